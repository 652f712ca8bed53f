//! The `cardproof` binary: parse arguments, validate them, run one command, print, exit.
//!
//! Exit codes: 0 clean, 1 findings, 2 bad input or usage.

mod cli;
mod config;
mod printer;

use std::io;
use std::process::ExitCode;

use clap::Parser;

use cardproof::hub::snapshot::Select;
use cli::{Cli, Command};
use config::{
    HashConfig, InspectConfig, KldConfig, LintConfig, MeasureConfig, Output, VerifyConfig,
};
use printer::Printer;

const EXIT_FINDINGS: u8 = 1;
const EXIT_BAD_INPUT: u8 = 2;

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let code = if e.use_stderr() { EXIT_BAD_INPUT } else { 0 };
            let _ = e.print();
            return ExitCode::from(code);
        }
    };
    if let Some(output) = sarif_misused(&cli.command) {
        return ExitCode::from(
            usage_error(output, "--format sarif is for `lint` and `check` only")
                .unwrap_or(EXIT_BAD_INPUT),
        );
    }
    let result = match cli.command {
        Command::Lint(args) => {
            let config = LintConfig {
                path: args.path,
                output: Output::from_args(&args.output),
            };
            lint(&config)
        }
        Command::Schema => schema(),
        Command::Inspect(args) => inspect(&InspectConfig {
            path: args.path,
            list_modules: args.modules,
            output: Output::from_args(&args.output),
        }),
        Command::Kld(args) => {
            let output = Output::from_args(&args.output);
            match KldConfig::from_args(args) {
                Ok(config) => kld(&config),
                Err(message) => usage_error(output, &message),
            }
        }
        Command::Measure(args) => {
            let output = Output::from_args(&args.output);
            match MeasureConfig::from_args(args) {
                Ok(config) => measure(&config),
                Err(message) => usage_error(output, &message),
            }
        }
        Command::Verify(args) => {
            let output = Output::from_args(&args.output);
            match VerifyConfig::from_args(args) {
                Ok(config) => verify(&config),
                Err(message) => usage_error(output, &message),
            }
        }
        Command::Card(args) => card(&args),
        Command::Reference(cli::ReferenceCommand::Export(args)) => {
            let output = Output::from_args(&args.output);
            match config::ProtocolConfig::from_args(&args.protocol) {
                Ok(p) => export(&args, p),
                Err(message) => usage_error(output, &message),
            }
        }
        Command::Keygen(args) => keygen(&args.out, Output::from_args(&args.output)),
        Command::Sign(args) => sign(&args),
        Command::VerifyReport(args) => verify_report(&args),
        Command::Check(args) => check(&args),
        Command::Hash(args) => {
            let output = Output::from_args(&args.output);
            hash(&HashConfig {
                path: args.path,
                options: cardproof::checkpoint::hash::HashOptions {
                    threads: args.threads.map(usize::from),
                    include_all: args.all,
                },
                progress: std::io::IsTerminal::is_terminal(&std::io::stderr()),
                output,
            })
        }
    };
    match result {
        Ok(code) => ExitCode::from(code),
        // A closed pipe (`cardproof schema | head`) is not an error.
        Err(e) if e.kind() == io::ErrorKind::BrokenPipe => ExitCode::SUCCESS,
        Err(_) => ExitCode::from(EXIT_BAD_INPUT),
    }
}

fn lint(config: &LintConfig) -> io::Result<u8> {
    let printer = Printer::new(config.output);
    // A Hub source: only the card is fetched (into the Hugging Face cache).
    let card = match cardproof::hub::HfSource::from_path(&config.path) {
        Some(source) => source.and_then(|source| {
            let client = hub_client();
            let snapshot = materialize(&printer, &client, &source, Select::Only(&["README.md"]))?;
            let path = snapshot.dir.join("README.md");
            let bytes =
                cardproof::files::read_capped(&path, cardproof::card::MAX_CARD_BYTES, "a card")?;
            cardproof::card::Card::from_bytes(
                snapshot.pinned.display_path(Some("README.md")),
                bytes,
            )
        }),
        None => cardproof::card::Card::open(&config.path),
    };
    let card = match card {
        Ok(card) => card,
        Err(e) => {
            printer.error(&e)?;
            return Ok(EXIT_BAD_INPUT);
        }
    };
    // A model directory: check the card against the checkpoint it describes.
    let inspections = if config.path.is_dir() && cardproof::checkpoint::has_checkpoint(&config.path)
    {
        match cardproof::checkpoint::inspect::inspect_path(&config.path) {
            Ok(inspections) => inspections,
            Err(e) => {
                printer.error(&e)?;
                return Ok(EXIT_BAD_INPUT);
            }
        }
    } else {
        Vec::new()
    };
    let report = cardproof::lint::lint_with_checkpoint(&card, &inspections);
    printer.lint(&card, &report)?;
    Ok(if report.errors() > 0 {
        EXIT_FINDINGS
    } else {
        0
    })
}

