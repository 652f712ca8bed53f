//! `cardproof verify`: lint the card, inspect and hash the checkpoint, resolve the card's typed
//! protocol, hand one [`rerun::Request`] to the rerun module, judge every claim against the typed
//! measurement it returns, and assemble the typed [`Report`]; [`write`] signs it (an in-toto
//! Statement in a DSSE envelope) and renders it.

pub mod claims;
pub mod differences;
pub mod report;
pub mod view;
pub mod write;

use std::path::{Path, PathBuf};

use crate::card::Card;
use crate::checkpoint::hash::{HashOptions, Manifest, hash_path};
use crate::disclosure::{self, read::Sections};
use crate::error::{Error, Result};
use crate::findings::Code;
use crate::rerun::{self, GateRequest, HubPin, Lane, Progress, Rerun, Role, RunnerSpec};
use crate::runner::native::kv_cache::KvCacheSetting;
use crate::runner::native::{ComputeDtype, Emulate};
use claims::{Claim, ClaimResult, Context, Verdict};
pub use report::{FilesSummary, Report};

/// What to verify.
pub struct VerifyRequest<'a> {
    /// The candidate: a model directory holding its card (README.md), or a GGUF file with its
    /// card beside it ([`read_card`]'s one layout rule).
    pub model: &'a Path,
    /// The card to read instead of the one in (or beside) `model`: a card published in a later
    /// commit than the weights it pins (`verify hf:ORG/NAME@<weights commit>`).
    pub card: Option<&'a Path>,
    /// `--file NAME`: the one file of a card listing many (`fidelity.files`) to verify.
    pub file: Option<&'a str>,
    /// The reference checkpoint.
    pub reference: Option<&'a Path>,
    /// A compact reference artifact (or llama.cpp base file) in place of the reference
    /// checkpoint, and who decides whether it is vouched for (with `reference` also given, a
    /// sample of its rows is recomputed from the reference's weights).
    pub reference_artifact: Option<(&'a Path, &'a dyn rerun::artifact::Voucher)>,
    /// The eval text, when the card's `eval.text.source` is not a readable path.
    pub eval_text: Option<&'a Path>,
    pub threads: usize,
    /// Also measure the reference against itself in f64 vs the rerun's compute dtype.
    pub noise_floor: bool,
    /// Rerun with the transformers runner (the user's GPU) instead of the native one.
    pub transformers: Option<&'a crate::runner::transformers::TransformersOptions>,
    /// Rerun with the user's llama.cpp (`--runner llamacpp`); the card's llama.cpp flags are
    /// followed where the user set none.
    pub llamacpp: Option<&'a crate::runner::llamacpp::LlamacppOptions>,
    /// The Hub commits the candidate and reference came from (signed with the report).
    pub pins: Vec<(Role, HubPin)>,
    /// The dtype the candidate's recurrent state is kept in for the rerun (native runner;
    /// `--recurrent-state-dtype`, default f32); a card that discloses another is not reproduced.
    pub recurrent_state: crate::runner::native::StateDtype,
    /// `--kv-cache`: the candidate's KV-cache scheme for the rerun, in place of the card's.
    pub kv_cache: Option<KvCacheSetting>,
    /// `--chat-template*`: how a conversation eval text is rendered, each flag in place of what
    /// the card discloses.
    pub chat_template: crate::runner::tokens::ChatTemplateFlags,
    /// Told each pre-flight warning before the rerun starts.
    pub on_warning: &'a (dyn Fn(&rerun::preflight::Warning) + Sync),
    /// Asked, after the pre-flight and before the rerun, whether the outputs of this request
    /// (what the pre-flight found: the token count) fit where they go: a full disk must not be
    /// found after the whole rerun.
    pub before_rerun:
        &'a (dyn Fn(&rerun::Request, &rerun::preflight::Identity) -> Result<()> + Sync),
}

/// A finished verification.
pub struct VerifyOutcome {
    /// report.json: the in-toto predicate.
    pub report: Report,
    pub verdict: Verdict,
    /// The checkpoint's files: the statement's subjects.
    pub manifest: Manifest,
    /// The rerun (its measurement is also in the report).
    pub rerun: Option<Rerun>,
    /// Each context length's rows, for the report's plots.
    pub rows: Vec<crate::report::RunRows>,
}

/// The eval text: `--eval-text`, else the card's `eval.text.source` as a path inside the card's
/// directory ([`card_file`]).
fn eval_text_path(
    card_dir: &Path,
    eval: Option<&disclosure::Eval>,
    given: Option<&Path>,
) -> Result<PathBuf> {
    if let Some(p) = given {
        return Ok(p.to_owned());
    }
    let source = eval.map_or("", |e| e.text.source.as_str());
    let digest = eval
        .and_then(|e| e.text.sha256.as_ref())
        .map_or("not disclosed", |d| d.0.as_str());
    card_file(
        card_dir,
        source,
        "fidelity.eval.text.source",
        &format!("the eval text `{source}` (sha256 {digest})"),
        "--eval-text FILE",
    )
}

/// A file a card names, as a path inside the card's directory. A card never makes cardproof
/// read a file outside its own directory (an absolute path, `..`, or a link out of it):
/// whatever it names would be hashed and signed. `what` names the file in the error, `flag` how
/// to give it instead.
fn card_file(
    card_dir: &Path,
    source: &str,
    field: &str,
    what: &str,
    flag: &str,
) -> Result<PathBuf> {
    crate::files::inside_dir(card_dir, source).map_err(|why| {
        Error::card(
            card_dir,
            Some(field),
            format!("{what} {}; pass it with {flag}", why.why("card")),
        )
    })
}

