//! Validated settings, built from the raw arguments and the environment before any work starts.

use std::io::IsTerminal;
use std::path::PathBuf;

use crate::cli::{ColorArg, FormatArg, OutputArgs};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Human,
    Json,
    Markdown,
}

#[derive(Debug, Clone, Copy)]
pub struct Output {
    pub format: Format,
    /// Colour human diagnostics on stderr.
    pub color: bool,
}

impl Output {
    pub fn from_args(args: &OutputArgs) -> Output {
        let format = match (args.json, args.format) {
            (true, _) | (_, FormatArg::Json) => Format::Json,
            (_, FormatArg::Markdown) => Format::Markdown,
            (_, FormatArg::Human) => Format::Human,
        };
        let no_color = std::env::var_os("NO_COLOR").is_some_and(|v| !v.is_empty());
        let color = match args.color {
            ColorArg::Always => true,
            ColorArg::Never => false,
            ColorArg::Auto => !no_color && std::io::stderr().is_terminal(),
        };
        Output { format, color }
    }
}

#[derive(Debug, Clone)]
pub struct LintConfig {
    pub path: PathBuf,
    pub output: Output,
}

#[derive(Debug, Clone)]
pub struct InspectConfig {
    pub path: PathBuf,
    pub list_modules: bool,
    pub output: Output,
}

#[derive(Debug, Clone)]
pub struct HashConfig {
    pub path: PathBuf,
    pub options: cardproof::checkpoint::hash::HashOptions,
    pub output: Output,
    /// Show a progress bar (stderr is a terminal).
    pub progress: bool,
}
