//! Checkpoints: strict header readers (safetensors, GGUF), quantization-scheme detection and the
//! manifest hasher. Nothing here loads weights.

pub mod dtype;
pub mod gguf;
pub mod hash;
pub mod head;
pub mod inspect;
pub mod layout;
pub mod members;
pub mod mmap;
pub mod quant_config;
pub mod safetensors;

/// Whether a directory holds checkpoint files (safetensors or GGUF) next to its card, or the path
/// is a GGUF file itself.
pub fn has_checkpoint(dir: &std::path::Path) -> bool {
    if dir
        .extension()
        .is_some_and(|x| x.eq_ignore_ascii_case("gguf"))
    {
        return std::fs::metadata(dir).is_ok_and(|m| m.is_file());
    }
    std::fs::read_dir(dir).is_ok_and(|entries| {
        entries.filter_map(|e| e.ok()).any(|e| {
            let path = e.path();
            !members::excluded(&e.file_name().to_string_lossy())
                && matches!(
                    path.extension().and_then(|x| x.to_str()),
                    Some("safetensors" | "gguf")
                )
                || path
                    .file_name()
                    .is_some_and(|n| n == "model.safetensors.index.json")
        })
    })
}
