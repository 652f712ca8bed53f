//! `cardproof verify`: lint the card, inspect and hash the checkpoint, resolve the card's typed
//! protocol, hand one [`rerun::Request`] to the rerun module, judge every claim against the typed
//! measurement it returns, and assemble the typed [`Report`]; [`write`] signs it (an in-toto
//! Statement in a DSSE envelope) and renders it.

pub mod claims;
pub mod differences;
pub mod report;
pub mod write;

use std::path::{Path, PathBuf};

use crate::card::Card;
use crate::checkpoint::hash::{HashOptions, Manifest, hash_path};
use crate::disclosure::{self, read::Sections};
use crate::error::{Error, Result};
use crate::findings::Code;
use crate::rerun::{self, GateRequest, HubPin, Lane, Progress, Rerun, Role};
use crate::runner::native::kv_cache::KvCacheSetting;
use crate::runner::native::{ComputeDtype, Emulate};
use claims::{Claim, ClaimResult, Context, Verdict};
pub use report::Report;

/// What to verify.
pub struct VerifyRequest<'a> {
    /// The candidate: a model directory holding its card (README.md).
    pub model: &'a Path,
    /// The reference checkpoint.
    pub reference: Option<&'a Path>,
    /// A compact reference artifact (or llama.cpp base file) in place of the reference
    /// checkpoint, and who decides whether it is vouched for (with `reference` also given, a
    /// sample of its rows is recomputed from the reference's weights).
    pub reference_artifact: Option<(&'a Path, &'a dyn rerun::artifact::Voucher)>,
    /// The eval text, when the card's `eval.text.source` is not a readable path.
    pub eval_text: Option<&'a Path>,
    pub threads: usize,
    /// Also measure the reference against itself in f64 vs the rerun's compute dtype.
    pub noise_floor: bool,
    /// Rerun with the transformers runner (the user's GPU) instead of the native one.
    pub transformers: Option<&'a crate::runner::transformers::TransformersOptions>,
    /// Rerun with the user's llama.cpp (`--runner llamacpp`); the card's llama.cpp flags are
    /// followed where the user set none.
    pub llamacpp: Option<&'a crate::runner::llamacpp::LlamacppOptions>,
    /// The Hub commits the candidate and reference came from (signed with the report).
    pub pins: Vec<(Role, HubPin)>,
    /// The dtype the candidate's recurrent state is kept in for the rerun (native runner;
    /// `--recurrent-state-dtype`, default f32); a card that discloses another is not reproduced.
    pub recurrent_state: crate::runner::native::StateDtype,
    /// `--kv-cache`: the candidate's KV-cache scheme for the rerun, in place of the card's.
    pub kv_cache: Option<KvCacheSetting>,
    /// `--chat-template*`: how a conversation eval text is rendered, each flag in place of what
    /// the card discloses.
    pub chat_template: crate::runner::tokens::ChatTemplateFlags,
    /// Told each pre-flight warning before the rerun starts.
    pub on_warning: &'a (dyn Fn(&rerun::preflight::Warning) + Sync),
    /// Asked, after the pre-flight and before the rerun, whether the outputs of this request
    /// (what the pre-flight found: the token count) fit where they go: a full disk must not be
    /// found after the whole rerun.
    pub before_rerun:
        &'a (dyn Fn(&rerun::Request, &rerun::preflight::Identity) -> Result<()> + Sync),
}

/// A finished verification.
pub struct VerifyOutcome {
    /// report.json: the in-toto predicate.
    pub report: Report,
    pub verdict: Verdict,
    /// The checkpoint's files: the statement's subjects.
    pub manifest: Manifest,
    /// The rerun (its measurement is also in the report).
    pub rerun: Option<Rerun>,
    /// Each context length's rows, for the report's plots.
    pub rows: Vec<crate::report::RunRows>,
}

