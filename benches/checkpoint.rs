//! Checkpoint benchmarks, as ratios against baselines run in the same process:
//! - `hash`: one thread vs all threads, against `sha256sum` and `openssl dgst -sha256` on the same
//!   files (the page cache is warmed first, so all read from memory);
//! - `inspect`: a 1,000-shard synthetic checkpoint, against reading the same header bytes.
//!
//! Run: `cargo bench --bench checkpoint` (add `-- --quick` for smaller files).
#![allow(clippy::print_stdout)]

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use cardproof::checkpoint::dtype::Dtype;
use cardproof::checkpoint::hash::{HashOptions, hash_path};
use cardproof::checkpoint::{inspect, safetensors};

fn best_of<T>(runs: usize, mut f: impl FnMut() -> T) -> Duration {
    (0..runs)
        .map(|_| {
            let start = Instant::now();
            std::hint::black_box(f());
            start.elapsed()
        })
        .min()
        .expect("at least one run")
}

fn tool(program: &str, args: &[&str], dir: &Path) -> Option<Duration> {
    Command::new(program).arg("--version").output().ok()?;
    Some(best_of(3, || {
        let out = Command::new(program)
            .args(args)
            .current_dir(dir)
            .output()
            .expect("runs");
        assert!(out.status.success(), "{program} failed");
    }))
}

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    println!("machine: {cores} cores, {}", cpu_model());

    // --- hash: 8 files of 64 MiB (8 MiB with --quick).
    let dir = tempfile::tempdir().expect("temp dir");
    let file_mib = if quick { 8 } else { 64 };
    let names: Vec<String> = (0..8)
        .map(|i| format!("model-{:05}-of-00008.safetensors", i + 1))
        .collect();
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    for name in &names {
        let mut data = vec![0u8; file_mib << 20];
        for chunk in data.chunks_mut(8) {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            chunk.copy_from_slice(&seed.to_le_bytes()[..chunk.len()]);
        }
        std::fs::write(dir.path().join(name), data).expect("write");
    }
    let total = (names.len() * file_mib) as f64;
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    let _ = tool("cat", &refs, dir.path()); // warm the page cache
    let one = best_of(3, || {
        hash_path(
            dir.path(),
            &HashOptions {
                threads: Some(1),
                include_all: false,
            },
            &|_| {},
        )
        .expect("hash")
    });
    let all = best_of(3, || {
        hash_path(dir.path(), &HashOptions::default(), &|_| {}).expect("hash")
    });
    let sha256sum = tool("sha256sum", &refs, dir.path());
    let mut openssl_args = vec!["dgst", "-sha256"];
    openssl_args.extend(&refs);
    let openssl = tool("openssl", &openssl_args, dir.path());
    let rate = |d: Duration| total / d.as_secs_f64();
    println!(
        "\nhash: {} files × {file_mib} MiB = {total} MiB (best of 3)",
        names.len()
    );
    println!("| run | time | MiB/s | vs cardproof 1 thread |");
    println!("|---|---|---|---|");
    let row = |label: &str, d: Duration| {
        println!(
            "| {label} | {:.3} s | {:.0} | {:.2}x |",
            d.as_secs_f64(),
            rate(d),
            one.as_secs_f64() / d.as_secs_f64()
        );
    };
    row("cardproof hash --threads 1", one);
    row(&format!("cardproof hash (all {cores} cores)"), all);
    if let Some(d) = sha256sum {
        row("sha256sum (1 core)", d);
    }
    if let Some(d) = openssl {
        row("openssl dgst -sha256 (1 core)", d);
    }

    // --- inspect: 1,000 shards of a BF16 checkpoint with an index.
    let shards = tempfile::tempdir().expect("temp dir");
    let count = 1000;
    let mut weight_map = serde_json::Map::new();
    let mut header_bytes = 0u64;
    for s in 0..count {
        let file = format!("model-{:05}-of-{count:05}.safetensors", s + 1);
        let mut tensors = Vec::new();
        for (proj, out, inn) in [
            ("q_proj", 64u64, 64u64),
            ("k_proj", 32, 64),
            ("v_proj", 32, 64),
            ("o_proj", 64, 64),
        ] {
            tensors.push((
                format!("model.layers.{s}.self_attn.{proj}.weight"),
                vec![out, inn],
            ));
        }
        for (proj, out, inn) in [
            ("gate_proj", 128u64, 64u64),
            ("up_proj", 128, 64),
            ("down_proj", 64, 128),
        ] {
            tensors.push((
                format!("model.layers.{s}.mlp.{proj}.weight"),
                vec![out, inn],
            ));
        }
        tensors.push((format!("model.layers.{s}.input_layernorm.weight"), vec![64]));
        let data: Vec<Vec<u8>> = tensors
            .iter()
            .map(|(_, shape)| vec![0u8; shape.iter().product::<u64>() as usize * 2])
            .collect();
        let views: Vec<(&str, Dtype, &[u64], &[u8])> = tensors
            .iter()
            .zip(&data)
            .map(|((n, s), d)| (n.as_str(), Dtype::BF16, s.as_slice(), d.as_slice()))
            .collect();
        let bytes = safetensors::serialize(&views, &BTreeMap::new());
        header_bytes += 8 + u64::from_le_bytes(bytes[..8].try_into().expect("8 bytes"));
        std::fs::write(shards.path().join(&file), bytes).expect("write shard");
        for (name, _) in &tensors {
            weight_map.insert(name.clone(), file.clone().into());
        }
    }
    let index = serde_json::json!({"metadata": {}, "weight_map": weight_map});
    std::fs::write(
        shards.path().join("model.safetensors.index.json"),
        index.to_string(),
    )
    .expect("index");
    let inspect_time = best_of(5, || inspect::inspect_path(shards.path()).expect("inspect"));
    let read_headers = best_of(5, || {
        let mut sum = 0usize;
        for entry in std::fs::read_dir(shards.path()).expect("dir") {
            let path = entry.expect("entry").path();
            let mut f = std::fs::File::open(&path).expect("open");
            let mut buf = vec![0u8; 4096];
            sum += std::io::Read::read(&mut f, &mut buf).expect("read");
        }
        sum
    });
    println!(
        "\ninspect: {count} shards, {} tensors, {header_bytes} header bytes (best of 5)",
        count * 8
    );
    println!("| run | time | vs opening and reading 4 KiB of every file |");
    println!("|---|---|---|");
    println!(
        "| cardproof inspect | {:.1} ms | {:.2}x |",
        inspect_time.as_secs_f64() * 1e3,
        inspect_time.as_secs_f64() / read_headers.as_secs_f64()
    );
    println!(
        "| open + read 4 KiB × {count} | {:.1} ms | 1.00x |",
        read_headers.as_secs_f64() * 1e3
    );
}

fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_owned())
        })
        .unwrap_or_else(|| "unknown CPU".into())
}
