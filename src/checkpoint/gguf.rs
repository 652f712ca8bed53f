//! A strict GGUF (v2, v3) header reader that never touches tensor data.
//!
//! The layout is ggml's `docs/gguf.md`; where the spec and ggml's own reader (`src/gguf.cpp`)
//! disagree we take the stricter of the two, so a file that passes here loads in llama.cpp and
//! matches the spec. Every count and length in a header is untrusted: each is bounded by the bytes
//! that could hold it before anything is allocated, and all arithmetic is checked.
//!
//! [`parse_header`] works on a prefix of a file (for ranged remote reads) and says how many bytes
//! it needs when the header runs past the prefix; [`read_file`] maps a local file.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use crate::checkpoint::mmap::MappedFile;
use crate::error::{Error, Result};

mod types;
mod write;

pub use types::{GgmlType, file_type_name};
pub use write::serialize;

/// `GGUF_DEFAULT_ALIGNMENT`: the data alignment when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// Longest tensor name ggml loads: `GGML_MAX_NAME` (64) counts the terminating NUL.
pub const MAX_TENSOR_NAME_LEN: u64 = 63;
/// `GGML_MAX_DIMS`.
pub const MAX_DIMS: u32 = 4;
/// Cap on a metadata key's length (real keys are a few dozen bytes).
pub const MAX_KEY_LEN: u64 = 64 * 1024;
/// Cap on one string value (chat templates, the longest real ones, are tens of KiB).
pub const MAX_STRING_LEN: u64 = 16 * 1024 * 1024;
/// Cap on array elements across all metadata: a one-byte element becomes a [`GgufValue`] of tens
/// of bytes, so this bounds memory. Real vocabularies total around a million.
pub const MAX_ARRAY_VALUES: u64 = 1 << 23;

/// Smallest possible KV pair: key length, a one-byte key, value type, a one-byte value.
const MIN_KV_BYTES: u64 = 8 + 1 + 4 + 1;
/// Smallest possible tensor info: name length (empty name), n_dims, one dim, type, offset.
const MIN_TENSOR_INFO_BYTES: u64 = 8 + 4 + 8 + 4 + 8;

/// A metadata value. Type ids are `enum gguf_type` (`include/gguf.h`).
#[derive(Debug, Clone, PartialEq)]
pub enum GgufValue {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    String(String),
    Array(GgufArray),
    U64(u64),
    I64(i64),
    F64(f64),
}

/// An array value: elements share `elem_type` (a [`GgufValue::type_id`]); arrays of arrays are
/// rejected when reading.
#[derive(Debug, Clone, PartialEq)]
pub struct GgufArray {
    pub elem_type: u32,
    pub values: Vec<GgufValue>,
}

const TYPE_STRING: u32 = 8;
const TYPE_ARRAY: u32 = 9;

impl GgufValue {
    /// The GGUF value type id (0 U8 ... 12 F64).
    pub fn type_id(&self) -> u32 {
        match self {
            GgufValue::U8(_) => 0,
            GgufValue::I8(_) => 1,
            GgufValue::U16(_) => 2,
            GgufValue::I16(_) => 3,
            GgufValue::U32(_) => 4,
            GgufValue::I32(_) => 5,
            GgufValue::F32(_) => 6,
            GgufValue::Bool(_) => 7,
            GgufValue::String(_) => TYPE_STRING,
            GgufValue::Array(_) => TYPE_ARRAY,
            GgufValue::U64(_) => 10,
            GgufValue::I64(_) => 11,
            GgufValue::F64(_) => 12,
        }
    }

    /// Any integer that is not negative; writers disagree on the width of counts and ids.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            GgufValue::U8(v) => Some(v.into()),
            GgufValue::U16(v) => Some(v.into()),
            GgufValue::U32(v) => Some(v.into()),
            GgufValue::U64(v) => Some(v),
            GgufValue::I8(v) => u64::try_from(v).ok(),
            GgufValue::I16(v) => u64::try_from(v).ok(),
            GgufValue::I32(v) => u64::try_from(v).ok(),
            GgufValue::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            GgufValue::String(s) => Some(s),
            _ => None,
        }
    }

    /// JSON for reports. An F32 prints as its shortest decimal (`1e-5`, not the f64 widening
    /// `9.99999974e-6`); non-finite floats, which JSON cannot hold, become the strings `"nan"`,
    /// `"inf"` and `"-inf"` rather than a `null` that would read as "absent".
    pub fn to_json(&self) -> serde_json::Value {
        use serde_json::Value;
        match self {
            GgufValue::U8(v) => (*v).into(),
            GgufValue::I8(v) => (*v).into(),
            GgufValue::U16(v) => (*v).into(),
            GgufValue::I16(v) => (*v).into(),
            GgufValue::U32(v) => (*v).into(),
            GgufValue::I32(v) => (*v).into(),
            GgufValue::U64(v) => (*v).into(),
            GgufValue::I64(v) => (*v).into(),
            GgufValue::F32(v) => {
                let shortest = v.to_string().parse::<f64>().unwrap_or(f64::from(*v));
                float_json(shortest)
            }
            GgufValue::F64(v) => float_json(*v),
            GgufValue::Bool(v) => Value::Bool(*v),
            GgufValue::String(s) => Value::String(s.clone()),
            GgufValue::Array(a) => Value::Array(a.values.iter().map(GgufValue::to_json).collect()),
        }
    }
}

