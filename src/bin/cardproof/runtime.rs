//! The process's compute settings, made once at start, before any thread exists: `--threads N`
//! means N cores for every pool in the process.

/// Pin the process to `threads` cores.
///
/// candle sizes every matrix product's parallelism from `RAYON_NUM_THREADS` (else the physical
/// cores), not from the rayon pool it runs in: without this, `--threads 1` ran each product as
/// two tasks and a second pool, and the process used more cores than asked. Setting the variable
/// makes candle's count, rayon's global pool and cardproof's own pools one number.
///
/// candle's element-wise operations run on a second pool of its own (`CANDLE_NUM_THREADS`, else
/// the same count), whose workers spin at a barrier between operations: beside rayon's N threads
/// that made 2N−1 busy threads on N cores (4% of a 2-thread run's samples were that spinning).
/// With one, those operations run on the calling thread; the runners spread work over windows
/// and rows on rayon's pool instead, and the matrix products keep their N-way split.
#[allow(unsafe_code)]
pub fn configure(threads: usize) {
    // SAFETY: called first thing in `main`, while the process has one thread, so no other
    // thread reads the environment concurrently (the hazard `set_var` is unsafe for).
    unsafe {
        std::env::set_var("RAYON_NUM_THREADS", threads.max(1).to_string());
        std::env::set_var("CANDLE_NUM_THREADS", "1");
    }
}
