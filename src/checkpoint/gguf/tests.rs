use std::path::Path;

use super::*;

const REF_F32: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/fixtures/llamacpp/ref-f32.gguf"
);
const CAND_Q5_0: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/fixtures/llamacpp/cand-q5_0.gguf"
);
const CAND_Q6_K: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/fixtures/llamacpp/cand-q6_k.gguf"
);

fn parse_all(bytes: &[u8]) -> Result<GgufFile> {
    parse(Path::new("t.gguf"), bytes, bytes.len() as u64)
}

/// The error message for `bytes`, asserting it names `subject` (if any) and each of `needles`.
#[track_caller]
fn rejected(bytes: &[u8], subject: Option<&str>, needles: &[&str]) -> String {
    let err = parse_all(bytes).expect_err("should be rejected");
    let msg = err.to_string();
    match &err.kind {
        crate::ErrorKind::Format { subject: s, .. } => {
            assert_eq!(s.as_deref(), subject, "{msg}")
        }
        other => panic!("not a Format error: {other:?}"),
    }
    for needle in needles {
        assert!(msg.contains(needle), "`{msg}` lacks `{needle}`");
    }
    msg
}

// ---------------------------------------------------------------------------------------------
// A raw writer for files `serialize` cannot express (bad ids, counts, versions).

struct Kv<'a> {
    key: &'a [u8],
    ty: u32,
    payload: Vec<u8>,
}

fn kv_u32(key: &str, v: u32) -> Kv<'_> {
    Kv {
        key: key.as_bytes(),
        ty: 4,
        payload: v.to_le_bytes().to_vec(),
    }
}

fn kv_str<'a>(key: &'a str, v: &str) -> Kv<'a> {
    let mut payload = (v.len() as u64).to_le_bytes().to_vec();
    payload.extend_from_slice(v.as_bytes());
    Kv {
        key: key.as_bytes(),
        ty: 8,
        payload,
    }
}

struct Info<'a> {
    name: &'a [u8],
    dims: &'a [u64],
    ty: u32,
    offset: u64,
}

fn info<'a>(name: &'a str, dims: &'a [u64], ty: u32, offset: u64) -> Info<'a> {
    Info {
        name: name.as_bytes(),
        dims,
        ty,
        offset,
    }
}

/// Header with `version`, the KVs and tensor infos, padding to 32, then `data_len` zero bytes.
fn raw(version: u32, kvs: &[Kv<'_>], infos: &[Info<'_>], data_len: usize) -> Vec<u8> {
    let mut b = b"GGUF".to_vec();
    b.extend_from_slice(&version.to_le_bytes());
    b.extend_from_slice(&(infos.len() as u64).to_le_bytes());
    b.extend_from_slice(&(kvs.len() as u64).to_le_bytes());
    for kv in kvs {
        b.extend_from_slice(&(kv.key.len() as u64).to_le_bytes());
        b.extend_from_slice(kv.key);
        b.extend_from_slice(&kv.ty.to_le_bytes());
        b.extend_from_slice(&kv.payload);
    }
    for t in infos {
        b.extend_from_slice(&(t.name.len() as u64).to_le_bytes());
        b.extend_from_slice(t.name);
        b.extend_from_slice(&(t.dims.len() as u32).to_le_bytes());
        for d in t.dims {
            b.extend_from_slice(&d.to_le_bytes());
        }
        b.extend_from_slice(&t.ty.to_le_bytes());
        b.extend_from_slice(&t.offset.to_le_bytes());
    }
    b.resize(b.len().div_ceil(32) * 32 + data_len, 0);
    b
}

fn arch() -> Kv<'static> {
    kv_str("general.architecture", "llama")
}

/// One F32 tensor of 8 elements (32 bytes) at `offset`.
fn one_tensor_at(offset: u64, data_len: usize) -> Vec<u8> {
    raw(3, &[arch()], &[info("a", &[8], 0, offset)], data_len)
}

// ---------------------------------------------------------------------------------------------
// Real llama.cpp files.

