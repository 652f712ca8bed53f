//! The study file (YAML; `schema/study-file-v1.schema.json`): one reference, one eval text, one
//! protocol, and arms that each change one declared variable against the baseline.
//!
//! ```yaml
//! study: cardproof/study-v1
//! reference: ../models/shakespeare-bf16          # paths are relative to the study file
//! eval: {text: ../data/eval.txt}                 # or a conversation .json with chat_template
//! protocol: {context_lengths: [256], positions: {policy: all}}
//! arms:
//!   - {name: w8a16, candidate: ../models/shakespeare-w8a16, changes: weights}
//!   - {name: kv-q8_0, kv_cache: q8_0, changes: kv_cache}
//! ```
//!
//! The baseline is the reference itself with the study's settings; an arm without `candidate`
//! runs the reference's weights. Every arm's settings are compared with the baseline's, and an
//! arm that changes another variable than the one it names, or more than one, is refused unless
//! it says `mixed: true` (and is then marked in every output).

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::kld::protocol::{Bos, Direction};

/// The study file's `study:` value.
pub const STUDY_ID: &str = "cardproof/study-v1";

/// The most arms a study may have: each is a model loaded and a pass over the text.
pub const MAX_ARMS: usize = 64;

/// A study file as written.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(title = "cardproof study file v1")]
pub struct StudyFile {
    /// Always `cardproof/study-v1`.
    pub study: String,
    /// A name for the study's outputs (default: the file's name).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// The reference model (a path relative to the study file).
    pub reference: String,
    pub eval: StudyEval,
    pub protocol: StudyProtocol,
    /// `native` (the default: pure Rust on CPU), `transformers` (the user's GPU) or `llamacpp`
    /// (the user's `llama-perplexity`, GGUF models, llama.cpp's protocol).
    #[serde(default)]
    pub runner: StudyRunner,
    /// The transformers runner's settings (`runner: transformers`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub transformers: Option<TransformersSettings>,
    /// The llama.cpp runner's settings (`runner: llamacpp`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub llamacpp: Option<LlamacppStudySettings>,
    /// The baseline's settings (default: the runner's defaults); every arm starts from them.
    #[serde(default)]
    pub baseline: Settings,
    pub arms: Vec<Arm>,
    /// The controls every study runs unless told not to.
    #[serde(default)]
    pub controls: Controls,
}

#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum StudyRunner {
    #[default]
    Native,
    Transformers,
    Llamacpp,
}

impl StudyRunner {
    pub fn as_str(self) -> &'static str {
        match self {
            StudyRunner::Native => "native",
            StudyRunner::Transformers => "transformers",
            StudyRunner::Llamacpp => "llamacpp",
        }
    }

    /// The `--runner` spelling.
    pub fn from_name(name: &str) -> Option<StudyRunner> {
        [
            StudyRunner::Native,
            StudyRunner::Transformers,
            StudyRunner::Llamacpp,
        ]
        .into_iter()
        .find(|r| r.as_str() == name)
    }
}

/// The eval text, and for a conversation file how it is rendered.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct StudyEval {
    /// A text file, or a conversation file (`.json`/`.jsonl`), relative to the study file.
    pub text: String,
    /// A chat template file for a conversation, the eval text or `protocol.turns.conversation`
    /// (default: the reference's own).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chat_template: Option<String>,
    /// `reference` or `candidate`'s template instead of a file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chat_template_from: Option<crate::conversation::eval::TemplateFrom>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chat_template_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chat_template_clock: Option<i64>,
    /// BOS policy (default `none`).
    #[serde(default = "no_bos")]
    pub bos: Bos,
}

fn no_bos() -> Bos {
    Bos::None
}

/// How the transformers runner runs (`runner: transformers`); absent fields are the runner's
/// defaults, as `measure --runner transformers` has them. The Python interpreter is never the
/// file's: `study --python`, else `CARDPROOF_PYTHON`, else `python3`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TransformersSettings {
    /// `cuda` (the default), `cuda:N`, `auto` or `cpu`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device: Option<String>,
    /// `bfloat16` (the default), `float16` or `float32`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub torch_dtype: Option<String>,
    /// Tokens per prefill chunk (default: planned).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chunk_size: Option<u32>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub tf32: bool,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub deterministic: bool,
    /// Where the reference's hidden states wait for the arms: `auto`, `device`, `host`, `disk`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keep_hidden: Option<String>,
}

