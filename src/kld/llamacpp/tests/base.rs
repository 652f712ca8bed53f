//! Reading, writing and refusing base files.

use super::*;
use crate::kld::llamacpp::base_file::nearest_int;

#[test]
fn fixtures_open_with_their_real_geometry() {
    let mut streams = Vec::new();
    for name in ["ref.kld", "cand-q5_0.kld", "cand-q6_k.kld"] {
        let f = BaseFile::open(&fixture(name)).unwrap();
        // What the files hold (the README: -c 128, 39 windows, 63 scored rows each).
        assert_eq!((f.n_ctx, f.n_vocab, f.n_chunk), (128, 512, 39), "{name}");
        assert_eq!(f.tokens.len(), 39 * 128);
        assert_eq!(f.rows_per_chunk(), 63);
        assert_eq!(f.n_rows(), 2457);
        assert_eq!(f.row_position(0), (0, 64));
        assert_eq!(f.row_position(62), (0, 126));
        assert_eq!(f.row_position(63), (1, 64));
        assert_eq!(f.row_position(2456), (38, 126));
        assert_eq!(f.next_token(0), f.tokens[65]);
        assert_eq!(f.next_token(63), f.tokens[128 + 65]);
        assert_eq!(f.next_token(2456), f.tokens[38 * 128 + 127]);
        assert_eq!(f.describe_row(70), "row 70 (chunk 1, position 71)");

        let mut reader = f.reader().unwrap();
        let mut row = BaseRow::default();
        let mut n = 0;
        while reader.next_row(&mut row).unwrap() {
            assert_eq!(row.codes.len(), 512);
            // llama.cpp's encoding: the top token gets the top code and decodes to -lse <= 0;
            // the window is at most 16 nats wide.
            assert!(row.scale > 0.0 && row.scale <= 16.0 / 65535.0 * 1.000_001);
            let top = row.codes.iter().copied().max().unwrap();
            assert_eq!(top, 65535, "row {n}");
            let top_lp = row.log_prob(row.codes.iter().position(|&q| q == top).unwrap());
            assert!(top_lp <= 1e-6 && top_lp > -16.0, "row {n}: {top_lp}");
            n += 1;
        }
        assert_eq!(n, 2457);
        assert!(!reader.next_row(&mut row).unwrap(), "stays at the end");
        streams.push(f.tokens);
    }
    assert!(streams.windows(2).all(|w| w[0] == w[1]), "one token stream");
}

#[test]
fn skip_rows_lands_on_the_same_row_as_reading() {
    let f = BaseFile::open(&fixture("ref.kld")).unwrap();
    let mut seq = f.reader().unwrap();
    let mut row = BaseRow::default();
    for _ in 0..=64 {
        assert!(seq.next_row(&mut row).unwrap());
    }
    let mut skip = f.reader().unwrap();
    skip.skip_rows(64).unwrap();
    assert_eq!(skip.position(), 64);
    let mut skipped = BaseRow::default();
    assert!(skip.next_row(&mut skipped).unwrap());
    assert_eq!(skipped, row);
    skip.skip_rows(2457 - 65).unwrap();
    assert!(!skip.next_row(&mut skipped).unwrap());
    let err = skip.skip_rows(1).unwrap_err();
    assert_kind(err, "usage", &f.path, &["cannot skip 1 rows from row 2457"]);
}

#[test]
fn decode_matches_log_prob() {
    let row = BaseRow {
        scale: 0.25,
        min_log_prob: -17.5,
        codes: vec![0, 1, 64, 65535],
    };
    let d = row.decode();
    assert_eq!(d, vec![-17.5, -17.25, -1.5, 16366.25]);
    for (i, v) in d.iter().enumerate() {
        assert_eq!(*v, row.log_prob(i));
    }
}

#[test]
fn nearest_int_rounds_half_to_even() {
    for (x, want) in [
        (0.0, 0),
        (0.49, 0),
        (0.5, 0),
        (1.5, 2),
        (2.5, 2),
        (3.5, 4),
        (65534.5, 65534),
        (65533.5, 65534),
        (65535.0, 65535),
        (12.499_999, 12),
    ] {
        assert_eq!(nearest_int(x), want, "{x}");
        assert_eq!(nearest_int(x), x.round_ties_even() as i32, "{x}");
    }
}

