//! A study file's arms as runs: each arm's settings resolved over the baseline's, what it
//! really changes found by comparing them (and its checkpoint with the reference), and the
//! controls added. An arm that changes another variable than it names, or several, is refused
//! unless it says `mixed: true`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::file::{Arm, Settings, Study, StudyRunner, Variable};
use crate::checkpoint::hash::{HashOptions, Manifest, hash_path};
use crate::error::{Error, Result};
use crate::rerun::MeasureOptions;
use crate::runner::native::kv_cache::KvCacheSetting;
use crate::runner::native::{ComputeDtype, Emulate, StateDtype};
use crate::runner::tokens::ChatTemplateChoice;

/// An arm's settings, resolved.
#[derive(Debug, Clone, PartialEq)]
pub struct Resolved {
    pub kv_cache: Option<KvCacheSetting>,
    pub compute: ComputeDtype,
    pub attention: String,
    /// The transformers runner's Gated DeltaNet kernel (`None`: transformers' choice).
    pub gdn_kernel: Option<String>,
    pub recurrent_state: StateDtype,
    pub emulate: Emulate,
}

/// Why an arm is in the study.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ArmKind {
    /// One of the study file's arms.
    Study,
    /// The baseline against itself again: what repeating the run changes (0 in a deterministic
    /// lane).
    Repeatability,
    /// The reference's weights with another kernel: the lane's numerical floor.
    NoiseFloor,
}

/// One arm, ready to run.
#[derive(Debug, Clone)]
pub struct PlannedArm {
    pub name: String,
    pub kind: ArmKind,
    /// What the arm says it changes.
    pub declared: Variable,
    /// What it changes against the baseline, found.
    pub changed: Vec<Variable>,
    pub mixed: bool,
    /// The checkpoint it runs (the reference's for a settings arm).
    pub candidate: PathBuf,
    /// Its files (hashed once per checkpoint): the arm changes the weights when their root
    /// digest is not the reference's, whatever the paths.
    pub manifest: Arc<Manifest>,
    /// The study file names this arm's candidate: its files are subjects of the signed study.
    pub named_candidate: bool,
    pub settings: Resolved,
}

/// A study ready to run.
#[derive(Debug, Clone)]
pub struct Plan {
    pub reference: PathBuf,
    pub reference_manifest: Arc<Manifest>,
    pub eval_text: PathBuf,
    pub chat_template: ChatTemplateChoice,
    pub options: MeasureOptions,
    pub runner: StudyRunner,
    /// The transformers runner's options (`runner: transformers`), the reference's attention
    /// the baseline's.
    pub transformers: Option<crate::runner::transformers::TransformersOptions>,
    /// The llama.cpp runner's options (`runner: llamacpp`): the flags every arm shares, the
    /// reference's settings the baseline's (its `-fa` and cache types).
    pub llamacpp: Option<crate::runner::llamacpp::LlamacppOptions>,
    pub baseline: Resolved,
    pub arms: Vec<PlannedArm>,
    /// Every arm's turns generated and judged too (`protocol.turns`).
    pub turns: Option<crate::rerun::turns::TurnProtocol>,
    /// The conversation file the turns come from where it is not the eval text
    /// (`protocol.turns.conversation` or `--turns-conversation`; always set for llama.cpp).
    pub turns_conversation: Option<PathBuf>,
}

/// The checkpoints a study file names: the reference, and each arm's candidate where it names
/// one (by the arm's index). Checkpoints may live anywhere (`../models/x`, an absolute path),
/// but each must be one before anything of it is read: a directory holding `*.safetensors` or
/// `*.gguf` weights (or a sharded index), or such a file. A study file naming
/// `/proc/self/environ` or a home directory gets nothing of it read, digested or signed.
pub fn checkpoints(study: &Study) -> Result<(PathBuf, Vec<(usize, PathBuf)>)> {
    let reference = checkpoint(study, "reference", &study.file.reference)?;
    let mut arms = Vec::new();
    for (i, arm) in study.file.arms.iter().enumerate() {
        if let Some(c) = &arm.candidate {
            arms.push((i, checkpoint(study, &format!("arms[{i}].candidate"), c)?));
        }
    }
    Ok((reference, arms))
}

