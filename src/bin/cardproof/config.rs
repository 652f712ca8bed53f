//! Validated settings, built from the raw arguments and the environment before any work starts:
//! the structs the commands read, each from its clap arguments through the library's builders
//! ([`ProtocolFlags`], [`TransformersFlags`]), which hold the checks.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};

use cardproof::conversation::turns::TurnSelection;
use cardproof::kld::protocol::{Bootstrap, Bos, Direction, Positions, Tail, VocabMode};
use cardproof::rerun::options::ProtocolFlags;
use cardproof::runner::llamacpp::{LlamacppOptions, LlamacppSettings};
use cardproof::runner::native::kv_cache::KvCacheSetting;
use cardproof::runner::native::{ComputeDtype, Emulate, StateDtype};
use cardproof::runner::tokens::{ChatTemplateChoice, ChatTemplateFlags};
use cardproof::runner::transformers::{TransformersFlags, TransformersOptions};
use clap::ValueEnum;

use crate::cli::{self, ColorArg, FormatArg, OutputArgs, RunnerArg};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Human,
    Json,
    Markdown,
    /// SARIF 2.1.0 (lint and check).
    Sarif,
}

impl Format {
    /// The flag value (`--format NAME`).
    pub fn name(self) -> &'static str {
        match self {
            Format::Human => "human",
            Format::Json => "json",
            Format::Markdown => "markdown",
            Format::Sarif => "sarif",
        }
    }
}

/// The formats each command prints, the one table of them: a format not listed for a command is
/// refused (a usage error, exit 2) before any work, never silently printed as another. `schema`
/// has no output flags (its document is always JSON).
pub const FORMATS: &[(&str, &[Format])] = {
    use Format::*;
    &[
        ("lint", &[Human, Json, Markdown, Sarif]),
        ("check", &[Human, Json, Sarif]),
        ("inspect", &[Human, Json]),
        ("hash", &[Human, Json]),
        ("kld", &[Human, Json]),
        ("measure", &[Human, Json]),
        ("study", &[Human, Json]),
        ("verify", &[Human, Json]),
        ("card", &[Human, Json]),
        ("keygen", &[Human, Json]),
        ("sign", &[Human, Json]),
        ("reference export", &[Human, Json]),
        ("reference sign", &[Human, Json]),
        ("verify-report", &[Human, Json]),
    ]
};

/// The formats `command` prints (every command has an entry in [`FORMATS`]).
pub fn formats_of(command: &str) -> &'static [Format] {
    FORMATS
        .iter()
        .find(|(name, _)| *name == command)
        .map(|(_, formats)| *formats)
        .expect("every command with output flags is in FORMATS")
}

#[derive(Debug, Clone, Copy)]
pub struct Output {
    pub format: Format,
    /// Colour human diagnostics on stderr.
    pub color: bool,
}

impl Output {
    /// The output of `command`; a format it does not print is a usage error naming the command
    /// and the formats it does print (the error itself is then printed for people).
    pub fn for_command(args: &OutputArgs, command: &str) -> Result<Output, (Output, String)> {
        let output = Output::from_args(args);
        let accepted = formats_of(command);
        if accepted.contains(&output.format) {
            return Ok(output);
        }
        let names: Vec<&str> = accepted.iter().map(|f| f.name()).collect();
        Err((
            Output {
                format: Format::Human,
                ..output
            },
            format!(
                "`{command}` does not print --format {}; it prints {}",
                output.format.name(),
                names.join(", ")
            ),
        ))
    }

    fn from_args(args: &OutputArgs) -> Output {
        let format = match (args.json, args.format) {
            (true, _) | (_, FormatArg::Json) => Format::Json,
            (_, FormatArg::Markdown) => Format::Markdown,
            (_, FormatArg::Sarif) => Format::Sarif,
            (_, FormatArg::Human) => Format::Human,
        };
        let no_color = std::env::var_os("NO_COLOR").is_some_and(|v| !v.is_empty());
        let color = match args.color {
            ColorArg::Always => true,
            ColorArg::Never => false,
            ColorArg::Auto => !no_color && std::io::stderr().is_terminal(),
        };
        Output { format, color }
    }
}

