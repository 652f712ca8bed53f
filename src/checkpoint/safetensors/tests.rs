//! Fixtures are built in code: valid files with `serialize`, hostile ones from raw header text.

use std::fmt::Debug;
use std::fs;

use super::*;
use crate::error::ErrorKind;

/// What `serialize` takes: name, dtype, shape, data.
type Spec<'a> = (&'a str, Dtype, &'a [u64], &'a [u8]);

fn no_metadata() -> BTreeMap<String, String> {
    BTreeMap::new()
}

fn bytes_of(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 7 + 1) as u8).collect()
}

/// A file with `header` as its JSON header, unpadded, followed by `data_len` bytes of data.
fn raw(header: &str, data_len: usize) -> Vec<u8> {
    let mut out = (header.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(header.as_bytes());
    out.extend(bytes_of(data_len));
    out
}

fn parse(bytes: &[u8]) -> Result<SafetensorsFile> {
    parse_header(Path::new("t.safetensors"), bytes, bytes.len() as u64)
}

#[track_caller]
fn assert_malformed<T: Debug>(result: Result<T>, subject: Option<&str>, needle: &str) -> Error {
    let err = match result {
        Ok(value) => panic!("expected an error, got {value:?}"),
        Err(err) => err,
    };
    match &err.kind {
        ErrorKind::Format { subject: got, rule } => {
            assert_eq!(got.as_deref(), subject, "wrong subject in: {err}");
            assert!(rule.contains(needle), "`{needle}` not in: {err}");
        }
        other => panic!("expected Format, got {other:?}"),
    }
    err
}

/// The official crate must accept the file and read the same header.
#[track_caller]
fn assert_official_agrees(bytes: &[u8], ours: &SafetensorsFile) {
    let (n, theirs) = match ::safetensors::SafeTensors::read_metadata(bytes) {
        Ok(read) => read,
        Err(e) => panic!("official crate refuses the file: {e:?}"),
    };
    assert_eq!(n as u64, ours.header_len);
    let tensors = theirs.tensors();
    assert_eq!(tensors.len(), ours.tensors.len());
    let base = 8 + n as u64;
    for t in &ours.tensors {
        let Some(info) = tensors.get(&t.name) else {
            panic!("official crate lacks {}", t.name)
        };
        assert_eq!(format!("{:?}", info.dtype), t.dtype.name(), "{}", t.name);
        let shape: Vec<u64> = info.shape.iter().map(|&d| d as u64).collect();
        assert_eq!(shape, t.shape, "{}", t.name);
        let (begin, end) = info.data_offsets;
        assert_eq!(base + begin as u64..base + end as u64, t.data, "{}", t.name);
    }
    let metadata: BTreeMap<String, String> = theirs
        .metadata()
        .clone()
        .unwrap_or_default()
        .into_iter()
        .collect();
    assert_eq!(metadata, ours.metadata);
}

fn entry(name: &str, dtype: &str, shape: &str, begin: u64, end: u64) -> String {
    format!(r#""{name}":{{"dtype":"{dtype}","shape":{shape},"data_offsets":[{begin},{end}]}}"#)
}

// ---- valid files -------------------------------------------------------------------------------

#[test]
fn round_trip_every_dtype() {
    let dir = tempfile::tempdir().unwrap();
    for dtype in Dtype::ALL {
        let eight = bytes_of(dtype.byte_len(8).unwrap() as usize);
        let scalar = dtype.byte_len(1).map(|n| bytes_of(n as usize));
        let mut tensors: Vec<Spec> = vec![
            ("w", dtype, &[2, 4], &eight),
            ("empty", dtype, &[0, 3], &[]),
        ];
        if let Some(scalar) = &scalar {
            tensors.push(("s", dtype, &[], scalar));
        }
        let metadata = BTreeMap::from([("format".to_owned(), "pt".to_owned())]);
        let bytes = serialize(&tensors, &metadata);
        let path = dir.path().join(format!("{dtype}.safetensors"));
        fs::write(&path, &bytes).unwrap();

        let file = read_file(&path).unwrap();
        assert_eq!(file.path, path);
        assert_eq!(file.file_size, bytes.len() as u64);
        assert_eq!(file.metadata, metadata);
        assert_eq!(file.tensors.len(), tensors.len());
        let w = file.get("w").unwrap();
        assert_eq!(
            (w.dtype, w.shape.as_slice(), w.numel()),
            (dtype, &[2, 4][..], 8)
        );
        assert_eq!(w.byte_len(), eight.len() as u64);
        assert_eq!(w.data.start, 8 + file.header_len);
        let empty = file.get("empty").unwrap();
        assert_eq!((empty.numel(), empty.byte_len()), (0, 0));
        if scalar.is_some() {
            let s = file.get("s").unwrap();
            assert_eq!((s.numel(), s.shape.len()), (1, 0));
        }
        assert_eq!(read_tensor_bytes(&file, "w", 1 << 20).unwrap(), eight);
        assert_eq!(file.tensors.last().unwrap().data.end, file.file_size);
        assert_official_agrees(&bytes, &file);
    }
}

#[test]
fn sub_byte_types_must_end_on_a_byte_boundary() {
    let f6 = serialize(&[("x", Dtype::F6_E3M2, &[4], &[1, 2, 3])], &no_metadata());
    assert_eq!(parse(&f6).unwrap().tensors[0].byte_len(), 3);
    let f4 = raw(&format!("{{{}}}", entry("x", "F4", "[3]", 0, 2)), 2);
    assert_malformed(
        parse(&f4),
        Some("x"),
        "12 bits, which does not end on a byte boundary",
    );
    let f6 = raw(&format!("{{{}}}", entry("x", "F6_E2M3", "[1]", 0, 1)), 1);
    assert_malformed(parse(&f6), Some("x"), "6 bits");
}

#[test]
fn official_crate_accepts_what_serialize_writes() {
    let metadata = BTreeMap::from([
        ("format".to_owned(), "pt".to_owned()),
        (
            "quote\"and\\slash\n".to_owned(),
            "ünïcode \u{1} ✓".to_owned(),
        ),
    ]);
    let a = bytes_of(2 * 3 * 2);
    let b = bytes_of(16);
    let c = bytes_of(5);
    let cases: Vec<(Vec<Spec>, BTreeMap<String, String>)> = vec![
        (vec![], no_metadata()),
        (vec![], metadata.clone()),
        (vec![("only", Dtype::U8, &[5], &c)], no_metadata()),
        (
            vec![
                ("model.layers.0.weight", Dtype::BF16, &[2, 3], &a),
                ("名前 \"quoted\" \\ \t", Dtype::F4, &[4, 8], &b),
                ("zero", Dtype::F64, &[0], &[]),
                ("bias", Dtype::I8, &[5], &c),
                ("scale", Dtype::F8_E8M0, &[], &c[..1]),
            ],
            metadata,
        ),
    ];
    for (tensors, metadata) in cases {
        let bytes = serialize(&tensors, &metadata);
        let n = u64::from_le_bytes(bytes[..8].try_into().unwrap());
        assert_eq!(n % 8, 0, "header is padded to a multiple of 8");
        let file = parse(&bytes).unwrap();
        let names: Vec<&str> = file.tensors.iter().map(|t| t.name.as_str()).collect();
        let given: Vec<&str> = tensors.iter().map(|t| t.0).collect();
        assert_eq!(names, given, "offset order is the given order");
        assert_official_agrees(&bytes, &file);
    }
}

#[test]
fn tensors_come_back_in_offset_order_and_padding_is_allowed() {
    // Header order differs from offset order; the header has trailing spaces and a newline, as the
    // official parser allows.
    let header = format!(
        "{{{},{}}}  \n",
        entry("second", "U8", "[2]", 2, 4),
        entry("first", "U8", "[2]", 0, 2)
    );
    let bytes = raw(&header, 4);
    assert!(::safetensors::SafeTensors::deserialize(&bytes).is_ok());
    let file = parse(&bytes).unwrap();
    let names: Vec<&str> = file.tensors.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, ["first", "second"]);
    let base = 8 + header.len() as u64;
    assert_eq!(file.tensors[1].data, base + 2..base + 4);
}

#[test]
fn read_tensor_bytes_limits_and_names() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.safetensors");
    let big = bytes_of(64);
    fs::write(
        &path,
        serialize(&[("big", Dtype::F32, &[16], &big)], &no_metadata()),
    )
    .unwrap();
    let file = read_file(&path).unwrap();
    assert_eq!(read_tensor_bytes(&file, "big", 64).unwrap(), big);
    assert_malformed(
        read_tensor_bytes(&file, "big", 63),
        Some("big"),
        "over the 63-byte limit",
    );
    assert_malformed(
        read_tensor_bytes(&file, "nope", 64),
        Some("nope"),
        "no tensor",
    );
    // A file that changed since its header was read is refused, not misread.
    fs::write(&path, b"short").unwrap();
    assert_malformed(read_tensor_bytes(&file, "big", 64), None, "file changed");
}