fn checkpoint(study: &Study, field: &str, relative: &str) -> Result<PathBuf> {
    let path = study.resolve(relative);
    let meta = std::fs::metadata(&path)
        .map_err(|e| study.error(field, format!("{}: {e}", path.display())))?;
    let weights = |name: &std::ffi::OsStr| {
        let name = name.to_string_lossy();
        !crate::checkpoint::members::excluded(&name) && name.ends_with(".safetensors")
            || name.ends_with(".gguf")
            || name.ends_with(".safetensors.index.json")
    };
    let is_checkpoint = if meta.is_dir() {
        std::fs::read_dir(&path)
            .map_err(|e| study.error(field, format!("{}: {e}", path.display())))?
            .flatten()
            .any(|e| weights(&e.file_name()))
    } else {
        meta.is_file() && path.file_name().is_some_and(weights)
    };
    if !is_checkpoint {
        return Err(study.error(
            field,
            format!(
                "`{relative}` is not a checkpoint (a directory holding *.safetensors or *.gguf weights, or such a file); a study file names checkpoints, and cardproof reads nothing else it names outside the study file's directory"
            ),
        ));
    }
    Ok(path)
}

/// The study's arms resolved and checked, controls last; every checkpoint hashed (with
/// `threads`; `None`: every core) once.
pub fn plan(study: &Study, threads: Option<usize>) -> Result<Plan> {
    let f = &study.file;
    let field_error = |field: &str, rule: String| study.error(field, rule);
    let baseline = resolve(&f.baseline, None, f.runner)
        .map_err(|(field, why)| field_error(&format!("baseline.{field}"), why))?;
    let (reference, named) = checkpoints(study)?;
    // The data files before any checkpoint is hashed.
    let (text, chat_template) = eval_files(study)?;
    let (turns, turns_conversation) = turn_protocol(study)?;
    // Every distinct checkpoint hashed once, all at the same time (a checkpoint in one large
    // file hashes on one core: two 17 GB checkpoints took twice as long one after the other).
    let mut real_paths: BTreeMap<PathBuf, ()> = BTreeMap::new();
    let real = |field: &str, path: &Path| {
        std::fs::canonicalize(path)
            .map_err(|e| field_error(field, format!("{}: {e}", path.display())))
    };
    real_paths.insert(real("reference", &reference)?, ());
    for (i, path) in &named {
        real_paths.insert(real(&format!("arms[{i}].candidate"), path)?, ());
    }
    let options = HashOptions {
        threads,
        include_all: false,
    };
    let hashed: BTreeMap<PathBuf, Arc<Manifest>> = {
        use rayon::prelude::*;
        real_paths
            .into_keys()
            .collect::<Vec<_>>()
            .into_par_iter()
            .map(|p| Ok((p.clone(), Arc::new(hash_path(&p, &options, &|_| {})?))))
            .collect::<Result<_>>()?
    };
    let manifest = |field: &str, path: &Path| -> Result<Arc<Manifest>> {
        let real = real(field, path)?;
        hashed
            .get(&real)
            .cloned()
            .ok_or_else(|| Error::internal(path, "a checkpoint the plan did not hash"))
    };
    let reference_manifest = manifest("reference", &reference)?;
    let mut arms = Vec::new();
    for (i, arm) in f.arms.iter().enumerate() {
        let (candidate, candidate_manifest) = match named.iter().find(|(j, _)| *j == i) {
            Some((_, path)) => (
                path.clone(),
                manifest(&format!("arms[{i}].candidate"), path)?,
            ),
            None => (reference.clone(), reference_manifest.clone()),
        };
        arms.push(plan_arm(
            study,
            i,
            arm,
            &baseline,
            candidate,
            candidate_manifest,
            &reference_manifest,
        )?);
    }
    push_controls(f, &baseline, &reference, &reference_manifest, &mut arms);
    let options = protocol_options(study)?;
    state_knobs_act(study, &arms, &options, turns.is_some())?;
    if f.runner != StudyRunner::Llamacpp && f.llamacpp.is_some() {
        return Err(field_error("llamacpp", "is for runner: llamacpp".into()));
    }
    let llamacpp = match f.runner {
        StudyRunner::Llamacpp => Some(llamacpp_options(study, &baseline)?),
        _ => None,
    };
    let transformers = transformers_options(study, &baseline, &arms)?;
    Ok(Plan {
        reference,
        reference_manifest,
        eval_text: text,
        chat_template,
        options,
        runner: f.runner,
        transformers,
        llamacpp,
        baseline,
        arms,
        turns,
        turns_conversation,
    })
}

