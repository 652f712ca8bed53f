//! `measure --kv-cache`: the candidate's KV cache quantized as an engine writes it (issue #18),
//! through the CLI on the example models.

use std::path::Path;

use crate::support::*;

/// The bf16 example against itself with the candidate's cache in `scheme`: its kld_mean and the
/// recorded KV-cache dtype and text output.
fn self_with(dir: &Path, flags: &[&str]) -> (f64, String, String) {
    let text = short_text(dir, 4000);
    let out = dir.join(flags.join("_").replace("--", ""));
    let r = measure_short(
        Path::new(&model("shakespeare-bf16")),
        &text,
        &out,
        "100",
        flags,
    );
    assert_eq!(r.code, 0, "{}", r.stderr);
    let m: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("measurement.json")).unwrap())
            .unwrap();
    let kld = m["runs"][0]["metrics"]["kld_mean"]
        .as_f64()
        .unwrap_or_else(|| panic!("no kld_mean in {}", m["runs"][0]["metrics"]));
    let kv = m["environment"]["kv_cache_dtype"]
        .as_str()
        .unwrap()
        .to_owned();
    (kld, kv, r.stdout)
}

#[test]
fn a_quantized_kv_cache_moves_the_model_against_itself_and_int4_far_more_than_int8() {
    let dir = tempfile::tempdir().unwrap();
    let (plain, kv, _) = self_with(dir.path(), &["--kv-cache", "none"]);
    assert_eq!(plain, 0.0, "the model against itself, nothing rounded");
    assert_eq!(kv, "none");
    let (q8, kv, text) = self_with(dir.path(), &["--kv-cache", "q8_0"]);
    assert_eq!(kv, "q8_0");
    assert!(text.contains("KV cache q8_0"), "{text}");
    let (q4, _, _) = self_with(dir.path(), &["--kv-cache", "q4_0"]);
    let (q5, _, _) = self_with(dir.path(), &["--kv-cache", "q5_1"]);
    // The study's shape: int8 close, 4-bit far (measured on the full eval text: 1.65e-4,
    // 7.7e-3 and 4.4e-2).
    assert!(q8 > 0.0 && q8 < 1e-3, "q8_0 {q8}");
    assert!(
        q5 > 5.0 * q8 && q4 > 2.0 * q5,
        "q8_0 {q8}, q5_1 {q5}, q4_0 {q4}"
    );
    // K and V separately: the keys alone at q4_0 move it less than both.
    let (k_only, kv, _) = self_with(dir.path(), &["--kv-cache-k", "q4_0"]);
    assert_eq!(kv, "k:q4_0/v:none");
    assert!(k_only > 0.0 && k_only < q4, "k only {k_only}, both {q4}");
    let (mixed, kv, _) = self_with(dir.path(), &["--kv-cache", "q8_0", "--kv-cache-v", "q4_0"]);
    assert_eq!(kv, "k:q8_0/v:q4_0");
    assert!(mixed > q8 && mixed < q4, "{mixed}");
}

