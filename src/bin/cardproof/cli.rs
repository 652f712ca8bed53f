//! Raw command-line arguments (clap). [`crate::config`] turns them into validated settings.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};

#[derive(Debug, Parser)]
#[command(
    name = "cardproof",
    version,
    about = "Check the fidelity (KL-divergence) claims on quantized LLM model cards",
    long_about = "Check the fidelity (KL-divergence) claims on quantized LLM model cards.\n\n\
                  Exit codes: 0 clean, 1 findings (lint errors), 2 bad input or usage."
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

// Parsed once per process and moved into its config at once: the variants' sizes do not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Check a card's fidelity disclosure, Hub metadata and KLD claims.
    Lint(LintArgs),
    /// Print the JSON Schema (draft 2020-12) of the `fidelity:` block.
    Schema,
    /// Report what a checkpoint holds, from headers alone: formats, files, which modules are
    /// quantized and how, bits per weight, and config/tensor disagreements.
    Inspect(InspectArgs),
    /// SHA-256 of every file and a root digest (the SHA-256 of the `sha256sum`-format manifest
    /// printed on stdout).
    Hash(HashArgs),
    /// Reduce two logit files (safetensors dumps or llama.cpp --kl-divergence-base files) to KLD
    /// statistics.
    Kld(KldArgs),
    /// Run reference and candidate over an eval text and measure KLD (writes measurement.json and
    /// positions.safetensors).
    Measure(MeasureArgs),
    /// Verify a model directory's card: lint, inspect, hash, rerun the disclosed protocol, decide
    /// a verdict per claim, and write the signed report. Exit 0 only when every claim reproduces.
    Verify(VerifyArgs),
    /// Write or update a card's `fidelity:` block and fidelity section from a measurement,
    /// preserving everything else byte for byte.
    Card(CardArgs),
    /// Create an Ed25519 key pair: DIR/cardproof.key (PKCS#8 PEM, mode 0600) and
    /// DIR/cardproof.pub (public key PEM).
    Keygen(KeygenArgs),
    /// Sign a measurement.json or report.json as an in-toto statement in a DSSE envelope.
    Sign(SignArgs),
    /// Compact reference artifacts.
    #[command(subcommand)]
    Reference(ReferenceCommand),
    /// Check a signed report or study offline: the signature, the keyid, every file of its set
    /// beside it against the digests it signed, and (with --checkpoint, or --study for a study)
    /// that every subject digest matches the files. Exit 1 on any mismatch.
    VerifyReport(VerifyReportArgs),
    /// Run a study: one reference against several arms (quantized checkpoints, KV-cache schemes,
    /// kernels), each changing one variable, measured against one reference pass; writes each
    /// arm's measurement, the paired comparisons and study.json/.md/.html, signed.
    Study(StudyArgs),
    /// Check a Hub upload without downloading its weights: lint the card, inspect the checkpoint
    /// from its headers (HTTP Range reads), compare the card's candidate digest and revision with
    /// the Hub's per-file SHA-256 and head, and check a signed report in the repository. Given a
    /// local directory, the same checks before the upload (files hashed only when the card
    /// claims a digest or holds a report; no revision yet).
    Check(CheckArgs),
}

impl Command {
    /// `--threads`, for the commands that compute.
    pub fn threads(&self) -> Option<u16> {
        match self {
            Command::Hash(a) => a.threads,
            Command::Measure(a) => a.threads,
            Command::Verify(a) => a.threads,
            Command::Study(a) => a.threads,
            Command::Reference(ReferenceCommand::Export(a)) => a.threads,
            _ => None,
        }
    }
}

/// `--kv-cache`, `--kv-cache-k`, `--kv-cache-v`, `--kv-cache-rotation` (measure and verify).
#[derive(Debug, Args)]
pub struct KvCacheArgs {
    /// The candidate's KV-cache scheme, keys and values (attention layers; write-then-read, as
    /// llama.cpp and vLLM store a chunk before attending to it): none (the model dtype), f16,
    /// bf16; llama.cpp's q8_0, q4_0, q4_1, q5_0, q5_1, iq4_nl (blocks of 32, ggml's reference rounding);
    /// exllamav3's exl3_q2 .. exl3_q8 (groups of 32 rotated by H32, f16 absmax scales);
    /// vLLM's fp8_e4m3 (fp8) and fp8_e5m2 (per-tensor scale: the checkpoint's k_scale/v_scale,
    /// else 1.0, or computed: --kv-cache-scales), int8_per_token_head and fp8_per_token_head; or k:SCHEME/v:SCHEME. Recorded as
    /// the run's kv_cache_dtype.
    #[arg(long, value_name = "SCHEME")]
    pub kv_cache: Option<String>,
    /// The keys' scheme alone (overrides --kv-cache for K; llama.cpp's -ctk).
    #[arg(long, value_name = "SCHEME")]
    pub kv_cache_k: Option<String>,
    /// The values' scheme alone (overrides --kv-cache for V; llama.cpp's -ctv).
    #[arg(long, value_name = "SCHEME")]
    pub kv_cache_v: Option<String>,
    /// hadamard: llama.cpp's rotation of a quantized cache (its default since April 2026; Q/K in
    /// blocks of the largest power of two dividing the head, V in blocks of 64; heads that are a
    /// multiple of 64) or none (LLAMA_ATTN_ROT_DISABLE=1). Also written SCHEME+hadamard.
    #[arg(long, value_name = "ROTATION")]
    pub kv_cache_rotation: Option<String>,
    /// Where a per-tensor fp8 cache's scales come from: checkpoint (its k_scale/v_scale, else
    /// 1.0; the default) or computed (vLLM's calculate_kv_scales: each layer's amax/200 for keys
    /// and amax/100 for values on the first forward pass, then frozen). Also written
    /// SCHEME+computed.
    #[arg(long, value_name = "SOURCE")]
    pub kv_cache_scales: Option<String>,
    /// When the stored K/V are read back rounded: write_then_read (vLLM, llama.cpp; the
    /// default: a chunk's own keys and values are rounded before attention reads them) or
    /// quantized_cache_residual (transformers' QuantizedCache: the first prefill chunk reads
    /// unrounded, later chunks read the rounded history plus an unrounded residual window, the
    /// whole history rounded again when the window fills; windows are prefilled in chunks).
    /// Also written SCHEME+residualN.
    #[arg(long, value_name = "SEMANTICS")]
    pub kv_cache_semantics: Option<String>,
    /// transformers' residual_length under quantized_cache_residual (default 128).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=1_048_576))]
    pub kv_cache_residual: Option<u32>,
    /// Tokens per prefill chunk under quantized_cache_residual (default: the residual length).
    /// Also written SCHEME+residualN+chunkC.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=1_048_576))]
    pub kv_cache_chunk: Option<u32>,
}

