//! The process's compute settings, made once at start, before any thread exists: `--threads N`
//! means N cores for every pool in the process.

/// Pin the process to `threads` cores.
///
/// candle sizes every matrix product's parallelism from `RAYON_NUM_THREADS` (else the physical
/// cores), not from the rayon pool it runs in: without this, `--threads 1` ran each product as
/// two tasks and a second pool, and the process used more cores than asked. Setting the variable
/// makes candle's count, rayon's global pool and cardproof's own pools one number.
#[allow(unsafe_code)]
pub fn configure(threads: usize) {
    // SAFETY: called first thing in `main`, while the process has one thread, so no other
    // thread reads the environment concurrently (the hazard `set_var` is unsafe for).
    unsafe {
        std::env::set_var("RAYON_NUM_THREADS", threads.max(1).to_string());
    }
}