/// Data section start plus every tensor padded to the alignment must be the file, exactly.
#[track_caller]
fn assert_exact_accounting(f: &GgufFile) {
    let mut tensors: Vec<_> = f.tensors.iter().collect();
    tensors.sort_by_key(|t| t.offset);
    let mut at = f.data_offset;
    for t in &tensors {
        assert_eq!(t.offset, at, "{} is not packed", t.name);
        assert_eq!(t.n_bytes, t.numel() / t.ty.block_size() * t.ty.type_size());
        at = (t.offset + t.n_bytes).div_ceil(f.alignment) * f.alignment;
    }
    assert_eq!(at, f.file_size);
}

fn count_types(f: &GgufFile) -> Vec<(GgmlType, usize)> {
    let mut counts: Vec<(GgmlType, usize)> = Vec::new();
    for t in &f.tensors {
        match counts.iter_mut().find(|(ty, _)| *ty == t.ty) {
            Some((_, n)) => *n += 1,
            None => counts.push((t.ty, 1)),
        }
    }
    counts.sort();
    counts
}

#[test]
fn reads_llamacpp_f32_reference() {
    let f = read_file(Path::new(REF_F32)).unwrap();
    assert_eq!(f.version, 3);
    assert_eq!(f.architecture(), Some("llama"));
    assert_eq!(f.file_size, 11_557_728);
    assert_eq!(f.alignment, 32);
    assert_eq!(f.metadata.len(), 22);
    assert_eq!(f.data_offset, 14_176); // header ends at 14,146
    assert_eq!(f.tensors.len(), 39);
    assert_eq!(count_types(&f), [(GgmlType::F32, 39)]);
    assert_eq!(
        f.get("general.file_type").and_then(GgufValue::as_u64),
        Some(0)
    );
    assert_eq!(
        f.get("llama.block_count").and_then(GgufValue::as_u64),
        Some(4)
    );
    let GgufValue::Array(tokens) = f.get("tokenizer.ggml.tokens").unwrap() else {
        panic!()
    };
    assert_eq!((tokens.elem_type, tokens.values.len()), (8, 512));
    assert_eq!(tokens.values[1].as_str(), Some("<s>"));
    let out = f.tensor("output.weight").unwrap();
    assert_eq!(out.dims, [256, 512]);
    assert_eq!((out.offset, out.n_bytes), (14_176 + 11_019_264, 524_288));
    assert_eq!(f.tensor("token_embd.weight").unwrap().offset, f.data_offset);
    assert_eq!(f.split(), None);
    assert_exact_accounting(&f);
}

#[test]
fn reads_llamacpp_q5_0_candidate() {
    let f = read_file(Path::new(CAND_Q5_0)).unwrap();
    assert_eq!((f.version, f.architecture()), (3, Some("llama")));
    assert_eq!(
        (f.file_size, f.data_offset, f.tensors.len()),
        (2_023_296, 14_208, 39)
    );
    assert_eq!(
        f.get("general.file_type").and_then(GgufValue::as_u64),
        Some(8)
    ); // MOSTLY_Q5_0
    assert_eq!(
        f.get("general.quantization_version")
            .and_then(GgufValue::as_u64),
        Some(2)
    );
    // llama-quantize keeps the output matrix at Q6_K and the 1-D norms at F32.
    assert_eq!(f.tensor("output.weight").unwrap().ty, GgmlType::Q6_K);
    assert_eq!(f.tensor("token_embd.weight").unwrap().ty, GgmlType::Q5_0);
    assert_eq!(
        f.tensor("blk.2.ffn_down.weight").unwrap().ty,
        GgmlType::Q5_0
    );
    assert_eq!(f.tensor("output_norm.weight").unwrap().ty, GgmlType::F32);
    for t in &f.tensors {
        let want = match t.name.as_str() {
            "output.weight" => GgmlType::Q6_K,
            n if n.ends_with("_norm.weight") => GgmlType::F32,
            _ => GgmlType::Q5_0,
        };
        assert_eq!(t.ty, want, "{}", t.name);
    }
    assert_eq!(
        count_types(&f),
        [
            (GgmlType::F32, 9),
            (GgmlType::Q5_0, 29),
            (GgmlType::Q6_K, 1)
        ]
    );
    let embd = f.tensor("token_embd.weight").unwrap();
    assert_eq!(embd.n_bytes, 256 * 512 / 32 * 22);
    assert_exact_accounting(&f);
}