/// How the rerun renders a conversation eval text: as the card's `eval.conversation` says (its
/// template's source, name and clock; a template file by its path inside the card's
/// directory), with each `--chat-template*` flag in place of what it names. A card without the
/// block renders with the reference's template, and any difference from what a card states is
/// a difference.
fn chat_template_choice(
    card_dir: &Path,
    eval: Option<&disclosure::Eval>,
    flags: &crate::runner::tokens::ChatTemplateFlags,
    text: Option<&Path>,
) -> Result<crate::runner::tokens::ChatTemplateChoice> {
    use crate::conversation::eval::TemplateFrom;
    use crate::runner::tokens::ChatTemplateChoice;
    let conversation_text = text.is_some_and(crate::conversation::eval::is_conversation_file);
    let Some(c) = eval.and_then(|e| e.conversation.as_ref()) else {
        return Ok(flags.over(ChatTemplateChoice::default()));
    };
    let file = match c.template.from {
        // A template the flags replace is not looked for.
        TemplateFrom::File if conversation_text && flags.from.is_none() => {
            let digest = c
                .template
                .sha256
                .as_ref()
                .map_or("not disclosed", |d| d.0.as_str());
            let path = c.template.path.as_deref().unwrap_or_default();
            Some(card_file(
                card_dir,
                path,
                "fidelity.eval.conversation.template.path",
                &format!("the chat template `{path}` (sha256 {digest})"),
                "--chat-template FILE",
            )?)
        }
        _ => None,
    };
    Ok(flags.over(ChatTemplateChoice {
        from: c.template.from,
        file,
        name: c.template.name.clone(),
        clock: c.clock,
    }))
}

fn compute_dtype(card_dir: &Path, name: &str) -> Result<ComputeDtype> {
    ComputeDtype::from_name(name).ok_or_else(|| {
        Error::unsupported(
            card_dir,
            Some("fidelity.runtime.compute_dtype"),
            format!("compute dtype `{name}` is not one the native runner has (f32, f64, bf16)"),
        )
    })
}

/// The reference checkpoint the rerun needs.
fn required_reference<'a>(
    r: &VerifyRequest<'a>,
    reference: Option<&disclosure::Reference>,
) -> Result<&'a Path> {
    r.reference.ok_or_else(|| {
        Error::usage(
            r.model,
            format!(
                "fidelity.reference: verify needs the reference: pass --reference PATH or hf:ORG/NAME@REVISION, or --reference-artifact FILE with the native runner (the card names {}@{})",
                reference.map_or("?", |r| r.repo.as_str()),
                reference.map_or("?", |r| r.revision.as_str()),
            ),
        )
    })
}

/// A claim is rerun in the lane the card discloses: when the card's numbers come from
/// transformers and the user did not say otherwise, use its attention kernel and dtype.
fn follow_card_runtime(
    runner: &mut crate::runner::transformers::TransformersOptions,
    rt: Option<&disclosure::Runtime>,
) {
    let Some(rt) = rt.filter(|rt| rt.engine == disclosure::Engine::Transformers) else {
        return;
    };
    let (attention, dtype) = runner.follow_card;
    if attention {
        let a = rt.attention_backend.to_ascii_lowercase();
        if crate::runner::transformers::ATTENTION_IMPLEMENTATIONS.contains(&a.as_str()) {
            runner.attention = (a.clone(), a);
        }
    }
    if dtype {
        match rt.compute_dtype.as_str() {
            "bf16" | "bfloat16" => runner.dtype = "bfloat16".into(),
            "f16" | "float16" => runner.dtype = "float16".into(),
            "f32" | "float32" => runner.dtype = "float32".into(),
            _ => {}
        }
    }
}

/// A claim measured in llama.cpp is rerun with the card's llama.cpp flags wherever the user set
/// none: flash attention, the batch sizes and the GPU layers (the KV cache is the card's
/// `kv_cache_dtype`, as for every lane). Anything the rerun still does differently is a listed
/// difference, not a silent change.
fn follow_card_llamacpp(
    given: &crate::runner::llamacpp::LlamacppOptions,
    rt: Option<&disclosure::Runtime>,
) -> crate::runner::llamacpp::LlamacppOptions {
    use disclosure::FlagValue;
    let mut o = given.clone();
    let Some(flags) = rt
        .filter(|rt| rt.engine == disclosure::Engine::LlamaCpp)
        .and_then(|rt| rt.flags.as_ref())
    else {
        return o;
    };
    let number = |key: &str| match flags.get(key) {
        Some(FlagValue::Integer(n)) => u32::try_from(*n).ok(),
        Some(FlagValue::Text(t)) => t.parse().ok(),
        _ => None,
    };
    let s = &mut o.settings;
    if s.flash_attn.is_none()
        && let Some(FlagValue::Text(fa)) = flags.get("flash_attn")
    {
        s.flash_attn = match fa.as_str() {
            "enabled" | "on" | "true" | "1" => Some("on".into()),
            "disabled" | "off" | "false" | "0" => Some("off".into()),
            _ => None,
        };
    }
    if s.batch.is_none() {
        s.batch = number("n_batch");
    }
    if s.ubatch.is_none() {
        s.ubatch = number("n_ubatch");
    }
    if s.gpu_layers.is_none() {
        s.gpu_layers = match flags.get("n_gpu_layers") {
            Some(FlagValue::Integer(n)) => Some(n.to_string()),
            Some(FlagValue::Text(t)) => Some(t.clone()),
            _ => None,
        };
    }
    o
}

