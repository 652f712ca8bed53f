//! A study's completed arms carried across runs of the transformers runner (`study --resume`).
//!
//! The program journals every arm it completes (`results/partial.json`: the record it would
//! write, holding the arms done so far, replaced whole after each arm; the arms' result files
//! beside it). When a later arm fails — an error, an out-of-memory, the process killed by a
//! signal — cardproof reads that journal, checks it as it checks a record, and hands the
//! completed arms back as a [`Carry`]: their record entries and result files exactly as the
//! program wrote them, the program's environment and the reference's generated turns. A
//! resumed run gives the carry back to [`super::transformers::run_arms`], which runs only the
//! remaining arms and reads the carried ones through the same checks as its own answers, so the
//! carried arms are scored by the same code as if they had just run.
//!
//! Resuming is refused, naming what differs, unless the new run is the same measurement: the
//! same software, dtype, chunk size and GPU model ([`same_environment`]); the reference's side
//! of every row bit for bit the same as the interrupted run's ([`same_reference_rows`]: the
//! reference pass reproduced exactly, so carried and new arms are measured against one
//! reference); the reference's generated turns the same.

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::kld::row::RowRecord;
use crate::runner::exchange::{RecordArm, RecordTurnSet, RunnerEnvironment};

/// The journal's name in the program's result directory.
pub const JOURNAL: &str = "partial.json";

/// The completed arms of an interrupted study (a prefix of its arms: the program runs them in
/// order), as the transformers runner answered them.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Carry {
    /// The program's environment when the arms ran.
    pub environment: RunnerEnvironment,
    /// The reference's generated turns (a study with turns).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reference_turns: Option<RecordTurnSet>,
    /// Each completed arm, in the study's order.
    #[serde(skip)]
    pub arms: Vec<CarriedArm>,
}

/// One completed arm: its record entry (its runs' `path`s are file names of `runs`' entries)
/// and each run's result file.
#[derive(Debug, Clone)]
pub struct CarriedArm {
    pub record: RecordArm,
    /// Each run's result file, in the record's order: (file name, bytes).
    pub runs: Vec<(String, Vec<u8>)>,
}

/// The name a carried arm's run `i` file takes in a set.
pub fn run_file_name(i: usize) -> String {
    format!("carry-run{i}.safetensors")
}

impl CarriedArm {
    /// The arm as the program answered it in `results` (its files read, each checked to lie
    /// there), renamed for the set.
    pub fn from_answer(arm: &RecordArm, results: &Path, model: &Path) -> Result<CarriedArm> {
        let mut record = arm.clone();
        let mut runs = Vec::with_capacity(arm.runs.len());
        for (i, run) in record.runs.iter_mut().enumerate() {
            let path = run.path.as_deref().map(Path::new).ok_or_else(|| {
                Error::runner(model, format!("the journal lists no result for run {i}"))
            })?;
            if path.parent() != Some(results) {
                return Err(Error::runner(
                    model,
                    format!(
                        "the journal puts run {i}'s result at {}, outside the result directory",
                        path.display()
                    ),
                ));
            }
            let bytes = std::fs::read(path).map_err(|e| Error::io(path, e))?;
            let name = run_file_name(i);
            run.path = Some(name.clone());
            runs.push((name, bytes));
        }
        Ok(CarriedArm { record, runs })
    }

    /// Write the arm's run files into `results` as `prefix`-run`i`, its record pointing at them
    /// (what [`super::transformers`] reads as if the program had just written them).
    pub fn unpack(&self, results: &Path, prefix: &str) -> Result<RecordArm> {
        let mut record = self.record.clone();
        if record.runs.len() != self.runs.len() {
            return Err(Error::internal(
                results,
                "a carried arm whose runs and files differ in number",
            ));
        }
        std::fs::create_dir_all(results).map_err(|e| Error::io(results, e))?;
        for (i, (run, (_, bytes))) in record.runs.iter_mut().zip(&self.runs).enumerate() {
            let path = results.join(format!("{prefix}-run{i}.safetensors"));
            std::fs::write(&path, bytes).map_err(|e| Error::io(&path, e))?;
            run.path = Some(path.display().to_string());
        }
        Ok(record)
    }
}

