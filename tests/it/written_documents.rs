//! The files cardproof writes and the transformers runner's exchange, against their committed
//! schemas (issue #15): `measurement.json` from `measure` (a reference model, a hidden-state
//! artifact, a llama.cpp base file), `report.json` from `verify` (a card reproduced and one that
//! fails), the exchange recorded on a GPU (tests/fixtures/gpu) and the request cardproof writes
//! today. Each validates against the committed schema and a copy closed to undeclared fields
//! ([`crate::output_schemas::assert_valid`]); `sweep.json`, written only with torch, is checked
//! in `transformers::torch`.

use std::path::{Path, PathBuf};

use cardproof::rerun::Measurement;
use serde_json::Value;

use crate::output_schemas::{assert_valid, violations};
use crate::support::{
    Cmd, LLAMACPP_PROTOCOL, Run, measure_short, model, repo_root, short_text, without_direction,
};
use crate::verify::Verified;

fn read_json(path: &Path) -> Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

#[track_caller]
fn ok(what: &str, run: &Run) {
    assert_eq!(run.code, 0, "{what}: {}\n{}", run.stderr, run.stdout);
}

/// `dir/measurement.json` as its schema describes it; returns the document.
#[track_caller]
fn valid_measurement(what: &str, dir: &Path) -> Value {
    let doc = read_json(&dir.join("measurement.json"));
    assert_valid("measurement", what, &doc);
    doc
}

/// `Measurement::read` of `path`, serialized again: the same JSON value.
#[track_caller]
fn assert_reads_back_as_written(what: &str, path: &Path) -> Measurement {
    let measurement = Measurement::read(path).unwrap_or_else(|e| panic!("{what}: {e}"));
    assert_eq!(
        measurement.to_value(),
        read_json(path),
        "{what}: read then serialized"
    );
    measurement
}

/// [`assert_reads_back_as_written`], and the same bytes as the file (pretty, a trailing
/// newline): for a measurement this cardproof wrote.
#[track_caller]
fn assert_reads_back_exactly(what: &str, path: &Path) {
    let measurement = assert_reads_back_as_written(what, path);
    let mut text = serde_json::to_string_pretty(&measurement).unwrap();
    text.push('\n');
    assert_eq!(
        text,
        std::fs::read_to_string(path).unwrap(),
        "{what}: the bytes"
    );
}

/// `reference export` of the bf16 example on `text` (windows of 128 tokens) into `out`.
fn export(text: &Path, out: &Path, extra: &[&str]) {
    let r = Cmd::reference_export()
        .flag("--model", model("shakespeare-bf16"))
        .eval_text(text)
        .context_length(128)
        .out(out)
        .args(extra)
        .run();
    ok("reference export", &r);
}

/// `measure` of the w8a16 example against a reference artifact, into `out`.
fn measure_against(artifact: &Path, out: &Path, extra: &[&str]) {
    let r = Cmd::measure()
        .flag("--reference-artifact", artifact)
        .candidate(model("shakespeare-w8a16"))
        .context_length(128)
        .bootstrap(10)
        .out(out)
        .args(extra)
        .run();
    ok("measure --reference-artifact", &r);
}

#[test]
fn measure_writes_the_measurement_json_its_schema_describes() {
    let tmp = tempfile::tempdir().unwrap();
    let t = tmp.path();
    let text = short_text(t, 2500);

    // Against the reference model.
    let candidate = PathBuf::from(model("shakespeare-w8a16"));
    let out = t.join("model");
    ok(
        "measure",
        &measure_short(&candidate, &text, &out, "10", &[]),
    );
    let doc = valid_measurement("measure", &out);
    assert!(
        doc["environment"].get("reference_artifact").is_none(),
        "{doc}"
    );

    // Against a hidden-state artifact exported on the same text.
    let hidden = t.join("ref.safetensors");
    export(&text, &hidden, &[]);
    let out = t.join("hidden");
    measure_against(&hidden, &out, &["--eval-text", s(&text)]);
    let doc = valid_measurement("measure --reference-artifact (hidden)", &out);
    assert_eq!(doc["environment"]["reference_artifact"]["kind"], "hidden");
}

