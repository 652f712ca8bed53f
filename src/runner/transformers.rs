//! The `transformers` runner: a Python program (the package runners/transformers_runner/, embedded
//! in the binary) driven as a subprocess on the user's GPU. cardproof writes a JSON request
//! (models, dtype, token windows, scored rows, attention implementation, chunk sizes, placement),
//! the program answers with one safetensors file of per-row records per context length and a JSON
//! record of what it actually ran (versions, GPU, attention really used, dtypes, peak memory,
//! timings). Its rows are reduced on the GPU with the numerics rules of the `measure` module; the
//! statistics are still ours.
//!
//! Trust and failure: the program is ours, not the checkpoint's (no remote code unless the user
//! passes `--trust-remote-code`, safetensors only). A crash, a signal, a missing record or a
//! result that does not match the request is an error naming what happened, never a verdict.
//! The process runs under [`crate::runner::child`]: in its own process group, killed whole
//! when it exits (anything it left running), on an error and on Ctrl-C, its output read in
//! lines cut at [`MAX_LINE_BYTES`], and stopped when it prints nothing for an hour
//! ([`STALL_TIMEOUT_VAR`]): it reports each window and each model loaded, and transformers
//! shows each checkpoint shard, so an hour of silence is a hang, not a slow run.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

use crate::checkpoint::dtype::Dtype;
use crate::checkpoint::safetensors::{self, SafetensorsFile};
use crate::error::{Error, Result};
use crate::kld::row::RowRecord;
use crate::runner::exchange::{
    GateNumbers, RecordArm, RecordTurnSet, RequestDump, RequestModel, RequestModels, RequestRun,
    RequestTurns, RunnerEnvironment, RunnerRecord, RunnerRequest, TurnAsk, TurnEngine,
};
use crate::runner::native::StateDtype;
use crate::runner::native::generate::{Generated, GenerationTiming};
use crate::runner::transformers_carry::{CarriedArm, Carry};

/// The program, as shipped: the package's files (path under the package's parent directory,
/// content), written next to the request so an installed binary needs no source tree, and
/// started as `python DIR/transformers_runner REQUEST` (its `__main__.py` imports the package
/// from DIR). Every `.py` file of runners/transformers_runner/ is here (a test checks it).
pub const RUNNER_FILES: &[(&str, &str)] = &[
    (
        "transformers_runner/__init__.py",
        include_str!("../../runners/transformers_runner/__init__.py"),
    ),
    (
        "transformers_runner/__main__.py",
        include_str!("../../runners/transformers_runner/__main__.py"),
    ),
    (
        "transformers_runner/gdn.py",
        include_str!("../../runners/transformers_runner/gdn.py"),
    ),
    (
        "transformers_runner/generate.py",
        include_str!("../../runners/transformers_runner/generate.py"),
    ),
    (
        "transformers_runner/kv_quant.py",
        include_str!("../../runners/transformers_runner/kv_quant.py"),
    ),
    (
        "transformers_runner/memory.py",
        include_str!("../../runners/transformers_runner/memory.py"),
    ),
    (
        "transformers_runner/model.py",
        include_str!("../../runners/transformers_runner/model.py"),
    ),
    (
        "transformers_runner/protocol.py",
        include_str!("../../runners/transformers_runner/protocol.py"),
    ),
    (
        "transformers_runner/provenance.py",
        include_str!("../../runners/transformers_runner/provenance.py"),
    ),
    (
        "transformers_runner/reduce.py",
        include_str!("../../runners/transformers_runner/reduce.py"),
    ),
    (
        "transformers_runner/run.py",
        include_str!("../../runners/transformers_runner/run.py"),
    ),
    (
        "transformers_runner/state.py",
        include_str!("../../runners/transformers_runner/state.py"),
    ),
];
/// The package's directory under the directory [`RUNNER_FILES`] are written into.
const RUNNER_PACKAGE: &str = "transformers_runner";
/// The request/record format both sides speak.
pub const PROTOCOL: u64 = 1;
/// Lines of the program's output kept for an error message.
const TAIL_LINES: usize = 30;
/// The longest line of the program's output read (a progress line is ~100 bytes); the rest of a
/// longer one is dropped, so output without newlines cannot grow memory.
const MAX_LINE_BYTES: usize = 16 << 10;
/// The environment variable that sets how long the program may print nothing, in seconds.
pub const STALL_TIMEOUT_VAR: &str = "CARDPROOF_TRANSFORMERS_STALL_SECS";
const STALL_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(3600);
/// The attention implementations the runner asks transformers for (`attn_implementation`).
/// `sdpa:BACKEND` is sdpa held to one of torch's SDPA backends (`torch.nn.attention.sdpa_kernel`):
/// a pass that backend cannot run is an error, so the backend recorded is the one that ran.
pub const ATTENTION_IMPLEMENTATIONS: &[&str] = &[
    "sdpa",
    "sdpa:flash",
    "sdpa:efficient",
    "sdpa:cudnn",
    "sdpa:math",
    "eager",
    "flash_attention_2",
    "flash_attention_3",
    "flex_attention",
];

/// The Gated DeltaNet kernels the runner can hold a hybrid model's linear-attention layers to
/// (`gdn_kernel`): flash-linear-attention's chunked kernel (its fused recurrent one in decode),
/// its fused recurrent kernel for every token, transformers' own torch functions (chunked in
/// prefill), or its torch recurrent function for every token.
pub const GDN_KERNELS: &[&str] = &["fla", "fla_recurrent", "torch", "torch_recurrent"];