/// How a conversation eval text (`--eval-text FILE.json|.jsonl`) is rendered (measure and
/// verify).
#[derive(Debug, Args)]
pub struct ChatTemplateArgs {
    /// Render conversations with this chat template file (Jinja, as transformers renders it)
    /// instead of the reference model's own.
    #[arg(long, value_name = "FILE", conflicts_with = "chat_template_from")]
    pub chat_template: Option<PathBuf>,
    /// Whose template renders the conversations: reference (the default; chat_template.jinja, else
    /// tokenizer_config.json's chat_template) or candidate (quant repositories sometimes ship a
    /// patched one).
    #[arg(long, value_name = "MODEL", value_parser = ["reference", "candidate"])]
    pub chat_template_from: Option<String>,
    /// A named template of tokenizer_config.json's list (default: `default`).
    #[arg(long, value_name = "NAME")]
    pub chat_template_name: Option<String>,
    /// The time strftime_now reads, in seconds since 1970 UTC (default 1767225600,
    /// 2026-01-01): a render must not depend on the day it runs. Recorded.
    #[arg(long, value_name = "SECONDS", allow_negative_numbers = true)]
    pub chat_template_clock: Option<i64>,
}

#[derive(Debug, Args)]
pub struct StudyArgs {
    /// The study file (YAML; `cardproof/study-v1`, see schema/study-file-v1.schema.json).
    pub file: PathBuf,
    /// Where the study goes (default: ./cardproof-out/<study name>/, or the first free
    /// <study name>-2, -3, ... beside an earlier run's), written as one set.
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// Private key to sign study.json with (default: the user's key).
    #[arg(long, value_name = "KEY")]
    pub key: Option<PathBuf>,
    /// Run the study in this runner instead of the file's `runner` (native, transformers or
    /// llamacpp).
    #[arg(long, value_name = "RUNNER", value_parser = ["native", "transformers", "llamacpp"])]
    pub runner: Option<String>,
    /// For the llama.cpp runner: the `llama-perplexity` binary (default:
    /// $CARDPROOF_LLAMACPP_BIN, else the one on PATH). A study file never names a program.
    #[arg(long, value_name = "PATH")]
    pub llamacpp_bin: Option<PathBuf>,
    /// For the llama.cpp runner: the `llama-server` binary that generates `protocol.turns`
    /// (default: the one beside llama-perplexity, the same build).
    #[arg(long, value_name = "PATH")]
    pub llamacpp_server: Option<PathBuf>,
    /// For the transformers runner: the Python interpreter with torch and transformers
    /// (default: $CARDPROOF_PYTHON, else python3). A study file never names a program.
    #[arg(long, value_name = "PATH")]
    pub python: Option<PathBuf>,
    /// The eval text instead of the file's `eval.text` (which must be inside the study file's
    /// directory: a study file cannot make cardproof read files elsewhere).
    #[arg(long, value_name = "FILE")]
    pub eval_text: Option<PathBuf>,
    /// The chat template file instead of the file's `eval.chat_template` (which must be inside
    /// the study file's directory).
    #[arg(long, value_name = "FILE")]
    pub chat_template: Option<PathBuf>,
    /// The conversation file (.json or .jsonl) the turns come from instead of the file's
    /// `protocol.turns.conversation` (which must be inside the study file's directory).
    #[arg(long, value_name = "FILE")]
    pub turns_conversation: Option<PathBuf>,
    /// For the transformers runner: the device instead of the file's (cuda, cuda:N, auto, cpu).
    #[arg(long, value_name = "DEVICE")]
    pub device: Option<String>,
    /// For the transformers runner: the dtype instead of the file's (bfloat16, float16, float32).
    #[arg(long, value_name = "DTYPE")]
    pub torch_dtype: Option<String>,
    /// For the transformers runner: plan memory as if only this many bytes were free (tests).
    #[arg(long, value_name = "BYTES", hide = true)]
    pub memory_limit: Option<u64>,
    /// Replace an --out that holds files other than a cardproof set.
    #[arg(long, conflicts_with = "resume")]
    pub force: bool,
    /// Finish an interrupted study: --out holds the arms it completed (an incomplete set, written
    /// when an arm failed); only the others run, the completed ones are replayed from their rows.
    #[arg(long)]
    pub resume: bool,
    /// Worker threads (default: every core).
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..))]
    pub threads: Option<u16>,
    #[command(flatten)]
    pub output: OutputArgs,
}

