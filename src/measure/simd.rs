//! Runtime dispatch to AVX2 + FMA code paths: the one place in `measure` that needs `unsafe`.
#![allow(unsafe_code)]

/// Whether this CPU has AVX2 and FMA (the detection is cached by std).
#[cfg(target_arch = "x86_64")]
pub fn has_avx2_fma() -> bool {
    std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn with_avx2<R>(f: impl FnOnce() -> R) -> R {
    f()
}

/// Run `f` inside a function compiled for AVX2 and FMA, so that the inlined kernel is vectorized
/// with them.
#[cfg(target_arch = "x86_64")]
pub fn avx2<R>(f: impl FnOnce() -> R) -> R {
    assert!(
        has_avx2_fma(),
        "avx2() called on a CPU without AVX2 and FMA"
    );
    // SAFETY: the CPU supports AVX2 and FMA, checked just above; that is the only requirement of
    // calling a `#[target_feature(enable = "avx2,fma")]` function.
    unsafe { with_avx2(f) }
}