pub use crate::runner::transformers_flags::{TransformersFlags, parse_sweep};

/// Where models go: one GPU, every GPU through accelerate's `device_map="auto"`, or the CPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Device {
    Cuda(Option<u32>),
    Auto,
    Cpu,
}

impl Device {
    pub fn parse(s: &str) -> Option<Device> {
        match s {
            "cuda" => Some(Device::Cuda(None)),
            "auto" => Some(Device::Auto),
            "cpu" => Some(Device::Cpu),
            _ => s
                .strip_prefix("cuda:")
                .and_then(|n| n.parse().ok())
                .map(|n| Device::Cuda(Some(n))),
        }
    }

    pub fn as_request(&self) -> String {
        match self {
            Device::Cuda(None) => "cuda".into(),
            Device::Cuda(Some(n)) => format!("cuda:{n}"),
            Device::Auto => "auto".into(),
            Device::Cpu => "cpu".into(),
        }
    }
}

/// How the runner is started and what it is asked to use.
#[derive(Debug, Clone)]
pub struct TransformersOptions {
    /// The Python interpreter (`--python`, else `CARDPROOF_PYTHON`, else `python3`).
    pub python: PathBuf,
    /// A runner program to use instead of the embedded one (development): anything `python PATH
    /// REQUEST` runs, a package directory with a `__main__.py` (a copy of
    /// runners/transformers_runner) or a single file (a stand-in).
    pub script: Option<PathBuf>,
    pub device: Device,
    /// `bfloat16`, `float16` or `float32`: the dtype the models are loaded and run in.
    pub dtype: String,
    /// Attention implementation of the reference and the candidate (one of
    /// [`ATTENTION_IMPLEMENTATIONS`]).
    pub attention: (String, String),
    /// The Gated DeltaNet kernel of the reference and the candidate (one of [`GDN_KERNELS`];
    /// `None`: transformers' choice).
    pub gdn_kernel: (Option<String>, Option<String>),
    /// Tokens per prefill chunk (0: planned: the whole window when it fits).
    pub chunk_size: usize,
    /// Rows per output-head chunk (0: planned from free memory).
    pub head_rows: usize,
    pub tf32: bool,
    pub deterministic: bool,
    pub trust_remote_code: bool,
    /// Pretend only this much device memory is free (tests of the memory plan).
    pub memory_limit: Option<u64>,
    /// `auto`, `side_by_side` or `sequential`.
    pub mode: String,
    /// Sequential mode: where the reference's hidden states wait for the candidate (`auto`,
    /// `device`, `host`, `disk`).
    pub keep_hidden: String,
    /// Also run the sanity gates on the first window (verify).
    pub gates: bool,
    /// Also write the first window's first rows' logits of both models into this directory
    /// (`reference.logits.safetensors`, `candidate.logits.safetensors`, read by `cardproof kld`):
    /// the device's reduction can then be checked against cardproof's on the same numbers.
    pub dump_rows: Option<(PathBuf, usize)>,
    /// Whether `verify` may take the attention implementation and the dtype from the card's
    /// runtime (neither was given on the command line).
    pub follow_card: (bool, bool),
    /// The reference's and the candidate's KV-cache schemes (`None`: the model dtype), set by
    /// the rerun from its request, not by flags of their own.
    pub kv_cache: (
        Option<crate::runner::native::kv_cache::KvCacheSetting>,
        Option<crate::runner::native::kv_cache::KvCacheSetting>,
    ),
    /// The greedy turns each model generates after its scoring (`--turns`), set by the rerun
    /// from its request.
    pub turns: Option<TurnAsk>,
    /// The dtype the candidate's carried recurrent state is stored in between calls, set by the
    /// rerun from its request (the reference keeps the model's own).
    pub recurrent_state: StateDtype,
}

impl Default for TransformersOptions {
    fn default() -> Self {
        TransformersOptions {
            python: std::env::var_os("CARDPROOF_PYTHON")
                .map_or_else(|| PathBuf::from("python3"), PathBuf::from),
            script: None,
            device: Device::Cuda(None),
            dtype: "bfloat16".into(),
            attention: ("sdpa".into(), "sdpa".into()),
            gdn_kernel: (None, None),
            chunk_size: 0,
            head_rows: 0,
            tf32: false,
            deterministic: false,
            trust_remote_code: false,
            memory_limit: None,
            mode: "auto".into(),
            keep_hidden: "auto".into(),
            gates: false,
            recurrent_state: StateDtype::F32,
            dump_rows: None,
            follow_card: (true, true),
            kv_cache: (None, None),
            turns: None,
        }
    }
}

/// One context length's work: its windows (each exactly `context_length` ids) and scored rows.
pub struct RunWork<'a> {
    pub context_length: usize,
    pub windows: &'a [Vec<u32>],
    /// Per window, the rows scored.
    pub rows: &'a [Vec<usize>],
}

impl RunWork<'_> {
    /// The rows every window shares, if they share them.
    fn shared_rows(&self) -> Option<&[usize]> {
        let first = self.rows.first()?;
        self.rows
            .iter()
            .all(|r| r == first)
            .then_some(first.as_slice())
    }
}