fn float_json(v: f64) -> serde_json::Value {
    match serde_json::Number::from_f64(v) {
        Some(n) => serde_json::Value::Number(n),
        None if v.is_nan() => "nan".into(),
        None if v > 0.0 => "inf".into(),
        None => "-inf".into(),
    }
}

/// One tensor's header entry.
#[derive(Debug, Clone, PartialEq)]
pub struct GgufTensor {
    pub name: String,
    /// ggml order: `dims[0]` is the row length (the fastest-varying dimension).
    pub dims: Vec<u64>,
    pub ty: GgmlType,
    /// Absolute file offset of the data (the header stores it relative to the data section).
    pub offset: u64,
    pub n_bytes: u64,
}

impl GgufTensor {
    /// Element count; saturates for a hand-built tensor (parsed ones were checked).
    pub fn numel(&self) -> u64 {
        self.dims
            .iter()
            .try_fold(1u64, |acc, &d| acc.checked_mul(d))
            .unwrap_or(u64::MAX)
    }
}

/// A parsed header. Nothing of the tensor data is read or kept.
#[derive(Debug, Clone)]
pub struct GgufFile {
    pub path: PathBuf,
    pub version: u32,
    pub file_size: u64,
    pub alignment: u64,
    /// Start of the data section: the header's end padded to `alignment`. With no tensors the
    /// section is empty and this is clamped to `file_size`.
    pub data_offset: u64,
    /// In file order.
    pub metadata: Vec<(String, GgufValue)>,
    /// In file order (which need not be offset order).
    pub tensors: Vec<GgufTensor>,
}

impl GgufFile {
    pub fn get(&self, key: &str) -> Option<&GgufValue> {
        self.metadata.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }

    /// `general.architecture`, the prefix of the model's hyperparameter keys.
    pub fn architecture(&self) -> Option<&str> {
        self.get("general.architecture").and_then(GgufValue::as_str)
    }

    pub fn tensor(&self, name: &str) -> Option<&GgufTensor> {
        self.tensors.iter().find(|t| t.name == name)
    }

    /// For one file of a split GGUF (`llama-gguf-split`): `(split.no, split.count)`, with
    /// `split.no` counted from 0.
    pub fn split(&self) -> Option<(u64, u64)> {
        let no = self.get("split.no")?.as_u64()?;
        let count = self.get("split.count")?.as_u64()?;
        Some((no, count))
    }
}

