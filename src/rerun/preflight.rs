//! The pre-flight stage: everything about a rerun that can be checked without a forward pass,
//! checked before the first one. A wrong input used to surface only after the measurement (a
//! reference whose digest is not the card's, found after 31 s on a tiny model and hours on a
//! real one), or never (a 2048-token window on a 1024-position model ran silently).
//!
//! [`check`] runs on every [`Request`] ([`super::run`] calls it; `verify` calls it first itself,
//! to compare the identities it gives with the card's before anything is measured) and
//! [`check_export`] on every `reference export`. In order:
//!
//! - the run options in range ([`super::MeasureOptions::check`]);
//! - every output path writable (the dump directory of `--dump-logits`, an export's file);
//!   the output set of `measure` and `verify` is opened before this, see [`crate::outset`];
//! - the eval text readable and tokenized once, with a reference tokenizer the candidate's
//!   equals part by part ([`tokens::check_same_tokenizer`]: a KL divergence between two
//!   vocabularies means nothing);
//! - every context length within each model's trained positions (config.json's
//!   `max_position_embeddings` or its architecture's key, a GGUF file's `context_length`);
//! - enough bootstrap blocks at every context length for the interval to mean something
//!   ([`MIN_BOOTSTRAP_BLOCKS`], [`FEW_BOOTSTRAP_BLOCKS`]);
//! - the reference hashed once (its manifest is handed on to the lane), so the [`Identity`] of
//!   what will be measured is known before anything is.
//!
//! A check that fails is an [`Error`] (exit 2), named after the file and the numbers; one that
//! only makes the numbers weaker is a [`Warning`] the binary prints before the work starts.

use std::path::{Path, PathBuf};

use super::artifact::{Artifact, ArtifactIdentity, Vouch};
use super::{Lane, MeasureOptions, Request};
use crate::checkpoint::hash::{HashOptions, Manifest, hash_path};
use crate::error::{Error, Result};
use crate::runner::native;
use crate::runner::tokens::{self, TokenStream, TokenizerFile};

/// Below this many bootstrap blocks at a context length the interval is refused: one block
/// resamples to itself, so the "interval" has zero width whatever the data.
pub const MIN_BOOTSTRAP_BLOCKS: usize = 2;

/// Below this many bootstrap blocks the interval is kept but a warning names the numbers. A
/// percentile bootstrap of a mean over n blocks is narrower than the t interval by
/// `1.96·sqrt((n-1)/n) / t(0.975, n-1)`: 6% at 30 blocks, 9% at 20, 18% at 10.
pub const FEW_BOOTSTRAP_BLOCKS: usize = 30;

/// What a warning is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Check {
    /// Too few bootstrap blocks for a trustworthy interval.
    BootstrapBlocks,
}

/// A pre-flight finding that does not stop the run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Warning {
    pub check: Check,
    /// The file the numbers come from (the eval text, an artifact).
    pub file: PathBuf,
    pub message: String,
}

impl std::fmt::Display for Warning {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.file.display(), self.message)
    }
}

/// The identities of what a rerun will measure, known before it does (`None`: not known until
/// the lane has loaded it). They are the values the measurement records.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Identity {
    /// The reference's root digest (`measurement.reference.manifest_sha256`).
    pub reference_files_sha256: Option<String>,
    /// The eval text's SHA-256 (`measurement.eval.text_sha256`).
    pub eval_text_sha256: Option<String>,
    /// The eval text's size in bytes, where it was read here (`measurement.eval.text_bytes`).
    pub eval_text_bytes: Option<u64>,
    /// The token stream's digest and length (`measurement.eval.tokens_sha256`, `token_count`).
    pub tokens_sha256: Option<String>,
    pub token_count: Option<usize>,
    /// How a conversation eval text was rendered (`None`: plain text, or no text read).
    pub conversation: Option<crate::conversation::eval::ConversationRecord>,
    /// Whether the eval text was read here (so no `conversation` means plain text).
    pub text_read: bool,
}

