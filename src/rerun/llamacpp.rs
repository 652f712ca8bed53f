//! The llama.cpp lane (`--runner llamacpp`): both models run in the user's own
//! `llama-perplexity` ([`crate::runner::llamacpp`]), every pair of rows is reduced here with the
//! same row reduction as every other lane, and llama.cpp's own printed block must agree with
//! cardproof's llama.cpp-compatible reduction of the same rows (the printout gate).
//!
//! llama.cpp decides what it scores, so the protocol must be its own: the second half of each
//! `-c` window, forward KL (its rows keep a 16-nat window below each maximum), BOS as its GGUF's
//! `tokenizer.ggml.add_bos_token` says, one context length per run, plain text (it tokenizes the
//! file itself). Anything else is refused before a process starts.

mod generate;

use std::path::{Path, PathBuf};

use super::document::{Environment, ModelRecord, RunnerKind};
use super::gates::{self, Gate, Measured};
use super::lane::{
    ArmProgress, Arms, CandidateRunner, EngineReference, ReferenceSource, Runs, Scored,
};
use super::preflight::Preflight;
use super::score::{self, EvalInput, Progress};
use super::{Lane, Request};
use crate::error::{Error, Result};
use crate::kld::llamacpp::{BaseRow, KL_GATE};
use crate::kld::protocol::{Bos, Direction, Positions, VocabMode};
use crate::kld::row::{self, RowRecord};
use crate::runner::llamacpp::{
    self as engine, LlamacppOptions, LlamacppRecord, LlamacppSettings, PairSpec,
};
use crate::runner::native;
use crate::runner::native::kv_cache::KvCacheSetting;
use crate::runner::tokens::TokenStream;

type Stage<'a> = &'a (dyn Fn(&str) + Sync);

/// How cardproof asks for what llama.cpp computes: the flags that say it.
pub const PROTOCOL_FLAGS: &str = "--positions second-half --vocab threshold";

/// Why the request's protocol is not what llama.cpp computes (empty: it is).
pub fn protocol_differences(o: &super::MeasureOptions) -> Vec<String> {
    let mut out = Vec::new();
    if o.positions != Positions::SecondHalf {
        out.push(format!(
            "positions: llama-perplexity scores the second half of each window; run with --positions second-half, not {}",
            o.positions.spelling()
        ));
    }
    if o.direction != Direction::Forward {
        out.push(
            "direction: llama.cpp's rows keep a 16-nat window below each maximum, so only the forward KL is defined; run with --direction forward".into(),
        );
    }
    if o.vocab
        != (VocabMode::Threshold {
            log_p: f64::from(KL_GATE),
        })
    {
        out.push(format!(
            "vocab: llama.cpp sums the KL over the reference's entries above log p = {KL_GATE} (its gate); run with --vocab threshold --threshold {KL_GATE}"
        ));
    }
    if o.context_lengths.len() != 1 {
        out.push(format!(
            "context lengths: llama-perplexity runs one -c per pass; give one --context-length (asked: {:?})",
            o.context_lengths
        ));
    }
    out
}

/// The GGUF file of a model given as a file or a directory holding one. A safetensors
/// reference is not converted behind the user's back: llama.cpp's converter says how.
fn gguf_of(model: &Path, role: &str) -> Result<PathBuf> {
    let (path, format) = native::resolve(model)?;
    if format != "gguf" {
        return Err(Error::unsupported(
            model,
            None,
            format!(
                "the llama.cpp runner runs GGUF files and this {role} is safetensors; convert it with llama.cpp's own converter (`python convert_hf_to_gguf.py {} --outtype bf16 --outfile {role}.gguf`, from the same llama.cpp source as the binary) and pass the .gguf: cardproof does not convert on its own",
                model.display()
            ),
        ));
    }
    Ok(path)
}

/// What llama.cpp's tokenization adds at the start of each window for this GGUF: its
/// `tokenizer.ggml.add_bos_token` (absent: whether the token stream starts with the BOS), and
/// the BOS id.
fn bos_of(gguf: &Path, first_token: Option<i32>) -> Result<(bool, Option<u32>)> {
    let (declared, bos) = declared_bos(gguf)?;
    let add = declared
        .unwrap_or_else(|| bos.is_some() && first_token.map(|t| t as i64) == bos.map(i64::from));
    Ok((add, bos))
}