/// llama.cpp's Hadamard rotation spreads a head's outlier channels over its block before the
/// cache rounds it: on the bf16 example (heads of 64) q4_0 rotated moves the model less than
/// q4_0 plain. The record keeps the cache type as `kv_cache_dtype` and the rotation in
/// `kv_cache.rotation`; the text output names it.
/// exllamav3's widths order as bits do, and its cache is recorded with its groups of 32 and
/// dynamic scales; llama.cpp's rotation does not go with it (its own H32 is the scheme's).
#[test]
fn exllamav3_caches_order_by_width_and_refuse_llama_cpps_rotation() {
    let dir = tempfile::tempdir().unwrap();
    let (q8, kv, text) = self_with(dir.path(), &["--kv-cache", "exl3_q8"]);
    assert_eq!(kv, "exl3_q8");
    assert!(text.contains("KV cache exl3_q8"), "{text}");
    let (q4, _, _) = self_with(dir.path(), &["--kv-cache", "exl3_q4"]);
    let (q2, _, _) = self_with(dir.path(), &["--kv-cache", "exl3_q2"]);
    assert!(q8 > 0.0 && q4 > 5.0 * q8 && q2 > 2.0 * q4, "{q8} {q4} {q2}");
    let out = dir.path().join("mixed");
    let r = measure_short(
        Path::new(&model("shakespeare-bf16")),
        &short_text(dir.path(), 4000),
        &out,
        "100",
        &["--kv-cache-k", "exl3_q8", "--kv-cache-v", "exl3_q4"],
    );
    assert_eq!(r.code, 0, "{}", r.stderr);
    let m: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("measurement.json")).unwrap())
            .unwrap();
    let entry = &m["environment"]["kv_cache"];
    assert_eq!(m["environment"]["kv_cache_dtype"], "k:exl3_q8/v:exl3_q4");
    assert_eq!(
        (&entry["granularity"], &entry["scale_source"]),
        (&"block_32".into(), &"dynamic".into()),
        "{entry}"
    );
    let r = measure_short(
        Path::new(&model("shakespeare-bf16")),
        &short_text(dir.path(), 4000),
        &dir.path().join("rotated"),
        "100",
        &["--kv-cache", "exl3_q4+hadamard"],
    );
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert!(r.stderr.contains("not with exl3_q4"), "{}", r.stderr);
}

#[test]
fn the_hadamard_rotation_lowers_a_4_bit_caches_kld_and_is_recorded() {
    let dir = tempfile::tempdir().unwrap();
    let (plain, _, _) = self_with(dir.path(), &["--kv-cache", "q4_0"]);
    let (rotated, kv, text) = self_with(
        dir.path(),
        &["--kv-cache", "q4_0", "--kv-cache-rotation", "hadamard"],
    );
    assert_eq!(kv, "q4_0");
    assert!(
        text.contains("KV cache q4_0 (Hadamard-rotated, llama.cpp's)"),
        "{text}"
    );
    assert!(
        rotated > 0.0 && rotated < plain,
        "rotated {rotated}, plain {plain}"
    );
    let m: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(
            dir.path()
                .join("kv-cache_q4_0_kv-cache-rotation_hadamard/measurement.json"),
        )
        .unwrap(),
    )
    .unwrap();
    assert_eq!(m["environment"]["kv_cache"]["rotation"], "hadamard");
    // The one-word spelling is the same run.
    let (same, _, _) = self_with(dir.path(), &["--kv-cache", "q4_0+hadamard"]);
    assert_eq!(same, rotated);
    // A rotation llama.cpp would not do is refused: the hybrid example's heads are 32 wide.
    let text = short_text(dir.path(), 2000);
    let r = measure_short(
        Path::new(&model("shakespeare-hybrid-bf16")),
        &text,
        &dir.path().join("hybrid"),
        "100",
        &["--kv-cache", "q8_0+hadamard"],
    );
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert!(r.stderr.contains("multiple of 64"), "{}", r.stderr);
}

