//! Raw command-line arguments (clap). [`crate::config`] turns them into validated settings.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};

#[derive(Debug, Parser)]
#[command(
    name = "cardproof",
    version,
    about = "Check the fidelity (KL-divergence) claims on quantized LLM model cards",
    long_about = "Check the fidelity (KL-divergence) claims on quantized LLM model cards.\n\n\
                  Exit codes: 0 clean, 1 findings (lint errors), 2 bad input or usage."
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Check a card's fidelity disclosure, Hub metadata and KLD claims.
    Lint(LintArgs),
    /// Print the JSON Schema (draft 2020-12) of the `fidelity:` block.
    Schema,
}

#[derive(Debug, Args)]
pub struct LintArgs {
    /// A Markdown card, or a model directory holding README.md.
    #[arg(default_value = ".")]
    pub path: PathBuf,
    #[command(flatten)]
    pub output: OutputArgs,
}

#[derive(Debug, Args)]
pub struct OutputArgs {
    /// Output format: human diagnostics on stderr, or a document on stdout.
    #[arg(long, value_enum, default_value_t = FormatArg::Human)]
    pub format: FormatArg,
    /// Same as `--format json`.
    #[arg(long, conflicts_with = "format")]
    pub json: bool,
    /// When to colour human output (NO_COLOR is respected by `auto`).
    #[arg(long, value_enum, default_value_t = ColorArg::Auto)]
    pub color: ColorArg,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum FormatArg {
    Human,
    Json,
    Markdown,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ColorArg {
    Auto,
    Always,
    Never,
}
