//! Strict safetensors header reader: validates the framing, the JSON header and the tensor layout
//! without loading weights (the file is memory-mapped and only the header is copied out).
//!
//! Stricter than the official crate (0.8) on purpose: duplicate keys anywhere in the header,
//! unknown fields in a tensor entry, a `__metadata__` that is not a string→string map (`null`
//! included) and a header that does not start with `{` (the format README requires it; the crate
//! no longer checks) are refused, because two parsers can read such a header differently.
//! Everything the official crate refuses is refused too.

mod index;
mod json;
#[cfg(test)]
mod tests;

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::{Read, Seek, SeekFrom};
use std::ops::Range;
use std::path::{Path, PathBuf};

use crate::checkpoint::dtype::Dtype;
use crate::checkpoint::mmap::MappedFile;
use crate::error::{Error, Result};
use json::Json;

pub use index::{SafetensorsCheckpoint, ShardIndex, open_dir, open_file, read_index};

/// The official crate's `MAX_HEADER_SIZE`: a larger length prefix is refused before anything is
/// read, so a hostile prefix cannot make us allocate or scan gigabytes.
pub const MAX_HEADER_BYTES: u64 = 100_000_000;

/// The key that holds file-level metadata instead of a tensor.
const METADATA_KEY: &str = "__metadata__";

/// One tensor's header entry, validated.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorInfo {
    pub name: String,
    pub dtype: Dtype,
    pub shape: Vec<u64>,
    /// absolute byte range in the file
    pub data: Range<u64>,
}

impl TensorInfo {
    /// Number of elements: the product of the shape (1 for a scalar, 0 if any dim is 0).
    /// Saturates instead of overflowing for a hand-built `TensorInfo`; parsed ones never overflow.
    pub fn numel(&self) -> u64 {
        if self.shape.contains(&0) {
            return 0;
        }
        self.shape
            .iter()
            .fold(1u64, |acc, &d| acc.saturating_mul(d))
    }

    /// Bytes the tensor occupies in the file (for a parsed tensor, exactly numel × bits / 8).
    pub fn byte_len(&self) -> u64 {
        self.data.end.saturating_sub(self.data.start)
    }
}

/// One validated safetensors file's header.
#[derive(Debug, Clone)]
pub struct SafetensorsFile {
    pub path: PathBuf,
    pub file_size: u64,
    /// N, the JSON header's length in bytes (the data starts at 8 + N).
    pub header_len: u64,
    pub metadata: BTreeMap<String, String>,
    /// in file (offset) order
    pub tensors: Vec<TensorInfo>,
}

impl SafetensorsFile {
    pub fn get(&self, name: &str) -> Option<&TensorInfo> {
        self.tensors.iter().find(|t| t.name == name)
    }
}

/// Read and validate the header of one file (mmap; copies out only the header).
pub fn read_file(path: &Path) -> Result<SafetensorsFile> {
    let map = MappedFile::open(path)?;
    let bytes = map.bytes();
    parse_header(path, bytes, bytes.len() as u64)
}

/// Validate a header given its bytes: `prefix` = the first 8 + N bytes of the file (or more),
/// `file_size` the file's full size. Never looks at tensor data, so a remote reader can call it
/// with an HTTP range read of the header.
pub fn parse_header(path: &Path, prefix: &[u8], file_size: u64) -> Result<SafetensorsFile> {
    let bad = |subject: Option<&str>, rule: String| Error::format(path, subject, rule);

    let (header_len, text) = header_text(path, prefix, file_size)?;
    // Cannot overflow: header_text checked header_len <= MAX_HEADER_BYTES.
    let data_start = 8 + header_len;
    let root =
        json::parse(text).map_err(|e| bad(None, format!("header is not valid JSON: {e}")))?;
    let Json::Object(members) = root else {
        return Err(bad(None, "header is not a JSON object".to_owned()));
    };

    if let Some(duplicate) = header_duplicate(&members) {
        return Err(duplicate_error(path, duplicate));
    }

    let mut metadata = BTreeMap::new();
    let mut entries = Vec::with_capacity(members.len());
    for (name, value) in &members {
        if name == METADATA_KEY {
            metadata = check_metadata(path, value)?;
        } else {
            entries.push(check_entry(path, name, value)?);
        }
    }

    // Stable: entries at the same offsets (zero-size tensors) stay in header order.
    entries.sort_by_key(|e| (e.begin, e.end));
    let tensors = lay_out(path, &entries, data_start, file_size - data_start)?;

    Ok(SafetensorsFile {
        path: path.to_path_buf(),
        file_size,
        header_len,
        metadata,
        tensors,
    })
}