#[derive(Debug, Clone)]
pub struct LintConfig {
    pub paths: Vec<PathBuf>,
    /// `--model-cards`: skip local files that are not model cards.
    pub model_cards: bool,
    /// `--ignore`, and the settings file's.
    pub selection: cardproof::lint::select::Selection,
}

impl LintConfig {
    /// The paths and the rule selection: `--ignore` codes and the settings file (`--config`, else
    /// .cardproof.yaml in the working directory when present). An unknown code is exit 2.
    pub fn from_args(args: &cli::LintArgs) -> cardproof::Result<LintConfig> {
        use cardproof::lint::select::{SETTINGS_FILE, Selection};
        let json = args.output.json || matches!(args.output.format, cli::FormatArg::Json);
        if json && args.paths.len() > 1 {
            return Err(cardproof::Error::usage(
                Path::new("--json"),
                "a lint document is one card's: lint one path with --json, or several with \
                 --format sarif (one log for all)",
            ));
        }
        let given = Selection::from_codes(&args.ignore, Path::new("--ignore"))?;
        let file = match &args.config {
            Some(path) => Selection::read(path)?,
            None if Path::new(SETTINGS_FILE).is_file() => {
                Selection::read(Path::new(SETTINGS_FILE))?
            }
            None => Selection::default(),
        };
        Ok(LintConfig {
            paths: args.paths.clone(),
            model_cards: args.model_cards,
            selection: given.and(file),
        })
    }
}

#[derive(Debug, Clone)]
pub struct InspectConfig {
    pub path: PathBuf,
    pub list_modules: bool,
}

#[derive(Debug, Clone)]
pub struct HashConfig {
    pub path: PathBuf,
    pub options: cardproof::checkpoint::hash::HashOptions,
    /// Show a progress bar (stderr is a terminal).
    pub progress: bool,
}

impl HashConfig {
    pub fn from_args(args: cli::HashArgs) -> HashConfig {
        HashConfig {
            path: args.path,
            options: cardproof::checkpoint::hash::HashOptions {
                threads: args.threads.map(usize::from),
                include_all: args.all,
            },
            progress: std::io::stderr().is_terminal(),
        }
    }
}

#[derive(Debug, Clone)]
pub struct KldConfig {
    pub reference: PathBuf,
    pub candidate: PathBuf,
    pub options: cardproof::kld::Options,
    pub llamacpp_compat: bool,
}

impl KldConfig {
    pub fn from_args(args: cli::KldArgs) -> Result<KldConfig, String> {
        Ok(KldConfig {
            options: protocol_flags(&args.protocol).kld_options(args.context_length)?,
            reference: args.reference,
            candidate: args.candidate,
            llamacpp_compat: args.llamacpp_compat,
        })
    }
}

/// `card`: the library's request as it is (its checks are the writer's).
pub fn card_request(args: cli::CardArgs) -> cardproof::card::write::UpdateRequest {
    cardproof::card::write::UpdateRequest {
        measurement: args.measurement.unwrap_or_default(),
        study: args.study.zip(args.arm),
        from_llamacpp: args.from_llamacpp.map(|log| (log, args.base_file)),
        into: args.into,
        reference_repo: args.reference_repo,
        reference_revision: args.reference_revision,
        candidate_repo: args.candidate_repo,
        candidate_revision: args.candidate_revision,
        quantization: args.quantization,
        calibration: args
            .calibration
            .map(|dataset| cardproof::card::write::CalibrationInput {
                dataset,
                revision: args.calibration_revision,
                samples: args.calibration_samples,
            }),
    }
}

#[derive(Debug, Clone)]
pub struct KeygenConfig {
    pub out: PathBuf,
}

#[derive(Debug, Clone)]
pub struct SignConfig {
    pub file: PathBuf,
    pub checkpoint: Option<PathBuf>,
    /// `None`: the default key, created on first use.
    pub key: Option<PathBuf>,
    /// `None`: `NAME.dsse.json` beside the file.
    pub out: Option<PathBuf>,
}

#[derive(Debug, Clone)]
pub struct VerifyReportConfig {
    pub envelope: PathBuf,
    pub public_key: PathBuf,
    pub checkpoint: Option<PathBuf>,
    pub card: Option<PathBuf>,
    pub study: Option<PathBuf>,
}

