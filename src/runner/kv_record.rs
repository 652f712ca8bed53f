//! The structured KV-cache entry (`runtime.kv_cache`): what `kv_cache_dtype`'s one word leaves
//! out. Engines disagree on what "fp8 KV" or "q4_0 KV" means — where the fp8 scale comes from,
//! whether llama.cpp rotated Q/K/V by a Hadamard matrix before the store (its default since
//! April 2026), whether the current chunk is read back quantized — and each changes the number.
//!
//! The same type is the measurement's record of how its cache ran
//! (`environment.kv_cache`), so a card written from a measurement carries it verbatim and
//! `verify` compares field by field.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

pub use crate::runner::native::kv_cache::{ComputedKvScales, LayerKvScales};
use crate::runner::native::kv_cache::{KvCacheSetting, KvScheme, MAX_RESIDUAL, ResidualWindow};

/// The KV cache as run, K and V separately. Optional: `kv_cache_dtype` stays the one-line name;
/// when both are given they must agree.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(extend("patternProperties" = {"^x[-_]": {}}))]
pub struct KvCache {
    /// The key cache's scheme, by the name of the engine numerics it follows: `none` (the
    /// model dtype), `f16`, `bf16`, llama.cpp `q8_0` / `q4_0` / `q4_1` / `q5_0` / `q5_1` / `iq4_nl`,
    /// exllamav3 `exl3_q2` to `exl3_q8`, vLLM
    /// `fp8_e4m3` / `fp8_e5m2` (per tensor), `int8_per_token_head`, `fp8_per_token_head`.
    #[schemars(length(min = 1))]
    pub k: String,
    /// The value cache's scheme (same names as `k`).
    #[schemars(length(min = 1))]
    pub v: String,
    /// What one scale covers: `element` (a float cast, no scale), `per_tensor`,
    /// `per_token_head`, `block_32` (llama.cpp's blocks and exllamav3's groups of 32 values).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub granularity: Option<KvGranularity>,
    /// Where the scales come from: `unit` (1.0), `checkpoint` (its `k_scale` / `v_scale`),
    /// `computed` (from the first window, vLLM's `calculate_kv_scales`) — the per-tensor
    /// schemes' choices — or `dynamic` (each block or token-head's own, as it is written),
    /// `none` for a float cast.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scale_source: Option<KvScaleSource>,
    /// `hadamard`: Q and K (and V, with the attention output rotated back) multiplied by an
    /// orthonormal Walsh–Hadamard matrix before the store (llama.cpp's default for quantized
    /// caches since April 2026; `LLAMA_ATTN_ROT_DISABLE=1` turns it off); `none`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rotation: Option<KvRotation>,
    /// When stored K/V are read back rounded: `write_then_read` (vLLM, llama.cpp: the current
    /// chunk too) or `quantized_cache_residual` (transformers' QuantizedCache: the first
    /// prefill and a recent window unquantized).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub semantics: Option<KvSemantics>,
    /// Under `quantized_cache_residual`: transformers' `residual_length`, the tokens held
    /// unrounded before the whole history is rounded again (its default 128).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 1048576))]
    pub residual_length: Option<u32>,
    /// Under `quantized_cache_residual`: tokens per prefill chunk (one update of the cache),
    /// which the number depends on (default: the residual length).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 1048576))]
    pub prefill_chunk: Option<u32>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum KvGranularity {
    Element,
    PerTensor,
    PerTokenHead,
    #[serde(rename = "block_32")]
    Block32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum KvScaleSource {
    None,
    Unit,
    Checkpoint,
    Computed,
    Dynamic,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum KvRotation {
    None,
    Hadamard,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum KvSemantics {
    WriteThenRead,
    QuantizedCacheResidual,
}

/// `Display` as the name cards and records spell it with.
macro_rules! displayed_by_name {
    ($($t:ty),*) => {$(
        impl std::fmt::Display for $t {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }
    )*};
}

impl KvGranularity {
    /// The name cards and records spell it with.
    pub fn as_str(self) -> &'static str {
        match self {
            KvGranularity::Element => "element",
            KvGranularity::PerTensor => "per_tensor",
            KvGranularity::PerTokenHead => "per_token_head",
            KvGranularity::Block32 => "block_32",
        }
    }

    /// What one scale covers in `scheme`.
    pub fn of(scheme: KvScheme) -> KvGranularity {
        if scheme.in_groups_of_32() {
            KvGranularity::Block32
        } else if scheme.takes_tensor_scale() {
            KvGranularity::PerTensor
        } else if scheme.is_quantized() {
            KvGranularity::PerTokenHead
        } else {
            KvGranularity::Element
        }
    }
}

impl KvScaleSource {
    /// The name cards and records spell it with.
    pub fn as_str(self) -> &'static str {
        match self {
            KvScaleSource::None => "none",
            KvScaleSource::Unit => "unit",
            KvScaleSource::Checkpoint => "checkpoint",
            KvScaleSource::Computed => "computed",
            KvScaleSource::Dynamic => "dynamic",
        }
    }

    /// The sources `scheme` can have.
    pub fn allowed(scheme: KvScheme) -> &'static [KvScaleSource] {
        match KvGranularity::of(scheme) {
            KvGranularity::Element => &[KvScaleSource::None],
            KvGranularity::PerTensor => &[
                KvScaleSource::Unit,
                KvScaleSource::Checkpoint,
                KvScaleSource::Computed,
            ],
            KvGranularity::PerTokenHead | KvGranularity::Block32 => &[KvScaleSource::Dynamic],
        }
    }
}

impl KvRotation {
    /// The name cards and records spell it with.
    pub fn as_str(self) -> &'static str {
        match self {
            KvRotation::None => "none",
            KvRotation::Hadamard => "hadamard",
        }
    }
}

