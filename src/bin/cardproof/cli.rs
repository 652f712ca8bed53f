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
    /// Report what a checkpoint holds, from headers alone: formats, files, which modules are
    /// quantized and how, bits per weight, and config/tensor disagreements.
    Inspect(InspectArgs),
    /// SHA-256 of every file and a root digest (the SHA-256 of the `sha256sum`-format manifest
    /// printed on stdout).
    Hash(HashArgs),
}

#[derive(Debug, Args)]
pub struct InspectArgs {
    /// A .safetensors or .gguf file, or a checkpoint directory.
    #[arg(default_value = ".")]
    pub path: PathBuf,
    /// List every module, not only the summary.
    #[arg(long)]
    pub modules: bool,
    #[command(flatten)]
    pub output: OutputArgs,
}

#[derive(Debug, Args)]
pub struct HashArgs {
    /// A checkpoint directory or a single file.
    #[arg(default_value = ".")]
    pub path: PathBuf,
    /// Worker threads (default: every core).
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..))]
    pub threads: Option<u16>,
    /// Also hash the card (README.md), .gitattributes, .git/ and .cache/.
    #[arg(long)]
    pub all: bool,
    #[command(flatten)]
    pub output: OutputArgs,
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
