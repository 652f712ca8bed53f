//! `measure --runner transformers --sweep attention=A,B,...` and `measure --sweep
//! kv_cache=A,B,...`: one model's weights against themselves under each setting, the first the
//! baseline (design.md's backend-only test; the seed study's KV-cache test). Each pair is one
//! [`super::run`], in the transformers lane (attention) or the native one (the KV cache: the
//! reference's cache in the baseline scheme, the candidate's in the other); `sweep.json` is the
//! [`Sweep`] document.

use std::path::Path;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::document::Environment;
use super::score::{Progress, RunResult};
use super::{ReferenceSpec, Request, Rerun, RunnerSpec};
use crate::error::{Error, Result};
use crate::files::write_atomically;
use crate::kld::stats::Bucket;
use crate::runner::native::kv_cache::KvCacheSetting;

/// A sweep to run: one model ([`super::MeasureSpec::candidate`]) against itself under each of
/// `values` of `knob`, on the spec's text, protocol and runner.
pub struct SweepRequest<'a> {
    pub spec: &'a super::MeasureSpec,
    pub knob: &'a str,
    pub values: &'a [String],
    pub out: &'a Path,
    /// The run id every document of the sweep carries (see [`crate::outset`]).
    pub run_id: Option<&'a str>,
    /// Told each pre-flight warning (once: every pair measures the same text and protocol).
    pub on_warning: &'a (dyn Fn(&super::preflight::Warning) + Sync),
    /// Told the size estimate of every pair's files before the first pair runs.
    pub before_rerun: &'a (dyn Fn(u64) -> Result<()> + Sync),
}

/// Whether a sweep of `knob` changes only the kernels that run the same weights and cache (the
/// attention implementation, llama.cpp's flash attention or backend): its KL is then the lane's
/// own noise, a kernel control.
pub fn is_kernel_knob(knob: &str) -> bool {
    !matches!(knob, "kv_cache" | "llamacpp.kv")
}

/// `sweep.json`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[schemars(title = "cardproof sweep v1")]
pub struct Sweep {
    pub schema_version: crate::schema::SchemaVersion,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_id: Option<String>,
    /// Always `sweep`.
    pub kind: String,
    pub knob: String,
    pub values: Vec<String>,
    pub model: String,
    pub definition: String,
    /// The largest `kld_mean` of any pair.
    pub largest_kld_mean: Option<f64>,
    /// The lane's noise floor, the smallest KL a claim in it can resolve: a kernel sweep's
    /// largest `kld_mean` (the same weights under another kernel or backend: the lane's kernel
    /// control). `null` for a sweep of anything else (a KV-cache scheme's KL is its damage, not
    /// the lane's noise).
    pub noise_floor_kld_mean: Option<f64>,
    pub pairs: Vec<SweepPair>,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct SweepPair {
    pub baseline: String,
    pub other: String,
    /// The pair's measurement.json, relative to sweep.json.
    pub measurement: String,
    pub runs: Vec<Flips>,
    pub environment: Environment,
}

/// Flips of the top-1 token along position: how many rows flip, where the first flips are, and
/// the flip rate by depth.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct Flips {
    pub context_length: usize,
    pub n_positions: usize,
    pub kld_mean: Option<f64>,
    pub kld_max: Option<f64>,
    pub kld_p99: Option<f64>,
    pub top1_agreement: Option<f64>,
    pub n_flips: usize,
    pub flip_location: String,
    /// The first 1,000 flips.
    pub flips: Vec<FlipAt>,
    pub flips_listed: usize,
    pub by_depth: Vec<Bucket>,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, JsonSchema)]
pub struct FlipAt {
    pub block: u32,
    pub position: u64,
}

fn flips(run: &RunResult) -> Flips {
    let all: Vec<FlipAt> = run
        .rows
        .iter()
        .filter(|s| s.record.ref_top1 != s.record.cand_top1)
        .map(|s| FlipAt {
            block: s.block,
            position: s.position,
        })
        .collect();
    let shown: Vec<FlipAt> = all.iter().take(1000).copied().collect();
    let metric = |name: &str| run.summary.metrics.get(name).copied();
    Flips {
        context_length: run.context_length,
        n_positions: run.n_positions,
        kld_mean: metric("kld_mean"),
        kld_max: metric("kld_max"),
        kld_p99: metric("kld_p99"),
        top1_agreement: metric("top1_agreement"),
        n_flips: all.len(),
        flip_location: if run.n_windows == 1 {
            "block = run of rows in the one window"
        } else {
            "block = window"
        }
        .into(),
        flips_listed: shown.len(),
        flips: shown,
        by_depth: run.summary.diagnostics.by_depth.clone(),
    }
}

