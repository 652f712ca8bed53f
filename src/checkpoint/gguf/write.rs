//! A GGUF v3 writer, so tests across the crate can build fixtures in code instead of committing
//! binary files.

use super::{DEFAULT_ALIGNMENT, GgmlType, GgufValue};

/// Serialize a little-endian GGUF v3 file laid out as ggml's writer does: header, metadata in the
/// given order, tensor infos, zero padding to `alignment`, then each tensor's data (written as
/// given) padded to `alignment`, offsets assigned in order.
///
/// `general.alignment` is written as the caller gives it; if absent and `alignment` is not the
/// default 32, it is added (as a u32) so the file reads back with the layout it was written with.
/// Dims are written as given, without checking them against the type or the data's length, so
/// tests can write broken files too.
///
/// # Panics
///
/// If `alignment` is 0 (a bug in the calling test, not input).
pub fn serialize(
    metadata: &[(&str, GgufValue)],
    tensors: &[(&str, GgmlType, &[u64], &[u8])],
    alignment: u64,
) -> Vec<u8> {
    assert!(alignment > 0, "alignment must be positive");
    let pad = |n: u64| n.div_ceil(alignment) * alignment;
    let add_alignment =
        alignment != DEFAULT_ALIGNMENT && !metadata.iter().any(|(k, _)| *k == "general.alignment");
    // Readers accept only a u32; a wider alignment is truncated (the calling test's choice).
    let extra = add_alignment.then_some(("general.alignment", GgufValue::U32(alignment as u32)));

    let mut out = Vec::new();
    out.extend_from_slice(b"GGUF");
    out.extend_from_slice(&3u32.to_le_bytes());
    out.extend_from_slice(&(tensors.len() as u64).to_le_bytes());
    let kv_count = metadata.len() + usize::from(extra.is_some());
    out.extend_from_slice(&(kv_count as u64).to_le_bytes());
    for (key, value) in metadata
        .iter()
        .map(|(k, v)| (*k, v))
        .chain(extra.iter().map(|(k, v)| (*k, v)))
    {
        write_string(&mut out, key);
        out.extend_from_slice(&value.type_id().to_le_bytes());
        write_payload(&mut out, value);
    }

    let mut offset = 0u64;
    for (name, ty, dims, data) in tensors {
        write_string(&mut out, name);
        out.extend_from_slice(&(dims.len() as u32).to_le_bytes());
        for d in *dims {
            out.extend_from_slice(&d.to_le_bytes());
        }
        out.extend_from_slice(&ty.id().to_le_bytes());
        out.extend_from_slice(&offset.to_le_bytes());
        offset += pad(data.len() as u64);
    }

    out.resize(pad(out.len() as u64) as usize, 0);
    for (_, _, _, data) in tensors {
        out.extend_from_slice(data);
        out.resize(pad(out.len() as u64) as usize, 0);
    }
    out
}

fn write_string(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

/// The value without its type id (array elements carry none).
fn write_payload(out: &mut Vec<u8>, value: &GgufValue) {
    match value {
        GgufValue::U8(v) => out.extend_from_slice(&v.to_le_bytes()),
        GgufValue::I8(v) => out.extend_from_slice(&v.to_le_bytes()),
        GgufValue::U16(v) => out.extend_from_slice(&v.to_le_bytes()),
        GgufValue::I16(v) => out.extend_from_slice(&v.to_le_bytes()),
        GgufValue::U32(v) => out.extend_from_slice(&v.to_le_bytes()),
        GgufValue::I32(v) => out.extend_from_slice(&v.to_le_bytes()),
        GgufValue::F32(v) => out.extend_from_slice(&v.to_le_bytes()),
        GgufValue::Bool(v) => out.push(u8::from(*v)),
        GgufValue::String(s) => write_string(out, s),
        GgufValue::Array(a) => {
            out.extend_from_slice(&a.elem_type.to_le_bytes());
            out.extend_from_slice(&(a.values.len() as u64).to_le_bytes());
            for v in &a.values {
                write_payload(out, v);
            }
        }
        GgufValue::U64(v) => out.extend_from_slice(&v.to_le_bytes()),
        GgufValue::I64(v) => out.extend_from_slice(&v.to_le_bytes()),
        GgufValue::F64(v) => out.extend_from_slice(&v.to_le_bytes()),
    }
}