#[derive(Debug, Clone)]
pub struct CheckConfig {
    /// `hf:ORG/NAME[@REV]`, parsed by the command (a bad one is an input error).
    pub source: String,
    pub public_key: Option<PathBuf>,
}

/// The protocol settings of `reference export` (which reads its context lengths and BOS itself).
#[derive(Debug, Clone)]
pub struct ProtocolConfig {
    pub direction: Direction,
    pub vocab: VocabMode,
    pub positions: Positions,
    pub bootstrap: Bootstrap,
    pub vocab_size: Option<usize>,
}

impl ProtocolConfig {
    /// Validate the flags; an inconsistent combination is a usage error (exit 2).
    pub fn from_args(args: &cli::ProtocolArgs) -> Result<ProtocolConfig, String> {
        let o = protocol_flags(args).kld_options(None)?;
        Ok(ProtocolConfig {
            direction: o.direction,
            vocab: o.vocab,
            positions: o.positions,
            bootstrap: o.bootstrap,
            vocab_size: o.vocab_size,
        })
    }
}

/// The protocol flags as the library reads them.
fn protocol_flags(a: &cli::ProtocolArgs) -> ProtocolFlags {
    ProtocolFlags {
        direction: a.direction.map(Into::into),
        vocab: a.vocab.unwrap_or(cli::VocabArg::Full).into(),
        top_k: a.top_k,
        tail: a.tail.into(),
        threshold: a.threshold,
        positions: a
            .positions
            .as_ref()
            .map_or(cardproof::disclosure::PositionPolicy::All, |p| p.policy),
        role: a.positions.as_ref().and_then(|p| p.role),
        span: a.positions.as_ref().and_then(|p| p.span),
        stride: a.stride,
        offset: a.offset,
        from: a.from,
        vocab_size: a.vocab_size,
        bootstrap: a.bootstrap,
        seed: a.seed,
    }
}

/// A clap value enum is the library's enum of the same variants.
macro_rules! same_variants {
    ($($arg:ident => $lib:path { $($v:ident),+ })+) => {$(
        impl From<cli::$arg> for $lib {
            fn from(value: cli::$arg) -> $lib {
                match value {
                    $(cli::$arg::$v => <$lib>::$v,)+
                }
            }
        }
    )+};
}

same_variants! {
    DirectionArg => Direction { Forward, Reverse, Both }
    VocabArg => cardproof::disclosure::VocabMode { Full, TopK, Threshold }
    TailArg => Tail { Lumped, Dropped, Renormalized }
    BosArg => Bos { None, PerWindow, PerDocument }
}

/// The name clap shows for a value, which the library's `from_name` reads.
fn name(value: impl ValueEnum) -> String {
    let shown = value.to_possible_value().expect("no value is skipped");
    shown.get_name().to_owned()
}

#[derive(Debug, Clone)]
pub struct MeasureConfig {
    /// The rerun the flags ask for (its runner resolved once).
    pub spec: cardproof::rerun::MeasureSpec,
    /// `--artifact-pub`: keys whose signature vouches for the artifact.
    pub artifact_pub: Vec<PathBuf>,
    /// `--trust-unsigned-artifact`.
    pub trust_unsigned_artifact: bool,
    pub out: PathBuf,
    /// Show a progress bar (stderr is a terminal).
    pub progress: bool,
    /// `--sweep`: the knob and its values.
    pub sweep: Option<(String, Vec<String>)>,
    /// `--force`: replace an --out that is not a cardproof set.
    pub force: bool,
    /// What the configuration chose that the user did not ask for, said on stderr.
    pub notes: Vec<String>,
}