#[test]
fn reads_llamacpp_q6_k_candidate() {
    let f = read_file(Path::new(CAND_Q6_K)).unwrap();
    assert_eq!((f.version, f.architecture()), (3, Some("llama")));
    assert_eq!(
        (f.file_size, f.data_offset, f.tensors.len()),
        (2_388_864, 14_208, 39)
    );
    assert_eq!(
        f.get("general.file_type").and_then(GgufValue::as_u64),
        Some(18)
    ); // MOSTLY_Q6_K
    for t in &f.tensors {
        let want = if t.dims.len() == 1 {
            GgmlType::F32
        } else {
            GgmlType::Q6_K
        };
        assert_eq!(t.ty, want, "{}", t.name);
    }
    assert_eq!(count_types(&f), [(GgmlType::F32, 9), (GgmlType::Q6_K, 30)]);
    assert_eq!(
        f.tensor("blk.0.ffn_down.weight").unwrap().n_bytes,
        512 * 256 / 256 * 210
    );
    assert_exact_accounting(&f);
}

// ---------------------------------------------------------------------------------------------
// Types.

#[test]
fn bits_per_weight_is_exact_for_every_type() {
    use GgmlType::*;
    let want: [(GgmlType, u64, u64, f64); 35] = [
        (F32, 1, 4, 32.0),
        (F16, 1, 2, 16.0),
        (Q4_0, 32, 18, 4.5),
        (Q4_1, 32, 20, 5.0),
        (Q5_0, 32, 22, 5.5),
        (Q5_1, 32, 24, 6.0),
        (Q8_0, 32, 34, 8.5),
        (Q8_1, 32, 36, 9.0),
        (Q2_K, 256, 84, 2.625),
        (Q3_K, 256, 110, 3.4375),
        (Q4_K, 256, 144, 4.5),
        (Q5_K, 256, 176, 5.5),
        (Q6_K, 256, 210, 6.5625),
        (Q8_K, 256, 292, 9.125),
        (IQ2_XXS, 256, 66, 2.0625),
        (IQ2_XS, 256, 74, 2.3125),
        (IQ3_XXS, 256, 98, 3.0625),
        (IQ1_S, 256, 50, 1.5625),
        (IQ4_NL, 32, 18, 4.5),
        (IQ3_S, 256, 110, 3.4375),
        (IQ2_S, 256, 82, 2.5625),
        (IQ4_XS, 256, 136, 4.25),
        (I8, 1, 1, 8.0),
        (I16, 1, 2, 16.0),
        (I32, 1, 4, 32.0),
        (I64, 1, 8, 64.0),
        (F64, 1, 8, 64.0),
        (IQ1_M, 256, 56, 1.75),
        (BF16, 1, 2, 16.0),
        (TQ1_0, 256, 54, 1.6875),
        (TQ2_0, 256, 66, 2.0625),
        (MXFP4, 32, 17, 4.25),
        (NVFP4, 64, 36, 4.5),
        (Q1_0, 128, 18, 1.125),
        (Q2_0, 64, 18, 2.25),
    ];
    for (ty, block, size, bpw) in want {
        assert_eq!(
            (ty.block_size(), ty.type_size(), ty.bits_per_weight()),
            (block, size, bpw),
            "{ty}"
        );
    }
    assert_eq!(want.map(|w| w.0), GgmlType::ALL);
}

#[test]
fn type_ids_names_and_quantized_flags() {
    for (i, ty) in GgmlType::ALL.into_iter().enumerate() {
        assert_eq!(GgmlType::from_id(ty.id()), Some(ty));
        assert_eq!(ty.name(), ty.name().to_lowercase());
        assert!(
            GgmlType::ALL[..i]
                .iter()
                .all(|t| t.name() != ty.name() && t.id() < ty.id())
        );
    }
    for id in [4, 5, 31, 32, 33, 36, 37, 38, 43, 99, u32::MAX] {
        assert_eq!(GgmlType::from_id(id), None, "{id}");
    }
    assert_eq!(
        (GgmlType::Q4_K.name(), GgmlType::IQ4_XS.name()),
        ("q4_k", "iq4_xs")
    );
    assert_eq!(
        (
            GgmlType::MXFP4.id(),
            GgmlType::NVFP4.id(),
            GgmlType::Q2_0.id()
        ),
        (39, 40, 42)
    );
    let plain: Vec<_> = GgmlType::ALL
        .into_iter()
        .filter(|t| !t.is_quantized())
        .collect();
    use GgmlType::*;
    assert_eq!(plain, [F32, F16, I8, I16, I32, I64, F64, BF16]);
}

