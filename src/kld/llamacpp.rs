//! llama.cpp compatibility: its `--kl-divergence-base` files and its printed KLD statistics.
//!
//! `llama-perplexity --kl-divergence-base F` writes the reference's log-probabilities, quantized to
//! uint16 per row, with the token stream they were scored on; `--kl-divergence` then prints a block
//! of statistics for a candidate. This module reads and writes those files exactly as llama.cpp
//! does ([`BaseFile`], [`BaseFileWriter`]), recomputes the statistics with llama.cpp's own
//! float/double arithmetic ([`CompatAccumulator`], [`compare_base_files`]), renders them in its
//! format ([`CompatStats::render`]) and parses any version of the printed block back
//! ([`parse_printed`]), so a card's pasted llama.cpp numbers can be checked against a re-run.
//!
//! The rules restated here come from the team's notes (`kld-method-and-prior-art.md`, section 1)
//! and were checked against llama.cpp's `tools/perplexity/perplexity.cpp`; no code was copied.

mod base_file;
mod compat;
mod printed;

pub use base_file::{
    BaseFile, BaseFileWriter, BaseRow, BaseStream, MAGIC, MAX_STREAM_TOKENS, RowReader, encode_row,
};
pub use compat::{
    CompatAccumulator, CompatStats, KL_GATE, MIN_ROWS, RowScore, clamped_reference_mass,
    compare_base_files, row_kld, score_row, score_row_log_probs,
};
pub use printed::{
    PrintedLines, PrintedStats, parse_printed, parse_printed_blocks, parse_printed_located,
};

#[cfg(test)]
mod tests;