/// The framing: the 8-byte length prefix, checked against the limit, the file's size and the
/// bytes read, then the header itself as UTF-8 text that starts with `{`. Returns the header's
/// length N and its text.
fn header_text<'p>(path: &Path, prefix: &'p [u8], file_size: u64) -> Result<(u64, &'p str)> {
    let bad = |subject: Option<&str>, rule: String| Error::format(path, subject, rule);

    if file_size < 8 {
        return Err(bad(
            None,
            format!("file is {file_size} bytes, too short for the 8-byte header length"),
        ));
    }
    if prefix.len() as u64 > file_size {
        return Err(bad(
            None,
            format!(
                "{} bytes were read from a file said to hold {file_size}",
                prefix.len()
            ),
        ));
    }
    let Some(len_bytes) = prefix.first_chunk::<8>() else {
        return Err(bad(
            None,
            format!(
                "only {} bytes were read; the header length needs 8",
                prefix.len()
            ),
        ));
    };
    let header_len = u64::from_le_bytes(*len_bytes);
    if header_len > MAX_HEADER_BYTES {
        return Err(bad(
            None,
            format!(
                "header length {header_len} is over the {MAX_HEADER_BYTES}-byte limit for a \
                 safetensors header"
            ),
        ));
    }
    // Cannot overflow: header_len <= MAX_HEADER_BYTES.
    let data_start = 8 + header_len;
    if data_start > file_size {
        return Err(bad(
            None,
            format!("header length {header_len} runs past the end of the file ({file_size} bytes)"),
        ));
    }
    let header = usize::try_from(data_start)
        .ok()
        .and_then(|end| prefix.get(8..end));
    let Some(header) = header else {
        return Err(bad(
            None,
            format!(
                "the header is {header_len} bytes but only {} of them were read",
                prefix.len().saturating_sub(8)
            ),
        ));
    };
    let text = std::str::from_utf8(header).map_err(|e| {
        bad(
            None,
            format!(
                "header is not valid UTF-8 (byte {} of the header)",
                e.valid_up_to()
            ),
        )
    })?;
    if !text.starts_with('{') {
        return Err(bad(
            None,
            "header must start with `{` (a JSON object; only trailing padding is allowed)"
                .to_owned(),
        ));
    }
    Ok((header_len, text))
}

/// The error for a duplicate key, naming the member it is in (and where inside it).
fn duplicate_error(path: &Path, duplicate: Duplicate<'_>) -> Error {
    let bad = |subject: Option<&str>, rule: String| Error::format(path, subject, rule);
    match duplicate {
        Duplicate::TopLevel(key) => bad(
            Some(&shown(key)),
            "key appears twice in the header (parsers disagree on which one counts)".to_owned(),
        ),
        Duplicate::Inside {
            entry,
            path: at,
            key,
        } => {
            let at = if at.is_empty() {
                String::new()
            } else {
                format!(" at `{}`", shown(&at))
            };
            bad(
                Some(&shown(entry)),
                format!(
                    "duplicate key `{}`{at} inside this entry (parsers disagree on which one \
                     counts)",
                    shown(&key)
                ),
            )
        }
    }
}