impl MeasureConfig {
    pub fn from_args(args: cli::MeasureArgs) -> Result<MeasureConfig, String> {
        let mut notes = Vec::new();
        let protocol = protocol_flags(&args.protocol);
        let mut options = protocol.options(&args.context_length, args.bos.into())?;
        options.dump_logits = args.dump_logits.clone();
        options.prefill_chunk = args.prefill_chunk.map(|c| c as usize);
        let flags = transformers_flags(&args.transformers);
        let transformers = match args.runner {
            RunnerArg::Native
                if flags.sweep.as_deref().is_some_and(|s| {
                    s.starts_with("attention=") || s.starts_with("gdn_kernel=")
                }) =>
            {
                return Err(
                    "--sweep attention=... and gdn_kernel=... need --runner transformers".into(),
                );
            }
            RunnerArg::Native => None,
            RunnerArg::Transformers if args.reference_artifact.is_some() => {
                return Err("--runner transformers runs two models; a --reference-artifact is measured by the native runner".into());
            }
            RunnerArg::Transformers if args.dump_logits.is_some() => {
                return Err("--dump-logits needs --runner native".into());
            }
            RunnerArg::Transformers if options.vocab != VocabMode::Full => {
                return Err("--runner transformers computes full-vocabulary KL only; --vocab top-k and threshold need --runner native".into());
            }
            RunnerArg::Transformers => Some(flags.options()?),
            RunnerArg::Llamacpp => None,
        };
        let llamacpp = match args.runner {
            RunnerArg::Llamacpp if args.reference_artifact.is_some() => {
                return Err("--runner llamacpp runs two GGUF models; a --reference-artifact (or base file) is measured by the native runner".into());
            }
            RunnerArg::Llamacpp if args.dump_logits.is_some() => {
                return Err("--dump-logits needs --runner native".into());
            }
            RunnerArg::Llamacpp => {
                // llama.cpp's protocol is the default (as in a study): its rows define only the
                // forward KL over its threshold vocabulary, on the second half of each window.
                let p = &args.protocol;
                if p.direction.is_none() {
                    options.direction = cardproof::kld::protocol::Direction::Forward;
                }
                let mut defaulted = Vec::new();
                if p.positions.is_none() {
                    options.positions = cardproof::kld::protocol::Positions::SecondHalf;
                    defaulted.push("--positions second-half");
                }
                if p.vocab.is_none() {
                    options.vocab = VocabMode::Threshold { log_p: p.threshold };
                    defaulted.push("--vocab threshold");
                }
                if !defaulted.is_empty() {
                    notes.push(format!(
                        "--runner llamacpp: llama.cpp's protocol ({}), as llama-perplexity computes it",
                        defaulted.join(" ")
                    ));
                }
                Some(llamacpp_options(&args.llamacpp, args.threads)?)
            }
            _ => None,
        };
        let sweep = flags.sweep()?;
        if let Some((knob, _)) = &sweep {
            let llamacpp_knob = knob.starts_with("llamacpp.");
            if llamacpp_knob != llamacpp.is_some() {
                return Err(if llamacpp_knob {
                    format!("--sweep {knob}=...: llama.cpp's settings sweep with --runner llamacpp")
                } else {
                    format!(
                        "--sweep {knob}=...: with --runner llamacpp the knobs are llama.cpp's: {}",
                        cardproof::runner::llamacpp::SWEEP_KNOBS.join(", ")
                    )
                });
            }
        }
        let recurrent_state = recurrent_state(&args.recurrent_state_dtype, llamacpp.is_some())?;
        let kv_cache = kv_cache(&args.kv_cache)?;
        if sweep.is_some() && kv_cache.is_some() {
            return Err(
                "--kv-cache and --sweep do not combine: a sweep sets each side's scheme itself"
                    .into(),
            );
        }
        if sweep.is_none() && args.reference.is_none() && args.reference_artifact.is_none() {
            return Err("--reference or --reference-artifact is required".into());
        }
        let out = out_dir(
            args.out.as_deref(),
            &args.candidate,
            args.reference.as_deref(),
        )?;
        let compute = ComputeDtype::from_name(&name(args.compute_dtype)).expect("a native dtype");
        let emulate = Emulate::from_name(&name(args.emulate)).expect("a native emulation");
        Ok(MeasureConfig {
            notes,
            spec: cardproof::rerun::MeasureSpec {
                reference: args.reference,
                reference_artifact: args.reference_artifact,
                candidate: args.candidate,
                eval_text: args.eval_text,
                tokenizer: args.tokenizer,
                chat_template: chat_template(&args.chat_template)
                    .over(ChatTemplateChoice::default()),
                options,
                runner: cardproof::rerun::RunnerSpec::from_flags(
                    transformers,
                    llamacpp,
                    compute,
                    emulate,
                ),
                recurrent_state,
                kv_cache,
                turns: args.turns.map(|t| cardproof::rerun::turns::TurnProtocol {
                    turns: match t {
                        cli::TurnsArg::All => TurnSelection::All,
                        cli::TurnsArg::ToolCalls => TurnSelection::ToolCalls,
                    },
                    decoding: cardproof::rerun::turns::Decoding::Greedy,
                    max_new_tokens: args
                        .max_new_tokens
                        .map_or(cardproof::rerun::turns::DEFAULT_MAX_NEW_TOKENS, |n| {
                            n as usize
                        }),
                }),
                turns_conversation: args.turns_conversation,
                threads: threads(args.threads),
            },
            progress: std::io::stderr().is_terminal(),
            artifact_pub: args.artifact_trust.artifact_pub,
            trust_unsigned_artifact: args.artifact_trust.trust_unsigned_artifact,
            force: args.force,
            out,
            sweep,
        })
    }
}