/// A card for `cand` written from `measurement` (`candidate_repo` on the Hub side), into
/// `cand/README.md`; returns the card's path and text.
fn card_from(
    measurement: &Path,
    cand: &Path,
    candidate_repo: &str,
) -> (std::path::PathBuf, String) {
    let rev = "0123456789abcdef0123456789abcdef01234567";
    let card = cand.join("README.md");
    std::fs::remove_file(&card).ok();
    let r = cardproof(&[
        "card",
        "--measurement",
        measurement.to_str().unwrap(),
        "--into",
        card.to_str().unwrap(),
        "--reference-repo",
        "example/shakespeare-bf16",
        "--reference-revision",
        rev,
        "--candidate-repo",
        candidate_repo,
        "--candidate-revision",
        rev,
        "--quantization",
        "none",
        "--calibration",
        "none",
    ]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    let written = std::fs::read_to_string(&card).unwrap();
    (card, written)
}

/// A copy of the bf16 example measured against itself with `kv_flags` over a short text of
/// `chars` characters (`resamples` bootstrap resamples), and its card written from that
/// measurement as `repo`: (candidate dir, text, card path, the card's text).
fn kv_card(
    d: &Path,
    chars: usize,
    resamples: &str,
    kv_flags: &[&str],
    repo: &str,
) -> (
    std::path::PathBuf,
    std::path::PathBuf,
    std::path::PathBuf,
    String,
) {
    let text = short_text(d, chars);
    let cand = d.join("cand");
    copy_model("shakespeare-bf16", &cand);
    let r = measure_short(&cand, &text, &d.join("m"), resamples, kv_flags);
    assert_eq!(r.code, 0, "{}", r.stderr);
    let (card, written) = card_from(&d.join("m/measurement.json"), &cand, repo);
    (cand, text, card, written)
}

/// `verify` of `cand` against the bf16 example over `text`, written to `out`, with `extra` flags.
fn verify_card(cand: &Path, text: &Path, out: &Path, extra: &[&str]) -> Run {
    Cmd::verify(cand)
        .reference(model("shakespeare-bf16"))
        .eval_text(text)
        .out(out)
        .arg("--json")
        .args(extra)
        .run()
}

/// A card written from a `--kv-cache q4_0` measurement discloses `kv_cache_dtype: q4_0`, and
/// `verify` reruns it with that cache (native lane): reproduced. The same card claiming those
/// numbers for a q8_0 cache is rerun with q8_0 and is not.
#[test]
fn verify_reruns_a_card_with_the_kv_cache_scheme_it_discloses() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let text = short_text(d, 6000);
    let cand = d.join("cand");
    copy_model("shakespeare-bf16", &cand);
    let r = measure_short(&cand, &text, &d.join("m"), "1000", &["--kv-cache", "q4_0"]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    let (card, written) = card_from(
        &d.join("m/measurement.json"),
        &cand,
        "example/shakespeare-bf16-kv-q4_0",
    );
    assert!(written.contains("kv_cache_dtype: q4_0"), "{written}");
    // The measurement's record of how the cache ran travels into the card.
    let lint = cardproof(&["lint", card.to_str().unwrap(), "--json"]);
    assert!(
        !lint.stdout.contains("kv-cache-mismatch"),
        "{}",
        lint.stdout
    );
    for field in [
        "k: q4_0",
        "granularity: block_32",
        "scale_source: dynamic",
        "rotation: none",
        "semantics: write_then_read",
    ] {
        assert!(written.contains(field), "{field} in {written}");
    }
    let verify = |out: &str, extra: &[&str]| verify_card(&cand, &text, &d.join(out), extra);
    let r = verify("v1", &[]);
    assert_eq!(r.code, 0, "{}\n{}", r.stdout, r.stderr);
    assert_eq!(r.json()["verdict"], "reproduced", "{}", r.stdout);
    std::fs::write(
        &card,
        written.replace("kv_cache_dtype: q4_0", "kv_cache_dtype: q8_0"),
    )
    .unwrap();
    let r = verify("v2", &[]);
    assert_eq!(r.code, 1, "{}", r.stdout);
    assert_eq!(r.json()["verdict"], "not_reproduced", "{}", r.stdout);
    // `verify --kv-cache` reruns with another scheme than the card's: the rerun then differs
    // from the card's runtime, so no claim is reproduced and the difference is named.
    std::fs::write(&card, &written).unwrap();
    // The same numbers claimed for a rotated cache (llama.cpp's Hadamard): the rerun follows
    // the rotation, which lowers q4_0's KLD, so they are not reproduced.
    std::fs::write(
        &card,
        written.replace("rotation: none", "rotation: hadamard"),
    )
    .unwrap();
    let r = verify("v4", &[]);
    assert_eq!(r.code, 1, "{}", r.stdout);
    assert_eq!(r.json()["verdict"], "not_reproduced", "{}", r.stdout);
    // Rerun rotated where the card says it was not: the difference is named.
    std::fs::write(&card, &written).unwrap();
    let r = verify("v5", &["--kv-cache", "q4_0+hadamard"]);
    assert_ne!(r.json()["verdict"], "reproduced", "{}", r.stdout);
    assert!(
        r.stdout.contains("runtime.kv_cache.rotation"),
        "{}",
        r.stdout
    );
    std::fs::write(&card, &written).unwrap();
    let r = verify("v3", &["--kv-cache", "q8_0"]);
    assert_eq!(r.code, 1, "{}", r.stdout);
    let doc = r.json();
    assert_ne!(doc["verdict"], "reproduced", "{}", r.stdout);
    assert!(
        r.stdout.contains("runtime.kv_cache_dtype") && r.stdout.contains("q8_0"),
        "{}",
        r.stdout
    );
}

/// A card written from an exllamav3 cache measurement reproduces through `verify`, which reruns
/// its scheme; the same card naming vLLM's `int4_per_token_head`, which cardproof cannot follow,
/// is not reproduced and the report says why.
#[test]
fn verify_follows_an_exllamav3_card_and_cannot_reproduce_an_unemulated_cache() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (cand, text, card, written) = kv_card(
        d,
        4000,
        "1000",
        &["--kv-cache", "exl3_q4"],
        "example/shakespeare-bf16-kv-exl3",
    );
    assert!(written.contains("kv_cache_dtype: exl3_q4"), "{written}");
    let r = verify_card(&cand, &text, &d.join("v1"), &[]);
    assert_eq!(r.code, 0, "{}\n{}", r.stdout, r.stderr);
    assert_eq!(r.json()["verdict"], "reproduced", "{}", r.stdout);
    std::fs::write(&card, written.replace("exl3_q4", "int4_per_token_head")).unwrap();
    let r = verify_card(&cand, &text, &d.join("v2"), &[]);
    assert_ne!(r.json()["verdict"], "reproduced", "{}", r.stdout);
    assert!(
        r.stdout.contains("int4_per_token_head") && r.stdout.contains("not pinned"),
        "{}",
        r.stdout
    );
}