/// The GGUF's `tokenizer.ggml.add_bos_token` (where it says) and BOS id.
fn declared_bos(gguf: &Path) -> Result<(Option<bool>, Option<u32>)> {
    use crate::checkpoint::gguf::GgufValue;
    let file = crate::checkpoint::gguf::read_file(gguf)?;
    let bos = file
        .get("tokenizer.ggml.bos_token_id")
        .and_then(GgufValue::as_u64)
        .and_then(|b| u32::try_from(b).ok());
    let add = match file.get("tokenizer.ggml.add_bos_token") {
        Some(GgufValue::Bool(b)) => Some(*b),
        _ => None,
    };
    Ok((add, bos))
}

/// The protocol's BOS policy against what llama.cpp does for this GGUF: a BOS at each window's
/// start exactly when it adds one.
fn check_bos(gguf: &Path, add_bos: bool, asked: Bos) -> Result<()> {
    let wanted = if add_bos { Bos::PerWindow } else { Bos::None };
    if asked == wanted {
        return Ok(());
    }
    Err(Error::usage(
        gguf,
        format!(
            "llama.cpp puts {} BOS at each window's start for this GGUF (tokenizer.ggml.add_bos_token {add_bos}); the protocol says bos: {}: run with --bos {}",
            if add_bos { "a" } else { "no" },
            asked.as_str(),
            wanted.as_str().replace('_', "-"),
        ),
    ))
}

/// The settings the reference runs with: the candidate's flags, llama.cpp's default cache (or
/// the request's reference cache, a KV sweep's baseline).
fn reference_settings(r: &Request, given: &LlamacppOptions) -> Result<LlamacppSettings> {
    if let Some(own) = &given.reference {
        return Ok(own.clone());
    }
    let (k, v, rotation) = engine::cache_flags(r.reference_kv_cache)
        .map_err(|e| Error::usage(Path::new("--kv-cache"), e))?;
    Ok(LlamacppSettings {
        cache_type_k: k,
        cache_type_v: v,
        rotation,
        ..given.settings.clone()
    })
}

/// The candidate's settings: the flags, with the request's KV cache as `-ctk/-ctv`.
pub fn candidate_settings(
    kv: Option<KvCacheSetting>,
    given: &LlamacppSettings,
) -> Result<LlamacppSettings> {
    let (k, v, rotation) =
        engine::cache_flags(kv).map_err(|e| Error::usage(Path::new("--kv-cache"), e))?;
    let s = LlamacppSettings {
        cache_type_k: k.or(given.cache_type_k.clone()),
        cache_type_v: v.or(given.cache_type_v.clone()),
        rotation: if kv.is_some() {
            rotation
        } else {
            given.rotation
        },
        ..given.clone()
    };
    s.check()
        .map_err(|e| Error::usage(Path::new("--runner llamacpp"), e))?;
    Ok(s)
}

/// The pre-flight of the llama.cpp lane: the protocol is llama.cpp's, the text plain, both
/// models GGUF, the reference hashed; the tokens are llama.cpp's, known once it runs.
pub(super) fn preflight(r: &Request, pre: &mut Preflight, reference: &Path) -> Result<()> {
    let (reference, text) = check_request(r, reference)?;
    let bytes = std::fs::read(text).map_err(|e| Error::io(text, e))?;
    let manifest = crate::checkpoint::hash::hash_path(
        &reference,
        &crate::checkpoint::hash::HashOptions {
            threads: Some(r.threads),
            include_all: false,
        },
        &|_| {},
    )?;
    pre.identity = super::preflight::Identity {
        reference_files_sha256: Some(manifest.root_sha256.clone()),
        eval_text_sha256: Some(sha256_hex(&bytes)),
        eval_text_bytes: Some(bytes.len() as u64),
        tokens_sha256: None,
        token_count: None,
        conversation: None,
        text_read: true,
    };
    pre.reference_manifest = Some(manifest);
    Ok(())
}

/// Everything the pre-flight checks but the hashing: the reference's GGUF and the eval text.
fn check_request<'a>(r: &Request<'a>, reference: &Path) -> Result<(PathBuf, &'a Path)> {
    let differences = protocol_differences(&r.options);
    if !differences.is_empty() {
        return Err(Error::usage(
            r.candidate,
            format!("--runner llamacpp: {}", differences.join("; ")),
        ));
    }
    let text = r.eval_text.ok_or_else(|| {
        Error::usage(
            r.candidate,
            "the llama.cpp runner needs the eval text (--eval-text FILE)",
        )
    })?;
    if crate::conversation::eval::is_conversation_file(text) {
        return Err(Error::unsupported(
            text,
            None,
            "llama-perplexity reads plain text and tokenizes it without parsing special tokens; a conversation eval text runs with --runner native or transformers",
        ));
    }
    let reference = gguf_of(reference, "reference")?;
    let candidate = gguf_of(r.candidate, "candidate")?;
    // Where the GGUF says whether llama.cpp adds a BOS, a protocol that says otherwise is
    // refused before any process starts (else the token stream tells, after the run).
    if let (Some(add_bos), _) = declared_bos(&reference)? {
        check_bos(&reference, add_bos, r.options.bos)?;
    }
    // The binary before the hashing: a missing one fails at once.
    if let Lane::Llamacpp { runner, .. } = r.lane {
        engine::find_binary(runner.binary.as_deref())?;
    }
    engine::timeouts()?;
    for model in [&reference, &candidate] {
        super::preflight::context_lengths(model, &r.options.context_lengths)?;
    }
    Ok((reference, text))
}

