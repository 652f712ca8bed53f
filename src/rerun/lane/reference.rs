//! The reference sources that are checkpoints: one the native runner loads and holds (its rows
//! in this process), and one an engine runs itself beside its candidates.

use crate::rerun::turns::TurnWork;
use crate::runner::native::generate::{Generated, GenerationTiming};
use std::path::Path;

use super::{Bound, Pass, ReferenceRecord, ReferenceSource, Rows, Stage};
use crate::checkpoint::hash::Manifest;
use crate::error::{Error, Result};
use crate::rerun::document::ModelRecord;
use crate::rerun::identity::{identity_of, root_digest, tokenizer_record};
use crate::rerun::preflight::{Identity, Preflight};
use crate::rerun::score::{self, EvalInput};
use crate::rerun::{NoiseFloor, NoiseFloorRun, Request};
use crate::runner::Runner;
use crate::runner::native::{self, ComputeDtype, Emulate, NativeModel, StateDtype};
use crate::runner::tokens::{TokenStream, TokenizerFile};

/// A reference checkpoint loaded by the native runner, with the eval text's tokens.
pub(crate) struct CheckpointReference<'a> {
    path: &'a Path,
    model: NativeModel,
    record: ModelRecord,
    compute: ComputeDtype,
    text: &'a Path,
    tokenizer: TokenizerFile,
    stream: TokenStream,
}

impl<'a> CheckpointReference<'a> {
    /// Load the reference in `compute` (keeping the exact f32 recurrent state: the reference
    /// semantics; the state knob emulates the candidate's engine) with the KV cache a sweep
    /// asks of it, hashed while it loads.
    pub fn load(
        r: &Request<'a>,
        pre: &mut Preflight,
        path: &'a Path,
        (compute, emulate): (ComputeDtype, Emulate),
        pass: Pass,
        stage: Stage,
    ) -> Result<CheckpointReference<'a>> {
        let (text, tokenizer, stream) = super::tokenized(r, pre)?;
        stage(match pass {
            Pass::Streamed => "loading and hashing the models",
            Pass::Kept => "loading the reference",
        });
        let (model, digest) = rayon::join(
            || -> Result<NativeModel> {
                let mut model = native::load(path, compute, emulate, StateDtype::F32)?;
                if let Some(setting) = r.reference_kv_cache {
                    model.decoder.set_kv_cache(setting).map_err(|e| {
                        Error::usage(path, format!("KV cache {}: {e}", setting.name()))
                    })?;
                }
                set_prefill_chunk(&mut model, r, path)?;
                Ok(model)
            },
            || root_digest(path, r.threads, pre.reference_manifest.as_ref()),
        );
        let model = model?;
        let record = identity_of(&model, path, digest?);
        Ok(CheckpointReference {
            path,
            model,
            record,
            compute,
            text,
            tokenizer,
            stream,
        })
    }
}

impl ReferenceSource for CheckpointReference<'_> {
    fn generate_turns(
        &self,
        work: &TurnWork,
        stage: Stage,
    ) -> Result<(Vec<Generated>, Option<GenerationTiming>)> {
        let (generated, timing) = work.generate(&self.model, &|done, total| {
            stage(&format!("generating the reference's turns {done}/{total}"))
        })?;
        Ok((generated, Some(timing)))
    }

    fn bind<'s>(
        &'s self,
        candidate: Option<&'s NativeModel>,
        r: &Request,
        _stage: Stage,
    ) -> Result<Bound<'s>> {
        let width = candidate.map_or_else(|| self.model.vocab(), |c| c.vocab());
        Ok(Bound {
            rows: Rows::Held(&self.model),
            eval: EvalInput {
                stream: &self.stream,
                text_path: self.text,
                bos_id: self.tokenizer.bos_id,
                tokenizer_vocab: self.tokenizer.vocab_size,
            },
            options: super::with_padding(r, width),
            every_row: true,
            text_path: None,
            recorded: ReferenceRecord {
                model: self.record.clone(),
                tokenizer: Some(tokenizer_record(&self.tokenizer)),
                artifact: None,
            },
        })
    }

    /// The reference against itself computed in a second dtype (f64 against f32).
    fn noise_floor(&self, bound: &Bound) -> Result<Option<NoiseFloor>> {
        let other = if self.compute == ComputeDtype::F64 {
            ComputeDtype::F32
        } else {
            ComputeDtype::F64
        };
        let mut twin = native::load(
            self.path,
            other,
            Emulate::ReferenceSemantics,
            StateDtype::F32,
        )?;
        twin.decoder
            .set_prefill_chunk(bound.options.prefill_chunk)
            .map_err(|e| Error::usage(self.path, format!("--prefill-chunk: {e}")))?;
        let mut floor_options = bound.options.clone();
        floor_options.bootstrap.resamples = floor_options.bootstrap.resamples.min(200);
        let f = score::measure_models(&self.model, &twin, &bound.eval, &floor_options, &|_, _| {})?;
        Ok(Some(NoiseFloor::Measured {
            what: format!(
                "the reference against itself, computed in {} vs {}",
                self.compute.as_str(),
                other.as_str()
            ),
            runs: f
                .runs
                .iter()
                .map(|run| NoiseFloorRun {
                    context_length: run.context_length,
                    metrics: run.summary.metrics.clone(),
                })
                .collect(),
        }))
    }

    fn check_unchanged(&self) -> Result<()> {
        self.model.check_unchanged()
    }
}

/// A reference checkpoint that the candidates' engine runs itself (transformers, llama.cpp):
/// the path, with what the pre-flight found (its manifest, the text's digests, the tokens when
/// cardproof tokenizes).
pub(crate) struct EngineReference<'a> {
    pub path: &'a Path,
    pub manifest: Option<Manifest>,
    pub identity: Identity,
    pub text: Option<&'a Path>,
    pub tokenized: Option<(TokenizerFile, TokenStream)>,
}

impl<'a> EngineReference<'a> {
    pub fn new(r: &Request<'a>, pre: Preflight, path: &'a Path) -> EngineReference<'a> {
        EngineReference {
            path,
            manifest: pre.reference_manifest,
            identity: pre.identity,
            text: r.eval_text,
            tokenized: pre.tokenized,
        }
    }

    /// The scoring's input, where cardproof tokenized the text.
    pub fn eval(&self) -> Result<EvalInput<'_>> {
        match (self.text, &self.tokenized) {
            (Some(text), Some((tokenizer, stream))) => Ok(EvalInput {
                stream,
                text_path: text,
                bos_id: tokenizer.bos_id,
                tokenizer_vocab: tokenizer.vocab_size,
            }),
            _ => Err(Error::internal(
                self.path,
                "the lane was started without its pre-flight's eval text and tokens",
            )),
        }
    }
}

impl ReferenceSource for EngineReference<'_> {
    fn bind<'s>(
        &'s self,
        _candidate: Option<&'s NativeModel>,
        r: &Request,
        _stage: Stage,
    ) -> Result<Bound<'s>> {
        Err(Error::internal(
            r.candidate,
            "a checkpoint the engine runs has no rows in this process",
        ))
    }

    fn engine(&self) -> Option<&EngineReference<'_>> {
        Some(self)
    }
}

/// The protocol's prefill chunk on a native model of this run (checked against a KV-cache
/// scheme's own chunk).
pub(super) fn set_prefill_chunk(model: &mut NativeModel, r: &Request, path: &Path) -> Result<()> {
    model
        .decoder
        .set_prefill_chunk(r.options.prefill_chunk)
        .map_err(|e| Error::usage(path, format!("--prefill-chunk: {e}")))
}