/// The true log-softmax, in f64.
fn true_log_probs(logits: &[f32]) -> Vec<f64> {
    let max = logits.iter().copied().fold(f32::MIN, f32::max) as f64;
    let lse = logits
        .iter()
        .map(|&l| (l as f64 - max).exp())
        .sum::<f64>()
        .ln();
    logits.iter().map(|&l| l as f64 - max - lse).collect()
}

#[test]
fn encode_round_trip_is_within_half_a_step() {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut below = 0;
    for _ in 0..200 {
        let logits = rng.logits(301);
        let row = encode_row(&logits);
        let exact = true_log_probs(&logits);
        let max = logits.iter().copied().fold(f32::MIN, f32::max);
        let min_logit = max - 16.0;
        // f32 rounding of `scale*q + min_log_prob` (|terms| < 32, a few operations).
        let eps = 4e-6;
        for (i, &l) in logits.iter().enumerate() {
            let decoded = row.log_prob(i) as f64;
            if l > min_logit {
                assert!(
                    (decoded - exact[i]).abs() <= row.scale as f64 / 2.0 + eps,
                    "token {i}: {decoded} vs {}",
                    exact[i]
                );
            } else {
                // At or below the window: the -16 clamp, above the truth.
                below += 1;
                assert_eq!(row.codes[i], 0);
                assert_eq!(decoded as f32, row.min_log_prob);
                assert!(decoded >= exact[i] - eps);
                assert!((decoded - (exact[i] - (l - min_logit) as f64)).abs() <= eps);
            }
        }
    }
    assert!(below > 1000, "the generator exercises the clamp ({below})");
}

#[test]
fn flat_row_has_scale_zero() {
    let row = encode_row(&[2.5; 7]);
    assert_eq!(row.scale, 0.0);
    assert_eq!(row.codes, vec![0; 7]);
    assert_eq!(row.min_log_prob, -(7.0f64.ln() as f32));
    assert!(row.decode().iter().all(|&v| v == row.min_log_prob));
    assert_eq!(encode_row(&[]), BaseRow::default());
}

/// Writes a file of `n_chunk` chunks from random logits; returns the logits row by row.
fn write_random(path: &Path, n_ctx: u32, n_vocab: u32, n_chunk: u32, seed: u64) -> Vec<Vec<f32>> {
    let mut rng = Rng(seed);
    let tokens: Vec<i32> = (0..n_ctx * n_chunk)
        .map(|_| (rng.next_u64() % u64::from(n_vocab)) as i32)
        .collect();
    let mut w = BaseFileWriter::create(path, n_ctx, n_vocab, &tokens).unwrap();
    let rows = u64::from(n_chunk) * u64::from(n_ctx - 1 - n_ctx / 2);
    let all: Vec<Vec<f32>> = (0..rows).map(|_| rng.logits(n_vocab as usize)).collect();
    for l in &all {
        w.write_row_logits(l).unwrap();
    }
    assert_eq!(w.rows_written(), rows);
    w.finish().unwrap();
    all
}

#[test]
fn written_file_reopens_and_compares_to_itself_as_zero() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ref.kld");
    // Odd vocabulary (a padding code per row); 8-token windows score 3 rows; 40 chunks = 120.
    let logits = write_random(&path, 8, 37, 40, 7);
    let f = BaseFile::open(&path).unwrap();
    assert_eq!(
        (f.n_ctx, f.n_vocab, f.n_chunk, f.n_rows()),
        (8, 37, 40, 120)
    );
    let expected_len = 20 + 4 * 40 * 8 + 2 * 120 * (2 * 19 + 4);
    assert_eq!(std::fs::metadata(&path).unwrap().len(), expected_len);
    let mut reader = f.reader().unwrap();
    let mut row = BaseRow::default();
    for l in &logits {
        assert!(reader.next_row(&mut row).unwrap());
        assert_eq!(row, encode_row(l));
    }
    assert!(!reader.next_row(&mut row).unwrap());

    let s = compare_base_files(&f, &f).unwrap();
    assert_eq!(s.n, 120);
    assert_eq!(s.kld_mean, (0.0, 0.0));
    for v in [
        s.kld_max,
        s.kld_p99,
        s.kld_median,
        s.kld_min,
        s.dp_max,
        s.dp_min,
    ] {
        assert_eq!(v, 0.0);
    }
    assert_eq!(s.same_top, (1.0, 0.0));
    assert_eq!(s.dp_mean, (0.0, 0.0));
    assert_eq!(s.ppl_q, s.ppl_base);
    assert_eq!(s.ln_ratio.0, 0.0);
    // Only the temporary file's rename is left: nothing else in the directory.
    let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
    assert_eq!(names.len(), 1);
}