/// The pre-flight of a study's arms in llama.cpp: every arm checked before the first runs, the
/// reference hashed once.
pub(super) fn study_preflight(
    requests: &[Request],
    reference: &Path,
    stage: Stage,
) -> Result<Preflight> {
    let first = requests
        .first()
        .ok_or_else(|| Error::internal(reference, "a study without arms"))?;
    stage("checking the arms");
    for r in requests {
        if !matches!(r.lane, Lane::Llamacpp { .. }) {
            return Err(Error::internal(
                r.candidate,
                "a llama.cpp study arm outside the llama.cpp lane",
            ));
        }
        check_request(r, reference)?;
    }
    let mut pre = Preflight::empty();
    stage("hashing the reference");
    preflight(first, &mut pre, reference)?;
    Ok(pre)
}

/// The llama.cpp candidate runner: each candidate beside the reference in the user's
/// `llama-perplexity`. llama.cpp's base stream cannot be kept (a 100k-token stream at a 248k
/// vocabulary is ~50 GB), so each arm runs the reference again: N arms cost 2N passes, and
/// every arm's reference rows must equal the first arm's (their NLL, top-1 token and its
/// probability, to the bit), else the arms were measured against different references and the
/// study is refused, naming the arm and the row.
/// Each arm runs with its own lane's llama.cpp settings (a study's arm sets its own `-fa`).
pub(crate) struct LlamacppCandidates;

impl CandidateRunner for LlamacppCandidates {
    fn run(
        &self,
        reference: &dyn ReferenceSource,
        arms: &Arms,
        turns: Option<&crate::rerun::turns::TurnWork>,
        stage: Stage,
        progress: ArmProgress,
    ) -> Result<Runs> {
        let engine = reference.engine().ok_or_else(|| {
            Error::internal(
                Path::new("--runner llamacpp"),
                "the llama.cpp runner without its reference checkpoint",
            )
        })?;
        // The reference's turns once, in its own server, before any arm.
        let turns = match turns {
            Some(work) => Some(reference_turns(arms, engine, work, stage)?),
            None => None,
        };
        let mut out: Vec<Scored> = Vec::with_capacity(arms.requests.len());
        let mut first_reference: Option<Vec<(f64, u32, f64)>> = None;
        for (i, r) in arms.requests.iter().enumerate() {
            stage(&arms.stage(
                i,
                ": the reference and the candidate in llama.cpp",
                "running llama.cpp",
            ));
            let Lane::Llamacpp { runner, .. } = r.lane else {
                return Err(Error::internal(
                    r.candidate,
                    "a llama.cpp arm outside the llama.cpp lane",
                ));
            };
            let started = std::time::Instant::now();
            let mut scored = score_pair(r, engine, runner, stage, &|d, t| progress(i + 1, d, t))?;
            scored.seconds = started.elapsed().as_secs_f64();
            if let Some((work, server, reference_run)) = &turns {
                let settings = candidate_settings(r.kv_cache, &runner.settings)?;
                let gguf = gguf_of(r.candidate, "candidate")?;
                let t = server.generate(&gguf, &settings, work, "candidate", stage)?;
                if let Some(env) = scored.environment.llamacpp.as_mut() {
                    env.turns = Some(server.record(&reference_run.run, t.run));
                }
                scored.turns = Some(t.generated);
                scored.turns_timing = Some(t.timing);
            }
            let rows = reference_rows(&scored.records);
            match &first_reference {
                None => first_reference = Some(rows),
                Some(base) => same_reference(base, &rows, engine.path, arms.names.get(i))?,
            }
            out.push(scored);
        }
        let (reference_turns, reference_turns_timing) = match turns {
            Some((_, _, t)) => (Some(t.generated), Some(t.timing)),
            None => (None, None),
        };
        Ok(Runs {
            interrupted: None,
            // The reference runs beside each arm, inside its seconds.
            reference_seconds: None,
            arms: out,
            reference_turns,
            reference_turns_timing,
        })
    }
}