// ---------------------------------------------------------------------------------------------
// Round trip.

fn every_value() -> Vec<(&'static str, GgufValue)> {
    use GgufValue::*;
    let arr = |elem_type, values| Array(GgufArray { elem_type, values });
    vec![
        ("general.architecture", String("llama".into())),
        ("t.u8", U8(200)),
        ("t.i8", I8(-100)),
        ("t.u16", U16(60_000)),
        ("t.i16", I16(-30_000)),
        ("t.u32", U32(4_000_000_000)),
        ("t.i32", I32(-2_000_000_000)),
        ("t.f32", F32(1e-5)),
        ("t.bool", Bool(true)),
        ("t.string", String("héllo\n{{ chat }}".into())),
        ("t.u64", U64(u64::MAX)),
        ("t.i64", I64(i64::MIN)),
        ("t.f64", F64(-2.5e300)),
        ("t.empty", String(std::string::String::new())),
        ("a.u8", arr(0, vec![U8(0), U8(255)])),
        ("a.i8", arr(1, vec![I8(-1)])),
        ("a.u16", arr(2, vec![U16(1), U16(2)])),
        ("a.i16", arr(3, vec![I16(-2)])),
        ("a.u32", arr(4, vec![U32(7)])),
        ("a.i32", arr(5, vec![I32(1), I32(-1), I32(3)])),
        ("a.f32", arr(6, vec![F32(0.5), F32(-0.0)])),
        ("a.bool", arr(7, vec![Bool(false), Bool(true)])),
        (
            "a.string",
            arr(
                8,
                vec![String("<s>".into()), String(std::string::String::new())],
            ),
        ),
        ("a.u64", arr(10, vec![U64(1 << 40)])),
        ("a.i64", arr(11, vec![I64(-(1 << 40))])),
        ("a.f64", arr(12, vec![F64(0.1)])),
        ("a.none", arr(4, vec![])),
        ("split.no", U16(1)),
        ("split.count", U16(3)),
    ]
}

#[test]
fn serialize_then_parse_round_trips() {
    let metadata = every_value();
    let q8 = vec![7u8; 2 * 34];
    let q4k = vec![9u8; 144];
    let f32s = vec![1u8; 3 * 4];
    let tensors: [(&str, GgmlType, &[u64], &[u8]); 4] = [
        ("blk.0.attn_q.weight", GgmlType::Q8_0, &[32, 2], &q8),
        ("blk.0.ffn_up.weight", GgmlType::Q4_K, &[256, 1, 1, 1], &q4k),
        ("norm", GgmlType::F32, &[3], &f32s),
        ("empty", GgmlType::F16, &[0, 5], &[]),
    ];
    for alignment in [32, 64, 8] {
        let bytes = serialize(&metadata, &tensors, alignment);
        assert_eq!(bytes.len() as u64 % alignment, 0);
        let f = parse_all(&bytes).unwrap();
        assert_eq!(f.version, 3);
        assert_eq!(f.alignment, alignment);
        let mut want: Vec<(String, GgufValue)> = metadata
            .iter()
            .map(|(k, v)| (k.to_string(), v.clone()))
            .collect();
        if alignment != 32 {
            want.push(("general.alignment".into(), GgufValue::U32(alignment as u32)));
        }
        assert_eq!(f.metadata, want);
        assert_eq!(f.split(), Some((1, 3)));
        assert_eq!(f.tensors.len(), tensors.len());
        for (t, (name, ty, dims, data)) in f.tensors.iter().zip(&tensors) {
            assert_eq!(
                (t.name.as_str(), t.ty, t.dims.as_slice()),
                (*name, *ty, *dims)
            );
            assert_eq!(t.n_bytes, data.len() as u64);
            assert_eq!(t.offset % alignment, 0);
            let at = t.offset as usize;
            assert_eq!(&bytes[at..at + data.len()], *data, "{name}");
        }
        assert_eq!(f.tensor("empty").unwrap().numel(), 0);
    }
}