// ---- framing -----------------------------------------------------------------------------------

#[test]
fn file_shorter_than_8_bytes() {
    assert_malformed(
        parse(&[1, 2, 3]),
        None,
        "too short for the 8-byte header length",
    );
    assert_malformed(parse(&[]), None, "too short");
}

#[test]
fn length_prefix_u64_max() {
    let mut bytes = u64::MAX.to_le_bytes().to_vec();
    bytes.extend_from_slice(b"{}");
    assert_malformed(parse(&bytes), None, "over the 100000000-byte limit");
}

#[test]
fn length_prefix_past_the_end_of_the_file() {
    let mut bytes = 1000u64.to_le_bytes().to_vec();
    bytes.extend_from_slice(&[b' '; 50]);
    assert_malformed(
        parse(&bytes),
        None,
        "runs past the end of the file (58 bytes)",
    );
}

#[test]
fn header_of_101_mb_claimed() {
    // A sparse file: the size is real, the disk use is not.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("huge.safetensors");
    let file = fs::File::create(&path).unwrap();
    use std::io::Write as _;
    (&file).write_all(&101_000_000u64.to_le_bytes()).unwrap();
    (&file).write_all(b"{").unwrap();
    file.set_len(101_000_100).unwrap();
    assert_malformed(
        read_file(&path),
        None,
        "header length 101000000 is over the 100000000",
    );
    // Remote reads: only the 8-byte prefix is available and that is enough to refuse.
    let prefix = 101_000_000u64.to_le_bytes();
    assert_malformed(
        parse_header(&path, &prefix, 200_000_000),
        None,
        "over the 100000000",
    );
}