/// The reference's turns, generated by its own `llama-server` with the first arm's reference
/// settings (every arm's reference runs with them), with the server every arm's candidate runs
/// in.
fn reference_turns<'w>(
    arms: &Arms,
    engine: &EngineReference,
    work: &'w crate::rerun::turns::TurnWork,
    stage: Stage,
) -> Result<(
    &'w crate::rerun::turns::TurnWork,
    generate::TurnServer,
    generate::ServerTurns,
)> {
    let first = arms.first()?;
    let Lane::Llamacpp { runner, .. } = first.lane else {
        return Err(Error::internal(
            first.candidate,
            "a llama.cpp arm outside the llama.cpp lane",
        ));
    };
    let gguf = gguf_of(engine.path, "reference")?;
    generate::check_window(work, &gguf)?;
    generate::check_vocabulary(work, &gguf)?;
    for r in arms.requests {
        let candidate = gguf_of(r.candidate, "candidate")?;
        generate::check_window(work, &candidate)?;
        generate::check_vocabulary(work, &candidate)?;
    }
    let server = generate::TurnServer::new(runner, work)?;
    let settings = reference_settings(first, runner)?;
    let turns = server.generate(&gguf, &settings, work, "reference", stage)?;
    Ok((work, server, turns))
}

/// Each scored row's reference side: its NLL, top-1 token and that token's probability.
fn reference_rows(records: &score::PerRun) -> Vec<(f64, u32, f64)> {
    records
        .iter()
        .flatten()
        .flatten()
        .map(|rec| {
            rec.as_ref().map_or((f64::NAN, u32::MAX, f64::NAN), |rec| {
                (
                    rec.nll_ref.unwrap_or(f64::NAN),
                    rec.ref_top1,
                    rec.ref_top1_prob,
                )
            })
        })
        .collect()
}

/// An arm's reference rows must be the first arm's, to the bit.
fn same_reference(
    base: &[(f64, u32, f64)],
    rows: &[(f64, u32, f64)],
    reference: &Path,
    name: Option<&String>,
) -> Result<()> {
    let same = |x: &(f64, u32, f64), y: &(f64, u32, f64)| {
        x.0.to_bits() == y.0.to_bits() && x.1 == y.1 && x.2.to_bits() == y.2.to_bits()
    };
    if base.len() == rows.len() && base.iter().zip(rows).all(|(x, y)| same(x, y)) {
        return Ok(());
    }
    let at = base
        .iter()
        .zip(rows)
        .position(|(x, y)| !same(x, y))
        .unwrap_or(base.len().min(rows.len()));
    Err(Error::runner(
        reference,
        format!(
            "llama.cpp's reference pass for arm `{}` differs from the first arm's at scored row {at} ({} rows against {}): the reference is not deterministic in this lane, so the arms would be measured against different references. Pin the threads and batch sizes (llamacpp: threads, batch, ubatch) or run the study in another runner",
            name.map_or("?", String::as_str),
            rows.len(),
            base.len()
        ),
    ))
}

fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest as _;
    crate::digest::hex(&sha2::Sha256::digest(bytes))
}

/// The gates' reductions: stored reference rows against other rows, cardproof's full-vocabulary
/// KL over the reference's unmasked entries.
struct RowReducer {
    reference: Vec<f32>,
    scratch: row::Scratch,
}

impl RowReducer {
    fn new(width: usize) -> Self {
        RowReducer {
            reference: vec![0.0; width],
            scratch: row::Scratch::default(),
        }
    }

    /// The reference row decoded, its codes of 0 (below its 16-nat window) masked.
    fn decode_reference(&mut self, a: &BaseRow) {
        a.decode_into(&mut self.reference);
        for (v, &c) in self.reference.iter_mut().zip(&a.codes) {
            if c == 0 && a.scale > 0.0 {
                *v = f32::NEG_INFINITY;
            }
        }
    }

    /// A stored reference row against another row (gates; cardproof's full-vocabulary KL over
    /// the unmasked entries), both directions when `reverse`.
    fn kl(&mut self, a: &BaseRow, b: &[f32], reverse: bool) -> Option<RowRecord> {
        self.decode_reference(a);
        row::reduce(
            &self.reference,
            b,
            None,
            VocabMode::Full,
            reverse,
            &mut self.scratch,
        )
    }
}