#[test]
fn flat_rows_survive_a_file_round_trip() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("flat.kld");
    let tokens = vec![1; 4 * 3];
    let mut w = BaseFileWriter::create(&path, 4, 3, &tokens).unwrap();
    for _ in 0..3 {
        w.write_row_logits(&[0.0, 0.0, 0.0]).unwrap();
    }
    w.finish().unwrap();
    let f = BaseFile::open(&path).unwrap();
    let mut r = f.reader().unwrap();
    let mut row = BaseRow::default();
    while r.next_row(&mut row).unwrap() {
        assert_eq!(row.scale, 0.0);
        assert_eq!(row.codes, vec![0, 0, 0]);
        assert_eq!(row_kld(&row, &[0.0, 0.0, 0.0]), 0.0);
    }
}

#[test]
fn writer_refuses_bad_input_and_leaves_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("out.kld");
    let empty = |d: &Path| std::fs::read_dir(d).unwrap().count() == 0;

    let err = BaseFileWriter::create(&path, 8, 10, &[0; 12]).unwrap_err();
    assert_kind(
        err,
        "usage",
        &path,
        &["tokens: 12 tokens", "8-token chunks"],
    );
    let err = BaseFileWriter::create(&path, 8, 10, &[]).unwrap_err();
    assert_kind(err, "usage", &path, &["0 tokens"]);
    let err = BaseFileWriter::create(&path, 2, 10, &[0; 4]).unwrap_err();
    assert_kind(err, "usage", &path, &["n_ctx: 2 is outside"]);
    let err = BaseFileWriter::create(&path, 8, 0, &[0; 8]).unwrap_err();
    assert_kind(err, "unsupported", &path, &["n_vocab"]);
    let mut tokens = vec![0; 16];
    tokens[11] = 10;
    let err = BaseFileWriter::create(&path, 8, 10, &tokens).unwrap_err();
    assert_kind(
        err,
        "mismatch",
        &path,
        &["token 11 (chunk 1, position 3)", "token id 10"],
    );
    assert!(empty(dir.path()));

    let mut w = BaseFileWriter::create(&path, 8, 4, &[0; 8]).unwrap();
    let err = w.write_row_logits(&[0.0; 3]).unwrap_err();
    assert_kind(
        err,
        "usage",
        &path,
        &["row 0 (chunk 0, position 4): 3 logits"],
    );
    let err = w.write_row_logits(&[0.0, f32::NAN, 0.0, 0.0]).unwrap_err();
    assert_format(err, &path, &["logit 1 is NaN"]);
    let err = w
        .write_row_logits(&[0.0, 0.0, f32::INFINITY, 0.0])
        .unwrap_err();
    assert_format(err, &path, &["logit 2 is inf"]);
    let err = w.write_row_logits(&[f32::NEG_INFINITY; 4]).unwrap_err();
    assert_format(err, &path, &["every logit is -inf"]);
    // A masked token (-inf) is fine.
    w.write_row_logits(&[0.0, f32::NEG_INFINITY, 1.0, 2.0])
        .unwrap();
    let err = w.finish().unwrap_err();
    assert_kind(err, "usage", &path, &["1 of 3 rows written"]);
    assert!(empty(dir.path()), "an unfinished file is removed");

    let mut w = BaseFileWriter::create(&path, 8, 4, &[0; 8]).unwrap();
    for _ in 0..3 {
        w.write_row_logits(&[0.0, 1.0, 2.0, 3.0]).unwrap();
    }
    let err = w.write_row_logits(&[0.0; 4]).unwrap_err();
    assert_kind(err, "usage", &path, &["all 3 rows are already written"]);
    drop(w);
    assert!(empty(dir.path()), "a dropped writer leaves nothing");
}

// ---------------------------------------------------------------------------------------------
// Refusing bad files. Each error names the file and the row, token or field.

fn ref_bytes() -> Vec<u8> {
    std::fs::read(fixture("ref.kld")).unwrap()
}

fn open_bytes(bytes: &[u8]) -> (tempfile::TempDir, PathBuf, crate::Result<BaseFile>) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.kld");
    std::fs::write(&path, bytes).unwrap();
    let r = BaseFile::open(&path);
    (dir, path, r)
}

