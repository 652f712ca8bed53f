//! Checkpoints: strict header readers (safetensors, GGUF), quantization-scheme detection and the
//! manifest hasher. Nothing here loads weights.

pub mod dtype;
pub mod gguf;
pub mod mmap;
pub mod safetensors;