/// `--runner llamacpp`'s flags, checked.
fn llamacpp_options(
    a: &cli::LlamacppArgs,
    threads: Option<u16>,
) -> Result<LlamacppOptions, String> {
    let settings = LlamacppSettings {
        threads: threads.map(u32::from),
        batch: a.llamacpp_batch,
        ubatch: a.llamacpp_ubatch,
        gpu_layers: a.llamacpp_gpu_layers.clone(),
        flash_attn: a.llamacpp_flash_attn.clone(),
        ..LlamacppSettings::default()
    };
    settings.check()?;
    Ok(LlamacppOptions {
        binary: a.llamacpp_bin.clone(),
        server: a.llamacpp_server.clone(),
        settings,
        no_gate: a.llamacpp_no_gate,
        reference: None,
    })
}

/// The transformers runner's flags as the library reads them.
fn transformers_flags(a: &cli::TransformersArgs) -> TransformersFlags {
    TransformersFlags {
        python: a.python.clone(),
        device: a.device.clone(),
        torch_dtype: a.torch_dtype.map(name),
        attention: a.attention.clone(),
        gdn_kernel: a.gdn_kernel.clone(),
        chunk_size: a.chunk_size,
        head_rows: a.head_rows,
        tf32: a.tf32,
        deterministic: a.deterministic,
        trust_remote_code: a.trust_remote_code,
        sweep: a.sweep.clone(),
        runner_script: a.runner_script.clone(),
        memory_limit: a.memory_limit,
        keep_hidden: a.keep_hidden.clone(),
        runner_dump: a.runner_dump.clone(),
    }
}

/// `--kv-cache`, `--kv-cache-k`, `--kv-cache-v`, `--kv-cache-rotation`: `None` when none is given.
/// `--chat-template*` as the library reads them.
fn chat_template(args: &cli::ChatTemplateArgs) -> ChatTemplateFlags {
    use cardproof::conversation::eval::TemplateFrom;
    let from = match (&args.chat_template, args.chat_template_from.as_deref()) {
        (Some(_), _) => Some(TemplateFrom::File),
        (None, Some("candidate")) => Some(TemplateFrom::Candidate),
        (None, Some(_)) => Some(TemplateFrom::Reference),
        (None, None) => None,
    };
    ChatTemplateFlags {
        from,
        file: args.chat_template.clone(),
        name: args.chat_template_name.clone(),
        clock: args.chat_template_clock,
    }
}

fn kv_cache(args: &cli::KvCacheArgs) -> Result<Option<KvCacheSetting>, String> {
    KvCacheSetting::from_flags(cardproof::runner::native::kv_cache::KvFlags {
        both: args.kv_cache.as_deref(),
        k: args.kv_cache_k.as_deref(),
        v: args.kv_cache_v.as_deref(),
        rotation: args.kv_cache_rotation.as_deref(),
        scales: args.kv_cache_scales.as_deref(),
        semantics: args.kv_cache_semantics.as_deref(),
        residual: args.kv_cache_residual,
        chunk: args.kv_cache_chunk,
    })
}