/// The draft `fidelity:` block holds `""` where the run does not know what the disclosure
/// requires there: the eval text's name when the tokens come from a hidden-state artifact alone;
/// the text's digest and the reference's files digest with a llama.cpp base file. `card` carries
/// them into the card and lint then reports them. The schema states the disclosure's rule; these
/// are the only places each document breaks it (a fix fails this test: drop what it fixed).
#[test]
fn a_measurement_against_an_artifact_writes_no_blank_draft_fields() {
    // Regression: a run against a stored reference wrote `""` for what it did not know (the
    // eval text's name with a hidden-state artifact alone; the reference's files and the text's
    // digest with a llama.cpp base file), which the disclosure schema refuses and `card` copied
    // into cards. The draft now names what it knows and leaves out what it does not.
    let tmp = tempfile::tempdir().unwrap();
    let t = tmp.path();
    let text = short_text(t, 2500);
    let hidden = t.join("ref.safetensors");
    export(&text, &hidden, &[]);
    let base = t.join("ref.kld");
    export(&text, &base, &["--kind", "llamacpp", "--bos", "per-window"]);
    for (what, artifact, protocol, kind, source, absent) in [
        (
            "a hidden-state artifact alone",
            &hidden,
            &[][..],
            "hidden",
            "the eval text of reference artifact ref.safetensors",
            &[][..],
        ),
        (
            "a llama.cpp base file",
            &base,
            &LLAMACPP_PROTOCOL[..],
            "llamacpp_base",
            "the token stream of llama.cpp base file ref.kld",
            &[
                "/fidelity/reference/files_sha256",
                "/fidelity/eval/text/sha256",
            ][..],
        ),
    ] {
        let out = t.join(kind);
        measure_against(artifact, &out, protocol);
        let doc = read_json(&out.join("measurement.json"));
        assert_eq!(doc["schema_version"], 1);
        assert_eq!(doc["environment"]["reference_artifact"]["kind"], kind);
        assert_eq!(doc["fidelity"]["eval"]["text"]["source"], source, "{what}");
        for at in absent {
            assert_eq!(doc.pointer(at), None, "{what}: {at}");
        }
        let broken: Vec<(&str, String)> = violations("measurement", &doc)
            .into_iter()
            .map(|v| (v.how, v.at))
            .collect();
        assert!(broken.is_empty(), "{what}: {broken:?}\n{doc:#}");
    }
}

#[test]
fn measurement_read_round_trips_a_written_measurement_exactly() {
    let tmp = tempfile::tempdir().unwrap();
    let t = tmp.path();
    let text = short_text(t, 2500);
    // The GGUF example (the other format; the safetensors ones are read back elsewhere here):
    // its optional parts (`run_id`, `emulate`, `threads`, `tokenizer`) are written and kept.
    let candidate = PathBuf::from(model("shakespeare-q4_0-gguf"));
    let out = t.join("m");
    ok(
        "measure",
        &measure_short(&candidate, &text, &out, "10", &[]),
    );
    let path = out.join("measurement.json");
    assert_reads_back_exactly("measure (GGUF)", &path);
    let written = read_json(&path);
    for key in ["run_id", "emulate", "threads", "tokenizer"] {
        let present = written.get(key).or_else(|| written["environment"].get(key));
        assert!(present.is_some(), "{key}: {written}");
    }
    // One written by an earlier cardproof from the GPU runner: the same value (its keys in
    // another order than this cardproof writes them, so not the same bytes).
    assert_reads_back_as_written(
        "tests/fixtures/gpu",
        &repo_root().join("tests/fixtures/gpu/measurement.json"),
    );
}

#[test]
fn a_measurement_of_another_schema_version_is_refused() {
    let path = repo_root().join("tests/fixtures/gpu/measurement.json");
    let mut doc = read_json(&path);
    doc["schema_version"] = 2.into();
    let err = Measurement::from_slice(&path, &serde_json::to_vec(&doc).unwrap()).unwrap_err();
    let message = err.to_string();
    assert!(
        message.contains("schema_version")
            && message.contains("unsupported schema_version 2 (this cardproof reads version 1)"),
        "{message}"
    );
    // Version 1 reads.
    doc["schema_version"] = 1.into();
    Measurement::from_slice(&path, &serde_json::to_vec(&doc).unwrap()).unwrap();
}

