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
    keep_freed_memory();
}

/// Keep freed buffers in the heap for the next window instead of giving them back.
///
/// The forward pass frees and reallocates the same few-megabyte activations layer after layer.
/// glibc served each from a fresh mapping (its dynamic threshold), trimmed the heap's top after
/// frees, and gave each rayon worker an arena of its own whose 64 MiB heaps are unmapped as they
/// empty: every buffer came back as new pages, 2.9 million page faults on a 2-window run of the
/// 0.6B benchmark pair, each page zeroed by the kernel. A fixed 32 MiB mapping threshold, no
/// trimming and one arena: 0.7 million (`perf stat`, docs/benchmarks.md). The allocations are
/// few and large, so one arena costs no contention. Larger blocks (a chunk of logits, a
/// dequantized weight) are still mapped and returned when freed.
#[allow(unsafe_code)]
fn keep_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: `mallopt` only sets allocator parameters; called before any other thread exists.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 32 << 20);
        libc::mallopt(libc::M_TRIM_THRESHOLD, i32::MAX);
        libc::mallopt(libc::M_ARENA_MAX, 1);
    }
}