/// A request that passed its pre-flight: the warnings to print, the identities, and what was
/// read for the checks, handed on to the lane so nothing is read twice.
pub struct Preflight {
    pub warnings: Vec<Warning>,
    pub identity: Identity,
    /// The reference's tokenizer and the eval text's tokens (lanes that tokenize).
    pub(super) tokenized: Option<(TokenizerFile, TokenStream)>,
    /// The reference's manifest (lanes that hash the reference).
    pub(super) reference_manifest: Option<Manifest>,
    /// The opened reference artifact (its lane).
    pub(super) artifact: Option<Artifact>,
    /// The opened llama.cpp base file (its lane).
    pub(super) base_file: Option<crate::kld::llamacpp::BaseFile>,
    /// Who vouches for the artifact or base file (their lanes).
    pub(super) vouch: Option<Vouch>,
}

impl Preflight {
    /// Nothing checked yet.
    pub(super) fn empty() -> Preflight {
        Preflight {
            warnings: Vec::new(),
            identity: Identity::default(),
            tokenized: None,
            reference_manifest: None,
            artifact: None,
            base_file: None,
            vouch: None,
        }
    }
}

/// The pre-flight of one rerun. `stage` names what it is doing (hashing a large reference
/// takes a while).
pub fn check(r: &Request, stage: &(dyn Fn(&str) + Sync)) -> Result<Preflight> {
    check_hashing(r, stage, true)
}

/// [`check`] for a rerun nothing compares before it runs (`measure`): the native lane's
/// reference is then hashed while the models load, beside the candidate, and the transformers
/// lane's beside the runner program, instead of alone before them (a 17 GB checkpoint in one
/// file is about 9 s of one core, which `measure` at 131k tokens on a GPU spent before the
/// runner started).
pub fn check_deferring_digest(r: &Request, stage: &(dyn Fn(&str) + Sync)) -> Result<Preflight> {
    check_hashing(
        r,
        stage,
        !matches!(r.lane, Lane::Native { .. } | Lane::Transformers { .. }),
    )
}

fn check_hashing(
    r: &Request,
    stage: &(dyn Fn(&str) + Sync),
    reference_digest_now: bool,
) -> Result<Preflight> {
    let o = &r.options;
    o.check()?;
    if let Some(dir) = &o.dump_logits {
        writable_dir(dir)?;
    }
    let mut pre = Preflight::empty();
    if o.positions.needs_labels()
        && matches!(
            r.lane,
            Lane::ReferenceArtifact { .. } | Lane::LlamacppBase { .. }
        )
    {
        return Err(Error::usage(
            r.candidate,
            format!(
                "--positions {}: a reference artifact or llama.cpp base file holds the same rows of every window and no conversation labels; rerun against the reference model",
                o.positions.spelling()
            ),
        ));
    }
    match r.lane {
        Lane::Native { reference, .. } | Lane::Transformers { reference, .. } => {
            model_lane(r, &mut pre, reference, stage, reference_digest_now)?
        }
        Lane::ReferenceArtifact { source, .. } => {
            let artifact = source.file;
            stage("reading the artifact");
            let a = Artifact::open(artifact)?;
            pre.vouch = Some(source.voucher.vouch(&ArtifactIdentity {
                path: artifact,
                sha256: a.sha256.clone(),
                stated: a.stated(),
            })?);
            context_lengths(r.candidate, &o.context_lengths)?;

            pre.identity = Identity {
                reference_files_sha256: Some(
                    a.header
                        .reference
                        .manifest_sha256
                        .clone()
                        .unwrap_or_default(),
                ),
                eval_text_sha256: a.header.eval.text_sha256.clone(),
                eval_text_bytes: None,
                tokens_sha256: Some(tokens::tokens_sha256(&a.tokens)),
                token_count: Some(a.tokens.len()),
                conversation: None,
                text_read: false,
            };
            let stream = TokenStream::of_ids(a.tokens.clone(), String::new());
            let bos_id = tokens::load_tokenizer(&tokens::tokenizer_path(r.candidate))
                .ok()
                .and_then(|t| t.bos_id);
            pre.warnings = bootstrap_blocks(artifact, &stream, o, bos_id)?;
            pre.artifact = Some(a);
        }
        Lane::Llamacpp { reference, .. } => {
            stage("hashing");
            super::llamacpp::preflight(r, &mut pre, reference)?
        }
        Lane::LlamacppBase { source, .. } => {
            stage("reading the base file");
            let base = crate::kld::llamacpp::BaseFile::open(source.file)?;
            stage("hashing the base file");
            pre.vouch = Some(source.voucher.vouch(&ArtifactIdentity {
                path: source.file,
                sha256: crate::checkpoint::hash::hash_file(source.file)?,
                stated: super::artifact::llamacpp::stated(&base),
            })?);
            pre.base_file = Some(base);
            // The base file's window is its own n_ctx (checked against the candidate when the
            // lane opens it); the protocol's lengths are what the candidate is asked to run.
            context_lengths(r.candidate, &o.context_lengths)?;
            // A base file holds no reference digest and no text: the measurement records both
            // as empty, known now.
            pre.identity.reference_files_sha256 = Some(String::new());
            pre.identity.eval_text_sha256 = Some(String::new());
        }
    }
    Ok(pre)
}

