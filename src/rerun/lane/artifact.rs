//! The reference sources that are files of rows: cardproof's reference artifact (`reference
//! export`) and llama.cpp's `--kl-divergence-base` file, each read and vouched for by the
//! pre-flight, and bound to a native candidate only after everything that must match does: the
//! tokenizer, the eval text, the logit width, the protocol, the output head.

use std::path::Path;

use sha2::Digest as _;

use super::{Bound, ReferenceRecord, ReferenceSource, Rows, Stage};
use crate::error::{Error, Result};
use crate::rerun::artifact::{Artifact, ArtifactRunner, ArtifactSource, Header, Kind, Vouch};
use crate::rerun::document::{ArtifactRecord, ModelRecord, Padding};
use crate::rerun::identity::identity;
use crate::rerun::score::{self, EvalInput};
use crate::rerun::{MeasureOptions, Request};
use crate::runner::Runner;
use crate::runner::native::{self, ComputeDtype, Emulate, NativeModel, StateDtype};
use crate::runner::tokens::{self, TokenStream, TokenizerFile};

/// A compact reference artifact as the reference: its tokens, the candidate's tokenizer
/// checked to be the one it was made with.
pub(crate) struct ArtifactReference<'a> {
    source: ArtifactSource<'a>,
    artifact: Artifact,
    vouch: Vouch,
    tokenizer: TokenizerFile,
    stream: TokenStream,
    eval_text: Option<&'a Path>,
    threads: usize,
}

impl<'a> ArtifactReference<'a> {
    /// The artifact the pre-flight read and vouched for, its tokenizer and eval text checked.
    pub fn open(
        r: &Request<'a>,
        pre: &mut crate::rerun::preflight::Preflight,
        source: ArtifactSource<'a>,
    ) -> Result<ArtifactReference<'a>> {
        let (Some(artifact), Some(vouch)) = (pre.artifact.take(), pre.vouch.take()) else {
            return Err(Error::internal(
                source.file,
                "the artifact's lane was started without its pre-flight (the artifact read and vouched for)",
            ));
        };
        let h = &artifact.header;
        let tokenizer = tokens::load_tokenizer(&tokens::tokenizer_path(r.candidate))?;
        check_tokenizer(h, &tokenizer)?;
        if let Some(text) = r.eval_text {
            check_eval_text(h, text)?;
        }
        let stream = TokenStream::of_ids(
            artifact.tokens.clone(),
            h.eval.text_sha256.clone().unwrap_or_default(),
        );
        Ok(ArtifactReference {
            source,
            artifact,
            vouch,
            tokenizer,
            stream,
            eval_text: r.eval_text,
            threads: r.threads,
        })
    }
}