impl KvSemantics {
    /// The name cards and records spell it with.
    pub fn as_str(self) -> &'static str {
        match self {
            KvSemantics::WriteThenRead => "write_then_read",
            KvSemantics::QuantizedCacheResidual => "quantized_cache_residual",
        }
    }
}

displayed_by_name!(KvGranularity, KvScaleSource, KvRotation, KvSemantics);

impl KvCache {
    /// How cardproof's runners ran `setting`: write-then-read, its rotation, the per-tensor
    /// schemes' scales computed (the setting's `computed_scales`), else from the checkpoint or
    /// 1.0 (`checkpoint_scales`). K and V of different
    /// granularity or scale source leave those fields out (one field cannot hold both).
    pub fn as_run(setting: KvCacheSetting, checkpoint_scales: bool) -> KvCache {
        let source = |s: KvScheme| match KvScaleSource::allowed(s) {
            [one] => *one,
            _ if setting.computed_scales => KvScaleSource::Computed,
            _ if checkpoint_scales => KvScaleSource::Checkpoint,
            _ => KvScaleSource::Unit,
        };
        fn same<T: PartialEq>(a: T, b: T) -> Option<T> {
            (a == b).then_some(a)
        }
        KvCache {
            k: setting.k.as_str().to_owned(),
            v: setting.v.as_str().to_owned(),
            granularity: same(KvGranularity::of(setting.k), KvGranularity::of(setting.v)),
            scale_source: same(source(setting.k), source(setting.v)),
            rotation: Some(if setting.hadamard {
                KvRotation::Hadamard
            } else {
                KvRotation::None
            }),
            semantics: Some(if setting.residual.is_some() {
                KvSemantics::QuantizedCacheResidual
            } else {
                KvSemantics::WriteThenRead
            }),
            residual_length: setting.residual.map(|w| w.length),
            prefill_chunk: setting.residual.map(|w| w.chunk),
        }
    }

    /// The schemes named, or the first field whose name is not one.
    pub fn setting(&self) -> Result<KvCacheSetting, (&'static str, &str)> {
        let k = KvScheme::from_name(&self.k).ok_or(("k", self.k.as_str()))?;
        let v = KvScheme::from_name(&self.v).ok_or(("v", self.v.as_str()))?;
        let residual = (self.semantics == Some(KvSemantics::QuantizedCacheResidual))
            .then(|| ResidualWindow::new(self.residual_length, self.prefill_chunk))
            .transpose()
            .map_err(|_| {
                let bad = |n: Option<u32>| n.is_some_and(|n| !(1..=MAX_RESIDUAL).contains(&n));
                if bad(self.residual_length) {
                    ("residual_length", "out of range")
                } else {
                    ("prefill_chunk", "out of range")
                }
            })?;
        Ok(KvCacheSetting {
            residual,
            k,
            v,
            hadamard: self.rotation == Some(KvRotation::Hadamard),
            computed_scales: self.scale_source == Some(KvScaleSource::Computed)
                && (k.takes_tensor_scale() || v.takes_tensor_scale()),
        })
    }