/// What the runner returned.
#[derive(Debug)]
pub struct TransformersOutput {
    /// Per run, per window, one record per scored row (`None` for a non-finite row).
    pub records: Vec<Vec<Vec<Option<RowRecord>>>>,
    /// The runner's record of what it ran.
    pub environment: RunnerEnvironment,
    /// The sanity gates' raw numbers, when asked for.
    pub gates: Option<GateNumbers>,
    /// The reference's and the candidate's generated turns, when asked for.
    pub turns: Option<(TurnSet, TurnSet)>,
}

/// One model's generated turns, checked against the request: the turns, how the runner
/// generated them, and the seconds it took.
#[derive(Debug, Clone)]
pub struct TurnSet {
    pub generated: Vec<Generated>,
    pub engine: TurnEngine,
    pub seconds: f64,
    /// Where the time went (prefill and decode), where the runner program measured it.
    pub timing: Option<GenerationTiming>,
}

impl TurnSet {
    /// `set` checked against what `options` asked (`model` names the model in the error).
    fn of(
        set: Option<RecordTurnSet>,
        options: &TransformersOptions,
        model: &Path,
    ) -> Result<TurnSet> {
        let Some(ask) = &options.turns else {
            return Err(Error::internal(
                model,
                "turns read from a run that asked for none",
            ));
        };
        let Some(set) = set else {
            return Err(Error::runner(
                model,
                "the transformers runner answered no generated turns for this model (an older runner program?)",
            ));
        };
        let (seconds, timing) = (set.seconds, set.timing);
        let (generated, engine) = set.checked(ask).map_err(|e| {
            Error::runner(
                model,
                format!("the transformers runner's generated turns for this model: {e}"),
            )
        })?;
        Ok(TurnSet {
            generated,
            engine,
            seconds,
            timing,
        })
    }
}

/// Progress: (stage, done, total) as the program reports it.
pub type RunnerProgress<'a> = &'a (dyn Fn(&str, Option<(usize, usize)>) + Sync);

/// Run the program on a pair of models.
pub fn run(
    reference: &Path,
    candidate: &Path,
    work: &[RunWork],
    vocab_size: usize,
    options: &TransformersOptions,
    progress: RunnerProgress,
) -> Result<TransformersOutput> {
    let dir = tempfile::Builder::new()
        .prefix("cardproof-transformers-")
        .tempdir()
        .map_err(|e| Error::io(&std::env::temp_dir(), e))?;
    let request = write_request(
        dir.path(),
        reference,
        candidate,
        None,
        work,
        vocab_size,
        options,
    )?;
    let record = invoke(dir.path(), candidate, &request, options, 2, progress)?;
    let records = work
        .iter()
        .enumerate()
        .map(|(i, w)| read_run(candidate, &record.runs, i, w, &request))
        .collect::<Result<Vec<_>>>()?;
    if let Some((keep, _)) = &options.dump_rows {
        keep_exchange(dir.path(), keep, work.len())?;
    }
    let turns = match (&options.turns, record.turns) {
        (None, _) => None,
        (Some(_), t) => {
            let (r, c) = t.map_or((None, None), |t| (Some(t.reference), t.candidate));
            Some((
                TurnSet::of(r, options, reference)?,
                TurnSet::of(c, options, candidate)?,
            ))
        }
    };
    Ok(TransformersOutput {
        records,
        environment: record.environment.unwrap_or_default(),
        gates: record.gates,
        turns,
    })
}

/// A study arm's kernels in the transformers runner: its attention implementation and its Gated
/// DeltaNet kernel (`None`: transformers' choice).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArmKernel {
    pub attention: String,
    pub gdn_kernel: Option<String>,
}

/// One arm of a study in the runner: its checkpoint, attention and KV-cache scheme.
#[derive(Debug, Clone)]
pub struct ArmModel<'a> {
    /// The arm's name (the runner names it in its messages).
    pub name: String,
    pub path: &'a Path,
    pub attention: String,
    pub kv_cache: Option<crate::runner::native::kv_cache::KvCacheSetting>,
    pub recurrent_state: StateDtype,
    /// One of [`GDN_KERNELS`] (`None`: transformers' choice).
    pub gdn_kernel: Option<String>,
}

/// One arm's answer: per run, per window, its rows' records; its model record; its seconds;
/// its generated turns, when asked for.
#[derive(Debug)]
pub struct ArmOutput {
    pub records: Vec<Vec<Vec<Option<RowRecord>>>>,
    pub model: serde_json::Value,
    pub seconds: f64,
    pub turns: Option<TurnSet>,
}

/// A study's answer: each arm's, the program's environment, the reference's generated turns
/// (when asked for). With `failure`, a later arm failed: `arms` are the arms completed (carried
/// ones first), and `carry` holds them for `study --resume`.
#[derive(Debug)]
pub struct ArmsOutput {
    pub arms: Vec<ArmOutput>,
    pub environment: RunnerEnvironment,
    pub reference_turns: Option<TurnSet>,
    pub failure: Option<Error>,
    pub carry: Option<Carry>,
}

