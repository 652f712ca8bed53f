//! Native runner throughput: tokens per second on the example model and on a synthetic model of
//! Qwen3-0.6B's shape (~0.6B parameters), against the machine's measured f32 matrix-multiply
//! rate (candle's gemm, same process, same threads). `cargo bench --bench native`.

#![allow(clippy::print_stdout)]

use std::time::Instant;

use candle_core::{Device, Tensor};
use cardproof::runner::native::config::{Arch, ModelConfig};
use cardproof::runner::native::decoder::{ComputeDtype, Decoder};
use cardproof::runner::native::weights::synthetic;
use cardproof::runner::native::{self, Emulate, StateDtype};

/// Best of `reps` timings, in seconds.
fn best<F: FnMut()>(reps: usize, mut f: F) -> f64 {
    (0..reps)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64()
        })
        .fold(f64::INFINITY, f64::min)
}

/// f32 GFLOP/s of an (m × k) · (k × n) product.
fn matmul_rate(m: usize, k: usize, n: usize) -> f64 {
    let a = Tensor::randn(0f32, 1.0, (m, k), &Device::Cpu).unwrap();
    let b = Tensor::randn(0f32, 1.0, (n, k), &Device::Cpu)
        .unwrap()
        .t()
        .unwrap();
    let _ = a.matmul(&b).unwrap();
    let t = best(5, || {
        let _ = a.matmul(&b).unwrap();
    });
    2.0 * (m * k * n) as f64 / t / 1e9
}

/// Matrix-multiply FLOPs of one window of `n` tokens with the LM head on `rows` rows.
fn flops(c: &ModelConfig, n: usize, rows: usize) -> f64 {
    let (q, kv) = (c.heads * c.head_dim, c.kv_heads * c.head_dim);
    let linear =
        2.0 * n as f64 * (c.hidden * (2 * q + 2 * kv) + 3 * c.hidden * c.intermediate) as f64;
    let attention = 4.0 * (c.heads * n * n * c.head_dim) as f64;
    let head = 2.0 * (rows * c.hidden * c.vocab) as f64;
    c.layers as f64 * (linear + attention) + head
}

fn report(name: &str, decoder: &Decoder, n: usize, reps: usize, peak: f64) {
    let ids: Vec<u32> = (0..n as u32)
        .map(|i| (i * 7919) % decoder.config.vocab as u32)
        .collect();
    let rows: Vec<usize> = (0..n - 1).collect();
    let run = || {
        let h = decoder.hidden(&ids).unwrap();
        let _ = decoder.logits_at(&h, &rows).unwrap();
    };
    run();
    let t = best(reps, run);
    let f = flops(&decoder.config, n, rows.len());
    let rate = f / t / 1e9;
    println!(
        "{name:<34} window {n:>5}: {:>8.3} s  {:>9.0} tokens/s  {:>7.1} GFLOP/s  ({:.0}% of measured peak {:.1})",
        t,
        n as f64 / t,
        rate,
        100.0 * rate / peak,
        peak
    );
}

fn main() {
    let threads = std::thread::available_parallelism().map_or(1, usize::from);
    println!("native runner, {threads} threads, f32 compute");
    let peak_square = matmul_rate(1024, 1024, 1024);
    let peak_model = matmul_rate(256, 1024, 3072);
    let peak = peak_square.max(peak_model);
    println!(
        "f32 matmul: 1024x1024x1024 {peak_square:.1} GFLOP/s, 256x1024x3072 {peak_model:.1} GFLOP/s"
    );

    let root =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/models/shakespeare-bf16");
    let example = native::load(
        &root,
        ComputeDtype::F32,
        Emulate::ReferenceSemantics,
        StateDtype::F32,
    )
    .unwrap();
    report("example (4.2M params)", &example.decoder, 256, 10, peak);

    let config = ModelConfig {
        moe: None,
        arch: Arch::Qwen3,
        hidden: 1024,
        intermediate: 3072,
        layers: 28,
        heads: 16,
        kv_heads: 8,
        head_dim: 128,
        vocab: 151_936,
        rms_eps: 1e-6,
        rope_theta: 1_000_000.0,
        rope_scaling: None,
        tie_embeddings: false,
        sliding_window: None,
        max_positions: Some(40_960),
        biases: Default::default(),
        rotary_dim: 128,
        prefix: "model".into(),
        hybrid: None,
    };
    let store = synthetic(&config, 7);
    let decoder = Decoder::load(&store, config, ComputeDtype::F32, StateDtype::F32).unwrap();
    drop(store);
    report("synthetic Qwen3-0.6B shape (0.6B)", &decoder, 256, 2, peak);
}