    /// What in this entry contradicts itself or the card's `kv_cache_dtype`, each as (field
    /// under `runtime.kv_cache`, message). Empty when the entry is coherent.
    pub fn contradictions(&self, kv_cache_dtype: &str) -> Vec<(&'static str, String)> {
        let setting = match self.setting() {
            Ok(s) => s,
            Err((field @ ("residual_length" | "prefill_chunk"), _)) => {
                return vec![(
                    field,
                    format!("`runtime.kv_cache.{field}` must be 1 to {MAX_RESIDUAL} tokens"),
                )];
            }
            Err((field, name)) => {
                return vec![(
                    field,
                    format!("`runtime.kv_cache.{field}`: {}", KvScheme::unknown(name)),
                )];
            }
        };
        let mut out = Vec::new();
        if let Some(named) = KvCacheSetting::from_label(kv_cache_dtype) {
            if (named.k, named.v) != (setting.k, setting.v) {
                out.push((
                    "k",
                    format!(
                        "`runtime.kv_cache` says K {} and V {} but `runtime.kv_cache_dtype` is `{kv_cache_dtype}`",
                        setting.k, setting.v
                    ),
                ));
            }
            if named.hadamard && self.rotation == Some(KvRotation::None) {
                out.push((
                    "rotation",
                    format!(
                        "`runtime.kv_cache_dtype` is `{kv_cache_dtype}` (rotated) but `runtime.kv_cache.rotation` is `none`"
                    ),
                ));
            }
        }
        if let Some(g) = self.granularity {
            let (gk, gv) = (KvGranularity::of(setting.k), KvGranularity::of(setting.v));
            if gk != gv {
                out.push((
                    "granularity",
                    format!(
                        "`granularity: {g}` but K ({}) is {gk} and V ({}) is {gv}: leave it out when they differ",
                        setting.k, setting.v
                    ),
                ));
            } else if g != gk {
                out.push((
                    "granularity",
                    format!("`granularity: {g}` but `{}` is {gk}", setting.k),
                ));
            }
        }
        if let Some(source) = self.scale_source {
            for scheme in [setting.k, setting.v] {
                let allowed = KvScaleSource::allowed(scheme);
                if !allowed.contains(&source) {
                    let list: Vec<&str> = allowed.iter().map(|s| s.as_str()).collect();
                    out.push((
                        "scale_source",
                        format!(
                            "`scale_source: {source}` cannot hold for `{scheme}` (its scales: {})",
                            list.join(", ")
                        ),
                    ));
                    break;
                }
            }
        }
        let residual_semantics = self.semantics == Some(KvSemantics::QuantizedCacheResidual);
        for (field, given) in [
            ("residual_length", self.residual_length),
            ("prefill_chunk", self.prefill_chunk),
        ] {
            if given.is_some() && !residual_semantics {
                out.push((
                    field,
                    format!(
                        "`{field}` sizes transformers' QuantizedCache window, and `semantics` is {}: say `semantics: quantized_cache_residual` or leave it out",
                        self.semantics.map_or("not stated".to_owned(), |s| format!("`{s}`"))
                    ),
                ));
            }
        }
        if residual_semantics && self.scale_source == Some(KvScaleSource::Computed) {
            out.push((
                "scale_source",
                "`scale_source: computed` is vLLM's calculate_kv_scales (write-then-read); with `semantics: quantized_cache_residual` it is no engine's cache".into(),
            ));
        }
        if self.rotation == Some(KvRotation::Hadamard)
            && !(setting.k.is_quantized() || setting.v.is_quantized())
        {
            out.push((
                "rotation",
                format!(
                    "`rotation: hadamard` with an unquantized cache (K {}, V {}): engines rotate only quantized caches",
                    setting.k, setting.v
                ),
            ));
        }
        out
    }

