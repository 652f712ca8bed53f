//! `--runner transformers`: the request/response protocol against an exchange the real runner
//! recorded on a GPU (tests/fixtures/gpu), the error paths with stand-in runner programs, and
//! (ignored unless asked for, see `mod torch`) the real runner on CPU against the example models.

use std::path::{Path, PathBuf};

use assert_cmd::Command;
use safetensors::SafeTensors;

use crate::support::{Cmd, Run, model, repo_root, short_text};

fn fixture() -> PathBuf {
    repo_root().join("tests/fixtures/gpu")
}

fn run(env: &[(&str, &str)], args: &[&str]) -> Run {
    let mut cmd = Command::cargo_bin("cardproof").expect("binary builds");
    cmd.current_dir(repo_root()).env("NO_COLOR", "1").args(args);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let output = cmd.output().expect("binary runs");
    Run {
        code: output.status.code().expect("exited normally"),
        stdout: String::from_utf8(output.stdout).expect("UTF-8"),
        stderr: String::from_utf8(output.stderr).expect("UTF-8"),
    }
}

fn rel(a: f64, b: f64) -> f64 {
    ((a - b) / b.abs().max(1e-300)).abs()
}

/// f64/i32/u8 columns of a result or dump file.
fn columns(path: &Path) -> (Vec<u8>, Vec<String>) {
    let bytes = std::fs::read(path).unwrap();
    let names = SafeTensors::deserialize(&bytes)
        .unwrap()
        .names()
        .into_iter()
        .map(str::to_owned)
        .collect();
    (bytes, names)
}

fn f64s(bytes: &[u8], name: &str) -> Vec<f64> {
    let st = SafeTensors::deserialize(bytes).unwrap();
    let t = st.tensor(name).unwrap();
    t.data()
        .chunks_exact(8)
        .map(|c| f64::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

fn i32s(bytes: &[u8], name: &str) -> Vec<i32> {
    let st = SafeTensors::deserialize(bytes).unwrap();
    let t = st.tensor(name).unwrap();
    t.data()
        .chunks_exact(4)
        .map(|c| i32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

/// The runner's records for the dumped rows against `cardproof kld` on the dumped logits (the
/// same numbers, reduced by cardproof's own kernel): 1e-6 relative.
fn assert_reduction_agrees(dir: &Path) {
    let kld = Cmd::kld()
        .arg("--json")
        .reference(dir.join("reference.logits.safetensors"))
        .candidate(dir.join("candidate.logits.safetensors"))
        .run();
    assert_eq!(kld.code, 0, "{}", kld.stderr);
    let metrics = &kld.json()["metrics"];
    let n = kld.json()["n_positions"].as_u64().unwrap() as usize;
    let (bytes, names) = columns(&dir.join("run0.safetensors"));
    assert!(names.contains(&"forward".to_owned()));
    let take = |name: &str| f64s(&bytes, name)[..n].to_vec();
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
    let max = |v: &[f64]| v.iter().copied().fold(f64::MIN, f64::max);
    let (fwd, rev) = (take("forward"), take("reverse"));
    let (nll_ref, nll_cand) = (take("nll_ref"), take("nll_cand"));
    let top = |name: &str| i32s(&bytes, name)[..n].to_vec();
    let agree = top("ref_top1")
        .iter()
        .zip(top("cand_top1"))
        .filter(|(a, b)| **a == *b)
        .count() as f64
        / n as f64;
    for (name, ours, theirs) in [
        (
            "kld_mean",
            metrics["kld_mean"].as_f64().unwrap(),
            mean(&fwd),
        ),
        ("kld_max", metrics["kld_max"].as_f64().unwrap(), max(&fwd)),
        (
            "kld_reverse_mean",
            metrics["kld_reverse_mean"].as_f64().unwrap(),
            mean(&rev),
        ),
        (
            "ppl_ref",
            metrics["ppl_ref"].as_f64().unwrap(),
            mean(&nll_ref).exp(),
        ),
        (
            "ppl_cand",
            metrics["ppl_cand"].as_f64().unwrap(),
            mean(&nll_cand).exp(),
        ),
        (
            "top1_agreement",
            metrics["top1_agreement"].as_f64().unwrap(),
            agree,
        ),
    ] {
        assert!(
            rel(ours, theirs) < 1e-6,
            "{name}: cardproof {ours:e}, runner {theirs:e}"
        );
    }
}

#[test]
fn the_gpu_reduction_agrees_with_cardproofs_on_the_gpus_logits() {
    assert_reduction_agrees(&fixture());
}

#[test]
fn a_recorded_gpu_exchange_gives_the_recorded_measurement() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let script = fixture().join("replay_runner.py");
    let result = transformers_measure()
        .flag("--runner-script", &script)
        .reference(model("shakespeare-bf16"))
        .candidate(model("shakespeare-w8a16"))
        .eval_text("examples/data/eval.txt")
        .context_length(256)
        .out(&out)
        .arg("--json")
        .env("CARDPROOF_REPLAY", fixture())
        .run();
    assert_eq!(result.code, 0, "{}", result.stderr);
    let ours = result.json();
    let recorded: serde_json::Value =
        serde_json::from_slice(&std::fs::read(fixture().join("measurement.json")).unwrap())
            .unwrap();
    let (a, b) = (&ours["runs"][0]["metrics"], &recorded["runs"][0]["metrics"]);
    for (name, value) in b.as_object().unwrap() {
        let (x, y) = (a[name].as_f64().unwrap(), value.as_f64().unwrap());
        assert!(rel(x, y) < 1e-12, "{name}: {x} vs recorded {y}");
    }
    let env = &ours["environment"];
    assert_eq!(env["runner"], "transformers");
    assert!(env["device"].as_str().unwrap().contains("H200"), "{env}");
    assert_eq!(ours["fidelity"]["runtime"]["engine"], "transformers");
    assert_eq!(ours["protocol_sha256"], recorded["protocol_sha256"]);
}

/// A runner program that does not apply a KV-cache scheme it was asked for (the recorded GPU
/// exchange, replayed: its record says the model dtype) fails the run instead of passing off a
/// plain run as a quantized-cache one, and nothing is written.
#[test]
fn a_runner_that_ignores_the_kv_cache_scheme_asked_for_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let replay = fixture();
    let result = stand_in_measure(
        &replay.join("replay_runner.py"),
        &out,
        &[("CARDPROOF_REPLAY", replay.to_str().unwrap())],
        &["--kv-cache", "q8_0"],
    );
    assert_eq!(result.code, 2, "{}", result.stderr);
    assert!(
        result
            .stderr
            .contains("ran the candidate with KV cache `bfloat16` where `q8_0` was asked for"),
        "{}",
        result.stderr
    );
    assert!(!out.join("measurement.json").exists());
}

/// A stand-in runner program: Python source run in place of the real one.
fn stand_in(dir: &Path, source: &str) -> PathBuf {
    let path = dir.join("runner.py");
    std::fs::write(&path, source).unwrap();
    path
}

/// `measure --runner transformers`.
fn transformers_measure() -> Cmd {
    Cmd::measure().args(["--runner", "transformers"])
}

/// `measure` of the W8A16 example against BF16 through a stand-in runner script.
fn stand_in_measure(script: &Path, out: &Path, env: &[(&str, &str)], extra: &[&str]) -> Run {
    transformers_measure()
        .flag("--runner-script", script)
        .reference("examples/models/shakespeare-bf16")
        .candidate("examples/models/shakespeare-w8a16")
        .eval_text("examples/data/eval.txt")
        .context_length(256)
        .out(out)
        .args(extra)
        .envs(env)
        .run()
}

fn measure_with(script: &Path, extra: &[&str]) -> Run {
    let out = script.parent().unwrap().join("out");
    let r = stand_in_measure(script, &out, &[], extra);
    assert!(
        !out.join("measurement.json").exists(),
        "a failed run must leave no measurement"
    );
    r
}

const PRELUDE: &str = "import json, os, sys\nreq = json.load(open(sys.argv[1]))\ndef answer(doc):\n    json.dump(doc, open(req['record_path'], 'w'))\n";

#[test]
fn a_runner_that_crashes_without_a_record_is_an_error_with_its_last_words() {
    let dir = tempfile::tempdir().unwrap();
    let script = stand_in(
        dir.path(),
        "import sys\nprint('CUDA driver exploded', file=sys.stderr)\nsys.exit(1)\n",
    );
    let r = measure_with(&script, &[]);
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert!(
        r.stderr
            .contains("exited with status 1 without writing its record"),
        "{}",
        r.stderr
    );
    assert!(r.stderr.contains("CUDA driver exploded"), "{}", r.stderr);
}

#[test]
fn a_runner_killed_by_a_signal_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let script = stand_in(
        dir.path(),
        "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n",
    );
    let r = measure_with(&script, &[]);
    assert_eq!(r.code, 2);
    assert!(r.stderr.contains("killed by signal 9"), "{}", r.stderr);
}

/// A runner program that dies leaving a process behind (holding its output pipes, as a
/// compile worker or a data loader would) is an error at once, and what it left is killed with
/// it: cardproof no longer waits for the pipes to close.
#[test]
#[cfg(target_os = "linux")]
fn a_runner_that_leaves_a_process_behind_is_stopped_with_its_group() {
    let dir = tempfile::tempdir().unwrap();
    let pgid = dir.path().join("pgid");
    let script = stand_in(
        dir.path(),
        &format!(
            "import os, subprocess, sys\nsubprocess.Popen(['sleep', '1000'])\nopen({:?}, 'w').write(str(os.getpgid(0)))\nprint('dying, a child left behind', file=sys.stderr)\nsys.exit(1)\n",
            pgid.display().to_string()
        ),
    );
    let started = std::time::Instant::now();
    let r = measure_with(&script, &[]);
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert!(
        started.elapsed() < std::time::Duration::from_secs(60),
        "{:?}",
        started.elapsed()
    );
    assert!(
        r.stderr.contains("dying, a child left behind"),
        "{}",
        r.stderr
    );
    let group: u32 = std::fs::read_to_string(&pgid).unwrap().parse().unwrap();
    let left = crate::support::alive_in_groups(&[group]);
    assert!(left.is_empty(), "left running: {left:?}");
}

/// A runner program that hangs (prints nothing for the stall timeout) is stopped with its group
/// and is an error naming the limit.
#[test]
#[cfg(target_os = "linux")]
fn a_runner_that_prints_nothing_for_its_stall_timeout_is_stopped() {
    let dir = tempfile::tempdir().unwrap();
    let pgid = dir.path().join("pgid");
    let script = stand_in(
        dir.path(),
        &format!(
            "import os, sys, time\nopen({:?}, 'w').write(str(os.getpgid(0)))\nprint('loading', file=sys.stderr)\ntime.sleep(1000)\n",
            pgid.display().to_string()
        ),
    );
    let out = dir.path().join("out");
    let started = std::time::Instant::now();
    let r = stand_in_measure(
        &script,
        &out,
        &[("CARDPROOF_TRANSFORMERS_STALL_SECS", "1")],
        &[],
    );
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert!(
        started.elapsed() < std::time::Duration::from_secs(60),
        "{:?}",
        started.elapsed()
    );
    assert!(
        r.stderr
            .contains("printed nothing for 1 s: stopped as stalled")
            && r.stderr.contains("CARDPROOF_TRANSFORMERS_STALL_SECS")
            && r.stderr.contains("loading"),
        "{}",
        r.stderr
    );
    let group: u32 = std::fs::read_to_string(&pgid).unwrap().parse().unwrap();
    let left = crate::support::alive_in_groups(&[group]);
    assert!(left.is_empty(), "left running: {left:?}");
    assert!(!out.join("measurement.json").exists());
}

/// Output without newlines is read in lines cut at a length: the error quotes a bounded tail,
/// and cardproof's memory does not grow with the line.
#[test]
fn a_runner_printing_one_endless_line_is_read_in_capped_lines() {
    let dir = tempfile::tempdir().unwrap();
    let script = stand_in(
        dir.path(),
        "import sys\nsys.stderr.write('x' * 50_000_000)\nsys.exit(1)\n",
    );
    let r = measure_with(&script, &[]);
    assert_eq!(r.code, 2, "{}", r.transcript());
    assert!(r.stderr.contains("xxxx"), "{}", r.transcript());
    assert!(
        r.stderr.len() < 64 << 10,
        "{} bytes of stderr",
        r.stderr.len()
    );
}

#[test]
fn a_structured_runner_error_reaches_the_user() {
    let dir = tempfile::tempdir().unwrap();
    let script = stand_in(
        dir.path(),
        &format!(
            "{PRELUDE}answer({{'protocol': 1, 'ok': False, 'error': {{'kind': 'out_of_memory_plan', 'message': 'the run needs about 99.0 GiB but 80.0 GiB is free on cuda'}}}})\nsys.exit(3)\n"
        ),
    );
    let r = measure_with(&script, &[]);
    assert_eq!(r.code, 2);
    assert!(
        r.stderr
            .contains("failed (out_of_memory_plan): the run needs about 99.0 GiB"),
        "{}",
        r.stderr
    );
}

#[test]
fn a_record_in_another_protocol_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let script = stand_in(
        dir.path(),
        &format!("{PRELUDE}answer({{'protocol': 2, 'ok': True, 'runs': []}})\n"),
    );
    let r = measure_with(&script, &[]);
    assert_eq!(r.code, 2);
    assert!(r.stderr.contains("answered in protocol 2"), "{}", r.stderr);
}

