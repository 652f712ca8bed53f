//! The rerun commands: `measure` (one rerun or a sweep, written as one output set), `verify` (a
//! rerun judged against the card, signed) and `reference export`.

use std::path::{Path, PathBuf};

use cardproof::hub::HubPin;
use cardproof::outset::{Kind, OutputSet};
use cardproof::rerun::{self, Measurement, Role};

use super::{Failure, Outcome, local_path, signing_key};
use crate::config::{MeasureConfig, VerifyConfig};
use crate::printer::{self, Printer};

/// What `measure` wrote.
pub enum Measured {
    Measurement(Box<Measurement>),
    Sweep(rerun::sweep::Sweep),
}

/// What `verify` wrote.
/// A finished study and the files written.
pub struct Studied {
    pub document: cardproof::study::document::StudyDocument,
    pub written: Vec<PathBuf>,
}

/// `study`: the study file read and its checkpoints found, the output set opened, the study
/// planned (every checkpoint hashed once), every arm run against one reference pass (after
/// checking the set has room for them), the documents written and signed over every file of
/// the set, the set committed as one unit.
pub fn study(config: &crate::config::StudyConfig, printer: &Printer) -> super::Result<Studied> {
    let c = config;
    let mut study = cardproof::study::file::Study::read(&c.file)?;
    study.apply(&c.overrides)?;
    // The checkpoints before the set is opened (--out is never inside one); a study that
    // cannot run leaves --out as it was.
    let (reference, named) = cardproof::study::plan::checkpoints(&study)?;
    let mut models: Vec<&Path> = vec![reference.as_path()];
    models.extend(named.iter().map(|(_, p)| p.as_path()));
    let set = OutputSet::create(
        &c.out,
        &cardproof::outset::SetOptions {
            kind: Kind::Study,
            force: c.force,
            models: &models,
        },
    )?;
    let key = signing_key(printer, c.key.as_deref())?;
    let (plan, ran) = pool(c.threads)?.install(|| {
        with_progress(c.progress, |stage, progress| {
            stage("hashing the checkpoints");
            let plan = cardproof::study::plan::plan(&study, Some(c.threads))?;
            // The interrupted run's set, read under this run's lock on --out.
            let resume = match c.resume {
                true => Some(cardproof::study::resume::read(&c.out, &study, &plan)?),
                false => None,
            };
            let arms = plan.arms.len() as u64;
            let ran = cardproof::study::run::run(
                &study,
                &plan,
                set.dir(),
                Some(set.run_id()),
                c.threads,
                resume.as_ref(),
                &|r, id| set.check_space(rerun::output::size_estimate(r, id).saturating_mul(arms)),
                stage,
                progress,
            )?;
            Ok::<_, cardproof::Error>((plan, ran))
        })
    })?;
    let mut outcome = match ran {
        cardproof::study::run::Ran::Complete(outcome) => *outcome,
        cardproof::study::run::Ran::Interrupted {
            error,
            completed,
            remaining,
        } => {
            // The completed arms, kept as an incomplete, unsigned set; then the failure.
            set.commit_incomplete()?;
            printer.warning(&format!(
                "the study stopped at arm `{}`; the {} arms completed before it ({}) are kept in {} as an incomplete set (no study.json, nothing signed). Once the cause is fixed, `cardproof study {} --out {} --resume` runs the {} remaining arms.",
                remaining.first().map_or("?", String::as_str),
                completed.len(),
                completed.join(", "),
                c.out.display(),
                c.file.display(),
                c.out.display(),
                remaining.len()
            ));
            return Err(error.into());
        }
    };
    cardproof::study::write_documents(&set, &study, &plan, &mut outcome, &key)?;
    let written = set.commit()?;
    Ok(Outcome::clean(Studied {
        document: outcome.document,
        written,
    }))
}

pub struct Verified {
    /// One verification, or one per file of a card that lists many (`fidelity.files`).
    pub files: Vec<FileVerified>,
    /// The card lists its files: each has its own set in `--out/<file>/`.
    pub listed: bool,
    pub out: PathBuf,
}

/// The verification of one checkpoint (or one listed file) and the set it wrote.
pub struct FileVerified {
    pub file: Option<String>,
    pub report: cardproof::verify::Report,
    pub written: Vec<PathBuf>,
}

/// A thread pool of the configured size (a size the system refuses is a usage error).
fn pool(threads: usize) -> Result<rayon::ThreadPool, Failure> {
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .map_err(|e| Failure::Usage(format!("cannot start {threads} threads: {e}")))
}

/// Off a terminal (CI logs, pipes) each stage is a plain line on stderr as it starts;
/// `CARDPROOF_PROGRESS=plain` adds each count of windows as it moves (at most one line a second
/// per stage, and always the last), so a long pass shows it is alive.
pub const FORCE_PROGRESS: &str = "CARDPROOF_PROGRESS";

