//! `cardproof verify`: lint the card, inspect and hash the checkpoint, rerun the disclosed
//! protocol with the native runner, run the sanity gates and decide a verdict per claim; then the
//! signed report (an in-toto Statement in a DSSE envelope) and its Markdown and HTML renderings.

pub mod claims;
pub mod gates;
pub mod protocol;
pub mod write;

use std::path::{Path, PathBuf};

use serde_json::{Value, json};

use crate::card::Card;
use crate::checkpoint::hash::{HashOptions, Manifest, hash_path};
use crate::error::{Error, Result};
use crate::findings::Code;
use crate::measurement::{self, MeasureOptions, ModelMeasurement, NativeRequest, Progress};
use crate::runner::Runner;
use crate::runner::native::{ComputeDtype, Emulate};
use claims::{Claim, ClaimResult, Context, Rerun, Verdict};

/// What to verify.
pub struct VerifyRequest<'a> {
    /// The candidate: a model directory holding its card (README.md).
    pub model: &'a Path,
    /// The reference checkpoint (local path; Hub sources come later).
    pub reference: Option<&'a Path>,
    /// A compact reference artifact in place of the reference checkpoint.
    pub reference_artifact: Option<&'a Path>,
    /// The eval text, when the card's `eval.text.source` is not a readable path.
    pub eval_text: Option<&'a Path>,
    pub threads: usize,
    /// Also measure the reference against itself in f64 vs the rerun's compute dtype.
    pub noise_floor: bool,
    /// Rerun with the transformers runner (the user's GPU) instead of the native one.
    pub transformers: Option<&'a crate::runner::transformers::TransformersOptions>,
}

/// One context length's rows, for the report's plots.
pub struct PlotRows {
    pub context_length: usize,
    pub position: Vec<u64>,
    pub kld: Vec<f64>,
    pub flip: Vec<bool>,
}

/// A finished verification.
pub struct VerifyOutcome {
    /// report.json: the in-toto predicate.
    pub report: Value,
    pub verdict: Verdict,
    pub claims: Vec<ClaimResult>,
    /// The checkpoint's files: the statement's subjects.
    pub manifest: Manifest,
    pub measurement: Option<(ModelMeasurement, Value)>,
    pub rows: Vec<PlotRows>,
}

/// The eval text: `--eval-text`, else the card's `eval.text.source` as a path inside the card's
/// directory. A card never makes cardproof read a file outside its own directory (an absolute
/// path, `..`, or a link out of it): whatever it names would be hashed and signed.
fn eval_text_path(card_dir: &Path, disclosure: &Value, given: Option<&Path>) -> Result<PathBuf> {
    if let Some(p) = given {
        return Ok(p.to_owned());
    }
    let source = disclosure["eval"]["text"]["source"]
        .as_str()
        .unwrap_or_default();
    let digest = disclosure["eval"]["text"]["sha256"]
        .as_str()
        .unwrap_or("not disclosed");
    let refuse = |why: &str| {
        Error::malformed(
            card_dir,
            Some("fidelity.eval.text.source"),
            format!(
                "the eval text `{source}` (sha256 {digest}) {why}; pass it with --eval-text FILE"
            ),
        )
    };
    let relative = Path::new(source);
    if source.is_empty() {
        return Err(refuse("is not named"));
    }
    if relative.is_absolute()
        || relative.components().any(|c| {
            !matches!(
                c,
                std::path::Component::Normal(_) | std::path::Component::CurDir
            )
        })
    {
        return Err(refuse(
            "is not a path inside the card's directory, and a card cannot make cardproof read files elsewhere",
        ));
    }
    let candidate = card_dir.join(relative);
    let (Ok(dir), Ok(real)) = (card_dir.canonicalize(), candidate.canonicalize()) else {
        return Err(refuse("is not a readable file in the card's directory"));
    };
    if !real.starts_with(&dir) {
        return Err(refuse(
            "resolves (through a link) outside the card's directory, and a card cannot make cardproof read files elsewhere",
        ));
    }
    if !std::fs::metadata(&real).is_ok_and(|m| m.is_file()) {
        return Err(refuse("is not a regular file in the card's directory"));
    }
    Ok(real)
}

fn compute_dtype(card_dir: &Path, name: &str) -> Result<ComputeDtype> {
    match name {
        "f32" | "float32" => Ok(ComputeDtype::F32),
        "f64" | "float64" => Ok(ComputeDtype::F64),
        "bf16" | "bfloat16" => Ok(ComputeDtype::Bf16),
        other => Err(Error::malformed(
            card_dir,
            Some("fidelity.runtime.compute_dtype"),
            format!("compute dtype `{other}` is not one the native runner has (f32, f64, bf16)"),
        )),
    }
}