/// Run the program on a study: the reference (with `options`' reference attention and KV
/// cache) once per window, each arm against its kept hidden states in turn. `carried`: the
/// first arms, completed by an interrupted run (see [`crate::runner::transformers_carry`]);
/// only the others run, and the carried ones are read as the program's own answers are.
pub fn run_arms(
    reference: &Path,
    arms: &[ArmModel],
    carried: Option<&Carry>,
    work: &[RunWork],
    vocab_size: usize,
    options: &TransformersOptions,
    progress: RunnerProgress,
) -> Result<ArmsOutput> {
    let first = arms
        .first()
        .ok_or_else(|| Error::internal(reference, "a study without arms"))?;
    let done = carried.map_or(0, |c| c.arms.len());
    if done >= arms.len() {
        return Err(Error::internal(
            reference,
            format!("{done} carried arms of a study of {}", arms.len()),
        ));
    }
    let to_run = &arms[done..];
    let dir = tempfile::Builder::new()
        .prefix("cardproof-transformers-")
        .tempdir()
        .map_err(|e| Error::io(&std::env::temp_dir(), e))?;
    let request = write_request(
        dir.path(),
        reference,
        to_run[0].path,
        Some(to_run),
        work,
        vocab_size,
        options,
    )?;
    let results = dir.path().join("results");
    let (record, failure) = match invoke(
        dir.path(),
        to_run[0].path,
        &request,
        options,
        to_run.len() + 1,
        progress,
    ) {
        Ok(record) => (Some(record), None),
        // The arms the program completed before it failed, from its journal (none: only the
        // carried ones, or the failure alone).
        Err(e) => match journal(&results, to_run.len(), options, first.path)? {
            Some(record) => (Some(record), Some(e)),
            None if done > 0 => (None, Some(e)),
            None => return Err(e),
        },
    };
    let answered = record
        .as_ref()
        .map_or_else(Vec::new, |r| r.arms.clone().unwrap_or_default());
    if failure.is_none() && answered.len() != to_run.len() {
        return Err(Error::runner(
            first.path,
            format!(
                "the transformers runner answered {} arms for the {} asked (an older runner program?)",
                answered.len(),
                to_run.len()
            ),
        ));
    }
    let mut entries: Vec<(&ArmModel, RecordArm)> = Vec::with_capacity(arms.len());
    if let Some(c) = carried {
        for (i, (arm, carried)) in arms.iter().zip(&c.arms).enumerate() {
            entries.push((arm, carried.unpack(&results, &format!("carried{i}"))?));
        }
    }
    entries.extend(to_run.iter().zip(answered.iter().cloned()));
    let mut out = Vec::with_capacity(entries.len());
    for (arm, a) in &entries {
        let records = work
            .iter()
            .enumerate()
            .map(|(i, w)| read_run(arm.path, &a.runs, i, w, &request))
            .collect::<Result<Vec<_>>>()?;
        let turns = match options.turns {
            Some(_) => Some(TurnSet::of(a.turns.clone(), options, arm.path)?),
            None => None,
        };
        out.push(ArmOutput {
            records,
            model: a.model.clone(),
            seconds: a.seconds,
            turns,
        });
    }
    let environment = match (&record, carried) {
        (Some(r), _) => r.environment.clone().unwrap_or_default(),
        (None, Some(c)) => c.environment.clone(),
        (None, None) => RunnerEnvironment::default(),
    };
    let reference_turn_set = match (&record, carried) {
        (Some(r), _) => r.turns.as_ref().map(|t| t.reference.clone()),
        (None, Some(c)) => c.reference_turns.clone(),
        (None, None) => None,
    };
    if let Some(c) = carried {
        same_run(
            c,
            &environment,
            reference_turn_set.as_ref(),
            &out,
            done,
            first.path,
        )?;
    }
    let reference_turns = match options.turns {
        Some(_) => Some(TurnSet::of(reference_turn_set.clone(), options, reference)?),
        None => None,
    };
    let carry = match &failure {
        Some(_) => Some(Carry {
            environment: environment.clone(),
            reference_turns: reference_turn_set,
            arms: carried
                .map_or_else(Vec::new, |c| c.arms.clone())
                .into_iter()
                .map(Ok)
                .chain(
                    answered
                        .iter()
                        .map(|a| CarriedArm::from_answer(a, &results, first.path)),
                )
                .collect::<Result<Vec<_>>>()?,
        }),
        None => None,
    };
    Ok(ArmsOutput {
        arms: out,
        environment,
        reference_turns,
        failure,
        carry,
    })
}

/// The program's journal of completed arms (see [`crate::runner::transformers_carry`]), checked
/// as a record is; `None` when it wrote none or completed no arm.
fn journal(
    results: &Path,
    asked: usize,
    options: &TransformersOptions,
    model: &Path,
) -> Result<Option<RunnerRecord>> {
    let path = results.join(crate::runner::transformers_carry::JOURNAL);
    let Some(bytes) = crate::files::read_capped_if_present(
        &path,
        record_cap(options, asked + 1),
        "a transformers runner journal",
    )?
    else {
        return Ok(None);
    };
    let record: RunnerRecord = serde_json::from_slice(&bytes)
        .map_err(|e| Error::runner(model, format!("the transformers runner's journal: {e}")))?;
    let arms = record.arms.as_ref().map_or(0, Vec::len);
    if record.protocol != PROTOCOL || !record.ok || arms >= asked {
        return Err(Error::runner(
            model,
            format!(
                "the transformers runner's journal (protocol {}, ok {}, {arms} arms of {asked}) is not a journal of completed arms",
                record.protocol, record.ok
            ),
        ));
    }
    Ok((arms > 0).then_some(record))
}