/// The record every lane's statistics read, from a pair of rows llama.cpp's way
/// ([`engine::ScoredRow`]): so kld_mean is llama.cpp's `Mean KLD` and top1_agreement its `Same
/// top p`, on the same rows. `None`: a non-finite row.
fn record_of(a: &BaseRow, s: &engine::ScoredRow) -> Option<RowRecord> {
    let record = RowRecord {
        forward: s.score.kld,
        reverse: f64::NAN,
        ref_top1: s.score.top_base,
        cand_top1: s.score.top,
        ref_top1_prob: f64::from(a.log_prob(s.score.top_base as usize)).exp(),
        nll_ref: Some(f64::from(s.score.nll_base)),
        nll_cand: Some(f64::from(s.score.nll)),
    };
    let finite = record.forward.is_finite()
        && record.nll_ref.is_some_and(f64::is_finite)
        && record.nll_cand.is_some_and(f64::is_finite);
    finite.then_some(record)
}

/// What the gates keep of the first chunk while the rows stream by.
#[derive(Default)]
struct GateRows {
    /// The reference's first-chunk rows, for the self-compare.
    reference: Vec<BaseRow>,
    /// Forward KL of reference row j against candidate row j + 1 (first chunk).
    shift_sum: f64,
    shift_n: usize,
    previous: Option<BaseRow>,
}

/// One candidate beside the reference in llama.cpp: each window's row records (a study's arms
/// are paired on them), the gates when asked, the printout gate unless skipped.
fn score_pair(
    r: &Request,
    engine_reference: &EngineReference,
    options_given: &LlamacppOptions,
    stage: Stage,
    progress: Progress,
) -> Result<Scored> {
    let reference = engine_reference.path;
    let text = r
        .eval_text
        .ok_or_else(|| Error::internal(r.candidate, "the llama.cpp lane without its eval text"))?;
    let reference_gguf = gguf_of(reference, "reference")?;
    let candidate_gguf = gguf_of(r.candidate, "candidate")?;
    let binary = engine::find_binary(options_given.binary.as_deref())?;
    let build = engine::build_of(&binary)?;
    let ref_settings = reference_settings(r, options_given)?;
    let cand_settings = candidate_settings(r.kv_cache, &options_given.settings)?;
    let options = r.options.clone();
    let n_ctx = options.context_lengths[0];
    let gate_printout = !options_given.no_gate;
    let spec = PairSpec {
        binary: &binary,
        reference: &reference_gguf,
        candidate: &candidate_gguf,
        text,
        n_ctx,
        reference_settings: &ref_settings,
        candidate_settings: &cand_settings,
        gate: gate_printout,
    };
    let streamed = stream_pair(&spec, r.gates.is_some(), progress)?;
    let (scoring, kept_windows) = score_rows(&spec, &options, engine_reference, &streamed)?;
    let mut gates_out = match &r.gates {
        Some(g) => {
            stage("sanity gates: the reference again");
            self_and_shift_gates(
                &binary,
                &reference_gguf,
                text,
                n_ctx,
                &ref_settings,
                &streamed.kept,
                Measured::of_metrics(
                    scoring.runs.first().map(|run| &run.summary.metrics),
                    g.checkpoint_quantized,
                    g.declared.clone(),
                ),
            )?
        }
        None => Vec::new(),
    };

    let model = |given: &Path, gguf: &Path, observed: &engine::LlamacppObserved, known| {
        model_record(
            given,
            gguf,
            observed,
            known,
            r.threads,
            streamed.pair.n_vocab,
        )
    };
    let pair = &streamed.pair;
    let reference_id = model(
        reference,
        &reference_gguf,
        &pair.reference_observed,
        engine_reference
            .manifest
            .as_ref()
            .map(|m| m.root_sha256.clone()),
    )?;
    let candidate_id = model(
        r.candidate,
        &candidate_gguf,
        &pair.candidate_observed,
        r.candidate_manifest.map(|m| m.root_sha256.clone()),
    )?;
    let record = LlamacppRecord {
        build: build.clone(),
        reference_settings: ref_settings,
        candidate_settings: cand_settings.clone(),
        reference: pair.reference_observed.clone(),
        candidate: pair.candidate_observed.clone(),
        n_ctx: pair.n_ctx,
        chunks: pair.n_chunk,
        ppl_stride: 0,
        gate: streamed.gate_record.clone(),
        seconds: pair.seconds,
        imported_from: None,
        inherited_environment: crate::runner::llamacpp::inherited_settings(),
        turns: None,
    };
    let environment = environment(&record, r.kv_cache, r.threads);
    gates_out.extend(printout_gate(gate_printout, record.gate.as_ref()));
    Ok(Scored {
        turns: None,
        turns_generated_by: None,
        turns_timing: None,
        scoring,
        options,
        reference: reference_id,
        candidate: candidate_id,
        environment,
        gates: gates_out,
        noise_floor: r.noise_floor.then(|| super::NoiseFloor::Skipped {
            skipped: "llama.cpp's noise floor is its own settings sweep: `cardproof measure --runner llamacpp --sweep llamacpp.flash_attn=on,off`".into(),
        }),
        records: vec![kept_windows],
        seconds: 0.0,
    })
}