#[derive(Debug, Args)]
pub struct CheckArgs {
    /// The repository: hf:ORG/NAME[@REVISION] (a branch, tag or commit; default main), or a
    /// local model directory about to be uploaded.
    #[arg(value_name = "hf:ORG/NAME[@REV] | DIR")]
    pub source: String,
    /// Also verify the signature of a report in the repository (report.dsse.json) with this
    /// public key (PEM); without it the report's subjects are still compared with the Hub.
    #[arg(long = "pub", value_name = "KEY")]
    pub public_key: Option<PathBuf>,
    #[command(flatten)]
    pub output: OutputArgs,
}

#[derive(Debug, Args)]
pub struct CardArgs {
    /// The measurement.json that `cardproof measure` wrote.
    #[arg(
        long,
        value_name = "FILE",
        required_unless_present_any = ["study", "from_llamacpp"],
        conflicts_with_all = ["study", "from_llamacpp"]
    )]
    pub measurement: Option<PathBuf>,
    /// The log of a `llama-perplexity --kl-divergence` run (its printed statistics block and
    /// the lines before it): its numbers become the claims, llama.cpp the runtime; needs
    /// --into (the card beside the GGUF it measured). Lint then names what a log cannot disclose.
    #[arg(long, value_name = "LOG", conflicts_with = "study", requires = "into")]
    pub from_llamacpp: Option<PathBuf>,
    /// With --from-llamacpp: the run's `--kl-divergence-base` file, read for its header only
    /// (the token stream's count and digest).
    #[arg(long, value_name = "FILE", requires = "from_llamacpp")]
    pub base_file: Option<PathBuf>,
    /// A study's study.json: write the arm named by --arm (its measurement beside study.json),
    /// with the study's table of its arms in the fidelity section.
    #[arg(long, value_name = "STUDY_JSON", requires = "arm")]
    pub study: Option<PathBuf>,
    /// With --study: the arm whose card this is.
    #[arg(long, value_name = "NAME", requires = "study")]
    pub arm: Option<String>,
    /// The card to write or update (default: README.md in the measured candidate's directory).
    #[arg(long, value_name = "FILE")]
    pub into: Option<PathBuf>,
    /// Hub repository of the reference (kept from the card when absent).
    #[arg(long, value_name = "ORG/NAME")]
    pub reference_repo: Option<String>,
    /// 40-hex commit of the reference repository.
    #[arg(long, value_name = "SHA")]
    pub reference_revision: Option<String>,
    /// Hub repository of the candidate.
    #[arg(long, value_name = "ORG/NAME")]
    pub candidate_repo: Option<String>,
    /// 40-hex commit of the candidate repository.
    #[arg(long, value_name = "SHA")]
    pub candidate_revision: Option<String>,
    /// How the candidate was quantized: `fidelity.quantization.method`, e.g. `fp8-block`,
    /// `int4-awq`, `nvfp4` or a GGUF type such as `q4_k_m` (replaces the card's method).
    #[arg(long, value_name = "METHOD")]
    pub quantization: Option<String>,
    /// The calibration data the quantizer used: `fidelity.calibration.dataset`, a dataset id or
    /// `none` (round-to-nearest, dynamic FP8); replaces the card's `calibration` block whole.
    #[arg(long, value_name = "DATASET")]
    pub calibration: Option<String>,
    /// Revision of the calibration dataset (`fidelity.calibration.revision`; with --calibration).
    #[arg(long, value_name = "REV", requires = "calibration")]
    pub calibration_revision: Option<String>,
    /// Number of calibration samples (`fidelity.calibration.samples`; with --calibration).
    #[arg(long, value_name = "N", requires = "calibration", value_parser = clap::value_parser!(u64).range(1..))]
    pub calibration_samples: Option<u64>,
    #[command(flatten)]
    pub output: OutputArgs,
}

#[derive(Debug, Subcommand)]
pub enum ReferenceCommand {
    /// Export a reference artifact for one protocol: the token stream, the protocol, the
    /// reference's identity and, per scored position, the final hidden states (exact KL with the
    /// reference's lm_head) or the top-K log-probabilities (a lower bound of the KL).
    Export(Box<ExportArgs>),
    /// Sign an existing reference artifact or llama.cpp base file (FILE.dsse.json), vouching for
    /// it as the reference's: others then use it with --artifact-pub and your public key.
    Sign(ReferenceSignArgs),
}