/// How the llama.cpp runner runs (`runner: llamacpp`): the `llama-perplexity` flags every arm
/// shares. An arm's `attention` is its `-fa` (`on`, `off`, `auto`) and its `kv_cache` its
/// `-ctk/-ctv`; the reference runs the baseline's. The binary is never the file's:
/// `study --llamacpp-bin`, else `CARDPROOF_LLAMACPP_BIN`, else `llama-perplexity` on `PATH`;
/// nor is the `llama-server` that generates `protocol.turns`: `study --llamacpp-server`, else
/// the one beside `llama-perplexity`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LlamacppStudySettings {
    /// `-t`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub threads: Option<u32>,
    /// `-b`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub batch: Option<u32>,
    /// `-ub`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ubatch: Option<u32>,
    /// `-ngl` (a number of layers, `auto` or `all`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_layers: Option<String>,
    /// `-dev` (`none`: llama.cpp's CPU backend alone).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device: Option<String>,
    /// Skip llama.cpp's own KLD pass beside each arm (the printout gate); each arm is then
    /// marked as not gated.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub no_gate: bool,
}

/// What every arm is scored under.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct StudyProtocol {
    #[schemars(length(min = 1))]
    pub context_lengths: Vec<u64>,
    /// The card's positions block (`{policy: all}`, `{policy: stride, stride: 32, offset: 31}`,
    /// `{policy: span, span: tool_call}`, ...); default all.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub positions: Option<crate::disclosure::Positions>,
    /// KL direction (default `both`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub direction: Option<Direction>,
    /// Bootstrap resamples (default 1000) and seed (default 0) for every interval.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resamples: Option<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seed: Option<u64>,
    /// Also generate the conversation's assistant turns with the reference and every arm
    /// (greedy, teacher-forced history) and judge their tool calls:
    /// `{select: tool_calls, max_new_tokens: 64}` (`select`: `all` or `tool_calls`;
    /// `max_new_tokens` default 512; `conversation`: the conversation file, required with
    /// `runner: llamacpp`). Every runner.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub turns: Option<StudyTurns>,
    /// Prefill each window in chunks of this many tokens, the KV cache and recurrent state
    /// carried (the state stored in the arm's `recurrent_state`) between them, as an engine's
    /// chunked prefill (the seed study's engine used 2,048). Default: each window in one pass.
    /// Native and transformers runners.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = crate::kld::protocol::MAX_CONTEXT_LENGTH))]
    pub prefill_chunk: Option<u32>,
}

/// Which turns a study generates, how long each may be, and from which conversation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct StudyTurns {
    pub select: crate::conversation::turns::TurnSelection,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = crate::runner::native::generate::MAX_NEW_TOKENS))]
    pub max_new_tokens: Option<usize>,
    /// The conversation file (`.json` or `.jsonl`, relative to the study file and inside its
    /// directory) whose assistant turns are generated, as `measure --turns-conversation` takes
    /// it. Required with `runner: llamacpp`, whose eval text is the plain text
    /// `llama-perplexity` scores; elsewhere absent means the eval text, which must then be a
    /// conversation. `study --turns-conversation FILE` names one anywhere instead.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conversation: Option<String>,
}

