//! The `cardproof` binary: parse arguments, validate them, run one command, print, exit.
//!
//! Exit codes: 0 clean, 1 findings, 2 bad input or usage, chosen in one place ([`exit_code`]).

mod cli;
mod commands;
mod config;
mod printer;
mod runtime;

use std::io;
use std::process::ExitCode;

use clap::Parser;

use cli::{Cli, Command, OutputArgs};
use commands::{Class, Failure, Outcome};
use config::{Format, InspectConfig, KldConfig, LintConfig, Output};
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
    // `--threads N` (default: every core) for every pool in the process, before any starts.
    runtime::configure(
        cli.command
            .threads()
            .map_or_else(config::cores, usize::from),
    );
    let output = match output_args(&cli.command) {
        None => Ok(Output {
            format: Format::Json,
            color: false,
        }),
        Some((name, args)) => Output::for_command(args, name),
    };
    let (output, finished) = match output {
        Ok(output) => (output, run(cli.command, &Printer::new(output))),
        // A format the command does not print: refused before any work, in words.
        Err((output, message)) => (output, Ok(Finished::Failed(Failure::Usage(message)))),
    };
    // An interrupted run ends by its signal, not by the failure its killed children caused.
    cardproof::runner::child::wait_if_interrupted();
    ExitCode::from(exit_code(&Printer::new(output), finished))
}

/// How a command ended, for [`exit_code`].
enum Finished {
    /// Its outcome is printed.
    Done(Class),
    /// It failed; the error is not printed yet.
    Failed(Failure),
}

/// Run the command and print its outcome.
fn run(command: Command, printer: &Printer) -> io::Result<Finished> {
    use commands::*;
    match command {
        Command::Lint(args) => match LintConfig::from_args(&args) {
            Ok(config) => finish(lint::run(&config, printer), |all| printer.lints(all)),
            Err(e) => Ok(Finished::Failed(Failure::Input(e))),
        },
        Command::Schema => finish(schema::run(), |s| printer.document(s)),
        Command::Inspect(args) => {
            let config = InspectConfig {
                path: args.path,
                list_modules: args.modules,
            };
            finish(inspect::run(&config, printer), |i| {
                printer.inspection(i, config.list_modules)
            })
        }
        Command::Hash(args) => finish(
            hash::run(&config::HashConfig::from_args(args), printer),
            |m| printer.manifest(m),
        ),
        Command::Kld(args) => match KldConfig::from_args(args) {
            Ok(config) => finish(kld::run(&config), |k| printer.kld(k)),
            Err(message) => Ok(Finished::Failed(Failure::Usage(message))),
        },
        Command::Card(args) => finish(card::run(&config::card_request(args)), |c| {
            printer.card_written(c)
        }),
        Command::Keygen(args) => {
            finish(keygen::run(&config::KeygenConfig { out: args.out }), |k| {
                printer.keys(k)
            })
        }
        Command::Sign(args) => {
            let config = config::SignConfig {
                file: args.file,
                checkpoint: args.checkpoint,
                key: args.key,
                out: args.out,
            };
            finish(sign::run(&config, printer), |s| printer.signed(s))
        }
        Command::VerifyReport(args) => {
            let config = config::VerifyReportConfig {
                envelope: args.envelope,
                public_key: args.public_key,
                checkpoint: args.checkpoint,
                card: args.card,
                study: args.study,
            };
            finish(verify_report::run(&config), |r| printer.report_check(r))
        }
        Command::Check(args) => {
            let config = config::CheckConfig {
                source: args.source,
                public_key: args.public_key,
            };
            finish(check::run(&config, printer), |r| printer.check(r))
        }
        Command::Measure(args) => match config::MeasureConfig::from_args(args) {
            Ok(config) => finish(rerun::measure(&config, printer), |m| {
                printer.measured(m, &config.out)
            }),
            Err(message) => Ok(Finished::Failed(Failure::Usage(message))),
        },
        Command::Study(args) => {
            let config = config::StudyConfig::from_args(args);
            finish(rerun::study(&config, printer), |s| printer.studied(s))
        }
        Command::Verify(args) => match config::VerifyConfig::from_args(args) {
            Ok(config) => finish(rerun::verify(&config, printer), |v| printer.verification(v)),
            Err(message) => Ok(Finished::Failed(Failure::Usage(message))),
        },
        Command::Reference(cli::ReferenceCommand::Sign(args)) => {
            finish(sign::reference(&args, printer), |s| printer.signed(s))
        }
        Command::Reference(cli::ReferenceCommand::Export(args)) => {
            match config::ProtocolConfig::from_args(&args.protocol) {
                Ok(p) => finish(rerun::export(&args, p, printer), |e| printer.exported(e)),
                Err(message) => Ok(Finished::Failed(Failure::Usage(message))),
            }
        }
    }
}

/// Print a command's outcome, or keep its failure for [`exit_code`].
fn finish<T>(
    result: commands::Result<T>,
    print: impl FnOnce(&T) -> io::Result<()>,
) -> io::Result<Finished> {
    match result {
        Ok(Outcome { value, class }) => print(&value).map(|()| Finished::Done(class)),
        Err(failure) => Ok(Finished::Failed(failure)),
    }
}

/// The one place that maps how a command ended to its exit code, printing a failure first.
fn exit_code(printer: &Printer, finished: io::Result<Finished>) -> u8 {
    let code = finished.and_then(|finished| match finished {
        Finished::Done(Class::Clean) => Ok(0),
        Finished::Done(Class::Findings) => Ok(EXIT_FINDINGS),
        Finished::Failed(Failure::Input(e)) => printer.error(&e).map(|()| EXIT_BAD_INPUT),
        Finished::Failed(Failure::Usage(m)) => printer.usage_error(&m).map(|()| EXIT_BAD_INPUT),
    });
    match code {
        Ok(code) => code,
        // A closed pipe (`cardproof schema | head`) is not an error.
        Err(e) if e.kind() == io::ErrorKind::BrokenPipe => 0,
        Err(_) => EXIT_BAD_INPUT,
    }
}

/// The name and output flags of a command, the name as [`config::FORMATS`] lists it (`schema`
/// has none: its document is always JSON).
fn output_args(command: &Command) -> Option<(&'static str, &OutputArgs)> {
    Some(match command {
        Command::Schema => return None,
        Command::Lint(a) => ("lint", &a.output),
        Command::Check(a) => ("check", &a.output),
        Command::Inspect(a) => ("inspect", &a.output),
        Command::Hash(a) => ("hash", &a.output),
        Command::Kld(a) => ("kld", &a.output),
        Command::Measure(a) => ("measure", &a.output),
        Command::Study(a) => ("study", &a.output),
        Command::Verify(a) => ("verify", &a.output),
        Command::Card(a) => ("card", &a.output),
        Command::Keygen(a) => ("keygen", &a.output),
        Command::Sign(a) => ("sign", &a.output),
        Command::Reference(cli::ReferenceCommand::Export(a)) => ("reference export", &a.output),
        Command::Reference(cli::ReferenceCommand::Sign(a)) => ("reference sign", &a.output),
        Command::VerifyReport(a) => ("verify-report", &a.output),
    })
}
