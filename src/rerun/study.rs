//! A study's runs (issue #20): one reference pass, then each arm's candidate against it. The
//! arms are ordinary rerun requests sharing a reference, an eval text and options, so every
//! arm's measurement is what a single `measure` of the pair records; only the reference's pass
//! is shared. The comparison between arms and the report are [`crate::study`]'s.

use std::path::Path;

pub use super::lane::{ArmOutcome, ArmsOutcome, Interrupted};
use super::lane::{Arms, Pass};
use super::{Lane, Request, preflight};
use crate::error::{Error, Result};

/// Run every arm against one reference pass. `requests` share the first one's reference, eval
/// text, tokenizer, chat template and options (checked here); each has its own candidate and
/// settings. All are in the native lane, all in the transformers lane (each arm's attention
/// and GDN kernel in `kernels`), or all in the llama.cpp lane (each arm its own pair run); the first
/// request's pre-flight runs in full, the others' tokenizers and context lengths are checked
/// before any forward pass. `room` is asked, after the pre-flight and before the first forward
/// pass, whether the outputs fit (given the first request and what its pre-flight found).
/// `carry`: the first arms, completed by an interrupted run (`study --resume`).
#[allow(clippy::too_many_arguments)]
pub fn run_arms(
    requests: &[Request],
    names: &[String],
    kernels: &[crate::runner::transformers::ArmKernel],
    carry: Option<&crate::runner::transformers_carry::Carry>,
    reference_compute: crate::runner::native::ComputeDtype,
    room: &(dyn Fn(&Request, &preflight::Identity) -> Result<()> + Sync),
    stage: &(dyn Fn(&str) + Sync),
    progress: &(dyn Fn(usize, usize, usize) + Sync),
) -> Result<ArmsOutcome> {
    let first = requests
        .first()
        .ok_or_else(|| Error::usage(Path::new("study"), "a study needs at least one arm"))?;
    let reference = match first.lane {
        Lane::Native { reference, .. }
        | Lane::Transformers { reference, .. }
        | Lane::Llamacpp { reference, .. } => reference,
        _ => {
            return Err(Error::usage(
                first.candidate,
                "a study's arms run two models: the native, transformers or llama.cpp lane",
            ));
        }
    };
    fn lane_reference<'a>(lane: &Lane<'a>) -> Option<(&'static str, &'a Path)> {
        match *lane {
            Lane::Native { reference, .. } => Some(("native", reference)),
            Lane::Transformers { reference, .. } => Some(("transformers", reference)),
            Lane::Llamacpp { reference, .. } => Some(("llamacpp", reference)),
            _ => None,
        }
    }
    for r in requests {
        let same = lane_reference(&r.lane) == lane_reference(&first.lane)
            && r.eval_text == first.eval_text
            && r.tokenizer == first.tokenizer
            && r.chat_template == first.chat_template
            && r.options.context_lengths == first.options.context_lengths
            && r.options.positions == first.options.positions
            && r.reference_kv_cache == first.reference_kv_cache
            && r.turns == first.turns
            && r.turns_conversation == first.turns_conversation;
        if !same {
            return Err(Error::internal(
                r.candidate,
                "a study arm with another reference, text, protocol or turns than the first arm's",
            ));
        }
    }
    let pre = if let Lane::Llamacpp { .. } = first.lane {
        // llama.cpp tokenizes when it runs: the text's size bounds the tokens.
        room(first, &preflight::Identity::default())?;
        super::llamacpp::study_preflight(requests, reference, stage)?
    } else {
        let pre = preflight::check(first, stage)?;
        if let Some((tokenizer, _)) = &pre.tokenized {
            // Each checkpoint once: the pre-flight checked the reference and the first arm's
            // (a study's settings arms all run the reference's; its 248k-entry tokenizer took
            // 0.5 s to load for each of 12 arms).
            let mut checked = std::collections::BTreeSet::from([reference, first.candidate]);
            for r in &requests[1..] {
                if checked.insert(r.candidate) {
                    preflight::check_arm(r, tokenizer)?;
                }
            }
        }
        room(first, &pre.identity)?;
        pre
    };
    let arms = Arms {
        requests,
        names,
        kernels,
        reference_compute: Some(reference_compute),
        pass: Pass::Kept,
        carry,
    };
    super::lane::run(&arms, pre, stage, progress)
}
