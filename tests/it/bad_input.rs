//! Input cardproof cannot read: exit 2 with one message naming the file and the place.

use crate::support::*;

/// Lint `bytes` with `--json` and check the exit-2 error document.
fn refused(bytes: &[u8]) -> serde_json::Value {
    let dir = card_dir(bytes);
    let run = cardproof_in(dir.path(), &["lint", "README.md", "--json"]);
    assert_eq!(run.code, 2, "stderr: {}", run.stderr);
    // The error document alone: stderr does not repeat it.
    assert_eq!(run.stderr, "");
    let human = cardproof_in(dir.path(), &["lint", "README.md"]);
    assert_eq!(human.code, 2, "stderr: {}", human.stderr);
    assert!(!human.stderr.contains("panicked"), "{}", human.stderr);
    assert!(
        human.stderr.starts_with("error: README.md"),
        "{}",
        human.stderr
    );
    let doc = run.json();
    assert_eq!(doc["schema_version"], 1);
    assert_eq!(doc["error"]["file"], "README.md");
    doc["error"].clone()
}

fn place(error: &serde_json::Value) -> (Option<u64>, Option<u64>) {
    (error["line"].as_u64(), error["column"].as_u64())
}

#[test]
fn yaml_syntax_errors_name_the_line() {
    let e = refused(b"---\nlicense: mit\nfidelity: {schema: [\n---\n");
    assert!(
        e["message"].as_str().unwrap().contains("YAML syntax error"),
        "{e}"
    );
    assert!(e["line"].as_u64().unwrap() >= 3, "{e}");
}

#[test]
fn bad_indentation_is_a_syntax_error() {
    let e = refused(b"---\na:\n  b: 1\n c: 2\n---\n");
    assert!(e["message"].as_str().unwrap().contains("YAML"), "{e}");
}

#[test]
fn duplicate_keys_name_both_places() {
    let e = refused(b"---\nlicense: mit\nbase_model: a/b\nlicense: apache-2.0\n---\n");
    assert_eq!(place(&e), (Some(4), Some(1)));
    assert!(
        e["message"]
            .as_str()
            .unwrap()
            .contains("duplicate key `license` in the front matter (first defined on line 2)")
    );
}

#[test]
fn duplicate_keys_inside_fidelity_are_refused() {
    let card = compliant_with("    dtype: bf16\n", "    dtype: bf16\n    dtype: f16\n");
    let e = refused(card.as_bytes());
    assert!(
        e["message"]
            .as_str()
            .unwrap()
            .contains("duplicate key `dtype`")
    );
}

#[test]
fn alias_bombs_exceed_the_budget() {
    let mut text = String::from("---\na: &a [x, x, x, x, x, x, x, x, x, x]\n");
    for i in 0..9 {
        let prev = if i == 0 {
            "a".to_owned()
        } else {
            format!("b{}", i - 1)
        };
        let refs = vec![format!("*{prev}"); 10].join(", ");
        text.push_str(&format!("b{i}: &b{i} [{refs}]\n"));
    }
    text.push_str("---\n");
    let e = refused(text.as_bytes());
    assert!(e["message"].as_str().unwrap().contains("budget"), "{e}");
}

#[test]
fn very_deep_nesting_exceeds_the_budget() {
    let text = format!("---\na: {}1{}\n---\n", "[".repeat(5000), "]".repeat(5000));
    let e = refused(text.as_bytes());
    assert!(e["line"].is_u64(), "{e}");
    let block: String = (0..500)
        .map(|i| format!("{}k{i}:\n", "  ".repeat(i)))
        .collect();
    let e = refused(format!("---\n{block}{}x: 1\n---\n", "  ".repeat(500)).as_bytes());
    assert!(
        e["message"].as_str().unwrap().contains("nesting depth"),
        "{e}"
    );
}

#[test]
fn a_card_over_16_mib_is_refused_without_reading_it() {
    let dir = tempfile::tempdir().unwrap();
    let file = std::fs::File::create(dir.path().join("README.md")).unwrap();
    file.set_len(100 * 1024 * 1024).unwrap(); // sparse: 100 MB on disk costs nothing
    let run = cardproof_in(dir.path(), &["lint", ".", "--json"]);
    assert_eq!(run.code, 2);
    let e = &run.json()["error"];
    assert!(
        e["message"]
            .as_str()
            .unwrap()
            .contains("104857600 bytes, over the 16777216-byte limit"),
        "{e}"
    );
    assert_eq!(e["file"], "./README.md");
    assert!(e["line"].is_null());
}

#[test]
fn non_utf8_bytes_name_the_place() {
    let e = refused(b"---\nlicense: mit\n---\n# Caf\xe9\n");
    assert!(e["message"].as_str().unwrap().contains("UTF-8"));
    assert_eq!(place(&e), (Some(4), Some(6)));
}

#[test]
fn more_than_one_yaml_document_is_refused() {
    // `--- # comment` does not close the block for the Hub, so YAML sees a second document.
    let e = refused(b"---\na: 1\n--- # second\nb: 2\n---\n");
    assert!(
        e["message"]
            .as_str()
            .unwrap()
            .contains("more than one YAML document"),
        "{e}"
    );
}

#[test]
fn merge_keys_and_custom_tags_are_refused() {
    let e = refused(b"---\nbase: &b {x: 1}\nother:\n  <<: *b\n---\n");
    assert!(e["message"].as_str().unwrap().contains("merge keys"), "{e}");
    let e = refused(b"---\na: !python/object:os.system echo\n---\n");
    assert!(e["message"].as_str().unwrap().contains("tag"), "{e}");
}

#[test]
fn missing_paths_and_directories_without_a_card_are_exit_2() {
    let run = cardproof(&["lint", "no/such/dir", "--json"]);
    assert_eq!(run.code, 2);
    assert_eq!(run.json()["error"]["message"], "no such file or directory");
    let dir = tempfile::tempdir().unwrap();
    let run = cardproof_in(dir.path(), &["lint", "."]);
    assert_eq!(run.code, 2);
    assert!(
        run.stderr.contains("directory holds no README.md"),
        "{}",
        run.stderr
    );
}

#[test]
fn human_errors_show_the_offending_line() {
    let dir = card_dir("---\nlicense: mit\nlicense: mit\n---\n");
    let run = cardproof_in(dir.path(), &["lint", "README.md"]);
    assert_eq!(run.code, 2);
    assert!(run.stdout.is_empty());
    insta::assert_snapshot!(run.stderr);
}

#[test]
fn bad_flags_are_usage_errors() {
    let run = cardproof(&["lint", "--format", "yaml"]);
    assert_eq!(run.code, 2);
}