/// The eval text: `--eval-text`, else the card's `eval.text.source` as a path inside the card's
/// directory ([`card_file`]).
fn eval_text_path(
    card_dir: &Path,
    eval: Option<&disclosure::Eval>,
    given: Option<&Path>,
) -> Result<PathBuf> {
    if let Some(p) = given {
        return Ok(p.to_owned());
    }
    let source = eval.map_or("", |e| e.text.source.as_str());
    let digest = eval
        .and_then(|e| e.text.sha256.as_ref())
        .map_or("not disclosed", |d| d.0.as_str());
    card_file(
        card_dir,
        source,
        "fidelity.eval.text.source",
        &format!("the eval text `{source}` (sha256 {digest})"),
        "--eval-text FILE",
    )
}

/// A file a card names, as a path inside the card's directory. A card never makes cardproof
/// read a file outside its own directory (an absolute path, `..`, or a link out of it):
/// whatever it names would be hashed and signed. `what` names the file in the error, `flag` how
/// to give it instead.
fn card_file(
    card_dir: &Path,
    source: &str,
    field: &str,
    what: &str,
    flag: &str,
) -> Result<PathBuf> {
    crate::files::inside_dir(card_dir, source).map_err(|why| {
        Error::card(
            card_dir,
            Some(field),
            format!("{what} {}; pass it with {flag}", why.why("card")),
        )
    })
}

/// How the rerun renders a conversation eval text: as the card's `eval.conversation` says (its
/// template's source, name and clock; a template file by its path inside the card's
/// directory), with each `--chat-template*` flag in place of what it names. A card without the
/// block renders with the reference's template, and any difference from what a card states is
/// a difference.
fn chat_template_choice(
    card_dir: &Path,
    eval: Option<&disclosure::Eval>,
    flags: &crate::runner::tokens::ChatTemplateFlags,
    text: Option<&Path>,
) -> Result<crate::runner::tokens::ChatTemplateChoice> {
    use crate::conversation::eval::TemplateFrom;
    use crate::runner::tokens::ChatTemplateChoice;
    let conversation_text = text.is_some_and(crate::conversation::eval::is_conversation_file);
    let Some(c) = eval.and_then(|e| e.conversation.as_ref()) else {
        return Ok(flags.over(ChatTemplateChoice::default()));
    };
    let file = match c.template.from {
        // A template the flags replace is not looked for.
        TemplateFrom::File if conversation_text && flags.from.is_none() => {
            let digest = c
                .template
                .sha256
                .as_ref()
                .map_or("not disclosed", |d| d.0.as_str());
            let path = c.template.path.as_deref().unwrap_or_default();
            Some(card_file(
                card_dir,
                path,
                "fidelity.eval.conversation.template.path",
                &format!("the chat template `{path}` (sha256 {digest})"),
                "--chat-template FILE",
            )?)
        }
        _ => None,
    };
    Ok(flags.over(ChatTemplateChoice {
        from: c.template.from,
        file,
        name: c.template.name.clone(),
        clock: c.clock,
    }))
}

fn compute_dtype(card_dir: &Path, name: &str) -> Result<ComputeDtype> {
    ComputeDtype::from_name(name).ok_or_else(|| {
        Error::unsupported(
            card_dir,
            Some("fidelity.runtime.compute_dtype"),
            format!("compute dtype `{name}` is not one the native runner has (f32, f64, bf16)"),
        )
    })
}

/// The reference checkpoint the rerun needs.
fn required_reference<'a>(
    r: &VerifyRequest<'a>,
    reference: Option<&disclosure::Reference>,
) -> Result<&'a Path> {
    r.reference.ok_or_else(|| {
        Error::usage(
            r.model,
            format!(
                "fidelity.reference: verify needs the reference: pass --reference PATH or hf:ORG/NAME@REVISION, or --reference-artifact FILE with the native runner (the card names {}@{})",
                reference.map_or("?", |r| r.repo.as_str()),
                reference.map_or("?", |r| r.revision.as_str()),
            ),
        )
    })
}