impl ReferenceSource for ArtifactReference<'_> {
    fn bind<'s>(
        &'s self,
        candidate: Option<&'s NativeModel>,
        r: &Request,
        stage: Stage,
    ) -> Result<Bound<'s>> {
        let path = self.source.file;
        let candidate = candidate.ok_or_else(|| {
            Error::internal(path, "an artifact's rows are bound to one candidate")
        })?;
        let h = &self.artifact.header;
        let width = candidate.decoder.config.vocab;
        check_width(h, r.candidate, width)?;
        let options = super::with_padding(r, width);
        let vocab_size = options.vocab_size.unwrap_or(self.tokenizer.vocab_size);
        check_protocol(&self.artifact, path, &options, vocab_size, width)?;
        if h.kind == Kind::Hidden {
            check_lm_head(h, r.candidate, candidate)?;
        }
        let windows: Vec<tokens::Windows> = options
            .context_lengths
            .iter()
            .map(|&l| tokens::windows(&self.stream, path, l, options.bos, self.tokenizer.bos_id))
            .collect::<Result<_>>()?;
        // The reference's LM head, for a hidden-state artifact, is the candidate's (whose
        // digest was just checked to be the reference's).
        let head = move |x: Vec<f32>| -> Result<Vec<f32>> {
            candidate
                .decoder
                .head_from_rows(x)
                .map_err(|e| Error::runner(&candidate.path, format!("lm_head failed: {e}")))
        };
        let runner = ArtifactRunner::new(
            &self.artifact,
            &windows,
            (h.kind == Kind::Hidden).then(|| Box::new(head) as crate::rerun::artifact::Head<'s>),
        )?;
        let spot_check = match self.source.reference {
            Some(reference) => Some(spot_check(
                &runner,
                &windows,
                reference,
                (&options, vocab_size),
                self.threads,
                stage,
            )?),
            None => None,
        };
        let record = reference_record(&runner);
        Ok(Bound {
            rows: Rows::Built(Box::new(runner)),
            eval: EvalInput {
                stream: &self.stream,
                text_path: path,
                bos_id: self.tokenizer.bos_id,
                tokenizer_vocab: self.tokenizer.vocab_size,
            },
            options,
            every_row: false,
            text_path: Some(self.eval_text.map(|t| t.display().to_string())),
            recorded: ReferenceRecord {
                model: record,
                tokenizer: None,
                artifact: Some(ArtifactRecord {
                    path: path.display().to_string(),
                    sha256: Some(self.artifact.sha256.clone()),
                    kind: serde_json::to_value(h.kind)
                        .ok()
                        .and_then(|v| v.as_str().map(str::to_owned))
                        .unwrap_or_default(),
                    bound: self.artifact.bound(),
                    vouch: Some(self.vouch.clone()),
                    spot_check,
                }),
            },
        })
    }
}

/// The candidate's tokenizer must be the one the artifact was made with: the artifact's token
/// stream is what that tokenizer made of the eval text.
fn check_tokenizer(h: &Header, tokenizer: &TokenizerFile) -> Result<()> {
    if h.eval.tokenizer_sha256.as_deref() != Some(tokenizer.sha256.as_str()) {
        return Err(Error::mismatch(
            &tokenizer.path,
            None,
            format!(
                "differs from the tokenizer the artifact was made with (sha256 {} vs {})",
                tokenizer.sha256,
                crate::rerun::artifact::stated_text(&h.eval.tokenizer_sha256)
            ),
        ));
    }
    Ok(())
}

/// An eval text given beside an artifact (which carries its own tokens) must be the text the
/// artifact was exported from, byte for byte.
fn check_eval_text(h: &Header, text: &Path) -> Result<()> {
    let bytes = crate::files::read_capped(text, tokens::MAX_EVAL_TEXT_BYTES, "an eval text")?;
    let digest = crate::digest::hex(&sha2::Sha256::digest(&bytes));
    if h.eval.text_sha256.as_deref() != Some(digest.as_str()) {
        return Err(Error::mismatch(
            text,
            None,
            format!(
                "is not the artifact's eval text (sha256 {digest} vs {})",
                crate::rerun::artifact::stated_text(&h.eval.text_sha256)
            ),
        ));
    }
    Ok(())
}

/// The candidate's logit rows must be as wide as the artifact's reference's, entry for entry.
fn check_width(h: &Header, candidate: &Path, width: usize) -> Result<()> {
    if width != h.logit_width {
        return Err(Error::mismatch(
            candidate,
            None,
            format!(
                "vocabulary mismatch: {width} logit entries, the artifact's reference has {}",
                h.logit_width
            ),
        ));
    }
    Ok(())
}

/// The run's protocol must be the one the artifact was exported for: it holds rows for those
/// windows, positions and vocabulary only.
fn check_protocol(
    artifact: &Artifact,
    path: &Path,
    options: &MeasureOptions,
    vocab_size: usize,
    width: usize,
) -> Result<()> {
    let requested = score::run_protocol(options, vocab_size, Padding::of(vocab_size, width, width));
    let differences = artifact.protocol_differences(&requested);
    if !differences.is_empty() {
        return Err(Error::mismatch(
            path,
            None,
            format!(
                "was exported for another protocol: {}",
                differences.join("; ")
            ),
        ));
    }
    Ok(())
}