#[test]
fn read_file_maps_a_serialized_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.gguf");
    let data = [0u8; 64];
    std::fs::write(
        &path,
        serialize(&[], &[("x", GgmlType::BF16, &[32], &data)], 32),
    )
    .unwrap();
    let f = read_file(&path).unwrap();
    assert_eq!((f.path.as_path(), f.architecture()), (path.as_path(), None));
    assert_eq!(f.tensor("x").unwrap().n_bytes, 64);
    let missing = read_file(&dir.path().join("none.gguf")).unwrap_err();
    assert!(matches!(missing.kind, crate::ErrorKind::NotFound));
}

#[test]
fn files_without_tensors_and_version_2_are_fine() {
    let bytes = raw(2, &[arch()], &[], 0);
    let f = parse_all(&bytes).unwrap();
    assert_eq!(
        (f.version, f.tensors.len(), f.data_offset),
        (2, 0, bytes.len() as u64)
    );
    // Not padded: the empty data section is clamped to the end.
    let mut short = bytes.clone();
    short.truncate(24 + 8 + 20 + 4 + 8 + 5);
    assert_eq!(parse_all(&short).unwrap().data_offset, short.len() as u64);
}

#[test]
fn values_convert_to_json_and_integers() {
    use GgufValue::*;
    let json: Vec<_> = every_value().iter().map(|(_, v)| v.to_json()).collect();
    assert_eq!(json[7], serde_json::json!(1e-5)); // the f32's shortest decimal
    assert_eq!(json[10], serde_json::json!(u64::MAX));
    assert_eq!(json[11], serde_json::json!(i64::MIN));
    assert_eq!(json[22], serde_json::json!(["<s>", ""]));
    assert_eq!(F32(f32::NAN).to_json(), serde_json::json!("nan"));
    assert_eq!(F64(f64::NEG_INFINITY).to_json(), serde_json::json!("-inf"));
    assert_eq!(Bool(true).to_json(), serde_json::json!(true));
    assert_eq!(I8(-1).as_u64(), None);
    assert_eq!(I64(5).as_u64(), Some(5));
    assert_eq!(U16(9).as_u64(), Some(9));
    assert_eq!(F32(1.0).as_u64(), None);
    assert_eq!(String("x".into()).as_str(), Some("x"));
    assert_eq!(U8(1).as_str(), None);
}

#[test]
fn prefix_reads_say_how_many_bytes_they_need() {
    let bytes = std::fs::read(CAND_Q5_0).unwrap();
    let path = Path::new("remote.gguf");
    let size = bytes.len() as u64;
    let mut have = 16usize;
    let mut rounds = 0;
    let f = loop {
        match parse_header(path, &bytes[..have], size) {
            Ok(f) => break f,
            Err(ParseError::NeedMore(n)) => {
                assert!(n > have as u64 && n <= size, "need {n} with {have}");
                have = (n as usize).max(have * 2).min(bytes.len());
            }
            Err(ParseError::Malformed(e)) => panic!("{e}"),
        }
        rounds += 1;
    };
    assert!(rounds > 3 && have < 20_000, "{rounds} rounds, {have} bytes");
    assert_eq!(f.tensors, read_file(Path::new(CAND_Q5_0)).unwrap().tensors);
}

// ---------------------------------------------------------------------------------------------
// Malicious corpus: each is refused with a message naming the rule and the key or tensor.

#[test]
fn rejects_bad_magic() {
    let mut bytes = one_tensor_at(0, 32);
    bytes[..4].copy_from_slice(b"GGML");
    rejected(&bytes, None, &["not a GGUF file", "47 47 4d 4c"]);
    rejected(b"GG", None, &["past the end of the file (2 bytes)"]);
    rejected(b"", None, &["past the end of the file (0 bytes)"]);
}

#[test]
fn rejects_version_1_and_unknown_versions() {
    rejected(
        &raw(1, &[arch()], &[], 0),
        None,
        &["GGUF v1 is not supported"],
    );
    rejected(
        &raw(4, &[arch()], &[], 0),
        None,
        &["unsupported GGUF version 4"],
    );
    rejected(
        &raw(0, &[arch()], &[], 0),
        None,
        &["unsupported GGUF version 0"],
    );
}