/// The tensors in offset order, placed in the file: they must tile the data section of
/// `data_len` bytes (starting at `data_start`) exactly, with no gap, overlap or trailing byte.
fn lay_out(
    path: &Path,
    entries: &[Entry<'_>],
    data_start: u64,
    data_len: u64,
) -> Result<Vec<TensorInfo>> {
    let bad = |subject: Option<&str>, rule: String| Error::format(path, subject, rule);
    let mut tensors = Vec::with_capacity(entries.len());
    let mut previous: Option<&Entry> = None;
    for entry in entries {
        let expected = previous.map_or(0, |p| p.end);
        let subject = Some(shown(entry.name));
        let subject = subject.as_deref();
        if entry.begin > expected {
            let after = match previous {
                Some(p) => format!("`{}` ends at {}", shown(p.name), p.end),
                None => "the data section starts at 0".to_owned(),
            };
            return Err(bad(
                subject,
                format!(
                    "gap of {} bytes before data_offsets [{}, {}] ({after}); tensors must be \
                     contiguous",
                    entry.begin - expected,
                    entry.begin,
                    entry.end
                ),
            ));
        }
        if let Some(p) = previous
            && entry.begin < expected
        {
            return Err(bad(
                subject,
                format!(
                    "data_offsets [{}, {}] overlap `{}` at [{}, {}]",
                    entry.begin,
                    entry.end,
                    shown(p.name),
                    p.begin,
                    p.end
                ),
            ));
        }
        if entry.end > data_len {
            return Err(bad(
                subject,
                format!(
                    "data_offsets [{}, {}] run past the end of the file: the data section holds \
                     {data_len} bytes (truncated file?)",
                    entry.begin, entry.end
                ),
            ));
        }
        tensors.push(TensorInfo {
            name: entry.name.to_owned(),
            dtype: entry.dtype,
            shape: entry.shape.clone(),
            data: data_start + entry.begin..data_start + entry.end,
        });
        previous = Some(entry);
    }
    let used = previous.map_or(0, |p| p.end);
    if used != data_len {
        let last = previous.map(|p| shown(p.name));
        return Err(bad(
            last.as_deref(),
            format!(
                "{} trailing byte(s) after the last tensor (data ends at {used} of {data_len}); \
                 the file must end where its last tensor does",
                data_len - used
            ),
        ));
    }
    Ok(tensors)
}

enum Duplicate<'a> {
    /// Two top-level members (tensors, or `__metadata__`) with one key.
    TopLevel(&'a str),
    /// A key twice in one object inside the member `entry`, at `path` within it.
    Inside {
        entry: &'a str,
        path: String,
        key: String,
    },
}

/// The first duplicate key in the header, top level first so that a duplicated tensor is reported
/// as that rather than as whatever its entries hold.
fn header_duplicate(members: &[(String, Json)]) -> Option<Duplicate<'_>> {
    let mut seen = std::collections::HashSet::with_capacity(members.len());
    if let Some((key, _)) = members.iter().find(|(key, _)| !seen.insert(key.as_str())) {
        return Some(Duplicate::TopLevel(key));
    }
    members.iter().find_map(|(entry, value)| {
        json::find_duplicate(value).map(|(path, key)| Duplicate::Inside { entry, path, key })
    })
}

/// `__metadata__`: a string→string map and nothing else.
fn check_metadata(path: &Path, value: &Json) -> Result<BTreeMap<String, String>> {
    let Json::Object(members) = value else {
        return Err(Error::format(
            path,
            Some(METADATA_KEY),
            format!("must be an object of strings, found {}", value.describe()),
        ));
    };
    let mut metadata = BTreeMap::new();
    for (key, value) in members {
        let Json::Str(text) = value else {
            return Err(Error::format(
                path,
                Some(METADATA_KEY),
                format!(
                    "the value of `{}` must be a string, found {}",
                    shown(key),
                    value.describe()
                ),
            ));
        };
        metadata.insert(key.clone(), text.clone());
    }
    Ok(metadata)
}

/// A tensor entry that passed the per-entry rules; offsets are relative to the data section.
struct Entry<'a> {
    name: &'a str,
    dtype: Dtype,
    shape: Vec<u64>,
    begin: u64,
    end: u64,
}

