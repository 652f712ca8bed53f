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
    let Some((set, pins)) = open_set(
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
    enum Done {
        Sweep(cardproof::rerun::sweep::Sweep),
        Measured(cardproof::rerun::Measurement),
    }
    let result = pool.install(|| -> cardproof::Result<Done> {
        if let (Some(runner), Some((knob, values))) = (&config.transformers, &config.sweep) {
            let sweep = cardproof::rerun::sweep::run_sweep(
                &cardproof::rerun::sweep::SweepRequest {
                    model: &config.candidate,
                    eval_text: config
                        .eval_text
                        .as_deref()
                        .unwrap_or(std::path::Path::new("")),
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
            )?;
            return Ok(Done::Sweep(sweep));
        }
        let lane = cardproof::rerun::Lane::choose(
            config.reference.as_deref(),
            config.reference_artifact.as_deref(),
            config.transformers.as_ref(),
            config.compute,
            config.emulate,
        );
        let rerun = cardproof::rerun::run(
            &cardproof::rerun::Request {
                lane,
                candidate: &config.candidate,
                eval_text: config.eval_text.as_deref(),
                tokenizer: config.tokenizer.as_deref(),
                options: config.options.clone(),
                padding_included: false,
                threads: config.threads,
                candidate_manifest: None,
                gates: None,
                noise_floor: false,
                pins,
            },
            &stage,
            &progress,
        )?;
        let mut measurement = rerun.measurement;
        measurement.run_id = Some(set.run_id().to_owned());
        set.write(
            "positions.safetensors",
            &cardproof::rerun::output::positions_file(&rerun.runs, &measurement.protocol_sha256),
        )?;
        set.write_json("measurement.json", &measurement.to_value())?;
        Ok(Done::Measured(measurement))
    });
    if let Some(bar) = &bar {
        bar.finish_and_clear();
    }
    // The set moves into place whole.
    let result = result.and_then(|done| set.commit().map(|_| done));
    match result {
        Ok(Done::Sweep(sweep)) => {
            printer.sweep(
                &serde_json::to_value(&sweep).unwrap_or_default(),
                &config.out,
            )?;
            Ok(0)
        }
        Ok(Done::Measured(m)) => {
            printer.model_measurement(&m.to_value(), &config.out)?;
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
    let Some((set, pins)) = open_set(
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
                pins,
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
        let written = cardproof::verify::write::write_outputs(set, &mut outcome, &key)?;
        Ok::<_, cardproof::Error>((outcome, written))
    });
    if let Some(bar) = &bar {
        bar.finish_and_clear();
    }
    match result {
        Ok((outcome, written)) => {
            printer.verification(&outcome.report.to_value(), &written)?;
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
    use cardproof::rerun::artifact::Kind;
    let printer = Printer::new(Output::from_args(&args.output));
    let options = cardproof::rerun::MeasureOptions {
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
            return match cardproof::rerun::export::export_llamacpp(
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
    match cardproof::rerun::export::export_reference(
        &args.model,
        &args.eval_text,
        &options,
        cardproof::rerun::artifact::ExportSpec {
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
            let sidecar = cardproof::rerun::artifact::sidecar_path(&args.out);
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

/// The Hub pins of a command's models, gathered as they are resolved (no global state).
type Pins = Vec<(cardproof::rerun::Role, cardproof::rerun::HubPin)>;

/// The run's output set, created before any work (an `--out` that cannot be written fails first),
/// with the Hub pins of its models; `None` once the error is printed.
fn open_set(
    printer: &Printer,
    out: &std::path::Path,
    kind: cardproof::outset::Kind,
    force: bool,
    candidate: &mut std::path::PathBuf,
    reference: Option<&mut std::path::PathBuf>,
) -> io::Result<Option<(cardproof::outset::OutputSet, Pins)>> {
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
    reference: Option<&mut std::path::PathBuf>,
) -> cardproof::Result<(cardproof::outset::OutputSet, Pins)> {
    use cardproof::rerun::Role;
    let mut given: Vec<std::path::PathBuf> = vec![candidate.clone()];
    given.extend(reference.as_deref().cloned());
    let given: Vec<&std::path::Path> = given.iter().map(|p| p.as_path()).collect();
    let set = cardproof::outset::OutputSet::create(
        out,
        &cardproof::outset::SetOptions {
            kind,
            force,
            models: &given,
        },
    )?;
    let mut pins = Pins::new();
    let mut localize = |path: &mut std::path::PathBuf, role: Role| -> cardproof::Result<bool> {
        let (local, pin) = local_path(printer, path)?;
        *path = local;
        let hub = pin.is_some();
        pins.extend(pin.map(|p| (role, p)));
        Ok(hub)
    };
    let mut hub = localize(candidate, Role::Candidate)?;
    let mut local = vec![candidate.clone()];
    if let Some(r) = reference {
        hub |= localize(r, Role::Reference)?;
        local.push(r.clone());
    }
    if hub {
        let local: Vec<&std::path::Path> = local.iter().map(|p| p.as_path()).collect();
        cardproof::outset::outside_checkpoints(out, &local)?;
    }
    Ok((set, pins))
}

/// A path for the local code: a Hub source becomes its verified snapshot folder (all files),
/// with the commit it resolved to.
pub(crate) fn local_path(
    printer: &Printer,
    path: &std::path::Path,
) -> cardproof::Result<(std::path::PathBuf, Option<cardproof::rerun::HubPin>)> {
    match cardproof::hub::HfSource::from_path(path) {
        Some(source) => {
            let source = source?;
            let snapshot = materialize(printer, &hub_client(), &source, Select::All)?;
            let pin = cardproof::rerun::HubPin {
                repo: source.repo.clone(),
                revision: source.revision.clone(),
                commit: snapshot.pinned.revision.clone(),
            };
            Ok((snapshot.dir, Some(pin)))
        }
        None => Ok((path.to_owned(), None)),
    }
}
