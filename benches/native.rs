//! Native runner throughput: tokens per second on the example model, on a synthetic model of
//! Qwen3-0.6B's shape (~0.6B parameters, dense) and on a synthetic hybrid of Qwen3.5-0.8B's shape
//! (Gated DeltaNet and gated attention, 3:1; ~0.5B parameters outside the embeddings), against
//! the machine's measured f32 matrix-multiply rate (candle's gemm, same process, same threads).
//! `cargo bench --bench native`.

#![allow(clippy::print_stdout)]

use std::time::Instant;

use candle_core::{Device, Tensor};
use cardproof::runner::native::config::{Arch, Hybrid, LayerType, ModelConfig};
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

/// Matrix-multiply FLOPs of one window of `n` tokens with the LM head on `rows` rows: every
/// projection, QK^T and PV over the full window in attention layers, and in Gated DeltaNet
/// layers the delta rule's nominal 6 · key_dim · value_dim per token and value head (the state
/// read, its rank-1 update and the query's read; the chunked form spends more, counted as this).
fn flops(c: &ModelConfig, n: usize, rows: usize) -> f64 {
    let (q, kv) = (c.heads * c.head_dim, c.kv_heads * c.head_dim);
    let n_f = n as f64;
    let mlp = 2.0 * n_f * (3 * c.hidden * c.intermediate) as f64;
    let gated = if c.arch.is_hybrid() { 2 } else { 1 };
    let attention = 2.0 * n_f * (c.hidden * (gated * q + q + 2 * kv)) as f64
        + 4.0 * (c.heads * n * n * c.head_dim) as f64;
    let delta_net = c.hybrid.as_ref().map_or(0.0, |h| {
        let width = h.value_heads * h.value_dim;
        let projections = c.hidden * (h.conv_dim() + width + 2 * h.value_heads) + width * c.hidden;
        2.0 * n_f * projections as f64 + 6.0 * n_f * (width * h.key_dim) as f64
    });
    let mixers: f64 = (0..c.layers)
        .map(|i| match c.hybrid.as_ref().map(|h| h.layer_types[i]) {
            Some(LayerType::Linear) => delta_net,
            _ => attention,
        })
        .sum();
    let head = 2.0 * (rows * c.hidden * c.vocab) as f64;
    mixers + c.layers as f64 * mlp + head
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
    let decoder =
        Decoder::load(&store, config.clone(), ComputeDtype::F32, StateDtype::F32).unwrap();
    drop(store);
    report("synthetic Qwen3-0.6B shape (0.6B)", &decoder, 256, 2, peak);
    drop(decoder);

    // Qwen3.5-0.8B's published shape: 24 layers, three Gated DeltaNet then one gated attention
    // layer; GDN 16 key and 16 value heads of 128, conv kernel 4; attention 8 query / 2 KV heads
    // of 256 with RoPE on 64 of them; FFN 3584; vocabulary 248,320 (its head untied here).
    let layers = 24;
    let hybrid_config = ModelConfig {
        arch: Arch::Qwen3_5Text,
        hidden: 1024,
        intermediate: 3584,
        layers,
        heads: 8,
        kv_heads: 2,
        head_dim: 256,
        vocab: 248_320,
        rope_theta: 10_000_000.0,
        max_positions: Some(262_144),
        rotary_dim: 64,
        hybrid: Some(Hybrid {
            layer_types: (0..layers)
                .map(|i| {
                    if i % 4 == 3 {
                        LayerType::Full
                    } else {
                        LayerType::Linear
                    }
                })
                .collect(),
            conv_kernel: 4,
            key_heads: 16,
            value_heads: 16,
            key_dim: 128,
            value_dim: 128,
            fused_projections: false,
            mamba_ssm_dtype: None,
            mrope_section: None,
        }),
        ..config
    };
    let store = synthetic(&hybrid_config, 11);
    let decoder = Decoder::load(&store, hybrid_config, ComputeDtype::F32, StateDtype::F32).unwrap();
    drop(store);
    report(
        "synthetic hybrid Qwen3.5-0.8B shape",
        &decoder,
        256,
        2,
        peak,
    );
    report(
        "synthetic hybrid Qwen3.5-0.8B shape",
        &decoder,
        2048,
        1,
        peak,
    );
}