#[test]
fn a_result_with_other_rows_than_asked_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    // A well-formed result file of 3 rows, whatever the request asked for.
    let writer = r#"
os.makedirs(req['result_dir'], exist_ok=True)
path = os.path.join(req['result_dir'], 'run0.safetensors')
f = ('F64', 'd', [0.1, 0.2, 0.3])
i = ('I32', 'i', [0, 0, 0])
save(path, {'forward': f, 'reverse': f, 'ref_top1_prob': f, 'nll_ref': f, 'nll_cand': f,
            'ref_top1': i, 'cand_top1': i, 'window': i, 'position': ('I64', 'q', [0, 1, 2]),
            'finite': ('U8', 'B', [1, 1, 1])})
answer({'protocol': 1, 'ok': True, 'runs': [{'path': path}], 'environment': {}, 'gates': None})
"#;
    let script = stand_in(dir.path(), &format!("{PRELUDE}{SAVE_SAFETENSORS}{writer}"));
    let r = measure_with(&script, &[]);
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert!(r.stderr.contains("run0.safetensors"), "{}", r.stderr);
    assert!(r.stderr.contains("expected F64 ["), "{}", r.stderr);
}

#[test]
fn a_missing_interpreter_says_how_to_name_one() {
    let r = transformers_measure()
        .flag("--python", "/nonexistent/python3")
        .reference("examples/models/shakespeare-bf16")
        .candidate("examples/models/shakespeare-w8a16")
        .eval_text("examples/data/eval.txt")
        .context_length(256)
        .out(tempfile::tempdir().unwrap().path())
        .run();
    assert_eq!(r.code, 2);
    assert!(
        r.stderr.contains("cannot start the transformers runner") && r.stderr.contains("--python"),
        "{}",
        r.stderr
    );
}

#[test]
fn runner_flags_are_validated_before_any_work() {
    let base = Cmd::measure()
        .reference("examples/models/shakespeare-bf16")
        .candidate("examples/models/shakespeare-w8a16")
        .eval_text("examples/data/eval.txt")
        .context_length(256);
    for (extra, message) in [
        (
            &["--sweep", "attention=sdpa,eager"][..],
            "--sweep attention=... and gdn_kernel=... need --runner transformers",
        ),
        (
            &["--runner", "transformers", "--device", "tpu"][..],
            "--device tpu: expected cuda, cuda:N, auto or cpu",
        ),
        (
            &["--runner", "transformers", "--attention", "magic"][..],
            "attention \"magic\" is not one of",
        ),
        (
            &["--runner", "transformers", "--sweep", "attention=sdpa"][..],
            "give at least two values",
        ),
        (
            &["--runner", "transformers", "--sweep", "dtype=bf16,f32"][..],
            "the knob can be `attention` or `gdn_kernel`",
        ),
        (
            &["--runner", "transformers", "--gdn-kernel", "triton"][..],
            "--gdn-kernel: GDN kernel \"triton\" is not one of fla, fla_recurrent, torch, torch_recurrent",
        ),
        (
            &["--runner", "transformers", "--attention", "sdpa:fast"][..],
            "attention \"sdpa:fast\" is not one of",
        ),
        (
            &[
                "--runner",
                "transformers",
                "--vocab",
                "top-k",
                "--top-k",
                "8",
            ][..],
            "--runner transformers computes full-vocabulary KL only",
        ),
    ] {
        let r = base.clone().args(extra).run();
        assert_eq!(r.code, 2, "{extra:?}: {}", r.stderr);
        assert!(r.stderr.contains(message), "{extra:?}: {}", r.stderr);
    }
}

#[test]
fn a_gguf_model_is_refused_before_any_work() {
    let out = tempfile::tempdir().unwrap();
    let r = transformers_measure()
        .flag("--python", "/nonexistent/python3")
        .reference("examples/models/shakespeare-bf16")
        .candidate("examples/models/shakespeare-q4_0-gguf")
        .eval_text("examples/data/eval.txt")
        .context_length(256)
        .out(out.path())
        .run();
    assert_eq!(r.code, 2);
    assert!(
        r.stderr.contains("examples/models/shakespeare-q4_0-gguf: the transformers runner loads safetensors checkpoint directories; GGUF runs with --runner native"),
        "{}",
        r.stderr
    );
    assert_eq!(std::fs::read_dir(out.path()).unwrap().count(), 0);
}

/// A stand-in runner's writer of a safetensors file: `save(path, {name: (dtype, struct
/// format, values)})`.
const SAVE_SAFETENSORS: &str = r#"
import struct
def save(path, cols):
    header, blobs, off = {}, [], 0
    for name, (dtype, fmt, values) in cols.items():
        blob = struct.pack('<%d%s' % (len(values), fmt), *values)
        header[name] = {'dtype': dtype, 'shape': [len(values)], 'data_offsets': [off, off + len(blob)]}
        off += len(blob)
        blobs.append(blob)
    h = json.dumps(header).encode()
    h += b' ' * (-len(h) % 8)
    with open(path, 'wb') as f:
        f.write(struct.pack('<Q', len(h)) + h + b''.join(blobs))
"#;

/// A stand-in runner that answers any request with well-formed rows (KL 0 on every row
/// asked) and, for `turns`, every prompt's turn as `max_new_tokens` copies of a token that is no
/// stop, the reference's with its timing (the candidate's without, as an older runner program
/// answers); `CARDPROOF_TURN_FAULT` spoils the candidate's: `count` (a turn missing), `id` (an id
/// outside the vocabulary), `long` (a turn over the budget), `timing` (a timing that counts
/// other tokens than its turns hold). It keeps the request it was given as `seen.json` beside
/// itself.
const TURNS_STAND_IN: &str = r#"
import shutil
shutil.copy(sys.argv[1], os.path.join(os.path.dirname(os.path.abspath(__file__)), 'seen.json'))
os.makedirs(req['result_dir'], exist_ok=True)
runs = []
for i, run in enumerate(req['runs']):
    per = run.get('window_rows') or [run['rows']] * run['n_windows']
    window = [w for w, rows in enumerate(per) for _ in rows]
    position = [j for rows in per for j in rows]
    n = len(position)
    zero, top = ('F64', 'd', [0.0] * n), ('I32', 'i', [0] * n)
    path = os.path.join(req['result_dir'], 'run%d.safetensors' % i)
    save(path, {'forward': zero, 'reverse': zero, 'ref_top1_prob': ('F64', 'd', [1.0] * n),
                'nll_ref': zero, 'nll_cand': zero, 'ref_top1': top, 'cand_top1': top,
                'window': ('I32', 'i', window), 'position': ('I64', 'q', position),
                'finite': ('U8', 'B', [1] * n)})
    runs.append({'path': path, 'context_length': run['context_length'], 'rows': n})
t = req['turns']
token = next(i for i in range(t['used']) if i not in t['stops'])
def turns():
    return [{'tokens': [token] * t['max_new_tokens'], 'stop': 'max_tokens'} for _ in t['prompt_lengths']]
engine = {'attention': 'sdpa', 'dtype': 'float32', 'kv_cache': None, 'prefix_reuse': 'crop', 'prefilled_tokens': max(t['prompt_lengths'])}
candidate = turns()
fault = os.environ.get('CARDPROOF_TURN_FAULT')
if fault == 'count':
    candidate.pop()
elif fault == 'id':
    candidate[1]['tokens'][0] = t['used']
elif fault == 'long':
    candidate[0]['tokens'].append(token)
def timing(generated):
    return {'prefill_tokens': engine['prefilled_tokens'], 'prefill_seconds': 0.5,
            'generated_tokens': generated, 'decode_seconds': 0.25}
cand = {'engine': engine, 'seconds': 0.0, 'turns': candidate}
if fault == 'timing':
    cand['timing'] = timing(1)
answer({'protocol': 1, 'ok': True, 'runs': runs, 'environment': {}, 'gates': None,
        'turns': {'reference': {'engine': engine, 'seconds': 0.0, 'turns': turns(),
                                'timing': timing(t['max_new_tokens'] * len(t['prompt_lengths']))},
                  'candidate': cand}})
"#;