/// Reads every row; the first error.
fn read_all(f: &BaseFile) -> crate::Result<u64> {
    let mut r = f.reader()?;
    let mut row = BaseRow::default();
    let mut n = 0;
    while r.next_row(&mut row)? {
        n += 1;
    }
    Ok(n)
}

const ROW_BYTES: usize = 2 * (512 + 4);
const DATA_OFFSET: usize = 20 + 4 * 39 * 128;

#[test]
fn truncated_files_name_where_they_end() {
    let bytes = ref_bytes();
    let cut = DATA_OFFSET + 100 * ROW_BYTES + 17;
    let (_d, path, r) = open_bytes(&bytes[..cut]);
    assert_format(
        r.unwrap_err(),
        &path,
        &[
            "row 100 (chunk 1, position 101)",
            "truncated",
            "expected 2555612 bytes",
            &format!("found {cut}"),
            "ends inside this row",
        ],
    );
    let (_d, path, r) = open_bytes(&bytes[..DATA_OFFSET + 63 * ROW_BYTES]);
    assert_format(
        r.unwrap_err(),
        &path,
        &["row 63 (chunk 1, position 64)", "ends before"],
    );
    let (_d, path, r) = open_bytes(&bytes[..20 + 4 * 130 + 2]);
    assert_format(
        r.unwrap_err(),
        &path,
        &["token 130 (chunk 1, position 2)", "inside the token ids"],
    );
    let (_d, path, r) = open_bytes(&bytes[..19]);
    assert_format(r.unwrap_err(), &path, &["19 bytes", "20-byte header"]);
    let (_d, path, r) = open_bytes(&bytes[..5]);
    assert_format(r.unwrap_err(), &path, &["20-byte header"]);
    let (_d, path, r) = open_bytes(&[]);
    assert_format(r.unwrap_err(), &path, &["empty"]);
}

#[test]
fn wrong_magic_and_extra_bytes_are_refused() {
    let mut bytes = ref_bytes();
    bytes[0] = b'X';
    let (_d, path, r) = open_bytes(&bytes);
    assert_format(
        r.unwrap_err(),
        &path,
        &["not a llama.cpp KLD base file", "Xlogits_"],
    );
    let (_d, path, r) = open_bytes(b"GGUF\x03\x00\x00\x00");
    assert_format(r.unwrap_err(), &path, &["not a llama.cpp KLD base file"]);

    let mut bytes = ref_bytes();
    bytes.extend_from_slice(&[0; 3]);
    let (_d, path, r) = open_bytes(&bytes);
    assert_format(
        r.unwrap_err(),
        &path,
        &[
            "size mismatch",
            "expected 2555612",
            "found 2555615",
            "3 bytes after the last row",
        ],
    );
}

#[test]
fn header_fields_must_be_positive_and_sane() {
    for (at, v, needle) in [
        (8, 0i32, "n_ctx: 0 is not positive"),
        (8, -128, "n_ctx: -128 is not positive"),
        (8, 2, "n_ctx: 2 leaves no scored position"),
        (12, 0, "n_vocab: 0 is not positive"),
        (12, -1, "n_vocab: -1 is not positive"),
        (16, 0, "n_chunk: 0 is not positive"),
    ] {
        let mut bytes = ref_bytes();
        bytes[at..at + 4].copy_from_slice(&v.to_le_bytes());
        let (_d, path, r) = open_bytes(&bytes);
        assert_format(r.unwrap_err(), &path, &[needle]);
    }
    // Sizes past u64: refused before anything is allocated.
    let mut bytes = ref_bytes();
    for at in [8, 12, 16] {
        bytes[at..at + 4].copy_from_slice(&i32::MAX.to_le_bytes());
    }
    let (_d, path, r) = open_bytes(&bytes[..64]);
    assert_format(r.unwrap_err(), &path, &["past 2^64"]);
    // A header promising more than the file: a size mismatch, not an allocation.
    let mut bytes = ref_bytes();
    bytes[16..20].copy_from_slice(&1_000_000i32.to_le_bytes());
    let (_d, path, r) = open_bytes(&bytes);
    assert_format(r.unwrap_err(), &path, &["truncated", "n_chunk 1000000"]);
}