/// A resumed study's run is the interrupted run's: the same environment, the reference's side of
/// every row bit for bit (compared with the first arm this run measured) and the same
/// reference's turns. Else the carried arms were measured against another reference.
fn same_run(
    carry: &Carry,
    environment: &RunnerEnvironment,
    reference_turns: Option<&RecordTurnSet>,
    out: &[ArmOutput],
    done: usize,
    model: &Path,
) -> Result<()> {
    use crate::runner::transformers_carry::{same_environment, same_reference_rows};
    let refuse = |why: String| {
        Err(Error::runner(
            model,
            format!(
                "cannot resume the study: {why}; the arms carried from the interrupted run would not be comparable with this run's (run the study again without --resume)"
            ),
        ))
    };
    if let Some(why) = same_environment(&carry.environment, environment) {
        return refuse(why);
    }
    let json =
        |t: Option<&RecordTurnSet>| t.map(|t| serde_json::to_value(&t.turns).unwrap_or_default());
    if json(carry.reference_turns.as_ref()) != json(reference_turns) {
        return refuse("the reference generated other turns than in the interrupted run".into());
    }
    if let Some(new) = out.get(done) {
        for (i, carried) in out[..done].iter().enumerate() {
            if let Some(why) = same_reference_rows(&carried.records, &new.records) {
                return refuse(format!(
                    "the reference's pass did not reproduce the interrupted run's bit for bit (carried arm {}: {why})",
                    i + 1
                ));
            }
        }
    }
    Ok(())
}

/// Write the token files and the request; returns the request's path.
fn write_request(
    dir: &Path,
    reference: &Path,
    candidate: &Path,
    arms: Option<&[ArmModel]>,
    work: &[RunWork],
    vocab_size: usize,
    o: &TransformersOptions,
) -> Result<PathBuf> {
    let absolute = |p: &Path| std::path::absolute(p).unwrap_or_else(|_| p.to_owned());
    let mut runs = Vec::new();
    for (i, w) in work.iter().enumerate() {
        let path = dir.join(format!("tokens{i}.u32"));
        let mut bytes = Vec::with_capacity(w.windows.len() * w.context_length * 4);
        for window in w.windows {
            debug_assert_eq!(window.len(), w.context_length);
            for id in window {
                bytes.extend_from_slice(&id.to_le_bytes());
            }
        }
        std::fs::write(&path, bytes).map_err(|e| Error::io(&path, e))?;
        runs.push(RequestRun {
            context_length: w.context_length,
            tokens_file: path.display().to_string(),
            n_windows: w.windows.len(),
            rows: w.shared_rows().map(<[usize]>::to_vec).unwrap_or_default(),
            window_rows: w.shared_rows().is_none().then(|| w.rows.to_vec()),
        });
    }
    let model = |p: &Path,
                 (attention, gdn): (&str, &Option<String>),
                 kv: Option<crate::runner::native::kv_cache::KvCacheSetting>,
                 state: StateDtype| {
        RequestModel {
            name: None,
            path: absolute(p).display().to_string(),
            attn_implementation: attention.to_owned(),
            gdn_kernel: gdn.clone(),
            recurrent_state: (state != StateDtype::F32).then(|| state.as_str().to_owned()),
            kv_cache: kv.filter(|s| s.changes_anything()).map(|s| {
                crate::runner::exchange::RequestKvCache {
                    k: s.k.as_str().to_owned(),
                    v: s.v.as_str().to_owned(),
                    rotation: s.hadamard.then(|| "hadamard".to_owned()),
                    scales: s.computed_scales.then(|| "computed".to_owned()),
                    semantics: s.residual.map(|_| "quantized_cache_residual".to_owned()),
                    residual_length: s.residual.map(|w| w.length),
                    prefill_chunk: s.residual.map(|w| w.chunk),
                }
            }),
        }
    };
    let turns = match &o.turns {
        Some(ask) => Some(write_turns(dir, ask)?),
        None => None,
    };
    let request = RunnerRequest {
        protocol: PROTOCOL,
        models: RequestModels {
            reference: model(
                reference,
                (&o.attention.0, &o.gdn_kernel.0),
                o.kv_cache.0,
                StateDtype::F32,
            ),
            candidate: model(
                candidate,
                (&o.attention.1, &o.gdn_kernel.1),
                o.kv_cache.1,
                o.recurrent_state,
            ),
            arms: arms.map(|arms| {
                arms.iter()
                    .map(|a| RequestModel {
                        name: Some(a.name.clone()),
                        ..model(
                            a.path,
                            (&a.attention, &a.gdn_kernel),
                            a.kv_cache,
                            a.recurrent_state,
                        )
                    })
                    .collect()
            }),
        },
        dtype: o.dtype.clone(),
        device: o.device.as_request(),
        chunk_size: o.chunk_size,
        head_rows: o.head_rows,
        tf32: o.tf32,
        deterministic: o.deterministic,
        trust_remote_code: o.trust_remote_code,
        memory_limit_bytes: o.memory_limit,
        mode: o.mode.clone(),
        keep_hidden: o.keep_hidden.clone(),
        gates: o.gates,
        dump: o.dump_rows.as_ref().map(|(dir, rows)| RequestDump {
            dir: absolute(dir).display().to_string(),
            rows: *rows,
        }),
        vocab_size,
        runs,
        result_dir: dir.join("results").display().to_string(),
        record_path: dir.join("record.json").display().to_string(),
        turns,
    };
    let path = dir.join("request.json");
    let text = serde_json::to_vec_pretty(&request).unwrap_or_default();
    std::fs::write(&path, text).map_err(|e| Error::io(&path, e))?;
    Ok(path)
}