/// `--turns` in the transformers lane through a stand-in runner: the request carries every
/// turn's prompt, the stop ids, the budget and the vocabulary; the answer's turns are recorded
/// with the engine that generated them, and each model's timing where the runner measured it;
/// and an answer whose turns are malformed (a turn missing, an id outside the vocabulary, a turn
/// over the budget, a timing of other tokens) is an error naming the turn and the fault, with no
/// measurement written.
#[test]
fn the_transformers_lane_asks_for_turns_and_checks_every_turn_it_gets_back() {
    let dir = tempfile::tempdir().unwrap();
    let (conversation, template) = crate::conversation::short_conversation(dir.path(), 12);
    let script = stand_in(
        dir.path(),
        &format!("{PRELUDE}{SAVE_SAFETENSORS}{TURNS_STAND_IN}"),
    );
    let measure = |out: &str, fault: &str| {
        transformers_measure()
            .flag("--runner-script", &script)
            .reference(model("shakespeare-bf16"))
            .candidate(model("shakespeare-w8a16"))
            .eval_text(&conversation)
            .flag("--chat-template", &template)
            .context_length(128)
            .bootstrap(50)
            .args(["--turns", "all", "--max-new-tokens", "3"])
            .out(dir.path().join(out))
            .env("CARDPROOF_TURN_FAULT", fault)
            .run()
    };
    let r = measure("ok", "");
    assert_eq!(r.code, 0, "{}", r.stderr);
    let m: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.path().join("ok/measurement.json")).unwrap())
            .unwrap();
    let t = &m["turns"];
    assert_eq!(t["generated_by"]["runner"], "transformers", "{t}");
    assert_eq!(t["generated_by"]["candidate"]["prefix_reuse"], "crop");
    assert_eq!(t["summary"]["turn_match"]["value"], 1.0, "{t}");
    let timing = &t["timings"]["reference"];
    assert_eq!(timing["generated_tokens"], 15, "{t}");
    assert_eq!(timing["decode_seconds"], 0.25, "{t}");
    assert_eq!(
        timing["prefill_tokens"],
        t["generated_by"]["reference"]["prefilled_tokens"]
    );
    assert!(t["timings"].get("candidate").is_none(), "{t}");
    let seen: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.path().join("seen.json")).unwrap()).unwrap();
    let asked = &seen["turns"];
    assert_eq!(asked["max_new_tokens"], 3);
    assert_eq!(asked["stops"], t["stop_ids"]);
    assert_eq!(asked["used"], 2048);
    let lengths: Vec<u64> = asked["prompt_lengths"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n.as_u64().unwrap())
        .collect();
    let recorded: Vec<u64> = t["turns"]
        .as_array()
        .unwrap()
        .iter()
        .map(|turn| turn["prompt_tokens"].as_u64().unwrap())
        .collect();
    assert_eq!(lengths, recorded);
    for (fault, message) in [
        ("count", "4 generated turns for the 5 prompts asked"),
        (
            "id",
            "turn 2: token 1 is id 2048, outside the 2048 token ids of the vocabulary",
        ),
        ("long", "turn 1: 4 tokens, over max_new_tokens 3"),
        (
            "timing",
            "timing.generated_tokens 1 is not the 15 tokens of the turns",
        ),
    ] {
        let r = measure(fault, fault);
        assert_eq!(r.code, 2, "{fault}: {}", r.stderr);
        assert!(
            r.stderr.contains("generated turns for this model") && r.stderr.contains(message),
            "{fault}: {}",
            r.stderr
        );
        assert!(
            r.stderr.contains("shakespeare-w8a16"),
            "{fault}: {}",
            r.stderr
        );
        assert!(!dir.path().join(fault).join("measurement.json").exists());
    }
}

/// The real runner on CPU against the example models. These need torch and transformers, so
/// they are ignored by default; `.ci/run` installs both and runs them with
/// `cargo test --test it transformers::torch -- --ignored`, where a missing torch fails them.
mod torch {
    use super::*;

    /// The real runner on CPU needs torch and transformers importable by the interpreter the runner
    /// uses (`CARDPROOF_PYTHON`, else `python3`). An ignored test asked to run fails without them.
    #[track_caller]
    fn require_torch() {
        let python = std::env::var_os("CARDPROOF_PYTHON").unwrap_or_else(|| "python3".into());
        let probe = std::process::Command::new(&python)
            .args(["-c", "import torch, transformers, safetensors"])
            .output();
        match probe {
            Ok(out) if out.status.success() => {}
            Ok(out) => panic!(
                "needs torch and transformers, and {} cannot import them: {}",
                python.display(),
                String::from_utf8_lossy(&out.stderr).trim()
            ),
            Err(e) => panic!(
                "needs torch and transformers, and {} does not start: {e}",
                python.display()
            ),
        }
    }

    fn cpu_measure(dir: &Path, candidate: &str, extra: &[&str]) -> Run {
        cpu_measure_pair(dir, "examples/models/shakespeare-bf16", candidate, extra)
    }

    /// The real runner on CPU in float32, windows of 128 tokens of a short text, into `dir/out`.
    fn cpu_measure_pair(dir: &Path, reference: &str, candidate: &str, extra: &[&str]) -> Run {
        let text = short_text(dir, 6000);
        let out = dir.join("out");
        cpu_float32()
            .reference(reference)
            .candidate(candidate)
            .eval_text(&text)
            .context_length(128)
            .out(&out)
            .arg("--json")
            .args(extra)
            .run()
    }

    /// `measure` in the real runner on CPU in float32.
    fn cpu_float32() -> Cmd {
        transformers_measure().args(["--device", "cpu", "--torch-dtype", "float32"])
    }