fn plain_progress() -> bool {
    std::env::var(FORCE_PROGRESS).is_ok_and(|v| v == "plain")
}

/// Run `work` with a progress bar on a terminal (`shown`), or plain lines when
/// [`FORCE_PROGRESS`] asks for them: its stage, and the windows done while a stage counts them.
/// A stage that counts nothing shows its name alone (not "linting 0/0 windows"); a new stage
/// drops the previous stage's count.
fn with_progress<T>(
    shown: bool,
    work: impl FnOnce(&(dyn Fn(&str) + Sync), rerun::Progress) -> T,
) -> T {
    use std::io::Write as _;
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicBool, Ordering};
    let bar = shown.then(|| printer::progress_bar(printer::STAGE_PROGRESS));
    let lines = !shown;
    let counts = lines && plain_progress();
    let counting = AtomicBool::new(false);
    let current = Mutex::new(String::new());
    // When the current stage's last count line was printed.
    let last_count = Mutex::new(None::<std::time::Instant>);
    let stage = |stage: &str| {
        if let Some(bar) = &bar {
            if counting.swap(false, Ordering::Relaxed) {
                bar.set_style(printer::progress_style(printer::STAGE_PROGRESS));
            }
            bar.set_message(stage.to_owned());
        }
        if lines {
            stage.clone_into(&mut current.lock().unwrap_or_else(|e| e.into_inner()));
            *last_count.lock().unwrap_or_else(|e| e.into_inner()) = None;
            let _ = writeln!(std::io::stderr().lock(), "progress: {stage}");
        }
    };
    let progress = |done: usize, total: usize| {
        if total == 0 {
            return;
        }
        if let Some(bar) = &bar {
            if !counting.swap(true, Ordering::Relaxed) {
                bar.set_style(printer::progress_style(printer::MEASURE_PROGRESS));
            }
            bar.set_length(total as u64);
            bar.set_position(done as u64);
        }
        if counts {
            let mut last = last_count.lock().unwrap_or_else(|e| e.into_inner());
            let due = last.is_none_or(|t| t.elapsed() >= std::time::Duration::from_secs(1));
            if due || done == total {
                *last = Some(std::time::Instant::now());
                let stage = current.lock().unwrap_or_else(|e| e.into_inner()).clone();
                let _ = writeln!(
                    std::io::stderr().lock(),
                    "progress: {stage} {done}/{total} windows"
                );
            }
        }
    };
    let out = work(&stage, &progress);
    if let Some(bar) = &bar {
        bar.finish_and_clear();
    }
    out
}

pub fn measure(config: &MeasureConfig, printer: &Printer) -> super::Result<Measured> {
    for note in &config.notes {
        printer.note(note);
    }
    // The output set first: an --out that cannot be written fails before any download or work.
    let mut config = config.clone();
    let (set, pins) = open_set(
        printer,
        &config.out,
        Kind::Measure,
        config.force,
        &mut config.spec.candidate,
        config.spec.reference.as_mut(),
    )?;
    let c = &config;
    let spec = &c.spec;
    let trust = cardproof::attest::artifact::Trust::when_used(
        spec.reference_artifact.as_deref(),
        &c.artifact_pub,
        c.trust_unsigned_artifact,
    )?;
    let on_warning = |w: &rerun::preflight::Warning| printer.warning(&w.to_string());
    let measured = pool(spec.threads)?.install(|| {
        with_progress(c.progress, |stage, progress| {
            if let Some((knob, values)) = &c.sweep {
                let sweep = rerun::sweep::run_sweep(
                    &rerun::sweep::SweepRequest {
                        spec,
                        knob,
                        values,
                        out: set.dir(),
                        run_id: Some(set.run_id()),
                        on_warning: &on_warning,
                        before_rerun: &|bytes| set.check_space(bytes),
                    },
                    stage,
                    progress,
                )?;
                set.commit()?;
                return Ok::<_, cardproof::Error>(Measured::Sweep(sweep));
            }
            let hooks = rerun::spec::MeasureHooks {
                voucher: &trust,
                pins,
                on_warning: &on_warning,
                stage,
                progress,
            };
            let m = rerun::spec::measure(spec, set, hooks)?;
            Ok(Measured::Measurement(Box::new(m)))
        })
    })?;
    Ok(Outcome::clean(measured))
}

