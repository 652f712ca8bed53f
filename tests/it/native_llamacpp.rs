//! Peer check of the native runner against real llama.cpp runs: the GGUF models in
//! tests/fixtures/llamacpp scored on the token windows stored in their .kld files, with
//! llama.cpp's protocol (per-window BOS, second half of each 128-token window, reference terms
//! below log p = -16 dropped), must land close to the statistics llama-perplexity printed.

use std::path::PathBuf;

use cardproof::kld::llamacpp::{BaseFile, parse_printed};
use cardproof::kld::protocol::{Positions, VocabMode};
use cardproof::kld::row::{Scratch, reduce};
use cardproof::runner::Runner;
use cardproof::runner::native::{self, ComputeDtype, Emulate, StateDtype};

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/llamacpp")
}

/// Reference semantics (exact dequantized weights, f32 activations) leaves out llama.cpp's Q8
/// activation rounding, so its KLD is a few percent lower than llama.cpp's; the llama.cpp-CPU
/// emulation lands within two standard errors of what llama.cpp printed.
#[test]
fn gguf_models_land_close_to_llamacpp_printed_statistics() {
    peer_check(Emulate::ReferenceSemantics);
    peer_check(Emulate::LlamacppCpu);
}

/// Prints the comparison (`--nocapture`) besides asserting it.
#[allow(clippy::print_stderr)]
fn peer_check(emulate: Emulate) {
    let dir = fixtures();
    let base = BaseFile::open(&dir.join("ref.kld")).unwrap();
    let n_ctx = base.n_ctx as usize;
    let reference = native::load(
        &dir.join("ref-f32.gguf"),
        ComputeDtype::F32,
        emulate,
        StateDtype::F32,
    )
    .unwrap();
    for quant in ["q5_0", "q6_k"] {
        let candidate = native::load(
            &dir.join(format!("cand-{quant}.gguf")),
            ComputeDtype::F32,
            emulate,
            StateDtype::F32,
        )
        .unwrap();
        let printed =
            parse_printed(&std::fs::read_to_string(dir.join(format!("kld-{quant}.txt"))).unwrap());
        let rows: Vec<usize> = (0..n_ctx)
            .filter(|&j| Positions::SecondHalf.selects(j as u64, n_ctx as u64))
            .collect();
        let (mut kl, mut nll_ref, mut nll_cand, mut same, mut n) = (0.0, 0.0, 0.0, 0usize, 0usize);
        let mut scratch = Scratch::default();
        for chunk in base.tokens.chunks_exact(n_ctx) {
            let mut ids: Vec<u32> = chunk.iter().map(|&t| t as u32).collect();
            ids[0] = 1; // llama.cpp replaces the first token of each chunk with BOS
            let a = reference.window(&ids).unwrap().logits(&rows).unwrap();
            let b = candidate.window(&ids).unwrap().logits(&rows).unwrap();
            let v = reference.vocab();
            for (k, &j) in rows.iter().enumerate() {
                let r = reduce(
                    &a[k * v..(k + 1) * v],
                    &b[k * v..(k + 1) * v],
                    Some(ids[j + 1]),
                    VocabMode::Threshold { log_p: -16.0 },
                    false,
                    &mut scratch,
                )
                .unwrap();
                kl += r.forward;
                nll_ref += r.nll_ref.unwrap();
                nll_cand += r.nll_cand.unwrap();
                same += usize::from(r.ref_top1 == r.cand_top1);
                n += 1;
            }
        }
        let n_f = n as f64;
        let (ppl_base, _) = printed.ppl_base.unwrap();
        let (ppl_q, _) = printed.ppl_q.unwrap();
        let (kld, kld_se) = printed.kld_mean.unwrap();
        let ours_ppl_base = (nll_ref / n_f).exp();
        let ours_ppl_q = (nll_cand / n_f).exp();
        let ours_kld = kl / n_f;
        eprintln!(
            "{emulate:?} {quant}: PPL(base) {ours_ppl_base:.6} vs {ppl_base}, PPL(Q) {ours_ppl_q:.6} vs {ppl_q}, KLD {ours_kld:.6} vs {kld} ± {kld_se}, same top {:.4}",
            same as f64 / n_f
        );
        assert_eq!(n, base.n_chunk as usize * rows.len());
        // Different kernels (llama.cpp's CPU matmuls vs candle's), same math.
        assert!(
            (ours_ppl_base / ppl_base - 1.0).abs() < 1e-3,
            "{ours_ppl_base} vs {ppl_base}"
        );
        assert!(
            (ours_ppl_q / ppl_q - 1.0).abs() < 1e-3,
            "{ours_ppl_q} vs {ppl_q}"
        );
        match emulate {
            Emulate::LlamacppCpu | Emulate::LlamacppCpuNoFa => {
                assert!(
                    (ours_kld - kld).abs() < 2.0 * kld_se,
                    "{ours_kld} vs {kld} ± {kld_se}"
                );
            }
            Emulate::ReferenceSemantics => {
                assert!(
                    ours_kld < kld && ours_kld > 0.85 * kld,
                    "{ours_kld} vs {kld}"
                );
            }
        }
    }
}