/// The rows a card says were left out as non-finite at a context length (the largest any of its
/// claims there states; `None` when none states it).
fn disclosed_nonfinite(claims: &[Claim], length: u64) -> Option<u64> {
    claims
        .iter()
        .filter(|c| c.invalid.is_none() && c.context_length.is_none_or(|l| l == length))
        .filter_map(|c| c.n_nonfinite)
        .max()
}

/// The quantization method a card declares (`None` for none or a plain float dtype).
fn declared_quantization(method: Option<&str>) -> Option<String> {
    let method = method?;
    let plain = [
        "none", "bf16", "bfloat16", "f16", "fp16", "float16", "f32", "fp32", "float32",
    ];
    (!plain.contains(&method.to_ascii_lowercase().as_str())).then(|| method.to_owned())
}

fn plot_rows(runs: &[rerun::RunResult]) -> Vec<crate::report::RunRows> {
    runs.iter().map(crate::report::RunRows::from).collect()
}

/// A reference artifact nobody the user trusts vouches for (`--trust-unsigned-artifact`): its
/// numbers are shown, and a difference makes every claim `not_comparable`, never `reproduced`
/// (an artifact recorded without a vouch counts as unvouched too).
fn unvouched_reference(m: &rerun::Measurement) -> Option<differences::Difference> {
    let artifact = m.environment.reference_artifact.as_ref()?;
    let described = match &artifact.vouch {
        Some(v) if v.is_signed() => return None,
        Some(v) => v.describe(),
        None => "an artifact nobody vouches for".to_owned(),
    };
    Some(differences::Difference {
        field: "reference".into(),
        card: "the reference the card names".into(),
        rerun: described.clone(),
        message: format!(
            "reference: {described}; a reference nobody you trust vouches for cannot reproduce a claim (name its signer's key with --artifact-pub, or rerun against the reference's weights)"
        ),
    })
}

/// Who vouches for the reference a verification ran against, in words for the report.
fn reference_source(m: &rerun::Measurement) -> String {
    match &m.environment.reference_artifact {
        None => format!(
            "the reference's own weights ({}, root sha256 {}), rerun here",
            m.reference.path, m.reference.manifest_sha256
        ),
        Some(a) => {
            let vouch = a.vouch.as_ref().map_or_else(
                || "an artifact nobody vouches for".to_owned(),
                |v| v.describe(),
            );
            let spot = match &a.spot_check {
                Some(c) => format!(
                    "; {} rows of {} windows recomputed from the reference's weights (root sha256 {}) match it (largest row KL {:.1e}, at most {:.0e}; seed {})",
                    c.rows,
                    c.windows.len(),
                    c.reference_manifest_sha256,
                    c.max_row_kld,
                    c.limit,
                    c.seed
                ),
                None => "; not checked against the reference's weights".to_owned(),
            };
            format!("{} {vouch}{spot}", a.path)
        }
    }
}

/// Run the whole verification. Fails closed: any error is an `Err`, never a verdict.
pub fn verify(
    r: &VerifyRequest,
    stage: &(dyn Fn(&str) + Sync),
    progress: Progress,
) -> Result<VerifyOutcome> {
    stage("linting");
    let read = read_card(r.model, r.card, r.file)?;
    let mut ctx = lint_context(&read.lint);
    ctx.turns_disclosed = read
        .sections
        .protocol
        .as_ref()
        .is_ok_and(|p| p.turns.is_some());
    stage("hashing");
    let manifest = hash_path(
        &read.checkpoint,
        &HashOptions {
            threads: Some(r.threads),
            include_all: false,
        },
        &|_| {},
    )?;
    let outcome = rerun_card(r, &read, &manifest, &mut ctx, stage, progress)?;
    let lane_differences = lane_differences(&read, &outcome);
    ctx.differences = lane_differences.iter().map(|d| d.message.clone()).collect();
    let results = judge_claims(&read.claims, &outcome, &ctx);
    let done = match outcome {
        RerunOutcome::Done(done, _) => Some(*done),
        RerunOutcome::NotDisclosed | RerunOutcome::Stopped { .. } => None,
    };
    let judged = Judged {
        results,
        undisclosed: ctx.undisclosed,
        lane_differences,
    };
    let report = assemble_report(r, read, &manifest, done.as_ref(), judged);
    let rows = done
        .as_ref()
        .map(|d| plot_rows(&d.runs))
        .unwrap_or_default();
    Ok(VerifyOutcome {
        verdict: report.verdict,
        report,
        manifest,
        rerun: done,
        rows,
    })
}

/// The card as verify reads it before anything is hashed: linted against the checkpoint's
/// headers, its `fidelity` block as JSON and as typed sections, and its claims.
struct ReadCard {
    path: PathBuf,
    /// What the card's claims are about: the directory, or the one file in it (`candidate.file`
    /// or the GGUF file `verify` was given).
    checkpoint: PathBuf,
    /// The card's directory: the files a card names are looked for inside it ([`card_file`]).
    dir: PathBuf,
    card: Card,
    inspections: Vec<crate::checkpoint::inspect::Inspection>,
    lint: crate::lint::LintReport,
    /// The `fidelity` block (`Null` when the card has none): what the report signs as disclosed.
    disclosure: serde_json::Value,
    sections: Sections,
    claims: Vec<Claim>,
}

impl ReadCard {
    fn runtime(&self) -> Option<&disclosure::Runtime> {
        self.sections.runtime.as_ref().ok()
    }

    fn eval(&self) -> Option<&disclosure::Eval> {
        self.sections.eval.as_ref().ok()
    }

    fn reference(&self) -> Option<&disclosure::Reference> {
        self.sections.reference.as_ref().ok()
    }