/// Whether the loaded candidate holds quantized weights.
fn quantized(m: &crate::runner::native::NativeModel) -> bool {
    m.decoder.report.schemes.keys().any(|s| {
        !matches!(
            s.as_str(),
            "bf16" | "f16" | "f32" | "f64" | "gguf F32" | "gguf F16" | "gguf BF16"
        )
    })
}

/// The reference checkpoint the rerun needs.
fn required_reference<'a>(r: &VerifyRequest<'a>, disclosure: &Value) -> Result<&'a Path> {
    r.reference.ok_or_else(|| {
        Error::malformed(
            r.model,
            Some("fidelity.reference"),
            format!(
                "verify needs the reference: pass --reference PATH or hf:ORG/NAME@REVISION, or --reference-artifact FILE with the native runner (the card names {}@{})",
                disclosure["reference"]["repo"].as_str().unwrap_or("?"),
                disclosure["reference"]["revision"].as_str().unwrap_or("?")
            ),
        )
    })
}

/// The logit rows' width from config.json (padding included), for cards that include padding.
fn config_vocab(model: &Path) -> Result<usize> {
    let path = model.join("config.json");
    let json: Value = crate::files::read_config(&path)?;
    let v = json.get("text_config").unwrap_or(&json)["vocab_size"].as_u64();
    v.map(|v| v as usize)
        .ok_or_else(|| Error::malformed(&path, Some("vocab_size"), "missing"))
}

/// A claim is rerun in the lane the card discloses: when the card's numbers come from
/// transformers and the user did not say otherwise, use its attention kernel and dtype.
fn follow_card_runtime(runner: &mut crate::runner::transformers::TransformersOptions, rt: &Value) {
    if rt["engine"] != "transformers" {
        return;
    }
    let (attention, dtype) = runner.follow_card;
    if attention && let Some(a) = rt["attention_backend"].as_str() {
        let a = a.to_ascii_lowercase();
        if [
            "sdpa",
            "eager",
            "flash_attention_2",
            "flash_attention_3",
            "flex_attention",
        ]
        .contains(&a.as_str())
        {
            runner.attention = (a.clone(), a);
        }
    }
    if dtype {
        match rt["compute_dtype"].as_str() {
            Some("bf16" | "bfloat16") => runner.dtype = "bfloat16".into(),
            Some("f16" | "float16") => runner.dtype = "float16".into(),
            Some("f32" | "float32") => runner.dtype = "float32".into(),
            _ => {}
        }
    }
}

/// The gates from the transformers runner's raw numbers; gates it could not run fail (closed).
fn transformers_gates(raw: &Value, measured: gates::Measured) -> Vec<gates::Gate> {
    let num = |k: &str| raw[k].as_f64();
    match (
        num("self_forward_mean"),
        num("self_reverse_mean"),
        raw["self_top1_identical"].as_bool(),
        num("shift_forward_mean"),
    ) {
        (Some(forward), Some(reverse), Some(same_top1), Some(shift)) => gates::judge(
            gates::SelfCompare {
                forward,
                reverse,
                same_top1,
            },
            shift,
            measured,
        ),
        _ => vec![gates::Gate {
            gate: "self_compare",
            passed: false,
            detail: format!(
                "the transformers runner did not run the gates ({}); a rerun without them is never reproduced",
                raw["skipped"]
                    .as_str()
                    .unwrap_or("no gate numbers in its record")
            ),
        }],
    }
}

fn native_request<'a>(
    reference: &'a Path,
    model: &'a Path,
    text: &'a Path,
    options: &'a MeasureOptions,
    compute: ComputeDtype,
    threads: usize,
    candidate_manifest: &'a Manifest,
) -> NativeRequest<'a> {
    NativeRequest {
        reference,
        candidate: model,
        eval_text: text,
        tokenizer: None,
        options,
        compute,
        emulate: Emulate::ReferenceSemantics,
        threads,
        out: Path::new("."),
        candidate_manifest: Some(candidate_manifest),
    }
}

/// The rows a card says were left out as non-finite at a context length (the largest any of its
/// claims there states; `None` when none states it).
fn disclosed_nonfinite(claims: &[Claim], length: u64) -> Option<u64> {
    claims
        .iter()
        .filter(|c| c.invalid.is_none() && c.context_length.is_none_or(|l| l == length))
        .filter_map(|c| c.n_nonfinite)
        .max()
}