/// The turns' prompts written one after another into `dir/turns.u32`; the request's `turns`.
fn write_turns(dir: &Path, ask: &TurnAsk) -> Result<RequestTurns> {
    let path = dir.join("turns.u32");
    let bytes: Vec<u8> = ask
        .prompts
        .iter()
        .flatten()
        .flat_map(|id| id.to_le_bytes())
        .collect();
    std::fs::write(&path, bytes).map_err(|e| Error::io(&path, e))?;
    Ok(RequestTurns {
        tokens_file: std::path::absolute(&path)
            .unwrap_or(path)
            .display()
            .to_string(),
        prompt_lengths: ask.prompts.iter().map(Vec::len).collect(),
        stops: ask.stops.clone(),
        max_new_tokens: ask.max_new_tokens,
        used: ask.used,
    })
}

/// The largest record.json read: the environment and the runs' list are a few kilobytes; the
/// generated turns of `models` models add at most `max_new_tokens` ids per prompt each, every
/// id on a line of its own in the program's indented JSON (32 bytes allowed per id).
fn record_cap(o: &TransformersOptions, models: usize) -> u64 {
    const BASE: u64 = 64 << 20;
    let turns = o.turns.as_ref().map_or(0, |t| {
        (t.prompts.len() as u64)
            .saturating_mul(t.max_new_tokens as u64)
            .saturating_mul(models as u64)
            .saturating_mul(32)
    });
    BASE.saturating_add(turns)
}

/// Runs `python script request` (`script`: a file, or a package directory) under
/// [`crate::runner::child`], relaying its progress lines; returns its exit status and its last
/// [`TAIL_LINES`] other lines. Both pipes are drained on threads (transformers may print on stdout)
/// while this thread waits for the program: when it exits its group is killed, so a process it left
/// holding the pipes cannot keep the reads from ending; an hour without output stops it.
fn run_program(
    python: &Path,
    script: &Path,
    request: &Path,
    candidate: &Path,
    progress: RunnerProgress,
) -> Result<(std::process::ExitStatus, Vec<String>)> {
    use crate::runner::child::{self, Progressing};
    let stall = child::timeout_from_env(STALL_TIMEOUT_VAR, STALL_TIMEOUT)?;
    let mut command = Command::new(python);
    command
        .arg(script)
        .arg(request)
        .env("PYTHONUNBUFFERED", "1");
    let watch = child::Watch::new();
    let mut process = watch
        .spawn("the transformers runner", command, child::Output::Piped)
        .map_err(|e| {
            Error::runner(candidate, format!(
                "cannot start the transformers runner with {}: {e} (pass --python PATH or set CARDPROOF_PYTHON)",
                python.display()
            ))
        })?;
    let tail = std::sync::Mutex::new(std::collections::VecDeque::new());
    let push = |line: String| {
        if let Ok(mut t) = tail.lock() {
            if t.len() == TAIL_LINES {
                t.pop_front();
            }
            t.push_back(line);
        }
    };
    let stdout = process.take_stdout().map(|s| Progressing::new(s, &watch));
    let stderr = process.take_stderr().map(|s| Progressing::new(s, &watch));
    let stalled = watch
        .stall_timeout(stall, format!(
            "the transformers runner printed nothing for {}: stopped as stalled (a checkpoint slower than that to load, or to run one window, needs a longer {STALL_TIMEOUT_VAR})",
            child::seconds(stall)
        ))
        .map_err(|e| Error::runner(candidate, format!("cannot watch the transformers runner: {e}")))?;
    let status = std::thread::scope(|scope| {
        if let Some(out) = stdout {
            scope.spawn(|| child::read_lines_capped(out, MAX_LINE_BYTES, push));
        }
        if let Some(err) = stderr {
            scope.spawn(|| {
                child::read_lines_capped(err, MAX_LINE_BYTES, |line| {
                    match serde_json::from_str::<Value>(&line) {
                        Ok(v) if v.get("cardproof_progress").is_some() => {
                            let stage = v["cardproof_progress"].as_str().unwrap_or("");
                            let counts = v["done"]
                                .as_u64()
                                .zip(v["total"].as_u64())
                                .map(|(d, t)| (d as usize, t as usize));
                            progress(stage, counts);
                        }
                        _ => push(line),
                    }
                });
            });
        }
        watch.wait(&mut process, None)
    });
    drop(stalled);
    let tail: Vec<String> = tail.into_inner().unwrap_or_default().into_iter().collect();
    match status {
        Ok(status) => Ok((status, tail)),
        Err(why) if tail.is_empty() => Err(Error::runner(candidate, why)),
        Err(why) => Err(Error::runner(
            candidate,
            format!("{why}; its last output lines:\n  {}", tail.join("\n  ")),
        )),
    }
}