    /// The card's lane and identities as read.
    fn lane(&self) -> differences::CardLane<'_> {
        differences::CardLane {
            runtime: self.runtime(),
            eval: self.eval(),
            reference: self.reference(),
            candidate_files_sha256: self.disclosure["candidate"]["files_sha256"].as_str(),
            turns: self
                .sections
                .protocol
                .as_ref()
                .ok()
                .and_then(|p| p.turns.as_ref()),
        }
    }

    /// The sanity gates the card's own statements set: the quantization it declares against
    /// the checkpoint's, and the non-finite rows it discloses at each context length.
    fn gates(&self, lengths: &[u64]) -> GateRequest {
        GateRequest {
            declared: declared_quantization(self.sections.quantization_method.as_deref()),
            checkpoint_quantized: self.inspections.iter().any(|i| i.summary.quantized > 0),
            disclosed_nonfinite: lengths
                .iter()
                .map(|&l| (l, disclosed_nonfinite(&self.claims, l)))
                .collect(),
        }
    }
}

/// What a card pins of the Hub, for `verify` to fetch what it was not given: the reference
/// (`fidelity.reference.repo` at its `revision`) and the candidate's weights
/// (`fidelity.candidate.repo` at its `revision`). Only full 40-hex commits of Hub repo ids
/// count (a branch moves; the examples name local paths, which pin nothing to fetch).
#[derive(Debug, Clone, Default)]
pub struct CardPins {
    pub reference: Option<crate::hub::HfSource>,
    /// The candidate's repo and commit.
    pub candidate: Option<(String, String)>,
}

/// The card `verify` reads for `model` (its README.md, or the one beside a GGUF file), if any.
pub fn card_of(model: &Path) -> Option<PathBuf> {
    let card_at = match (is_gguf_file(model), model.parent()) {
        (true, Some(dir)) if !dir.as_os_str().is_empty() => dir,
        (true, _) => Path::new("."),
        (false, _) => model,
    };
    crate::card::resolve_card_path(card_at).ok()
}

/// The pins of the card at `card` (a README.md).
pub fn card_pins(card: &Path) -> Result<CardPins> {
    let card = Card::open(card)?;
    let fidelity = card
        .metadata()
        .and_then(|m| m.get("fidelity"))
        .map(|e| e.value.to_json())
        .unwrap_or_default();
    let pinned = |side: &str| -> Option<(String, String)> {
        let node = fidelity.get(side)?;
        let (repo, revision) = (node["repo"].as_str()?, node["revision"].as_str()?);
        let commit = revision.len() == 40 && revision.bytes().all(|b| b.is_ascii_hexdigit());
        let source = crate::hub::HfSource::parse(&format!("hf:{repo}@{revision}"));
        (commit && source.is_ok()).then(|| (repo.to_owned(), revision.to_owned()))
    };
    Ok(CardPins {
        reference: pinned("reference")
            .and_then(|(r, v)| crate::hub::HfSource::parse(&format!("hf:{r}@{v}")).ok()),
        candidate: pinned("candidate"),
    })
}

/// Open the card and lint it against its checkpoint, by one layout rule for files and
/// directories: a directory means its README.md, and the checkpoint is the directory or, when
/// the card's `candidate.file` names one, that file in it; a GGUF file means the README.md beside
/// it, and the checkpoint is that file (a card naming another file is refused). A card listing
/// many files (`fidelity.files`) is read as the view of the one file given or named by `file`.
/// A directory without a checkpoint is refused before anything is linted.
fn read_card(model: &Path, card_file: Option<&Path>, file: Option<&str>) -> Result<ReadCard> {
    let given_file = is_gguf_file(model);
    let card_at = match (given_file, model.parent()) {
        (true, Some(dir)) if !dir.as_os_str().is_empty() => dir,
        (true, _) => Path::new("."),
        (false, _) => model,
    };
    let resolved = match card_file {
        Some(card) => Ok(card.to_owned()),
        None => crate::card::resolve_card_path(card_at),
    };
    let path = resolved.map_err(|e| {
        if given_file && matches!(e.kind, crate::error::ErrorKind::NoReadme) {
            Error::usage(
                model,
                format!(
                    "has no card beside it ({} is missing): write one with `cardproof card --measurement …`",
                    card_at.join("README.md").display()
                ),
            )
        } else {
            e
        }
    })?;
    let card = Card::open(&path)?;
    let fidelity_node = card.metadata().and_then(|m| m.get("fidelity"));
    let given_name = given_file
        .then(|| model.file_name().and_then(|n| n.to_str()))
        .flatten();
    let view = match fidelity_node.and_then(|e| disclosure::files::read(&e.value)) {
        Some(files) => Some(file_view(files, file.or(given_name), model, &path)?),
        None => None,
    };
    let fidelity_value = view
        .as_ref()
        .map(|v| &v.node)
        .or(fidelity_node.map(|e| &e.value));
    let disclosure = fidelity_value.map_or(serde_json::Value::Null, |n| n.to_json());
    let named = disclosure
        .pointer("/candidate/file")
        .and_then(serde_json::Value::as_str);
    if let Some(asked) = file
        && named != Some(asked)
    {
        return Err(Error::usage(
            &path,
            match named {
                Some(other) => {
                    format!("describes `{other}` (fidelity.candidate.file), not `{asked}` (--file)")
                }
                None => format!(
                    "describes the whole directory, not one file: `--file {asked}` is for a card that lists files (`fidelity.files`) or names one (`candidate.file`)"
                ),
            },
        ));
    }
    let field = view
        .as_ref()
        .map_or("fidelity.candidate.file".to_owned(), |v| {
            format!("fidelity.files[{}].file", v.index)
        });
    let checkpoint = card_checkpoint(model, card_at, given_file, named, &path, &field)?;
    let inspections = if crate::checkpoint::has_checkpoint(&checkpoint) {
        crate::checkpoint::inspect::inspect_path(&checkpoint)?
    } else {
        return Err(Error::usage(
            &checkpoint,
            "holds no checkpoint (safetensors or GGUF) to verify",
        ));
    };
    let mut lint = crate::lint::lint_with_checkpoint(&card, &inspections);
    if let Some(view) = &view {
        // What the card says of its other files is not about this one.
        lint.findings.retain(|f| {
            !f.pointer.as_deref().is_some_and(|p| view.is_other_entry(p))
                && f.code != Code::UnlistedFile
        });
    }
    let sections = Sections::read(&disclosure);
    let claims: Vec<Claim> = fidelity_value
        .map(|n| claims::claims(n, &|offset| card.line_col(offset).line))
        .unwrap_or_default();
    Ok(ReadCard {
        dir: path.parent().unwrap_or(Path::new(".")).to_owned(),
        path,
        checkpoint,
        card,
        inspections,
        lint,
        disclosure,
        sections,
        claims,
    })
}