/// One tensor entry: exactly `dtype`, `shape` and `data_offsets`, with a byte length that matches
/// the shape and dtype exactly.
fn check_entry<'a>(path: &Path, name: &'a str, value: &Json) -> Result<Entry<'a>> {
    let subject = shown(name);
    let bad = |rule: String| Error::format(path, Some(&subject), rule);
    let Json::Object(fields) = value else {
        return Err(bad(format!(
            "a tensor entry must be an object with dtype, shape and data_offsets, found {}",
            value.describe()
        )));
    };
    let (mut dtype, mut shape, mut offsets) = (None, None, None);
    for (field, value) in fields {
        match field.as_str() {
            "dtype" => dtype = Some(value),
            "shape" => shape = Some(value),
            "data_offsets" => offsets = Some(value),
            other => {
                return Err(bad(format!(
                    "unknown field `{}` (a tensor entry holds exactly dtype, shape and \
                     data_offsets)",
                    shown(other)
                )));
            }
        }
    }
    let missing = |field: &str| bad(format!("entry has no `{field}`"));
    let dtype = dtype.ok_or_else(|| missing("dtype"))?;
    let shape = shape.ok_or_else(|| missing("shape"))?;
    let offsets = offsets.ok_or_else(|| missing("data_offsets"))?;

    let dtype = match dtype {
        Json::Str(text) => {
            Dtype::from_name(text).ok_or_else(|| bad(format!("unknown dtype `{}`", shown(text))))?
        }
        other => {
            return Err(bad(format!(
                "dtype must be a string, found {}",
                other.describe()
            )));
        }
    };

    let Json::Array(dims) = shape else {
        return Err(bad(format!(
            "shape must be an array of non-negative integers, found {}",
            shape.describe()
        )));
    };
    let mut shape = Vec::with_capacity(dims.len());
    for (i, dim) in dims.iter().enumerate() {
        let Json::UInt(dim) = dim else {
            return Err(bad(format!(
                "shape[{i}] is {}; dims must be non-negative integers",
                dim.describe()
            )));
        };
        shape.push(*dim);
    }
    // Overflow is judged on the nonzero dims so that the verdict does not depend on where a zero
    // sits; the official crate multiplies left to right and refuses [2^40, 2^40, 0].
    let nonzero = shape
        .iter()
        .filter(|&&d| d != 0)
        .try_fold(1u64, |acc, &d| acc.checked_mul(d));
    let Some(nonzero) = nonzero else {
        return Err(bad(format!("shape {shape:?} has more than 2^64 elements")));
    };
    let numel = if shape.contains(&0) { 0 } else { nonzero };
    let Some(bits) = numel.checked_mul(dtype.bits()) else {
        return Err(bad(format!(
            "shape {shape:?} × {dtype} is more than 2^64 bits"
        )));
    };
    if bits % 8 != 0 {
        return Err(bad(format!(
            "shape {shape:?} × {dtype} is {bits} bits, which does not end on a byte boundary"
        )));
    }
    let needed = bits / 8;

    let pair = match offsets {
        Json::Array(pair) => match pair.as_slice() {
            [Json::UInt(begin), Json::UInt(end)] => Some((*begin, *end)),
            _ => None,
        },
        _ => None,
    };
    let Some((begin, end)) = pair else {
        return Err(bad(format!(
            "data_offsets must be [begin, end], two non-negative integers; found {}",
            offsets_text(offsets)
        )));
    };
    if begin > end {
        return Err(bad(format!(
            "data_offsets [{begin}, {end}] end before they begin"
        )));
    }
    let held = end - begin;
    if held != needed {
        return Err(bad(format!(
            "data_offsets [{begin}, {end}] hold {held} bytes but shape {shape:?} × {dtype} needs \
             {needed}"
        )));
    }
    Ok(Entry {
        name,
        dtype,
        shape,
        begin,
        end,
    })
}

/// A malformed `data_offsets` value for a message: arrays of scalars written out, the rest by kind.
fn offsets_text(value: &Json) -> String {
    match value {
        Json::Array(items) if items.len() <= 4 => {
            let items: Vec<String> = items.iter().map(Json::describe).collect();
            format!("[{}]", items.join(", "))
        }
        other => other.describe(),
    }
}