/// A card written from a `fp8_e4m3+computed` measurement says `scale_source: computed`, and
/// `verify` reruns it with computed scales: reproduced. Rerun with the checkpoint's scales
/// (`--kv-cache fp8_e4m3`, 1.0 here) instead, the scale source differs and is named.
#[test]
fn verify_follows_a_cards_computed_kv_scales() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (cand, text, card, written) = kv_card(
        d,
        4000,
        "100",
        &["--kv-cache", "fp8_e4m3+computed"],
        "example/shakespeare-bf16-kv-fp8",
    );
    assert!(written.contains("scale_source: computed"), "{written}");
    let lint = cardproof(&["lint", card.to_str().unwrap(), "--json"]);
    assert!(
        !lint.stdout.contains("kv-cache-mismatch"),
        "{}",
        lint.stdout
    );
    let verify = |out: &str, extra: &[&str]| verify_card(&cand, &text, &d.join(out), extra);
    let r = verify("v1", &[]);
    assert_eq!(r.code, 0, "{}\n{}", r.stdout, r.stderr);
    assert_eq!(r.json()["verdict"], "reproduced", "{}", r.stdout);
    let r = verify("v2", &["--kv-cache", "fp8_e4m3"]);
    assert_ne!(r.json()["verdict"], "reproduced", "{}", r.stdout);
    assert!(
        r.stdout.contains("runtime.kv_cache.scale_source"),
        "{}",
        r.stdout
    );
}