    /// Writes two tiny random Qwen3.5 vision-language checkpoints (hybrid: three Gated DeltaNet
    /// layers, then full attention; text weights under `model.language_model.*`, a vision tower
    /// beside them) with the example's tokenizer: the reference, and the candidate with every
    /// weight perturbed.
    fn tiny_qwen3_5_pair(dir: &Path) -> (PathBuf, PathBuf) {
        let script = dir.join("make_qwen3_5.py");
        std::fs::write(
            &script,
            r#"import glob, shutil, sys, torch
from transformers import Qwen3_5Config
from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5ForConditionalGeneration
torch.manual_seed(0)
text = dict(vocab_size=2048, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
            num_attention_heads=4, num_key_value_heads=2, head_dim=16, linear_num_key_heads=2,
            linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=16,
            linear_conv_kernel_dim=4, full_attention_interval=4, max_position_embeddings=1024,
            tie_word_embeddings=False)
vision = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64)
config = Qwen3_5Config(text_config=text, vision_config=vision, tie_word_embeddings=False)
model = Qwen3_5ForConditionalGeneration(config).eval()
out, tokenizer = sys.argv[1], sys.argv[2]
for name, noise in (("reference", 0.0), ("candidate", 0.02)):
    with torch.no_grad():
        for p in model.parameters():
            p.add_(noise * torch.randn_like(p))
    model.save_pretrained(f"{out}/{name}")
    for f in glob.glob(f"{tokenizer}/tokenizer*"):
        shutil.copy(f, f"{out}/{name}/")
"#,
        )
        .unwrap();
        let python = std::env::var_os("CARDPROOF_PYTHON").unwrap_or_else(|| "python3".into());
        let made = std::process::Command::new(&python)
            .arg(&script)
            .arg(dir)
            .arg(model("shakespeare-bf16"))
            .output()
            .unwrap();
        assert!(
            made.status.success(),
            "{}",
            String::from_utf8_lossy(&made.stderr)
        );
        (dir.join("reference"), dir.join("candidate"))
    }

    #[test]
    #[ignore = "needs torch and transformers: cargo test --test it transformers::torch -- --ignored"]
    fn a_hybrid_qwen3_5_vision_language_checkpoint_is_measured_on_its_text_model() {
        require_torch();
        let dir = tempfile::tempdir().unwrap();
        let (reference, candidate) = tiny_qwen3_5_pair(dir.path());
        let dump = dir.path().join("dump");
        let r = cpu_measure_pair(
            dir.path(),
            reference.to_str().unwrap(),
            candidate.to_str().unwrap(),
            &["--runner-dump", dump.to_str().unwrap()],
        );
        assert_eq!(r.code, 0, "{}", r.stderr);
        let doc = r.json();
        assert!(
            doc["runs"][0]["metrics"]["kld_mean"].as_f64().unwrap() > 1e-6,
            "{doc}"
        );
        assert_eq!(doc["environment"]["tokenizer"]["vocab_size"], 2048);
        // The head is the text model's own, read without the native runner's architectures.
        let head = doc["reference"]["lm_head_sha256"].as_str().unwrap();
        assert_eq!(head.len(), 64, "{doc}");
        assert_ne!(head, doc["candidate"]["lm_head_sha256"].as_str().unwrap());
        assert_reduction_agrees(&dump);
    }

    /// tests/fixtures/hybrid/make.py with a fresh seed into `dir`: new random Qwen3.5 (text and
    /// VLM layouts), Qwen3-Next (dense, and with expert layers) and Qwen3.5-MoE models, and
    /// transformers' rows for each.
    fn fresh_hybrid_models(dir: &Path) {
        let python = std::env::var_os("CARDPROOF_PYTHON").unwrap_or_else(|| "python3".into());
        let made = std::process::Command::new(&python)
            .arg(repo_root().join("tests/fixtures/hybrid/make.py"))
            .arg(dir)
            .arg("--next-out")
            .arg(dir.join("next"))
            .args(["--seed", "2026"])
            .output()
            .unwrap();
        assert!(
            made.status.success(),
            "{}",
            String::from_utf8_lossy(&made.stderr)
        );
    }

    #[test]
    #[ignore = "needs torch and transformers: cargo test --test it transformers::torch -- --ignored"]
    fn the_native_runner_matches_transformers_on_fresh_random_hybrid_models() {
        use crate::hybrid::{
            TOKENS, agrees_with_transformers, f64_disagreement, measure_pair, rows_of,
        };
        require_torch();
        let dir = tempfile::tempdir().unwrap();
        fresh_hybrid_models(dir.path());
        let eval = dir.path().join("eval.txt");
        for (reference, candidate, rows) in [
            ("qwen3_5_text", "qwen3_5_vlm", "rows.safetensors"),
            (
                "next/qwen3_next",
                "next/qwen3_next",
                "next/rows.safetensors",
            ),
            (
                "moe/qwen3_next_moe",
                "moe/qwen3_next_moe",
                "moe/qwen3_next_moe.rows.safetensors",
            ),
            (
                "moe/qwen3_5_moe_text",
                "moe/qwen3_5_moe_text",
                "moe/qwen3_5_moe_text.rows.safetensors",
            ),
        ] {
            let work = tempfile::tempdir().unwrap();
            let doc = measure_pair(
                work.path(),
                &dir.path().join(reference),
                &dir.path().join(candidate),
                &eval,
                TOKENS,
            );
            assert_eq!(doc["runs"][0]["metrics"]["kld_mean"], 0.0, "{doc}");
            let (ids, want, want64) = rows_of(&dir.path().join(rows));
            let worst = agrees_with_transformers(work.path(), &want);
            assert!(worst < 1e-4, "{reference}: f32 max |Δ log p| = {worst:e}");
            let worst = f64_disagreement(&dir.path().join(reference), &ids, &want64);
            assert!(worst < 1e-9, "{reference}: f64 max |Δ log p| = {worst:e}");
        }
    }

    #[test]
    #[ignore = "needs torch and transformers: cargo test --test it transformers::torch -- --ignored"]
    fn a_hybrid_run_on_cpu_records_the_torch_fallback_kernels_and_float32_states() {
        require_torch();
        let dir = tempfile::tempdir().unwrap();
        let (reference, candidate) = tiny_qwen3_5_pair(dir.path());
        let r = cpu_measure_pair(
            dir.path(),
            reference.to_str().unwrap(),
            candidate.to_str().unwrap(),
            &[],
        );
        assert_eq!(r.code, 0, "{}", r.stderr);
        let doc = r.json();
        let env = &doc["environment"];
        // CI's CPU has neither flash-linear-attention nor causal-conv1d: transformers' own torch
        // functions ran, as observed on the calls, and the states are what the cache held.
        let la = &env["linear_attention"];
        assert_eq!(la["layers"], 3, "{env}");
        assert_eq!(la["gdn_kernel"], "torch_fallback", "{env}");
        assert_eq!(
            la["gdn_function"],
            "transformers.models.qwen3_5.modeling_qwen3_5.torch_chunk_gated_delta_rule"
        );
        assert_eq!(la["causal_conv1d"], "torch_fallback", "{env}");
        assert_eq!(
            la["causal_conv1d_function"],
            "transformers.models.qwen3_5.modeling_qwen3_5.causal_conv1d_fn"
        );
        assert_eq!(la["packages"], serde_json::json!([]));
        // Each window in one pass stores no state: the kernels are observed on the warm-up's
        // pass and no cached pass is probed (it would compile kernels the run never runs).
        assert!(la["recurrent_state_dtype"].is_null(), "{env}");
        assert!(la["conv_state_dtype"].is_null(), "{env}");
        assert!(
            la["observed_in"].as_str().unwrap().contains("one-pass"),
            "{env}"
        );
        // Both sides ran the same: no separate reference record.
        assert!(env.get("reference_linear_attention").is_none(), "{env}");
        assert_eq!(
            env["transformers_runner"]["linear_attention"]["reference"],
            *la
        );
        // In prefill chunks the states are stored, and read back from the cache.
        let chunked = cpu_measure_pair(
            dir.path(),
            reference.to_str().unwrap(),
            candidate.to_str().unwrap(),
            &["--prefill-chunk", "64", "--force"],
        );
        assert_eq!(chunked.code, 0, "{}", chunked.stderr);
        let la = chunked.json()["environment"]["linear_attention"].clone();
        assert_eq!(la["recurrent_state_dtype"], "float32", "{la}");
        assert_eq!(la["conv_state_dtype"], "float32", "{la}");
        assert_eq!(la["gdn_kernel"], "torch_fallback", "{la}");
    }

    #[test]
    #[ignore = "needs torch and transformers: cargo test --test it transformers::torch -- --ignored"]
    fn a_bf16_recurrent_state_at_prefill_chunks_moves_transformers_as_it_moves_the_native_runner() {
        require_torch();
        let dir = tempfile::tempdir().unwrap();
        let (reference, _) = tiny_qwen3_5_pair(dir.path());
        let reference = reference.to_str().unwrap();
        let knobs = ["--prefill-chunk", "32", "--recurrent-state-dtype", "bf16"];
        let torch_run = cpu_measure_pair(dir.path(), reference, reference, &knobs);
        assert_eq!(torch_run.code, 0, "{}", torch_run.stderr);
        let torch_doc = torch_run.json();
        let native_run = Cmd::measure()
            .reference(reference)
            .candidate(reference)
            .eval_text(dir.path().join("eval.txt"))
            .context_length(128)
            .out(dir.path().join("native"))
            .arg("--json")
            .args(knobs)
            .run();
        assert_eq!(native_run.code, 0, "{}", native_run.stderr);
        let native_doc = native_run.json();
        for doc in [&torch_doc, &native_doc] {
            assert_eq!(doc["protocol"]["prefill_chunk"], 32, "{}", doc["protocol"]);
            assert_eq!(doc["environment"]["recurrent_state_dtype"], "bf16");
        }
        // The runner records the knob on the candidate's model and prefilled in the protocol's
        // chunks.
        let model = &torch_doc["environment"]["transformers_runner"]["models"]["candidate"];
        assert_eq!(model["recurrent_state"], "bf16", "{model}");
        // The same rounding at the same places: both runners move the candidate by the same
        // KL (the f32 forward passes differ in their last bits, so a few state entries round
        // the other way; the means agree to a few percent, and both are far from 0).
        let kld = |doc: &serde_json::Value| doc["runs"][0]["metrics"]["kld_mean"].as_f64().unwrap();
        let (t, n) = (kld(&torch_doc), kld(&native_doc));
        assert!(t > 0.0 && n > 0.0, "torch {t:e}, native {n:e}");
        assert!(rel(t, n) < 0.05, "torch {t:e} vs native {n:e}");
        // An f32 state at the same chunks: both sides are the reference's, exactly.
        let again = cpu_measure_pair(
            dir.path(),
            reference,
            reference,
            &["--prefill-chunk", "32", "--force"],
        );
        assert_eq!(again.code, 0, "{}", again.stderr);
        assert_eq!(again.json()["runs"][0]["metrics"]["kld_mean"], 0.0);
    }

    #[test]
    #[ignore = "needs torch and transformers: cargo test --test it transformers::torch -- --ignored"]
    fn the_cpu_runner_agrees_with_cardproofs_reduction_of_its_own_logits() {
        require_torch();
        let dir = tempfile::tempdir().unwrap();
        let dump = dir.path().join("dump");
        let r = cpu_measure(
            dir.path(),
            "examples/models/shakespeare-fp8-block",
            &["--runner-dump", dump.to_str().unwrap()],
        );
        assert_eq!(r.code, 0, "{}", r.stderr);
        let doc = r.json();
        assert_eq!(doc["environment"]["runner"], "transformers");
        assert_eq!(
            doc["environment"]["transformers_runner"]["reduction_kernel"],
            "torch"
        );
        assert!(doc["runs"][0]["metrics"]["kld_mean"].as_f64().unwrap() > 1e-4);
        assert_reduction_agrees(&dump);
        // The exchange kept by --runner-dump, and the measurement, against their schemas.
        for (name, path) in [
            ("runner-request", dump.join("request.json")),
            ("runner-record", dump.join("record.json")),
            ("measurement", dir.path().join("out/measurement.json")),
        ] {
            let doc: serde_json::Value =
                serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
            crate::output_schemas::assert_valid(name, &path.display().to_string(), &doc);
        }
    }

    /// A package the run needs and the Python lacks (here flash-attn, which CPU machines never
    /// have) is named as the environment's problem, without a traceback, and nothing is written.
    #[test]
    #[ignore = "needs torch and transformers: cargo test --test it transformers::torch -- --ignored"]
    fn a_missing_package_is_reported_as_missing_not_as_an_internal_error() {
        require_torch();
        let dir = tempfile::tempdir().unwrap();
        let r = cpu_measure(
            dir.path(),
            "examples/models/shakespeare-bf16",
            &["--attention", "flash_attention_2"],
        );
        assert_eq!(r.code, 2, "{}", r.stderr);
        let message = r.message();
        assert!(
            message.contains("(missing_package)") && message.contains("FlashAttention2"),
            "{message}"
        );
        assert!(!message.contains("Traceback"), "{message}");
        assert!(!dir.path().join("out/measurement.json").exists());
    }

    #[test]
    #[ignore = "needs torch and transformers: cargo test --test it transformers::torch -- --ignored"]
    fn a_run_that_cannot_fit_is_refused_before_loading() {
        require_torch();
        let dir = tempfile::tempdir().unwrap();
        let r = cpu_measure(
            dir.path(),
            "examples/models/shakespeare-fp8-block",
            &["--memory-limit", "1000000"],
        );
        assert_eq!(r.code, 2, "{}", r.stderr);
        // With --json the error is the document's, not repeated on stderr.
        let message = r.message();
        assert!(
            message.contains("out_of_memory_plan") && message.contains("is free on cpu"),
            "{message}"
        );
    }

    /// `measure --sweep SWEEP` of the bf16 example in the real runner on CPU, float32, windows
    /// of 128 tokens of `text`, into `out`, with `--json`.
    fn cpu_sweep(text: &Path, out: &Path, sweep: &str) -> Run {
        cpu_float32()
            .flag("--sweep", sweep)
            .candidate("examples/models/shakespeare-bf16")
            .eval_text(text)
            .context_length(128)
            .out(out)
            .arg("--json")
            .run()
    }

    #[test]
    #[ignore = "needs torch and transformers: cargo test --test it transformers::torch -- --ignored"]
    fn an_attention_sweep_measures_the_kernel_alone() {
        require_torch();
        let dir = tempfile::tempdir().unwrap();
        let text = short_text(dir.path(), 6000);
        let out = dir.path().join("sweep");
        let r = cpu_sweep(&text, &out, "attention=sdpa,eager");
        assert_eq!(r.code, 0, "{}", r.stderr);
        let doc = r.json();
        let pair = &doc["pairs"][0];
        assert_eq!(pair["baseline"], "sdpa");
        assert_eq!(pair["other"], "eager");
        let run0 = &pair["runs"][0];
        let kld = run0["kld_mean"].as_f64().unwrap();
        // Same weights, another kernel, f32: a rounding-level KL, never zero, far below the
        // quantized pairs' (~1e-2).
        assert!(kld > 0.0 && kld < 1e-6, "{kld}");
        assert!(run0["n_flips"].as_u64().is_some());
        // sweep.json and the pair's measurement.json, as their committed schemas describe them.
        let read = |path: &Path| -> serde_json::Value {
            serde_json::from_slice(&std::fs::read(path).unwrap())
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        };
        let sweep = read(&out.join("sweep.json"));
        crate::output_schemas::assert_valid("sweep", "sweep.json", &sweep);
        assert_eq!(
            sweep["pairs"][0]["measurement"],
            "attention-sdpa-vs-eager/measurement.json"
        );
        let pair = read(&out.join("attention-sdpa-vs-eager/measurement.json"));
        crate::output_schemas::assert_valid("measurement", "the sweep pair's measurement", &pair);
    }

    /// The runner's torch KV-cache quantizers against the fixtures the native ones are checked
    /// on (gguf-py's llama.cpp blocks, torch's casts on vLLM's paths, llama.cpp's rotation),
    /// bit for bit in float32.
    #[test]
    #[ignore = "needs torch and transformers: cargo test --test it transformers::torch -- --ignored"]
    fn the_runners_kv_quantizers_match_the_fixtures_bit_for_bit() {
        require_torch();
        let python = std::env::var_os("CARDPROOF_PYTHON").unwrap_or_else(|| "python3".into());
        let out = std::process::Command::new(python)
            .arg(repo_root().join("tests/kv_quant_check.py"))
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned()
            + &String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{text}");
        assert!(text.contains("41 cases bit for bit"), "{text}");
    }

    /// A conversation in the transformers runner: the rows a span policy selects differ from
    /// window to window (windows without a tool call are not run), and they give the same rows
    /// and numbers as the tool-call span of the runner's run over every row, and the native
    /// runner's rows (the bf16 example against itself with llama.cpp's q8_0 KV cache, which
    /// both runners write alike: float32 forwards within 2%, as the KV-cache sweep test).
    #[test]
    #[ignore = "needs torch and transformers: cargo test --test it transformers::torch -- --ignored"]
    fn a_conversation_runs_in_the_transformers_runner_by_span() {
        require_torch();
        let dir = tempfile::tempdir().unwrap();
        let (conversation, template) = crate::conversation::short_conversation(dir.path(), 16);
        let measure = |out: &str, runner: &[&str], extra: &[&str]| {
            let out = dir.path().join(out);
            let r = Cmd::measure()
                .reference("examples/models/shakespeare-bf16")
                .candidate("examples/models/shakespeare-bf16")
                .flag("--kv-cache", "q8_0")
                .eval_text(&conversation)
                .flag("--chat-template", &template)
                .context_length(128)
                .bootstrap(100)
                .out(out)
                .arg("--json")
                .args(runner)
                .args(extra)
                .run();
            assert_eq!(r.code, 0, "{}", r.stderr);
            r.json()
        };
        let torch = [
            "--runner",
            "transformers",
            "--device",
            "cpu",
            "--torch-dtype",
            "float32",
        ];
        let span = ["--positions", "span:tool-call"];
        let all = measure("all", &torch, &[]);
        let calls = measure("calls", &torch, &span);
        let native = measure("native", &[], &span);
        assert_eq!(calls["environment"]["runner"], "transformers");
        assert_eq!(
            calls["eval"]["tokens_sha256"],
            native["eval"]["tokens_sha256"]
        );
        let inside = all["runs"][0]["spans"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["by"] == "segment" && s["name"] == "tool_call")
            .unwrap()
            .clone();
        let only = &calls["runs"][0];
        assert_eq!(only["n_positions"], inside["n_positions"]);
        assert_eq!(only["n_positions"], native["runs"][0]["n_positions"]);
        for metric in ["kld_mean", "top1_agreement", "kld_max"] {
            let (a, b) = (
                only["metrics"][metric].as_f64().unwrap(),
                inside["metrics"][metric].as_f64().unwrap(),
            );
            assert!(rel(a, b) < 1e-12, "{metric}: {a} vs {b}");
        }
        let (t, n) = (
            only["metrics"]["kld_mean"].as_f64().unwrap(),
            native["runs"][0]["metrics"]["kld_mean"].as_f64().unwrap(),
        );
        assert!(t > 0.0 && rel(t, n) < 0.02, "transformers {t}, native {n}");
    }

    /// `study STUDY --out OUT EXTRA...` in the real runner.
    fn study_cmd(study: &Path, out: &Path, extra: &[&str]) -> Run {
        let mut args = vec![
            "study",
            study.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
        ];
        args.extend_from_slice(extra);
        run(&[], &args)
    }

    /// `study STUDY --out OUT --json` in the real runner: exit 0, its document.
    fn study_json(study: &Path, out: &Path) -> serde_json::Value {
        let r = study_cmd(study, out, &["--json"]);
        assert_eq!(r.code, 0, "{}", r.stderr);
        r.json()
    }

    /// A transformers study (CPU, float32) of the hybrid fixture at 128 tokens in `dir`: its
    /// eval text copied beside it, `protocol` added to the protocol block, `head` before the arms.
    fn hybrid_study(dir: &Path, protocol: &str, head: &str, arms: &[&str]) -> PathBuf {
        let hybrid = repo_root().join("tests/fixtures/hybrid");
        std::fs::copy(hybrid.join("eval.txt"), dir.join("eval.txt")).unwrap();
        let mut yaml = format!(
            "study: cardproof/study-v1\nreference: {}\neval: {{text: eval.txt}}\nprotocol: {{context_lengths: [128], resamples: 100{protocol}}}\nrunner: transformers\ntransformers: {{device: cpu, torch_dtype: float32}}\n{head}arms:\n",
            hybrid.join("qwen3_5_text").display(),
        );
        for a in arms {
            yaml.push_str(&format!("  - {a}\n"));
        }
        let study = dir.join("study.yaml");
        std::fs::write(&study, yaml).unwrap();
        study
    }

    /// A copy of checkpoint `from` in `to` whose first non-square matrix below the embeddings has
    /// its shape transposed in the header (the same bytes): cardproof plans and hashes it, and
    /// transformers refuses to load it (a size mismatch), failing the arm that runs it.
    fn transposed_copy(from: &Path, to: &Path) {
        std::fs::create_dir_all(to).unwrap();
        for e in std::fs::read_dir(from).unwrap() {
            let e = e.unwrap();
            std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
        }
        let path = to.join("model.safetensors");
        let bytes = std::fs::read(&path).unwrap();
        let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
        let mut header: serde_json::Map<String, serde_json::Value> =
            serde_json::from_slice(&bytes[8..8 + n]).unwrap();
        let name = header
            .iter()
            .find(|(k, v)| {
                k.contains("layers.")
                    && v["shape"]
                        .as_array()
                        .is_some_and(|s| s.len() == 2 && s[0] != s[1])
            })
            .map(|(k, _)| k.clone())
            .expect("a non-square matrix");
        let shape = header[&name]["shape"].as_array().unwrap().clone();
        header[&name]["shape"] = serde_json::json!([shape[1], shape[0]]);
        let mut text = serde_json::to_vec(&header).unwrap();
        while text.len() < n {
            text.push(b' ');
        }
        assert_eq!(text.len(), n, "the header keeps its length");
        let mut out = bytes[..8].to_vec();
        out.extend_from_slice(&text);
        out.extend_from_slice(&bytes[8 + n..]);
        std::fs::write(&path, out).unwrap();
    }

    /// An arm that fails after another completed leaves that arm in an incomplete, unsigned set
    /// (no study.json) naming what ran and what did not; `--resume` runs only the rest, replays
    /// the completed arm from its rows, and gives the very numbers a run without interruption
    /// gives. A carried file changed, or another study file, is refused.
    #[test]
    #[ignore = "needs torch and transformers: cargo test --test it transformers::torch -- --ignored"]
    fn an_interrupted_transformers_study_keeps_its_completed_arms_and_resume_finishes_it_exactly() {
        require_torch();
        let dir = tempfile::tempdir().unwrap();
        let fixture = repo_root().join("tests/fixtures/hybrid/qwen3_5_text");
        let candidate = dir.path().join("candidate");
        transposed_copy(&fixture, &candidate);
        let study = hybrid_study(
            dir.path(),
            "",
            "controls: {noise_floor: false}\n",
            &[
                "{name: kv-fp8, kv_cache: fp8_e4m3, changes: kv_cache}",
                "{name: weights, candidate: candidate, changes: weights}",
            ],
        );
        let out = dir.path().join("out");
        let interrupted = study_cmd(&study, &out, &[]);
        assert_eq!(interrupted.code, 2, "{}", interrupted.stderr);
        assert!(
            interrupted
                .stderr
                .contains("the study stopped at arm `weights`")
                && interrupted.stderr.contains("--resume"),
            "{}",
            interrupted.stderr
        );
        let read = |p: &Path| -> serde_json::Value {
            serde_json::from_slice(&std::fs::read(p).unwrap()).unwrap()
        };
        let marker = read(&out.join(".cardproof-set.json"));
        assert_eq!(marker["complete"], false);
        let record = read(&out.join("study.incomplete.json"));
        assert_eq!(record["completed"], serde_json::json!(["kv-fp8"]));
        assert_eq!(
            record["remaining"],
            serde_json::json!(["weights", "control-repeat"])
        );
        assert!(
            record["error"]
                .as_str()
                .unwrap()
                .contains("transformers runner failed")
        );
        assert!(out.join("arms/kv-fp8/measurement.json").exists());
        assert!(out.join("arms/kv-fp8/carry-run0.safetensors").exists());
        assert!(!out.join("study.json").exists() && !out.join("study.dsse.json").exists());

        // The cause fixed (weights that load: the reference's, one mantissa bit of its first
        // value flipped): the remaining arms run, the completed one is replayed.
        let weights = candidate.join("model.safetensors");
        std::fs::copy(fixture.join("model.safetensors"), &weights).unwrap();
        let mut bytes = std::fs::read(&weights).unwrap();
        let first = 8 + u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
        bytes[first] ^= 1;
        std::fs::write(&weights, bytes).unwrap();
        let resumed = study_cmd(&study, &out, &["--resume", "--json"]);
        assert_eq!(resumed.code, 0, "{}{}", resumed.stderr, resumed.stdout);
        let resumed = resumed.json();
        assert_eq!(resumed["resumed"]["run_id"], marker["run_id"]);
        assert_eq!(resumed["resumed"]["arms"], serde_json::json!(["kv-fp8"]));
        assert_eq!(read(&out.join(".cardproof-set.json"))["complete"], true);
        assert!(!out.join("study.incomplete.json").exists());
        assert!(!out.join("arms/kv-fp8/carry.json").exists());

        // The same numbers as a run never interrupted.
        let whole = study_json(&study, &dir.path().join("whole"));
        for key in ["arms", "comparisons"] {
            let strip = |doc: &serde_json::Value| {
                let mut v = doc[key].clone();
                for a in v.as_array_mut().unwrap() {
                    a.as_object_mut().unwrap().remove("seconds");
                }
                v
            };
            assert_eq!(strip(&resumed), strip(&whole), "{key}");
        }

        // A carried file changed, or the study file, is refused before any work.
        transposed_copy(&fixture, &dir.path().join("broken"));
        std::fs::write(
            &study,
            std::fs::read_to_string(&study)
                .unwrap()
                .replace("candidate: candidate", "candidate: broken"),
        )
        .unwrap();
        let again = dir.path().join("again");
        assert_eq!(study_cmd(&study, &again, &[]).code, 2);
        let rows = again.join("arms/kv-fp8/carry-run0.safetensors");
        let mut bytes = std::fs::read(&rows).unwrap();
        let last = bytes.len() - 1;
        bytes[last] ^= 1;
        std::fs::write(&rows, &bytes).unwrap();
        let r = study_cmd(&study, &again, &["--resume"]);
        assert_eq!(r.code, 2, "{}", r.stderr);
        assert!(
            r.stderr
                .contains("changed after the interrupted run wrote it"),
            "{}",
            r.stderr
        );
        bytes[last] ^= 1;
        std::fs::write(&rows, &bytes).unwrap();
        std::fs::write(
            &study,
            std::fs::read_to_string(&study).unwrap() + "# edited\n",
        )
        .unwrap();
        let r = study_cmd(&study, &again, &["--resume"]);
        assert_eq!(r.code, 2, "{}", r.stderr);
        assert!(
            r.stderr.contains("changed since the interrupted run"),
            "{}",
            r.stderr
        );
    }

    /// The seed's three tests as one study in miniature (on the hybrid fixture, CPU): kernel arms
    /// for an SDPA backend, eager attention and the GDN kernel, a KV-cache arm, a bf16
    /// recurrent-state arm at 32-token prefill chunks; every kernel recorded as what ran.
    #[test]
    #[ignore = "needs torch and transformers: cargo test --test it transformers::torch -- --ignored"]
    fn the_seed_studys_kernel_kv_and_state_axes_run_as_one_transformers_study() {
        require_torch();
        let dir = tempfile::tempdir().unwrap();
        let study = hybrid_study(
            dir.path(),
            ", prefill_chunk: 32",
            "baseline: {attention: sdpa:math, gdn_kernel: torch}\n",
            &[
                "{name: sdpa-flash, attention: sdpa:flash, changes: kernel}",
                "{name: gdn-recurrent, gdn_kernel: torch_recurrent, changes: kernel}",
                "{name: kv-fp8, kv_cache: fp8_e4m3, changes: kv_cache}",
                "{name: state-bf16, recurrent_state: bf16, changes: recurrent_state}",
            ],
        );
        let out = dir.path().join("out");
        let doc = study_json(&study, &out);
        assert_eq!(doc["protocol"]["prefill_chunk"], 32);
        let arm = |name: &str| {
            doc["arms"]
                .as_array()
                .unwrap()
                .iter()
                .find(|a| a["name"] == name)
                .unwrap_or_else(|| panic!("no arm {name}"))
                .clone()
        };
        let kld = |name: &str| {
            arm(name)["runs"][0]["metrics"]["kld_mean"]
                .as_f64()
                .unwrap()
        };
        let measurement = |name: &str| -> serde_json::Value {
            serde_json::from_str(
                &std::fs::read_to_string(out.join(format!("arms/{name}/measurement.json")))
                    .unwrap(),
            )
            .unwrap()
        };
        let model = |name: &str| {
            measurement(name)["environment"]["transformers_runner"]["models"]["candidate"].clone()
        };
        // Each kernel ran as asked, and is recorded so.
        assert_eq!(model("sdpa-flash")["attention"], "sdpa:flash");
        assert_eq!(model("gdn-recurrent")["gdn_kernel"], "torch_recurrent");
        assert_eq!(model("kv-fp8")["attention"], "sdpa:math");
        assert_eq!(model("kv-fp8")["gdn_kernel"], "torch");
        assert_eq!(
            arm("gdn-recurrent")["settings"]["gdn_kernel"],
            "torch_recurrent"
        );
        assert_eq!(arm("state-bf16")["settings"]["recurrent_state"], "bf16");
        assert_eq!(
            measurement("state-bf16")["environment"]["recurrent_state_dtype"],
            "bf16"
        );
        // Every arm moves the numbers (the kernels by rounding only); the repeat control does
        // not (nor, on this CPU in float32, eager attention against SDPA's math backend).
        for name in ["sdpa-flash", "gdn-recurrent", "kv-fp8", "state-bf16"] {
            assert!(kld(name) > 0.0, "{name}: {}", kld(name));
        }
        assert_eq!(kld("control-repeat"), 0.0);
        assert!(kld("kv-fp8") > kld("gdn-recurrent"));
        // A kernel that cannot run here is an error naming it, before any arm is written.
        std::fs::write(
            &study,
            std::fs::read_to_string(&study)
                .unwrap()
                .replace("sdpa:flash", "sdpa:cudnn"),
        )
        .unwrap();
        let failed = dir.path().join("failed");
        let r = study_cmd(&study, &failed, &[]);
        assert_eq!(r.code, 2, "{}", r.stderr);
        assert!(r.stderr.contains("sdpa:cudnn"), "{}", r.stderr);
        assert!(r.stderr.contains("refused before loading"), "{}", r.stderr);
        assert!(!failed.join("study.json").exists());
    }

    /// The kernel control's eager attention is in the memory plan with every other arm, before
    /// anything loads: where its scores do not fit at the window, its queries are taken in
    /// blocks (recorded); where nothing fits, the study is refused naming the arm, and nothing
    /// is written.
    #[test]
    #[ignore = "needs torch and transformers: cargo test --test it transformers::torch -- --ignored"]
    fn eager_attention_is_planned_in_query_blocks_or_the_study_is_refused_before_any_work() {
        require_torch();
        let dir = tempfile::tempdir().unwrap();
        let study = hybrid_study(
            dir.path(),
            "",
            "",
            &["{name: gdn-recurrent, gdn_kernel: torch_recurrent, changes: kernel}"],
        );
        let study_with =
            |limit: &str, out: &Path| study_cmd(&study, out, &["--memory-limit", limit]);
        let out = dir.path().join("blocks");
        let r = study_with("1500000", &out);
        assert_eq!(r.code, 0, "{}", r.stderr);
        let control: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(out.join("arms/control-kernel/measurement.json")).unwrap(),
        )
        .unwrap();
        let plan = &control["environment"]["transformers_runner"]["memory_plan"];
        assert_eq!(plan["chunk_size"], 128, "{plan}");
        assert_eq!(plan["eager_query_block"], 32, "{plan}");
        assert_eq!(
            control["environment"]["transformers_runner"]["models"]["candidate"]["attention"],
            "eager"
        );
        // In blocks, eager's rows are eager's: the control stays at the lane's floor.
        let kld = control["runs"][0]["metrics"]["kld_mean"].as_f64().unwrap();
        assert!(kld < 1e-10, "{kld}");
        let refused = dir.path().join("refused");
        let r = study_with("1000000", &refused);
        assert_eq!(r.code, 2, "{}", r.stderr);
        assert!(r.stderr.contains("out_of_memory_plan"), "{}", r.stderr);
        assert!(
            r.stderr
                .contains("arm `control-kernel` runs eager attention"),
            "{}",
            r.stderr
        );
        assert!(
            r.stderr.contains("controls: {noise_floor: false}"),
            "{}",
            r.stderr
        );
        assert!(!refused.exists(), "nothing is written");
    }

    /// A study in the transformers runner (CPU, float32): one program run, the reference's pass
    /// kept for every arm, and each arm's numbers those of the single `measure --runner
    /// transformers` of its pair.
    #[test]
    #[ignore = "needs torch and transformers: cargo test --test it transformers::torch -- --ignored"]
    fn a_study_in_the_transformers_runner_equals_its_single_measures() {
        require_torch();
        let dir = tempfile::tempdir().unwrap();
        short_text(dir.path(), 6000);
        let models = repo_root().join("examples/models");
        let study = dir.path().join("study.yaml");
        std::fs::write(
            &study,
            format!(
                "study: cardproof/study-v1\nreference: {m}/shakespeare-bf16\neval: {{text: eval.txt}}\nprotocol: {{context_lengths: [128], resamples: 100}}\nrunner: transformers\ntransformers: {{device: cpu, torch_dtype: float32}}\narms:\n  - {{name: fp8-block, candidate: {m}/shakespeare-fp8-block, changes: weights}}\n  - {{name: kv-q8_0, kv_cache: q8_0, changes: kv_cache}}\n  - {{name: eager, attention: eager, changes: kernel}}\n",
                m = models.display(),
            ),
        )
        .unwrap();
        let out = dir.path().join("out");
        let doc = study_json(&study, &out);
        assert_eq!(doc["runner"], "transformers");
        for (arm, candidate, extra) in [
            ("fp8-block", "shakespeare-fp8-block", &[][..]),
            ("kv-q8_0", "shakespeare-bf16", &["--kv-cache", "q8_0"][..]),
        ] {
            let single_dir = dir.path().join(arm);
            std::fs::create_dir_all(&single_dir).unwrap();
            let r = cpu_measure_pair(
                &single_dir,
                "examples/models/shakespeare-bf16",
                models.join(candidate).to_str().unwrap(),
                &[&["--bootstrap", "100"], extra].concat(),
            );
            assert_eq!(r.code, 0, "{}", r.stderr);
            let single = r.json();
            let a: serde_json::Value = serde_json::from_str(
                &std::fs::read_to_string(out.join(format!("arms/{arm}/measurement.json"))).unwrap(),
            )
            .unwrap();
            assert_eq!(a["eval"]["tokens_sha256"], single["eval"]["tokens_sha256"]);
            assert_eq!(
                a["runs"][0]["n_positions"],
                single["runs"][0]["n_positions"]
            );
            for (name, x) in a["runs"][0]["metrics"].as_object().unwrap() {
                let y = &single["runs"][0]["metrics"][name];
                if let (Some(x), Some(y)) = (x.as_f64(), y.as_f64()) {
                    assert!(rel(x, y) < 1e-12, "{arm} {name}: study {x}, single {y}");
                }
            }
        }
        // The kernel arm ran eager attention; the repeat control is exactly 0.
        let arm = |name: &str| {
            doc["arms"]
                .as_array()
                .unwrap()
                .iter()
                .find(|a| a["name"] == name)
                .unwrap()
                .clone()
        };
        assert_eq!(arm("eager")["settings"]["attention"], "eager");
        let m: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(out.join("arms/eager/measurement.json")).unwrap(),
        )
        .unwrap();
        assert_eq!(m["reference"]["runner"]["attention"], "sdpa");
        assert_eq!(m["candidate"]["runner"]["attention"], "eager");
        assert_eq!(arm("control-repeat")["runs"][0]["metrics"]["kld_mean"], 0.0);
    }

    /// Every chat template of the corpus renders to transformers' bytes and token ids with every
    /// conversation, or fails where transformers fails with the same Python error; every probe of
    /// a jinja2 rule renders or fails alike (tests/it/chat_templates.rs). Needs transformers,
    /// not torch.
    #[test]
    #[ignore = "needs transformers: cargo test --test it transformers::torch -- --ignored"]
    fn chat_templates_render_as_transformers_renders_them() {
        let python = std::env::var_os("CARDPROOF_PYTHON").unwrap_or_else(|| "python3".into());
        let probe = std::process::Command::new(&python)
            .args(["-c", "import transformers"])
            .output()
            .unwrap();
        assert!(
            probe.status.success(),
            "needs transformers: {}",
            String::from_utf8_lossy(&probe.stderr)
        );
        let dir = tempfile::tempdir().unwrap();
        let expected = dir.path().join("renders.json");
        let out = std::process::Command::new(python)
            .arg(repo_root().join("tests/chat_template_check.py"))
            .arg(&expected)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let c = crate::chat_templates::mismatches(&expected);
        let summary = format!(
            "{} renders: {} identical, {} failing alike, {} refused; {} probes: {} alike, {} refused, {} failing otherwise; {} bad",
            c.renders,
            c.identical,
            c.both_fail,
            c.refused.len(),
            c.probes,
            c.probes_identical,
            c.probes_refused.len(),
            c.probes_other_error.len(),
            c.bad.len()
        );
        assert!(c.renders >= 630, "{summary}");
        assert!(c.bad.is_empty(), "{summary}:\n{}", c.bad.join("\n"));
        // Measured on the corpus of 70 templates × 9 conversations and 368 probes: nothing of
        // the corpus is refused and no probe fails otherwise, and the probes cardproof refuses
        // by name stay these (a rule implemented since shrinks the list; a regression grows it).
        assert!(c.refused.is_empty(), "{summary}: {:?}", c.refused);
        assert!(c.identical >= 505, "{summary}");
        assert_eq!(c.identical + c.both_fail, c.renders, "{summary}");
        assert!(c.probes >= 368, "{summary}");
        assert!(
            c.probes_other_error.is_empty(),
            "{summary}:\n{}",
            c.probes_other_error.join("\n")
        );
        assert!(
            c.probes_refused.len() <= 10,
            "{summary}: {:#?}",
            c.probes_refused
        );
        assert_eq!(
            c.probes_identical + c.probes_refused.len(),
            c.probes,
            "{summary}"
        );
    }

    /// A KV-cache sweep in the transformers runner (CPU, float32) gives the native runner's
    /// numbers for the same schemes: the same formulas where each engine writes its cache; the
    /// two forwards' float32 rounding moves a few codes across a step, so within 2%.
    #[test]
    #[ignore = "needs torch and transformers: cargo test --test it transformers::torch -- --ignored"]
    fn a_kv_cache_sweep_in_the_transformers_runner_matches_the_native_runner() {
        require_torch();
        let dir = tempfile::tempdir().unwrap();
        let text = short_text(dir.path(), 6000);
        let out = dir.path().join("sweep");
        let r = cpu_sweep(
            &text,
            &out,
            "kv_cache=none,q8_0,q4_0,k:q4_0/v:none,fp8_e4m3+computed,q4_0+residual64+chunk32,iq4_nl+hadamard,exl3_q4",
        );
        assert_eq!(r.code, 0, "{}", r.stderr);
        let doc = r.json();
        let pairs = doc["pairs"].as_array().unwrap();
        assert_eq!(pairs.len(), 7);
        for pair in pairs {
            let scheme = pair["other"].as_str().unwrap();
            assert_eq!(
                pair["environment"]["kv_cache_dtype"],
                scheme.split('+').next().unwrap()
            );
            let gpu_lane = pair["runs"][0]["kld_mean"].as_f64().unwrap();
            let native = Cmd::measure()
                .reference("examples/models/shakespeare-bf16")
                .candidate("examples/models/shakespeare-bf16")
                .eval_text(&text)
                .context_length(128)
                .flag("--kv-cache", scheme)
                .out(dir.path().join(scheme.replace([':', '/', '+'], "_")))
                .arg("--json")
                .run();
            assert_eq!(native.code, 0, "{}", native.message());
            let native = native.json()["runs"][0]["metrics"]["kld_mean"]
                .as_f64()
                .unwrap();
            assert!(
                gpu_lane > 0.0 && rel(gpu_lane, native) < 0.02,
                "{scheme}: transformers {gpu_lane}, native {native}"
            );
        }
    }

    /// A copy of the FP8 example whose card is written from a transformers measurement on CPU, and a
    /// key to sign with: (temp dir, candidate dir, key, the measurement document).
    fn transformers_card() -> (tempfile::TempDir, PathBuf, PathBuf, serde_json::Value) {
        let dir = tempfile::tempdir().unwrap();
        let r = cpu_measure(dir.path(), "examples/models/shakespeare-fp8-block", &[]);
        assert_eq!(r.code, 0, "{}", r.stderr);
        let candidate = dir.path().join("candidate");
        std::fs::create_dir(&candidate).unwrap();
        for entry in
            std::fs::read_dir(repo_root().join("examples/models/shakespeare-fp8-block")).unwrap()
        {
            let entry = entry.unwrap();
            std::fs::copy(entry.path(), candidate.join(entry.file_name())).unwrap();
        }
        let card = candidate.join("README.md");
        let measurement = dir.path().join("out/measurement.json");
        let c = run(
            &[],
            &[
                "card",
                "--measurement",
                measurement.to_str().unwrap(),
                "--into",
                card.to_str().unwrap(),
            ],
        );
        assert_eq!(c.code, 0, "{}", c.stderr);
        let text = std::fs::read_to_string(&card).unwrap();
        assert!(text.contains("engine: transformers"), "{text}");
        let keys = dir.path().join("keys");
        let k = run(&[], &["keygen", "--out", keys.to_str().unwrap()]);
        assert_eq!(k.code, 0, "{}", k.stderr);
        let doc = r.json();
        (dir, candidate, keys.join("cardproof.key"), doc)
    }

    fn verify_transformers(dir: &Path, candidate: &Path, key: &Path, extra: &[&str]) -> Run {
        let text = dir.join("eval.txt");
        let out = dir.join("report");
        Cmd::verify(candidate)
            .reference("examples/models/shakespeare-bf16")
            .args(["--runner", "transformers", "--device", "cpu"])
            .eval_text(&text)
            .key(key)
            .out(&out)
            .arg("--json")
            .args(extra)
            .run()
    }

    #[test]
    #[ignore = "needs torch and transformers: cargo test --test it transformers::torch -- --ignored"]
    fn verify_reruns_a_transformers_card_in_its_lane() {
        require_torch();
        let (dir, candidate, key, _) = transformers_card();
        let v = verify_transformers(dir.path(), &candidate, &key, &[]);
        let report = v.json();
        assert_eq!(
            report["verdict"], "reproduced",
            "{}\n{}",
            v.stderr, v.stdout
        );
        assert_eq!(v.code, 0);
        let gates = report["sanity"].as_array().unwrap();
        // self_compare, one_row_shift, quantization_engaged, finite_rows
        assert_eq!(gates.len(), 4, "{gates:?}");
        for gate in gates {
            assert_eq!(gate["passed"], true, "{gate}");
        }
        let written: serde_json::Value =
            serde_json::from_slice(&std::fs::read(dir.path().join("report/report.json")).unwrap())
                .unwrap();
        crate::output_schemas::assert_valid("report", "report.json (transformers)", &written);
        // Another attention kernel is another lane: not comparable, never "reproduced".
        let v = verify_transformers(dir.path(), &candidate, &key, &["--attention", "eager"]);
        let report = v.json();
        assert_eq!(report["verdict"], "not_comparable", "{}", v.stdout);
        assert!(v.stdout.contains("attention: card"), "{}", v.stdout);
    }

    #[test]
    #[ignore = "needs torch and transformers: cargo test --test it transformers::torch -- --ignored"]
    fn sequential_mode_gives_the_same_numbers_and_still_runs_the_gates() {
        require_torch();
        let (dir, candidate, key, measured) = transformers_card();
        // 30 MB "free": both example models with the head chunk do not fit, one at a time does.
        let v = verify_transformers(
            dir.path(),
            &candidate,
            &key,
            &["--memory-limit", "30000000"],
        );
        let report = v.json();
        assert_eq!(
            report["measurement"]["environment"]["transformers_runner"]["mode"],
            "sequential"
        );
        assert_eq!(
            report["verdict"], "reproduced",
            "{}\n{}",
            v.stderr, v.stdout
        );
        for gate in report["sanity"].as_array().unwrap() {
            assert_eq!(gate["passed"], true, "{gate}");
        }
        let same_numbers = |doc: &serde_json::Value, what: &str| {
            let (a, b) = (&doc["runs"][0]["metrics"], &measured["runs"][0]["metrics"]);
            for (name, value) in b.as_object().unwrap() {
                let (x, y) = (a[name].as_f64().unwrap(), value.as_f64().unwrap());
                assert!(rel(x, y) < 1e-12, "{name}: {what} {x}, side by side {y}");
            }
        };
        same_numbers(&report["measurement"], "sequential");
        // The reference's hidden states spilled to disk between the two models: the same numbers.
        let r = cpu_measure(
            dir.path(),
            "examples/models/shakespeare-fp8-block",
            &["--memory-limit", "30000000", "--keep-hidden", "disk"],
        );
        assert_eq!(r.code, 0, "{}", r.stderr);
        let doc = r.json();
        let plan = &doc["environment"]["transformers_runner"]["memory_plan"];
        assert_eq!(plan["kept_hidden_where"], "disk", "{plan}");
        same_numbers(&doc, "spilled to disk");
    }

    /// A fresh random qwen3_moe (tests/fixtures/moe/make.py with another seed) through the native
    /// runner: transformers' own float32 rows within 1e-4, identical top-1.
    #[test]
    #[ignore = "needs torch and transformers: cargo test --test it transformers::torch -- --ignored"]
    fn a_fresh_random_qwen3_moe_matches_transformers_in_the_native_runner() {
        require_torch();
        let dir = tempfile::tempdir().unwrap();
        let made_dir = dir.path().join("made");
        let python = std::env::var_os("CARDPROOF_PYTHON").unwrap_or_else(|| "python3".into());
        let made = std::process::Command::new(&python)
            .arg(crate::moe::fixtures().join("make.py"))
            .args(["--seed", "4242", "--out"])
            .arg(&made_dir)
            .output()
            .unwrap();
        assert!(
            made.status.success(),
            "{}",
            String::from_utf8_lossy(&made.stderr)
        );
        let run = crate::moe::measure_dump(&made_dir.join("qwen3-moe"), dir.path(), &[]);
        assert_eq!(run.code, 0, "{}", run.stderr);
        crate::moe::dump_matches_transformers(
            &dir.path().join("dump"),
            &made_dir.join("qwen3-moe.rows.safetensors"),
        );
    }

    /// Native greedy turns equal transformers' own `generate` token for token (float32 on CPU):
    /// the dense example as the reference, the hybrid one (Gated DeltaNet state carried step to
    /// step) as the candidate, every assistant turn of the first twelve messages of the example
    /// conversation, their prompts rendered again by transformers (tests/turns_check.py).
    #[test]
    #[ignore = "needs torch and transformers: cargo test --test it transformers::torch -- --ignored"]
    fn native_greedy_turns_equal_transformers_generate() {
        require_torch();
        let dir = tempfile::tempdir().unwrap();
        let (conversation, template) = crate::conversation::short_conversation(dir.path(), 12);
        let out = dir.path().join("out");
        let r = Cmd::measure()
            .reference(model("shakespeare-bf16"))
            .candidate(model("shakespeare-hybrid-bf16"))
            .eval_text(&conversation)
            .flag("--chat-template", &template)
            .context_length(128)
            .bootstrap(50)
            .args(["--turns", "all", "--max-new-tokens", "12"])
            .out(&out)
            .run();
        assert_eq!(r.code, 0, "{}", r.stderr);
        let (reference, candidate) = (model("shakespeare-bf16"), model("shakespeare-hybrid-bf16"));
        let stdout = turns_check(
            &out,
            &conversation,
            &template,
            (Path::new(&reference), Path::new(&candidate)),
        );
        assert!(stdout.contains("5 of 5 turns agree"), "{stdout}");
    }

    /// tests/turns_check.py on the measurement in `out`: its report, once it exited 0 (every
    /// turn's prompt and tokens agree).
    fn turns_check(
        out: &Path,
        conversation: &Path,
        template: &Path,
        (reference, candidate): (&Path, &Path),
    ) -> String {
        let python = std::env::var_os("CARDPROOF_PYTHON").unwrap_or_else(|| "python3".into());
        let check = std::process::Command::new(&python)
            .arg(repo_root().join("tests/turns_check.py"))
            .arg(out.join("measurement.json"))
            .args([conversation, template, reference, candidate])
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&check.stdout).into_owned();
        assert!(
            check.status.success(),
            "{stdout}\n{}",
            String::from_utf8_lossy(&check.stderr)
        );
        stdout
    }

    /// The same on a mixture of experts: the qwen3_moe fixture (its routing, top-k experts and
    /// their sum) generating the short conversation's turns natively, against transformers'
    /// `generate` (the fixture's tokenizer file as is: it names no tokenizer class).
    #[test]
    #[ignore = "needs torch and transformers (.ci/run installs them)"]
    fn native_greedy_turns_equal_transformers_generate_on_a_mixture_of_experts() {
        require_torch();
        let dir = tempfile::tempdir().unwrap();
        let moe = dir.path().join("qwen3-moe");
        std::fs::create_dir(&moe).unwrap();
        for f in ["config.json", "model.safetensors", "tokenizer.json"] {
            std::fs::copy(
                crate::moe::fixtures().join("qwen3-moe").join(f),
                moe.join(f),
            )
            .unwrap();
        }
        // The fixture names no end-of-turn token; byte 0 never occurs in the text.
        std::fs::write(moe.join("generation_config.json"), r#"{"eos_token_id": 0}"#).unwrap();
        let (conversation, template) = crate::conversation::short_conversation(dir.path(), 6);
        let out = dir.path().join("out");
        let r = Cmd::measure()
            .reference(&moe)
            .candidate(&moe)
            .eval_text(&conversation)
            .flag("--chat-template", &template)
            .context_length(64)
            .bootstrap(50)
            .args(["--turns", "all", "--max-new-tokens", "8"])
            .out(&out)
            .run();
        assert_eq!(r.code, 0, "{}", r.stderr);
        let stdout = turns_check(&out, &conversation, &template, (&moe, &moe));
        assert!(stdout.contains("2 of 2 turns agree"), "{stdout}");
    }

    /// `measure --turns all` on the example conversation's first twelve messages, turns of at
    /// most 12 tokens, the bf16 example as the reference; `runner` flags before the rest; the
    /// measurement's `turns`.
    fn measure_turns(dir: &Path, out: &str, candidate: &str, runner: &[&str]) -> serde_json::Value {
        let (conversation, template) = crate::conversation::short_conversation(dir, 12);
        let r = Cmd::measure()
            .args(runner)
            .reference(model("shakespeare-bf16"))
            .candidate(model(candidate))
            .eval_text(&conversation)
            .flag("--chat-template", &template)
            .context_length(128)
            .bootstrap(50)
            .args(["--turns", "all", "--max-new-tokens", "12"])
            .out(dir.join(out))
            .run();
        assert_eq!(r.code, 0, "{}", r.stderr);
        let m: serde_json::Value =
            serde_json::from_slice(&std::fs::read(dir.join(out).join("measurement.json")).unwrap())
                .unwrap();
        m["turns"].clone()
    }

    /// Both models' generated token ids, turn by turn.
    fn turn_ids(turns: &serde_json::Value) -> Vec<(serde_json::Value, serde_json::Value)> {
        turns["turns"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| (t["reference"]["ids"].clone(), t["candidate"]["ids"].clone()))
            .collect()
    }

    const CPU_FLOAT32: &[&str] = &[
        "--runner",
        "transformers",
        "--device",
        "cpu",
        "--torch-dtype",
        "float32",
    ];

    /// The transformers lane's greedy turns (CPU, float32) are the native lane's token for
    /// token: the dense example as the reference (its cache cropped to each next prompt), the
    /// hybrid one as the candidate (its Gated DeltaNet state copied at each prompt's end); the
    /// nested prompts are prefilled once in all; and the reference against itself matches
    /// every turn.
    #[test]
    #[ignore = "needs torch and transformers: cargo test --test it transformers::torch -- --ignored"]
    fn transformers_greedy_turns_equal_the_native_lanes() {
        require_torch();
        let dir = tempfile::tempdir().unwrap();
        let native = measure_turns(dir.path(), "native", "shakespeare-hybrid-bf16", &[]);
        let ours = measure_turns(
            dir.path(),
            "transformers",
            "shakespeare-hybrid-bf16",
            CPU_FLOAT32,
        );
        assert!(native.get("generated_by").is_none(), "{native}");
        let (a, b) = (turn_ids(&ours), turn_ids(&native));
        assert_eq!(a.len(), 5);
        assert_eq!(a, b);
        let by = &ours["generated_by"];
        assert_eq!(by["runner"], "transformers", "{by}");
        assert_eq!(by["reference"]["prefix_reuse"], "crop", "{by}");
        assert_eq!(by["candidate"]["prefix_reuse"], "snapshot", "{by}");
        assert_eq!(by["candidate"]["dtype"], "float32", "{by}");
        assert_eq!(by["candidate"]["attention"], "sdpa", "{by}");
        let last = ours["turns"].as_array().unwrap().last().unwrap()["prompt_tokens"].clone();
        for side in ["reference", "candidate"] {
            assert_eq!(by[side]["prefilled_tokens"], last, "{side}: {by}");
            // The runner times each model's prefill and decode, as the native runner does.
            let timing = &ours["timings"][side];
            assert_eq!(timing["prefill_tokens"], last, "{side}: {timing}");
            let generated: usize = ours["turns"]
                .as_array()
                .unwrap()
                .iter()
                .map(|t| t[side]["ids"].as_array().unwrap().len())
                .sum();
            assert_eq!(timing["generated_tokens"], generated, "{side}: {timing}");
            assert!(timing["decode_seconds"].as_f64().unwrap() > 0.0, "{timing}");
            assert!(
                timing["prefill_seconds"].as_f64().unwrap() > 0.0,
                "{timing}"
            );
        }
        assert_eq!(ours["summary"], native["summary"]);

        let same = measure_turns(dir.path(), "self", "shakespeare-bf16", CPU_FLOAT32);
        let s = &same["summary"];
        assert_eq!(s["turn_match"]["value"], 1.0, "{s}");
        assert_eq!(s["first_divergence"]["turns"], 0, "{s}");
    }

    /// A study in the transformers lane generates the reference's turns once and every arm's
    /// after its pass, each as the native study's token for token (a hybrid candidate, a q8_0
    /// KV cache rounding what each step writes), and its repeat control matches every turn.
    /// The transformers study scores a plain text and takes its turns from the conversation
    /// named beside it (`protocol.turns.conversation`); the native one's eval text is the
    /// conversation itself.
    #[test]
    #[ignore = "needs torch and transformers: cargo test --test it transformers::torch -- --ignored"]
    fn a_transformers_study_generates_every_arms_turns_as_the_native_study() {
        require_torch();
        let dir = tempfile::tempdir().unwrap();
        crate::conversation::short_conversation(dir.path(), 12);
        crate::support::short_text(dir.path(), 3000);
        let study = |runner: &str| {
            let (text, conversation) = if runner.contains("transformers") {
                ("eval.txt", ", conversation: conversation.json")
            } else {
                ("conversation.json", "")
            };
            format!(
                "study: cardproof/study-v1\nreference: {}\neval:\n  text: {text}\n  chat_template: chat_template.jinja\nprotocol:\n  context_lengths: [128]\n  resamples: 50\n  turns: {{select: all, max_new_tokens: 6{conversation}}}\n{runner}\narms:\n  - {{name: hybrid, candidate: {}, changes: weights}}\n  - {{name: kv-q8_0, kv_cache: q8_0, changes: kv_cache}}\ncontrols: {{repeatability: true, noise_floor: false}}\n",
                model("shakespeare-bf16"),
                model("shakespeare-hybrid-bf16")
            )
        };
        let run = |name: &str, runner: &str| {
            let file = dir.path().join(format!("{name}.yaml"));
            std::fs::write(&file, study(runner)).unwrap();
            let r = Cmd::new("study")
                .path(&file)
                .out(dir.path().join(name))
                .run();
            assert_eq!(r.code, 0, "{}", r.stderr);
        };
        run("native", "runner: native");
        run(
            "transformers",
            "runner: transformers\ntransformers: {device: cpu, torch_dtype: float32}",
        );
        let turns = |name: &str, arm: &str| {
            let m: serde_json::Value = serde_json::from_slice(
                &std::fs::read(
                    dir.path()
                        .join(name)
                        .join("arms")
                        .join(arm)
                        .join("measurement.json"),
                )
                .unwrap(),
            )
            .unwrap();
            m["turns"].clone()
        };
        for arm in ["hybrid", "kv-q8_0", "control-repeat"] {
            let (ours, native) = (turns("transformers", arm), turns("native", arm));
            assert_eq!(turn_ids(&ours), turn_ids(&native), "{arm}");
            assert_eq!(ours["generated_by"]["runner"], "transformers", "{arm}");
        }
        let q8 = turns("transformers", "kv-q8_0");
        assert_eq!(q8["generated_by"]["candidate"]["kv_cache"], "q8_0", "{q8}");
        assert_eq!(
            q8["generated_by"]["reference"]["kv_cache"],
            serde_json::Value::Null
        );
        let repeat = turns("transformers", "control-repeat");
        assert_eq!(repeat["summary"]["turn_match"]["value"], 1.0);
        let conversation = dir.path().join("conversation.json").canonicalize().unwrap();
        assert_eq!(
            repeat["conversation"]["path"],
            conversation.to_str().unwrap()
        );
        assert!(
            turns("native", "control-repeat")
                .get("conversation")
                .is_none()
        );
    }
}