fn schema() -> io::Result<u8> {
    let printer = Printer::new(Output {
        format: config::Format::Json,
        color: false,
    });
    printer.document(&cardproof::disclosure::json_schema_text())?;
    Ok(0)
}

fn inspect(config: &InspectConfig) -> io::Result<u8> {
    let printer = Printer::new(config.output);
    let result = match cardproof::hub::HfSource::from_path(&config.path) {
        Some(source) => source.and_then(|source| inspect_hub(&printer, &source)),
        None => cardproof::checkpoint::inspect::inspect_path(&config.path),
    };
    match result {
        Ok(inspections) => {
            printer.inspection(&inspections, config.list_modules)?;
            Ok(0)
        }
        Err(e) => {
            printer.error(&e)?;
            Ok(EXIT_BAD_INPUT)
        }
    }
}

fn hash(config: &HashConfig) -> io::Result<u8> {
    let printer = Printer::new(config.output);
    if cardproof::hub::HfSource::from_path(&config.path).is_some() {
        return match local_path(&printer, &config.path) {
            Ok((path, _)) => hash(&HashConfig {
                path,
                ..config.clone()
            }),
            Err(e) => {
                printer.error(&e)?;
                Ok(EXIT_BAD_INPUT)
            }
        };
    }
    let bar = config
        .progress
        .then(|| printer::progress_bar(printer::HASH_PROGRESS));
    let progress = |n: u64| {
        if let Some(bar) = &bar {
            bar.inc(n);
        }
    };
    if let Some(bar) = &bar {
        let total = cardproof::checkpoint::hash::total_size(&config.path, &config.options);
        bar.set_length(total.unwrap_or(0));
    }
    let result = cardproof::checkpoint::hash::hash_path(&config.path, &config.options, &progress);
    if let Some(bar) = &bar {
        bar.finish_and_clear();
    }
    match result {
        Ok(manifest) => {
            printer.manifest(&manifest)?;
            Ok(0)
        }
        Err(e) => {
            printer.error(&e)?;
            Ok(EXIT_BAD_INPUT)
        }
    }
}

/// A usage error found after parsing (inconsistent flags): exit 2 with one message.
fn usage_error(output: Output, message: &str) -> io::Result<u8> {
    Printer::new(output).usage_error(message)?;
    Ok(EXIT_BAD_INPUT)
}

fn kld(config: &KldConfig) -> io::Result<u8> {
    let printer = Printer::new(config.output);
    if config.llamacpp_compat {
        return match cardproof::measure::compat::compat_measure(
            &config.reference,
            &config.candidate,
        ) {
            Ok(result) => {
                printer.compat(&result)?;
                Ok(0)
            }
            Err(e) => {
                printer.error(&e)?;
                Ok(EXIT_BAD_INPUT)
            }
        };
    }
    match cardproof::measure::measure(&config.reference, &config.candidate, &config.options) {
        Ok(m) => {
            printer.measurement(&m)?;
            Ok(0)
        }
        Err(e) => {
            printer.error(&e)?;
            Ok(EXIT_BAD_INPUT)
        }
    }
}