/// The runner of one pair (`baseline` as the reference's setting, `other` as the candidate's),
/// and for a KV-cache sweep the two schemes.
fn pair_runner(
    r: &SweepRequest,
    baseline: &str,
    other: &str,
) -> Result<(RunnerSpec, Option<(KvCacheSetting, KvCacheSetting)>)> {
    let kv = |v: &str| {
        KvCacheSetting::from_label(v)
            .ok_or_else(|| Error::usage(Path::new("--sweep"), KvCacheSetting::unknown_label(v)))
    };
    if let Some(given) = r.spec.runner.llamacpp() {
        let knob = |v: &str| {
            crate::runner::llamacpp::with_knob(&given.settings, r.knob, v)
                .map_err(|e| Error::usage(Path::new("--sweep"), format!("{}={v}: {e}", r.knob)))
        };
        let pair = crate::runner::llamacpp::LlamacppOptions {
            settings: knob(other)?,
            reference: Some(knob(baseline)?),
            ..given.clone()
        };
        return Ok((RunnerSpec::Llamacpp(pair), None));
    }
    let native = RunnerSpec::Native {
        compute: r.spec.runner.compute(),
        emulate: crate::runner::native::Emulate::ReferenceSemantics,
    };
    match (r.knob, r.spec.runner.transformers()) {
        ("attention", Some(runner)) => {
            let mut runner = runner.clone();
            runner.attention = (baseline.to_owned(), other.to_owned());
            Ok((RunnerSpec::Transformers(runner), None))
        }
        ("gdn_kernel", Some(runner)) => {
            let mut runner = runner.clone();
            runner.gdn_kernel = (Some(baseline.to_owned()), Some(other.to_owned()));
            Ok((RunnerSpec::Transformers(runner), None))
        }
        ("kv_cache", runner) => Ok((
            runner.cloned().map_or(native, RunnerSpec::Transformers),
            Some((kv(baseline)?, kv(other)?)),
        )),
        (knob, _) => Err(Error::usage(
            Path::new("--sweep"),
            format!("a `{knob}` sweep runs in the transformers runner"),
        )),
    }
}