/// The settings an arm can change. Absent: the baseline's.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Settings {
    /// The candidate's KV-cache scheme (`q8_0`, `k:q8_0/v:q4_0+hadamard`, `fp8_e4m3`, ...;
    /// `none`: the model dtype).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kv_cache: Option<String>,
    /// The native runner's compute dtype (`f32`, `f64`, `bf16`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compute_dtype: Option<String>,
    /// The attention kernel (transformers' `attn_implementation`: `sdpa`, `eager`, ...; the
    /// llama.cpp runner's `-fa`: `on`, `off`, `auto`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attention: Option<String>,
    /// The transformers runner's Gated DeltaNet kernel: `fla` (flash-linear-attention's chunked
    /// kernel), `fla_recurrent` (its fused recurrent kernel for every token), `torch`
    /// (transformers' own functions) or `torch_recurrent` (its recurrent function for every
    /// token); default: transformers' choice. A kernel axis
    /// (`changes: kernel`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gdn_kernel: Option<String>,
    /// The candidate's recurrent-state dtype (`f32`, `bf16`, `f16`; hybrid models).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recurrent_state: Option<String>,
    /// The native runner's emulation (`reference-semantics`, `llamacpp-cpu`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub emulate: Option<String>,
}

/// What an arm changes against the baseline.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, schemars::JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum Variable {
    /// Another checkpoint (a quantization of the reference).
    Weights,
    KvCache,
    /// The attention kernel, or for the native runner the compute dtype.
    Kernel,
    RecurrentState,
    Emulation,
    /// Nothing: the baseline again (a repeatability control).
    None,
}

impl Variable {
    pub fn as_str(self) -> &'static str {
        match self {
            Variable::Weights => "weights",
            Variable::KvCache => "kv_cache",
            Variable::Kernel => "kernel",
            Variable::RecurrentState => "recurrent_state",
            Variable::Emulation => "emulation",
            Variable::None => "none",
        }
    }
}

/// One arm.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Arm {
    /// A short name (letters, digits, `.`, `_`, `-`): the arm's output directory.
    pub name: String,
    /// The candidate checkpoint (relative to the study file); absent: the reference's weights.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub candidate: Option<String>,
    /// The one variable this arm changes against the baseline.
    pub changes: Variable,
    /// Allow changing more than `changes` says (the arm is then marked `mixed`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub mixed: bool,
    #[serde(flatten)]
    pub settings: Settings,
}

/// The controls: the baseline measured against itself (repeatability: 0 in a deterministic
/// lane) and the reference's weights with another kernel (the lane's noise floor).
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Controls {
    #[serde(default = "yes")]
    pub repeatability: bool,
    #[serde(default = "yes")]
    pub noise_floor: bool,
}

impl Default for Controls {
    fn default() -> Self {
        Controls {
            repeatability: true,
            noise_floor: true,
        }
    }
}

fn yes() -> bool {
    true
}

/// What the command line puts over a study file: the runner, and the transformers runner's
/// device and dtype. Recorded as what ran (study.json's `runner`, each arm's environment).
/// The programs that run and the files outside the study file's directory come from here
/// only: a study file is data.
#[derive(Debug, Clone, Default)]
pub struct Overrides {
    pub runner: Option<StudyRunner>,
    pub device: Option<String>,
    pub torch_dtype: Option<String>,
    /// `--llamacpp-bin` (an absolute path: the binary resolves it against the working
    /// directory).
    pub llamacpp_bin: Option<PathBuf>,
    /// `--python`.
    pub python: Option<PathBuf>,
    /// `--memory-limit` (hidden; tests of the transformers runner's memory plan).
    pub memory_limit: Option<u64>,
    /// `--eval-text`: the eval text instead of the file's `eval.text`, wherever it is.
    pub eval_text: Option<PathBuf>,
    /// `--chat-template`: the chat template file instead of the file's `eval.chat_template`.
    pub chat_template: Option<PathBuf>,
    /// `--turns-conversation`: the conversation file the turns come from instead of the file's
    /// `protocol.turns.conversation`, wherever it is.
    pub turns_conversation: Option<PathBuf>,
    /// `--llamacpp-server` (an absolute path, as `--llamacpp-bin`): the `llama-server` that
    /// generates a llama.cpp study's turns instead of the one beside `llama-perplexity`.
    pub llamacpp_server: Option<PathBuf>,
}

/// The environment variable naming `llama-perplexity` when `--llamacpp-bin` does not.
pub const LLAMACPP_BIN_ENV: &str = "CARDPROOF_LLAMACPP_BIN";