#[test]
fn remote_prefix_shorter_than_the_header() {
    let bytes = serialize(&[("x", Dtype::U8, &[1], &[1])], &no_metadata());
    let size = bytes.len() as u64;
    let cut = &bytes[..bytes.len() - 3];
    let file = parse_header(Path::new("r"), &bytes[..bytes.len() - 1], size).unwrap();
    assert_eq!(file.tensors[0].data.end, size);
    assert_malformed(parse_header(Path::new("r"), cut, size), None, "only");
    assert_malformed(
        parse_header(Path::new("r"), &bytes[..5], size),
        None,
        "needs 8",
    );
}

#[test]
fn header_not_utf8() {
    let mut header = b"{\"a\xff\":1}".to_vec();
    header.resize(16, b' ');
    let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(&header);
    assert_malformed(
        parse(&bytes),
        None,
        "not valid UTF-8 (byte 3 of the header)",
    );
}

#[test]
fn header_not_an_object() {
    assert_malformed(parse(&raw("[1, 2]", 0)), None, "must start with `{`");
    assert_malformed(parse(&raw("", 0)), None, "must start with `{`");
    assert_malformed(parse(&raw(" {}", 0)), None, "must start with `{`");
    assert_malformed(parse(&raw("{", 0)), None, "not valid JSON");
    assert_malformed(parse(&raw("{}x", 0)), None, "not valid JSON");
    assert_malformed(parse(&raw("{} {}", 0)), None, "not valid JSON");
    assert!(parse(&raw("{}       ", 0)).unwrap().tensors.is_empty());
}

#[test]
fn deep_nesting_is_refused_without_overflowing_the_stack() {
    let header = format!(
        "{{\"__metadata__\":{}{}}}",
        "[".repeat(100_000),
        "]".repeat(100_000)
    );
    assert_malformed(parse(&raw(&header, 0)), None, "recursion limit");
}

// ---- duplicates --------------------------------------------------------------------------------

#[test]
fn duplicate_tensor_key() {
    // Same offsets, different dtypes: the official crate keeps the last and accepts the file, a
    // first-wins parser reads the other entry.
    let header = format!(
        "{{{},{}}}",
        entry("w", "F16", "[2]", 0, 4),
        entry("w", "I32", "[1]", 0, 4)
    );
    let bytes = raw(&header, 4);
    assert!(::safetensors::SafeTensors::deserialize(&bytes).is_ok());
    assert_malformed(parse(&bytes), Some("w"), "appears twice in the header");
}