#[derive(Debug, Args)]
pub struct ReferenceSignArgs {
    /// The artifact (cardproof's) or llama.cpp base file.
    pub file: PathBuf,
    /// The reference model it was made from: required for a base file (which names none); for
    /// cardproof's artifact, checked against the one its header names.
    #[arg(long, value_name = "PATH")]
    pub reference: Option<PathBuf>,
    /// Private key (PKCS#8 PEM; default: the user's key, created on first use).
    #[arg(long, value_name = "KEY")]
    pub key: Option<PathBuf>,
    #[command(flatten)]
    pub output: OutputArgs,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ArtifactKindArg {
    Hidden,
    TopK,
    /// A llama.cpp `--kl-divergence-base` file (second-half rows of each window).
    Llamacpp,
}

#[derive(Debug, Args)]
pub struct ExportArgs {
    /// The reference model.
    #[arg(long, value_name = "PATH")]
    pub model: PathBuf,
    #[arg(long, value_name = "FILE")]
    pub eval_text: PathBuf,
    /// Window length in tokens; repeatable.
    #[arg(long, value_name = "L", required = true)]
    pub context_length: Vec<usize>,
    #[arg(long, value_enum, default_value_t = BosArg::None)]
    pub bos: BosArg,
    #[command(flatten)]
    pub protocol: ProtocolArgs,
    /// What to store per scored position.
    #[arg(long, value_enum, default_value_t = ArtifactKindArg::Hidden)]
    pub kind: ArtifactKindArg,
    /// K for `--kind top-k`.
    #[arg(long = "artifact-top-k", value_name = "K", default_value_t = 256)]
    pub artifact_top_k: usize,
    /// Store hidden states in bf16 (half the size; the KL is then no longer exact).
    #[arg(long)]
    pub bf16: bool,
    /// Hub repository of the reference, recorded in the artifact's identity.
    #[arg(long, value_name = "ORG/NAME")]
    pub repo: Option<String>,
    /// 40-hex commit of the reference repository, recorded in the artifact's identity.
    #[arg(long, value_name = "SHA")]
    pub revision: Option<String>,
    /// Worker threads (default: every core).
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..))]
    pub threads: Option<u16>,
    /// The artifact file (its digest goes to FILE.sha256).
    #[arg(long, value_name = "FILE")]
    pub out: PathBuf,
    /// Private key (PKCS#8 PEM) to sign the artifact with (default: the user's key, created on
    /// first use under the config directory). The signed statement goes beside it as
    /// FILE.dsse.json; others accept the artifact with the matching --artifact-pub.
    #[arg(long, value_name = "KEY")]
    pub key: Option<PathBuf>,
    #[command(flatten)]
    pub output: OutputArgs,
}

#[derive(Debug, Args)]
pub struct KeygenArgs {
    /// Directory for cardproof.key and cardproof.pub (created if missing; existing keys are never
    /// overwritten).
    #[arg(long, value_name = "DIR")]
    pub out: PathBuf,
    #[command(flatten)]
    pub output: OutputArgs,
}

#[derive(Debug, Args)]
pub struct SignArgs {
    /// A measurement.json or report.json.
    pub file: PathBuf,
    /// The checkpoint whose files become the statement's subjects (default: the document's
    /// candidate or checkpoint path).
    #[arg(long, value_name = "DIR")]
    pub checkpoint: Option<PathBuf>,
    /// Private key (default: the user's key).
    #[arg(long, value_name = "KEY")]
    pub key: Option<PathBuf>,
    /// Where the envelope goes (default: FILE with `.dsse.json` in place of `.json`).
    #[arg(long, value_name = "FILE")]
    pub out: Option<PathBuf>,
    #[command(flatten)]
    pub output: OutputArgs,
}

#[derive(Debug, Args)]
pub struct VerifyReportArgs {
    /// The DSSE envelope (report.dsse.json).
    pub envelope: PathBuf,
    /// The signer's public key (PEM).
    #[arg(long = "pub", value_name = "KEY")]
    pub public_key: PathBuf,
    /// Also check every subject digest against this checkpoint's files, and its card
    /// (DIR/README.md) against the fidelity block the report signed.
    #[arg(long, value_name = "DIR")]
    pub checkpoint: Option<PathBuf>,
    /// Compare this card (a Markdown file, or a directory holding README.md) with the fidelity
    /// block the report signed, instead of the checkpoint's README.md.
    #[arg(long, value_name = "FILE")]
    pub card: Option<PathBuf>,
    /// A signed study (study.dsse.json): compare its subjects with this study file and the
    /// files of the reference and of each arm's candidate it names.
    #[arg(long, value_name = "STUDY_FILE", conflicts_with_all = ["checkpoint", "card"])]
    pub study: Option<PathBuf>,
    #[command(flatten)]
    pub output: OutputArgs,
}

/// Whom a reference artifact's signature must come from.
#[derive(Debug, Args)]
pub struct ArtifactTrustArgs {
    /// A public key (PEM) whose signature vouches for a reference artifact; repeat for several.
    /// The config directory's own cardproof.pub and trusted/*.pub are trusted too.
    #[arg(
        long = "artifact-pub",
        value_name = "KEY",
        requires = "reference_artifact"
    )]
    pub artifact_pub: Vec<PathBuf>,
    /// Use a reference artifact nobody you trust signed: its numbers are shown, and no claim is
    /// reproduced against them (the reference is self-asserted).
    #[arg(long, requires = "reference_artifact")]
    pub trust_unsigned_artifact: bool,
}

