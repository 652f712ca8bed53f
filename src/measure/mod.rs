//! The KLD measurement: per-row records from reference and candidate logits, and the statistics
//! every runner and verdict relies on.

pub mod llamacpp;