/// What llama.cpp's two passes gave while streaming: the pair's run, each scored row's record,
/// the rows the gates keep, and the printout gate's record.
struct Streamed {
    pair: engine::PairRun,
    records: Vec<Option<RowRecord>>,
    kept: GateRows,
    gate_record: Option<engine::PrintoutGate>,
}

/// Run llama.cpp's base and KLD passes, reducing each row as it streams (and keeping the first
/// chunk's rows for the gates when `want_gates`), then gate its printout against the rows.
fn stream_pair(spec: &PairSpec, want_gates: bool, progress: Progress) -> Result<Streamed> {
    let (binary, n_ctx, gate_printout) = (spec.binary, spec.n_ctx, spec.gate);
    let per_chunk = (n_ctx - 1 - n_ctx / 2) as u64;
    let mut records: Vec<Option<RowRecord>> = Vec::new();
    let mut reducer: Option<RowReducer> = None;
    let mut kept = GateRows::default();
    let report = |done: usize, total: usize| progress(done, total);
    let pair = engine::run_pair(
        spec,
        &mut |a, b, scored, index, _token| {
            let red = reducer.get_or_insert_with(|| RowReducer::new(a.codes.len()));
            records.push(record_of(a, scored));
            if want_gates && index < per_chunk {
                kept.reference.push(a.clone());
                if let Some(prev) = kept.previous.take() {
                    let mut shifted = vec![0f32; b.codes.len()];
                    b.decode_into(&mut shifted);
                    if let Some(rec) = red.kl(&prev, &shifted, false) {
                        kept.shift_sum += rec.forward;
                        kept.shift_n += 1;
                    }
                }
                kept.previous = Some(a.clone());
            }
            Ok(())
        },
        &report,
    )?;
    let gate_record = match (&pair.printed, gate_printout) {
        (Some(printed), true) => Some(engine::gate(&pair.compat, printed, pair.clamped_candidate_tokens, pair.clamped_reference_mass).map_err(|e| {
            Error::runner(
                binary,
                format!(
                    "the printout gate failed: {e}. llama.cpp's own statistics and cardproof's reading of its rows disagree, so neither is reported"
                ),
            )
        })?),
        _ => None,
    };

    Ok(Streamed {
        pair,
        records,
        kept,
        gate_record,
    })
}

/// The rows llama.cpp scored, checked to be the rows cardproof plans for the same token stream
/// (windowed as cardproof windows it), and scored: the scoring and each window's records.
fn score_rows(
    spec: &PairSpec,
    options: &super::MeasureOptions,
    reference: &EngineReference,
    streamed: &Streamed,
) -> Result<(score::Scoring, Vec<Vec<Option<RowRecord>>>)> {
    let (text, n_ctx, pair) = (spec.text, spec.n_ctx, &streamed.pair);
    let per_chunk = (n_ctx - 1 - n_ctx / 2) as u64;
    // The token stream llama.cpp scored, windowed as cardproof windows it.
    let first = pair.tokens.first().copied();
    let (add_bos, bos_id) = bos_of(spec.reference, first)?;
    check_bos(spec.reference, add_bos, options.bos)?;
    let ids: Vec<u32> = pair
        .tokens
        .iter()
        .map(|&t| u32::try_from(t).unwrap_or(u32::MAX))
        .collect();
    let width = pair.n_vocab as usize;
    let stream = TokenStream {
        // The size of the text the pre-flight hashed (llama.cpp read the same file).
        text_bytes: reference.identity.eval_text_bytes.unwrap_or(0),
        ..TokenStream::of_ids(
            ids,
            reference
                .identity
                .eval_text_sha256
                .clone()
                .unwrap_or_default(),
        )
    };
    let eval = EvalInput {
        stream: &stream,
        text_path: text,
        bos_id,
        tokenizer_vocab: width,
    };
    let mut records = Some(streamed.records.clone());
    let mut kept_windows: Vec<Vec<Option<RowRecord>>> = Vec::new();
    let scoring = score::measure_records(&eval, options, width, |plans, _vocab_size| {
        let plan = plans
            .first()
            .ok_or_else(|| Error::internal(text, "no run planned"))?;
        let half = n_ctx / 2;
        let expected: Vec<usize> = (half..n_ctx - 1).collect();
        if plan.windows.windows.len() != pair.n_chunk as usize
            || plan.rows.iter().any(|rows| *rows != expected)
        {
            return Err(Error::internal(
                text,
                format!(
                    "llama.cpp scored {} chunks of rows {half}..{}; cardproof planned {} windows of other rows",
                    pair.n_chunk,
                    n_ctx - 2,
                    plan.windows.windows.len()
                ),
            ));
        }
        let all = records.take().unwrap_or_default();
        let per_window: Vec<Vec<Option<RowRecord>>> = all
            .chunks(per_chunk as usize)
            .map(<[Option<RowRecord>]>::to_vec)
            .collect();
        kept_windows = per_window.clone();
        Ok(vec![per_window])
    })?;

    // The numbers are llama.cpp's per-row arithmetic: the protocol says so.
    let mut scoring = scoring;
    scoring.protocol.llamacpp_compat = true;
    Ok((scoring, kept_windows))
}

