//! Native greedy decode (issue #44): tokens per second of one token at a time through the KV
//! cache, against the rate at which this machine reads the weights a step must read (a decode
//! step is bound by reading every weight once: the peer is the same threads summing the same
//! bytes, in the same process). Shapes: SmolLM2-135M's (the real-weights example; tied head) and
//! Qwen3-0.6B's, f32 weights (4 bytes a parameter), at a 512-token prompt.
//! `cargo bench --bench decode`.

#![allow(clippy::print_stdout)]

use std::time::Instant;

use cardproof::runner::native::StateDtype;
use cardproof::runner::native::config::{Arch, ModelConfig};
use cardproof::runner::native::decoder::{ComputeDtype, Decoder, DecoderCache};
use cardproof::runner::native::generate::Greedy;
use cardproof::runner::native::weights::synthetic;
use rayon::prelude::*;

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

/// Bytes a second this machine's threads read from `bytes` of f32 (each thread sums a
/// contiguous share, as the row product splits outputs).
fn read_rate(bytes: usize) -> f64 {
    let data = vec![1f32; bytes / 4];
    let threads = rayon::current_num_threads();
    let share = data.len().div_ceil(threads);
    let sum = || {
        data.par_chunks(share)
            .map(|c| {
                // Eight independent partial sums, so the adds are not one latency-bound chain.
                let mut acc = [0f32; 8];
                for w in c.chunks_exact(8) {
                    for (a, x) in acc.iter_mut().zip(w) {
                        *a += x;
                    }
                }
                acc.iter().sum::<f32>()
            })
            .sum::<f32>()
    };
    std::hint::black_box(sum());
    let t = best(5, || {
        std::hint::black_box(sum());
    });
    bytes as f64 / t
}

/// Weights a decode step reads (f32 bytes): every layer's projections and the head (the
/// embedding's one row aside).
fn step_bytes(c: &ModelConfig) -> usize {
    let (q, kv) = (c.heads * c.head_dim, c.kv_heads * c.head_dim);
    let layer = c.hidden * (2 * q + 2 * kv) + 3 * c.hidden * c.intermediate;
    4 * (c.layers * layer + c.vocab * c.hidden)
}

fn report(name: &str, config: ModelConfig, prompt: usize, new: usize) {
    let store = synthetic(&config, 7);
    let decoder =
        Decoder::load(&store, config.clone(), ComputeDtype::F32, StateDtype::F32).unwrap();
    drop(store);
    let ids: Vec<u32> = (0..prompt as u32)
        .map(|i| (i * 7919) % config.vocab as u32)
        .collect();
    let prefilled = decoder.prefill(&ids, DecoderCache::default()).unwrap();
    let greedy = Greedy {
        max_new_tokens: new,
        stops: Vec::new(),
        used: config.vocab,
    };
    let generated = decoder.generate(&prefilled, &greedy).unwrap();
    assert_eq!(generated.tokens.len(), new);
    // `new` tokens take `new - 1` steps (the first comes from the prefill's last row).
    let t = best(3, || {
        std::hint::black_box(decoder.generate(&prefilled, &greedy).unwrap());
    });
    let rate = (new - 1) as f64 / t;
    let bytes = step_bytes(&config);
    let ceiling = read_rate(bytes) / bytes as f64;
    println!(
        "{name:<28} prompt {prompt}: {rate:>7.1} tokens/s; reading its {:.0} MB of weights: {ceiling:>7.1} /s; ratio {:.2}",
        bytes as f64 / 1e6,
        rate / ceiling
    );
}

fn main() {
    let threads = rayon::current_num_threads();
    println!("native greedy decode, {threads} threads, f32 weights");
    let smollm2 = ModelConfig {
        moe: None,
        arch: Arch::Llama,
        hidden: 576,
        intermediate: 1536,
        layers: 30,
        heads: 9,
        kv_heads: 3,
        head_dim: 64,
        vocab: 49_152,
        rms_eps: 1e-5,
        rope_theta: 100_000.0,
        rope_scaling: None,
        tie_embeddings: false,
        sliding_window: None,
        max_positions: Some(8192),
        biases: Default::default(),
        rotary_dim: 64,
        prefix: "model".into(),
        hybrid: None,
    };
    report("SmolLM2-135M shape", smollm2.clone(), 512, 33);
    let qwen3 = ModelConfig {
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
        tie_embeddings: false,
        max_positions: Some(40_960),
        rotary_dim: 128,
        ..smollm2
    };
    report("Qwen3-0.6B shape", qwen3, 512, 17);
}