/// The view of the one file to verify of a card listing many: the file `verify` was given or
/// `--file` names; none given is refused, listing the files (the command verifies each in turn).
fn file_view(
    files: disclosure::files::Files,
    name: Option<&str>,
    model: &Path,
    card: &Path,
) -> Result<disclosure::files::FileView> {
    let listed = || files.names().join(", ");
    let Some(name) = name else {
        return Err(Error::usage(
            model,
            format!(
                "the card lists {} files ({}): verify one with `--file NAME`",
                files.views.len(),
                listed()
            ),
        ));
    };
    match files.view(name) {
        Some(view) => Ok(view.clone()),
        None => Err(Error::usage(
            card,
            format!(
                "lists no file `{name}` in `fidelity.files` (it lists: {})",
                if files.views.is_empty() {
                    "none".to_owned()
                } else {
                    listed()
                }
            ),
        )),
    }
}

/// The files a card lists (`fidelity.files`), when `model` is a directory whose card lists
/// several: `verify` of the directory verifies each. `None` for a card of one checkpoint; an
/// error when a listed file is not a regular file in `model`.
pub fn listed_files(model: &Path, card_file: Option<&Path>) -> Result<Option<Vec<String>>> {
    if is_gguf_file(model) {
        return Ok(None);
    }
    let path = match card_file {
        Some(card) => card.to_owned(),
        None => match crate::card::resolve_card_path(model) {
            Ok(p) => p,
            Err(_) => return Ok(None),
        },
    };
    let card = Card::open(&path)?;
    let Some(fidelity) = card.metadata().and_then(|m| m.get("fidelity")) else {
        return Ok(None);
    };
    let Some(files) = disclosure::files::read(&fidelity.value) else {
        return Ok(None);
    };
    // Every listed file is there before the first is verified (not found after hours of it).
    for v in &files.views {
        file_beside(
            model,
            &v.file,
            &path,
            &format!("fidelity.files[{}].file", v.index),
        )?;
    }
    Ok(Some(files.names().into_iter().map(str::to_owned).collect()))
}

fn is_gguf_file(path: &Path) -> bool {
    path.extension()
        .is_some_and(|x| x.eq_ignore_ascii_case("gguf"))
        && std::fs::metadata(path).is_ok_and(|m| m.is_file())
}

/// The checkpoint a card describes (see [`read_card`]): `named` is the card's `candidate.file`
/// (or the file entry's, `field` says which), a bare name of a file beside the card, never a
/// path.
fn card_checkpoint(
    model: &Path,
    dir: &Path,
    given_file: bool,
    named: Option<&str>,
    card: &Path,
    field: &str,
) -> Result<PathBuf> {
    let Some(name) = named else {
        return Ok(model.to_owned());
    };
    if given_file {
        let given = model.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if given != name {
            return Err(Error::usage(
                model,
                format!(
                    "the card beside it ({}) describes `{name}` ({field}), not `{given}`: verify {}, or give `{given}` a card of its own",
                    card.display(),
                    dir.join(name).display()
                ),
            ));
        }
        return Ok(model.to_owned());
    }
    file_beside(dir, name, card, field)
}

/// The file `name` (the card's `field`) in `dir`: a bare name of a regular file there, never a
/// path or a link followed out of it.
fn file_beside(dir: &Path, name: &str, card: &Path, field: &str) -> Result<PathBuf> {
    if !disclosure::files::is_bare_name(name) || Path::new(name).components().count() != 1 {
        return Err(Error::format(
            card,
            Some(field),
            format!(
                "`{name}` is not a bare file name: the card names a file beside it, never a path"
            ),
        ));
    }
    let file = dir.join(name);
    if !std::fs::symlink_metadata(&file).is_ok_and(|m| m.is_file()) {
        return Err(Error::usage(
            card,
            format!(
                "{field} names `{name}`, which is not a regular file in {}",
                dir.display()
            ),
        ));
    }
    Ok(file)
}

/// What the card's lint decides for every claim: a missing or vague disclosure makes each
/// claim undisclosed, a lint error fails each closed.
fn lint_context(lint: &crate::lint::LintReport) -> Context {
    let mut ctx = Context::default();
    for f in &lint.findings {
        if matches!(
            f.code,
            Code::MissingDisclosure | Code::VagueDisclosure | Code::NoFidelityDisclosure
        ) {
            ctx.undisclosed.push(f.message.clone());
        }
        if f.is_error() {
            ctx.lint_errors.push(match f.line {
                Some(line) => format!("{} (line {line}): {}", f.code, f.message),
                None => format!("{}: {}", f.code, f.message),
            });
        }
    }
    ctx
}

