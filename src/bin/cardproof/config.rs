//! Validated settings, built from the raw arguments and the environment before any work starts.

use std::io::IsTerminal;
use std::path::PathBuf;

use crate::cli::{ColorArg, FormatArg, OutputArgs};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Human,
    Json,
    Markdown,
    /// SARIF 2.1.0 (lint and check).
    Sarif,
}

#[derive(Debug, Clone, Copy)]
pub struct Output {
    pub format: Format,
    /// Colour human diagnostics on stderr.
    pub color: bool,
}

impl Output {
    pub fn from_args(args: &OutputArgs) -> Output {
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
    pub path: PathBuf,
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
    pub fn from_args(args: crate::cli::HashArgs) -> HashConfig {
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

/// `card`: the library's request as it is (its checks are the writer's).
pub fn card_request(args: crate::cli::CardArgs) -> cardproof::card::write::UpdateRequest {
    cardproof::card::write::UpdateRequest {
        measurement: args.measurement,
        into: args.into,
        reference_repo: args.reference_repo,
        reference_revision: args.reference_revision,
        candidate_repo: args.candidate_repo,
        candidate_revision: args.candidate_revision,
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
}

#[derive(Debug, Clone)]
pub struct CheckConfig {
    /// `hf:ORG/NAME[@REV]`, parsed by the command (a bad one is an input error).
    pub source: String,
    pub public_key: Option<PathBuf>,
}

/// The protocol settings `kld` and `measure` share.
#[derive(Debug, Clone)]
pub struct ProtocolConfig {
    pub direction: cardproof::kld::protocol::Direction,
    pub vocab: cardproof::kld::protocol::VocabMode,
    pub positions: cardproof::kld::protocol::Positions,
    pub bootstrap: cardproof::kld::protocol::Bootstrap,
    pub vocab_size: Option<usize>,
}

impl ProtocolConfig {
    /// Validate the flags; an inconsistent combination is a usage error (exit 2).
    pub fn from_args(args: &crate::cli::ProtocolArgs) -> Result<ProtocolConfig, String> {
        use crate::cli::{DirectionArg, PositionsArg, TailArg, VocabArg};
        use cardproof::kld::protocol::{Bootstrap, Direction, Positions, Tail, VocabMode};
        let direction = match args.direction {
            Some(DirectionArg::Forward) => Direction::Forward,
            Some(DirectionArg::Reverse) => Direction::Reverse,
            Some(DirectionArg::Both) => Direction::Both,
            // llama.cpp's threshold mode is forward only (see `unmeasurable`).
            None if args.vocab == VocabArg::Threshold => Direction::Forward,
            None => Direction::Both,
        };
        let vocab = match args.vocab {
            VocabArg::Full => VocabMode::Full,
            VocabArg::TopK => {
                let k = args.top_k.ok_or("--vocab top-k needs --top-k K")?;
                if k == 0 {
                    return Err("--top-k must be at least 1".into());
                }
                let tail = match args.tail {
                    TailArg::Lumped => Tail::Lumped,
                    TailArg::Dropped => Tail::Dropped,
                    TailArg::Renormalized => Tail::Renormalized,
                };
                VocabMode::TopK { k, tail }
            }
            VocabArg::Threshold => {
                if !(args.threshold.is_finite() && args.threshold <= 0.0) {
                    return Err(format!(
                        "--threshold {} must be a log-probability (<= 0)",
                        args.threshold
                    ));
                }
                VocabMode::Threshold {
                    log_p: args.threshold,
                }
            }
        };
        if let Some(why) = cardproof::kld::protocol::unmeasurable(direction, vocab) {
            return Err(format!(
                "--direction {}: {why}",
                args.direction.map_or("both", |d| match d {
                    DirectionArg::Forward => "forward",
                    DirectionArg::Reverse => "reverse",
                    DirectionArg::Both => "both",
                })
            ));
        }
        if args.top_k.is_some() && args.vocab != VocabArg::TopK {
            return Err("--top-k needs --vocab top-k".into());
        }
        let positions = match args.positions {
            PositionsArg::All => Positions::All,
            PositionsArg::SecondHalf => Positions::SecondHalf,
            PositionsArg::Stride => {
                let stride = args.stride.ok_or("--positions stride needs --stride N")?;
                let offset = args
                    .offset
                    .ok_or("--positions stride needs --offset K (0 <= K < N)")?;
                if stride == 0 || offset >= stride {
                    return Err(format!(
                        "--offset {offset} must be below --stride {stride} (and the stride at least 1)"
                    ));
                }
                Positions::Stride { stride, offset }
            }
            PositionsArg::From => Positions::From {
                from: args.from.ok_or("--positions from needs --from N")?,
            },
        };
        if (args.stride.is_some() || args.offset.is_some())
            && args.positions != PositionsArg::Stride
        {
            return Err("--stride and --offset need --positions stride".into());
        }
        if args.from.is_some() && args.positions != PositionsArg::From {
            return Err("--from needs --positions from".into());
        }
        if args.vocab_size == Some(0) {
            return Err("--vocab-size must be at least 1".into());
        }
        let bootstrap = Bootstrap {
            resamples: args.bootstrap,
            seed: args.seed,
            level: 0.95,
        };
        bootstrap
            .check()
            .map_err(|why| format!("--bootstrap {}: {why}", args.bootstrap))?;
        Ok(ProtocolConfig {
            direction,
            vocab,
            positions,
            bootstrap,
            vocab_size: args.vocab_size,
        })
    }
}

impl KldConfig {
    pub fn from_args(args: crate::cli::KldArgs) -> Result<KldConfig, String> {
        let p = ProtocolConfig::from_args(&args.protocol)?;
        if let Some(l) = args.context_length {
            cardproof::kld::protocol::check_context_length(l)
                .map_err(|why| format!("--context-length {l}: {why}"))?;
        }
        Ok(KldConfig {
            reference: args.reference,
            candidate: args.candidate,
            options: cardproof::kld::Options {
                direction: p.direction,
                vocab: p.vocab,
                positions: p.positions,
                context_length: args.context_length,
                vocab_size: p.vocab_size,
                bootstrap: p.bootstrap,
            },
            llamacpp_compat: args.llamacpp_compat,
        })
    }
}

#[derive(Debug, Clone)]
pub struct MeasureConfig {
    pub reference: Option<PathBuf>,
    pub reference_artifact: Option<PathBuf>,
    pub candidate: PathBuf,
    pub eval_text: Option<PathBuf>,
    pub tokenizer: Option<PathBuf>,
    pub options: cardproof::rerun::MeasureOptions,
    pub compute: cardproof::runner::native::ComputeDtype,
    pub emulate: cardproof::runner::native::Emulate,
    pub threads: usize,
    pub out: PathBuf,
    /// Show a progress bar (stderr is a terminal).
    pub progress: bool,
    /// `--runner transformers` and its settings.
    pub transformers: Option<cardproof::runner::transformers::TransformersOptions>,
    /// `--sweep`: the knob and its values.
    pub sweep: Option<(String, Vec<String>)>,
    /// `--force`: replace an --out that is not a cardproof set.
    pub force: bool,
}

impl MeasureConfig {
    pub fn from_args(args: crate::cli::MeasureArgs) -> Result<MeasureConfig, String> {
        use crate::cli::{BosArg, ComputeArg, EmulateArg, RunnerArg};
        use cardproof::runner::native::ComputeDtype;
        use cardproof::runner::tokens::Bos;
        let p = ProtocolConfig::from_args(&args.protocol)?;
        let mut lengths = args.context_length.clone();
        for &l in &lengths {
            cardproof::kld::protocol::check_context_length(l as u64)
                .map_err(|why| format!("--context-length {l}: {why}"))?;
        }
        lengths.sort_unstable();
        lengths.dedup();
        let transformers = match args.runner {
            RunnerArg::Native => {
                if args.transformers.sweep.is_some() {
                    return Err("--sweep needs --runner transformers".into());
                }
                None
            }
            RunnerArg::Transformers => {
                if args.reference_artifact.is_some() {
                    return Err(
                        "--runner transformers runs two models; a --reference-artifact is measured by the native runner"
                            .into(),
                    );
                }
                if args.dump_logits.is_some() {
                    return Err("--dump-logits needs --runner native".into());
                }
                if !matches!(p.vocab, cardproof::kld::protocol::VocabMode::Full) {
                    return Err(
                        "--runner transformers computes full-vocabulary KL only; --vocab top-k and threshold need --runner native"
                            .into(),
                    );
                }
                Some(transformers_options(&args.transformers)?)
            }
        };
        let sweep = args
            .transformers
            .sweep
            .as_deref()
            .map(parse_sweep)
            .transpose()?;
        if sweep.is_none() && args.reference.is_none() && args.reference_artifact.is_none() {
            return Err("--reference or --reference-artifact is required".into());
        }
        let out = args
            .out
            .clone()
            .unwrap_or_else(|| default_out(&args.candidate));
        let mut models = vec![&args.candidate];
        if let Some(r) = &args.reference {
            models.push(r);
        }
        outside_checkpoints(&out, &models)?;
        let threads = args
            .threads
            .map(usize::from)
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, usize::from));
        Ok(MeasureConfig {
            reference: args.reference,
            reference_artifact: args.reference_artifact,
            candidate: args.candidate,
            eval_text: args.eval_text,
            tokenizer: args.tokenizer,
            options: cardproof::rerun::MeasureOptions {
                direction: p.direction,
                vocab: p.vocab,
                positions: p.positions,
                bootstrap: p.bootstrap,
                context_lengths: lengths,
                bos: match args.bos {
                    BosArg::None => Bos::None,
                    BosArg::PerWindow => Bos::PerWindow,
                    BosArg::PerDocument => Bos::PerDocument,
                },
                vocab_size: p.vocab_size,
                dump_logits: args.dump_logits,
            },
            compute: match args.compute_dtype {
                ComputeArg::F32 => ComputeDtype::F32,
                ComputeArg::F64 => ComputeDtype::F64,
                ComputeArg::Bf16 => ComputeDtype::Bf16,
            },
            emulate: match args.emulate {
                EmulateArg::Reference => cardproof::runner::native::Emulate::ReferenceSemantics,
                EmulateArg::LlamacppCpu => cardproof::runner::native::Emulate::LlamacppCpu,
            },
            threads,
            out,
            progress: std::io::IsTerminal::is_terminal(&std::io::stderr()),
            transformers,
            sweep,
            force: args.force,
        })
    }
}

/// `--sweep KNOB=A,B,...`: the knob and its values, the first the baseline.
fn parse_sweep(s: &str) -> Result<(String, Vec<String>), String> {
    let (knob, values) = s
        .split_once('=')
        .ok_or_else(|| format!("--sweep {s}: expected KNOB=A,B (e.g. attention=eager,sdpa)"))?;
    if knob != "attention" {
        return Err(format!(
            "--sweep {s}: the knob can be `attention` (the weights stay the same, the kernel changes)"
        ));
    }
    let values: Vec<String> = values.split(',').map(|v| v.trim().to_owned()).collect();
    if values.len() < 2 || values.iter().any(String::is_empty) {
        return Err(format!(
            "--sweep {s}: give at least two values, the first the baseline"
        ));
    }
    for v in &values {
        attention_name(v)?;
    }
    Ok((knob.to_owned(), values))
}

fn attention_name(v: &str) -> Result<(), String> {
    const KNOWN: &[&str] = &[
        "sdpa",
        "eager",
        "flash_attention_2",
        "flash_attention_3",
        "flex_attention",
    ];
    if KNOWN.contains(&v) {
        Ok(())
    } else {
        Err(format!(
            "attention {v:?} is not one of {}",
            KNOWN.join(", ")
        ))
    }
}

/// The transformers runner's settings, validated.
pub fn transformers_options(
    a: &crate::cli::TransformersArgs,
) -> Result<cardproof::runner::transformers::TransformersOptions, String> {
    use cardproof::runner::transformers::{Device, TransformersOptions};
    let device = Device::parse(&a.device)
        .ok_or_else(|| format!("--device {}: expected cuda, cuda:N, auto or cpu", a.device))?;
    let attention = a.attention.clone().unwrap_or_else(|| "sdpa".into());
    attention_name(&attention)?;
    let defaults = TransformersOptions::default();
    Ok(TransformersOptions {
        python: a.python.clone().unwrap_or(defaults.python),
        script: a.runner_script.clone(),
        device,
        dtype: match a.torch_dtype {
            None | Some(crate::cli::TorchDtypeArg::Bfloat16) => "bfloat16",
            Some(crate::cli::TorchDtypeArg::Float16) => "float16",
            Some(crate::cli::TorchDtypeArg::Float32) => "float32",
        }
        .into(),
        attention: (attention.clone(), attention),
        follow_card: (a.attention.is_none(), a.torch_dtype.is_none()),
        chunk_size: a.chunk_size.map_or(0, |n| n as usize),
        head_rows: a.head_rows.map_or(0, |n| n as usize),
        tf32: a.tf32,
        deterministic: a.deterministic,
        trust_remote_code: a.trust_remote_code,
        memory_limit: a.memory_limit,
        mode: "auto".into(),
        keep_hidden: match a.keep_hidden.as_str() {
            k @ ("auto" | "device" | "host" | "disk") => k.into(),
            other => {
                return Err(format!(
                    "--keep-hidden {other}: expected auto, device, host or disk"
                ));
            }
        },
        gates: false,
        dump_rows: a.runner_dump.clone().map(|d| (d, 64)),
    })
}

/// Outputs never go into a checkpoint being read, nor replace a directory holding one: the
/// library's check on real paths ([`cardproof::outset::outside_checkpoints`]), as a usage error.
fn outside_checkpoints(out: &std::path::Path, models: &[&PathBuf]) -> Result<(), String> {
    let models: Vec<&std::path::Path> = models.iter().map(|m| m.as_path()).collect();
    cardproof::outset::outside_checkpoints(out, &models)
        .map_err(|e| format!("--out {}: {}", out.display(), e.message()))
}

/// Default output directory: ./cardproof-out/<name of the path>/.
fn default_out(path: &std::path::Path) -> PathBuf {
    let name = path
        .canonicalize()
        .ok()
        .and_then(|p| p.file_stem().map(|n| n.to_string_lossy().into_owned()))
        .or_else(|| path.file_stem().map(|n| n.to_string_lossy().into_owned()))
        .unwrap_or_else(|| "model".into());
    PathBuf::from("cardproof-out").join(name)
}

#[derive(Debug, Clone)]
pub struct VerifyConfig {
    pub path: PathBuf,
    pub reference: Option<PathBuf>,
    pub reference_artifact: Option<PathBuf>,
    pub eval_text: Option<PathBuf>,
    pub noise_floor: bool,
    pub key: Option<PathBuf>,
    pub out: PathBuf,
    /// `--force`: replace an --out that is not a cardproof set.
    pub force: bool,
    pub threads: usize,
    pub progress: bool,
    /// `--runner transformers` and its settings.
    pub transformers: Option<cardproof::runner::transformers::TransformersOptions>,
}

impl VerifyConfig {
    pub fn from_args(args: crate::cli::VerifyArgs) -> Result<VerifyConfig, String> {
        let out = args.out.clone().unwrap_or_else(|| default_out(&args.path));
        let mut models = vec![&args.path];
        if let Some(r) = &args.reference {
            models.push(r);
        }
        outside_checkpoints(&out, &models)?;
        let transformers = match args.runner {
            crate::cli::RunnerArg::Native => None,
            crate::cli::RunnerArg::Transformers => {
                if args.reference_artifact.is_some() {
                    return Err("--runner transformers reruns two models; a --reference-artifact is measured by the native runner".into());
                }
                if args.transformers.sweep.is_some() {
                    return Err("--sweep belongs to `measure`".into());
                }
                Some(transformers_options(&args.transformers)?)
            }
        };
        Ok(VerifyConfig {
            transformers,
            threads: args
                .threads
                .map(usize::from)
                .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, usize::from)),
            path: args.path,
            reference: args.reference,
            reference_artifact: args.reference_artifact,
            eval_text: args.eval_text,
            noise_floor: args.noise_floor,
            key: args.key,
            out,
            force: args.force,
            progress: std::io::IsTerminal::is_terminal(&std::io::stderr()),
        })
    }
}