/// Start the program, relay its progress, and read its record.
fn invoke(
    dir: &Path,
    candidate: &Path,
    request: &Path,
    o: &TransformersOptions,
    models: usize,
    progress: RunnerProgress,
) -> Result<RunnerRecord> {
    let script = match &o.script {
        Some(s) => s.clone(),
        None => write_runner(dir)?,
    };
    let (status, tail) = run_program(&o.python, &script, request, candidate, progress)?;
    let shown_tail = || {
        if tail.is_empty() {
            String::from("(it printed nothing)")
        } else {
            format!("its last output lines:\n  {}", tail.join("\n  "))
        }
    };
    let record_path = dir.join("record.json");
    let bytes = crate::files::read_capped_if_present(
        &record_path,
        record_cap(o, models),
        "a transformers runner record",
    )
    .map_err(|e| Error::runner(candidate, format!("the transformers runner's record: {e}")))?;
    let record: Option<Value> = bytes.and_then(|b| serde_json::from_slice(&b).ok());
    let Some(record) = record else {
        return Err(Error::runner(
            candidate,
            format!(
                "the transformers runner {} without writing its record; {}",
                describe(status),
                shown_tail()
            ),
        ));
    };
    if record["protocol"].as_u64() != Some(PROTOCOL) {
        return Err(Error::runner(
            candidate,
            format!(
                "the transformers runner answered in protocol {}, cardproof speaks {PROTOCOL}",
                record["protocol"]
            ),
        ));
    }
    let record: RunnerRecord = serde_path_to_error::deserialize(&record).map_err(|e| {
        Error::runner(
            candidate,
            format!(
                "the transformers runner's record breaks its schema at {}: {}",
                e.path(),
                e.inner()
            ),
        )
    })?;
    if !record.ok {
        let (kind, message, traceback) = match &record.error {
            Some(e) => (e.kind.as_str(), e.message.as_str(), e.traceback.as_deref()),
            None => ("unknown", "(no message)", None),
        };
        let detail = if kind == "internal" {
            format!("\n{}", traceback.unwrap_or(""))
        } else {
            String::new()
        };
        return Err(Error::runner(
            candidate,
            format!("the transformers runner failed ({kind}): {message}{detail}"),
        ));
    }
    if !status.success() {
        return Err(Error::runner(
            candidate,
            format!(
                "the transformers runner wrote a record but {}; {}",
                describe(status),
                shown_tail()
            ),
        ));
    }
    Ok(record)
}

/// Write the embedded package into `dir`; returns the package's directory, the path to start.
fn write_runner(dir: &Path) -> Result<PathBuf> {
    for (name, source) in RUNNER_FILES {
        let path = dir.join(name);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).map_err(|e| Error::io(parent, e))?;
        }
        std::fs::write(&path, source).map_err(|e| Error::io(&path, e))?;
    }
    Ok(dir.join(RUNNER_PACKAGE))
}

/// Copy the request, the record and the result files next to the logit dump: a recorded
/// exchange, replayed by tests without a GPU.
fn keep_exchange(dir: &Path, keep: &Path, runs: usize) -> Result<()> {
    std::fs::create_dir_all(keep).map_err(|e| Error::io(keep, e))?;
    let mut names = vec!["request.json".to_owned(), "record.json".to_owned()];
    names.extend((0..runs).map(|i| format!("results/run{i}.safetensors")));
    names.extend((0..runs).map(|i| format!("tokens{i}.u32")));
    for name in names {
        let from = dir.join(&name);
        let to = keep.join(name.trim_start_matches("results/"));
        std::fs::copy(&from, &to).map_err(|e| Error::io(&to, e))?;
    }
    Ok(())
}

fn describe(status: std::process::ExitStatus) -> String {
    #[cfg(unix)]
    {
        use std::os::unix::process::ExitStatusExt;
        if let Some(sig) = status.signal() {
            return format!("was killed by signal {sig}");
        }
    }
    match status.code() {
        Some(c) => format!("exited with status {c}"),
        None => "ended abnormally".into(),
    }
}

/// Read run `i`'s result file and check it holds exactly the rows asked for.
fn read_run(
    candidate: &Path,
    runs: &[crate::runner::exchange::RecordRun],
    i: usize,
    work: &RunWork,
    request: &Path,
) -> Result<Vec<Vec<Option<RowRecord>>>> {
    let path = match runs.get(i).and_then(|r| r.path.as_deref()) {
        Some(p) => PathBuf::from(p),
        None => {
            return Err(Error::runner(
                candidate,
                format!(
                    "the transformers runner's record lists no result for run {i} (context length {})",
                    work.context_length
                ),
            ));
        }
    };
    let expected_dir = request.parent().map(|d| d.join("results"));
    if expected_dir.as_deref() != path.parent() {
        return Err(Error::runner(
            candidate,
            format!(
                "the transformers runner put run {i}'s result at {}, outside its result directory",
                path.display()
            ),
        ));
    }
    read_records(&path, work)
}