/// The study file and where it is (paths in it are relative to its directory).
#[derive(Debug, Clone)]
pub struct Study {
    pub path: PathBuf,
    pub file: StudyFile,
    /// SHA-256 of the file's bytes.
    pub sha256: String,
    /// Where each node of the file starts (JSON pointer to line and column), so that every
    /// error about a field, found when reading or when planning, names its line.
    places: std::collections::BTreeMap<String, crate::span::LineCol>,
    /// What the command line gave ([`Study::apply`]).
    pub given: Overrides,
}

/// The most bytes a study file may hold.
pub const MAX_STUDY_BYTES: u64 = 1 << 20;

impl Study {
    /// Reads and checks a study file: YAML 1.2 under the card's budgets, the schema's types
    /// (an error names the field and its line), the arms' names, and the ranges of every
    /// number that sizes something.
    pub fn read(path: &Path) -> Result<Study> {
        let bytes = crate::files::read_capped(path, MAX_STUDY_BYTES, "a study file")?;
        let sha256 = crate::digest::hex(&<sha2::Sha256 as sha2::Digest>::digest(&bytes));
        let text = std::str::from_utf8(&bytes)
            .map_err(|_| Error::format(path, None, "a study file must be UTF-8"))?;
        let node = crate::card::yaml::parse(text, 0, crate::card::yaml::Budget::default())
            .map_err(|e| {
                use crate::card::yaml::YamlError;
                let (offset, why) = match e {
                    YamlError::Syntax { offset, message } => (offset, message),
                    YamlError::DuplicateKey { offset, key, .. } => {
                        (offset, format!("the key `{key}` is given twice"))
                    }
                    YamlError::Budget {
                        offset,
                        what,
                        limit,
                    } => (offset, format!("more than {limit} {what}")),
                    YamlError::Unsupported { offset, message } => (offset, message),
                };
                let (line, column) = line_column(text, offset);
                let mut err = Error::format(path, None, format!("not a YAML study file: {why}"));
                err.at = Some(crate::span::LineCol { line, column });
                err
            })?
            .ok_or_else(|| Error::format(path, None, "is empty"))?;
        let value = node.to_json();
        let mut places = std::collections::BTreeMap::new();
        node.walk(&mut |pointer, key, node| {
            let start = key.map_or(node.span.start, |k| k.start);
            let (line, column) = line_column(text, start);
            places
                .entry(pointer.to_owned())
                .or_insert(crate::span::LineCol { line, column });
        });
        let error = |field: &str, rule: String| field_error(path, &places, field, rule);
        // The version first: a file for another cardproof says so, not what it lacks.
        match value.get("study").and_then(serde_json::Value::as_str) {
            Some(STUDY_ID) => {}
            Some(other) => {
                return Err(error(
                    "study",
                    format!("is `{other}`; this cardproof reads `{STUDY_ID}`"),
                ));
            }
            None => {
                return Err(error(
                    "study",
                    format!("is missing: a study file starts with `study: {STUDY_ID}`"),
                ));
            }
        }
        // A file that is data never chooses the program that runs.
        for (field, instead) in [
            (
                "llamacpp.binary",
                "--llamacpp-bin PATH or CARDPROOF_LLAMACPP_BIN",
            ),
            ("llamacpp.server", "--llamacpp-server PATH"),
            ("transformers.python", "--python PATH or CARDPROOF_PYTHON"),
        ] {
            if value.pointer(&pointer_of(field)).is_some() {
                return Err(error(
                    field,
                    format!(
                        "a study file does not choose the program that runs (it is data, and a study file from someone else would run their program); remove it and name the program with {instead}"
                    ),
                ));
            }
        }
        let file = serde_path_to_error::deserialize(&value).map_err(|e| {
            let field = match e.path().to_string() {
                p if p == "." => "(top level)".to_owned(),
                p => p,
            };
            error(&field, e.into_inner().to_string())
        })?;
        let study = Study {
            path: path.to_owned(),
            file,
            sha256,
            places,
            given: Overrides::default(),
        };
        study.check()?;
        Ok(study)
    }

