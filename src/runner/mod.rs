//! Runners turn (model, token windows, scored rows) into logits; the [`crate::kld`] module
//! judges every runner with the same statistics code.

pub mod child;
#[cfg(feature = "native")]
pub mod exchange;
pub mod kv_record;
pub mod llamacpp;
pub mod llamacpp_server;
pub mod native;
pub mod tokens;
#[cfg(feature = "native")]
pub mod transformers;
#[cfg(feature = "native")]
pub mod transformers_carry;
#[cfg(feature = "native")]
pub mod transformers_flags;

use serde_json::Value;

use crate::error::Result;

/// A loaded model that produces logits.
pub trait Runner: Sync {
    /// Entries per logit row (the model's vocabulary, padding included).
    fn vocab(&self) -> usize;
    /// Run one window; logits are then read at scored rows, a chunk at a time.
    fn window<'a>(&'a self, ids: &[u32]) -> Result<Box<dyn WindowLogits + 'a>>;
    /// What this runner is and how it was configured, for the measurement's environment record.
    fn environment(&self) -> Value;
    /// Sets what the run computes once from its first forward pass (vLLM's computed KV-cache
    /// scales), on the measurement's first window, before windows run in parallel. A runner
    /// with nothing to calibrate does nothing.
    fn calibrate(&self, _ids: &[u32]) -> Result<()> {
        Ok(())
    }
}

/// One window's forward pass, kept so the output head can run on chunks of rows.
pub trait WindowLogits: Send {
    /// Logits `[rows.len(), vocab]` row-major, f32.
    fn logits(&self, rows: &[usize]) -> Result<Vec<f32>>;
    /// [`WindowLogits::logits`] written into `out` (replacing what it held), whose allocation a
    /// caller reuses from chunk to chunk: a chunk's rows are tens of megabytes, and fresh pages
    /// cost their faults and zeroing every time.
    fn logits_into(&self, rows: &[usize], out: &mut Vec<f32>) -> Result<()> {
        *out = self.logits(rows)?;
        Ok(())
    }
    /// The true next token's NLL at a row when the logits alone do not give it exactly (a top-K
    /// reference artifact stores it separately).
    fn token_nll(&self, _row: usize) -> Option<f64> {
        None
    }
}

#[cfg(feature = "native")]
mod native_runner {
    use super::*;
    use crate::error::Error;
    use native::NativeModel;
    use serde_json::json;

    struct NativeWindow<'a> {
        model: &'a NativeModel,
        hidden: candle_core::Tensor,
    }

    impl WindowLogits for NativeWindow<'_> {
        fn logits(&self, rows: &[usize]) -> Result<Vec<f32>> {
            self.model
                .decoder
                .logits_at(&self.hidden, rows)
                .map_err(|e| Error::runner(&self.model.path, format!("forward pass failed: {e}")))
        }

        fn logits_into(&self, rows: &[usize], out: &mut Vec<f32>) -> Result<()> {
            self.model
                .decoder
                .logits_into(&self.hidden, rows, out)
                .map_err(|e| Error::runner(&self.model.path, format!("forward pass failed: {e}")))
        }
    }

    impl Runner for NativeModel {
        fn vocab(&self) -> usize {
            self.decoder.config.vocab
        }

        fn window<'a>(&'a self, ids: &[u32]) -> Result<Box<dyn WindowLogits + 'a>> {
            if let Some(&bad) = ids
                .iter()
                .find(|&&t| t as usize >= self.decoder.config.vocab)
            {
                // The tokenizer's ids do not belong with this model.
                return Err(Error::mismatch(
                    &self.path,
                    None,
                    format!(
                        "token id {bad} is outside the model's vocabulary of {}",
                        self.decoder.config.vocab
                    ),
                ));
            }
            let hidden = self
                .decoder
                .hidden(ids)
                .map_err(|e| Error::runner(&self.path, format!("forward pass failed: {e}")))?;
            Ok(Box::new(NativeWindow {
                model: self,
                hidden,
            }))
        }

        fn calibrate(&self, ids: &[u32]) -> Result<()> {
            self.decoder
                .calibrate_kv_scales(ids)
                .map(|_| ())
                .map_err(|e| Error::runner(&self.path, format!("KV-scale calibration failed: {e}")))
        }

        fn environment(&self) -> Value {
            let r = &self.decoder.report;
            let mut env = json!({
                "architecture": self.decoder.config.arch.as_str(),
                "format": self.format,
                "weights": r.schemes,
                "activation_emulation": r.activations,
                "kv_cache": r.kv_cache.clone().unwrap_or_else(|| self.decoder.compute.as_str().to_owned()),
            });
            if let Some(experts) = &r.experts {
                env["experts"] = json!(experts);
            }
            env
        }
    }
}