/// Where the rerun got to.
enum RerunOutcome {
    /// The card does not disclose a protocol the rerun can follow (each missing piece is in the
    /// context's `undisclosed`): nothing ran.
    NotDisclosed,
    /// The pre-flight found the files given are not the ones the card names: nothing ran.
    Stopped {
        contradicted: Vec<differences::Difference>,
        /// The context lengths the protocol would have run.
        lengths: Vec<u64>,
    },
    /// The rerun, and the card's protocol it followed.
    Done(Box<Rerun>, rerun::Resolved),
}

/// Rerun the card's protocol in the lane the request chooses, when the card discloses one and
/// the pre-flight finds the files given are the card's; a failed sanity gate or a stop at the
/// pre-flight is recorded in `ctx`.
fn rerun_card(
    r: &VerifyRequest,
    read: &ReadCard,
    manifest: &Manifest,
    ctx: &mut Context,
    stage: &(dyn Fn(&str) + Sync),
    progress: Progress,
) -> Result<RerunOutcome> {
    let resolved = match resolve_protocol(&read.sections) {
        Ok(resolved) => resolved,
        Err(missing) => {
            ctx.undisclosed.extend(missing);
            return Ok(RerunOutcome::NotDisclosed);
        }
    };
    let compute = compute_dtype(&read.path, &resolved.compute)?;
    let runner = runner_spec(r, read.runtime(), compute);
    let (lane, text) = choose_lane(r, read, &runner)?;
    let request = rerun_request(r, read, lane, text.as_deref(), &resolved, manifest)?;
    let (pre, contradicted) = preflight(r, read, &request, manifest, stage)?;
    if !contradicted.is_empty() {
        // Not rerun: every claim is judged against the card alone and none can be
        // reproduced (docs/DESIGN.md, "Verification").
        ctx.not_rerun = Some(claims::NotRerun {
            forward: resolved.options.direction.forward(),
            reverse: resolved.options.direction.reverse(),
        });
        return Ok(RerunOutcome::Stopped {
            contradicted,
            lengths: context_lengths(&resolved),
        });
    }
    let done = run_rerun(r, &request, pre, ctx, stage, progress)?;
    Ok(RerunOutcome::Done(Box::new(done), resolved))
}

/// The card's protocol as the rerun follows it, or each missing or unusable piece of its
/// `protocol` and `eval` sections.
fn resolve_protocol(sections: &Sections) -> std::result::Result<rerun::Resolved, Vec<String>> {
    match (&sections.protocol, &sections.eval) {
        (Ok(p), Ok(e)) => rerun::options::resolve(p, e.bos, sections.runtime.as_ref().ok()),
        (p, e) => Err([p.as_ref().err(), e.as_ref().err()]
            .into_iter()
            .flatten()
            .cloned()
            .collect()),
    }
}

/// The protocol's context lengths.
fn context_lengths(resolved: &rerun::Resolved) -> Vec<u64> {
    resolved
        .options
        .context_lengths
        .iter()
        .map(|&l| l as u64)
        .collect()
}

/// The runner the claims are rerun in, resolved once from the flags and the card's runtime: a
/// reference artifact's candidate runs natively; else the user's llama.cpp or transformers,
/// following the card's runtime where the user set nothing; else the native runner.
fn runner_spec(
    r: &VerifyRequest,
    runtime: Option<&disclosure::Runtime>,
    compute: ComputeDtype,
) -> RunnerSpec {
    let native = RunnerSpec::Native {
        compute,
        emulate: Emulate::ReferenceSemantics,
    };
    match (r.reference_artifact, r.llamacpp, r.transformers) {
        (Some(_), _, _) => native,
        (None, Some(given), _) => RunnerSpec::Llamacpp(follow_card_llamacpp(given, runtime)),
        (None, None, Some(given)) => {
            let mut runner = given.clone();
            follow_card_runtime(&mut runner, runtime);
            RunnerSpec::Transformers(runner)
        }
        (None, None, None) => native,
    }
}

/// The lane the claims are rerun in, and the eval text it reads: `runner` against the reference
/// artifact when one is given (its tokens are its own, so a missing eval text is no error
/// there), else against the reference checkpoint.
fn choose_lane<'a: 'l, 'l>(
    r: &VerifyRequest<'a>,
    read: &ReadCard,
    runner: &'l RunnerSpec,
) -> Result<(Lane<'l>, Option<PathBuf>)> {
    let eval = read.eval();
    if let Some((file, voucher)) = r.reference_artifact {
        let text = eval_text_path(&read.dir, eval, r.eval_text).ok();
        let source = rerun::artifact::ArtifactSource {
            file,
            voucher,
            reference: r.reference,
        };
        Ok((runner.lane(rerun::ReferenceSpec::Artifact(source))?, text))
    } else {
        let reference = required_reference(r, read.reference())?;
        let text = Some(eval_text_path(&read.dir, eval, r.eval_text)?);
        Ok((
            runner.lane(rerun::ReferenceSpec::Checkpoint(reference))?,
            text,
        ))
    }
}

/// The candidate's KV cache in the rerun: `--kv-cache`, else a quantized scheme the card's
/// runtime names. A card whose runtime names a quantized KV-cache scheme the runners emulate is
/// rerun with it (native and transformers lanes; a llama.cpp base file's lane has nothing to
/// set); any other value is compared as before.
fn rerun_kv_cache(
    given: Option<KvCacheSetting>,
    lane: &Lane,
    runtime: Option<&disclosure::Runtime>,
) -> Option<KvCacheSetting> {
    match lane {
        Lane::Native { .. } | Lane::Transformers { .. } | Lane::Llamacpp { .. } => {
            given.or_else(|| {
                runtime
                    .and_then(|rt| {
                        // The structured entry names K and V separately; lint holds it to
                        // agree with `kv_cache_dtype`.
                        rt.kv_cache
                            .as_ref()
                            .and_then(|e| e.setting().ok())
                            .or_else(|| KvCacheSetting::from_label(&rt.kv_cache_dtype))
                    })
                    .filter(|s| s.k.is_quantized() || s.v.is_quantized())
            })
        }
        _ => None,
    }
}