/// transformers' QuantizedCache semantics by name: context length 128 in chunks of 32 with a
/// window of 64 moves the number less than write-then-read (a quarter of the rows read
/// nothing rounded, and every chunk reads itself unrounded), and a chunk as long as the window
/// sees no quantization at all (one update). The record carries the semantics and both sizes;
/// a card written from it verifies, and a rerun with another chunk is named.
#[test]
fn quantized_cache_residual_semantics_run_by_name_and_verify_follows_them() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let text = short_text(d, 4000);
    let cand = d.join("cand");
    copy_model("shakespeare-bf16", &cand);
    let kld = |out: &str, flags: &[&str]| kld_of(&cand, &text, &d.join(out), flags);
    let write_then_read = kld("wtr", &["--kv-cache", "q4_0"]);
    let residual = kld(
        "res",
        &[
            "--kv-cache",
            "q4_0",
            "--kv-cache-semantics",
            "quantized_cache_residual",
            "--kv-cache-residual",
            "64",
            "--kv-cache-chunk",
            "32",
        ],
    );
    assert!(
        residual > 0.0 && residual < write_then_read,
        "residual {residual}, write-then-read {write_then_read}"
    );
    assert_eq!(kld("one", &["--kv-cache", "q4_0+residual128"]), 0.0);
    let m: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(d.join("res/measurement.json")).unwrap())
            .unwrap();
    let kv = &m["environment"]["kv_cache"];
    assert_eq!(kv["semantics"], "quantized_cache_residual", "{kv}");
    assert_eq!(
        (kv["residual_length"].as_u64(), kv["prefill_chunk"].as_u64()),
        (Some(64), Some(32))
    );
    let (card, written) = card_from(
        &d.join("res/measurement.json"),
        &cand,
        "example/shakespeare-bf16-kv-q4-residual",
    );
    assert!(
        written.contains("semantics: quantized_cache_residual"),
        "{written}"
    );
    let lint = cardproof(&["lint", card.to_str().unwrap(), "--json"]);
    assert!(
        !lint.stdout.contains("kv-cache-mismatch"),
        "{}",
        lint.stdout
    );
    let r = verify_card(&cand, &text, &d.join("v1"), &[]);
    assert_eq!(r.code, 0, "{}\n{}", r.stdout, r.stderr);
    assert_eq!(r.json()["verdict"], "reproduced", "{}", r.stdout);
    let r = verify_card(
        &cand,
        &text,
        &d.join("v2"),
        &["--kv-cache", "q4_0+residual64"],
    );
    assert_ne!(r.json()["verdict"], "reproduced", "{}", r.stdout);
    assert!(
        r.stdout.contains("runtime.kv_cache.prefill_chunk"),
        "{}",
        r.stdout
    );
}

/// `candidate` against the bf16 example over `text` with `flags`: its kld_mean.
fn kld_of(candidate: &Path, text: &Path, out: &Path, flags: &[&str]) -> f64 {
    let r = measure_short(candidate, text, out, "100", flags);
    assert_eq!(r.code, 0, "{}", r.stderr);
    let m: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("measurement.json")).unwrap())
            .unwrap();
    m["runs"][0]["metrics"]["kld_mean"].as_f64().unwrap()
}

/// The bf16 example made into a checkpoint that declares an FP8 KV cache (compressed-tensors'
/// `kv_cache_scheme`) with per-layer `k_scale` / `v_scale` of `scale`.
fn with_declared_fp8_kv(to: &Path, scale: f32) {
    copy_model("shakespeare-bf16", to);
    rewrite_safetensors(&to.join("model.safetensors"), |tensors| {
        let layers = tensors
            .iter()
            .filter(|t| t.0.ends_with(".self_attn.k_proj.weight"))
            .count();
        assert!(layers > 0);
        for l in 0..layers {
            for kv in ["k_scale", "v_scale"] {
                tensors.push((
                    format!("model.layers.{l}.self_attn.{kv}"),
                    safetensors::Dtype::F32,
                    vec![],
                    scale.to_le_bytes().to_vec(),
                ));
            }
        }
    });
    edit_config(to, |c| {
        c["quantization_config"] = serde_json::json!({
            "quant_method": "compressed-tensors",
            "format": "dense",
            "config_groups": {},
            "kv_cache_scheme": {"num_bits": 8, "type": "float", "strategy": "tensor", "dynamic": false, "symmetric": true},
        });
    });
}

/// vLLM's `fp8_e4m3` takes the checkpoint's own scales where it declares them (the same numbers
/// as the declared cache's emulation) and 1.0 where it does not; `none` switches the declared
/// cache off.
#[test]
fn fp8_e4m3_uses_the_checkpoints_kv_scales_and_none_turns_a_declared_cache_off() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let text = short_text(d, 4000);
    let cand = d.join("cand");
    with_declared_fp8_kv(&cand, 0.05);
    let kld = |flags: &[&str], out: &str| kld_of(&cand, &text, &d.join(out), flags);
    let declared = kld(&[], "declared");
    let fp8 = kld(&["--kv-cache", "fp8_e4m3"], "fp8");
    let off = kld(&["--kv-cache", "none"], "off");
    assert!(declared > 0.0, "the declared FP8 cache moves the numbers");
    assert_eq!(
        fp8, declared,
        "the checkpoint's scales, as the declared emulation"
    );
    assert_eq!(
        off, 0.0,
        "no cache rounding: the bf16 weights against themselves"
    );
    // Scale 1.0 (vLLM's default without scales) on the plain example gives other numbers.
    let (plain_fp8, _, _) = self_with(d, &["--kv-cache", "fp8_e4m3"]);
    assert!(
        plain_fp8 > 0.0 && plain_fp8 != declared,
        "{plain_fp8} vs {declared}"
    );
}

