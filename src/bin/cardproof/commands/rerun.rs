//! The rerun commands (`measure`, `verify`, `reference export`) and the Hub helpers that make
//! `hf:` sources local, moved here unchanged from main.rs; their rewrite (issue #15) turns them
//! into commands returning outcomes like the others. Until then they print and choose their exit
//! code themselves.

use std::io;

use cardproof::hub::snapshot::Select;

use super::{hub_client, signing_key};
use crate::config::{self, MeasureConfig, Output, VerifyConfig};
use crate::printer::{self, Printer};
use crate::{EXIT_BAD_INPUT, EXIT_FINDINGS, cli};

/// A usage error found after parsing (inconsistent flags): exit 2 with one message.
fn usage_error(output: Output, message: &str) -> io::Result<u8> {
    Printer::new(output).usage_error(message)?;
    Ok(EXIT_BAD_INPUT)
}

pub(crate) fn measure(config: &MeasureConfig) -> io::Result<u8> {
    let printer = Printer::new(config.output);
    // The output set first: an --out that cannot be written fails before any download or work.
    let mut config = config.clone();
    let Some(set) = open_set(
        &printer,
        &config.out,
        cardproof::outset::Kind::Measure,
        config.force,
        &mut config.candidate,
        config.reference.as_mut(),
    )?
    else {
        return Ok(EXIT_BAD_INPUT);
    };
    let config = &config;
    let out = set.dir().to_owned();
    let pool = match rayon::ThreadPoolBuilder::new()
        .num_threads(config.threads)
        .build()
    {
        Ok(pool) => pool,
        Err(e) => {
            return usage_error(
                config.output,
                &format!("cannot start {} threads: {e}", config.threads),
            );
        }
    };
    let bar = config
        .progress
        .then(|| printer::progress_bar(printer::MEASURE_PROGRESS));
    let stage = |stage: &str| {
        if let Some(bar) = &bar {
            bar.set_message(stage.to_owned());
        }
    };
    let progress = |done: usize, total: usize| {
        if let Some(bar) = &bar {
            bar.set_length(total as u64);
            bar.set_position(done as u64);
        }
    };
    let eval_text = config
        .eval_text
        .as_deref()
        .unwrap_or(std::path::Path::new(""));
    let result = pool.install(|| match (&config.reference, &config.reference_artifact) {
        _ if config.sweep.is_some() => {
            let (Some(runner), Some((knob, values))) = (&config.transformers, &config.sweep) else {
                unreachable!("the config checks --sweep has --runner transformers")
            };
            cardproof::measurement::run_sweep(
                &cardproof::measurement::SweepRequest {
                    model: &config.candidate,
                    eval_text,
                    tokenizer: config.tokenizer.as_deref(),
                    options: &config.options,
                    runner,
                    knob,
                    values,
                    threads: config.threads,
                    out: &out,
                    run_id: Some(set.run_id()),
                },
                &stage,
                &progress,
            )
        }
        (Some(reference), None) if config.transformers.is_some() => {
            cardproof::measurement::run_transformers(
                &cardproof::measurement::TransformersRequest {
                    reference,
                    candidate: &config.candidate,
                    eval_text,
                    tokenizer: config.tokenizer.as_deref(),
                    options: &config.options,
                    runner: config.transformers.as_ref().expect("checked"),
                    threads: config.threads,
                    out: &out,
                    candidate_manifest: None,
                },
                &stage,
                &progress,
            )
        }
        (_, Some(artifact)) => {
            let request = cardproof::measurement::ArtifactRequest {
                artifact,
                candidate: &config.candidate,
                eval_text: config.eval_text.as_deref(),
                options: &config.options,
                compute: config.compute,
                emulate: config.emulate,
                threads: config.threads,
                out: &out,
                candidate_manifest: None,
            };
            if cardproof::measure::source::is_llamacpp_base(artifact) {
                cardproof::measurement::run_with_base_file(&request, &stage, &progress)
            } else {
                cardproof::measurement::run_with_artifact(&request, &stage, &progress)
            }
        }
        (reference, None) => cardproof::measurement::run_native(
            &cardproof::measurement::NativeRequest {
                reference: reference.as_deref().unwrap_or(std::path::Path::new(".")),
                candidate: &config.candidate,
                eval_text,
                tokenizer: config.tokenizer.as_deref(),
                options: &config.options,
                compute: config.compute,
                emulate: config.emulate,
                threads: config.threads,
                out: &out,
                candidate_manifest: None,
            },
            &stage,
            &progress,
        ),
    });
    if let Some(bar) = &bar {
        bar.finish_and_clear();
    }
    // The measurement gets the run id and the Hub pins, then the set moves into place whole.
    let result = result.and_then(|document| {
        let document = if config.sweep.is_some() {
            document
        } else {
            set.write_json("measurement.json", &with_hub_pins(document))?
        };
        set.commit().map(|_| document)
    });
    match result {
        Ok(document) if config.sweep.is_some() => {
            printer.sweep(&document, &config.out)?;
            Ok(0)
        }
        Ok(document) => {
            printer.model_measurement(&document, &config.out)?;
            Ok(0)
        }
        Err(e) => {
            printer.error(&e)?;
            Ok(EXIT_BAD_INPUT)
        }
    }
}