/// A hidden-state artifact's logits are recomputed with the candidate's lm_head, which must
/// therefore be the reference's (by digest).
fn check_lm_head(h: &Header, path: &Path, candidate: &NativeModel) -> Result<()> {
    if h.reference.lm_head_sha256.as_deref() != Some(candidate.lm_head_sha256.as_str()) {
        return Err(Error::mismatch(
            path,
            Some("lm_head"),
            format!(
                "is not the reference's (sha256 {} vs {}); a hidden-state artifact needs the reference's lm_head",
                candidate.lm_head_sha256,
                crate::rerun::artifact::stated_text(&h.reference.lm_head_sha256)
            ),
        ));
    }
    Ok(())
}

/// The reference's identity as the artifact's header states it (its weights are not here to
/// hash), with the artifact runner's environment.
fn reference_record(runner: &ArtifactRunner) -> ModelRecord {
    let reference = &runner.artifact.header.reference;
    let text = |v: &Option<String>, default: &str| v.as_deref().unwrap_or(default).to_owned();
    ModelRecord {
        path: text(&reference.path, ""),
        format: text(&reference.format, "artifact"),
        manifest_sha256: text(&reference.manifest_sha256, ""),
        lm_head_sha256: text(&reference.lm_head_sha256, ""),
        stored_dtype: text(&reference.stored_dtype, "unknown"),
        runner: Runner::environment(runner),
        hub: None,
    }
}

/// The artifact's rows recomputed, for a seeded sample of windows, from the reference's own
/// weights (loaded as `reference export` loads them), which must be the reference the artifact
/// names.
fn spot_check(
    runner: &ArtifactRunner,
    windows: &[tokens::Windows],
    reference: &Path,
    (options, vocab_size): (&MeasureOptions, usize),
    threads: usize,
    stage: Stage,
) -> Result<crate::rerun::artifact::SpotCheck> {
    use crate::rerun::artifact::spot_check::{Scoring, spot_check};
    stage("loading the reference for a spot check");
    let model = native::load(
        reference,
        ComputeDtype::F32,
        Emulate::ReferenceSemantics,
        StateDtype::F32,
    )?;
    let named = runner
        .artifact
        .header
        .reference
        .manifest_sha256
        .as_deref()
        .unwrap_or_default();
    let id = identity(&model, reference, threads, None)?;
    if id.manifest_sha256 != named {
        return Err(Error::mismatch(
            reference,
            None,
            format!(
                "is not the reference {} names (root sha256 {}, the artifact names {named:?}): the spot check recomputes the artifact's rows from its reference's weights",
                runner.artifact.path.display(),
                id.manifest_sha256
            ),
        ));
    }
    let mut seed = [0u8; 8];
    getrandom::fill(&mut seed).map_err(|e| {
        Error::internal(reference, format!("no randomness for the spot check: {e}"))
    })?;
    stage("spot-checking the artifact");
    let checked = spot_check(
        runner,
        windows,
        &model,
        &id.manifest_sha256,
        &Scoring {
            positions: options.positions,
            mode: options.vocab,
            vocab_size,
        },
        u64::from_le_bytes(seed),
    )?;
    model.check_unchanged()?;
    Ok(checked)
}

/// A llama.cpp `--kl-divergence-base` file as the reference: its token stream and rows (their
/// 16-nat window stated in the output).
pub(crate) struct BaseFileReference<'a> {
    path: &'a Path,
    base: crate::kld::llamacpp::BaseFile,
    vouch: Vouch,
    stream: TokenStream,
    tokenizer: Option<TokenizerFile>,
}