/// vLLM's `calculate_kv_scales`: `--kv-cache-scales computed` (or `fp8_e4m3+computed`) takes
/// each layer's scales from the first window's pass (amax/200, amax/100) instead of 1.0 or the
/// checkpoint's; the record says `scale_source: computed` and the scales found.
#[test]
fn computed_fp8_scales_replace_unit_and_checkpoint_scales_and_are_recorded() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (unit, _, _) = self_with(d, &["--kv-cache", "fp8_e4m3"]);
    let (computed, kv, text) = self_with(
        d,
        &["--kv-cache", "fp8_e4m3", "--kv-cache-scales", "computed"],
    );
    assert_eq!(kv, "fp8_e4m3");
    assert!(
        computed > 0.0 && computed != unit,
        "computed {computed}, unit {unit}"
    );
    let (same, _, _) = self_with(d, &["--kv-cache", "fp8_e4m3+computed"]);
    assert_eq!(
        same, computed,
        "one spelling, one run; the scales are frozen"
    );
    let m: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(
            d.join("kv-cache_fp8_e4m3_kv-cache-scales_computed/measurement.json"),
        )
        .unwrap(),
    )
    .unwrap();
    let env = &m["environment"];
    assert_eq!(env["kv_cache"]["scale_source"], "computed", "{env}");
    assert_eq!(env["kv_scales"]["tokens"], 128, "{env}");
    let layers = env["kv_scales"]["layers"].as_array().unwrap();
    assert!(!layers.is_empty());
    for l in layers {
        let (k, v) = (
            l["k_scale"].as_f64().unwrap(),
            l["v_scale"].as_f64().unwrap(),
        );
        assert!(k > 0.0 && v > 0.0 && k != v, "{l}");
    }
    assert!(
        text.contains("KV cache fp8_e4m3 (scales computed from the first 128 tokens"),
        "{text}"
    );
    // On a checkpoint that declares its scales, computed ones replace them.
    let cand = d.join("declared");
    with_declared_fp8_kv(&cand, 0.05);
    let t = short_text(d, 4000);
    let kld = |flags: &[&str], out: &str| kld_of(&cand, &t, &d.join(out), flags);
    let declared = kld(&[], "d1");
    let recomputed = kld(&["--kv-cache", "fp8+computed"], "d2");
    assert_eq!(
        recomputed, computed,
        "the same weights, the same computed scales"
    );
    assert_ne!(recomputed, declared);
    // Computed scales belong to the per-tensor caches.
    let r = measure_short(
        Path::new(&model("shakespeare-bf16")),
        &t,
        &d.join("bad"),
        "100",
        &["--kv-cache", "q8_0", "--kv-cache-scales", "computed"],
    );
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert!(r.stderr.contains("per-tensor fp8"), "{}", r.stderr);
}

