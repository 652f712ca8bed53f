//! Where a chat template comes from, found as transformers finds it, and its digest (a quant repo
//! sometimes ships a patched template, so the digest is what a card discloses and `verify`
//! compares).
//!
//! transformers (5.x) reads a model directory's `chat_template.jinja` when it exists, else the
//! `chat_template` of `tokenizer_config.json`: a string, or a list of `{"name", "template"}` of
//! which `default` is used unless a name is asked for. `--chat-template FILE` names a file
//! instead.

use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::error::{Error, Result};

/// The most bytes a template file or tokenizer config may hold: templates are a few to a few
/// tens of KB; a config beyond this is not a tokenizer config.
pub const MAX_TEMPLATE_BYTES: u64 = 4 << 20;

/// A chat template's text and where it was read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TemplateSource {
    /// The file it was read from.
    pub file: PathBuf,
    /// The name within a `tokenizer_config.json` list (`default`, `tool_use`), if any.
    pub name: Option<String>,
    pub text: String,
    /// sha256 of `text`'s UTF-8 bytes, hex.
    pub sha256: String,
}

impl TemplateSource {
    fn new(file: &Path, name: Option<String>, text: String) -> TemplateSource {
        let sha256 = crate::digest::hex(&Sha256::digest(text.as_bytes()));
        TemplateSource {
            file: file.to_owned(),
            name,
            text,
            sha256,
        }
    }

    /// A template file named by the user (`--chat-template FILE`).
    pub fn from_file(file: &Path) -> Result<TemplateSource> {
        let bytes = crate::files::read_capped(file, MAX_TEMPLATE_BYTES, "a chat template")?;
        let text = String::from_utf8(bytes)
            .map_err(|_| Error::format(file, None, "a chat template must be UTF-8 text"))?;
        Ok(TemplateSource::new(file, None, text))
    }

    /// The template of the model in `dir`, as transformers picks it; `name` picks one of a named
    /// list (else `default`). An error names the file and what is missing or malformed.
    pub fn from_model_dir(dir: &Path, name: Option<&str>) -> Result<TemplateSource> {
        let jinja = dir.join("chat_template.jinja");
        if jinja.is_file() && name.is_none() {
            return TemplateSource::from_file(&jinja);
        }
        let config_path = dir.join("tokenizer_config.json");
        let bytes = crate::files::read_capped_if_present(
            &config_path,
            MAX_TEMPLATE_BYTES,
            "a tokenizer config",
        )?
        .ok_or_else(|| {
            Error::format(
                &config_path,
                None,
                "the model has no chat template: neither chat_template.jinja nor a tokenizer_config.json (name one with --chat-template FILE)",
            )
        })?;
        let config: serde_json::Value = serde_json::from_slice(&bytes)
            .map_err(|e| Error::format(&config_path, None, format!("not valid JSON: {e}")))?;
        let field = Some("chat_template");
        match &config["chat_template"] {
            serde_json::Value::String(text) if name.is_none() => {
                Ok(TemplateSource::new(&config_path, None, text.clone()))
            }
            serde_json::Value::String(_) => Err(Error::format(
                &config_path,
                field,
                format!(
                    "is a single template, so it has no template named `{}`",
                    name.unwrap_or_default()
                ),
            )),
            serde_json::Value::Array(list) => {
                let wanted = name.unwrap_or("default");
                let mut names = Vec::new();
                for (i, entry) in list.iter().enumerate() {
                    let (Some(n), Some(t)) = (entry["name"].as_str(), entry["template"].as_str())
                    else {
                        return Err(Error::format(
                            &config_path,
                            field,
                            format!(
                                "entry {i} is not a {{\"name\", \"template\"}} pair of strings"
                            ),
                        ));
                    };
                    if n == wanted {
                        return Ok(TemplateSource::new(
                            &config_path,
                            Some(n.to_owned()),
                            t.to_owned(),
                        ));
                    }
                    names.push(n.to_owned());
                }
                Err(Error::format(
                    &config_path,
                    field,
                    format!(
                        "has no template named `{wanted}` (it has: {})",
                        names.join(", ")
                    ),
                ))
            }
            serde_json::Value::Null => Err(Error::format(
                &config_path,
                field,
                "is missing: the model has no chat template (name one with --chat-template FILE)",
            )),
            other => Err(Error::format(
                &config_path,
                field,
                format!("must be a string or a list of named templates, not {other}"),
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir_with(files: &[(&str, &str)]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        for (name, text) in files {
            std::fs::write(dir.path().join(name), text).unwrap();
        }
        dir
    }

    #[test]
    fn the_template_is_found_where_transformers_looks() {
        let d = dir_with(&[
            ("chat_template.jinja", "J"),
            ("tokenizer_config.json", r#"{"chat_template": "C"}"#),
        ]);
        let t = TemplateSource::from_model_dir(d.path(), None).unwrap();
        assert_eq!((t.text.as_str(), t.name), ("J", None));
        assert_eq!(
            t.sha256,
            "6da43b944e494e885e69af021f93c6d9331c78aa228084711429160a5bbd15b5"
        );
        let d = dir_with(&[(
            "tokenizer_config.json",
            r#"{"chat_template": [{"name": "default", "template": "D"}, {"name": "tool_use", "template": "T"}]}"#,
        )]);
        assert_eq!(
            TemplateSource::from_model_dir(d.path(), None).unwrap().text,
            "D"
        );
        let t = TemplateSource::from_model_dir(d.path(), Some("tool_use")).unwrap();
        assert_eq!(
            (t.text.as_str(), t.name.as_deref()),
            ("T", Some("tool_use"))
        );
    }

    #[test]
    fn a_missing_or_malformed_template_is_an_error_naming_the_file() {
        let d = dir_with(&[]);
        let e = TemplateSource::from_model_dir(d.path(), None).unwrap_err();
        assert!(
            e.to_string().contains("tokenizer_config.json")
                && e.to_string().contains("no chat template"),
            "{e}"
        );
        for (config, message) in [
            (r#"{}"#, "is missing"),
            (r#"{"chat_template": 3}"#, "must be a string or a list"),
            (r#"{"chat_template": [{"name": "x"}]}"#, "entry 0 is not"),
            (
                r#"{"chat_template": [{"name": "x", "template": "X"}]}"#,
                "no template named `default` (it has: x)",
            ),
        ] {
            let d = dir_with(&[("tokenizer_config.json", config)]);
            let e = TemplateSource::from_model_dir(d.path(), None).unwrap_err();
            assert!(e.to_string().contains(message), "{config}: {e}");
        }
    }
}
