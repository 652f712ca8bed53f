//! The `cardproof` binary: parse arguments, validate them, run one command, print, exit.
//!
//! Exit codes: 0 clean, 1 findings, 2 bad input or usage.

mod cli;
mod config;
mod printer;

use std::io;
use std::process::ExitCode;

use clap::Parser;

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
    let card = match cardproof::card::Card::open(&config.path) {
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
    match cardproof::checkpoint::inspect::inspect_path(&config.path) {
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
    let result = pool.install(|| match (&config.reference, &config.reference_artifact) {
        (_, Some(artifact)) => {
            let request = cardproof::measurement::ArtifactRequest {
                artifact,
                candidate: &config.candidate,
                eval_text: config.eval_text.as_deref(),
                options: &config.options,
                compute: config.compute,
                emulate: config.emulate,
                threads: config.threads,
                out: &config.out,
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
                eval_text: config
                    .eval_text
                    .as_deref()
                    .unwrap_or(std::path::Path::new("")),
                tokenizer: config.tokenizer.as_deref(),
                options: &config.options,
                compute: config.compute,
                emulate: config.emulate,
                threads: config.threads,
                out: &config.out,
            },
            &stage,
            &progress,
        ),
    });
    if let Some(bar) = &bar {
        bar.finish_and_clear();
    }
    match result {
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

fn verify(config: &VerifyConfig) -> io::Result<u8> {
    let printer = Printer::new(config.output);
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
        let written = cardproof::verify::write::write_outputs(&config.out, &outcome, &key)?;
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
            cardproof::verify::write::sign_document(&args.file, args.checkpoint.as_deref(), &key)?;
        let text = serde_json::to_vec_pretty(&envelope)
            .map_err(|e| cardproof::Error::malformed(&out, None, format!("cannot encode: {e}")))?;
        cardproof::measurement::write_atomically(&out, &text)?;
        Ok::<_, cardproof::Error>(out)
    })();
    match result {
        Ok(out) => {
            printer.note(&format!("wrote {}", out.display()));
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
        match outcome {
            Outcome::Verified(v) => {
                if let Some(dir) = &args.checkpoint {
                    mismatches.extend(cardproof::attest::check_subjects(&v.statement, dir)?);
                }
                statement = v.statement;
            }
            Outcome::Failed(m) => mismatches.extend(m),
        }
        Ok::<_, cardproof::Error>((cardproof::attest::keyid(&key), statement, mismatches))
    })();
    match result {
        Ok((keyid, statement, mismatches)) => {
            printer.report_check(
                &args.envelope,
                &keyid,
                &statement,
                &mismatches,
                args.checkpoint.as_deref(),
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
        cardproof::measurement::write_atomically(&into, written.text.as_bytes())?;
        let card = cardproof::card::Card::open(&into)?;
        let lint = cardproof::lint::lint(&card);
        Ok::<_, cardproof::Error>((into, written.warnings, lint))
    })();
    match result {
        Ok((into, warnings, lint)) => {
            for w in &warnings {
                printer.note(w);
            }
            printer.note(&format!(
                "wrote {} (lint: {} errors, {} warnings)",
                into.display(),
                lint.errors(),
                lint.warnings()
            ));
            Ok(if lint.errors() > 0 { EXIT_FINDINGS } else { 0 })
        }
        Err(e) => {
            printer.error(&e)?;
            Ok(EXIT_BAD_INPUT)
        }
    }
}

fn export(args: &cli::ExportArgs, p: config::ProtocolConfig) -> io::Result<u8> {
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
                    printer.note(&format!(
                        "wrote {} ({rows} rows: the second half of each {}-token window, as llama-perplexity --kl-divergence-base writes them)",
                        args.out.display(),
                        args.context_length[0]
                    ));
                    Ok(0)
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
            printer.note(&format!(
                "wrote {} ({size} bytes, {rows} scored positions, {:.0} bytes each; digest in {}): {}",
                args.out.display(),
                size as f64 / rows.max(1) as f64,
                cardproof::artifact::sidecar_path(&args.out).display(),
                header.bound
            ));
            Ok(0)
        }
        Err(e) => {
            printer.error(&e)?;
            Ok(EXIT_BAD_INPUT)
        }
    }
}