/// Why [`parse_header`] stopped.
#[derive(Debug, thiserror::Error)]
pub enum ParseError {
    /// The header continues past the bytes given: read at least this many from the file's start
    /// and try again.
    #[error("the GGUF header needs at least the first {0} bytes of the file")]
    NeedMore(u64),
    /// The file breaks a rule; more bytes would not help.
    #[error(transparent)]
    Malformed(#[from] Error),
}

/// Map a local file and parse its header.
pub fn read_file(path: &Path) -> Result<GgufFile> {
    let map = MappedFile::open(path)?;
    let bytes = map.bytes();
    parse(path, bytes, bytes.len() as u64)
}

/// Parse a header from `bytes`, the start of a file of `file_size` bytes. A header that runs past
/// `bytes` is an error here; use [`parse_header`] to tell that apart and fetch more.
pub fn parse(path: &Path, bytes: &[u8], file_size: u64) -> Result<GgufFile> {
    parse_header(path, bytes, file_size).map_err(|e| match e {
        ParseError::Malformed(e) => e,
        ParseError::NeedMore(n) => Error::format(
            path,
            None,
            format!(
                "the header continues past the {} bytes read; at least {n} are needed",
                bytes.len()
            ),
        ),
    })
}

/// Parse a header from `bytes`, a prefix (or all) of a file of `file_size` bytes.
pub fn parse_header(
    path: &Path,
    bytes: &[u8],
    file_size: u64,
) -> std::result::Result<GgufFile, ParseError> {
    if bytes.len() as u64 > file_size {
        return Err(Error::format(
            path,
            None,
            format!(
                "{} bytes given for a file of {file_size} bytes",
                bytes.len()
            ),
        )
        .into());
    }
    let mut r = Reader {
        path,
        bytes,
        file_size,
        pos: 0,
        subject: None,
        array_values: 0,
    };

    let magic = r.take(4)?;
    if magic != b"GGUF" {
        return Err(r.err(format!(
            "not a GGUF file: starts with {} (`{}`), expected `GGUF`",
            spaced_hex(magic),
            magic.escape_ascii()
        )));
    }
    let version = r.u32()?;
    check_version(&r, version)?;

    let tensor_count = r.u64()?;
    let kv_count = r.u64()?;
    // Each count must fit in what is left of the file before anything is sized from it.
    let left = r.file_remaining();
    let tensor_room = tensor_count
        .checked_mul(MIN_TENSOR_INFO_BYTES)
        .filter(|&n| n <= left);
    let Some(tensor_room) = tensor_room else {
        return Err(r.err(format!(
            "tensor_count {tensor_count} cannot fit: a tensor info takes at least \
             {MIN_TENSOR_INFO_BYTES} bytes and {left} bytes remain"
        )));
    };
    let kv_left = left - tensor_room;
    if kv_count
        .checked_mul(MIN_KV_BYTES)
        .is_none_or(|n| n > kv_left)
    {
        return Err(r.err(format!(
            "metadata_kv_count {kv_count} cannot fit: a key-value pair takes at least \
             {MIN_KV_BYTES} bytes and {kv_left} bytes remain after the tensor infos"
        )));
    }

    let metadata = read_metadata(&mut r, kv_count)?;
    let alignment = alignment(&r, &metadata)?;
    let infos = read_tensor_infos(&mut r, tensor_count)?;

    let header_end = r.pos;
    r.subject = None;
    let Some(aligned_end) = align_up(header_end, alignment) else {
        return Err(r.err("the data section's start overflows"));
    };
    let data_offset = if infos.is_empty() {
        aligned_end.min(file_size)
    } else if aligned_end > file_size {
        return Err(r.err(format!(
            "the data section starts at byte {aligned_end} (header end {header_end} padded to \
             {alignment}), past the end of the file ({file_size} bytes)"
        )));
    } else {
        aligned_end
    };

    let tensors = place_tensors(&r, infos, data_offset, alignment)?;
    Ok(GgufFile {
        path: path.to_owned(),
        version,
        file_size,
        alignment,
        data_offset,
        metadata,
        tensors,
    })
}

fn check_version(r: &Reader<'_>, version: u32) -> std::result::Result<(), ParseError> {
    match version {
        2 | 3 => Ok(()),
        // A big-endian writer stores 3 as 00 00 00 03.
        _ if matches!(version.swap_bytes(), 1..=3) => Err(r.err(format!(
            "big-endian GGUF is not supported (version field reads {version:#010x})"
        ))),
        1 => Err(r.err("GGUF v1 is not supported (it used 32-bit counts; ggml dropped it)")),
        _ => Err(r.err(format!(
            "unsupported GGUF version {version} (expected 2 or 3)"
        ))),
    }
}

fn read_metadata(
    r: &mut Reader<'_>,
    kv_count: u64,
) -> std::result::Result<Vec<(String, GgufValue)>, ParseError> {
    let mut metadata = Vec::with_capacity(r.capacity_for(kv_count, MIN_KV_BYTES));
    let mut seen: HashMap<String, u64> = HashMap::new();
    for i in 0..kv_count {
        r.subject = Some(format!("metadata pair #{i}"));
        let key = r.string(MAX_KEY_LEN, "key")?;
        if key.is_empty() {
            return Err(r.err("empty metadata key"));
        }
        r.subject = Some(format!("key `{key}`"));
        if let Some(first) = seen.get(&key) {
            return Err(r.err(format!(
                "duplicate metadata key (first defined as pair #{first})"
            )));
        }
        let ty = r.u32()?;
        let value = r.value(ty)?;
        seen.insert(key.clone(), i);
        metadata.push((key, value));
    }
    Ok(metadata)
}

/// `general.alignment`: ggml requires a u32 power of two, the spec a multiple of 8.
fn alignment(
    r: &Reader<'_>,
    metadata: &[(String, GgufValue)],
) -> std::result::Result<u64, ParseError> {
    let Some((key, value)) = metadata.iter().find(|(k, _)| k == "general.alignment") else {
        return Ok(DEFAULT_ALIGNMENT);
    };
    let subject = Some(format!("key `{key}`"));
    let err = |rule: String| ParseError::from(Error::format(r.path, subject.as_deref(), rule));
    let GgufValue::U32(a) = *value else {
        return Err(err(format!(
            "must be a u32, found value type {}",
            value.type_id()
        )));
    };
    if a == 0 || !a.is_power_of_two() {
        return Err(err(format!("alignment {a} is not a power of two")));
    }
    if a % 8 != 0 {
        return Err(err(format!("alignment {a} is not a multiple of 8")));
    }
    Ok(a.into())
}

/// A tensor info as stored: offset still relative to the data section.
struct TensorInfo {
    name: String,
    dims: Vec<u64>,
    ty: GgmlType,
    rel_offset: u64,
    n_bytes: u64,
}

fn read_tensor_infos(
    r: &mut Reader<'_>,
    tensor_count: u64,
) -> std::result::Result<Vec<TensorInfo>, ParseError> {
    let mut infos = Vec::with_capacity(r.capacity_for(tensor_count, MIN_TENSOR_INFO_BYTES));
    let mut seen: HashMap<String, u64> = HashMap::new();
    for i in 0..tensor_count {
        r.subject = Some(format!("tensor #{i}"));
        let len = r.u64()?;
        if len > MAX_TENSOR_NAME_LEN {
            return Err(r.err(format!(
                "name is {len} bytes; ggml allows at most {MAX_TENSOR_NAME_LEN} (GGML_MAX_NAME \
                 64 counts the terminating NUL)"
            )));
        }
        let raw = r.take(len)?;
        let Ok(name) = std::str::from_utf8(raw) else {
            return Err(r.err(format!("name `{}` is not UTF-8", raw.escape_ascii())));
        };
        if name.contains('\0') {
            return Err(r.err(format!(
                "name `{}` holds a NUL byte (ggml would read a shorter name)",
                raw.escape_ascii()
            )));
        }
        let name = name.to_owned();
        r.subject = Some(format!("tensor `{name}`"));
        if let Some(first) = seen.get(&name) {
            return Err(r.err(format!("duplicate tensor name (first at tensor #{first})")));
        }

        let n_dims = r.u32()?;
        if !(1..=MAX_DIMS).contains(&n_dims) {
            return Err(r.err(format!("n_dims is {n_dims}; ggml allows 1 to {MAX_DIMS}")));
        }
        let mut dims = Vec::with_capacity(MAX_DIMS as usize);
        let mut numel: u64 = 1;
        for _ in 0..n_dims {
            let d = r.u64()?;
            dims.push(d);
            // ggml holds dims and their product in int64.
            match numel.checked_mul(d).filter(|&n| i64::try_from(n).is_ok()) {
                Some(n) if i64::try_from(d).is_ok() => numel = n,
                _ => {
                    return Err(r.err(format!(
                        "dims {dims:?}: the element count overflows ggml's int64"
                    )));
                }
            }
        }

        let id = r.u32()?;
        let Some(ty) = GgmlType::from_id(id) else {
            return Err(r.err(match types::removed_type_name(id) {
                Some(old) => format!("type id {id} ({old}) was removed from ggml"),
                None => format!("type id {id} is not a ggml type"),
            }));
        };
        let block = ty.block_size();
        if dims[0] % block != 0 {
            return Err(r.err(format!(
                "first dimension {} is not a multiple of the {} block size {block}",
                dims[0],
                ty.name()
            )));
        }
        let Some(n_bytes) = (numel / block).checked_mul(ty.type_size()) else {
            return Err(r.err(format!("dims {dims:?}: the size in bytes overflows")));
        };
        let rel_offset = r.u64()?;
        seen.insert(name.clone(), i);
        infos.push(TensorInfo {
            name,
            dims,
            ty,
            rel_offset,
            n_bytes,
        });
    }
    Ok(infos)
}

/// Place each tensor in the file: aligned, inside it, and overlapping no other.
fn place_tensors(
    r: &Reader<'_>,
    infos: Vec<TensorInfo>,
    data_offset: u64,
    alignment: u64,
) -> std::result::Result<Vec<GgufTensor>, ParseError> {
    let file_size = r.file_size;
    let mut tensors = Vec::with_capacity(infos.len());
    for info in infos {
        let subject = format!("tensor `{}`", info.name);
        let err = |rule: String| ParseError::from(Error::format(r.path, Some(&subject), rule));
        if info.rel_offset % alignment != 0 {
            return Err(err(format!(
                "data offset {} is not a multiple of the alignment {alignment}",
                info.rel_offset
            )));
        }
        let start = data_offset.checked_add(info.rel_offset);
        let end = start.and_then(|s| s.checked_add(info.n_bytes));
        let (Some(start), Some(end)) = (start, end) else {
            return Err(err(format!("data offset {} overflows", info.rel_offset)));
        };
        if end > file_size {
            return Err(err(format!(
                "data at bytes {start}..{end} ({} bytes of {}) runs past the end of the file \
                 ({file_size} bytes)",
                info.n_bytes,
                info.ty.name()
            )));
        }
        tensors.push(GgufTensor {
            name: info.name,
            dims: info.dims,
            ty: info.ty,
            offset: start,
            n_bytes: info.n_bytes,
        });
    }

    let mut order: Vec<&GgufTensor> = tensors.iter().filter(|t| t.n_bytes > 0).collect();
    order.sort_by_key(|t| t.offset);
    for pair in order.windows(2) {
        let (a, b) = (pair[0], pair[1]);
        // Both were checked to end inside the file, so this cannot overflow.
        let a_end = a.offset.saturating_add(a.n_bytes);
        if b.offset < a_end {
            return Err(Error::format(
                r.path,
                Some(&format!("tensor `{}`", b.name)),
                format!(
                    "data at bytes {}..{} overlaps tensor `{}` at bytes {}..{a_end}",
                    b.offset,
                    b.offset.saturating_add(b.n_bytes),
                    a.name,
                    a.offset
                ),
            )
            .into());
        }
    }
    Ok(tensors)
}

fn align_up(n: u64, alignment: u64) -> Option<u64> {
    match n % alignment {
        0 => Some(n),
        rem => n.checked_add(alignment - rem),
    }
}

/// Bytes as spaced hex pairs (`47 47 55 46`), to show a file's first bytes in an error.
fn spaced_hex(bytes: &[u8]) -> String {
    bytes
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// A cursor over the header bytes that knows the whole file's size, so it can tell "past the
/// end of the file" (malformed) from "past the bytes we have" (need more).
struct Reader<'a> {
    path: &'a Path,
    bytes: &'a [u8],
    file_size: u64,
    pos: u64,
    /// What is being read, for error messages: a key or a tensor.
    subject: Option<String>,
    /// Array elements read so far, against [`MAX_ARRAY_VALUES`].
    array_values: u64,
}

impl<'a> Reader<'a> {
    fn err(&self, rule: impl Into<String>) -> ParseError {
        Error::format(self.path, self.subject.as_deref(), rule).into()
    }