#[test]
fn duplicate_key_inside_an_entry() {
    let header = r#"{"w":{"dtype":"F16","shape":[2],"dtype":"I32","data_offsets":[0,4]}}"#;
    assert_malformed(
        parse(&raw(header, 4)),
        Some("w"),
        "duplicate key `dtype` inside this entry",
    );
}

#[test]
fn duplicate_key_in_metadata_and_nested_values() {
    let header = r#"{"__metadata__":{"a":"1","a":"2"}}"#;
    assert_malformed(
        parse(&raw(header, 0)),
        Some("__metadata__"),
        "duplicate key `a`",
    );
    // Deep inside a value the rules would refuse anyway, the duplicate is still what is named.
    let header = r#"{"w":{"x":[{"k":1,"k":2}]}}"#;
    assert_malformed(
        parse(&raw(header, 0)),
        Some("w"),
        "duplicate key `k` at `x[0]`",
    );
    // Escapes spell the same key differently; it is still the same key.
    let header = r#"{"__metadata__":{"ab":"1","a\u0062":"2"}}"#;
    assert_malformed(
        parse(&raw(header, 0)),
        Some("__metadata__"),
        "duplicate key `ab`",
    );
}

// ---- layout ------------------------------------------------------------------------------------

#[test]
fn gap_between_tensors() {
    let header = format!(
        "{{{},{}}}",
        entry("a", "U8", "[2]", 0, 2),
        entry("b", "U8", "[2]", 4, 6)
    );
    assert_malformed(parse(&raw(&header, 6)), Some("b"), "gap of 2 bytes");
    let header = format!("{{{}}}", entry("a", "U8", "[2]", 3, 5));
    assert_malformed(parse(&raw(&header, 5)), Some("a"), "gap of 3 bytes");
}

#[test]
fn overlapping_tensors() {
    let header = format!(
        "{{{},{}}}",
        entry("a", "F16", "[2]", 0, 4),
        entry("b", "F16", "[2]", 2, 6)
    );
    assert_malformed(parse(&raw(&header, 6)), Some("b"), "overlap `a` at [0, 4]");
    // A zero-size tensor inside another one's bytes overlaps it too (the official crate agrees).
    let header = format!(
        "{{{},{}}}",
        entry("a", "F16", "[2]", 0, 4),
        entry("z", "F16", "[0]", 2, 2)
    );
    assert_malformed(parse(&raw(&header, 4)), Some("z"), "overlap `a`");
    // Two entries over the same bytes under different names.
    let header = format!(
        "{{{},{}}}",
        entry("a", "F16", "[2]", 0, 4),
        entry("b", "I32", "[1]", 0, 4)
    );
    assert_malformed(parse(&raw(&header, 4)), Some("b"), "overlap `a`");
}

#[test]
fn trailing_byte_after_the_last_tensor() {
    let mut bytes = serialize(&[("a", Dtype::U8, &[2], &[1, 2])], &no_metadata());
    bytes.push(0);
    assert_malformed(parse(&bytes), Some("a"), "1 trailing byte(s)");
    assert_malformed(parse(&raw("{}", 3)), None, "3 trailing byte(s)");
}

#[test]
fn truncated_file() {
    let mut bytes = serialize(
        &[
            ("a", Dtype::U8, &[2], &[1, 2]),
            ("b", Dtype::U8, &[2], &[3, 4]),
        ],
        &no_metadata(),
    );
    bytes.pop();
    assert_malformed(parse(&bytes), Some("b"), "run past the end of the file");
    // Remote: the size says truncated even though the prefix has only the header.
    let full = serialize(&[("a", Dtype::U8, &[2], &[1, 2])], &no_metadata());
    let header_end = full.len() - 2;
    let result = parse_header(Path::new("r"), &full[..header_end], full.len() as u64 - 1);
    assert_malformed(result, Some("a"), "run past the end");
}

#[test]
fn length_mismatch_between_offsets_and_shape() {
    let name = "model.layers.0.mlp.up_proj.weight";
    let header = format!("{{{}}}", entry(name, "F16", "[4, 4]", 0, 10));
    let err = assert_malformed(parse(&raw(&header, 10)), Some(name), "");
    assert_eq!(
        err.message(),
        format!("{name}: data_offsets [0, 10] hold 10 bytes but shape [4, 4] × F16 needs 32")
    );
    // serialize writes what it is given, so it can make this mistake on purpose too.
    let bytes = serialize(&[("x", Dtype::F32, &[2], &[0; 4])], &no_metadata());
    assert_malformed(
        parse(&bytes),
        Some("x"),
        "hold 4 bytes but shape [2] × F32 needs 8",
    );
}