#[test]
fn rejects_big_endian() {
    let mut bytes = one_tensor_at(0, 32);
    bytes[4..8].copy_from_slice(&[0, 0, 0, 3]);
    rejected(
        &bytes,
        None,
        &["big-endian GGUF is not supported", "0x03000000"],
    );
}

#[test]
fn rejects_huge_tensor_count() {
    let mut bytes = one_tensor_at(0, 32);
    bytes[8..16].copy_from_slice(&(u64::MAX / 2).to_le_bytes());
    rejected(
        &bytes,
        None,
        &["tensor_count 9223372036854775807 cannot fit"],
    );
    bytes[8..16].copy_from_slice(&(1u64 << 40).to_le_bytes());
    rejected(&bytes, None, &["tensor_count 1099511627776 cannot fit"]);
}

#[test]
fn rejects_huge_kv_count() {
    let mut bytes = one_tensor_at(0, 32);
    bytes[16..24].copy_from_slice(&u64::MAX.to_le_bytes());
    rejected(
        &bytes,
        None,
        &["metadata_kv_count 18446744073709551615 cannot fit"],
    );
    bytes[16..24].copy_from_slice(&10u64.to_le_bytes());
    rejected(&bytes, None, &["metadata_kv_count 10 cannot fit"]);
}

#[test]
fn rejects_huge_string_lengths() {
    // A key length of u64::MAX.
    let mut bytes = raw(3, &[arch()], &[], 64);
    bytes[24..32].copy_from_slice(&u64::MAX.to_le_bytes());
    rejected(
        &bytes,
        Some("metadata pair #0"),
        &["key length 18446744073709551615 is over"],
    );
    // A value over the 16 MiB cap, and one under it that runs past the file.
    let mut over = raw(3, &[kv_str("general.name", "x")], &[], 64);
    let at = 24 + 8 + 12 + 4;
    over[at..at + 8].copy_from_slice(&(1u64 << 30).to_le_bytes());
    rejected(
        &over,
        Some("key `general.name`"),
        &["string length 1073741824 is over the 16777216"],
    );
    over[at..at + 8].copy_from_slice(&(1u64 << 20).to_le_bytes());
    rejected(
        &over,
        Some("key `general.name`"),
        &["1048576 bytes at offset 56 run past the end"],
    );
}

#[test]
fn rejects_huge_array_count() {
    let mut payload = 4u32.to_le_bytes().to_vec();
    payload.extend_from_slice(&(u64::MAX / 4 + 1).to_le_bytes());
    let bytes = raw(
        3,
        &[Kv {
            key: b"a",
            ty: 9,
            payload,
        }],
        &[],
        64,
    );
    rejected(
        &bytes,
        Some("key `a`"),
        &["array of 4611686018427387904 elements cannot fit"],
    );
}

#[test]
fn rejects_nested_arrays() {
    let mut payload = 9u32.to_le_bytes().to_vec();
    payload.extend_from_slice(&1u64.to_le_bytes());
    payload.extend_from_slice(&4u32.to_le_bytes());
    payload.extend_from_slice(&0u64.to_le_bytes());
    let bytes = raw(
        3,
        &[Kv {
            key: b"n",
            ty: 9,
            payload,
        }],
        &[],
        0,
    );
    rejected(
        &bytes,
        Some("key `n`"),
        &["nested arrays are not supported"],
    );
}

#[test]
fn rejects_unknown_value_types() {
    let bytes = raw(
        3,
        &[Kv {
            key: b"k",
            ty: 13,
            payload: vec![0; 8],
        }],
        &[],
        0,
    );
    rejected(
        &bytes,
        Some("key `k`"),
        &["value type id 13 is not a GGUF value type"],
    );
    let mut payload = 13u32.to_le_bytes().to_vec();
    payload.extend_from_slice(&0u64.to_le_bytes());
    let bytes = raw(
        3,
        &[Kv {
            key: b"k",
            ty: 9,
            payload,
        }],
        &[],
        0,
    );
    rejected(
        &bytes,
        Some("key `k`"),
        &["array element type id 13 is not a GGUF value type"],
    );
}