/// Regression (#14): a sparse file of exactly the size its header implies passed every check
/// with `n_vocab` 2^30, and reading its one row allocated gigabytes per buffer.
#[test]
fn a_vocabulary_over_the_cap_is_refused_before_any_row_buffer() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sparse.kld");
    let n_vocab: u32 = 1 << 30;
    let mut head = Vec::new();
    head.extend_from_slice(b"_logits_");
    for v in [3u32, n_vocab, 1] {
        head.extend_from_slice(&v.to_le_bytes());
    }
    head.extend_from_slice(&[0u8; 12]);
    std::fs::write(&path, &head).unwrap();
    // One row of 2·(n_vocab + 4) bytes, sparse on disk.
    let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    file.set_len(head.len() as u64 + 2 * (u64::from(n_vocab) + 4))
        .unwrap();
    drop(file);
    let err = BaseFile::open(&path).unwrap_err();
    assert_kind(
        err,
        "unsupported",
        &path,
        &["n_vocab", "1073741824", "limit"],
    );
    let err = BaseFileWriter::create(&path, 3, n_vocab, &[0; 3]).unwrap_err();
    assert_kind(err, "unsupported", &path, &["n_vocab"]);
}

#[test]
fn tokens_outside_the_vocabulary_are_named() {
    for (v, needle) in [(512i32, "token id 512"), (-1, "token id -1")] {
        let mut bytes = ref_bytes();
        let at = 20 + 4 * 133;
        bytes[at..at + 4].copy_from_slice(&v.to_le_bytes());
        let (_d, path, r) = open_bytes(&bytes);
        assert_format(
            r.unwrap_err(),
            &path,
            &["token 133 (chunk 1, position 5)", needle, "0..512"],
        );
    }
}

#[test]
fn non_finite_scale_or_minimum_names_the_row() {
    for (offset, v, needle) in [
        (0, f32::NAN, "scale is NaN"),
        (0, f32::INFINITY, "scale is inf"),
        (4, f32::NEG_INFINITY, "min_log_prob is -inf"),
    ] {
        let mut bytes = ref_bytes();
        let at = DATA_OFFSET + 70 * ROW_BYTES + offset;
        bytes[at..at + 4].copy_from_slice(&v.to_le_bytes());
        let (_d, path, r) = open_bytes(&bytes);
        let f = r.unwrap();
        assert_format(
            read_all(&f).unwrap_err(),
            &path,
            &["row 70 (chunk 1, position 71)", needle],
        );
    }
}

#[test]
fn a_file_changed_after_open_is_refused() {
    let (_d, path, r) = open_bytes(&ref_bytes());
    let f = r.unwrap();
    std::fs::write(&path, &ref_bytes()[..1000]).unwrap();
    assert_format(
        f.reader().unwrap_err(),
        &path,
        &["changed since it was opened"],
    );
}

#[test]
fn crafted_minimal_file_reads() {
    // n_ctx 3: one scored row per chunk (position 1 scores token 2).
    let rows = vec![
        BaseRow {
            scale: 0.001,
            min_log_prob: -17.0,
            codes: vec![65535, 0, 5],
        };
        2
    ];
    let bytes = raw_file(3, 3, 2, &[0, 1, 2, 2, 1, 0], &rows);
    let (_d, _path, r) = open_bytes(&bytes);
    let f = r.unwrap();
    assert_eq!(f.n_rows(), 2);
    assert_eq!(f.row_position(1), (1, 1));
    assert_eq!(f.next_token(0), 2);
    assert_eq!(f.next_token(1), 0);
    assert_eq!(read_all(&f).unwrap(), 2);
}

/// llama-perplexity's log line for a too-short text is often lost at exit (its log thread dies
/// with it); the stream that ends after magic and n_ctx still names the reason.
#[test]
fn a_stream_ending_after_its_header_names_the_too_short_text() {
    let mut bytes = MAGIC.to_vec();
    bytes.extend_from_slice(&512i32.to_le_bytes());
    let e = BaseStream::open(Path::new("ref.pipe"), &bytes[..])
        .err()
        .expect("a stream of 12 bytes is refused");
    let m = e.to_string();
    assert!(m.contains("ref.pipe"), "{m}");
    assert!(
        m.contains("you need at least 1024 tokens with a context of 512"),
        "{m}"
    );
    // Any other short stream is still plainly not a base stream.
    let e = BaseStream::open(Path::new("ref.pipe"), &bytes[..10])
        .err()
        .unwrap();
    assert!(e.to_string().contains("10 bytes before it ended"), "{e}");
}