#[derive(Debug, Args)]
pub struct VerifyArgs {
    /// The candidate: a model directory holding its card (README.md) and checkpoint, or
    /// hf:ORG/NAME[@REV] (downloaded into the Hugging Face cache and verified first).
    pub path: PathBuf,
    /// The one file to verify of a card that lists many (`fidelity.files`); without it, every
    /// listed file is verified, each into its own report set in --out/<file>/.
    #[arg(long, value_name = "NAME")]
    pub file: Option<String>,
    /// The reference checkpoint the card's claims were measured against (a path or hf:ORG/NAME).
    /// With --reference-artifact: a seeded sample of the artifact's rows is recomputed from it.
    #[arg(long, value_name = "PATH")]
    pub reference: Option<PathBuf>,
    /// A compact reference artifact (`cardproof reference export`) in place of the reference,
    /// accepted when its signed statement (FILE.dsse.json) verifies under a key you trust.
    #[arg(long, value_name = "FILE")]
    pub reference_artifact: Option<PathBuf>,
    #[command(flatten)]
    pub artifact_trust: ArtifactTrustArgs,
    /// The eval text, when the card's `eval.text.source` is not a readable path.
    #[arg(long, value_name = "FILE")]
    pub eval_text: Option<PathBuf>,
    /// Also measure the reference against itself in a second compute dtype (the numerical floor).
    #[arg(long)]
    pub noise_floor: bool,
    /// The engine that reruns the claims.
    #[arg(long, value_enum, default_value_t = RunnerArg::Native)]
    pub runner: RunnerArg,
    #[command(flatten)]
    pub transformers: TransformersArgs,
    #[command(flatten)]
    pub llamacpp: LlamacppArgs,
    /// The dtype the candidate's recurrent (Gated DeltaNet) state is kept in, emulating an
    /// engine's SSM-state dtype: f32, bf16 or f16 (also float32, bfloat16, float16). Native
    /// runner, hybrid models only; recorded, and compared with the card's
    /// runtime.recurrent_state_dtype.
    #[arg(long, value_name = "DTYPE", default_value = "f32")]
    pub recurrent_state_dtype: String,
    /// The candidate's KV-cache scheme for the rerun, in place of the one the card's
    /// runtime.kv_cache_dtype names (a rerun that differs from the card is not comparable).
    #[command(flatten)]
    pub kv_cache: KvCacheArgs,
    /// How a conversation eval text is rendered, in place of what the card's
    /// eval.conversation discloses (a render that differs from the card's is not comparable).
    #[command(flatten)]
    pub chat_template: ChatTemplateArgs,
    /// Private key (PKCS#8 PEM) to sign the report with (default: the user's key, created on first
    /// use under the config directory).
    #[arg(long, value_name = "KEY")]
    pub key: Option<PathBuf>,
    /// Where the report goes (default: ./cardproof-out/<name>/, or the first free <name>-2, -3,
    /// ... beside an earlier run's), written as one set; a given --out's earlier set is replaced
    /// whole.
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// Replace an --out that holds files other than a cardproof set (its contents are deleted).
    /// Without it such an --out is refused; an earlier set is always replaced as a whole.
    #[arg(long)]
    pub force: bool,
    /// Worker threads (default: every core).
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..))]
    pub threads: Option<u16>,
    #[command(flatten)]
    pub output: OutputArgs,
}

#[derive(Debug, Args)]
pub struct KldArgs {
    /// The reference's logits: a safetensors dump (`logits` [rows, vocab], optional `tokens`,
    /// `positions`, `window`) or a llama.cpp base file.
    #[arg(long, value_name = "FILE")]
    pub reference: PathBuf,
    /// The candidate's logits, same rows and vocabulary.
    #[arg(long, value_name = "FILE")]
    pub candidate: PathBuf,
    #[command(flatten)]
    pub protocol: ProtocolArgs,
    /// Window length in tokens, for a dump without a `positions` tensor (one row per token).
    #[arg(long, value_name = "L")]
    pub context_length: Option<u64>,
    /// Reproduce `llama-perplexity --kl-divergence` exactly (reference: a llama.cpp base file).
    #[arg(long)]
    pub llamacpp_compat: bool,
    #[command(flatten)]
    pub output: OutputArgs,
}

/// The measurement protocol flags `kld` and `measure` share, spelled the same.
#[derive(Debug, Args)]
pub struct ProtocolArgs {
    /// Which KL directions to compute: forward = KL(P_ref || P_cand) [default: both; forward
    /// with --vocab threshold].
    #[arg(long, value_enum)]
    pub direction: Option<DirectionArg>,
    /// Vocabulary terms kept in the KL sum (the sets are the reference's) [default: full;
    /// threshold with `measure --runner llamacpp`, llama.cpp's].
    #[arg(long, value_enum)]
    pub vocab: Option<VocabArg>,
    /// For `--vocab top-k`: k.
    #[arg(long, value_name = "K")]
    pub top_k: Option<usize>,
    /// For `--vocab top-k`: the tail beyond k.
    #[arg(long, value_enum, default_value_t = TailArg::Lumped)]
    pub tail: TailArg,
    /// For `--vocab threshold`: drop reference terms with log p at or below this.
    #[arg(long, value_name = "LOGP", default_value_t = -16.0, allow_negative_numbers = true)]
    pub threshold: f64,
    /// Scored rows of each window (row j predicts token j+1): all, stride, second-half, from,
    /// or, on a conversation eval text, role:ROLE (system, developer, user, assistant, tool,
    /// other) or span:SEGMENT (content, reasoning, tool-call, tool-result, scaffolding): the
    /// rows predicting such a token (with --stride/--offset, only those with j mod N = K)
    /// [default: all; second-half with `measure --runner llamacpp`, llama.cpp's].
    #[arg(long, value_parser = parse_positions, value_name = "POLICY")]
    pub positions: Option<PositionsArg>,
    /// For `--positions stride` (or role:/span:): score rows with j mod N = offset.
    #[arg(long, value_name = "N")]
    pub stride: Option<u64>,
    /// For `--positions stride`: the residue K (0 <= K < N).
    #[arg(long, value_name = "K")]
    pub offset: Option<u64>,
    /// For `--positions from`: score rows with j >= N.
    #[arg(long, value_name = "N")]
    pub from: Option<u64>,
    /// Use only the first V entries of each row (default for `measure`: the tokenizer's
    /// vocabulary; the rest is padding).
    #[arg(long, value_name = "V")]
    pub vocab_size: Option<usize>,
    /// Bootstrap resamples for the 95% intervals (1 to 100,000).
    #[arg(long, value_name = "N", default_value_t = 1000)]
    pub bootstrap: usize,
    /// Bootstrap seed.
    #[arg(long, value_name = "S", default_value_t = 0)]
    pub seed: u64,
}