#[test]
fn rejects_bad_bools_and_keys() {
    rejected(
        &raw(
            3,
            &[Kv {
                key: b"b",
                ty: 7,
                payload: vec![2],
            }],
            &[],
            0,
        ),
        Some("key `b`"),
        &["bool byte is 2"],
    );
    rejected(
        &raw(3, &[kv_u32("", 1)], &[], 0),
        Some("metadata pair #0"),
        &["empty metadata key"],
    );
    let bad = Kv {
        key: b"\xff",
        ty: 4,
        payload: vec![0; 4],
    };
    rejected(
        &raw(3, &[bad], &[], 0),
        Some("metadata pair #0"),
        &["key `\\xff` is not UTF-8"],
    );
}

#[test]
fn rejects_removed_type_ids() {
    let bytes = raw(
        3,
        &[arch()],
        &[info("blk.0.attn_q.weight", &[32], 4, 0)],
        32,
    );
    let msg = rejected(&bytes, Some("tensor `blk.0.attn_q.weight`"), &[]);
    assert!(msg.ends_with("tensor `blk.0.attn_q.weight`: type id 4 (Q4_2) was removed from ggml"));
    let bytes = raw(3, &[arch()], &[info("w", &[32], 36, 0)], 32);
    rejected(
        &bytes,
        Some("tensor `w`"),
        &["type id 36 (IQ4_NL_4_4) was removed from ggml"],
    );
}

#[test]
fn rejects_unknown_type_id() {
    let bytes = raw(3, &[arch()], &[info("w", &[32], 99, 0)], 32);
    rejected(
        &bytes,
        Some("tensor `w`"),
        &["type id 99 is not a ggml type"],
    );
}

#[test]
fn rejects_n_dims_0_and_5() {
    let bytes = raw(3, &[arch()], &[info("w", &[], 0, 0)], 32);
    rejected(
        &bytes,
        Some("tensor `w`"),
        &["n_dims is 0; ggml allows 1 to 4"],
    );
    let bytes = raw(3, &[arch()], &[info("w", &[1, 1, 1, 1, 8], 0, 0)], 32);
    rejected(&bytes, Some("tensor `w`"), &["n_dims is 5"]);
}

#[test]
fn rejects_dims_overflow() {
    let bytes = raw(3, &[arch()], &[info("w", &[1 << 32, 1 << 32], 0, 0)], 32);
    rejected(&bytes, Some("tensor `w`"), &["element count overflows"]);
    let bytes = raw(3, &[arch()], &[info("w", &[1 << 63], 0, 0)], 32);
    rejected(&bytes, Some("tensor `w`"), &["element count overflows"]);
    // Fits in elements, not in bytes.
    let bytes = raw(3, &[arch()], &[info("w", &[1 << 62], 27, 0)], 32);
    rejected(&bytes, Some("tensor `w`"), &["size in bytes overflows"]);
}

#[test]
fn rejects_row_not_a_multiple_of_the_block() {
    let bytes = raw(3, &[arch()], &[info("w", &[16, 2], 2, 0)], 32);
    rejected(
        &bytes,
        Some("tensor `w`"),
        &["first dimension 16 is not a multiple of the q4_0 block size 32"],
    );
}

#[test]
fn rejects_long_tensor_names() {
    let n63 = "n".repeat(63);
    assert!(parse_all(&raw(3, &[arch()], &[info(&n63, &[8], 0, 0)], 32)).is_ok());
    for len in [64, 65] {
        let name = "n".repeat(len);
        let bytes = raw(3, &[arch()], &[info(&name, &[8], 0, 0)], 32);
        rejected(
            &bytes,
            Some("tensor #0"),
            &[&format!("name is {len} bytes; ggml allows at most 63")],
        );
    }
    let bytes = raw(
        3,
        &[arch()],
        &[Info {
            name: b"a\0b",
            dims: &[8],
            ty: 0,
            offset: 0,
        }],
        32,
    );
    rejected(&bytes, Some("tensor #0"), &["holds a NUL byte"]);
}

#[test]
fn rejects_duplicate_key() {
    let bytes = raw(
        3,
        &[
            arch(),
            kv_u32("x", 1),
            kv_str("general.architecture", "gpt2"),
        ],
        &[],
        0,
    );
    rejected(
        &bytes,
        Some("key `general.architecture`"),
        &["duplicate metadata key (first defined as pair #0)"],
    );
}