#[test]
fn shape_product_overflow() {
    let header = format!("{{{}}}", entry("w", "U8", "[4294967296, 4294967296]", 0, 0));
    assert_malformed(
        parse(&raw(&header, 0)),
        Some("w"),
        "more than 2^64 elements",
    );
    // A zero anywhere does not excuse an overflowing product of the other dims.
    let header = format!(
        "{{{}}}",
        entry("w", "U8", "[4294967296, 4294967296, 0]", 0, 0)
    );
    assert_malformed(
        parse(&raw(&header, 0)),
        Some("w"),
        "more than 2^64 elements",
    );
    let header = format!("{{{}}}", entry("w", "F32", "[4611686018427387904]", 0, 0));
    assert_malformed(parse(&raw(&header, 0)), Some("w"), "more than 2^64 bits");
}

#[test]
fn negative_and_float_dims() {
    for (shape, found) in [
        ("[-1, 4]", "shape[0] is -1"),
        ("[2.0]", "shape[0] is 2.0"),
        ("[1, 1e3]", "shape[1] is 1000.0"),
        (
            "[18446744073709551616]",
            "shape[0] is 1.8446744073709552e19",
        ),
        ("[\"4\"]", "shape[0] is the string \"4\""),
        ("[null]", "shape[0] is null"),
    ] {
        let header = format!("{{{}}}", entry("w", "U8", shape, 0, 4));
        assert_malformed(parse(&raw(&header, 4)), Some("w"), found);
    }
    let header = r#"{"w":{"dtype":"U8","shape":4,"data_offsets":[0,4]}}"#;
    assert_malformed(parse(&raw(header, 4)), Some("w"), "shape must be an array");
}

#[test]
fn unknown_dtype() {
    for dtype in ["F128", "f16", ""] {
        let header = format!("{{{}}}", entry("w", dtype, "[1]", 0, 1));
        assert_malformed(
            parse(&raw(&header, 1)),
            Some("w"),
            &format!("unknown dtype `{dtype}`"),
        );
    }
    let header = r#"{"w":{"dtype":16,"shape":[1],"data_offsets":[0,2]}}"#;
    assert_malformed(
        parse(&raw(header, 2)),
        Some("w"),
        "dtype must be a string, found 16",
    );
}

#[test]
fn unknown_and_missing_fields() {
    let header = r#"{"w":{"dtype":"U8","shape":[1],"data_offsets":[0,1],"offset":0}}"#;
    assert_malformed(parse(&raw(header, 1)), Some("w"), "unknown field `offset`");
    let header = r#"{"w":{"dtype":"U8","data_offsets":[0,1]}}"#;
    assert_malformed(parse(&raw(header, 1)), Some("w"), "no `shape`");
    let header = r#"{"w":[1]}"#;
    assert_malformed(parse(&raw(header, 0)), Some("w"), "must be an object");
}

