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
    assert_eq!(kv, "k:q4_0,v:none");
    assert!(k_only > 0.0 && k_only < q4, "k only {k_only}, both {q4}");
    let (mixed, kv, _) = self_with(dir.path(), &["--kv-cache", "q8_0", "--kv-cache-v", "q4_0"]);
    assert_eq!(kv, "k:q8_0,v:q4_0");
    assert!(mixed > q8 && mixed < q4, "{mixed}");
}

#[test]
fn an_unknown_kv_cache_scheme_is_refused_with_the_list() {
    let r = cardproof(&[
        "measure",
        "--reference",
        &model("shakespeare-bf16"),
        "--candidate",
        &model("shakespeare-bf16"),
        "--eval-text",
        "examples/data/eval.txt",
        "--context-length",
        "128",
        "--kv-cache",
        "int3",
    ]);
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert!(
        r.stderr
            .contains("--kv-cache: `int3` is not a KV-cache scheme")
            && r.stderr.contains("q8_0, q4_0, q4_1, q5_0, q5_1"),
        "{}",
        r.stderr
    );
    let r = cardproof(&[
        "measure",
        "--runner",
        "transformers",
        "--reference",
        &model("shakespeare-bf16"),
        "--candidate",
        &model("shakespeare-bf16"),
        "--eval-text",
        "examples/data/eval.txt",
        "--context-length",
        "128",
        "--kv-cache-v",
        "q4_0",
    ]);
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert!(r.stderr.contains("native runner only"), "{}", r.stderr);
}