    /// Bytes of the file after the cursor (the cursor never passes `file_size`).
    fn file_remaining(&self) -> u64 {
        self.file_size.saturating_sub(self.pos)
    }

    /// A capacity for `count` items of at least `min` bytes each that the bytes in hand could
    /// hold, so an untrusted count never sizes an allocation by itself.
    fn capacity_for(&self, count: u64, min: u64) -> usize {
        let in_hand = (self.bytes.len() as u64).saturating_sub(self.pos) / min.max(1);
        usize::try_from(count.min(in_hand)).unwrap_or(0)
    }

    fn take(&mut self, n: u64) -> std::result::Result<&'a [u8], ParseError> {
        let end = match self.pos.checked_add(n) {
            Some(end) if end <= self.file_size => end,
            _ => {
                return Err(self.err(format!(
                    "{n} bytes at offset {} run past the end of the file ({} bytes)",
                    self.pos, self.file_size
                )));
            }
        };
        let (Ok(start), Ok(end_idx)) = (usize::try_from(self.pos), usize::try_from(end)) else {
            return Err(ParseError::NeedMore(end));
        };
        let Some(slice) = self.bytes.get(start..end_idx) else {
            return Err(ParseError::NeedMore(end));
        };
        self.pos = end;
        Ok(slice)
    }