/// A claim is rerun in the lane the card discloses: when the card's numbers come from
/// transformers and the user did not say otherwise, use its attention kernel and dtype.
fn follow_card_runtime(
    runner: &mut crate::runner::transformers::TransformersOptions,
    rt: Option<&disclosure::Runtime>,
) {
    let Some(rt) = rt.filter(|rt| rt.engine == disclosure::Engine::Transformers) else {
        return;
    };
    let (attention, dtype) = runner.follow_card;
    if attention {
        let a = rt.attention_backend.to_ascii_lowercase();
        if crate::runner::transformers::ATTENTION_IMPLEMENTATIONS.contains(&a.as_str()) {
            runner.attention = (a.clone(), a);
        }
    }
    if dtype {
        match rt.compute_dtype.as_str() {
            "bf16" | "bfloat16" => runner.dtype = "bfloat16".into(),
            "f16" | "float16" => runner.dtype = "float16".into(),
            "f32" | "float32" => runner.dtype = "float32".into(),
            _ => {}
        }
    }
}

/// A claim measured in llama.cpp is rerun with the card's llama.cpp flags wherever the user set
/// none: flash attention, the batch sizes and the GPU layers (the KV cache is the card's
/// `kv_cache_dtype`, as for every lane). Anything the rerun still does differently is a listed
/// difference, not a silent change.
fn follow_card_llamacpp(
    given: &crate::runner::llamacpp::LlamacppOptions,
    rt: Option<&disclosure::Runtime>,
) -> crate::runner::llamacpp::LlamacppOptions {
    use disclosure::FlagValue;
    let mut o = given.clone();
    let Some(flags) = rt
        .filter(|rt| rt.engine == disclosure::Engine::LlamaCpp)
        .and_then(|rt| rt.flags.as_ref())
    else {
        return o;
    };
    let number = |key: &str| match flags.get(key) {
        Some(FlagValue::Integer(n)) => u32::try_from(*n).ok(),
        Some(FlagValue::Text(t)) => t.parse().ok(),
        _ => None,
    };
    let s = &mut o.settings;
    if s.flash_attn.is_none()
        && let Some(FlagValue::Text(fa)) = flags.get("flash_attn")
    {
        s.flash_attn = match fa.as_str() {
            "enabled" | "on" | "true" | "1" => Some("on".into()),
            "disabled" | "off" | "false" | "0" => Some("off".into()),
            _ => None,
        };
    }
    if s.batch.is_none() {
        s.batch = number("n_batch");
    }
    if s.ubatch.is_none() {
        s.ubatch = number("n_ubatch");
    }
    if s.gpu_layers.is_none() {
        s.gpu_layers = match flags.get("n_gpu_layers") {
            Some(FlagValue::Integer(n)) => Some(n.to_string()),
            Some(FlagValue::Text(t)) => Some(t.clone()),
            _ => None,
        };
    }
    o
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

/// The quantization method a card declares (`None` for none or a plain float dtype).
fn declared_quantization(method: Option<&str>) -> Option<String> {
    let method = method?;
    let plain = [
        "none", "bf16", "bfloat16", "f16", "fp16", "float16", "f32", "fp32", "float32",
    ];
    (!plain.contains(&method.to_ascii_lowercase().as_str())).then(|| method.to_owned())
}

fn plot_rows(runs: &[rerun::RunResult]) -> Vec<crate::report::RunRows> {
    runs.iter().map(crate::report::RunRows::from).collect()
}

/// The card's lane and identities as read.
fn card_lane<'a>(
    runtime: Option<&'a disclosure::Runtime>,
    eval: Option<&'a disclosure::Eval>,
    reference: Option<&'a disclosure::Reference>,
    disclosure: &'a serde_json::Value,
) -> differences::CardLane<'a> {
    differences::CardLane {
        runtime,
        eval,
        reference,
        candidate_files_sha256: disclosure["candidate"]["files_sha256"].as_str(),
    }
}