/// Every arm's recurrent-state dtype can change its numbers, else the study is refused before
/// any work: an engine stores the state only between calls (at the end of each prefill chunk
/// and after each decode step), so a state dtype needs `protocol.prefill_chunk` below the
/// longest context length, or turns.
fn state_knobs_act(
    study: &Study,
    arms: &[PlannedArm],
    options: &MeasureOptions,
    turns: bool,
) -> Result<()> {
    let longest = options.context_lengths.iter().copied().max().unwrap_or(0);
    let chunked = options.prefill_chunk.is_some_and(|c| c < longest);
    if chunked || turns {
        return Ok(());
    }
    match arms.iter().position(|a| a.settings.recurrent_state != StateDtype::F32) {
        Some(i) => Err(study.error(
            &if i < study.file.arms.len() {
                format!("arms[{i}].recurrent_state")
            } else {
                "baseline.recurrent_state".to_owned()
            },
            format!(
                "`{}` (arm `{}`) would change nothing: an engine stores the recurrent state only between calls (at the end of each prefill chunk and after each decode step), and each window here is prefilled in one pass; set protocol.prefill_chunk below the context length ({longest}), e.g. 2048 as vLLM chunks, or generate turns",
                arms[i].settings.recurrent_state, arms[i].name
            ),
        )),
        None => Ok(()),
    }
}

/// The study's `protocol.turns` as the rerun's turn protocol, checked, and the conversation
/// file its turns come from where it is not the eval text ([`turns_conversation`]).
fn turn_protocol(
    study: &Study,
) -> Result<(Option<crate::rerun::turns::TurnProtocol>, Option<PathBuf>)> {
    let Some(t) = &study.file.protocol.turns else {
        return Ok((None, None));
    };
    let protocol = crate::rerun::turns::TurnProtocol {
        turns: t.select,
        decoding: crate::rerun::turns::Decoding::Greedy,
        max_new_tokens: t
            .max_new_tokens
            .unwrap_or(crate::rerun::turns::DEFAULT_MAX_NEW_TOKENS),
    };
    protocol
        .check()
        .map_err(|why| study.error("protocol.turns.max_new_tokens", why))?;
    Ok((Some(protocol), turns_conversation(study, t)?))
}

/// The conversation file a study's turns come from: `--turns-conversation`, else
/// `protocol.turns.conversation` inside the study file's directory ([`Study::data_file`]: it is
/// read, digested and signed like the eval text), else `None` (the eval text, which the lane
/// then requires to be a conversation). A llama.cpp study must name one: `llama-perplexity`
/// scores a plain-text eval text, so its turns cannot come from there. The file must be a
/// conversation file by its name, as `measure` requires, before any checkpoint is hashed.
fn turns_conversation(study: &Study, t: &super::file::StudyTurns) -> Result<Option<PathBuf>> {
    const FIELD: &str = "protocol.turns.conversation";
    let path = match (&study.given.turns_conversation, &t.conversation) {
        (Some(given), _) => given.clone(),
        (None, Some(c)) => study.data_file(FIELD, c, "--turns-conversation FILE")?,
        (None, None) if study.file.runner == StudyRunner::Llamacpp => {
            return Err(study.error(
                FIELD,
                "is missing: a llama.cpp study's turns come from a conversation file (.json or .jsonl, inside the study file's directory), since its eval text is the plain text llama-perplexity scores; name it here or pass --turns-conversation FILE",
            ));
        }
        (None, None) => return Ok(None),
    };
    if !crate::conversation::eval::is_conversation_file(&path) {
        let shown = t
            .conversation
            .as_deref()
            .filter(|_| study.given.turns_conversation.is_none());
        let why = "is not a conversation file (.json or .jsonl): turns are generated from a conversation's messages and tools";
        return Err(match shown {
            Some(c) => study.error(FIELD, format!("`{c}` {why}")),
            None => crate::error::Error::usage(&path, format!("--turns-conversation: {why}")),
        });
    }
    Ok(Some(path))
}