/// The window the gates run on: the first of the first run whose scored rows are all finite (a
/// window spoilt by non-finite logits would make the one-row shift look like no change).
fn gate_window(m: &ModelMeasurement) -> usize {
    let Some(run) = m.runs.first() else {
        return 0;
    };
    if run.n_windows <= 1 {
        return 0;
    }
    let mut per_window = vec![0usize; run.n_windows];
    for row in &run.rows {
        if let Some(n) = per_window.get_mut(row.block as usize) {
            *n += 1;
        }
    }
    let full = per_window.iter().copied().max().unwrap_or(0);
    per_window.iter().position(|&n| n == full).unwrap_or(0)
}

/// The gates' view of a measurement's first run.
fn measured_for_gates(
    m: &ModelMeasurement,
    quantized: bool,
    declared: Option<String>,
) -> gates::Measured {
    gates::Measured::of_metrics(
        m.runs.first().map(|r| &r.summary.metrics),
        quantized,
        declared,
    )
}

/// The quantization method a card declares (`None` for none or a plain float dtype).
fn declared_quantization(disclosure: &Value) -> Option<String> {
    let method = disclosure["quantization"]["method"].as_str()?;
    let plain = [
        "none", "bf16", "bfloat16", "f16", "fp16", "float16", "f32", "fp32", "float32",
    ];
    (!plain.contains(&method.to_ascii_lowercase().as_str())).then(|| method.to_owned())
}

fn plot_rows(m: &ModelMeasurement) -> Vec<PlotRows> {
    m.runs
        .iter()
        .map(|run| PlotRows {
            context_length: run.context_length,
            position: run.rows.iter().map(|s| s.position).collect(),
            kld: run.rows.iter().map(|s| s.record.forward).collect(),
            flip: run
                .rows
                .iter()
                .map(|s| s.record.ref_top1 != s.record.cand_top1)
                .collect(),
        })
        .collect()
}

/// The reference against itself in a second compute dtype.
fn noise_floor(
    reference: &Path,
    prepared: &measurement::Prepared,
    text: &Path,
    options: &MeasureOptions,
    compute: ComputeDtype,
) -> Result<Value> {
    let other = if compute == ComputeDtype::F64 {
        ComputeDtype::F32
    } else {
        ComputeDtype::F64
    };
    let twin = crate::runner::native::load(reference, other, Emulate::ReferenceSemantics)?;
    let mut floor_options = options.clone();
    floor_options.bootstrap.resamples = floor_options.bootstrap.resamples.min(200);
    let f = measurement::measure_models(
        &prepared.reference,
        &twin,
        &measurement::EvalInput {
            stream: &prepared.stream,
            text_path: text,
            bos_id: prepared.tokenizer.bos_id,
            tokenizer_vocab: prepared.tokenizer.vocab_size,
        },
        &floor_options,
        &|_, _| {},
    )?;
    Ok(json!({
        "what": format!("the reference against itself, computed in {} vs {}", compute.as_str(), other.as_str()),
        "runs": f.runs.iter().map(|run| json!({
            "context_length": run.context_length,
            "metrics": run.summary.metrics,
        })).collect::<Vec<_>>(),
    }))
}