pub fn verify(config: &VerifyConfig, printer: &Printer) -> super::Result<Verified> {
    // The output set first: an --out that cannot be written fails before any download or work.
    let mut config = config.clone();
    let (set, pins) = open_set(
        printer,
        &config.out,
        Kind::Verify,
        config.force,
        &mut config.path,
        config.reference.as_mut(),
    )?;
    let card = hub_card(printer, &config.path, &pins)?;
    // No --reference: the one the card pins, from the Hub (or its cache).
    let mut pins = pins;
    if config.reference.is_none() && config.reference_artifact.is_none() {
        let card_path = card
            .clone()
            .or_else(|| cardproof::verify::card_of(&config.path));
        let pinned = match card_path {
            Some(path) => cardproof::verify::card_pins(&path)?.reference,
            None => None,
        };
        if let Some(source) = pinned {
            printer.note(&format!(
                "no --reference given: using the reference the card pins, {source}"
            ));
            let (dir, pin) = local_path(printer, &source.display_path(None))?;
            cardproof::outset::outside_checkpoints(&config.out, &[dir.as_path()])?;
            pins.extend(pin.map(|p| (Role::Reference, p)));
            config.reference = Some(dir);
        }
    }
    let c = &config;
    let key = signing_key(printer, c.key.as_deref())?;
    let trust = cardproof::attest::artifact::Trust::when_used(
        c.reference_artifact.as_deref(),
        &c.artifact_pub,
        c.trust_unsigned_artifact,
    )?;
    let one = |set: OutputSet, file: Option<&str>, pins: Pins| {
        verify_one(
            c,
            printer,
            &VerifyParts {
                card: card.as_deref(),
                key: &key,
                trust: &trust,
            },
            set,
            file,
            pins,
        )
    };
    let listed = match &c.file {
        Some(_) => None,
        None => cardproof::verify::listed_files(&c.path, card.as_deref())?,
    };
    let (files, listed) = match listed {
        None => (vec![one(set, c.file.as_deref(), pins)?], false),
        Some(names) => {
            // One set per listed file, in --out/<file>/: each stands alone (verify-report,
            // check), and a run stopped part way keeps the files it finished, complete.
            drop(set);
            let models: Vec<&Path> = std::iter::once(c.path.as_path())
                .chain(c.reference.as_deref())
                .collect();
            printer.note(&format!(
                "the card lists {} files: verifying each, one report set per file in {}/<file>/",
                names.len(),
                c.out.display()
            ));
            let mut done = Vec::new();
            for name in &names {
                let out = c.out.join(name);
                let set = OutputSet::create(
                    &out,
                    &cardproof::outset::SetOptions {
                        kind: Kind::Verify,
                        force: c.force,
                        models: &models,
                    },
                )?;
                done.push(one(set, Some(name), pins.clone())?);
            }
            (done, true)
        }
    };
    let reproduced = files
        .iter()
        .all(|f| f.report.verdict == cardproof::verify::claims::Verdict::Reproduced);
    Ok(Outcome::findings_if(
        Verified {
            files,
            listed,
            out: c.out.clone(),
        },
        !reproduced,
    ))
}

/// What every file's verification shares.
struct VerifyParts<'a> {
    card: Option<&'a Path>,
    key: &'a ed25519_dalek::SigningKey,
    trust: &'a cardproof::attest::artifact::Trust,
}

/// Verify the checkpoint (or the listed `file`) into `set`.
fn verify_one(
    c: &VerifyConfig,
    printer: &Printer,
    parts: &VerifyParts<'_>,
    set: OutputSet,
    file: Option<&str>,
    pins: Pins,
) -> Result<FileVerified, Failure> {
    let verified = pool(c.threads)?.install(|| {
        with_progress(c.progress, |stage, progress| {
            let request = cardproof::verify::VerifyRequest {
                model: &c.path,
                card: parts.card,
                file,
                reference: c.reference.as_deref(),
                reference_artifact: c
                    .reference_artifact
                    .as_deref()
                    .map(|f| (f, parts.trust as &dyn rerun::artifact::Voucher)),
                eval_text: c.eval_text.as_deref(),
                threads: c.threads,
                noise_floor: c.noise_floor,
                transformers: c.transformers.as_ref(),
                llamacpp: c.llamacpp.as_ref(),
                pins,
                recurrent_state: c.recurrent_state,
                kv_cache: c.kv_cache,
                chat_template: c.chat_template.clone(),
                on_warning: &|w| printer.warning(&w.to_string()),
                before_rerun: &|r, id| set.check_space(rerun::output::size_estimate(r, id)),
            };
            let mut outcome = cardproof::verify::verify(&request, stage, progress)?;
            let written = cardproof::verify::write::write_outputs(set, &mut outcome, parts.key)?;
            Ok::<_, cardproof::Error>(FileVerified {
                file: file.map(str::to_owned),
                report: outcome.report,
                written,
            })
        })
    })?;
    Ok(verified)
}