/// A name as it goes into a message: control and bidi-override characters escaped (tensor names
/// are untrusted and could rewrite a terminal line) and very long names cut short.
fn shown(name: &str) -> Cow<'_, str> {
    const MAX_CHARS: usize = 200;
    let risky =
        |c: char| c.is_control() || matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}');
    if name.len() <= MAX_CHARS && !name.chars().any(risky) {
        return Cow::Borrowed(name);
    }
    let mut out = String::new();
    for (i, c) in name.chars().enumerate() {
        if i == MAX_CHARS {
            out.push('…');
            break;
        }
        if risky(c) {
            out.extend(c.escape_unicode());
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

/// Read a small tensor's raw bytes (e.g. bitsandbytes' JSON quant-state tensor); refuse tensors
/// over `max_bytes`. Reads with plain file I/O rather than the map, so a file truncated since its
/// header was read gives an error instead of a fault.
pub fn read_tensor_bytes(file: &SafetensorsFile, name: &str, max_bytes: u64) -> Result<Vec<u8>> {
    let path = file.path.as_path();
    let Some(info) = file.get(name) else {
        return Err(Error::format(
            path,
            Some(&shown(name)),
            "no tensor of that name in this file",
        ));
    };
    let len = info.byte_len();
    if len > max_bytes {
        return Err(Error::format(
            path,
            Some(&shown(name)),
            format!("tensor is {len} bytes, over the {max_bytes}-byte limit for reading it whole"),
        ));
    }
    let mut handle = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
    let size = handle.metadata().map_err(|e| Error::io(path, e))?.len();
    if size != file.file_size {
        return Err(Error::format(
            path,
            None,
            format!(
                "file changed since its header was read ({} bytes then, {size} now)",
                file.file_size
            ),
        ));
    }
    let len = usize::try_from(len)
        .map_err(|_| Error::format(path, Some(&shown(name)), "tensor does not fit in memory"))?;
    let mut bytes = vec![0u8; len];
    handle
        .seek(SeekFrom::Start(info.data.start))
        .map_err(|e| Error::io(path, e))?;
    handle
        .read_exact(&mut bytes)
        .map_err(|e| Error::io(path, e))?;
    Ok(bytes)
}

/// Serialize tensors into a valid safetensors file (header padded with spaces to a multiple of 8,
/// tensors contiguous in the given order). Used by tests across the crate to generate fixtures in
/// code, and later to write logit dumps.
///
/// The offsets follow the bytes given: data of the wrong length for its shape and dtype (or a
/// name given twice) makes a file that [`read_file`] refuses, which tests can use on purpose.
pub fn serialize(
    tensors: &[(&str, Dtype, &[u64], &[u8])],
    metadata: &BTreeMap<String, String>,
) -> Vec<u8> {
    let mut header = String::from("{");
    if !metadata.is_empty() {
        header.push_str("\"__metadata__\":{");
        for (i, (key, value)) in metadata.iter().enumerate() {
            if i > 0 {
                header.push(',');
            }
            push_json_string(&mut header, key);
            header.push(':');
            push_json_string(&mut header, value);
        }
        header.push('}');
    }
    let mut offset = 0u64;
    for (i, (name, dtype, shape, data)) in tensors.iter().enumerate() {
        if i > 0 || !metadata.is_empty() {
            header.push(',');
        }
        let end = offset + data.len() as u64;
        push_json_string(&mut header, name);
        let dims: Vec<String> = shape.iter().map(u64::to_string).collect();
        // Writing to a String cannot fail.
        let _ = write!(
            header,
            ":{{\"dtype\":\"{dtype}\",\"shape\":[{}],\"data_offsets\":[{offset},{end}]}}",
            dims.join(",")
        );
        offset = end;
    }
    header.push('}');
    while header.len() % 8 != 0 {
        header.push(' ');
    }
    let data_len: usize = tensors.iter().map(|t| t.3.len()).sum();
    let mut out = Vec::with_capacity(8 + header.len() + data_len);
    out.extend_from_slice(&(header.len() as u64).to_le_bytes());
    out.extend_from_slice(header.as_bytes());
    for (_, _, _, data) in tensors {
        out.extend_from_slice(data);
    }
    out
}

/// Appends `text` as a JSON string literal.
fn push_json_string(out: &mut String, text: &str) {
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if u32::from(c) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    out.push('"');
}