/// The rerun the card's claims are judged against: the lane on the card's eval text, rendered
/// as the card or the `--chat-template*` flags say, under the card's resolved protocol, with
/// the sanity gates the card's own statements set.
fn rerun_request<'a: 'l, 'l>(
    r: &VerifyRequest<'a>,
    read: &'l ReadCard,
    lane: Lane<'l>,
    text: Option<&'l Path>,
    resolved: &rerun::Resolved,
    manifest: &'l Manifest,
) -> Result<rerun::Request<'l>> {
    let lengths = context_lengths(resolved);
    let kv_cache = rerun_kv_cache(r.kv_cache, &lane, read.runtime());
    let chat_template = chat_template_choice(&read.dir, read.eval(), &r.chat_template, text)?;
    Ok(rerun::Request {
        chat_template,
        padding_included: resolved.padding_included,
        candidate_manifest: Some(manifest),
        reference_manifest: None,
        gates: Some(read.gates(&lengths)),
        noise_floor: r.noise_floor,
        pins: r.pins.clone(),
        recurrent_state: r.recurrent_state,
        kv_cache,
        turns: resolved.turns,
        ..rerun::Request::new(
            lane,
            &read.checkpoint,
            text,
            resolved.options.clone(),
            r.threads,
        )
    })
}

/// Everything that needs no forward pass, first: a file that is not the card's is found in
/// well under a second, not after the measurement. Each pre-flight warning is told; the
/// identities it found (eval text, conversation, tokens, both checkpoints' files) are compared
/// with the card's, and each contradiction returned.
fn preflight(
    r: &VerifyRequest,
    read: &ReadCard,
    request: &rerun::Request,
    manifest: &Manifest,
    stage: &(dyn Fn(&str) + Sync),
) -> Result<(rerun::preflight::Preflight, Vec<differences::Difference>)> {
    let pre = rerun::preflight::check(request, stage)?;
    for w in &pre.warnings {
        (r.on_warning)(w);
    }
    let id = &pre.identity;
    let contradicted = differences::identity_differences(
        &read.lane(),
        &differences::Identities {
            eval_text_sha256: id.eval_text_sha256.as_deref(),
            conversation: id.conversation.as_ref(),
            text_known: id.text_read,
            tokens: id.tokens_sha256.as_deref().zip(id.token_count),
            candidate_files_sha256: &manifest.root_sha256,
            reference_files_sha256: id.reference_files_sha256.as_deref(),
        },
        "given files",
    );
    Ok((pre, contradicted))
}

/// The rerun, once the caller has said its outputs fit ([`VerifyRequest::before_rerun`]); each
/// sanity gate it fails fails every claim closed.
fn run_rerun(
    r: &VerifyRequest,
    request: &rerun::Request,
    pre: rerun::preflight::Preflight,
    ctx: &mut Context,
    stage: &(dyn Fn(&str) + Sync),
    progress: Progress,
) -> Result<Rerun> {
    (r.before_rerun)(request, &pre.identity)?;
    let done = rerun::run_checked(request, pre, stage, progress)?;
    for g in done.gates.iter().filter(|g| !g.passed) {
        ctx.failed_gates.push(format!("{}: {}", g.gate, g.detail));
    }
    Ok(done)
}

/// Every difference between the card's lane and what ran: the identities the pre-flight found
/// contradicted, or, after a rerun, an unreadable runtime, each difference in lane or protocol,
/// and a reference nobody vouches for.
fn lane_differences(read: &ReadCard, outcome: &RerunOutcome) -> Vec<differences::Difference> {
    let (done, resolved) = match outcome {
        RerunOutcome::NotDisclosed => return Vec::new(),
        RerunOutcome::Stopped { contradicted, .. } => return contradicted.clone(),
        RerunOutcome::Done(done, resolved) => (done, resolved),
    };
    let mut out = Vec::new();
    if let Err(e) = &read.sections.runtime {
        out.push(differences::Difference {
            field: "fidelity.runtime".into(),
            card: e.clone(),
            rerun: done.measurement.environment.lane.clone(),
            message: format!("runtime: the card's runtime cannot be read ({e}); the rerun's lane cannot be compared with it"),
        });
    }
    out.extend(differences::lane_differences(
        &read.lane(),
        &done.measurement,
        resolved,
    ));
    out.extend(unvouched_reference(&done.measurement));
    out
}

/// Each claim judged at its context length: against the rerun's number there, or, where nothing
/// ran, against the card alone.
fn judge_claims(card_claims: &[Claim], outcome: &RerunOutcome, ctx: &Context) -> Vec<ClaimResult> {
    let (measurement, bits, lengths): (_, _, Vec<u64>) = match outcome {
        RerunOutcome::NotDisclosed => (None, false, Vec::new()),
        RerunOutcome::Stopped { lengths, .. } => (None, false, lengths.clone()),
        RerunOutcome::Done(done, resolved) => (
            Some(&done.measurement),
            resolved.bits,
            done.measurement
                .runs
                .iter()
                .map(|r| r.context_length as u64)
                .collect(),
        ),
    };
    let lookup = |metric: &str, length: Option<u64>| {
        measurement.and_then(|m| match length {
            Some(length) => rerun_number(m, bits, metric, length),
            None => rerun_turn_number(m, metric),
        })
    };
    card_claims
        .iter()
        .map(|c| claims::judge(c, &lengths, ctx, &lookup))
        .collect()
}