pub fn export(
    args: &crate::cli::ExportArgs,
    p: crate::config::ProtocolConfig,
    printer: &Printer,
) -> super::Result<rerun::export::Exported> {
    let shown = std::io::IsTerminal::is_terminal(&std::io::stderr());
    use crate::cli::ArtifactKindArg;
    use rerun::export::{ExportKind, ExportRequest};
    let request = ExportRequest {
        model: &args.model,
        eval_text: &args.eval_text,
        options: rerun::MeasureOptions {
            direction: p.direction,
            vocab: p.vocab,
            positions: p.positions,
            bootstrap: p.bootstrap,
            context_lengths: args.context_length.clone(),
            bos: args.bos.into(),
            vocab_size: p.vocab_size,
            dump_logits: None,
            prefill_chunk: None,
        },
        kind: match args.kind {
            ArtifactKindArg::Hidden => ExportKind::Hidden,
            ArtifactKindArg::TopK => ExportKind::TopK,
            ArtifactKindArg::Llamacpp => ExportKind::Llamacpp,
        },
        k: args.artifact_top_k,
        hidden_bf16: args.bf16,
        repo: args.repo.clone(),
        revision: args.revision.clone(),
        threads: args
            .threads
            .map(usize::from)
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, usize::from)),
        out: &args.out,
    };
    let key = signing_key(printer, args.key.as_deref())?;
    let mut exported = with_progress(shown, |stage, progress| {
        rerun::export::export(&request, stage, progress)
    })?;
    cardproof::attest::artifact::sign_exported(&mut exported, &key)?;
    Ok(Outcome::clean(exported))
}

/// For a candidate from the Hub whose commit holds no card (the weights are committed first, the
/// card after, pinning them): the card at the repository's head, if it pins exactly these
/// weights (`fidelity.candidate` this repo at this commit); else `None` (the card is the
/// snapshot's own) or a refusal naming both commits.
fn hub_card(printer: &Printer, model: &Path, pins: &Pins) -> cardproof::Result<Option<PathBuf>> {
    let Some((_, pin)) = pins.iter().find(|(role, _)| *role == Role::Candidate) else {
        return Ok(None);
    };
    if cardproof::verify::card_of(model).is_some() {
        return Ok(None);
    }
    let head = cardproof::hub::HfSource::parse(&format!("hf:{}", pin.repo))?;
    let snapshot = super::materialize(
        printer,
        &super::hub_client(),
        &head,
        cardproof::hub::snapshot::Select::Only(&["README.md"]),
    )?;
    let card = snapshot.dir.join("README.md");
    let pinned = cardproof::verify::card_pins(&card)?.candidate;
    if pinned.as_ref() != Some(&(pin.repo.clone(), pin.commit.clone())) {
        return Err(cardproof::Error::usage(
            model,
            format!(
                "hf:{}@{} holds no card, and the card at the repository's head (commit {}) pins {}, not these weights: verify the revision that holds the card",
                pin.repo,
                pin.commit,
                snapshot.pinned.revision,
                pinned.map_or("no candidate revision".into(), |(r, c)| format!("{r}@{c}"))
            ),
        ));
    }
    printer.note(&format!(
        "hf:{}@{} holds no card: reading the card at the repository's head (commit {}), which pins these weights",
        pin.repo, pin.commit, snapshot.pinned.revision
    ));
    Ok(Some(card))
}

/// The Hub pins of a command's models, gathered as they are resolved (no global state).
type Pins = Vec<(Role, HubPin)>;

/// Open the output set of a run before any work ([`cardproof::outset`]: the policy for what
/// `out` holds, the lock, the temporary directory), then replace `hf:` sources by their verified
/// snapshots and check `out` against those too.
fn open_set(
    printer: &Printer,
    out: &Path,
    kind: Kind,
    force: bool,
    candidate: &mut PathBuf,
    reference: Option<&mut PathBuf>,
) -> cardproof::Result<(OutputSet, Pins)> {
    let mut given: Vec<PathBuf> = vec![candidate.clone()];
    given.extend(reference.as_deref().cloned());
    let given: Vec<&Path> = given.iter().map(|p| p.as_path()).collect();
    let set = OutputSet::create(
        out,
        &cardproof::outset::SetOptions {
            kind,
            force,
            models: &given,
        },
    )?;
    let mut pins = Pins::new();
    let mut local = Vec::new();
    for (path, role) in
        std::iter::once((candidate, Role::Candidate)).chain(reference.map(|r| (r, Role::Reference)))
    {
        let (resolved, pin) = local_path(printer, path)?;
        *path = resolved;
        local.push(path.clone());
        pins.extend(pin.map(|p| (role, p)));
    }
    if !pins.is_empty() {
        let local: Vec<&Path> = local.iter().map(|p| p.as_path()).collect();
        cardproof::outset::outside_checkpoints(out, &local)?;
    }
    Ok((set, pins))
}