/// The controls the study file asks for: the baseline again (`control-repeat`), and the
/// reference's weights under the runner's other kernel (`control-kernel`).
fn push_controls(
    f: &super::file::StudyFile,
    baseline: &Resolved,
    reference: &Path,
    reference_manifest: &Arc<Manifest>,
    arms: &mut Vec<PlannedArm>,
) {
    if f.controls.repeatability {
        arms.push(PlannedArm {
            name: "control-repeat".into(),
            kind: ArmKind::Repeatability,
            declared: Variable::None,
            changed: Vec::new(),
            mixed: false,
            candidate: reference.to_path_buf(),
            manifest: reference_manifest.clone(),
            named_candidate: false,
            settings: baseline.clone(),
        });
    }
    if f.controls.noise_floor {
        let mut settings = baseline.clone();
        match f.runner {
            // The native runner has one attention kernel; its floor is the compute dtype's.
            StudyRunner::Native => {
                settings.compute = if baseline.compute == ComputeDtype::F64 {
                    ComputeDtype::F32
                } else {
                    ComputeDtype::F64
                };
            }
            StudyRunner::Transformers => {
                settings.attention = if baseline.attention == "eager" {
                    "sdpa".into()
                } else {
                    "eager".into()
                };
            }
            // llama.cpp's kernel floor: flash attention the other way.
            StudyRunner::Llamacpp => {
                settings.attention = if baseline.attention == "off" {
                    "on".into()
                } else {
                    "off".into()
                };
            }
        }
        arms.push(PlannedArm {
            name: "control-kernel".into(),
            kind: ArmKind::NoiseFloor,
            declared: Variable::Kernel,
            changed: vec![Variable::Kernel],
            mixed: false,
            candidate: reference.to_path_buf(),
            manifest: reference_manifest.clone(),
            named_candidate: false,
            settings,
        });
    }
}

/// The transformers runner's options of a `runner: transformers` study (and every arm's
/// attention checked against them); `None` for the other runners, which refuse the block.
fn transformers_options(
    study: &Study,
    baseline: &Resolved,
    arms: &[PlannedArm],
) -> Result<Option<crate::runner::transformers::TransformersOptions>> {
    let f = &study.file;
    let field_error = |field: &str, rule: String| study.error(field, rule);
    let transformers = match f.runner {
        StudyRunner::Native | StudyRunner::Llamacpp => {
            if f.transformers.is_some() {
                return Err(field_error(
                    "transformers",
                    "is for runner: transformers".into(),
                ));
            }
            None
        }
        StudyRunner::Transformers => {
            let t = f.transformers.clone().unwrap_or_default();
            let flags = crate::runner::transformers_flags::TransformersFlags {
                python: study.given.python.clone(),
                device: t.device.unwrap_or_else(|| "cuda".into()),
                torch_dtype: t.torch_dtype,
                attention: Some(baseline.attention.clone()),
                gdn_kernel: baseline.gdn_kernel.clone(),
                memory_limit: study.given.memory_limit,
                chunk_size: t.chunk_size,
                tf32: t.tf32,
                deterministic: t.deterministic,
                keep_hidden: t.keep_hidden.unwrap_or_else(|| "auto".into()),
                ..Default::default()
            };
            Some(
                flags
                    .options()
                    .map_err(|why| field_error("transformers", why))?,
            )
        }
    };
    if transformers.is_some() {
        for (i, arm) in arms.iter().enumerate() {
            crate::runner::transformers_flags::check_attention(&arm.settings.attention)
                .map_err(|why| field_error(&format!("arms[{i}].attention"), why))?;
        }
    }
    Ok(transformers)
}