/// `--sweep kv_cache=none,q8_0,q4_0`: the same weights, the baseline's cache for the reference
/// and each other scheme's for the candidate; sweep.json lists each pair's KL and where top-1
/// flips sit, and each pair's measurement records its scheme.
#[test]
fn a_kv_cache_sweep_measures_each_scheme_against_the_baseline() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let text = short_text(d, 4000);
    let out = d.join("sweep");
    let model = model("shakespeare-bf16");
    let r = Cmd::measure()
        .flag("--sweep", "kv_cache=none,q8_0,q4_0")
        .candidate(&model)
        .eval_text(&text)
        .context_length(128)
        .out(&out)
        .run();
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(r.stdout.contains("largest KV-cache effect"), "{}", r.stdout);
    let sweep: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("sweep.json")).unwrap()).unwrap();
    assert_eq!(sweep["knob"], "kv_cache");
    let pairs = sweep["pairs"].as_array().unwrap();
    assert_eq!(pairs.len(), 2);
    let kld = |i: usize| pairs[i]["runs"][0]["kld_mean"].as_f64().unwrap();
    let flips = |i: usize| pairs[i]["runs"][0]["n_flips"].as_u64().unwrap();
    assert_eq!(pairs[0]["other"], "q8_0");
    assert_eq!(pairs[0]["environment"]["kv_cache_dtype"], "q8_0");
    assert!(
        kld(0) > 0.0 && kld(1) > 10.0 * kld(0),
        "{} {}",
        kld(0),
        kld(1)
    );
    assert!(flips(1) > flips(0), "{} {}", flips(0), flips(1));
    // Regression (#41): a scheme's damage was labelled the noise floor.
    assert_eq!(sweep["largest_kld_mean"].as_f64(), Some(kld(1)));
    assert!(sweep["noise_floor_kld_mean"].is_null(), "{sweep}");
    assert!(
        !r.stdout.contains("cross-kernel noise floor"),
        "{}",
        r.stdout
    );
    for p in pairs {
        assert!(out.join(p["measurement"].as_str().unwrap()).exists(), "{p}");
    }
    // The same pair through --kv-cache (the reference's cache is the baseline `none`): the same.
    let (direct, _, _) = self_with(d, &["--kv-cache", "q4_0"]);
    assert_eq!(direct, kld(1));
    // sweep.html: the table and one plot with a KLD line and a flip-rate line per setting.
    let page = std::fs::read_to_string(out.join("sweep.html")).unwrap();
    for needle in [
        "<h1>Sweep of <code>kv_cache</code> against <code>none</code></h1>",
        "<td><code>q8_0</code></td><td>128</td>",
        "<td><code>q4_0</code></td><td>128</td>",
        "<title>q8_0: mean KLD</title>",
        "<title>q4_0: mean KLD</title>",
        "<title>q4_0: top-1 flip rate</title>",
        "mean KLD (nats, log)",
    ] {
        assert!(page.contains(needle), "{needle} in {page}");
    }
    assert_eq!(
        page.matches("<svg").count(),
        1,
        "one context length, one plot"
    );
    assert!(
        !page.contains("<script") && !page.contains("http"),
        "self-contained"
    );
}

#[test]
fn kv_cache_flags_and_sweeps_that_cannot_run_are_refused_with_the_list() {
    let model = model("shakespeare-bf16");
    let base = Cmd::measure()
        .candidate(&model)
        .eval_text("examples/data/eval.txt")
        .context_length(128);
    for (extra, message) in [
        (
            &["--kv-cache", "int3"][..],
            "--kv-cache: `int3` is not a KV-cache scheme; use one of none, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1,",
        ),
        (
            &["--kv-cache-v", "int4"][..],
            "--kv-cache-v: `int4` is not a KV-cache scheme",
        ),
        (
            &["--sweep", "kv_cache=none,int3"][..],
            "`int3` is not a KV-cache scheme",
        ),
        (
            &["--sweep", "kv_cache=none,k:q8_0/v:int3+hadamard"][..],
            "`int3` is not a KV-cache scheme",
        ),
        // Regression (#41): a flag contradicting the label ran un-rotated, silently.
        (
            &["--kv-cache", "q4_0+hadamard", "--kv-cache-rotation", "none"][..],
            "--kv-cache-rotation none contradicts --kv-cache q4_0+hadamard",
        ),
        // An engine's cache type that is known but not emulated says so, and why.
        (
            &["--kv-cache", "int4_per_token_head"][..],
            "--kv-cache: `int4_per_token_head` is vLLM's, but its numerics (the channels per fp16 scale",
        ),
        (
            &["--kv-cache-k", "iq4_xs"][..],
            "--kv-cache-k: `iq4_xs` is a ggml weight type, not one llama.cpp accepts for its KV cache",
        ),
        // Refused from the flags alone, before any runner starts (the transformers one too).
        (
            &["--runner", "transformers", "--kv-cache", "exl3_q4+hadamard"][..],
            "llama.cpp's Hadamard rotation goes with its own cache types (q8_0, q4_0, ...), not with exl3_q4",
        ),
        (
            &["--kv-cache", "q4_0+rotated"][..],
            "`q4_0+rotated` is not a KV-cache setting: the suffixes are +hadamard",
        ),
        (
            &["--sweep", "attention=eager,sdpa"][..],
            "--sweep attention=... and gdn_kernel=... need --runner transformers",
        ),
        (
            &["--sweep", "kv_cache=none,q8_0", "--kv-cache", "q4_0"][..],
            "do not combine",
        ),
    ] {
        let r = base.clone().args(extra).run();
        assert_eq!(r.code, 2, "{extra:?}: {}", r.stderr);
        assert!(r.stderr.contains(message), "{extra:?}: {}", r.stderr);
    }
}