/// A copy of an example whose config.json names an architecture the native runner does not run
/// (a hybrid Gated DeltaNet `qwen3_5_text`, as the issue's user had).
fn as_hybrid(name: &str, to: &Path) -> PathBuf {
    crate::support::copy_model(name, to);
    let path = to.join("config.json");
    let mut config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    config["model_type"] = "qwen3_5_text".into();
    config["architectures"] = serde_json::json!(["Qwen3_5ForCausalLM"]);
    config["full_attention_interval"] = 4.into();
    std::fs::write(&path, serde_json::to_vec_pretty(&config).unwrap()).unwrap();
    to.to_owned()
}

#[test]
fn the_transformers_runner_takes_an_architecture_the_native_runner_does_not_run() {
    let dir = tempfile::tempdir().unwrap();
    let reference = as_hybrid("shakespeare-bf16", &dir.path().join("reference"));
    let candidate = as_hybrid("shakespeare-w8a16", &dir.path().join("candidate"));
    let seen = dir.path().join("request.json");
    // The stand-in keeps the request it was given and stops: what matters is that cardproof
    // started it, with the identities read without the native runner's architecture list.
    let script = stand_in(
        dir.path(),
        &format!(
            "import shutil, sys\nshutil.copy(sys.argv[1], {:?})\nprint('stand-in stops here', file=sys.stderr)\nsys.exit(1)\n",
            seen.to_str().unwrap()
        ),
    );
    let out = dir.path().join("out");
    let r = transformers_measure()
        .flag("--runner-script", &script)
        .reference(&reference)
        .candidate(&candidate)
        .eval_text("examples/data/eval.txt")
        .context_length(256)
        .out(&out)
        .run();
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert!(
        !r.stderr.contains("not supported by the native runner"),
        "{}",
        r.stderr
    );
    assert!(r.stderr.contains("stand-in stops here"), "{}", r.stderr);
    let request: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&seen).expect("the runner was started")).unwrap();
    let text = serde_json::to_string(&request).unwrap();
    assert!(
        text.contains("2048"),
        "the logit width is in the request: {text}"
    );
    assert!(!out.join("measurement.json").exists());
}