/// Run the sweep and write `sweep.json` plus one measurement directory per compared setting.
pub fn run_sweep(
    r: &SweepRequest,
    stage: &(dyn Fn(&str) + Sync),
    progress: Progress,
) -> Result<Sweep> {
    let spec = r.spec;
    let baseline = &r.values[0];
    // Each pair is one measurement; the text's size bounds its tokens.
    let text_bytes = spec
        .eval_text
        .as_deref()
        .and_then(|t| std::fs::metadata(t).ok())
        .map_or(0, |m| m.len());
    let conversation = spec
        .eval_text
        .as_deref()
        .is_some_and(crate::conversation::eval::is_conversation_file);
    (r.before_rerun)(
        super::output::size_estimate_of(&spec.options, text_bytes, conversation)
            .saturating_mul(r.values.len() as u64),
    )?;
    let mut pairs = Vec::new();
    // Written only when every pair has run: a failed sweep leaves no partial results.
    let mut outputs: Vec<(std::path::PathBuf, Rerun)> = Vec::new();
    let mut floor: Option<f64> = None;
    for other in &r.values[1..] {
        let (runner, kv_pair) = pair_runner(r, baseline, other)?;
        let pair_dir = format!("{}-{baseline}-vs-{other}", r.knob).replace([':', '/'], "_");
        let request = Request {
            tokenizer: spec.tokenizer.as_deref(),
            chat_template: spec.chat_template.clone(),
            kv_cache: kv_pair.map(|(_, other)| other),
            reference_kv_cache: kv_pair.map(|(baseline, _)| baseline),
            ..Request::new(
                runner.lane(ReferenceSpec::Checkpoint(&spec.candidate))?,
                &spec.candidate,
                Some(spec.eval_text.as_deref().unwrap_or(Path::new(""))),
                spec.options.clone(),
                spec.threads,
            )
        };
        let pre = super::preflight::check(&request, stage)?;
        if pairs.is_empty() {
            for w in &pre.warnings {
                (r.on_warning)(w);
            }
        }
        let mut rerun = super::run_checked(&request, pre, stage, progress)?;
        rerun.measurement.run_id = r.run_id.map(str::to_owned);
        for m in &rerun.runs {
            if let Some(&k) = m.summary.metrics.get("kld_mean") {
                floor = Some(floor.map_or(k, |f: f64| f.max(k)));
            }
        }
        pairs.push(SweepPair {
            baseline: baseline.clone(),
            other: other.clone(),
            // Relative to sweep.json: the sweep is written as one set and moved into place.
            measurement: format!("{pair_dir}/measurement.json"),
            runs: rerun.runs.iter().map(flips).collect(),
            environment: rerun.measurement.environment.clone(),
        });
        outputs.push((r.out.join(&pair_dir), rerun));
    }
    for (out, rerun) in &outputs {
        super::output::write_measurement(out, &rerun.measurement, &rerun.runs)?;
    }
    let document = Sweep {
        schema_version: crate::schema::SchemaVersion,
        run_id: r.run_id.map(str::to_owned),
        kind: "sweep".into(),
        knob: r.knob.to_owned(),
        values: r.values.to_vec(),
        model: spec.candidate.display().to_string(),
        definition: format!(
            "each pair measures the same weights under the baseline setting (as reference) and the other setting (as candidate), same tokens and rows: any KL is the {}'s, not the weights'",
            match r.knob {
                "kv_cache" | "llamacpp.kv" => "KV-cache scheme",
                "llamacpp.backend" => "backend",
                "llamacpp.flash_attn" => "attention kernel",
                _ => "kernel",
            }
        ),
        largest_kld_mean: floor,
        noise_floor_kld_mean: floor.filter(|_| is_kernel_knob(r.knob)),
        pairs,
    };
    std::fs::create_dir_all(r.out).map_err(|e| Error::write(r.out, e))?;
    let mut text = serde_json::to_vec_pretty(&document)
        .map_err(|e| Error::internal(r.out, format!("cannot encode sweep.json: {e}")))?;
    text.push(b'\n');
    // The page first: sweep.json, written last, says the sweep is complete.
    write_atomically(
        &r.out.join("sweep.html"),
        sweep_html(&document, &outputs).as_bytes(),
    )?;
    write_atomically(&r.out.join("sweep.json"), &text)?;
    Ok(document)
}

/// sweep.html: the pairs' table and, per context length, each setting's KLD and flip rate
/// along position against the baseline (from the pairs' rows, as their positions files hold them).
fn sweep_html(document: &Sweep, outputs: &[(std::path::PathBuf, Rerun)]) -> String {
    use crate::report::{RunRows, SweepRow};
    let baseline = document.values.first().map_or("", String::as_str);
    let mut rows = Vec::new();
    let mut by_length: std::collections::BTreeMap<usize, Vec<(String, RunRows)>> =
        Default::default();
    for (pair, (_, rerun)) in document.pairs.iter().zip(outputs) {
        for (flips, run) in pair.runs.iter().zip(&rerun.runs) {
            rows.push(SweepRow {
                setting: &pair.other,
                context_length: flips.context_length,
                kld_mean: flips.kld_mean,
                kld_p99: flips.kld_p99,
                top1_agreement: flips.top1_agreement,
                n_flips: flips.n_flips,
                n_positions: flips.n_positions,
            });
            by_length
                .entry(run.context_length)
                .or_default()
                .push((pair.other.clone(), RunRows::from(run)));
        }
    }
    let plots: Vec<String> = by_length
        .iter()
        .map(|(&length, series)| crate::report::svg_sweep(length, baseline, series))
        .collect();
    crate::report::render_sweep_html(
        &document.knob,
        baseline,
        &document.definition,
        &rows,
        &plots,
    )
}