/// The eval text and the chat template: the command line's (`--eval-text`, `--chat-template`),
/// else the study file's, inside its directory ([`Study::data_file`]).
fn eval_files(study: &Study) -> Result<(PathBuf, ChatTemplateChoice)> {
    let e = &study.file.eval;
    let text = match &study.given.eval_text {
        Some(given) => given.clone(),
        None => study.data_file("eval.text", &e.text, "--eval-text FILE")?,
    };
    let template_file = match (&study.given.chat_template, &e.chat_template) {
        (Some(given), _) => Some(given.clone()),
        (None, Some(t)) => {
            Some(study.data_file("eval.chat_template", t, "--chat-template FILE")?)
        }
        (None, None) => None,
    };
    let chat_template = ChatTemplateChoice {
        from: match (&template_file, e.chat_template_from) {
            (Some(_), _) => crate::conversation::eval::TemplateFrom::File,
            (None, Some(from)) => from,
            (None, None) => crate::conversation::eval::TemplateFrom::Reference,
        },
        file: template_file,
        name: e.chat_template_name.clone(),
        clock: e.chat_template_clock,
    };
    Ok((text, chat_template))
}

fn plan_arm(
    study: &Study,
    i: usize,
    arm: &Arm,
    baseline: &Resolved,
    candidate: PathBuf,
    manifest: Arc<Manifest>,
    reference: &Manifest,
) -> Result<PlannedArm> {
    let at = |field: &str| format!("arms[{i}].{field}");
    let err = |field: &str, rule: String| study.error(&at(field), rule);
    let settings = resolve(&arm.settings, Some(baseline), study.file.runner)
        .map_err(|(field, why)| err(field, why))?;
    let mut changed = Vec::new();
    // By digest: a byte-identical copy of the reference elsewhere changes no weights.
    if manifest.root_sha256 != reference.root_sha256 {
        changed.push(Variable::Weights);
    }
    if settings.kv_cache != baseline.kv_cache {
        changed.push(Variable::KvCache);
    }
    if settings.compute != baseline.compute
        || settings.attention != baseline.attention
        || settings.gdn_kernel != baseline.gdn_kernel
    {
        changed.push(Variable::Kernel);
    }
    if settings.recurrent_state != baseline.recurrent_state {
        changed.push(Variable::RecurrentState);
    }
    if settings.emulate != baseline.emulate {
        changed.push(Variable::Emulation);
    }
    let isolated = match arm.changes {
        Variable::None => changed.is_empty(),
        v => changed == [v],
    };
    if !isolated && !arm.mixed {
        let found = if changed.is_empty() {
            "nothing".to_owned()
        } else {
            changed
                .iter()
                .map(|v| v.as_str())
                .collect::<Vec<_>>()
                .join(" and ")
        };
        let copy = if arm.changes == Variable::Weights && changed.is_empty() {
            " (its candidate's files are the reference's, byte for byte)"
        } else {
            ""
        };
        return Err(err(
            "changes",
            format!(
                "arm `{}` says it changes {} but changes {found} against the baseline{copy}: each arm isolates one variable (write `mixed: true` to run it anyway, marked as mixed)",
                arm.name,
                arm.changes.as_str()
            ),
        ));
    }
    Ok(PlannedArm {
        name: arm.name.clone(),
        kind: ArmKind::Study,
        declared: arm.changes,
        mixed: !isolated,
        changed,
        named_candidate: arm.candidate.is_some(),
        candidate,
        manifest,
        settings,
    })
}