#[test]
fn rejects_duplicate_tensor() {
    let bytes = raw(
        3,
        &[arch()],
        &[info("w", &[8], 0, 0), info("w", &[8], 0, 32)],
        64,
    );
    rejected(
        &bytes,
        Some("tensor `w`"),
        &["duplicate tensor name (first at tensor #0)"],
    );
}

#[test]
fn rejects_misaligned_offset() {
    rejected(
        &one_tensor_at(4, 64),
        Some("tensor `a`"),
        &["data offset 4 is not a multiple of the alignment 32"],
    );
}

#[test]
fn rejects_offset_past_end() {
    assert!(parse_all(&one_tensor_at(32, 64)).is_ok());
    rejected(
        &one_tensor_at(64, 64),
        Some("tensor `a`"),
        &["runs past the end of the file"],
    );
    rejected(
        &one_tensor_at(u64::MAX - 31, 64),
        Some("tensor `a`"),
        &["overflows"],
    );
    // A header whose padded end is past the file.
    let mut bytes = one_tensor_at(0, 0);
    let header_len = 24 + 8 + 20 + 4 + 8 + 5 + 8 + 1 + 4 + 8 + 4 + 8;
    bytes.truncate(header_len);
    rejected(
        &bytes,
        None,
        &[
            "the data section starts at byte 128",
            "past the end of the file",
        ],
    );
}

#[test]
fn rejects_overlapping_tensors() {
    let bytes = raw(
        3,
        &[arch()],
        &[info("a", &[16], 0, 0), info("b", &[8], 0, 32)],
        96,
    );
    rejected(&bytes, Some("tensor `b`"), &["overlaps tensor `a`"]);
    // Empty tensors overlap nothing.
    let bytes = raw(
        3,
        &[arch()],
        &[info("a", &[8], 0, 0), info("z", &[0], 0, 0)],
        32,
    );
    assert!(parse_all(&bytes).is_ok());
}

#[test]
fn rejects_bad_alignment() {
    for (a, rule) in [
        (0, "alignment 0 is not a power of two"),
        (12, "alignment 12 is not a power of two"),
        (4, "alignment 4 is not a multiple of 8"),
    ] {
        let bytes = raw(3, &[kv_u32("general.alignment", a)], &[], 0);
        rejected(&bytes, Some("key `general.alignment`"), &[rule]);
    }
    let wide = Kv {
        key: b"general.alignment",
        ty: 10,
        payload: 32u64.to_le_bytes().to_vec(),
    };
    rejected(
        &raw(3, &[wide], &[], 0),
        Some("key `general.alignment`"),
        &["must be a u32, found value type 10"],
    );
    let bytes = raw(
        3,
        &[kv_u32("general.alignment", 8), arch()],
        &[info("a", &[8], 0, 0)],
        32,
    );
    assert_eq!(parse_all(&bytes).unwrap().alignment, 8);
}

#[test]
fn truncated_header_needs_more_or_is_malformed() {
    let full = serialize(&every_value(), &[("w", GgmlType::F32, &[4], &[0; 16])], 32);
    let size = full.len() as u64;
    // The header ends less than one alignment before the data section.
    let inside = parse_all(&full).unwrap().data_offset as usize - 32;
    for cut in [0, 3, 10, 24, 40, 200, inside] {
        match parse_header(Path::new("t.gguf"), &full[..cut], size) {
            Err(ParseError::NeedMore(n)) => assert!(n > cut as u64 && n <= size, "{cut}: {n}"),
            other => panic!("{cut}: {other:?}"),
        }
        let msg = parse(Path::new("t.gguf"), &full[..cut], size)
            .unwrap_err()
            .to_string();
        assert!(
            msg.contains(&format!("continues past the {cut} bytes read")),
            "{msg}"
        );
        // The same bytes as the whole file: truncated, so malformed (counts that cannot fit are
        // caught before the read that would run out).
        let msg = parse_all(&full[..cut]).unwrap_err().to_string();
        assert!(
            msg.contains("past the end of the file") || msg.contains("cannot fit"),
            "{msg}"
        );
    }
    assert!(matches!(
        parse_header(Path::new("t.gguf"), &full, size - 1),
        Err(ParseError::Malformed(_))
    ));
}