/// `--recurrent-state-dtype`: a dtype name, and f32 only with the llama.cpp runner (which keeps
/// its own state).
fn recurrent_state(value: &str, llamacpp: bool) -> Result<StateDtype, String> {
    let dtype = StateDtype::from_name(value).ok_or_else(|| {
        format!(
            "--recurrent-state-dtype: `{value}` is not a state dtype; use one of {}",
            StateDtype::NAMES
        )
    })?;
    if llamacpp && dtype != StateDtype::F32 {
        return Err(format!(
            "--recurrent-state-dtype {dtype} is emulated by the native and transformers runners; --runner llamacpp keeps llama.cpp's own state"
        ));
    }
    Ok(dtype)
}

/// `--threads`, by default every core.
fn threads(threads: Option<u16>) -> usize {
    threads.map_or_else(cores, usize::from)
}

/// Every core the process may use.
/// The default output directory for `name`: ./cardproof-out/<name>/, or, where an earlier run
/// left that, the first free `<name>-2`, `<name>-3`, ...: a run never replaces a set nobody named
/// (an explicit `--out` is replaced whole, as documented). The path is printed with what is
/// written there.
pub fn default_out(name: &str) -> PathBuf {
    let base = PathBuf::from("cardproof-out");
    let taken = |p: &Path| std::fs::symlink_metadata(p).is_ok();
    let first = base.join(name);
    if !taken(&first) {
        return first;
    }
    (2..10_000)
        .map(|i| base.join(format!("{name}-{i}")))
        .find(|p| !taken(p))
        .unwrap_or(first)
}

pub fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, usize::from)
}

/// `--out`, by default ./cardproof-out/<name of the model>/. Outputs never go into a checkpoint
/// being read, nor replace a directory holding one: the library's check on real paths
/// ([`cardproof::outset::outside_checkpoints`]), as a usage error.
fn out_dir(out: Option<&Path>, model: &Path, other: Option<&Path>) -> Result<PathBuf, String> {
    let out = out.map(Path::to_owned).unwrap_or_else(|| {
        let stem = |p: &Path| p.file_stem().map(|n| n.to_string_lossy().into_owned());
        let name = model
            .canonicalize()
            .ok()
            .and_then(|p| stem(&p))
            .or_else(|| stem(model));
        default_out(&name.unwrap_or_else(|| "model".into()))
    });
    let models: Vec<&Path> = std::iter::once(model).chain(other).collect();
    cardproof::outset::outside_checkpoints(&out, &models)
        .map_err(|e| format!("--out {}: {}", out.display(), e.message()))?;
    Ok(out)
}

#[derive(Debug, Clone)]
pub struct StudyConfig {
    pub file: PathBuf,
    /// `--runner`, `--device`, `--torch-dtype` over the file's.
    pub overrides: cardproof::study::file::Overrides,
    pub out: PathBuf,
    pub key: Option<PathBuf>,
    pub force: bool,
    /// `--resume`: finish the interrupted study in `out`.
    pub resume: bool,
    pub threads: usize,
    pub progress: bool,
}

impl StudyConfig {
    pub fn from_args(args: cli::StudyArgs) -> StudyConfig {
        let out = args.out.clone().unwrap_or_else(|| {
            let name = args
                .file
                .file_stem()
                .map_or("study".into(), |s| s.to_string_lossy().into_owned());
            // --resume finishes the interrupted run where it was left: the default itself.
            match args.resume {
                true => PathBuf::from("cardproof-out").join(name),
                false => default_out(&name),
            }
        });
        StudyConfig {
            overrides: cardproof::study::file::Overrides {
                runner: args
                    .runner
                    .as_deref()
                    .and_then(cardproof::study::file::StudyRunner::from_name),
                device: args.device,
                torch_dtype: args.torch_dtype,
                // Against the working directory, where the user typed it (a bare name would
                // otherwise be looked up on PATH when it runs).
                llamacpp_bin: args
                    .llamacpp_bin
                    .map(|p| std::path::absolute(&p).unwrap_or(p)),
                llamacpp_server: args
                    .llamacpp_server
                    .map(|p| std::path::absolute(&p).unwrap_or(p)),
                python: args.python,
                memory_limit: args.memory_limit,
                eval_text: args.eval_text,
                chat_template: args.chat_template,
                turns_conversation: args.turns_conversation,
            },
            file: args.file,
            out,
            key: args.key,
            force: args.force,
            resume: args.resume,
            threads: threads(args.threads),
            progress: std::io::stderr().is_terminal(),
        }
    }
}