/// Settings over `base` (the baseline's; `None`: the runner's defaults). The error names the
/// field.
fn resolve(
    s: &Settings,
    base: Option<&Resolved>,
    runner: StudyRunner,
) -> std::result::Result<Resolved, (&'static str, String)> {
    let default = Resolved {
        kv_cache: None,
        compute: ComputeDtype::F32,
        attention: match runner {
            StudyRunner::Native => "eager".into(),
            StudyRunner::Transformers => "sdpa".into(),
            // llama.cpp's own default `-fa`.
            StudyRunner::Llamacpp => "auto".into(),
        },
        gdn_kernel: None,
        recurrent_state: StateDtype::F32,
        emulate: Emulate::ReferenceSemantics,
    };
    let base = base.unwrap_or(&default);
    let kv_cache = match s.kv_cache.as_deref() {
        None => base.kv_cache,
        Some("none") => None,
        Some(label) => Some(
            KvCacheSetting::from_label(label)
                .ok_or_else(|| ("kv_cache", KvCacheSetting::unknown_label(label)))?,
        ),
    };
    let compute = match s.compute_dtype.as_deref() {
        None => base.compute,
        Some(name) => ComputeDtype::from_name(name).ok_or((
            "compute_dtype",
            format!("`{name}` is not a compute dtype (f32, f64, bf16)"),
        ))?,
    };
    if runner == StudyRunner::Transformers && s.compute_dtype.is_some() {
        return Err((
            "compute_dtype",
            "the transformers runner's dtype is the runner's (`torch_dtype`), not an arm's".into(),
        ));
    }
    if runner == StudyRunner::Llamacpp {
        // llama.cpp computes in its own types and keeps its own recurrent state; an arm changes
        // what `llama-perplexity` has a flag for.
        for (field, given) in [
            ("compute_dtype", s.compute_dtype.is_some()),
            ("recurrent_state", s.recurrent_state.is_some()),
            ("emulate", s.emulate.is_some()),
        ] {
            if given {
                return Err((
                    field,
                    format!(
                        "the llama.cpp runner has no `{field}` setting: its arms change the weights, the KV cache (-ctk/-ctv) or flash attention (attention: on, off, auto)"
                    ),
                ));
            }
        }
        if let Some(a) = s.attention.as_deref()
            && !matches!(a, "on" | "off" | "auto")
        {
            return Err((
                "attention",
                format!("`{a}`: the llama.cpp runner's attention is its -fa: on, off or auto"),
            ));
        }
    }
    let attention = match s.attention.as_deref() {
        None => base.attention.clone(),
        Some(a) if runner == StudyRunner::Native && a != "eager" => {
            return Err((
                "attention",
                format!(
                    "`{a}`: the native runner has one attention kernel (eager); its kernel arm changes compute_dtype, or use runner: transformers"
                ),
            ));
        }
        Some(a) => a.to_owned(),
    };
    let gdn_kernel = match s.gdn_kernel.as_deref() {
        None => base.gdn_kernel.clone(),
        Some(_) if runner != StudyRunner::Transformers => {
            return Err((
                "gdn_kernel",
                "the Gated DeltaNet kernel is the transformers runner's setting (the native runner has one delta-rule implementation; llama.cpp its own)".into(),
            ));
        }
        Some(k) => {
            crate::runner::transformers_flags::check_gdn_kernel(k)
                .map_err(|e| ("gdn_kernel", e))?;
            Some(k.to_owned())
        }
    };
    let recurrent_state = match s.recurrent_state.as_deref() {
        None => base.recurrent_state,
        Some(name) => StateDtype::from_name(name).ok_or((
            "recurrent_state",
            format!("`{name}` is not a state dtype (f32, bf16, f16)"),
        ))?,
    };
    let emulate = match s.emulate.as_deref() {
        None => base.emulate,
        Some(name) => Emulate::from_name(name).ok_or((
            "emulate",
            format!("`{name}` is not an emulation (reference-semantics, llamacpp-cpu)"),
        ))?,
    };
    Ok(Resolved {
        kv_cache,
        compute,
        attention,
        gdn_kernel,
        recurrent_state,
        emulate,
    })
}