/// `kv_cache_dtype`'s one word leaves out what moves the number: a per-tensor fp8 cache needs
/// where its scale came from, llama.cpp's quantized types whether the Hadamard rotation ran.
/// `runtime.kv_cache` says both; an entry that contradicts the one-word name is an error.
#[test]
fn a_kv_cache_name_that_hides_its_scales_or_rotation_is_vague_until_the_entry_says_them() {
    let vague_at = |card: String, pointer: &str, words: &str| {
        let run = lint_text(&card);
        let f = run.finding("vague-disclosure");
        assert_eq!(f["pointer"], pointer, "{}", run.stdout);
        assert!(f["message"].as_str().unwrap().contains(words), "{f}");
        assert!(f["line"].as_u64().is_some(), "{f}");
    };
    let clean = |card: String| {
        let run = lint_text(&card);
        assert_eq!(run.codes(), Vec::<String>::new(), "{}", run.stdout);
        assert_eq!(run.code, 0);
    };
    let fp8 = |entry: &str| {
        compliant_with(
            "    kv_cache_dtype: bf16\n",
            &format!("    kv_cache_dtype: fp8_e4m3\n{entry}"),
        )
    };
    vague_at(
        fp8(""),
        "/fidelity/runtime/kv_cache_dtype",
        "runtime.kv_cache.scale_source",
    );
    vague_at(
        fp8("    kv_cache: {k: fp8_e4m3, v: fp8_e4m3}\n"),
        "/fidelity/runtime/kv_cache",
        "scale_source",
    );
    clean(fp8(
        "    kv_cache: {k: fp8_e4m3, v: fp8_e4m3, scale_source: checkpoint}\n",
    ));
    // A per-tensor scheme cannot have per-block scales.
    let run = lint_text(fp8(
        "    kv_cache: {k: fp8_e4m3, v: fp8_e4m3, scale_source: dynamic}\n",
    ));
    assert_eq!(run.code, 1);
    let f = run.finding("kv-cache-mismatch");
    assert_eq!(f["pointer"], "/fidelity/runtime/kv_cache/scale_source");

    let llama = |entry: &str| {
        compliant_with(
            "    engine: vllm\n    engine_version: \"0.11.1\"\n",
            "    engine: llama_cpp\n    engine_version: b7000\n",
        )
        .replace(
            "    kv_cache_dtype: bf16\n",
            &format!("    kv_cache_dtype: q8_0\n{entry}"),
        )
    };
    vague_at(
        llama(""),
        "/fidelity/runtime/kv_cache_dtype",
        "LLAMA_ATTN_ROT_DISABLE",
    );
    clean(llama(
        "    kv_cache: {k: q8_0, v: q8_0, rotation: hadamard}\n",
    ));
    clean(llama("    kv_cache: {k: q8_0, v: q8_0, rotation: none}\n"));
    // vLLM has no rotation: a q8_0 word there is not asked for one.
    assert!(
        !lint_text(compliant_with(
            "    kv_cache_dtype: bf16\n",
            "    kv_cache_dtype: q8_0\n"
        ))
        .codes()
        .contains(&"vague-disclosure".to_owned())
    );
}