/// The rerun's number for a metric at a context length, on the claim's scale: a metric on
/// another one's scale (`same_top_p` is 100 × `top1_agreement`) derived from it, and KL in bits
/// where the card states bits (the rerun measures nats).
fn rerun_number(
    m: &rerun::Measurement,
    bits: bool,
    metric: &str,
    length: u64,
) -> Option<claims::Rerun> {
    let run = m.run(usize::try_from(length).ok()?)?;
    let (measured, factor) =
        crate::disclosure::vocabulary::derived(metric).unwrap_or((metric, 1.0));
    let value = *run.summary.metrics.get(measured)?;
    let ci = run.summary.uncertainty.get(measured).map(|u| u.ci95);
    let scale = factor
        * if bits && metric.starts_with("kld") {
            std::f64::consts::LN_2.recip()
        } else {
            1.0
        };
    Some(claims::Rerun {
        value: value * scale,
        ci95: ci.map(|[a, b]| [a * scale, b * scale]),
        n_positions: run.n_positions as u64,
        n_nonfinite: run.n_nonfinite as u64,
        turns: None,
    })
}

/// The rerun's turn metric, with the count it is a share of (`None` when the rerun generated no
/// turns, or the share is undefined on them).
fn rerun_turn_number(m: &rerun::Measurement, metric: &str) -> Option<claims::Rerun> {
    let s = &m.turns.as_ref()?.summary;
    let f1 = &s.tool_call_f1;
    let (value, u, denominator) = match metric {
        "tool_call_f1" => (Some(f1.value), &f1.uncertainty, 2 * f1.tp + f1.fp + f1.fn_),
        "tool_call_valid" => (
            s.tool_call_valid.value,
            &s.tool_call_valid.uncertainty,
            s.tool_call_valid.calls,
        ),
        "tool_call_match" => (
            s.tool_call_match.value,
            &s.tool_call_match.uncertainty,
            s.tool_call_match.of,
        ),
        "turn_match" => (
            s.turn_match.value,
            &s.turn_match.uncertainty,
            s.turn_match.of,
        ),
        _ => return None,
    };
    let value = value.filter(|v| v.is_finite())?;
    Some(claims::Rerun {
        value,
        ci95: u.ci95.iter().all(|v| v.is_finite()).then_some(u.ci95),
        n_positions: 0,
        n_nonfinite: 0,
        turns: Some(claims::TurnSample {
            turns: s.turns,
            step: 1.0 / denominator.max(1) as f64,
        }),
    })
}

/// What the report says of the claims: their verdicts and what decided them.
struct Judged {
    results: Vec<ClaimResult>,
    undisclosed: Vec<String>,
    lane_differences: Vec<differences::Difference>,
}

/// The report: the verdicts, the checkpoint's files, the card as read and linted, and what the
/// rerun (if any) measured.
fn assemble_report(
    r: &VerifyRequest,
    read: ReadCard,
    manifest: &Manifest,
    done: Option<&Rerun>,
    judged: Judged,
) -> Report {
    let measurement = done.map(|d| &d.measurement);
    Report {
        schema_version: crate::schema::SchemaVersion,
        run_id: None,
        tool: report::Tool {
            name: "cardproof".into(),
            version: env!("CARGO_PKG_VERSION").into(),
        },
        verdict: claims::overall(&judged.results),
        summary: claims::summary(&judged.results),
        checkpoint: checkpoint_record(&read.checkpoint, manifest),
        card: card_record(read),
        reference: measurement.map(|m| m.reference.clone()),
        measurement: measurement.cloned(),
        claims: judged.results,
        sanity: done.map(|d| d.gates.clone()).unwrap_or_default(),
        noise_floor: done.and_then(|d| d.noise_floor.clone()),
        undisclosed: judged.undisclosed,
        lane_differences: judged.lane_differences,
        hub_sources: r
            .pins
            .iter()
            .map(|(role, pin)| report::HubSource::of(*role, pin))
            .collect(),
        definitions: report::verdict_definitions(),
        reference_source: measurement.map(reference_source),
        set_files: Vec::new(),
    }
}

/// The checkpoint verified, file by file: the statement's subjects.
fn checkpoint_record(model: &Path, manifest: &Manifest) -> report::Checkpoint {
    report::Checkpoint {
        path: model.display().to_string(),
        root_sha256: manifest.root_sha256.clone(),
        files: manifest
            .files
            .iter()
            .map(|f| report::CheckpointFile {
                path: f.path.clone(),
                size: f.size,
                sha256: f.sha256.clone(),
            })
            .collect(),
    }
}

/// The card as read: its disclosure with the digests that pin it, and its lint.
fn card_record(read: ReadCard) -> report::CardRecord {
    report::CardRecord {
        path: read.path.display().to_string(),
        fidelity_sha256: crate::card::canonical::fidelity_sha256(&read.disclosure),
        model_index_sha256: crate::card::canonical::fidelity_sha256(
            &crate::card::canonical::model_index_json(&read.card),
        ),
        disclosure: read.disclosure,
        lint: report::LintRecord {
            errors: read.lint.errors(),
            warnings: read.lint.warnings(),
            findings: read
                .lint
                .findings
                .iter()
                .map(|f| report::FindingRecord {
                    code: f.code.to_string(),
                    severity: f.severity.to_string(),
                    message: f.message.clone(),
                    line: f.line,
                })
                .collect(),
        },
    }
}