    /// Each field where a rerun (`ran`) did not follow this entry, as (field, card's value,
    /// rerun's value). A field the card leaves out is not compared; one the rerun cannot say
    /// reads `?`.
    pub fn differences(&self, ran: &KvCache) -> Vec<(&'static str, String, String)> {
        fn cmp<T: std::fmt::Display + PartialEq + Copy>(
            out: &mut Vec<(&'static str, String, String)>,
            field: &'static str,
            card: Option<T>,
            ran: Option<T>,
        ) {
            if let Some(c) = card
                && ran != Some(c)
            {
                out.push((
                    field,
                    c.to_string(),
                    ran.map_or("?".into(), |r| r.to_string()),
                ));
            }
        }
        let mut out = Vec::new();
        let same = |a: &str, b: &str| match (KvScheme::from_name(a), KvScheme::from_name(b)) {
            (Some(a), Some(b)) => a == b,
            _ => a.eq_ignore_ascii_case(b),
        };
        if !same(&self.k, &ran.k) {
            out.push(("k", self.k.clone(), ran.k.clone()));
        }
        if !same(&self.v, &ran.v) {
            out.push(("v", self.v.clone(), ran.v.clone()));
        }
        cmp(&mut out, "granularity", self.granularity, ran.granularity);
        cmp(
            &mut out,
            "scale_source",
            self.scale_source,
            ran.scale_source,
        );
        cmp(&mut out, "rotation", self.rotation, ran.rotation);
        cmp(&mut out, "semantics", self.semantics, ran.semantics);
        // Under the residual semantics the window's sizes move the number: a card that leaves
        // them out means transformers' defaults.
        if self.semantics == Some(KvSemantics::QuantizedCacheResidual) {
            let length = self
                .residual_length
                .or(Some(crate::runner::native::kv_cache::DEFAULT_RESIDUAL));
            cmp(&mut out, "residual_length", length, ran.residual_length);
            cmp(
                &mut out,
                "prefill_chunk",
                self.prefill_chunk.or(length),
                ran.prefill_chunk,
            );
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(k: &str, v: &str) -> KvCache {
        KvCache {
            k: k.into(),
            v: v.into(),
            granularity: None,
            scale_source: None,
            rotation: None,
            semantics: None,
            residual_length: None,
            prefill_chunk: None,
        }
    }

    #[test]
    fn a_run_is_described_with_its_scale_source_and_no_rotation() {
        let q8 = KvCacheSetting::from_label("q8_0").unwrap();
        let run = KvCache::as_run(q8, false);
        assert_eq!(run.granularity, Some(KvGranularity::Block32));
        assert_eq!(run.scale_source, Some(KvScaleSource::Dynamic));
        assert_eq!(run.rotation, Some(KvRotation::None));
        let fp8 = KvCacheSetting::from_label("fp8").unwrap();
        assert_eq!(
            KvCache::as_run(fp8, true).scale_source,
            Some(KvScaleSource::Checkpoint)
        );
        assert_eq!(
            KvCache::as_run(fp8, false).scale_source,
            Some(KvScaleSource::Unit)
        );
        let mixed = KvCacheSetting::from_label("k:q8_0/v:fp8_e4m3").unwrap();
        let run = KvCache::as_run(mixed, false);
        assert_eq!((run.granularity, run.scale_source), (None, None));
        assert!(run.contradictions("k:q8_0/v:fp8_e4m3").is_empty());
    }

    #[test]
    fn contradictions_name_the_field() {
        assert_eq!(entry("q9_0", "q8_0").contradictions("q8_0")[0].0, "k");
        assert_eq!(entry("q8_0", "q8_0").contradictions("q4_0")[0].0, "k");
        assert!(entry("q8_0", "q8_0").contradictions("Q8_0").is_empty());
        let mut e = entry("fp8", "fp8_e4m3");
        e.scale_source = Some(KvScaleSource::Dynamic);
        e.granularity = Some(KvGranularity::PerTokenHead);
        let fields: Vec<_> = e.contradictions("fp8").into_iter().map(|c| c.0).collect();
        assert_eq!(fields, ["granularity", "scale_source"]);
        let mut e = entry("bf16", "bf16");
        e.rotation = Some(KvRotation::Hadamard);
        assert_eq!(e.contradictions("bf16")[0].0, "rotation");
    }

    /// The residual window's sizes belong to transformers' semantics: without it they
    /// contradict; with it a card that leaves them out means transformers' defaults, and a
    /// rerun with other sizes differs on each.
    #[test]
    fn a_residual_window_is_compared_with_transformers_defaults() {
        let mut card = entry("q8_0", "q8_0");
        card.residual_length = Some(64);
        assert_eq!(card.contradictions("q8_0")[0].0, "residual_length");
        card.semantics = Some(KvSemantics::QuantizedCacheResidual);
        assert!(card.contradictions("q8_0").is_empty());
        card.residual_length = Some(0);
        assert_eq!(card.contradictions("q8_0")[0].0, "residual_length");
        card.residual_length = None;
        let default = KvCacheSetting::from_label("q8_0+residual").unwrap();
        assert_eq!(card.setting().unwrap(), default);
        assert!(
            card.differences(&KvCache::as_run(default, false))
                .is_empty()
        );
        let other = KvCacheSetting::from_label("q8_0+residual128+chunk32").unwrap();
        assert_eq!(
            card.differences(&KvCache::as_run(other, false)),
            [("prefill_chunk", "128".to_owned(), "32".to_owned())]
        );
        let plain = KvCache::as_run(KvCacheSetting::from_label("q8_0").unwrap(), false);
        let fields: Vec<_> = card.differences(&plain).into_iter().map(|d| d.0).collect();
        assert_eq!(fields, ["semantics", "residual_length", "prefill_chunk"]);
        card.scale_source = Some(KvScaleSource::Computed);
        let fields: Vec<_> = card
            .contradictions("q8_0")
            .into_iter()
            .map(|c| c.0)
            .collect();
        assert!(fields.contains(&"scale_source"), "{fields:?}");
    }

    #[test]
    fn differences_compare_only_what_the_card_says() {
        let ran = KvCache::as_run(KvCacheSetting::from_label("q4_0").unwrap(), false);
        assert!(entry("Q4_0", "q4_0").differences(&ran).is_empty());
        let mut card = entry("q4_0", "q4_0");
        card.rotation = Some(KvRotation::Hadamard);
        assert_eq!(
            card.differences(&ran),
            [("rotation", "hadamard".to_owned(), "none".to_owned())]
        );
    }
}