pub(crate) fn verify(config: &VerifyConfig) -> io::Result<u8> {
    let printer = Printer::new(config.output);
    // The output set first: an --out that cannot be written fails before any download or work.
    let mut config = config.clone();
    let Some(set) = open_set(
        &printer,
        &config.out,
        cardproof::outset::Kind::Verify,
        config.force,
        &mut config.path,
        config.reference.as_mut(),
    )?
    else {
        return Ok(EXIT_BAD_INPUT);
    };
    let config = &config;
    let key = match signing_key(&printer, config.key.as_deref()) {
        Ok(key) => key,
        Err(e) => {
            printer.error(&e)?;
            return Ok(EXIT_BAD_INPUT);
        }
    };
    let pool = match rayon::ThreadPoolBuilder::new()
        .num_threads(config.threads)
        .build()
    {
        Ok(pool) => pool,
        Err(e) => {
            return usage_error(
                config.output,
                &format!("cannot start {} threads: {e}", config.threads),
            );
        }
    };
    let bar = config
        .progress
        .then(|| printer::progress_bar(printer::MEASURE_PROGRESS));
    let result = pool.install(|| {
        let outcome = cardproof::verify::verify(
            &cardproof::verify::VerifyRequest {
                model: &config.path,
                reference: config.reference.as_deref(),
                reference_artifact: config.reference_artifact.as_deref(),
                eval_text: config.eval_text.as_deref(),
                threads: config.threads,
                noise_floor: config.noise_floor,
                transformers: config.transformers.as_ref(),
            },
            &|stage: &str| {
                if let Some(bar) = &bar {
                    bar.set_message(stage.to_owned());
                }
            },
            &|done, total| {
                if let Some(bar) = &bar {
                    bar.set_length(total as u64);
                    bar.set_position(done as u64);
                }
            },
        )?;
        let mut outcome = outcome;
        let pins = hub_pins_json();
        if !pins.is_empty() {
            // Signed with the rest: which Hub commit the verified files came from.
            outcome.report["hub_sources"] = serde_json::Value::Array(pins);
        }
        let written = cardproof::verify::write::write_outputs(set, &mut outcome, &key)?;
        Ok::<_, cardproof::Error>((outcome, written))
    });
    if let Some(bar) = &bar {
        bar.finish_and_clear();
    }
    match result {
        Ok((outcome, written)) => {
            printer.verification(&outcome.report, &written)?;
            Ok(
                if outcome.verdict == cardproof::verify::claims::Verdict::Reproduced {
                    0
                } else {
                    EXIT_FINDINGS
                },
            )
        }
        Err(e) => {
            printer.error(&e)?;
            Ok(EXIT_BAD_INPUT)
        }
    }
}

