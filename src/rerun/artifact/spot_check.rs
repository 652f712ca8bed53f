//! A reference artifact checked against the reference's own weights: when the user has both, a
//! seeded sample of windows is recomputed from the weights and every recomputed row must match
//! the artifact's ([`SPOT_CHECK_MAX_ROW_KLD`]). A signature says who vouches for an artifact;
//! this says the rows are the reference's, for the windows it draws.

use candle_core::DType;

use super::vouch::{SPOT_CHECK_MAX_ROW_KLD, SpotCheck, spot_check_windows};
use super::{ArtifactRunner, Kind};
use crate::error::{Error, Result};
use crate::kld::protocol::{Positions, VocabMode};
use crate::kld::stats::SplitMix64;
use crate::runner::Runner;
use crate::runner::native::NativeModel;
use crate::runner::tokens::Windows;

/// What the spot check compares rows in.
pub struct Scoring {
    pub positions: Positions,
    pub mode: VocabMode,
    /// Logit entries scored (padding excluded).
    pub vocab_size: usize,
}

/// Recompute a seeded sample of `windows` (the run's windows, cut from the artifact's tokens)
/// with `reference` (loaded as `reference export` loads it: f32, reference semantics) and
/// compare each scored row with the artifact's. A row further than the limit is an error naming
/// the window: the artifact is not the reference's.
pub fn spot_check(
    runner: &ArtifactRunner,
    windows: &[Windows],
    reference: &NativeModel,
    reference_manifest_sha256: &str,
    scoring: &Scoring,
    seed: u64,
) -> Result<SpotCheck> {
    let artifact = runner.artifact;
    let d = &reference.decoder;
    let err = |e: candle_core::Error| {
        Error::runner(
            &reference.path,
            format!("spot check forward pass failed: {e}"),
        )
    };
    let width = d.config.vocab;
    let bf16 = artifact.header.hidden_dtype.as_deref() == Some("bf16");
    let mut rng = SplitMix64::new(seed);
    let mut checked = SpotCheck {
        seed,
        windows: Vec::new(),
        rows: 0,
        max_row_kld: 0.0,
        limit: SPOT_CHECK_MAX_ROW_KLD,
        reference_manifest_sha256: reference_manifest_sha256.to_owned(),
    };
    let mut scratch = crate::kld::row::Scratch::default();
    for run in windows {
        let l = run.length;
        let rows: Vec<usize> = (0..l)
            .filter(|&j| scoring.positions.selects(j as u64, l as u64))
            .collect();
        for w in sample(&mut rng, run.windows.len()) {
            let ids = &run.windows[w];
            let hidden = d.hidden(ids).map_err(err)?;
            let normed = d.normed_at(&hidden, &rows).map_err(err)?;
            let truth = match artifact.header.kind {
                Kind::Hidden => {
                    let mut h = normed
                        .to_dtype(DType::F32)
                        .and_then(|t| t.flatten_all())
                        .and_then(|t| t.to_vec1::<f32>())
                        .map_err(err)?;
                    if bf16 {
                        for v in &mut h {
                            *v = half::bf16::from_f32(*v).to_f32();
                        }
                    }
                    d.head_from_rows(h).map_err(err)?
                }
                Kind::TopK => d.head(&normed).map_err(err)?,
            };
            let stored = runner.window(ids)?.logits(&rows)?;
            let n = scoring.vocab_size;
            for (i, &j) in rows.iter().enumerate() {
                let a = &truth[i * width..i * width + n];
                let b = &stored[i * width..i * width + n];
                let kl = crate::kld::row::reduce(a, b, None, scoring.mode, false, &mut scratch)
                    .map_or(f64::INFINITY, |r| r.forward);
                if kl.is_nan() || kl > SPOT_CHECK_MAX_ROW_KLD {
                    return Err(Error::mismatch(
                        &artifact.path,
                        None,
                        format!(
                            "is not the reference's: window {w} position {j} at context length {l}, recomputed from {}, differs from the artifact's row by KL {kl:.3e} nats (at most {SPOT_CHECK_MAX_ROW_KLD:e} allowed; spot check seed {seed})",
                            reference.path.display()
                        ),
                    ));
                }
                checked.max_row_kld = checked.max_row_kld.max(kl);
            }
            checked.rows += rows.len() as u64;
            checked.windows.push([l as u64, w as u64]);
        }
    }
    Ok(checked)
}

/// [`spot_check_windows`] distinct window indices of `n`, drawn without replacement (a partial
/// Fisher-Yates shuffle), in increasing order.
fn sample(rng: &mut SplitMix64, n: usize) -> Vec<usize> {
    let m = spot_check_windows(n);
    let mut all: Vec<usize> = (0..n).collect();
    for i in 0..m {
        let j = i + rng.below((n - i) as u64) as usize;
        all.swap(i, j);
    }
    let mut picked = all[..m].to_vec();
    picked.sort_unstable();
    picked
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sample_is_distinct_seeded_and_one_in_sixteen() {
        let a = sample(&mut SplitMix64::new(7), 100);
        assert_eq!(a.len(), 7);
        assert!(a.windows(2).all(|p| p[0] < p[1]));
        assert_eq!(a, sample(&mut SplitMix64::new(7), 100));
        assert_ne!(a, sample(&mut SplitMix64::new(8), 100));
        assert_eq!(sample(&mut SplitMix64::new(1), 3), vec![0, 1, 2]);
        assert_eq!(sample(&mut SplitMix64::new(1), 0), Vec::<usize>::new());
        assert_eq!(spot_check_windows(10), 4);
        assert_eq!(spot_check_windows(64), 4);
        assert_eq!(spot_check_windows(65), 5);
    }
}