#[test]
fn bad_data_offsets() {
    for (offsets, needle) in [
        ("[0]", "found [0]"),
        ("[0, 1, 2]", "found [0, 1, 2]"),
        ("[-1, 1]", "found [-1, 1]"),
        ("[0.0, 1]", "two non-negative integers"),
        ("\"0,1\"", "two non-negative integers"),
        ("[2, 1]", "data_offsets [2, 1] end before they begin"),
    ] {
        let header = format!(r#"{{"w":{{"dtype":"U8","shape":[1],"data_offsets":{offsets}}}}}"#);
        assert_malformed(parse(&raw(&header, 2)), Some("w"), needle);
    }
}

#[test]
fn metadata_with_a_non_string_value() {
    let header = r#"{"__metadata__":{"format":"pt","epochs":3}}"#;
    assert_malformed(
        parse(&raw(header, 0)),
        Some("__metadata__"),
        "`epochs` must be a string",
    );
    let header = r#"{"__metadata__":{"nested":{"a":"b"}}}"#;
    assert_malformed(
        parse(&raw(header, 0)),
        Some("__metadata__"),
        "found an object",
    );
    let header = r#"{"__metadata__":null}"#;
    assert_malformed(
        parse(&raw(header, 0)),
        Some("__metadata__"),
        "must be an object",
    );
}

#[test]
fn hostile_names_are_escaped_in_messages() {
    let header = format!("{{{}}}", entry("a\\u001b[2Jb", "U8", "[2]", 0, 1));
    assert_malformed(
        parse(&raw(&header, 1)),
        Some("a\\u{1b}[2Jb"),
        "hold 1 bytes",
    );
}

#[test]
fn official_crate_also_refuses_the_layout_errors() {
    // Beyond the deliberate extra strictness (duplicates, unknown fields, metadata values, a
    // header not starting with `{`, which the format README requires but the 0.8 crate no longer
    // checks), what we refuse the reference parser refuses too.
    let e = |name: &str, shape: &str, begin: u64, end: u64| entry(name, "F16", shape, begin, end);
    let cases = [
        raw(
            &format!("{{{},{}}}", e("a", "[1]", 0, 2), e("b", "[1]", 4, 6)),
            6,
        ),
        raw(
            &format!("{{{},{}}}", e("a", "[2]", 0, 4), e("b", "[2]", 2, 6)),
            6,
        ),
        raw(&format!("{{{}}}", e("a", "[1]", 0, 2)), 3),
        raw(&format!("{{{}}}", e("a", "[1]", 0, 2)), 1),
        raw(&format!("{{{}}}", e("a", "[4, 4]", 0, 10)), 10),
        raw(
            &format!("{{{}}}", e("a", "[4294967296, 4294967296, 0]", 0, 0)),
            0,
        ),
        raw(&format!("{{{}}}", e("a", "[-1]", 0, 0)), 0),
        raw(&format!("{{{}}}", entry("a", "F4", "[3]", 0, 2)), 2),
    ];
    for (i, bytes) in cases.iter().enumerate() {
        assert!(parse(bytes).is_err(), "case {i}");
        assert!(
            ::safetensors::SafeTensors::deserialize(bytes).is_err(),
            "case {i}"
        );
    }
}

// ---- sharded checkpoints -----------------------------------------------------------------------

struct Shards {
    dir: tempfile::TempDir,
}

impl Shards {
    /// Two shards: `a` holds `x` (4 bytes) and `y` (2 bytes), `b` holds `z` (8 bytes).
    fn new() -> Shards {
        let dir = tempfile::tempdir().unwrap();
        let shards = Shards { dir };
        shards.shard("a.safetensors", &[("x", 4), ("y", 2)]);
        shards.shard("b.safetensors", &[("z", 8)]);
        shards
    }

    fn shard(&self, name: &str, tensors: &[(&str, u64)]) {
        let data: Vec<Vec<u8>> = tensors.iter().map(|t| bytes_of(t.1 as usize)).collect();
        let shapes: Vec<[u64; 1]> = tensors.iter().map(|t| [t.1]).collect();
        let list: Vec<Spec> = tensors
            .iter()
            .zip(&data)
            .zip(&shapes)
            .map(|((t, d), s)| (t.0, Dtype::U8, &s[..], &d[..]))
            .collect();
        fs::write(self.dir.path().join(name), serialize(&list, &no_metadata())).unwrap();
    }

    fn index(&self, body: &str) -> PathBuf {
        let path = self.dir.path().join("model.safetensors.index.json");
        fs::write(&path, body).unwrap();
        path
    }

    fn index_for(&self, total_size: u64, weight_map: &[(&str, &str)]) -> PathBuf {
        let map: Vec<String> = weight_map
            .iter()
            .map(|(t, s)| format!("\"{t}\": \"{s}\""))
            .collect();
        self.index(&format!(
            "{{\"metadata\": {{\"total_size\": {total_size}, \"format\": \"pt\"}},\n\
             \"weight_map\": {{{}}}}}",
            map.join(", ")
        ))
    }

    fn good_map() -> Vec<(&'static str, &'static str)> {
        vec![
            ("x", "a.safetensors"),
            ("y", "a.safetensors"),
            ("z", "b.safetensors"),
        ]
    }

    fn open(&self) -> Result<SafetensorsCheckpoint> {
        open_dir(self.dir.path())
    }

    fn index_path(&self) -> PathBuf {
        self.dir.path().join("model.safetensors.index.json")
    }
}

#[test]
fn sharded_checkpoint_with_index() {
    let shards = Shards::new();
    // A consolidated file beside the shards (as Mistral ships) is not part of the checkpoint.
    shards.shard("consolidated.safetensors", &[("other", 1)]);
    let index_path = shards.index_for(14, &Shards::good_map());
    let checkpoint = shards.open().unwrap();
    let index = checkpoint.index.as_ref().unwrap();
    assert_eq!(index.total_size, Some(14));
    assert_eq!(index.metadata["format"], "pt");
    assert_eq!(index.weight_map.len(), 3);
    let files: Vec<&Path> = checkpoint.files.iter().map(|f| f.path.as_path()).collect();
    assert_eq!(
        files,
        [
            shards.dir.path().join("a.safetensors"),
            shards.dir.path().join("b.safetensors")
        ]
    );
    assert_eq!(checkpoint.tensor_count(), 3);
    let names: Vec<&str> = checkpoint.tensors().map(|(_, t)| t.name.as_str()).collect();
    assert_eq!(names, ["x", "y", "z"]);
    let (file, z) = checkpoint.tensor("z").unwrap();
    assert!(file.path.ends_with("b.safetensors") && z.byte_len() == 8);
    assert!(checkpoint.tensor("other").is_none());
    // The index file itself opens the same checkpoint.
    assert_eq!(open_file(&index_path).unwrap().tensor_count(), 3);
}

#[test]
fn index_total_size_may_be_absent_or_an_integral_float() {
    let shards = Shards::new();
    shards.index(r#"{"weight_map":{"x":"a.safetensors","y":"a.safetensors","z":"b.safetensors"}}"#);
    assert_eq!(shards.open().unwrap().index.unwrap().total_size, None);
    shards.index(
        r#"{"metadata":{"total_size":14.0},"weight_map":{"x":"a.safetensors","y":"a.safetensors","z":"b.safetensors"}}"#,
    );
    assert_eq!(shards.open().unwrap().index.unwrap().total_size, Some(14));
    shards.index(r#"{"metadata":{"total_size":14.5},"weight_map":{"x":"a.safetensors"}}"#);
    assert_malformed(
        shards.open(),
        Some("total_size"),
        "non-negative integer, found 14.5",
    );
}

#[test]
fn index_naming_a_missing_shard() {
    let shards = Shards::new();
    let mut map = Shards::good_map();
    map.push(("w", "c.safetensors"));
    shards.index_for(14, &map);
    let err = assert_malformed(shards.open(), Some("c.safetensors"), "does not exist");
    assert_eq!(err.file, shards.index_path());
}

#[test]
fn tensor_in_two_shards() {
    let shards = Shards::new();
    shards.shard("b.safetensors", &[("z", 8), ("x", 4)]);
    shards.index_for(18, &Shards::good_map());
    let err = assert_malformed(
        shards.open(),
        Some("x"),
        "in two shards, `a.safetensors` and `b.safetensors`",
    );
    assert_eq!(err.file, shards.dir.path().join("b.safetensors"));
}

#[test]
fn tensor_in_a_shard_other_than_the_index_says() {
    let shards = Shards::new();
    shards.index_for(
        14,
        &[
            ("x", "a.safetensors"),
            ("y", "b.safetensors"),
            ("z", "b.safetensors"),
        ],
    );
    assert_malformed(
        shards.open(),
        Some("y"),
        "weight_map puts it in `b.safetensors`, but it is in `a.safetensors`",
    );
}

#[test]
fn index_lists_a_tensor_no_shard_has() {
    let shards = Shards::new();
    let mut map = Shards::good_map();
    map.push(("ghost", "b.safetensors"));
    shards.index_for(14, &map);
    assert_malformed(shards.open(), Some("ghost"), "no shard holds it");
}

#[test]
fn shard_holds_a_tensor_the_index_does_not_list() {
    let shards = Shards::new();
    shards.index_for(14, &[("x", "a.safetensors"), ("z", "b.safetensors")]);
    assert_malformed(shards.open(), Some("y"), "not in weight_map");
}

#[test]
fn shard_names_must_be_plain_file_names() {
    let shards = Shards::new();
    for shard in [
        "../a.safetensors",
        "/etc/passwd",
        "sub/a.safetensors",
        "..",
        ".",
        "",
        "a\\b",
    ] {
        let shard_json = serde_json::to_string(shard).unwrap();
        shards.index(&format!("{{\"weight_map\":{{\"x\":{shard_json}}}}}"));
        assert_malformed(shards.open(), Some("x"), "not a plain file name");
    }
}

#[test]
fn index_structure_and_duplicates() {
    let shards = Shards::new();
    shards.index(r#"{"weight_map":{"x":"a.safetensors","x":"b.safetensors"}}"#);
    assert_malformed(shards.open(), Some("x"), "appears twice in `weight_map`");
    shards.index(r#"{"weight_map":{"x":"a.safetensors"},"weight_map":{}}"#);
    assert_malformed(
        shards.open(),
        Some("weight_map"),
        "appears twice in the top level",
    );
    shards.index(r#"{"metadata":{}}"#);
    assert_malformed(shards.open(), None, "no `weight_map`");
    shards.index(r#"{"weight_map":{"x":1}}"#);
    assert_malformed(shards.open(), Some("x"), "shard file name, found 1");
    shards.index(r#"{"weight_map":{}}"#);
    assert_malformed(shards.open(), Some("weight_map"), "is empty");
    shards.index(r#"[]"#);
    assert_malformed(shards.open(), None, "must be a JSON object");
    shards.index(r#"{"weight_map":"#);
    assert_malformed(shards.open(), None, "not valid JSON");
}

#[test]
fn index_over_64_mib_is_refused_unread() {
    let shards = Shards::new();
    let path = shards.index("{");
    fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(65 << 20)
        .unwrap();
    let err = read_index(&path).unwrap_err();
    assert!(
        matches!(err.kind, ErrorKind::TooLarge { limit, .. } if limit == 64 << 20),
        "{err}"
    );
    assert!(
        err.to_string()
            .contains("over the 67108864-byte limit for an index"),
        "{err}"
    );
}

#[test]
fn shard_errors_name_the_shard() {
    let shards = Shards::new();
    fs::write(shards.dir.path().join("b.safetensors"), raw("{}", 1)).unwrap();
    shards.index_for(14, &Shards::good_map());
    let err = assert_malformed(shards.open(), None, "trailing byte");
    assert_eq!(err.file, shards.dir.path().join("b.safetensors"));
}

// ---- directories without an index -------------------------------------------------------------

#[test]
fn directory_of_files_without_an_index() {
    let shards = Shards::new();
    let checkpoint = shards.open().unwrap();
    assert!(checkpoint.index.is_none());
    assert_eq!(checkpoint.files.len(), 2);
    assert_eq!(checkpoint.tensor("y").unwrap().1.byte_len(), 2);
    // The same name in two files is refused, naming the tensor.
    shards.shard("c.safetensors", &[("y", 2)]);
    let err = assert_malformed(shards.open(), Some("y"), "also in");
    assert_eq!(err.file, shards.dir.path().join("c.safetensors"));
}

#[test]
fn single_file_directory_and_open_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("model.safetensors");
    fs::write(
        &path,
        serialize(&[("w", Dtype::BF16, &[2], &[0; 4])], &no_metadata()),
    )
    .unwrap();
    fs::write(dir.path().join("config.json"), "{}").unwrap();
    assert_eq!(open_dir(dir.path()).unwrap().files[0].path, path);
    assert_eq!(open_file(&path).unwrap().tensor("w").unwrap().1.shape, [2]);
}

#[test]
fn directory_without_weights_or_with_ambiguous_indexes() {
    let dir = tempfile::tempdir().unwrap();
    // A directory with no weights is not a checkpoint: the path given is the mistake.
    let empty = open_dir(dir.path()).unwrap_err();
    assert!(empty.is_usage(), "{empty:?}");
    assert!(
        empty.to_string().contains("no *.safetensors file"),
        "{empty}"
    );
    fs::write(dir.path().join("a.safetensors.index.json"), "{}").unwrap();
    fs::write(dir.path().join("b.safetensors.index.json"), "{}").unwrap();
    assert_malformed(open_dir(dir.path()), None, "several index files");
    let missing = dir.path().join("missing");
    assert!(matches!(
        open_dir(&missing).unwrap_err().kind,
        ErrorKind::NotFound
    ));
}

#[test]
fn total_size_that_disagrees_with_the_shards_is_accepted() {
    // Real indexes often count differently; the shards themselves are what is checked.
    let shards = Shards::new();
    shards.index_for(15, &Shards::good_map());
    assert_eq!(shards.open().unwrap().index.unwrap().total_size, Some(15));
}