#[test]
fn verify_writes_the_report_json_its_schema_describes() {
    let v = Verified::new("shakespeare-w8a16", &[]);
    // Its card's measurement, then a reproduced report and the rerun's measurement beside it.
    valid_measurement("measure (Verified)", &v.dir.path().join("m"));
    let r = v.verify();
    ok("verify", &r);
    let report = read_json(&v.out().join("report.json"));
    assert_eq!(report["verdict"], "reproduced");
    assert_valid("report", "verify (reproduced)", &report);
    assert!(report["measurement"].is_object(), "{report}");
    valid_measurement("verify (reproduced)", &v.out());

    // A card that fails with undisclosed items: the KL direction removed (nothing is rerun).
    let card = std::fs::read_to_string(v.card()).unwrap();
    std::fs::write(v.card(), without_direction(&card)).unwrap();
    let r = v.verify();
    assert_eq!(r.code, 1, "{}\n{}", r.stderr, r.stdout);
    let report = read_json(&v.out().join("report.json"));
    assert_eq!(report["verdict"], "undisclosed", "{report}");
    assert!(!report["undisclosed"].as_array().unwrap().is_empty());
    assert!(report["measurement"].is_null(), "{report}");
    assert_valid("report", "verify (undisclosed)", &report);

    // A card whose lane differs from the rerun's: a file added to the checkpoint after the card
    // (its files digest is no longer the card's).
    std::fs::write(v.card(), &card).unwrap();
    std::fs::write(v.candidate().join("notes.txt"), "added after the card\n").unwrap();
    let r = v.verify();
    assert_eq!(r.code, 1, "{}\n{}", r.stderr, r.stdout);
    let report = read_json(&v.out().join("report.json"));
    assert_eq!(report["verdict"], "not_comparable", "{report}");
    let differences = report["lane_differences"].as_array().unwrap();
    assert!(!differences.is_empty(), "{report}");
    assert_valid("report", "verify (lane differences)", &report);
}

fn fixture() -> PathBuf {
    repo_root().join("tests/fixtures/gpu")
}

#[test]
fn the_recorded_runner_exchange_matches_its_schemas() {
    let request = read_json(&fixture().join("request.json"));
    assert_valid(
        "runner-request",
        "tests/fixtures/gpu/request.json",
        &request,
    );
    let record = read_json(&fixture().join("record.json"));
    assert_valid("runner-record", "tests/fixtures/gpu/record.json", &record);
    assert_eq!(record["ok"], true);
    // A failure record as the program writes it: no runs, no environment.
    let failure = serde_json::json!({
        "protocol": 1,
        "ok": false,
        "error": {"kind": "out_of_memory_plan", "message": "the run needs about 99.0 GiB"},
    });
    assert_valid("runner-record", "a failure record", &failure);
}

/// Stands in for the runner: keeps a copy of the request in `$CARDPROOF_CAPTURE`, then answers
/// it with the recorded exchange (replay_runner.py).
const CAPTURE: &str = "import os, runpy, shutil, sys
shutil.copy(sys.argv[1], os.environ['CARDPROOF_CAPTURE'])
replay = os.path.join(os.environ['CARDPROOF_REPLAY'], 'replay_runner.py')
sys.argv = [replay, sys.argv[1]]
runpy.run_path(replay, run_name='__main__')
";

#[test]
fn the_runner_request_cardproof_writes_matches_its_schema() {
    let tmp = tempfile::tempdir().unwrap();
    let t = tmp.path();
    let script = t.join("capture.py");
    std::fs::write(&script, CAPTURE).unwrap();
    let captured = t.join("request.json");
    let (out, dump) = (t.join("out"), t.join("dump"));
    let r = Cmd::measure()
        .args(["--runner", "transformers"])
        .flag("--runner-script", &script)
        .reference(model("shakespeare-bf16"))
        .candidate(model("shakespeare-w8a16"))
        .eval_text("examples/data/eval.txt")
        .context_length(256)
        .out(&out)
        .flag("--runner-dump", &dump)
        .env("CARDPROOF_REPLAY", fixture())
        .env("CARDPROOF_CAPTURE", &captured)
        .run();
    assert_eq!(r.code, 0, "{}", r.stderr);

    let request = read_json(&captured);
    assert_valid("runner-request", "the request cardproof writes", &request);
    // Every field cardproof writes is there, those the schema lets a reader default included.
    let properties = cardproof::output::document("runner-request")
        .unwrap()
        .schema()["properties"]
        .as_object()
        .unwrap()
        .keys()
        .cloned()
        .collect::<Vec<_>>();
    let written: Vec<String> = request.as_object().unwrap().keys().cloned().collect();
    assert_eq!(written, properties, "{request}");
    assert_eq!(
        request["dump"]["dir"],
        s(&std::path::absolute(&dump).unwrap())
    );
    // The exchange kept beside the dump (`--runner-dump`): the request as sent and the record.
    assert_eq!(read_json(&dump.join("request.json")), request);
    let record = read_json(&dump.join("record.json"));
    assert_valid("runner-record", "the record kept by --runner-dump", &record);
    // And the measurement of the transformers lane.
    let doc = valid_measurement("measure --runner transformers (replayed)", &out);
    assert_eq!(doc["environment"]["runner"], "transformers");
    assert_reads_back_exactly(
        "measure --runner transformers",
        &out.join("measurement.json"),
    );
}