/// A stand-in that answers with the recorded GPU exchange (the replay runner) and then writes
/// `linear_attention` into the record's environment, as the real runner does for a model with
/// Gated DeltaNet layers.
fn replay_with_linear_attention(dir: &Path, linear_attention: &serde_json::Value) -> PathBuf {
    stand_in(
        dir,
        &format!(
            "import json, subprocess, sys\nrc = subprocess.call([sys.executable, {replay:?}, sys.argv[1]])\nreq = json.load(open(sys.argv[1]))\nrec = json.load(open(req['record_path']))\nrec['environment']['linear_attention'] = json.loads({la:?})\njson.dump(rec, open(req['record_path'], 'w'))\nsys.exit(rc)\n",
            replay = fixture().join("replay_runner.py").to_str().unwrap(),
            la = linear_attention.to_string(),
        ),
    )
}

fn fla_kernels() -> serde_json::Value {
    serde_json::json!({
        "layers": 48,
        "gdn_kernel": "package",
        "gdn_function": "fla.ops.gated_delta_rule.chunk.chunk_gated_delta_rule",
        "causal_conv1d": "torch_fallback",
        "causal_conv1d_function": "transformers.models.qwen3_5.modeling_qwen3_5.causal_conv1d_fn",
        "packages": ["flash-linear-attention 0.6.0", "fla-core 0.6.0"],
        "recurrent_state_dtype": "float32",
        "conv_state_dtype": "bfloat16",
        "config_mamba_ssm_dtype": "float32",
        "observed_in": "the warm-up"
    })
}

