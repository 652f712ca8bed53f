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
use config::{LintConfig, Output};
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
    let report = cardproof::lint::lint(&card);
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