/// Per-window records from one result file (also used on recorded fixtures).
pub fn read_records(path: &Path, work: &RunWork) -> Result<Vec<Vec<Option<RowRecord>>>> {
    let file = safetensors::read_file(path)?;
    let n: usize = work.rows.iter().map(Vec::len).sum();
    let f64s = |name: &str| column(&file, name, n, Dtype::F64);
    let i32s = |name: &str| column(&file, name, n, Dtype::I32);
    let forward = f64s("forward")?;
    let reverse = f64s("reverse")?;
    let ref_prob = f64s("ref_top1_prob")?;
    let nll_ref = f64s("nll_ref")?;
    let nll_cand = f64s("nll_cand")?;
    let ref_top1 = i32s("ref_top1")?;
    let cand_top1 = i32s("cand_top1")?;
    let window = i32s("window")?;
    let position = column(&file, "position", n, Dtype::I64)?;
    let finite = column(&file, "finite", n, Dtype::U8)?;
    let bad = |row: usize, what: String| Error::runner(path, format!("row {row}: {what}"));
    let mut out = Vec::with_capacity(work.windows.len());
    // Rows in order: window by window, each window's rows in order.
    let mut next = 0usize;
    for w in 0..work.windows.len() {
        let mut records = Vec::with_capacity(work.rows[w].len());
        for &j in &work.rows[w] {
            let r = next;
            next += 1;
            if window[r] as usize != w || position[r] as usize != j {
                return Err(bad(
                    r,
                    format!(
                        "is window {} position {}, the request's is window {w} position {j}",
                        window[r], position[r]
                    ),
                ));
            }
            if finite[r] == 0.0 {
                records.push(None);
                continue;
            }
            let (f, rv) = (forward[r], reverse[r]);
            if f.is_nan() || rv.is_nan() || f < 0.0 || rv < 0.0 {
                return Err(bad(
                    r,
                    format!("KL {f} forward, {rv} reverse: not a divergence"),
                ));
            }
            let top = |v: f64| u32::try_from(v as i64).ok();
            let (Some(rt), Some(ct)) = (top(ref_top1[r]), top(cand_top1[r])) else {
                return Err(bad(r, "negative top-1 token id".into()));
            };
            // NaN where the true next token is unknown (beyond the used vocabulary).
            let nll = |v: f64| v.is_finite().then_some(v);
            records.push(Some(RowRecord {
                forward: f,
                reverse: rv,
                ref_top1: rt,
                cand_top1: ct,
                ref_top1_prob: ref_prob[r],
                nll_ref: nll(nll_ref[r]),
                nll_cand: nll(nll_cand[r]),
            }));
        }
        out.push(records);
    }
    Ok(out)
}

/// One column of `n` values as f64 (exact for every dtype used here).
fn column(file: &SafetensorsFile, name: &str, n: usize, dtype: Dtype) -> Result<Vec<f64>> {
    let path = file.path.as_path();
    let Some(t) = file.get(name) else {
        return Err(Error::runner(
            path,
            format!("{name}: missing from the runner's result"),
        ));
    };
    if t.dtype != dtype || t.shape != [n as u64] {
        return Err(Error::runner(
            path,
            format!(
                "{name}: is {} {:?}, expected {dtype} [{n}] (the rows the request asked for)",
                t.dtype, t.shape
            ),
        ));
    }
    let bytes = safetensors::read_tensor_bytes(file, name, 8 * n as u64 + 8)?;
    Ok(match dtype {
        Dtype::F64 => bytes
            .chunks_exact(8)
            .map(|c| f64::from_le_bytes(c.try_into().unwrap_or([0; 8])))
            .collect(),
        Dtype::I64 => bytes
            .chunks_exact(8)
            .map(|c| i64::from_le_bytes(c.try_into().unwrap_or([0; 8])) as f64)
            .collect(),
        Dtype::I32 => bytes
            .chunks_exact(4)
            .map(|c| f64::from(i32::from_le_bytes(c.try_into().unwrap_or([0; 4]))))
            .collect(),
        _ => bytes.iter().map(|&b| f64::from(b)).collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The embedded package is the package in the tree: every `.py` file of
    /// runners/transformers_runner/, none missing and none extra.
    #[test]
    fn the_embedded_runner_is_every_file_of_its_package() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("runners");
        let mut on_disk: Vec<(String, String)> = std::fs::read_dir(root.join(RUNNER_PACKAGE))
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|x| x == "py"))
            .map(|p| {
                let name = format!(
                    "{RUNNER_PACKAGE}/{}",
                    p.file_name().unwrap().to_string_lossy()
                );
                (name, std::fs::read_to_string(&p).unwrap())
            })
            .collect();
        on_disk.sort();
        let embedded: Vec<(String, String)> = RUNNER_FILES
            .iter()
            .map(|(n, s)| ((*n).to_owned(), (*s).to_owned()))
            .collect();
        assert_eq!(
            embedded.iter().map(|(n, _)| n).collect::<Vec<_>>(),
            on_disk.iter().map(|(n, _)| n).collect::<Vec<_>>()
        );
        assert!(
            embedded == on_disk,
            "an embedded file differs from the tree's"
        );
    }

    #[test]
    fn the_embedded_runner_is_written_as_a_package() {
        let dir = tempfile::tempdir().unwrap();
        let start = write_runner(dir.path()).unwrap();
        assert_eq!(start, dir.path().join(RUNNER_PACKAGE));
        assert!(start.join("__main__.py").is_file());
        for (name, source) in RUNNER_FILES {
            assert_eq!(
                std::fs::read_to_string(dir.path().join(name)).unwrap(),
                *source
            );
        }
    }
}
