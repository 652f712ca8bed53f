//! Mixture-of-experts models in the native runner, through `measure`: a tiny random qwen3_moe
//! made by transformers 5.24 (tests/fixtures/moe, `make.py`) gives transformers' own rows, in
//! either expert layout; hostile MoE configs are refused with exit 2 naming the key.

use std::path::{Path, PathBuf};

use safetensors::{Dtype, SafeTensors, tensor::TensorView};

use crate::support::{Cmd, Run, copy_dir, edit_config, repo_root};

pub fn fixtures() -> PathBuf {
    repo_root().join("tests/fixtures/moe")
}

/// `measure` of `model` against itself on its eval.txt (windows of 32, no BOS), the native
/// runner's rows dumped into `dir/dump`.
pub fn measure_dump(model: &Path, dir: &Path, extra: &[&str]) -> Run {
    Cmd::measure()
        .reference(model)
        .candidate(model)
        .eval_text(model.join("eval.txt"))
        .context_length(32)
        .flag("--bos", "none")
        .bootstrap(10)
        .out(dir.join("out"))
        .flag("--dump-logits", dir.join("dump"))
        .arg("--json")
        .args(extra)
        .run()
}

fn f32s(t: &TensorView<'_>) -> Vec<f32> {
    assert_eq!(t.dtype(), Dtype::F32);
    t.data()
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

fn ints(t: &TensorView<'_>) -> Vec<i64> {
    match t.dtype() {
        Dtype::I32 => t
            .data()
            .chunks_exact(4)
            .map(|c| i64::from(i32::from_le_bytes(c.try_into().unwrap())))
            .collect(),
        Dtype::I64 => t
            .data()
            .chunks_exact(8)
            .map(|c| i64::from_le_bytes(c.try_into().unwrap()))
            .collect(),
        d => panic!("{d:?}"),
    }
}

fn log_softmax(row: &[f64]) -> Vec<f64> {
    let max = row.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let lse = max + row.iter().map(|v| (v - max).exp()).sum::<f64>().ln();
    row.iter().map(|v| v - lse).collect()
}

fn argmax(v: &[f64]) -> usize {
    (0..v.len()).max_by(|&a, &b| v[a].total_cmp(&v[b])).unwrap()
}

/// The dumped candidate rows against transformers' float32 rows in `rows` (make.py's
/// `<name>.rows.safetensors`): the same token windows, log-softmax within 1e-4 absolute,
/// identical top-1. Returns the largest difference.
pub fn dump_matches_transformers(dump: &Path, rows: &Path) -> f64 {
    let dumped = std::fs::read(dump.join("candidate.logits.safetensors")).unwrap();
    let dumped = SafeTensors::deserialize(&dumped).unwrap();
    let want = std::fs::read(rows).unwrap();
    let want = SafeTensors::deserialize(&want).unwrap();
    let ids_t = want.tensor("input_ids").unwrap();
    let [windows, ctx] = ids_t.shape()[..] else {
        panic!("input_ids is not 2-D")
    };
    assert_eq!(
        ints(&dumped.tensor("input_ids").unwrap()),
        ints(&ids_t),
        "cardproof's token windows are the ones transformers ran"
    );
    let reference = f32s(&want.tensor("logprobs_f32").unwrap());
    let vocab = reference.len() / (windows * ctx);
    let logits = f32s(&dumped.tensor("logits").unwrap());
    let window = ints(&dumped.tensor("window").unwrap());
    let position = ints(&dumped.tensor("positions").unwrap());
    assert!(!window.is_empty());
    assert_eq!(
        logits.len(),
        window.len() * vocab,
        "dumped rows are the vocabulary wide"
    );
    let mut worst = 0f64;
    for (i, (&w, &p)) in window.iter().zip(&position).enumerate() {
        let row: Vec<f64> = logits[i * vocab..(i + 1) * vocab]
            .iter()
            .map(|&v| f64::from(v))
            .collect();
        let lp = log_softmax(&row);
        let off = (w as usize * ctx + p as usize) * vocab;
        let r: Vec<f64> = reference[off..off + vocab]
            .iter()
            .map(|&v| f64::from(v))
            .collect();
        assert_eq!(argmax(&lp), argmax(&r), "top-1 of window {w} position {p}");
        for (a, b) in lp.iter().zip(&r) {
            worst = worst.max((a - b).abs());
        }
    }
    assert!(
        worst < 1e-4,
        "max |native - transformers| log-softmax = {worst:e}"
    );
    worst
}

#[test]
fn qwen3_moe_native_rows_match_transformers_through_measure() {
    let dir = tempfile::tempdir().unwrap();
    let model = fixtures().join("qwen3-moe");
    let run = measure_dump(&model, dir.path(), &[]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    dump_matches_transformers(
        &dir.path().join("dump"),
        &fixtures().join("qwen3-moe.rows.safetensors"),
    );
    let m = run.json();
    assert_eq!(
        m["runs"][0]["metrics"]["kld_mean"], 0.0,
        "the model against itself"
    );
    let record = m.to_string();
    assert!(
        record.contains("2 of 3 layers sparse: 8 experts of width 32, top-2 renormalised"),
        "the measurement records the experts: {record}"
    );
}

/// Rewrites a per-expert checkpoint into transformers' fused 3-D layout
/// (`save_pretrained(save_original_format=False)`): `experts.gate_up_proj` `[E, 2I, H]` (gate
/// first) and `experts.down_proj` `[E, H, I]`.
fn fuse_experts(file: &Path, experts: usize) {
    let bytes = std::fs::read(file).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let mut out: Vec<(String, Dtype, Vec<usize>, Vec<u8>)> = Vec::new();
    let mut fused = 0;
    for (name, t) in st.tensors() {
        let Some((mlp, rest)) = name.split_once(".experts.") else {
            out.push((
                name.clone(),
                t.dtype(),
                t.shape().to_vec(),
                t.data().to_vec(),
            ));
            continue;
        };
        if rest != "0.gate_proj.weight" {
            continue;
        }
        fused += 1;
        let get = |e: usize, p: &str| st.tensor(&format!("{mlp}.experts.{e}.{p}.weight")).unwrap();
        let g0 = get(0, "gate_proj");
        let (inter, hidden) = (g0.shape()[0], g0.shape()[1]);
        let mut gate_up = Vec::new();
        let mut down = Vec::new();
        for e in 0..experts {
            gate_up.extend_from_slice(get(e, "gate_proj").data());
            gate_up.extend_from_slice(get(e, "up_proj").data());
            down.extend_from_slice(get(e, "down_proj").data());
        }
        out.push((
            format!("{mlp}.experts.gate_up_proj"),
            g0.dtype(),
            vec![experts, 2 * inter, hidden],
            gate_up,
        ));
        out.push((
            format!("{mlp}.experts.down_proj"),
            g0.dtype(),
            vec![experts, hidden, inter],
            down,
        ));
    }
    assert_eq!(fused, 2, "both sparse layers rewritten");
    let views: Vec<(String, TensorView<'_>)> = out
        .iter()
        .map(|(n, d, s, b)| (n.clone(), TensorView::new(*d, s.clone(), b).unwrap()))
        .collect();
    safetensors::serialize_to_file(views, None, file).unwrap();
}

#[test]
fn fused_expert_tensors_give_the_same_rows_as_per_expert_ones() {
    let dir = tempfile::tempdir().unwrap();
    let fused = dir.path().join("fused");
    copy_dir(&fixtures().join("qwen3-moe"), &fused);
    fuse_experts(&fused.join("model.safetensors"), 8);
    let run = measure_dump(&fused, dir.path(), &[]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    dump_matches_transformers(
        &dir.path().join("dump"),
        &fixtures().join("qwen3-moe.rows.safetensors"),
    );
    // Bit for bit the per-expert checkpoint's rows.
    let per_expert = tempfile::tempdir().unwrap();
    let run = measure_dump(&fixtures().join("qwen3-moe"), per_expert.path(), &[]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    let a = std::fs::read(dir.path().join("dump/candidate.logits.safetensors")).unwrap();
    let b = std::fs::read(per_expert.path().join("dump/candidate.logits.safetensors")).unwrap();
    let logits = |bytes: &[u8]| {
        f32s(
            &SafeTensors::deserialize(bytes)
                .unwrap()
                .tensor("logits")
                .unwrap(),
        )
    };
    assert_eq!(logits(&a), logits(&b));
}

#[test]
fn hostile_moe_configs_exit_2_naming_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("m");
    for (edit, says) in [
        (
            serde_json::json!({"num_experts_per_tok": 9}),
            "num_experts_per_tok: 9 is more than num_experts 8",
        ),
        (
            serde_json::json!({"num_local_experts": 1u64 << 40}),
            "num_local_experts: must be an integer in 1..=4096",
        ),
        (
            serde_json::json!({"num_experts": 9}),
            "num_experts: 9 disagrees with num_local_experts 8",
        ),
        (
            serde_json::json!({"moe_intermediate_size": 0}),
            "moe_intermediate_size: must be an integer in 1..=",
        ),
        (
            serde_json::json!({"mlp_only_layers": [1, 3]}),
            "mlp_only_layers: entry 3 is not a layer index in 0..3",
        ),
        (
            serde_json::json!({"decoder_sparse_step": -1}),
            "decoder_sparse_step: must be an integer in 1..=3",
        ),
        // The config and the tensors disagree: layer 1 declared sparse holds a dense MLP.
        (
            serde_json::json!({"mlp_only_layers": []}),
            "model.layers.1.mlp.gate.weight: tensor missing from the checkpoint",
        ),
        // Experts of another width than the config's.
        (
            serde_json::json!({"moe_intermediate_size": 16}),
            "model.layers.0.mlp.experts.0.gate_proj: weight is [32, 64]; the config needs [16, 64]",
        ),
    ] {
        let _ = std::fs::remove_dir_all(&model);
        copy_dir(&fixtures().join("qwen3-moe"), &model);
        edit_config(&model, |c| {
            for (k, v) in edit.as_object().unwrap() {
                c[k] = v.clone();
            }
        });
        let run = measure_dump(&model, dir.path(), &[]);
        let message = run.message();
        assert_eq!(run.code, 2, "{edit}: {message}");
        assert!(message.contains(says), "{edit}: {message}");
        let file = run.json()["error"]["file"].as_str().unwrap().to_owned();
        assert!(file.contains("/m"), "names the file: {file}");
        assert!(!run.stderr.contains("panicked"), "{}", run.stderr);
    }
}

#[test]
fn a_missing_expert_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("m");
    copy_dir(&fixtures().join("qwen3-moe"), &model);
    let file = model.join("model.safetensors");
    let bytes = std::fs::read(&file).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let kept: Vec<(String, TensorView<'_>)> = st
        .tensors()
        .into_iter()
        .filter(|(n, _)| n != "model.layers.2.mlp.experts.7.down_proj.weight")
        .collect();
    let out = safetensors::serialize(kept, None).unwrap();
    std::fs::write(&file, out).unwrap();
    let run = measure_dump(&model, dir.path(), &[]);
    assert_eq!(run.code, 2, "{}", run.message());
    assert!(
        run.message()
            .contains("model.layers.2.mlp.experts.7.down_proj: no weight tensor"),
        "{}",
        run.message()
    );
}