/// The lanes that run both models: tokenizers, text, positions, blocks, the reference's digest.
fn model_lane(
    r: &Request,
    pre: &mut Preflight,
    reference: &Path,
    stage: &(dyn Fn(&str) + Sync),
    digest_now: bool,
) -> Result<()> {
    let text = r.eval_text.ok_or_else(|| {
        Error::usage(
            r.candidate,
            "this lane needs the eval text (--eval-text FILE)",
        )
    })?;
    stage("tokenizing");
    let (tokenizer, stream) = tokenize_eval(
        reference,
        r.candidate,
        r.tokenizer,
        text,
        &r.chat_template,
        stage,
    )?;
    for model in [reference, r.candidate] {
        context_lengths(model, &r.options.context_lengths)?;
    }
    pre.warnings = bootstrap_blocks(text, &stream, &r.options, tokenizer.bos_id)?;
    let manifest = if let Some(m) = r.reference_manifest {
        Some(m.clone())
    } else if digest_now {
        stage("hashing");
        Some(hash_path(
            reference,
            &HashOptions {
                threads: Some(r.threads),
                include_all: false,
            },
            &|_| {},
        )?)
    } else {
        None
    };
    pre.identity = Identity {
        reference_files_sha256: manifest.as_ref().map(|m| m.root_sha256.clone()),
        eval_text_sha256: Some(stream.text_sha256.clone()),
        eval_text_bytes: Some(stream.text_bytes),
        tokens_sha256: Some(tokens::tokens_sha256(&stream.ids)),
        token_count: Some(stream.ids.len()),
        conversation: stream.conversation.as_ref().map(|c| c.record.clone()),
        text_read: true,
    };
    pre.reference_manifest = manifest;
    pre.tokenized = Some((tokenizer, stream));
    Ok(())
}

/// The reference's tokenizer (or the one given), checked against the candidate's when it has
/// one, and the eval text tokenized once with it (a conversation file's progress to `stage`).
pub(super) fn tokenize_eval(
    reference: &Path,
    candidate: &Path,
    tokenizer: Option<&Path>,
    eval_text: &Path,
    chat_template: &tokens::ChatTemplateChoice,
    stage: &(dyn Fn(&str) + Sync),
) -> Result<(TokenizerFile, TokenStream)> {
    let tokenizer_path = tokenizer
        .map(Path::to_owned)
        .unwrap_or_else(|| tokens::tokenizer_path(reference));
    let loaded = tokens::load_tokenizer(&tokenizer_path)?;
    let candidate_tokenizer = tokens::tokenizer_path(candidate);
    if tokenizer.is_none() && candidate_tokenizer.exists() {
        tokens::check_same_tokenizer(&loaded, &tokens::load_tokenizer(&candidate_tokenizer)?)?;
    }
    let stream = tokens::tokenize_eval_text(
        &loaded,
        eval_text,
        chat_template,
        reference,
        candidate,
        stage,
    )?;
    Ok((loaded, stream))
}