    /// An error about `field` (`arms[0].changes`) of the file, placed at its line: the field's,
    /// else its nearest enclosing one's (a missing field is placed at its parent).
    pub fn error(&self, field: &str, rule: impl Into<String>) -> Error {
        field_error(&self.path, &self.places, field, rule)
    }

    fn check(&self) -> Result<()> {
        let f = &self.file;
        let bad = |field: &str, rule: String| self.error(field, rule);
        if f.study != STUDY_ID {
            return Err(bad(
                "study",
                format!("is `{}`; this cardproof reads `{STUDY_ID}`", f.study),
            ));
        }
        if f.arms.is_empty() {
            return Err(bad("arms", "a study needs at least one arm".into()));
        }
        if f.arms.len() > MAX_ARMS {
            return Err(bad(
                "arms",
                format!("{} arms; at most {MAX_ARMS}", f.arms.len()),
            ));
        }
        let mut names = std::collections::BTreeSet::new();
        for (i, arm) in f.arms.iter().enumerate() {
            let field = format!("arms[{i}].name");
            let ok = !arm.name.is_empty()
                && arm.name.len() <= 64
                && arm
                    .name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
                && !arm.name.starts_with('.');
            if !ok {
                return Err(bad(
                    &field,
                    format!(
                        "`{}` is not a name of 1 to 64 letters, digits, `.`, `_` and `-` (not starting with `.`)",
                        arm.name
                    ),
                ));
            }
            if arm.name.starts_with("control-") || arm.name == "baseline" {
                return Err(bad(
                    &field,
                    format!("`{}` is reserved for the study's own arms", arm.name),
                ));
            }
            if !names.insert(arm.name.clone()) {
                return Err(bad(&field, format!("`{}` names two arms", arm.name)));
            }
        }
        for (i, &l) in f.protocol.context_lengths.iter().enumerate() {
            crate::kld::protocol::check_context_length(l)
                .map_err(|why| bad(&format!("protocol.context_lengths[{i}]"), why))?;
        }
        if f.protocol.context_lengths.is_empty() {
            return Err(bad(
                "protocol.context_lengths",
                "name at least one context length".into(),
            ));
        }
        Ok(())
    }

    /// The command line's settings over the file's. A flag for another runner than the one
    /// that runs is refused, naming both (it would change nothing).
    pub fn apply(&mut self, o: &Overrides) -> Result<()> {
        if let Some(r) = o.runner {
            self.file.runner = r;
        }
        let runner = self.file.runner;
        for (flag, given, wants) in [
            (
                "--llamacpp-bin",
                o.llamacpp_bin.is_some(),
                StudyRunner::Llamacpp,
            ),
            (
                "--llamacpp-server",
                o.llamacpp_server.is_some(),
                StudyRunner::Llamacpp,
            ),
            ("--device", o.device.is_some(), StudyRunner::Transformers),
            ("--python", o.python.is_some(), StudyRunner::Transformers),
            (
                "--torch-dtype",
                o.torch_dtype.is_some(),
                StudyRunner::Transformers,
            ),
        ] {
            if given && runner != wants {
                return Err(Error::usage(
                    Path::new(flag),
                    format!(
                        "is for runner {}; {} runs in runner {} (the file's `runner`, or --runner)",
                        wants.as_str(),
                        self.path.display(),
                        runner.as_str()
                    ),
                ));
            }
        }
        if o.turns_conversation.is_some() && self.file.protocol.turns.is_none() {
            return Err(Error::usage(
                Path::new("--turns-conversation"),
                format!(
                    "names the conversation a study's turns come from, and {} generates no turns (it has no `protocol.turns`)",
                    self.path.display()
                ),
            ));
        }
        self.given = o.clone();
        if self.file.runner != StudyRunner::Llamacpp {
            self.file.llamacpp = None;
        }
        if self.file.runner != StudyRunner::Transformers {
            self.file.transformers = None;
            return Ok(());
        }
        if o.device.is_some() || o.torch_dtype.is_some() || self.file.transformers.is_none() {
            let t = self.file.transformers.get_or_insert_with(Default::default);
            if o.device.is_some() {
                t.device = o.device.clone();
            }
            if o.torch_dtype.is_some() {
                t.torch_dtype = o.torch_dtype.clone();
            }
        }
        Ok(())
    }