impl<'a> BaseFileReference<'a> {
    /// The base file the pre-flight read and vouched for; a spot check is refused (its rows are
    /// llama.cpp's own pass, stored as uint16 codes).
    pub fn open(
        r: &Request<'a>,
        pre: &mut crate::rerun::preflight::Preflight,
        source: ArtifactSource<'a>,
    ) -> Result<BaseFileReference<'a>> {
        let path = source.file;
        let (Some(base), Some(vouch)) = (pre.base_file.take(), pre.vouch.take()) else {
            return Err(Error::internal(
                path,
                "the base file's lane was started without its pre-flight (the file read and vouched for)",
            ));
        };
        if source.reference.is_some() {
            return Err(Error::usage(
                path,
                "a llama.cpp base file cannot be spot-checked against the reference's weights (its rows are uint16 codes of llama.cpp's own pass); drop --reference, or export a cardproof artifact",
            ));
        }
        let stream = TokenStream::of_ids(
            base.tokens.iter().map(|&t| t as u32).collect(),
            String::new(),
        );
        Ok(BaseFileReference {
            path,
            base,
            vouch,
            stream,
            tokenizer: tokens::load_tokenizer(&tokens::tokenizer_path(r.candidate)).ok(),
        })
    }
}

impl ReferenceSource for BaseFileReference<'_> {
    fn bind<'s>(
        &'s self,
        candidate: Option<&'s NativeModel>,
        r: &Request,
        _stage: Stage,
    ) -> Result<Bound<'s>> {
        use crate::rerun::artifact::llamacpp::{BaseFileRunner, WINDOW_NOTE};
        let path = self.path;
        let candidate = candidate.ok_or_else(|| {
            Error::internal(path, "a base file's rows are bound to one candidate")
        })?;
        let width = self.base.n_vocab as usize;
        if candidate.decoder.config.vocab != width {
            return Err(Error::mismatch(
                r.candidate,
                None,
                format!(
                    "vocabulary mismatch: {} logit entries, the base file has {}",
                    candidate.decoder.config.vocab, self.base.n_vocab
                ),
            ));
        }
        let bos_id = self
            .tokenizer
            .as_ref()
            .and_then(|t| t.bos_id)
            .or(candidate.bos_id);
        let tokenizer_vocab = self.tokenizer.as_ref().map_or(width, |t| t.vocab_size);
        let options = super::with_padding(r, width);
        let vocab_size = options.vocab_size.unwrap_or(tokenizer_vocab);
        let requested =
            score::run_protocol(&options, vocab_size, Padding::of(vocab_size, width, width));
        let windows = tokens::windows(
            &self.stream,
            path,
            self.base.n_ctx as usize,
            options.bos,
            bos_id,
        )?;
        let runner = BaseFileRunner::new(&self.base, &windows)?;
        let differences = runner.protocol_differences(&requested);
        if !differences.is_empty() {
            return Err(Error::mismatch(
                path,
                None,
                format!("holds another protocol: {}", differences.join("; ")),
            ));
        }
        let record = ModelRecord {
            path: path.display().to_string(),
            format: "llamacpp-base".into(),
            manifest_sha256: String::new(),
            lm_head_sha256: String::new(),
            stored_dtype: "uint16 log-probabilities".into(),
            runner: Runner::environment(&runner),
            hub: None,
        };
        Ok(Bound {
            rows: Rows::Built(Box::new(runner)),
            eval: EvalInput {
                stream: &self.stream,
                text_path: path,
                bos_id,
                tokenizer_vocab,
            },
            options,
            every_row: false,
            // A base file holds tokens, not text: no eval text was read.
            text_path: Some(None),
            recorded: ReferenceRecord {
                model: record,
                tokenizer: None,
                artifact: Some(ArtifactRecord {
                    path: path.display().to_string(),
                    sha256: None,
                    kind: "llamacpp_base".into(),
                    bound: WINDOW_NOTE.into(),
                    vouch: Some(self.vouch.clone()),
                    spot_check: None,
                }),
            },
        })
    }
}