    fn array<const N: usize>(&mut self) -> std::result::Result<[u8; N], ParseError> {
        let slice = self.take(N as u64)?;
        let mut out = [0u8; N];
        out.copy_from_slice(slice);
        Ok(out)
    }

    fn u32(&mut self) -> std::result::Result<u32, ParseError> {
        self.array().map(u32::from_le_bytes)
    }

    fn u64(&mut self) -> std::result::Result<u64, ParseError> {
        self.array().map(u64::from_le_bytes)
    }

    /// A GGUF string: u64 length, then bytes (no NUL). `what` names it in errors.
    fn string(&mut self, cap: u64, what: &str) -> std::result::Result<String, ParseError> {
        let len = self.u64()?;
        if len > cap {
            return Err(self.err(format!("{what} length {len} is over the {cap}-byte cap")));
        }
        let raw = self.take(len)?;
        match std::str::from_utf8(raw) {
            Ok(s) => Ok(s.to_owned()),
            Err(_) if what == "key" => {
                Err(self.err(format!("key `{}` is not UTF-8", raw.escape_ascii())))
            }
            // The spec says UTF-8, but some converters wrote raw bytes into vocabularies; one bad
            // token should not make the whole file unreadable.
            Err(_) => Ok(String::from_utf8_lossy(raw).into_owned()),
        }
    }