/// The tokenizer that renders the turns' prompts in a lane whose engine tokenizes the eval text
/// itself (llama.cpp): the one given, else the reference's (`tokenizer.json` beside its GGUF),
/// checked against the candidate's where it has one. Both engines are then given the same ids.
pub(super) fn turn_tokenizer(r: &Request, reference: &Path) -> Result<TokenizerFile> {
    let path = r
        .tokenizer
        .map(Path::to_owned)
        .unwrap_or_else(|| tokens::tokenizer_path(reference));
    let loaded = tokens::load_tokenizer(&path)?;
    let candidate = tokens::tokenizer_path(r.candidate);
    if r.tokenizer.is_none() && candidate.exists() {
        tokens::check_same_tokenizer(&loaded, &tokens::load_tokenizer(&candidate)?)?;
    }
    Ok(loaded)
}

/// What a study's further arm must share with its first: the reference's tokenizer, part by
/// part, and context lengths within the arm's candidate's trained positions.
pub(super) fn check_arm(r: &Request, tokenizer: &TokenizerFile) -> Result<()> {
    let candidate_tokenizer = tokens::tokenizer_path(r.candidate);
    if r.tokenizer.is_none() && candidate_tokenizer.exists() {
        tokens::check_same_tokenizer(tokenizer, &tokens::load_tokenizer(&candidate_tokenizer)?)?;
    }
    context_lengths(r.candidate, &r.options.context_lengths)
}

/// The config.json keys that hold a model's trained positions, by architecture family
/// (Llama/Qwen/Mistral, GPT-2, GPT-J/Falcon-style, MPT, ChatGLM).
const POSITION_KEYS: &[&str] = &[
    "max_position_embeddings",
    "n_positions",
    "n_ctx",
    "max_seq_len",
    "seq_length",
];

/// The positions a model was trained for and where that number is written: config.json's key,
/// or a GGUF file's `context_length`. `None` when the model states none.
pub fn max_positions(model: &Path) -> Result<Option<(usize, PathBuf, String)>> {
    let (path, format) = native::resolve(model)?;
    if format == "gguf" {
        let file = crate::checkpoint::gguf::read_file(&path)?;
        let key = format!("{}.context_length", file.architecture().unwrap_or_default());
        let n = file
            .get(&key)
            .and_then(crate::checkpoint::gguf::GgufValue::as_u64)
            .and_then(|n| usize::try_from(n).ok())
            .filter(|&n| n > 0);
        return Ok(n.map(|n| (n, path, key)));
    }
    let config_path = path.join("config.json");
    let json = crate::files::read_config(&config_path)?;
    let nested = json.get("text_config");
    for key in POSITION_KEYS {
        for (place, value) in [
            ((*key).to_owned(), json.get(*key)),
            (
                format!("text_config.{key}"),
                nested.and_then(|t| t.get(*key)),
            ),
        ] {
            if let Some(v) = value {
                let n = v
                    .as_u64()
                    .and_then(|n| usize::try_from(n).ok())
                    .ok_or_else(|| {
                        Error::format(&config_path, Some(&place), "not a non-negative integer")
                    })?;
                return Ok(Some((n, config_path, place)));
            }
        }
    }
    Ok(None)
}

/// Every context length within the model's trained positions. Past them a RoPE model runs on
/// positions it never saw and its numbers say nothing about the quantization; no flag allows it,
/// because no card's claim is about such a window.
pub(super) fn context_lengths(model: &Path, lengths: &[usize]) -> Result<()> {
    let Some((max, file, key)) = max_positions(model)? else {
        return Ok(());
    };
    if let Some(&l) = lengths.iter().filter(|&&l| l > max).max() {
        return Err(Error::usage(
            &file,
            format!(
                "context length {l} exceeds the model's {key} {max}: it was not trained on windows that long; measure at {max} tokens or fewer"
            ),
        ));
    }
    Ok(())
}

