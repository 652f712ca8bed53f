//! CPU feature detection for the kernels' AVX2 + FMA builds (see `kernel::dispatched!`).

/// Whether this CPU has AVX2 and FMA (std caches the detection).
#[cfg(target_arch = "x86_64")]
pub fn has_avx2_fma() -> bool {
    std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
}