/// `--turns`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum TurnsArg {
    All,
    ToolCalls,
}

#[derive(Debug, Args)]
pub struct MeasureArgs {
    /// The reference model (a path or hf:ORG/NAME[@REV]): a directory with config.json,
    /// tokenizer.json and safetensors, or a GGUF file (with tokenizer.json beside it).
    /// Required unless --reference-artifact or --sweep is given. With --reference-artifact: a
    /// seeded sample of the artifact's rows is recomputed from it.
    #[arg(long, value_name = "PATH")]
    pub reference: Option<PathBuf>,
    /// A compact reference artifact (`cardproof reference export`) in place of the reference
    /// model, accepted when its signed statement (FILE.dsse.json) verifies under a key you
    /// trust; its protocol is enforced.
    #[arg(long, value_name = "FILE")]
    pub reference_artifact: Option<PathBuf>,
    #[command(flatten)]
    pub artifact_trust: ArtifactTrustArgs,
    /// The candidate model, same tokenizer and vocabulary (a path or hf:ORG/NAME[@REV]).
    #[arg(long, value_name = "PATH")]
    pub candidate: PathBuf,
    /// The evaluation text (UTF-8), tokenized once with the reference's tokenizer (optional with
    /// --reference-artifact, which carries its token stream; checked against it when given).
    #[arg(
        long,
        value_name = "FILE",
        required_unless_present = "reference_artifact"
    )]
    pub eval_text: Option<PathBuf>,
    /// Window length in tokens; repeat for several (each gives its own run).
    #[arg(long, value_name = "L", required = true)]
    pub context_length: Vec<usize>,
    /// BOS policy: none, per-window (first token of each window replaced, as llama.cpp) or
    /// per-document (prepended before windowing).
    #[arg(long, value_enum, default_value_t = BosArg::None)]
    pub bos: BosArg,
    #[command(flatten)]
    pub protocol: ProtocolArgs,
    /// Prefill each window in chunks of N tokens, the KV cache and recurrent state carried (the
    /// state stored in --recurrent-state-dtype) between them, as an engine's chunked prefill
    /// (vLLM's 2,048-token default). A protocol item: recorded and disclosed. Default: each
    /// window in one pass.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=1048576))]
    pub prefill_chunk: Option<u32>,
    /// The engine that runs the models.
    #[arg(long, value_enum, default_value_t = RunnerArg::Native)]
    pub runner: RunnerArg,
    #[command(flatten)]
    pub transformers: TransformersArgs,
    #[command(flatten)]
    pub llamacpp: LlamacppArgs,
    /// Compute precision of the native runner's forward pass.
    #[arg(long, value_enum, default_value_t = ComputeArg::F32)]
    pub compute_dtype: ComputeArg,
    /// Whose numerics to follow: exact reference semantics, or llama.cpp's CPU path (GGUF
    /// models: activations quantized to q8_0/q8_K/f16 as ggml's dot products do, f16 KV; with
    /// flash attention, llama.cpp's CPU default, or llamacpp-cpu-no-fa as `-fa off`).
    #[arg(long, value_enum, default_value_t = EmulateArg::Reference)]
    pub emulate: EmulateArg,
    /// The dtype the candidate's recurrent (Gated DeltaNet) state is kept in, emulating an
    /// engine's SSM-state dtype: f32, bf16 or f16 (also float32, bfloat16, float16). Native
    /// runner, hybrid models only; recorded, and compared with the card's
    /// runtime.recurrent_state_dtype.
    #[arg(long, value_name = "DTYPE", default_value = "f32")]
    pub recurrent_state_dtype: String,
    /// Also generate the conversation eval text's assistant turns with both models (greedy,
    /// teacher-forced history) and judge their tool calls: `all` turns or those that call
    /// `tool-calls` in the conversation. Native, transformers and llama.cpp runners.
    #[arg(long, value_enum, value_name = "TURNS")]
    pub turns: Option<TurnsArg>,
    /// The conversation file (.json or .jsonl) whose turns --turns generates, where it is not
    /// the eval text: the llama.cpp runner scores a plain-text eval text, so its turns come
    /// from here.
    #[arg(long, value_name = "FILE", requires = "turns")]
    pub turns_conversation: Option<PathBuf>,
    /// Tokens a generated turn may hold at most, its stop token included (with --turns).
    #[arg(long, value_name = "N", requires = "turns",
          value_parser = clap::value_parser!(u32).range(1..=65_536))]
    pub max_new_tokens: Option<u32>,
    #[command(flatten)]
    pub kv_cache: KvCacheArgs,
    #[command(flatten)]
    pub chat_template: ChatTemplateArgs,
    /// Worker threads (default: every core).
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..))]
    pub threads: Option<u16>,
    /// A tokenizer.json to use instead of the reference's own.
    #[arg(long, value_name = "FILE")]
    pub tokenizer: Option<PathBuf>,
    /// Where measurement.json and positions.safetensors go (default:
    /// ./cardproof-out/<candidate name>/, or the first free <name>-2, -3, ... beside an earlier
    /// run's), written as one set; a given --out's earlier set is replaced whole.
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// Replace an --out that holds files other than a cardproof set (its contents are deleted).
    /// Without it such an --out is refused; an earlier set is always replaced as a whole.
    #[arg(long)]
    pub force: bool,
    /// Also write both models' logits at the scored rows (reference.logits.safetensors and
    /// candidate.logits.safetensors, readable by `cardproof kld`) into DIR.
    #[arg(long, value_name = "DIR")]
    pub dump_logits: Option<PathBuf>,
    #[command(flatten)]
    pub output: OutputArgs,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum BosArg {
    None,
    PerWindow,
    PerDocument,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum RunnerArg {
    /// Pure Rust on CPU (candle).
    Native,
    /// torch + transformers in a Python subprocess, on the user's GPU (runners/).
    Transformers,
    /// The user's own llama.cpp `llama-perplexity` (any build: CPU, CUDA, Metal, Vulkan), both
    /// models as GGUF files, llama.cpp's protocol (--positions second-half --direction forward,
    /// one --context-length).
    Llamacpp,
}

/// Settings of `--runner llamacpp` (llama-perplexity's flags; the KV cache is --kv-cache).
#[derive(Debug, Args)]
pub struct LlamacppArgs {
    /// The `llama-perplexity` binary (default: on PATH).
    #[arg(long, value_name = "PATH")]
    pub llamacpp_bin: Option<PathBuf>,
    /// The `llama-server` binary that generates --turns (default: the one beside
    /// llama-perplexity, the same build).
    #[arg(long, value_name = "PATH")]
    pub llamacpp_server: Option<PathBuf>,
    /// `-ngl`: layers offloaded to the GPU (a number, auto or all; 0 runs on the CPU).
    #[arg(long, value_name = "N")]
    pub llamacpp_gpu_layers: Option<String>,
    /// `-fa`: flash attention on, off or auto (llama.cpp's default: auto).
    #[arg(long, value_name = "ON|OFF|AUTO")]
    pub llamacpp_flash_attn: Option<String>,
    /// `-b`: logical batch size.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub llamacpp_batch: Option<u32>,
    /// `-ub`: physical batch size.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub llamacpp_ubatch: Option<u32>,
    /// Skip llama.cpp's own KLD pass, which prints its statistics for the printout gate (one
    /// process fewer; a rerun without the gate is never reproduced).
    #[arg(long)]
    pub llamacpp_no_gate: bool,
}

/// Settings of `--runner transformers` (ignored by the native runner).
#[derive(Debug, Args)]
pub struct TransformersArgs {
    /// Python interpreter with torch and transformers (default: $CARDPROOF_PYTHON, else python3).
    #[arg(long, value_name = "PATH")]
    pub python: Option<PathBuf>,
    /// Where the models run: cuda, cuda:N, auto (every GPU, placed by accelerate's
    /// device_map="auto") or cpu.
    #[arg(long, value_name = "DEVICE", default_value = "cuda")]
    pub device: String,
    /// dtype the models are loaded and run in (default: bfloat16; `verify` follows the card's
    /// runtime when it names transformers).
    #[arg(long, value_enum)]
    pub torch_dtype: Option<TorchDtypeArg>,
    /// Attention implementation: sdpa, eager, flash_attention_2, flex_attention (default: sdpa;
    /// `verify` follows the card's runtime when it names transformers).
    #[arg(long, value_name = "IMPL")]
    pub attention: Option<String>,
    /// The Gated DeltaNet kernel of a hybrid model's linear-attention layers: fla
    /// (flash-linear-attention's chunked kernel), fla_recurrent (its fused recurrent kernel for
    /// every token), torch (transformers' own functions) or torch_recurrent (its recurrent
    /// function for every token); default: transformers' choice.
    #[arg(long, value_name = "KERNEL")]
    pub gdn_kernel: Option<String>,
    /// Tokens per prefill chunk, the KV cache kept between chunks (default: the whole window in
    /// one pass when it fits the memory plan, else the longest power-of-two chunk that does).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub chunk_size: Option<u32>,
    /// Rows per output-head chunk (default: planned from free memory).
    #[arg(long, value_name = "N")]
    pub head_rows: Option<u32>,
    /// Allow TF32 matrix products (recorded; changes the numbers).
    #[arg(long)]
    pub tf32: bool,
    /// torch.use_deterministic_algorithms(True) (recorded).
    #[arg(long)]
    pub deterministic: bool,
    /// Let transformers run code shipped with the checkpoint. Off unless given.
    #[arg(long)]
    pub trust_remote_code: bool,
    /// Measure the candidate's weights against themselves under several settings, the first as
    /// the baseline: `attention=eager,sdpa` (transformers runner; the cross-kernel noise floor)
    /// or `kv_cache=none,q8_0,q4_0` (either runner; KV-cache schemes as --kv-cache names them).
    /// Gives the KL of each setting and where top-1 flips sit along position.
    #[arg(long, value_name = "KNOB=A,B")]
    pub sweep: Option<String>,
    /// A runner program to use instead of the embedded one (development).
    #[arg(long, value_name = "FILE", hide = true)]
    pub runner_script: Option<PathBuf>,
    /// Plan memory as if only this many bytes were free (tests).
    #[arg(long, value_name = "BYTES", hide = true)]
    pub memory_limit: Option<u64>,
    /// Where the reference's hidden states wait for the candidate when the models run one
    /// after the other: auto, device, host or disk.
    #[arg(long, value_name = "WHERE", default_value = "auto", hide = true)]
    pub keep_hidden: String,
    /// Write the first 64 scored rows' logits of both models here (checks of the device's
    /// reduction against `cardproof kld`).
    #[arg(long, value_name = "DIR", hide = true)]
    pub runner_dump: Option<PathBuf>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum TorchDtypeArg {
    Bfloat16,
    Float16,
    Float32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum EmulateArg {
    Reference,
    LlamacppCpu,
    LlamacppCpuNoFa,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ComputeArg {
    F32,
    F64,
    Bf16,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum DirectionArg {
    Forward,
    Reverse,
    Both,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum VocabArg {
    Full,
    TopK,
    Threshold,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum TailArg {
    Lumped,
    Dropped,
    Renormalized,
}

/// `--positions`: a policy, with the role or segment a `role:`/`span:` policy names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PositionsArg {
    pub policy: cardproof::disclosure::PositionPolicy,
    pub role: Option<cardproof::kld::protocol::Role>,
    pub span: Option<cardproof::kld::protocol::Segment>,
}

fn parse_positions(value: &str) -> Result<PositionsArg, String> {
    use cardproof::disclosure::PositionPolicy as P;
    use cardproof::kld::protocol::{Role, Segment};
    let plain = |policy| PositionsArg {
        policy,
        role: None,
        span: None,
    };
    match value.split_once(':') {
        None => match value {
            "all" => Ok(plain(P::All)),
            "stride" => Ok(plain(P::Stride)),
            "second-half" | "second_half" => Ok(plain(P::SecondHalf)),
            "from" => Ok(plain(P::From)),
            "role" | "span" => Err(format!(
                "`{value}` needs what it selects: {value}:{}",
                if value == "role" { "assistant" } else { "tool-call" }
            )),
            _ => Err(
                "expected all, stride, second-half, from, role:ROLE or span:SEGMENT".to_owned(),
            ),
        },
        Some(("role", name)) => Role::parse(name)
            .map(|r| PositionsArg {
                policy: P::Role,
                role: Some(r),
                span: None,
            })
            .ok_or_else(|| {
                format!("unknown role `{name}` (system, developer, user, assistant, tool, other)")
            }),
        Some(("span", name)) => Segment::parse(name)
            .map(|s| PositionsArg {
                policy: P::Span,
                role: None,
                span: Some(s),
            })
            .ok_or_else(|| {
                format!(
                    "unknown segment `{name}` (content, reasoning, tool-call, tool-result, scaffolding)"
                )
            }),
        Some((other, _)) => Err(format!("unknown policy `{other}:` (role: or span:)")),
    }
}

#[derive(Debug, Args)]
pub struct InspectArgs {
    /// A .safetensors or .gguf file, a checkpoint directory, or hf:ORG/NAME[@REV] (headers only,
    /// by HTTP Range requests).
    #[arg(default_value = ".")]
    pub path: PathBuf,
    /// List every module, not only the summary.
    #[arg(long)]
    pub modules: bool,
    #[command(flatten)]
    pub output: OutputArgs,
}

#[derive(Debug, Args)]
pub struct HashArgs {
    /// A checkpoint directory, a single file, or hf:ORG/NAME[@REV] (downloaded into the Hugging
    /// Face cache and verified first).
    #[arg(default_value = ".")]
    pub path: PathBuf,
    /// Worker threads (default: every core).
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..))]
    pub threads: Option<u16>,
    /// Also hash what a checkpoint leaves out: the card (README.md), .gitattributes, .git/,
    /// .cache/ and cardproof report sets (report.json, positions.safetensors, ...).
    #[arg(long)]
    pub all: bool,
    #[command(flatten)]
    pub output: OutputArgs,
}

#[derive(Debug, Args)]
pub struct LintArgs {
    /// Markdown cards, model directories holding README.md, or hf:ORG/NAME[@REV] (only the card
    /// is fetched): each linted, one summary (and one SARIF log) for all.
    #[arg(default_value = ".", num_args = 1..)]
    pub paths: Vec<PathBuf>,
    /// Leave out the findings of this code (repeatable; `cardproof lint` names each finding's
    /// code). Adds to the settings file's `lint.ignore`.
    #[arg(long, value_name = "CODE")]
    pub ignore: Vec<String>,
    /// The settings file (default: .cardproof.yaml in the working directory, when present; never
    /// one in the linted directory): `lint: {ignore: [CODE, ...]}`.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Skip what is not a model card (for hooks that match every README.md): a local Markdown
    /// file without front matter whose directory holds no config.json and no weights.
    #[arg(long)]
    pub model_cards: bool,
    #[command(flatten)]
    pub output: OutputArgs,
}

#[derive(Debug, Args)]
pub struct OutputArgs {
    /// Output format: for people, or a document on stdout. `lint` prints all four, `check`
    /// human, json and sarif, every other command human and json; a format a command does not
    /// print is refused (exit 2). With json, stderr does not repeat what the document holds.
    #[arg(long, value_enum, default_value_t = FormatArg::Human)]
    pub format: FormatArg,
    /// Same as `--format json`.
    #[arg(long, conflicts_with = "format")]
    pub json: bool,
    /// When to colour human output (NO_COLOR is respected by `auto`).
    #[arg(long, value_enum, default_value_t = ColorArg::Auto)]
    pub color: ColorArg,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum FormatArg {
    Human,
    Json,
    /// A Markdown table (lint only).
    Markdown,
    /// SARIF 2.1.0 (lint and check only), for code scanning.
    Sarif,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ColorArg {
    Auto,
    Always,
    Never,
}