    /// One value of type `ty`; arrays hold scalars or strings only.
    fn value(&mut self, ty: u32) -> std::result::Result<GgufValue, ParseError> {
        if ty == TYPE_ARRAY {
            let elem_type = self.u32()?;
            if elem_type == TYPE_ARRAY {
                return Err(self.err("nested arrays are not supported"));
            }
            let Some(min) = min_value_bytes(elem_type) else {
                return Err(self.err(format!(
                    "array element type id {elem_type} is not a GGUF value type (0-12)"
                )));
            };
            let count = self.u64()?;
            let left = self.file_remaining();
            if count.checked_mul(min).is_none_or(|n| n > left) {
                return Err(self.err(format!(
                    "array of {count} elements cannot fit: each takes at least {min} bytes and \
                     {left} bytes remain"
                )));
            }
            let budget = MAX_ARRAY_VALUES - self.array_values;
            if count > budget {
                return Err(self.err(format!(
                    "array of {count} elements is over the budget of {MAX_ARRAY_VALUES} array \
                     values in all metadata"
                )));
            }
            self.array_values += count;
            let mut values = Vec::with_capacity(self.capacity_for(count, min));
            for _ in 0..count {
                values.push(self.scalar(elem_type)?);
            }
            return Ok(GgufValue::Array(GgufArray { elem_type, values }));
        }
        if min_value_bytes(ty).is_none() {
            return Err(self.err(format!(
                "value type id {ty} is not a GGUF value type (0-12)"
            )));
        }
        self.scalar(ty)
    }

    /// A non-array value of a type already known to be valid.
    fn scalar(&mut self, ty: u32) -> std::result::Result<GgufValue, ParseError> {
        Ok(match ty {
            0 => GgufValue::U8(u8::from_le_bytes(self.array()?)),
            1 => GgufValue::I8(i8::from_le_bytes(self.array()?)),
            2 => GgufValue::U16(u16::from_le_bytes(self.array()?)),
            3 => GgufValue::I16(i16::from_le_bytes(self.array()?)),
            4 => GgufValue::U32(self.u32()?),
            5 => GgufValue::I32(i32::from_le_bytes(self.array()?)),
            6 => GgufValue::F32(f32::from_le_bytes(self.array()?)),
            7 => match self.array::<1>()? {
                [0] => GgufValue::Bool(false),
                [1] => GgufValue::Bool(true),
                [b] => return Err(self.err(format!("bool byte is {b}, not 0 or 1"))),
            },
            TYPE_STRING => GgufValue::String(self.string(MAX_STRING_LEN, "string")?),
            10 => GgufValue::U64(self.u64()?),
            11 => GgufValue::I64(i64::from_le_bytes(self.array()?)),
            12 => GgufValue::F64(f64::from_le_bytes(self.array()?)),
            _ => return Err(self.err(format!("value type id {ty} is not allowed here"))),
        })
    }
}

/// Fewest bytes a value of type `ty` takes (a string's length prefix); `None` for ids that are
/// not value types. Arrays are handled by the caller.
fn min_value_bytes(ty: u32) -> Option<u64> {
    Some(match ty {
        0 | 1 | 7 => 1,
        2 | 3 => 2,
        4..=6 => 4,
        TYPE_STRING | 10..=12 => 8,
        TYPE_ARRAY => 8 + 4,
        _ => return None,
    })
}

#[cfg(test)]
mod tests;