/// A GGUF model's record: where it is, its digests, and what llama.cpp said it ran.
fn model_record(
    given: &Path,
    gguf: &Path,
    observed: &engine::LlamacppObserved,
    known: Option<String>,
    threads: usize,
    n_vocab: u32,
) -> Result<ModelRecord> {
    Ok(ModelRecord {
        path: given.display().to_string(),
        format: "gguf".into(),
        manifest_sha256: match known {
            Some(m) => m,
            None => super::identity::root_digest(given, threads, None)?,
        },
        lm_head_sha256: lm_head_sha256(gguf),
        stored_dtype: observed
            .file_type
            .as_deref()
            .map_or_else(|| "?".into(), str::to_ascii_lowercase),
        runner: serde_json::json!({
            "engine": "llama.cpp",
            "architecture": crate::checkpoint::gguf::read_file(gguf)
                .ok()
                .and_then(|f| f.architecture().map(str::to_owned)),
            "param_dtype": observed.file_type,
            "attention": format!(
                "flash_attn={}",
                observed.flash_attn.as_deref().unwrap_or("?")
            ),
            "kv_cache": [observed.cache_type_k, observed.cache_type_v],
            "gguf": gguf.display().to_string(),
            "n_vocab": n_vocab,
        }),
        hub: None,
    })
}

/// The printout gate's verdict: skipped (`--llamacpp-no-gate`), or passed with llama.cpp's
/// printed mean beside cardproof's reduction of the same rows.
fn printout_gate(gate_printout: bool, record: Option<&engine::PrintoutGate>) -> Option<Gate> {
    if !gate_printout {
        return Some(Gate {
            gate: "llamacpp_printout".into(),
            passed: false,
            detail: "llama.cpp's own KLD pass was skipped (--llamacpp-no-gate): its printout was not compared with cardproof's reading of the rows".into(),
        });
    }
    record.map(|g| Gate {
        gate: "llamacpp_printout".into(),
        passed: true,
        detail: format!(
            "llama.cpp printed Mean KLD {:.6}, cardproof's llama.cpp-compatible reduction of the same {} rows gives {:.6} (allowed ±{:.1e})",
            g.printed_kld_mean, g.rows, g.cardproof_kld_mean, g.allowed
        ),
    })
}

/// The reference run a second time on its first chunk (`--chunks 1`), compared row by row with
/// the first run's (llama.cpp is deterministic on one machine: the KL must be exactly 0), and
/// the one-row shift from the first chunk kept while streaming.
fn self_and_shift_gates(
    binary: &Path,
    reference: &Path,
    text: &Path,
    n_ctx: usize,
    settings: &LlamacppSettings,
    kept: &GateRows,
    measured: Measured,
) -> Result<Vec<Gate>> {
    let width = kept.reference.first().map_or(0, |r| r.codes.len());
    let mut red = RowReducer::new(width);
    let (mut forward, mut reverse, mut n, mut same_top1) = (0.0, 0.0, 0usize, true);
    let mut decoded = vec![0f32; width];
    let mut mismatch = None;
    let rows = engine::run_single(
        binary,
        reference,
        text,
        n_ctx,
        Some(1),
        settings,
        &mut |row, index| {
            let Some(first) = kept.reference.get(index as usize) else {
                mismatch = Some(format!(
                    "the second run wrote row {index} beyond the first chunk"
                ));
                return Ok(());
            };
            row.decode_into(&mut decoded);
            // Same masking on both sides: reverse KL over the kept entries.
            for (v, &c) in decoded.iter_mut().zip(&row.codes) {
                if c == 0 && row.scale > 0.0 {
                    *v = f32::NEG_INFINITY;
                }
            }
            match red.kl(first, &decoded, true) {
                Some(rec) => {
                    forward += rec.forward;
                    reverse += rec.reverse;
                    same_top1 &= rec.ref_top1 == rec.cand_top1;
                    n += 1;
                }
                // A non-finite row: nothing shown, so the gate fails.
                None => forward = f64::NAN,
            }
            Ok(())
        },
    )?;
    if let Some(m) = mismatch {
        return Err(Error::runner(binary, m));
    }
    if rows as usize != kept.reference.len() {
        return Err(Error::runner(
            binary,
            format!(
                "the reference's second run wrote {rows} rows of its first chunk; the first run wrote {}",
                kept.reference.len()
            ),
        ));
    }
    let n = n.max(1) as f64;
    let self_compare = gates::SelfCompare {
        forward: forward / n,
        reverse: reverse / n,
        same_top1,
    };
    let shift = kept.shift_sum / kept.shift_n.max(1) as f64;
    Ok(gates::judge(self_compare, shift, measured))
}