/// Run the whole verification. Fails closed: any error is an `Err`, never a verdict.
pub fn verify(
    r: &VerifyRequest,
    stage: &(dyn Fn(&str) + Sync),
    progress: Progress,
) -> Result<VerifyOutcome> {
    stage("linting");
    let card_path = crate::card::resolve_card_path(r.model)?;
    let card = Card::open(&card_path)?;
    let inspections = if crate::checkpoint::has_checkpoint(r.model) {
        crate::checkpoint::inspect::inspect_path(r.model)?
    } else {
        return Err(Error::malformed(
            r.model,
            None,
            "holds no checkpoint (safetensors or GGUF) to verify",
        ));
    };
    let lint = crate::lint::lint_with_checkpoint(&card, &inspections);
    let fidelity_node = card.metadata().and_then(|m| m.get("fidelity"));
    let disclosure = fidelity_node.map_or(Value::Null, |e| e.value.to_json());
    let card_claims: Vec<Claim> = fidelity_node
        .map(|e| claims::claims(&e.value, &|offset| card.line_col(offset).line))
        .unwrap_or_default();

    let mut ctx = Context::default();
    for f in &lint.findings {
        if matches!(
            f.code,
            Code::MissingDisclosure | Code::VagueDisclosure | Code::NoFidelityDisclosure
        ) {
            ctx.undisclosed.push(f.message.clone());
        }
        if f.is_error() {
            ctx.lint_errors.push(match f.line {
                Some(line) => format!("{} (line {line}): {}", f.code, f.message),
                None => format!("{}: {}", f.code, f.message),
            });
        }
    }
    let declared = declared_quantization(&disclosure);
    stage("hashing");
    let manifest = hash_path(
        r.model,
        &HashOptions {
            threads: Some(r.threads),
            include_all: false,
        },
        &|_| {},
    )?;

    let resolved = protocol::resolve(&disclosure);
    let mut measured = None;
    let mut gates_out = Vec::new();
    let mut noise = Value::Null;
    let mut rows = Vec::new();
    match resolved {
        Err(missing) => ctx.undisclosed.extend(missing),
        Ok(resolved) => {
            let card_dir = card_path.parent().unwrap_or(Path::new(".")).to_owned();
            let compute = compute_dtype(&card_path, &resolved.compute)?;
            let mut options: MeasureOptions = resolved.options.clone();
            let (m, doc) = if let Some(artifact) = r.reference_artifact {
                let given = eval_text_path(&card_dir, &disclosure, r.eval_text).ok();
                let request = measurement::ArtifactRequest {
                    artifact,
                    candidate: r.model,
                    eval_text: given.as_deref(),
                    options: &options,
                    compute,
                    emulate: Emulate::ReferenceSemantics,
                    threads: r.threads,
                    out: Path::new("."),
                    candidate_manifest: Some(&manifest),
                };
                let prepared = measurement::prepare_artifact(&request, stage)?;
                stage("measuring");
                let (m, doc) = measurement::measure_artifact(&request, &prepared, progress)?;
                stage("sanity gates");
                let first = prepared.windows.first();
                let window = first
                    .and_then(|w| w.windows.get(gate_window(&m)))
                    .cloned()
                    .unwrap_or_default();
                let l = window.len();
                let scored: Vec<usize> = (0..l)
                    .filter(|&j| options.positions.selects(j as u64, l as u64))
                    .collect();
                let measured =
                    measured_for_gates(&m, quantized(&prepared.candidate), declared.clone());
                gates_out = measurement::with_artifact_runner(&prepared, |runner| {
                    gates::run(
                        runner,
                        &prepared.candidate,
                        &window,
                        &scored,
                        m.vocab_size,
                        measured,
                    )
                })?;
                rows = plot_rows(&m);
                (m, doc)
            } else if let Some(runner) = r.transformers {
                let reference = required_reference(r, &disclosure)?;
                let text = eval_text_path(&card_dir, &disclosure, r.eval_text)?;
                if resolved.padding_included {
                    options.vocab_size = Some(config_vocab(r.model)?);
                }
                let mut runner = runner.clone();
                runner.gates = true;
                follow_card_runtime(&mut runner, &disclosure["runtime"]);
                let run = measurement::measure_transformers(
                    &measurement::TransformersRequest {
                        reference,
                        candidate: r.model,
                        eval_text: &text,
                        tokenizer: None,
                        options: &options,
                        runner: &runner,
                        threads: r.threads,
                        out: Path::new("."),
                        candidate_manifest: Some(&manifest),
                    },
                    stage,
                    progress,
                )?;
                let measured = measured_for_gates(
                    &run.measurement,
                    inspections.iter().any(|i| i.summary.quantized > 0),
                    declared.clone(),
                );
                gates_out = transformers_gates(&run.gates, measured);
                if r.noise_floor {
                    noise = json!({"skipped": "the noise floor of the transformers runner is its kernel sweep: `cardproof measure --runner transformers --sweep attention=sdpa,eager`"});
                }
                rows = plot_rows(&run.measurement);
                (run.measurement, run.document)
            } else {
                let reference = required_reference(r, &disclosure)?;
                let text = eval_text_path(&card_dir, &disclosure, r.eval_text)?;
                let prepared = measurement::prepare_native(
                    &native_request(
                        reference, r.model, &text, &options, compute, r.threads, &manifest,
                    ),
                    stage,
                )?;
                if resolved.padding_included {
                    options.vocab_size = Some(prepared.candidate.vocab());
                }
                stage("measuring");
                let (m, doc) = measurement::measure_prepared(
                    &native_request(
                        reference, r.model, &text, &options, compute, r.threads, &manifest,
                    ),
                    &prepared,
                    progress,
                )?;
                stage("sanity gates");
                let first_length = options.context_lengths.first().copied().unwrap_or(2);
                let window: Vec<u32> = crate::runner::tokens::windows(
                    &prepared.stream,
                    &text,
                    first_length,
                    options.bos,
                    prepared.tokenizer.bos_id,
                )?
                .windows
                .into_iter()
                .nth(gate_window(&m))
                .unwrap_or_default();
                let l = window.len();
                let scored: Vec<usize> = (0..l).collect();
                let measured =
                    measured_for_gates(&m, quantized(&prepared.candidate), declared.clone());
                gates_out = gates::run(
                    &prepared.reference,
                    &prepared.candidate,
                    &window,
                    &scored,
                    m.vocab_size,
                    measured,
                )?;
                if r.noise_floor {
                    stage("noise floor");
                    noise = noise_floor(reference, &prepared, &text, &options, compute)?;
                }
                rows = plot_rows(&m);
                (m, doc)
            };
            gates_out.push(gates::finite_rows(
                &m.runs
                    .iter()
                    .map(|run| {
                        let length = run.context_length as u64;
                        (
                            length,
                            run.n_nonfinite as u64,
                            disclosed_nonfinite(&card_claims, length),
                        )
                    })
                    .collect::<Vec<_>>(),
            ));
            for g in gates_out.iter().filter(|g| !g.passed) {
                ctx.failed_gates.push(format!("{}: {}", g.gate, g.detail));
            }
            ctx.differences = protocol::lane_differences(&disclosure, &doc, &resolved);
            measured = Some((m, doc, resolved));
        }
    }

    let lengths: Vec<u64> = measured
        .as_ref()
        .map(|(m, _, _)| m.runs.iter().map(|r| r.context_length as u64).collect())
        .unwrap_or_default();
    let bits = measured.as_ref().is_some_and(|(_, _, res)| res.bits);
    let lookup = |metric: &str, length: u64| -> Option<Rerun> {
        let (m, _, _) = measured.as_ref()?;
        let run = m.runs.iter().find(|r| r.context_length as u64 == length)?;
        let value = *run.summary.metrics.get(metric)?;
        let ci = run.summary.uncertainty.get(metric).map(|u| u.ci95);
        let scale = if bits && metric.starts_with("kld") {
            std::f64::consts::LN_2.recip()
        } else {
            1.0
        };
        Some(Rerun {
            value: value * scale,
            ci95: ci.map(|[a, b]| [a * scale, b * scale]),
            n_positions: run.n_positions as u64,
            n_nonfinite: run.n_nonfinite as u64,
        })
    };
    let results: Vec<ClaimResult> = card_claims
        .iter()
        .map(|c| claims::judge(c, &lengths, &ctx, &lookup))
        .collect();
    let verdict = claims::overall(&results);
    let measurement_doc = measured.as_ref().map_or(Value::Null, |(_, d, _)| d.clone());
    let report = json!({
        "schema_version": crate::JSON_SCHEMA_VERSION,
        "tool": {"name": "cardproof", "version": env!("CARGO_PKG_VERSION")},
        "verdict": verdict,
        "summary": claims::summary(&results),
        "checkpoint": {
            "path": r.model.display().to_string(),
            "root_sha256": manifest.root_sha256,
            "files": manifest.files.iter().map(|f| json!({"path": f.path, "size": f.size, "sha256": f.sha256})).collect::<Vec<_>>(),
        },
        "card": {
            "path": card_path.display().to_string(),
            "fidelity_sha256": crate::card::canonical::fidelity_sha256(&disclosure),
            "disclosure": disclosure,
            "lint": {
                "errors": lint.errors(),
                "warnings": lint.warnings(),
                "findings": lint.findings.iter().map(|f| json!({
                    "code": f.code, "severity": f.severity, "message": f.message, "line": f.line,
                })).collect::<Vec<_>>(),
            },
        },
        "reference": measurement_doc.get("reference").cloned().unwrap_or(Value::Null),
        "measurement": measurement_doc,
        "claims": results,
        "sanity": gates_out,
        "noise_floor": noise,
        "undisclosed": ctx.undisclosed,
        "lane_differences": ctx.differences,
    });
    Ok(VerifyOutcome {
        report,
        verdict,
        claims: results,
        manifest,
        measurement: measured.map(|(m, d, _)| (m, d)),
        rows,
    })
}