pub(crate) fn export(args: &cli::ExportArgs, p: config::ProtocolConfig) -> io::Result<u8> {
    use cardproof::artifact::Kind;
    let printer = Printer::new(Output::from_args(&args.output));
    let options = cardproof::measurement::MeasureOptions {
        direction: p.direction,
        vocab: p.vocab,
        positions: p.positions,
        bootstrap: p.bootstrap,
        context_lengths: args.context_length.clone(),
        bos: match args.bos {
            cli::BosArg::None => cardproof::runner::tokens::Bos::None,
            cli::BosArg::PerWindow => cardproof::runner::tokens::Bos::PerWindow,
            cli::BosArg::PerDocument => cardproof::runner::tokens::Bos::PerDocument,
        },
        vocab_size: p.vocab_size,
        dump_logits: None,
    };
    let threads = args
        .threads
        .map(usize::from)
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, usize::from));
    let kind = match args.kind {
        cli::ArtifactKindArg::Hidden => Kind::Hidden,
        cli::ArtifactKindArg::TopK => Kind::TopK,
        cli::ArtifactKindArg::Llamacpp => {
            if args.context_length.len() != 1 {
                return usage_error(
                    Output::from_args(&args.output),
                    "--kind llamacpp takes exactly one --context-length (a base file has one n_ctx)",
                );
            }
            return match cardproof::measurement::export_llamacpp(
                &args.model,
                &args.eval_text,
                args.context_length[0],
                options.bos,
                &args.out,
            ) {
                Ok(rows) => {
                    let note = format!(
                        "wrote {} ({rows} rows: the second half of each {}-token window, as llama-perplexity --kl-divergence-base writes them)",
                        args.out.display(),
                        args.context_length[0]
                    );
                    exported(
                        &printer,
                        &args.out,
                        "llamacpp",
                        None,
                        rows as usize,
                        None,
                        note,
                    )
                }
                Err(e) => {
                    printer.error(&e)?;
                    Ok(EXIT_BAD_INPUT)
                }
            };
        }
    };
    match cardproof::measurement::export_reference(
        &args.model,
        &args.eval_text,
        &options,
        cardproof::artifact::ExportSpec {
            kind,
            k: args.artifact_top_k,
            hidden_bf16: args.bf16,
        },
        {
            let mut extra = serde_json::Map::new();
            if let Some(repo) = &args.repo {
                extra.insert("repo".into(), repo.clone().into());
            }
            if let Some(rev) = &args.revision {
                extra.insert("revision".into(), rev.clone().into());
            }
            serde_json::Value::Object(extra)
        },
        threads,
        &args.out,
    ) {
        Ok(header) => {
            let size = std::fs::metadata(&args.out).map(|m| m.len()).unwrap_or(0);
            let rows: usize = header.runs.iter().map(|r| r.rows).sum();
            let sidecar = cardproof::artifact::sidecar_path(&args.out);
            let note = format!(
                "wrote {} ({size} bytes, {rows} scored positions, {:.0} bytes each; digest in {}): {}",
                args.out.display(),
                size as f64 / rows.max(1) as f64,
                sidecar.display(),
                header.bound
            );
            let kind = match header.kind {
                Kind::Hidden => "hidden",
                Kind::TopK => "top_k",
            };
            exported(
                &printer,
                &args.out,
                kind,
                Some(&sidecar),
                rows,
                Some(&header.bound),
                note,
            )
        }
        Err(e) => {
            printer.error(&e)?;
            Ok(EXIT_BAD_INPUT)
        }
    }
}

/// Print what `reference export` wrote: the artifact's digest and size are read back from disk.
fn exported(
    printer: &Printer,
    artifact: &std::path::Path,
    kind: &str,
    sidecar: Option<&std::path::Path>,
    rows: usize,
    bound: Option<&str>,
    note: String,
) -> io::Result<u8> {
    let digest = cardproof::checkpoint::hash::hash_file(artifact).and_then(|sha256| {
        let size = std::fs::metadata(artifact)
            .map_err(|e| cardproof::Error::io(artifact, e))?
            .len();
        Ok((sha256, size))
    });
    match digest {
        Ok((sha256, size)) => {
            printer.exported(&printer::Exported {
                artifact,
                kind,
                sha256: &sha256,
                size,
                sidecar,
                rows,
                bound,
                note,
            })?;
            Ok(0)
        }
        Err(e) => {
            printer.error(&e)?;
            Ok(EXIT_BAD_INPUT)
        }
    }
}

/// Make the selected files of a Hub source present and verified in the Hugging Face cache, with
/// a download progress bar on a terminal, and say which commit was used.
pub(crate) fn materialize(
    printer: &Printer,
    client: &cardproof::hub::Client,
    source: &cardproof::hub::HfSource,
    select: Select<'_>,
) -> cardproof::Result<cardproof::hub::snapshot::Snapshot> {
    let bar = std::io::IsTerminal::is_terminal(&std::io::stderr())
        .then(|| printer::progress_bar(printer::DOWNLOAD_PROGRESS));
    let progress = |done: u64, total: u64| {
        if let Some(bar) = &bar {
            bar.set_length(total);
            bar.set_position(done);
        }
    };
    let result = cardproof::hub::snapshot::materialize(client, source, select, &progress);
    if let Some(bar) = &bar {
        bar.finish_and_clear();
    }
    let snapshot = result?;
    printer.note(&format!(
        "{source} is commit {} ({}; {} file(s) downloaded and verified, the rest from the cache {})",
        snapshot.pinned.revision,
        if client.config().offline {
            "offline"
        } else {
            "pinned"
        },
        snapshot.downloaded.len(),
        snapshot.dir.display()
    ));
    Ok(snapshot)
}

/// A Hub source resolved for this command: its role, the source as given and the commit.
struct HubPin {
    role: &'static str,
    source: cardproof::hub::HfSource,
    commit: String,
}

/// The Hub sources this command resolved. One command runs per process, so a global carries
/// them past the local code (which sees only snapshot folders) into the outputs.
static HUB_PINS: std::sync::Mutex<Vec<HubPin>> = std::sync::Mutex::new(Vec::new());

