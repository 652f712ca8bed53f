//! Any bytes as a llama.cpp `--kl-divergence-base` file: opening it and reading every row must
//! never panic; a file that opens has exactly the size its header implies and tokens in range,
//! and every row it yields has a finite scale and minimum. A file that opens is also compared
//! with itself (the full statistics path). Inputs without the magic go through the
//! printed-block parser as text instead.
#![no_main]

use std::path::{Path, PathBuf};
use std::sync::LazyLock;

use cardproof::kld::llamacpp::{BaseFile, BaseRow, MAGIC, compare_base_files, parse_printed};
use libfuzzer_sys::fuzz_target;

/// One scratch file per fuzzing process (libFuzzer runs inputs one at a time).
static PATH: LazyLock<PathBuf> = LazyLock::new(|| {
    std::env::temp_dir().join(format!(
        "cardproof-fuzz-llamacpp-{}.kld",
        std::process::id()
    ))
});

fuzz_target!(|data: &[u8]| {
    // Inputs that are not base files exercise the printed-block parser instead (which never
    // fails), so neither path dilutes the other.
    if !data.starts_with(MAGIC) {
        let _ = parse_printed(&String::from_utf8_lossy(data));
        if data.len() > 8 {
            return;
        }
    }
    let path = &*PATH;
    std::fs::write(path, data).expect("scratch file");
    check(path, data);
    let _ = std::fs::remove_file(path);
});

fn check(path: &Path, data: &[u8]) {
    let Ok(file) = BaseFile::open(path) else {
        return;
    };
    let (n_ctx, n_vocab, n_chunk) = (
        u64::from(file.n_ctx),
        u64::from(file.n_vocab),
        u64::from(file.n_chunk),
    );
    let nv = 2 * n_vocab.div_ceil(2) + 4;
    let size = 20 + 4 * n_chunk * n_ctx + 2 * file.n_rows() * nv;
    assert_eq!(size, data.len() as u64);
    assert_eq!(file.tokens.len() as u64, n_chunk * n_ctx);
    assert!(file.tokens.iter().all(|&t| t >= 0 && (t as u64) < n_vocab));

    let mut reader = file.reader().expect("reader of an opened file");
    let mut row = BaseRow::default();
    let mut r = 0;
    loop {
        match reader.next_row(&mut row) {
            Ok(true) => {
                assert!(row.scale.is_finite() && row.min_log_prob.is_finite());
                assert_eq!(row.codes.len() as u64, n_vocab);
                let (chunk, j) = file.row_position(r);
                assert!(chunk < n_chunk && j >= n_ctx / 2 && j + 1 < n_ctx);
                let _ = file.next_token(r);
                r += 1;
            }
            Ok(false) => {
                assert_eq!(r, file.n_rows());
                break;
            }
            Err(_) => break,
        }
    }
    let mut skipping = file.reader().expect("second reader");
    if skipping.skip_rows(file.n_rows() / 2).is_ok() {
        let _ = skipping.next_row(&mut row);
    }
    let _ = compare_base_files(&file, &file);
}