/// The output head's digest, where cardproof reads the GGUF's architecture (empty otherwise:
/// llama.cpp runs architectures cardproof's native runner does not).
fn lm_head_sha256(gguf: &Path) -> String {
    native::gguf::GgufStore::open(gguf, native::Emulate::ReferenceSemantics)
        .ok()
        .and_then(|(store, config)| {
            use native::weights::WeightStore;
            let head = if config.tie_embeddings {
                format!("{}.embed_tokens.weight", config.prefix)
            } else {
                "lm_head.weight".into()
            };
            store.tensor_sha256(&head).ok().flatten()
        })
        .unwrap_or_default()
}

/// The environment record of a llama.cpp run.
fn environment(record: &LlamacppRecord, kv: Option<KvCacheSetting>, threads: usize) -> Environment {
    let c = &record.candidate;
    let device = if c.backend == "cpu" {
        format!("cpu: {}", super::environment::cpu_name())
    } else {
        c.device.clone()
    };
    let place = if c.backend == "cpu" {
        "the CPU backend".to_owned()
    } else {
        format!("the {} backend, {}", c.backend, c.device)
    };
    let kv_label = c.kv_label().unwrap_or_else(|| {
        record
            .candidate_settings
            .cache_type_k
            .clone()
            .unwrap_or_else(|| "f16".into())
    });
    let rotated = c.rotation_k == Some(true) || c.rotation_v == Some(true);
    Environment {
        runner: RunnerKind::Llamacpp,
        runner_version: env!("CARGO_PKG_VERSION").into(),
        engine: "llama.cpp".into(),
        engine_version: Some(record.build.engine_version()),
        torch_version: None,
        cuda_version: None,
        device,
        compute_dtype: "f32".into(),
        attention: format!(
            "flash_attn={}",
            c.flash_attn.clone().unwrap_or_else(|| "?".into())
        ),
        kv_cache_dtype: Some(kv_label),
        kv_cache: kv.filter(|s| s.changes_anything()).map(|s| {
            let mut as_run = crate::disclosure::kv_cache::KvCache::as_run(s, false);
            // What llama.cpp did, not what was asked: it rotates only heads of a multiple of 64.
            as_run.rotation = Some(if rotated {
                crate::disclosure::kv_cache::KvRotation::Hadamard
            } else {
                crate::disclosure::kv_cache::KvRotation::None
            });
            as_run
        }),
        kv_scales: None,
        recurrent_state_dtype: None,
        emulate: None,
        threads: record
            .candidate_settings
            .threads
            .map(|t| t as usize)
            .or(Some(threads)),
        tf32: None,
        lane: format!(
            "llama.cpp {} on {place}: both models in llama-perplexity, each pair of rows read from its --kl-divergence-base streams and reduced by cardproof; llama.cpp's printed statistics {}",
            record.build.engine_version(),
            match &record.gate {
                Some(g) if g.clamped_candidate_tokens > 0 => format!(
                    "agree with cardproof's llama.cpp-compatible reduction (printout gate); on {} rows the candidate's true token lay below its stored 16-nat window, so its NLL reads as the floor and PPL(Q) is a lower bound (llama.cpp printed {}, cardproof {:.4})",
                    g.clamped_candidate_tokens, g.printed_ppl_q, g.cardproof_ppl_q
                ),
                Some(_) =>
                    "agree with cardproof's llama.cpp-compatible reduction (printout gate)".into(),
                None => "were not compared (no gate)".into(),
            }
        ),
        tokenizer: None,
        reference_artifact: None,
        linear_attention: None,
        reference_linear_attention: None,
        transformers_runner: None,
        llamacpp: Some(record.clone()),
    }
}