fn hub_pins_json() -> Vec<serde_json::Value> {
    HUB_PINS
        .lock()
        .map(|pins| {
            pins.iter()
                .map(|p| {
                    serde_json::json!({
                        "role": p.role,
                        "repo": p.source.repo,
                        "revision": p.source.revision,
                        "commit": p.commit,
                    })
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Record the pinned commits of Hub models in a measurement: beside each model's identity
/// (`hub`) and as `repo`/`revision` of the ready `fidelity:` block.
fn with_hub_pins(mut document: serde_json::Value) -> serde_json::Value {
    let Ok(pins) = HUB_PINS.lock() else {
        return document;
    };
    for pin in pins.iter() {
        let pinned = serde_json::json!({
            "repo": pin.source.repo,
            "revision": pin.source.revision,
            "commit": pin.commit,
        });
        if document[pin.role].is_object() {
            document[pin.role]["hub"] = pinned;
        }
        if document["fidelity"][pin.role].is_object() {
            document["fidelity"][pin.role]["repo"] = pin.source.repo.clone().into();
            document["fidelity"][pin.role]["revision"] = pin.commit.clone().into();
        }
    }
    document
}

/// The run's output set, created before any work (an `--out` that cannot be written fails first);
/// `None` once the error is printed.
fn open_set(
    printer: &Printer,
    out: &std::path::Path,
    kind: cardproof::outset::Kind,
    force: bool,
    candidate: &mut std::path::PathBuf,
    reference: Option<&mut std::path::PathBuf>,
) -> io::Result<Option<cardproof::outset::OutputSet>> {
    match create_set(printer, out, kind, force, candidate, reference) {
        Ok(set) => Ok(Some(set)),
        Err(e) => printer.error(&e).map(|()| None),
    }
}

/// Open the output set of a run before any work ([`cardproof::outset`]: the policy for what
/// `out` holds, the lock, the temporary directory), then replace `hf:` sources by their verified
/// snapshots and check `out` against those too.
fn create_set(
    printer: &Printer,
    out: &std::path::Path,
    kind: cardproof::outset::Kind,
    force: bool,
    candidate: &mut std::path::PathBuf,
    mut reference: Option<&mut std::path::PathBuf>,
) -> cardproof::Result<cardproof::outset::OutputSet> {
    let models =
        |c: &std::path::PathBuf, r: Option<&std::path::PathBuf>| -> Vec<std::path::PathBuf> {
            std::iter::once(c.clone()).chain(r.cloned()).collect()
        };
    let given = models(candidate, reference.as_deref());
    let given: Vec<&std::path::Path> = given.iter().map(|p| p.as_path()).collect();
    let set = cardproof::outset::OutputSet::create(
        out,
        &cardproof::outset::SetOptions {
            kind,
            force,
            models: &given,
        },
    )?;
    if is_hub(candidate) || reference.as_deref().is_some_and(|r| is_hub(r)) {
        localize(printer, candidate, reference.as_deref_mut())?;
        let local = models(candidate, reference.as_deref());
        let local: Vec<&std::path::Path> = local.iter().map(|p| p.as_path()).collect();
        cardproof::outset::outside_checkpoints(out, &local)?;
    }
    Ok(set)
}

/// A path for the local code: a Hub source becomes its verified snapshot folder (all files),
/// and its commit is remembered for the outputs.
fn is_hub(path: &std::path::Path) -> bool {
    cardproof::hub::HfSource::from_path(path).is_some()
}

/// Replace the candidate's and the reference's `hf:` sources by their downloaded, verified
/// snapshots.
fn localize(
    printer: &Printer,
    candidate: &mut std::path::PathBuf,
    reference: Option<&mut std::path::PathBuf>,
) -> cardproof::Result<()> {
    *candidate = local_path(printer, candidate, "candidate")?;
    if let Some(r) = reference {
        *r = local_path(printer, r, "reference")?;
    }
    Ok(())
}

pub(crate) fn local_path(
    printer: &Printer,
    path: &std::path::Path,
    role: &'static str,
) -> cardproof::Result<std::path::PathBuf> {
    match cardproof::hub::HfSource::from_path(path) {
        Some(source) => {
            let source = source?;
            let snapshot = materialize(printer, &hub_client(), &source, Select::All)?;
            if let Ok(mut pins) = HUB_PINS.lock() {
                pins.push(HubPin {
                    role,
                    source,
                    commit: snapshot.pinned.revision.clone(),
                });
            }
            Ok(snapshot.dir)
        }
        None => Ok(path.to_owned()),
    }
}