fn replay_measure(script: &Path, out: &Path, json: bool) -> Run {
    let replay = fixture();
    let extra: &[&str] = if json { &["--json"] } else { &[] };
    stand_in_measure(
        script,
        out,
        &[("CARDPROOF_REPLAY", replay.to_str().unwrap())],
        extra,
    )
}

#[test]
fn the_gdn_kernels_the_runner_records_reach_the_measurement_and_its_text() {
    let dir = tempfile::tempdir().unwrap();
    let kernels = fla_kernels();
    // The reference differs (the torch fallback): both are kept, the reference's apart.
    let mut reference = kernels.clone();
    reference["gdn_kernel"] = "torch_fallback".into();
    reference["gdn_function"] =
        "transformers.models.qwen3_5.modeling_qwen3_5.torch_chunk_gated_delta_rule".into();
    reference["packages"] = serde_json::json!([]);
    let script = replay_with_linear_attention(
        dir.path(),
        &serde_json::json!({"reference": reference, "candidate": kernels}),
    );
    let out = dir.path().join("out");
    let r = replay_measure(&script, &out, false);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(
        r.stdout.contains(
            "linear attention: 48 GDN layers: delta rule package (fla.ops.gated_delta_rule.chunk.chunk_gated_delta_rule), conv1d torch fallback (transformers.models.qwen3_5.modeling_qwen3_5.causal_conv1d_fn); recurrent state float32, conv state bfloat16 (config mamba_ssm_dtype float32); flash-linear-attention 0.6.0, fla-core 0.6.0"
        ),
        "{}",
        r.stdout
    );
    assert!(
        r.stdout
            .contains("reference's linear attention: 48 GDN layers: delta rule torch fallback"),
        "{}",
        r.stdout
    );
    let path = out.join("measurement.json");
    let doc: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    let env = &doc["environment"];
    assert_eq!(env["linear_attention"], kernels, "{env}");
    assert_eq!(env["reference_linear_attention"], reference, "{env}");
    crate::output_schemas::assert_valid("measurement", &path.display().to_string(), &doc);
}

#[test]
fn a_gdn_kernel_record_that_breaks_its_schema_is_refused_naming_the_field() {
    let dir = tempfile::tempdir().unwrap();
    let mut kernels = fla_kernels();
    kernels["gdn_kernel"] = "whatever ran".into();
    let script = replay_with_linear_attention(
        dir.path(),
        &serde_json::json!({"reference": null, "candidate": kernels}),
    );
    let out = dir.path().join("out");
    let r = replay_measure(&script, &out, false);
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert!(
        r.stderr
            .contains("environment.linear_attention.candidate.gdn_kernel"),
        "{}",
        r.stderr
    );
    assert!(!out.join("measurement.json").exists());
}