/// A reference artifact nobody the user trusts vouches for (`--trust-unsigned-artifact`): its
/// numbers are shown, and a difference makes every claim `not_comparable`, never `reproduced`
/// (an artifact recorded without a vouch counts as unvouched too).
fn unvouched_reference(m: &rerun::Measurement) -> Option<differences::Difference> {
    let artifact = m.environment.reference_artifact.as_ref()?;
    let described = match &artifact.vouch {
        Some(v) if v.is_signed() => return None,
        Some(v) => v.describe(),
        None => "an artifact nobody vouches for".to_owned(),
    };
    Some(differences::Difference {
        field: "reference".into(),
        card: "the reference the card names".into(),
        rerun: described.clone(),
        message: format!(
            "reference: {described}; a reference nobody you trust vouches for cannot reproduce a claim (name its signer's key with --artifact-pub, or rerun against the reference's weights)"
        ),
    })
}

/// Who vouches for the reference a verification ran against, in words for the report.
fn reference_source(m: &rerun::Measurement) -> String {
    match &m.environment.reference_artifact {
        None => format!(
            "the reference's own weights ({}, root sha256 {}), rerun here",
            m.reference.path, m.reference.manifest_sha256
        ),
        Some(a) => {
            let vouch = a.vouch.as_ref().map_or_else(
                || "an artifact nobody vouches for".to_owned(),
                |v| v.describe(),
            );
            let spot = match &a.spot_check {
                Some(c) => format!(
                    "; {} rows of {} windows recomputed from the reference's weights (root sha256 {}) match it (largest row KL {:.1e}, at most {:.0e}; seed {})",
                    c.rows,
                    c.windows.len(),
                    c.reference_manifest_sha256,
                    c.max_row_kld,
                    c.limit,
                    c.seed
                ),
                None => "; not checked against the reference's weights".to_owned(),
            };
            format!("{} {vouch}{spot}", a.path)
        }
    }
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
        return Err(Error::usage(
            r.model,
            "holds no checkpoint (safetensors or GGUF) to verify",
        ));
    };
    let lint = crate::lint::lint_with_checkpoint(&card, &inspections);
    let fidelity_node = card.metadata().and_then(|m| m.get("fidelity"));
    let disclosure = fidelity_node.map_or(serde_json::Value::Null, |e| e.value.to_json());
    let sections = Sections::read(&disclosure);
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
    stage("hashing");
    let manifest = hash_path(
        r.model,
        &HashOptions {
            threads: Some(r.threads),
            include_all: false,
        },
        &|_| {},
    )?;

    let runtime = sections.runtime.as_ref().ok();
    let eval = sections.eval.as_ref().ok();
    let reference_section = sections.reference.as_ref().ok();
    let resolved = match (&sections.protocol, &sections.eval) {
        (Ok(p), Ok(e)) => rerun::options::resolve(p, e.bos, runtime),
        (p, e) => Err([p.as_ref().err(), e.as_ref().err()]
            .into_iter()
            .flatten()
            .cloned()
            .collect()),
    };
    let mut rerun_done: Option<(Rerun, rerun::Resolved)> = None;
    // Set when the pre-flight stops the rerun: the files given contradict the card.
    let mut early_differences = Vec::new();
    let mut protocol_lengths: Vec<u64> = Vec::new();
    match resolved {
        Err(missing) => ctx.undisclosed.extend(missing),
        Ok(resolved) => {
            let card_dir = card_path.parent().unwrap_or(Path::new(".")).to_owned();
            let compute = compute_dtype(&card_path, &resolved.compute)?;
            let mut runner;
            let llamacpp_runner;
            let text;
            let lane = if let Some((file, voucher)) = r.reference_artifact {
                text = eval_text_path(&card_dir, eval, r.eval_text).ok();
                let source = rerun::artifact::ArtifactSource {
                    file,
                    voucher,
                    reference: r.reference,
                };
                Lane::artifact(source, compute, Emulate::ReferenceSemantics)
            } else if let Some(given) = r.llamacpp {
                let reference = required_reference(r, reference_section)?;
                text = Some(eval_text_path(&card_dir, eval, r.eval_text)?);
                llamacpp_runner = follow_card_llamacpp(given, runtime);
                Lane::Llamacpp {
                    reference,
                    runner: &llamacpp_runner,
                }
            } else if let Some(given) = r.transformers {
                let reference = required_reference(r, reference_section)?;
                text = Some(eval_text_path(&card_dir, eval, r.eval_text)?);
                runner = given.clone();
                follow_card_runtime(&mut runner, runtime);
                Lane::Transformers {
                    reference,
                    runner: &runner,
                }
            } else {
                let reference = required_reference(r, reference_section)?;
                text = Some(eval_text_path(&card_dir, eval, r.eval_text)?);
                Lane::Native {
                    reference,
                    compute,
                    emulate: Emulate::ReferenceSemantics,
                }
            };
            let lengths: Vec<u64> = resolved
                .options
                .context_lengths
                .iter()
                .map(|&l| l as u64)
                .collect();
            // A card whose runtime names a quantized KV-cache scheme the runners emulate is
            // rerun with it (native and transformers lanes; a llama.cpp base file's lane has
            // nothing to set); any other value is compared as before.
            let kv_cache = match &lane {
                Lane::Native { .. } | Lane::Transformers { .. } | Lane::Llamacpp { .. } => {
                    r.kv_cache.or_else(|| {
                        runtime
                            .and_then(|rt| {
                                // The structured entry names K and V separately; lint holds it to
                                // agree with `kv_cache_dtype`.
                                rt.kv_cache
                                    .as_ref()
                                    .and_then(|e| e.setting().ok())
                                    .or_else(|| KvCacheSetting::from_label(&rt.kv_cache_dtype))
                            })
                            .filter(|s| s.k.is_quantized() || s.v.is_quantized())
                    })
                }
                _ => None,
            };
            let request = rerun::Request {
                lane,
                candidate: r.model,
                eval_text: text.as_deref(),
                tokenizer: None,
                chat_template: chat_template_choice(
                    &card_dir,
                    eval,
                    &r.chat_template,
                    text.as_deref(),
                )?,
                options: resolved.options.clone(),
                padding_included: resolved.padding_included,
                threads: r.threads,
                candidate_manifest: Some(&manifest),
                gates: Some(GateRequest {
                    declared: declared_quantization(sections.quantization_method.as_deref()),
                    checkpoint_quantized: inspections.iter().any(|i| i.summary.quantized > 0),
                    disclosed_nonfinite: lengths
                        .iter()
                        .map(|&l| (l, disclosed_nonfinite(&card_claims, l)))
                        .collect(),
                }),
                noise_floor: r.noise_floor,
                pins: r.pins.clone(),
                recurrent_state: r.recurrent_state,
                kv_cache,
                reference_kv_cache: None,
            };
            // Everything that needs no forward pass first: a file that is not the card's is
            // found in well under a second, not after the measurement.
            let pre = rerun::preflight::check(&request, stage)?;
            for w in &pre.warnings {
                (r.on_warning)(w);
            }
            let id = &pre.identity;
            let contradicted = differences::identity_differences(
                &card_lane(runtime, eval, reference_section, &disclosure),
                &differences::Identities {
                    eval_text_sha256: id.eval_text_sha256.as_deref(),
                    conversation: id.conversation.as_ref(),
                    text_known: id.text_read,
                    tokens: id.tokens_sha256.as_deref().zip(id.token_count),
                    candidate_files_sha256: &manifest.root_sha256,
                    reference_files_sha256: id.reference_files_sha256.as_deref(),
                },
                "given files",
            );
            if contradicted.is_empty() {
                (r.before_rerun)(&request, &pre.identity)?;
                let done = rerun::run_checked(&request, pre, stage, progress)?;
                for g in done.gates.iter().filter(|g| !g.passed) {
                    ctx.failed_gates.push(format!("{}: {}", g.gate, g.detail));
                }
                rerun_done = Some((done, resolved));
            } else {
                // Not rerun: every claim is judged against the card alone and none can be
                // reproduced (docs/DESIGN.md, "Verification").
                ctx.not_rerun = Some(claims::NotRerun {
                    forward: resolved.options.direction.forward(),
                    reverse: resolved.options.direction.reverse(),
                });
                protocol_lengths = lengths;
                early_differences = contradicted;
            }
        }
    }
    let mut lane_differences = early_differences;
    if let Some((done, resolved)) = &rerun_done {
        if let Err(e) = &sections.runtime {
            lane_differences.push(differences::Difference {
                field: "fidelity.runtime".into(),
                card: e.clone(),
                rerun: done.measurement.environment.lane.clone(),
                message: format!("runtime: the card's runtime cannot be read ({e}); the rerun's lane cannot be compared with it"),
            });
        }
        lane_differences.extend(differences::lane_differences(
            &card_lane(runtime, eval, reference_section, &disclosure),
            &done.measurement,
            resolved,
        ));
        lane_differences.extend(unvouched_reference(&done.measurement));
    }
    ctx.differences = lane_differences.iter().map(|d| d.message.clone()).collect();

    let measurement = rerun_done.as_ref().map(|(d, _)| &d.measurement);
    let lengths: Vec<u64> = measurement
        .map(|m| m.runs.iter().map(|r| r.context_length as u64).collect())
        .unwrap_or(protocol_lengths);
    let bits = rerun_done.as_ref().is_some_and(|(_, res)| res.bits);
    let lookup = |metric: &str, length: u64| -> Option<claims::Rerun> {
        let run = measurement?.run(usize::try_from(length).ok()?)?;
        // A metric on another one's scale (`same_top_p` is 100 × `top1_agreement`).
        let (measured, factor) =
            crate::disclosure::vocabulary::derived(metric).unwrap_or((metric, 1.0));
        let value = *run.summary.metrics.get(measured)?;
        let ci = run.summary.uncertainty.get(measured).map(|u| u.ci95);
        let scale = factor
            * if bits && metric.starts_with("kld") {
                std::f64::consts::LN_2.recip()
            } else {
                1.0
            };
        Some(claims::Rerun {
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
    let report = Report {
        schema_version: crate::output::SchemaVersion,
        run_id: None,
        tool: report::Tool {
            name: "cardproof".into(),
            version: env!("CARGO_PKG_VERSION").into(),
        },
        verdict,
        summary: claims::summary(&results),
        checkpoint: report::Checkpoint {
            path: r.model.display().to_string(),
            root_sha256: manifest.root_sha256.clone(),
            files: manifest
                .files
                .iter()
                .map(|f| report::CheckpointFile {
                    path: f.path.clone(),
                    size: f.size,
                    sha256: f.sha256.clone(),
                })
                .collect(),
        },
        card: report::CardRecord {
            path: card_path.display().to_string(),
            fidelity_sha256: crate::card::canonical::fidelity_sha256(&disclosure),
            model_index_sha256: crate::card::canonical::fidelity_sha256(
                &crate::card::canonical::model_index_json(&card),
            ),
            disclosure,
            lint: report::LintRecord {
                errors: lint.errors(),
                warnings: lint.warnings(),
                findings: lint
                    .findings
                    .iter()
                    .map(|f| report::FindingRecord {
                        code: f.code.to_string(),
                        severity: f.severity.to_string(),
                        message: f.message.clone(),
                        line: f.line,
                    })
                    .collect(),
            },
        },
        reference: measurement.map(|m| m.reference.clone()),
        measurement: measurement.cloned(),
        claims: results,
        sanity: rerun_done
            .as_ref()
            .map(|(d, _)| d.gates.clone())
            .unwrap_or_default(),
        noise_floor: rerun_done.as_ref().and_then(|(d, _)| d.noise_floor.clone()),
        undisclosed: ctx.undisclosed,
        lane_differences,
        hub_sources: r
            .pins
            .iter()
            .map(|(role, pin)| report::HubSource::of(*role, pin))
            .collect(),
        definitions: report::verdict_definitions(),
        reference_source: measurement.map(reference_source),
        set_files: Vec::new(),
    };
    let rows = rerun_done
        .as_ref()
        .map(|(d, _)| plot_rows(&d.runs))
        .unwrap_or_default();
    Ok(VerifyOutcome {
        report,
        verdict,
        manifest,
        rerun: rerun_done.map(|(d, _)| d),
        rows,
    })
}