fn measure(config: &MeasureConfig) -> io::Result<u8> {
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

fn verify(config: &VerifyConfig) -> io::Result<u8> {
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

fn keygen(dir: &std::path::Path, output: Output) -> io::Result<u8> {
    let printer = Printer::new(output);
    let result = cardproof::attest::generate_key()
        .and_then(|key| cardproof::attest::write_keypair(dir, &key).map(|paths| (key, paths)));
    match result {
        Ok((key, (private, public))) => {
            printer.keys(
                &private,
                &public,
                &cardproof::attest::keyid(&key.verifying_key()),
            )?;
            Ok(0)
        }
        Err(e) => {
            printer.error(&e)?;
            Ok(EXIT_BAD_INPUT)
        }
    }
}

fn signing_key(
    printer: &Printer,
    path: Option<&std::path::Path>,
) -> cardproof::Result<ed25519_dalek::SigningKey> {
    match path {
        Some(path) => cardproof::attest::read_signing_key(path),
        None => cardproof::attest::default_signing_key().map(|(key, path, created)| {
            if created {
                printer.note(&format!(
                    "created your signing key {} (public key beside it); reports are signed with it",
                    path.display()
                ));
            }
            key
        }),
    }
}

fn sign(args: &cli::SignArgs) -> io::Result<u8> {
    let printer = Printer::new(Output::from_args(&args.output));
    let result = (|| {
        let key = signing_key(&printer, args.key.as_deref())?;
        let out = args.out.clone().unwrap_or_else(|| {
            let name = args
                .file
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            let stem = name.strip_suffix(".json").unwrap_or(&name);
            args.file.with_file_name(format!("{stem}.dsse.json"))
        });
        let envelope =
            cardproof::attest::sign_document(&args.file, args.checkpoint.as_deref(), &key)?;
        let text = serde_json::to_vec_pretty(&envelope)
            .map_err(|e| cardproof::Error::malformed(&out, None, format!("cannot encode: {e}")))?;
        cardproof::files::write_atomically(&out, &text)?;
        // What was signed, read back from the envelope's payload.
        let parts = cardproof::attest::dsse::EnvelopeParts::from_value(&out, &envelope)?;
        let statement: serde_json::Value = serde_json::from_slice(&parts.payload)
            .map_err(|e| cardproof::Error::malformed(&out, Some("payload"), e.to_string()))?;
        let sha256 = cardproof::checkpoint::hash::hash_file(&out)?;
        let keyid = cardproof::attest::keyid(&key.verifying_key());
        Ok::<_, cardproof::Error>((out, sha256, keyid, statement))
    })();
    match result {
        Ok((out, sha256, keyid, statement)) => {
            printer.signed(&printer::Signed {
                envelope: &out,
                sha256: &sha256,
                file: &args.file,
                keyid: &keyid,
                predicate_type: statement["predicateType"].as_str().unwrap_or_default(),
                subjects: statement["subject"].as_array().map_or(0, Vec::len),
            })?;
            Ok(0)
        }
        Err(e) => {
            printer.error(&e)?;
            Ok(EXIT_BAD_INPUT)
        }
    }
}

fn verify_report(args: &cli::VerifyReportArgs) -> io::Result<u8> {
    use cardproof::attest::Outcome;
    let printer = Printer::new(Output::from_args(&args.output));
    let result = (|| {
        let key = cardproof::attest::read_verifying_key(&args.public_key)?;
        let outcome = cardproof::attest::verify_envelope(&args.envelope, &key)?;
        let mut mismatches = Vec::new();
        let mut statement = serde_json::Value::Null;
        let mut card = None;
        match outcome {
            Outcome::Verified(v) => {
                if let Some(dir) = &args.checkpoint {
                    mismatches.extend(cardproof::attest::check_subjects(&v.statement, dir)?);
                }
                if let Some((path, m)) = cardproof::attest::check_card(
                    &v.statement,
                    args.card.as_deref(),
                    args.checkpoint.as_deref(),
                )? {
                    mismatches.extend(m);
                    card = Some(path);
                }
                mismatches.extend(cardproof::outset::check_set(&args.envelope, &v.statement)?);
                statement = v.statement;
            }
            Outcome::Failed(m) => mismatches.extend(m),
        }
        Ok::<_, cardproof::Error>((cardproof::attest::keyid(&key), statement, mismatches, card))
    })();
    match result {
        Ok((keyid, statement, mismatches, card)) => {
            printer.report_check(
                &args.envelope,
                &keyid,
                &statement,
                &mismatches,
                args.checkpoint.as_deref(),
                card.as_deref(),
            )?;
            Ok(if mismatches.is_empty() {
                0
            } else {
                EXIT_FINDINGS
            })
        }
        Err(e) => {
            printer.error(&e)?;
            Ok(EXIT_BAD_INPUT)
        }
    }
}

fn card(args: &cli::CardArgs) -> io::Result<u8> {
    let printer = Printer::new(Output::from_args(&args.output));
    let result = (|| {
        let text = std::fs::read_to_string(&args.measurement)
            .map_err(|e| cardproof::Error::io(&args.measurement, e))?;
        let measurement: serde_json::Value = serde_json::from_str(&text).map_err(|e| {
            cardproof::Error::malformed(&args.measurement, None, format!("not JSON: {e}"))
        })?;
        let into = match &args.into {
            Some(p) => p.clone(),
            None => {
                // A Hub candidate was measured from the Hugging Face cache, which must never be
                // written to (its snapshot would then differ from the Hub).
                if let Some(repo) = measurement["candidate"]["hub"]["repo"].as_str() {
                    return Err(cardproof::Error::malformed(
                        &args.measurement,
                        Some("candidate.hub"),
                        format!(
                            "the candidate was measured from hf:{repo}; pass --into with the \
                             card of your local clone (cardproof never writes into the Hugging \
                             Face cache)"
                        ),
                    ));
                }
                let candidate = measurement["candidate"]["path"].as_str().ok_or_else(|| {
                    cardproof::Error::malformed(
                        &args.measurement,
                        Some("candidate.path"),
                        "missing; pass --into README.md",
                    )
                })?;
                let c = std::path::Path::new(candidate);
                let dir = if c.is_file() {
                    c.parent().unwrap_or(c)
                } else {
                    c
                };
                dir.join("README.md")
            }
        };
        let existing = match std::fs::read_to_string(&into) {
            Ok(t) => Some(t),
            Err(e) if e.kind() == io::ErrorKind::NotFound => None,
            Err(e) => return Err(cardproof::Error::io(&into, e)),
        };
        let written = cardproof::card::write::write_card(
            existing.as_deref(),
            &into,
            &cardproof::card::write::CardInputs {
                measurement,
                reference_repo: args.reference_repo.clone(),
                reference_revision: args.reference_revision.clone(),
                candidate_repo: args.candidate_repo.clone(),
                candidate_revision: args.candidate_revision.clone(),
            },
        )?;
        cardproof::files::write_atomically(&into, written.text.as_bytes())?;
        let sha256 = cardproof::checkpoint::hash::hash_file(&into)?;
        let card = cardproof::card::Card::open(&into)?;
        let lint = cardproof::lint::lint(&card);
        Ok::<_, cardproof::Error>((into, existing.is_none(), sha256, written.warnings, lint))
    })();
    match result {
        Ok((into, created, sha256, warnings, lint)) => {
            printer.card_written(&printer::CardWritten {
                card: &into,
                created,
                sha256: &sha256,
                measurement: &args.measurement,
                lint: &lint,
                warnings: &warnings,
            })?;
            Ok(if lint.errors() > 0 { EXIT_FINDINGS } else { 0 })
        }
        Err(e) => {
            printer.error(&e)?;
            Ok(EXIT_BAD_INPUT)
        }
    }
}

fn export(args: &cli::ExportArgs, p: config::ProtocolConfig) -> io::Result<u8> {
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

/// The Hub client for this command, from the environment (`HF_ENDPOINT`, `HF_TOKEN`, ...).
fn hub_client() -> cardproof::hub::Client {
    cardproof::hub::Client::new(cardproof::hub::HubConfig::from_env())
}

/// Make the selected files of a Hub source present and verified in the Hugging Face cache, with
/// a download progress bar on a terminal, and say which commit was used.
fn materialize(
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
fn local_path(
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

/// `inspect hf:...`: headers only by Range requests; offline, the cached snapshot.
fn inspect_hub(
    printer: &Printer,
    source: &cardproof::hub::HfSource,
) -> cardproof::Result<Vec<cardproof::checkpoint::inspect::Inspection>> {
    let client = hub_client();
    if client.config().offline {
        let snapshot = materialize(printer, &client, source, Select::All)?;
        return cardproof::checkpoint::inspect::inspect_path(&snapshot.dir);
    }
    let info = client.repo_info(source)?;
    let pinned = source.at(&info.sha);
    let remote = cardproof::hub::remote::inspect_remote(&client, &pinned, &info)?;
    printer.note(&format!(
        "{source} is commit {}: fetched {} of {} bytes",
        info.sha,
        client.bytes_fetched(),
        info.total_size()
    ));
    Ok(remote.inspections)
}

fn check(args: &cli::CheckArgs) -> io::Result<u8> {
    let printer = Printer::new(Output::from_args(&args.output));
    let result = (|| {
        let source = cardproof::hub::HfSource::parse(&args.source)?;
        let key = args
            .public_key
            .as_deref()
            .map(cardproof::attest::read_verifying_key)
            .transpose()?;
        cardproof::hub::check::check(&hub_client(), &source, key.as_ref())
    })();
    match result {
        Ok(report) => {
            printer.check(&report)?;
            Ok(if report.errors() > 0 {
                EXIT_FINDINGS
            } else {
                0
            })
        }
        Err(e) => {
            printer.error(&e)?;
            Ok(EXIT_BAD_INPUT)
        }
    }
}

/// The output settings of a command that was given `--format sarif` but cannot print SARIF.
fn sarif_misused(command: &Command) -> Option<Output> {
    let output = match command {
        Command::Lint(_) | Command::Check(_) | Command::Schema => return None,
        Command::Inspect(a) => &a.output,
        Command::Hash(a) => &a.output,
        Command::Kld(a) => &a.output,
        Command::Measure(a) => &a.output,
        Command::Verify(a) => &a.output,
        Command::Card(a) => &a.output,
        Command::Keygen(a) => &a.output,
        Command::Sign(a) => &a.output,
        Command::Reference(cli::ReferenceCommand::Export(a)) => &a.output,
        Command::VerifyReport(a) => &a.output,
    };
    let parsed = Output::from_args(output);
    (parsed.format == config::Format::Sarif).then_some(Output {
        format: config::Format::Human,
        ..parsed
    })
}