    /// The directory the study file's paths are relative to.
    pub fn dir(&self) -> &Path {
        self.path
            .parent()
            .filter(|d| !d.as_os_str().is_empty())
            .unwrap_or(Path::new("."))
    }

    /// A data file the study file names (`field`: `eval.text`, `eval.chat_template`), which
    /// must be inside the study file's directory ([`crate::files::inside_dir`]: no absolute
    /// path, `..` or link out of it): it is read, digested and signed, and an eval text can be
    /// recovered from the rows written. `flag` names it from elsewhere.
    pub fn data_file(&self, field: &str, source: &str, flag: &str) -> Result<PathBuf> {
        crate::files::inside_dir(self.dir(), source).map_err(|why| {
            self.error(
                field,
                format!("`{source}` {}; pass it with {flag}", why.why("study file")),
            )
        })
    }

    /// `llama-perplexity`: `--llamacpp-bin`, else `CARDPROOF_LLAMACPP_BIN` (made absolute
    /// against the working directory), else `None` (the one on `PATH`).
    pub fn llamacpp_bin(&self) -> Option<PathBuf> {
        self.given.llamacpp_bin.clone().or_else(|| {
            std::env::var_os(LLAMACPP_BIN_ENV)
                .filter(|v| !v.is_empty())
                .map(|v| std::path::absolute(&v).unwrap_or_else(|_| PathBuf::from(v)))
        })
    }

    /// A path the study file names, relative to its directory.
    pub fn resolve(&self, relative: &str) -> PathBuf {
        let p = Path::new(relative);
        if p.is_absolute() {
            return p.to_owned();
        }
        self.path
            .parent()
            .filter(|d| !d.as_os_str().is_empty())
            .unwrap_or(Path::new("."))
            .join(p)
    }

    /// The study's name: its `name`, else the file's stem.
    pub fn name(&self) -> String {
        self.file.name.clone().unwrap_or_else(|| {
            self.path
                .file_stem()
                .map_or("study".into(), |s| s.to_string_lossy().into_owned())
        })
    }
}

/// [`Study::error`] before the [`Study`] exists.
fn field_error(
    path: &Path,
    places: &std::collections::BTreeMap<String, crate::span::LineCol>,
    field: &str,
    rule: impl Into<String>,
) -> Error {
    let mut err = Error::format(path, Some(field), rule);
    let mut pointer = pointer_of(field);
    err.at = loop {
        if let Some(at) = places.get(&pointer) {
            break Some(*at);
        }
        match pointer.rsplit_once('/') {
            Some((parent, _)) => pointer = parent.to_owned(),
            None => break places.get("").copied(),
        }
    };
    err
}

/// A field path (`arms[0].changes`, `protocol.context_lengths[1]`) as a JSON pointer
/// (`/arms/0/changes`).
fn pointer_of(field: &str) -> String {
    let parts: Vec<&str> = field
        .split(['.', '[', ']'])
        .filter(|p| *p != "?" && !p.is_empty())
        .collect();
    if parts.is_empty() {
        String::new()
    } else {
        format!("/{}", parts.join("/"))
    }
}

/// 1-based line and column (in characters) of a byte offset.
fn line_column(text: &str, offset: usize) -> (usize, usize) {
    let offset = text.floor_char_boundary(offset.min(text.len()));
    let before = &text[..offset];
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    (line, column)
}

/// The JSON Schema of the study file.
pub fn json_schema() -> serde_json::Value {
    crate::schema::generate::<StudyFile>(
        crate::schema::settings().for_deserialize(),
        STUDY_SCHEMA_URI,
    )
}

/// Where the study file's schema is published (and committed: `schema/study-file-v1.schema.json`).
pub const STUDY_SCHEMA_URI: &str = "https://cardproof.dev/schema/study-file-v1.schema.json";
