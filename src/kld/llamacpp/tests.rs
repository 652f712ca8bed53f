//! Tests of the llama.cpp compatibility layer, against real llama.cpp outputs
//! (`tests/fixtures/llamacpp/`, see its README) and crafted files for the edge cases real files
//! rarely hit.

use std::path::{Path, PathBuf};

use super::*;
use crate::ErrorKind;

mod base;
mod compat;
mod printed;

const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/llamacpp/");

fn fixture(name: &str) -> PathBuf {
    Path::new(FIXTURES).join(name)
}

fn fixture_text(name: &str) -> String {
    std::fs::read_to_string(fixture(name)).expect("fixture text")
}

/// A tiny deterministic generator (xorshift64*), so tests need no `rand`.
struct Rng(u64);

impl Rng {
    fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform in [0, 1).
    fn unit(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32
    }

    /// Peaked, logit-like values: a few high, most spread over ~30 nats below.
    fn logits(&mut self, n: usize) -> Vec<f32> {
        (0..n)
            .map(|_| {
                let u = self.unit();
                if u < 0.05 {
                    10.0 + 5.0 * self.unit()
                } else {
                    -20.0 + 30.0 * self.unit()
                }
            })
            .collect()
    }
}

/// A base file's bytes from parts, for files no writer would produce.
fn raw_file(n_ctx: i32, n_vocab: i32, n_chunk: i32, tokens: &[i32], rows: &[BaseRow]) -> Vec<u8> {
    let mut b = MAGIC.to_vec();
    for v in [n_ctx, n_vocab, n_chunk] {
        b.extend_from_slice(&v.to_le_bytes());
    }
    for t in tokens {
        b.extend_from_slice(&t.to_le_bytes());
    }
    for r in rows {
        b.extend_from_slice(&r.scale.to_le_bytes());
        b.extend_from_slice(&r.min_log_prob.to_le_bytes());
        for q in &r.codes {
            b.extend_from_slice(&q.to_le_bytes());
        }
        if r.codes.len() % 2 == 1 {
            b.extend_from_slice(&[0, 0]);
        }
    }
    b
}

/// Asserts `err` is a format error (the file breaks its format's rule) for `path` whose message
/// holds every needle.
#[track_caller]
fn assert_format(err: crate::Error, path: &Path, needles: &[&str]) -> String {
    assert_kind(err, "format", path, needles)
}

/// Asserts `err` is of the kind named `kind` (as [`crate::Error::kind_name`] names it; `format`
/// only as [`ErrorKind::Format`] itself) for `path`, and its message holds every needle.
#[track_caller]
fn assert_kind(err: crate::Error, kind: &str, path: &Path, needles: &[&str]) -> String {
    let msg = err.to_string();
    assert_eq!(err.file, path, "{msg}");
    let of_kind = match kind {
        "format" => matches!(err.kind, ErrorKind::Format { .. }),
        kind => err.kind_name() == kind,
    };
    assert!(of_kind, "not a {kind} error ({}): {msg}", err.kind_name());
    for n in needles {
        assert!(msg.contains(n), "`{msg}` lacks `{n}`");
    }
    msg
}
