//! `kld` benchmark: 2,000 positions × 151,936 vocabulary, f32 dumps from files, as ratios against
//! reading the same bytes from the page cache and against a straightforward numpy float64
//! implementation (benches/kld_numpy.py), all in this one run.
//!
//! Run: `cargo bench --bench kld` (needs python3 with numpy for the numpy row; `-- --quick` uses
//! 400 positions).
#![allow(clippy::print_stdout)]

use std::io::Read;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use cardproof::kld::protocol::{Bootstrap, Direction, Positions, VocabMode};
use cardproof::kld::stats::SplitMix64;
use cardproof::kld::{Options, measure};

const VOCAB: usize = 151_936;

fn normal(rng: &mut SplitMix64) -> f32 {
    let u = ((rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64).max(1e-300);
    let v = (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
    ((-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()) as f32
}

/// Write a safetensors dump (header, then rows) straight to disk: 1.2 GB files are not built in
/// memory.
fn write_dump(path: &Path, rows: usize, mut row: impl FnMut(usize, &mut [f32])) {
    use std::io::Write;
    let bytes = (rows * VOCAB * 4) as u64;
    let header = format!(
        "{{\"logits\":{{\"dtype\":\"F32\",\"shape\":[{rows},{VOCAB}],\"data_offsets\":[0,{bytes}]}}}}"
    );
    let padded = header.len().div_ceil(8) * 8;
    let mut f = std::io::BufWriter::new(std::fs::File::create(path).expect("create"));
    f.write_all(&(padded as u64).to_le_bytes()).expect("write");
    f.write_all(header.as_bytes()).expect("write");
    f.write_all(&vec![b' '; padded - header.len()])
        .expect("write");
    let mut buf = vec![0f32; VOCAB];
    for r in 0..rows {
        row(r, &mut buf);
        for v in &buf {
            f.write_all(&v.to_le_bytes()).expect("write");
        }
    }
    f.flush().expect("flush");
    // Written back before any timing: dirty pages flushed in the background would compete with
    // the runs measured (and did: 40% noise).
    f.into_inner().expect("flush").sync_all().expect("sync");
}

fn read_all(paths: &[&Path]) -> Duration {
    let start = Instant::now();
    let mut buf = vec![0u8; 8 << 20];
    let mut total = 0usize;
    for p in paths {
        let mut f = std::fs::File::open(p).expect("open");
        loop {
            let n = f.read(&mut buf).expect("read");
            if n == 0 {
                break;
            }
            total += n;
        }
    }
    std::hint::black_box(total);
    start.elapsed()
}

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let rows = if quick { 400 } else { 2000 };
    let dir = tempfile::tempdir().expect("temp dir");
    let (ref_path, cand_path) = (
        dir.path().join("ref.safetensors"),
        dir.path().join("cand.safetensors"),
    );
    // Peaked, LLM-like rows: a few strong candidates over a broad tail; the candidate perturbed.
    let mut rng = SplitMix64::new(42);
    write_dump(&ref_path, rows, |_, row| {
        for v in row.iter_mut() {
            *v = 2.0 * normal(&mut rng);
        }
        for _ in 0..8 {
            let i = rng.below(VOCAB as u64) as usize;
            row[i] += 12.0 + 4.0 * normal(&mut rng);
        }
    });
    let mut rng_a = SplitMix64::new(42);
    let mut rng_b = SplitMix64::new(7);
    write_dump(&cand_path, rows, |_, row| {
        for v in row.iter_mut() {
            *v = 2.0 * normal(&mut rng_a);
        }
        for _ in 0..8 {
            let i = rng_a.below(VOCAB as u64) as usize;
            row[i] += 12.0 + 4.0 * normal(&mut rng_a);
        }
        for v in row.iter_mut() {
            *v += 0.05 * normal(&mut rng_b);
        }
    });
    let paths = [ref_path.as_path(), cand_path.as_path()];
    let gib = 2.0 * (rows * VOCAB * 4) as f64 / f64::from(1u32 << 30);
    read_all(&paths); // warm the page cache
    let read = (0..3).map(|_| read_all(&paths)).min().expect("runs");
    let run = |direction: Direction| {
        let options = Options {
            direction,
            vocab: VocabMode::Full,
            positions: Positions::All,
            context_length: None,
            vocab_size: None,
            bootstrap: Bootstrap {
                resamples: 1000,
                seed: 0,
                level: 0.95,
            },
        };
        let mut best = Duration::MAX;
        let mut mean = 0.0;
        for _ in 0..3 {
            let start = Instant::now();
            let m = measure(&ref_path, &cand_path, &options).expect("measure");
            best = best.min(start.elapsed());
            mean = m.metrics["kld_mean"];
        }
        (best, mean)
    };
    let (forward, kld_mean) = run(Direction::Forward);
    let (both, _) = run(Direction::Both);
    // The same forward run through the binary, as a user types it (process start, JSON out).
    let binary = (0..3)
        .map(|_| {
            let start = Instant::now();
            let out = Command::new(env!("CARGO_BIN_EXE_cardproof"))
                .args(["kld", "--json", "--reference"])
                .arg(&ref_path)
                .arg("--candidate")
                .arg(&cand_path)
                .output()
                .expect("run cardproof");
            assert!(out.status.success(), "cardproof kld failed: {out:?}");
            start.elapsed()
        })
        .min()
        .expect("runs");
    let numpy = Command::new("python3")
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/benches/kld_numpy.py"))
        .args(paths)
        .output()
        .ok()
        .filter(|o| o.status.success())
        .and_then(|o| serde_json::from_slice::<serde_json::Value>(&o.stdout).ok());
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    println!(
        "kld: {rows} positions × {VOCAB} vocabulary, f32, {gib:.2} GiB in two files; {cores} cores; best of 3"
    );
    println!("| run | time | vs reading the bytes |");
    println!("|---|---|---|");
    println!(
        "| read both files from page cache (8 MiB reads) | {:.3} s | 1.00x |",
        read.as_secs_f64()
    );
    println!(
        "| measure(), forward (+1000 bootstrap resamples) | {:.3} s | {:.2}x |",
        forward.as_secs_f64(),
        forward.as_secs_f64() / read.as_secs_f64()
    );
    println!(
        "| `cardproof kld --json` (the binary, default: both directions) | {:.3} s | {:.2}x |",
        binary.as_secs_f64(),
        binary.as_secs_f64() / read.as_secs_f64()
    );
    println!(
        "| measure(), both directions | {:.3} s | {:.2}x |",
        both.as_secs_f64(),
        both.as_secs_f64() / read.as_secs_f64()
    );
    match numpy {
        Some(v) => {
            let secs = v["seconds"].as_f64().unwrap_or(f64::NAN);
            let np_mean = v["kld_mean"].as_f64().unwrap_or(f64::NAN);
            println!(
                "| numpy float64, forward (benches/kld_numpy.py) | {secs:.3} s | {:.2}x |",
                secs / read.as_secs_f64()
            );
            println!(
                "\ncardproof forward is {:.1}x faster than numpy float64; kld_mean {kld_mean:.9e} vs numpy {np_mean:.9e} (relative difference {:.1e})",
                secs / forward.as_secs_f64(),
                ((kld_mean - np_mean) / np_mean).abs()
            );
        }
        None => println!("| numpy float64 | not run (python3 with numpy not found) | |"),
    }
}