#[derive(Debug, Clone)]
pub struct VerifyConfig {
    pub path: PathBuf,
    /// `--file NAME`: one file of a card listing many.
    pub file: Option<String>,
    pub reference: Option<PathBuf>,
    pub reference_artifact: Option<PathBuf>,
    /// `--artifact-pub`: keys whose signature vouches for the artifact.
    pub artifact_pub: Vec<PathBuf>,
    /// `--trust-unsigned-artifact`.
    pub trust_unsigned_artifact: bool,
    pub eval_text: Option<PathBuf>,
    pub noise_floor: bool,
    pub key: Option<PathBuf>,
    pub out: PathBuf,
    /// `--force`: replace an --out that is not a cardproof set.
    pub force: bool,
    pub threads: usize,
    pub progress: bool,
    /// `--runner transformers` and its settings.
    pub transformers: Option<TransformersOptions>,
    /// `--runner llamacpp` and its settings.
    pub llamacpp: Option<LlamacppOptions>,
    /// `--recurrent-state-dtype`.
    pub recurrent_state: StateDtype,
    /// `--kv-cache`, `--kv-cache-k`, `--kv-cache-v` (else the card's scheme).
    pub kv_cache: Option<KvCacheSetting>,
    /// `--chat-template*`, each over what the card's eval.conversation discloses.
    pub chat_template: ChatTemplateFlags,
}

impl VerifyConfig {
    pub fn from_args(args: cli::VerifyArgs) -> Result<VerifyConfig, String> {
        let out = out_dir(args.out.as_deref(), &args.path, args.reference.as_deref())?;
        let transformers = match args.runner {
            RunnerArg::Native => None,
            RunnerArg::Transformers if args.reference_artifact.is_some() => {
                return Err("--runner transformers reruns two models; a --reference-artifact is measured by the native runner".into());
            }
            RunnerArg::Transformers if args.transformers.sweep.is_some() => {
                return Err("--sweep belongs to `measure`".into());
            }
            RunnerArg::Transformers => Some(transformers_flags(&args.transformers).options()?),
            RunnerArg::Llamacpp => None,
        };
        let llamacpp = match args.runner {
            RunnerArg::Llamacpp if args.reference_artifact.is_some() => {
                return Err("--runner llamacpp reruns two GGUF models; a --reference-artifact is measured by the native runner".into());
            }
            RunnerArg::Llamacpp if args.transformers.sweep.is_some() => {
                return Err("--sweep belongs to `measure`".into());
            }
            RunnerArg::Llamacpp => Some(llamacpp_options(&args.llamacpp, args.threads)?),
            _ => None,
        };
        let recurrent_state = recurrent_state(&args.recurrent_state_dtype, llamacpp.is_some())?;
        let kv_cache = kv_cache(&args.kv_cache)?;
        Ok(VerifyConfig {
            recurrent_state,
            kv_cache,
            chat_template: chat_template(&args.chat_template),
            threads: threads(args.threads),
            progress: std::io::stderr().is_terminal(),
            path: args.path,
            file: args.file,
            reference: args.reference,
            reference_artifact: args.reference_artifact,
            artifact_pub: args.artifact_trust.artifact_pub,
            trust_unsigned_artifact: args.artifact_trust.trust_unsigned_artifact,
            eval_text: args.eval_text,
            noise_floor: args.noise_floor,
            key: args.key,
            force: args.force,
            out,
            transformers,
            llamacpp,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every `--compute-dtype`, `--emulate` and `--torch-dtype` value is a name the library reads.
    #[test]
    fn value_names_are_the_librarys() {
        for v in cli::ComputeArg::value_variants() {
            assert!(ComputeDtype::from_name(&name(*v)).is_some(), "{v:?}");
        }
        for v in cli::EmulateArg::value_variants() {
            assert!(Emulate::from_name(&name(*v)).is_some(), "{v:?}");
        }
        for v in cli::TorchDtypeArg::value_variants() {
            let flags = TransformersFlags {
                torch_dtype: Some(name(*v)),
                ..TransformersFlags::default()
            };
            assert!(flags.options().is_ok(), "{v:?}");
        }
    }
}