/// Why two environments are not one measurement's, or `None`: the software, the dtype, TF32,
/// the chunk size and the GPUs' models must be the same (timings and memory may differ).
pub fn same_environment(before: &RunnerEnvironment, now: &RunnerEnvironment) -> Option<String> {
    let key = |e: &RunnerEnvironment| -> [(&'static str, String); 7] {
        let gpus: Vec<&str> = e.gpus.iter().map(|g| g.name.as_str()).collect();
        [
            ("transformers", format!("{:?}", e.transformers)),
            ("torch", format!("{:?}", e.torch)),
            ("CUDA", format!("{:?}", e.cuda)),
            ("dtype", format!("{:?}", e.dtype)),
            ("TF32", format!("{:?}", e.tf32)),
            ("chunk size", format!("{:?}", e.chunk_size)),
            ("GPUs", format!("{gpus:?}")),
        ]
    };
    key(before)
        .into_iter()
        .zip(key(now))
        .find(|((_, a), (_, b))| a != b)
        .map(|((what, a), (_, b))| format!("{what} was {a} in the interrupted run and is {b} now"))
}

/// Where the reference's side of two arms' rows differs (its top-1 token, top-1 probability
/// and NLL of the true next token, bit for bit), or `None`: the same reference pass.
pub fn same_reference_rows(
    carried: &[Vec<Vec<Option<RowRecord>>>],
    new: &[Vec<Vec<Option<RowRecord>>>],
) -> Option<String> {
    if carried.len() != new.len() {
        return Some(format!("{} runs against {}", carried.len(), new.len()));
    }
    for (r, (a, b)) in carried.iter().zip(new).enumerate() {
        if a.len() != b.len() {
            return Some(format!("run {r}: {} windows against {}", a.len(), b.len()));
        }
        for (w, (a, b)) in a.iter().zip(b).enumerate() {
            if a.len() != b.len() {
                return Some(format!(
                    "run {r}, window {w}: {} rows against {}",
                    a.len(),
                    b.len()
                ));
            }
            for (j, (a, b)) in a.iter().zip(b).enumerate() {
                let same = match (a, b) {
                    (Some(a), Some(b)) => {
                        a.ref_top1 == b.ref_top1
                            && a.ref_top1_prob.to_bits() == b.ref_top1_prob.to_bits()
                            && a.nll_ref.map(f64::to_bits) == b.nll_ref.map(f64::to_bits)
                    }
                    (None, None) => true,
                    _ => false,
                };
                if !same {
                    return Some(format!(
                        "run {r}, window {w}, scored row {j}: {a:?} against {b:?}"
                    ));
                }
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(top1: u32, p: f64) -> Option<RowRecord> {
        Some(RowRecord {
            forward: 0.1,
            reverse: 0.1,
            ref_top1: top1,
            cand_top1: 3,
            ref_top1_prob: p,
            nll_ref: Some(1.0),
            nll_cand: Some(2.0),
        })
    }

    #[test]
    fn the_reference_rows_must_agree_bit_for_bit_and_the_candidate_side_may_differ() {
        let a = vec![vec![vec![row(1, 0.5), row(2, 0.25)]]];
        let mut b = a.clone();
        if let Some(r) = b[0][0][1].as_mut() {
            r.forward = 9.0;
            r.cand_top1 = 7;
        }
        assert_eq!(same_reference_rows(&a, &b), None);
        if let Some(r) = b[0][0][1].as_mut() {
            r.ref_top1_prob = f64::from_bits(0.25f64.to_bits() + 1);
        }
        let why = same_reference_rows(&a, &b).unwrap_or_default();
        assert!(why.contains("window 0, scored row 1"), "{why}");
        b[0][0].pop();
        assert!(same_reference_rows(&a, &b).is_some());
    }

    #[test]
    fn another_chunk_size_or_gpu_is_another_environment() {
        let before = RunnerEnvironment {
            torch: Some("2.11".into()),
            chunk_size: Some(2048),
            ..Default::default()
        };
        let mut now = before.clone();
        assert_eq!(same_environment(&before, &now), None);
        now.other
            .insert("timings".into(), serde_json::json!({"load": 3}));
        assert_eq!(same_environment(&before, &now), None);
        now.chunk_size = Some(1024);
        let why = same_environment(&before, &now).unwrap_or_default();
        assert!(why.starts_with("chunk size was Some(2048)"), "{why}");
    }
}