/// The bootstrap blocks each context length gives, as the scoring forms them (from the same
/// plan, [`super::score::plan_runs`]): one per window with a scored row, or runs of scored rows
/// when the text makes a single window.
fn bootstrap_blocks(
    file: &Path,
    stream: &TokenStream,
    o: &MeasureOptions,
    bos_id: Option<u32>,
) -> Result<Vec<Warning>> {
    let mut warnings = Vec::new();
    let eval = super::score::EvalInput {
        stream,
        text_path: file,
        bos_id,
        tokenizer_vocab: 0,
    };
    for plan in super::score::plan_runs(&eval, o)? {
        let l = plan.windows.length;
        let n_windows = plan.windows.windows.len();
        let (blocks, what) = if n_windows == 1 {
            let rows = plan.n_rows();
            let run = (rows / 100).clamp(1, crate::kld::BOOTSTRAP_MAX_RUN);
            (
                rows.div_ceil(run),
                format!("one {l}-token window, its {rows} scored rows in runs of {run}"),
            )
        } else {
            let scored = plan.rows.iter().filter(|r| !r.is_empty()).count();
            let of = if scored == n_windows {
                String::new()
            } else {
                format!(" ({scored} with a token the positions policy selects)")
            };
            (
                scored,
                format!(
                    "{} tokens make {n_windows} windows of {l}{of}",
                    stream.ids.len()
                ),
            )
        };
        if blocks < MIN_BOOTSTRAP_BLOCKS {
            return Err(Error::usage(
                file,
                format!(
                    "context length {l}: {what}, {blocks} bootstrap block; an interval needs at least {MIN_BOOTSTRAP_BLOCKS} (use a longer text or a shorter context length)"
                ),
            ));
        }
        if blocks < FEW_BOOTSTRAP_BLOCKS {
            warnings.push(Warning {
                check: Check::BootstrapBlocks,
                file: file.to_owned(),
                message: format!(
                    "context length {l}: {what}, {blocks} bootstrap blocks; below {FEW_BOOTSTRAP_BLOCKS} the ci95 is too narrow (6% at 30 blocks, 18% at 10): use a longer text or a shorter context length"
                ),
            });
        }
    }
    Ok(warnings)
}

/// A directory output is written into: made if missing, and a file can be created in it.
fn writable_dir(dir: &Path) -> Result<()> {
    std::fs::create_dir_all(dir).map_err(|e| Error::write(dir, e))?;
    tempfile::Builder::new()
        .prefix(".cardproof-probe-")
        .tempfile_in(dir)
        .map(drop)
        .map_err(|e| Error::write(dir, e))
}

/// A file output: its directory is writable, and the path is not a directory.
fn writable_file(file: &Path) -> Result<()> {
    if file.is_dir() {
        return Err(Error::write(
            file,
            std::io::Error::other("is a directory, not a file"),
        ));
    }
    let dir = match file.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    writable_dir(dir).map_err(|e| match e.kind {
        crate::error::ErrorKind::Write(io) => Error::write(file, io),
        _ => e,
    })
}

/// The pre-flight of `reference export`: options, the output file, the reference's positions
/// and the eval text's bootstrap blocks for the protocol exported (tokenizing it under `stage`).
pub fn check_export(
    r: &super::export::ExportRequest,
    stage: &(dyn Fn(&str) + Sync),
) -> Result<Vec<Warning>> {
    r.options.check()?;
    if r.options.positions.needs_labels() {
        return Err(Error::usage(
            r.eval_text,
            format!(
                "--positions {}: an artifact scores the same rows of every window; export with a position policy that does not select by role or span",
                r.options.positions.spelling()
            ),
        ));
    }
    writable_file(r.out)?;
    context_lengths(r.model, &r.options.context_lengths)?;
    if r.kind == super::export::ExportKind::Llamacpp {
        // A base file keeps the second half of each window; its reader's protocol, not this
        // one, decides the blocks.
        return Ok(Vec::new());
    }
    stage("tokenizing");
    let tokenizer = tokens::load_tokenizer(&tokens::tokenizer_path(r.model))?;
    let stream = tokens::tokenize_eval_text(
        &tokenizer,
        r.eval_text,
        &tokens::ChatTemplateChoice::default(),
        r.model,
        r.model,
        stage,
    )?;
    bootstrap_blocks(r.eval_text, &stream, &r.options, tokenizer.bos_id)
}