/// The study's protocol as run options, through the same checks as `measure`'s flags.
fn protocol_options(study: &Study) -> Result<MeasureOptions> {
    let p = &study.file.protocol;
    let mut flags = crate::rerun::options::ProtocolFlags::default();
    if let Some(pos) = &p.positions {
        flags.positions = pos.policy;
        flags.stride = pos.stride;
        flags.offset = pos.offset;
        flags.from = pos.from;
        flags.role = pos.role;
        flags.span = pos.span;
    }
    flags.direction = p.direction;
    if study.file.runner == StudyRunner::Llamacpp {
        // llama.cpp's protocol: its rows are the second half of each window (the default here;
        // another policy is refused below, naming it), its KL is over the reference's entries
        // above log p = -16, forward.
        if p.positions.is_none() {
            flags.positions = crate::disclosure::PositionPolicy::SecondHalf;
        }
        flags.vocab = crate::disclosure::VocabMode::Threshold;
        flags.threshold = f64::from(crate::kld::llamacpp::KL_GATE);
    }
    if let Some(r) = p.resamples {
        flags.bootstrap = r;
    }
    if let Some(s) = p.seed {
        flags.seed = s;
    }
    let lengths: Vec<usize> = p
        .context_lengths
        .iter()
        .map(|&l| usize::try_from(l).unwrap_or(usize::MAX))
        .collect();
    let mut options = flags
        .options(&lengths, study.file.eval.bos)
        .map_err(|why| study.error("protocol", why))?;
    if let Some(chunk) = p.prefill_chunk {
        if study.file.runner == StudyRunner::Llamacpp {
            return Err(study.error(
                "protocol.prefill_chunk",
                "llama.cpp prefills in its own batches (its -b/-ub settings), not in a protocol chunk",
            ));
        }
        crate::rerun::options::check_prefill_chunk(chunk as usize)
            .map_err(|why| study.error("protocol.prefill_chunk", why))?;
        options.prefill_chunk = Some(chunk as usize);
    }
    if study.file.runner == StudyRunner::Llamacpp {
        let differences = crate::rerun::llamacpp::protocol_differences(&options);
        if !differences.is_empty() {
            return Err(study.error(
                "protocol",
                format!(
                    "runner: llamacpp scores llama.cpp's protocol: {}",
                    differences.join("; ")
                ),
            ));
        }
    }
    Ok(options)
}

/// The llama.cpp runner's shared flags from the study file's `llamacpp:` block, the reference
/// running the baseline's `-fa` and cache types.
fn llamacpp_options(
    study: &Study,
    baseline: &Resolved,
) -> Result<crate::runner::llamacpp::LlamacppOptions> {
    use crate::runner::llamacpp::{self, LlamacppOptions, LlamacppSettings};
    let given = study.file.llamacpp.clone().unwrap_or_default();
    let bad = |field: &str, why: String| study.error(field, why);
    let settings = LlamacppSettings {
        threads: given.threads,
        batch: given.batch,
        ubatch: given.ubatch,
        gpu_layers: given.gpu_layers,
        device: given.device,
        ..LlamacppSettings::default()
    };
    settings.check().map_err(|why| bad("llamacpp", why))?;
    let (k, v, rotation) =
        llamacpp::cache_flags(baseline.kv_cache).map_err(|why| bad("baseline.kv_cache", why))?;
    let reference = LlamacppSettings {
        flash_attn: Some(baseline.attention.clone()),
        cache_type_k: k,
        cache_type_v: v,
        rotation,
        ..settings.clone()
    };
    Ok(LlamacppOptions {
        binary: study.llamacpp_bin(),
        server: study.given.llamacpp_server.clone(),
        settings,
        no_gate: given.no_gate,
        reference: Some(reference),
    })
}
