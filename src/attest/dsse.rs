//! DSSE v1 (Dead Simple Signing Envelope): what exactly is signed, and the envelope around it.
//!
//! The signature covers `PAE(payloadType, payload)`, never the JSON of the envelope, so the
//! envelope can be re-serialized, re-indented or co-signed without invalidating anything, and the
//! payload type is authenticated together with the bytes (a statement cannot be replayed as a
//! different kind of document).

use std::path::Path;

use base64::Engine;
use base64::alphabet;
use base64::engine::general_purpose::STANDARD;
use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};
use ed25519_dalek::{Signer, SigningKey};
use serde_json::{Value, json};

use super::keys::keyid;
use crate::error::{Error, Result};

/// The pre-authentication encoding: `"DSSEv1" SP LEN(type) SP type SP LEN(body) SP body`, with
/// LEN the decimal byte length (no leading zeros) and SP one space.
///
/// Length-prefixing both parts is what makes the encoding unambiguous: no (type, body) pair can be
/// shifted into another that encodes to the same bytes.
pub fn pae(payload_type: &str, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(payload_type.len() + payload.len() + 32);
    out.extend_from_slice(b"DSSEv1 ");
    out.extend_from_slice(payload_type.len().to_string().as_bytes());
    out.push(b' ');
    out.extend_from_slice(payload_type.as_bytes());
    out.push(b' ');
    out.extend_from_slice(payload.len().to_string().as_bytes());
    out.push(b' ');
    out.extend_from_slice(payload);
    out
}

/// One signature entry: `{"keyid": keyid(public key), "sig": base64(Ed25519(PAE))}`.
fn signature_entry(payload: &[u8], payload_type: &str, key: &SigningKey) -> Value {
    let signature = key.sign(&pae(payload_type, payload));
    json!({
        "keyid": keyid(&key.verifying_key()),
        "sig": STANDARD.encode(signature.to_bytes()),
    })
}

/// Sign `payload` into a new envelope
/// `{"payload": base64, "payloadType": …, "signatures": [{"keyid", "sig"}]}`.
///
/// Standard padded base64 is written (what securesystemslib and most tools emit); readers accept
/// both alphabets, as DSSE requires. The keyid is securesystemslib's default ([`keyid`]), so its
/// `Envelope.verify` finds the signature.
pub fn sign_envelope(payload: &[u8], payload_type: &str, key: &SigningKey) -> Value {
    json!({
        "payload": STANDARD.encode(payload),
        "payloadType": payload_type,
        "signatures": [signature_entry(payload, payload_type, key)],
    })
}

/// Co-sign: add `key`'s signature over the envelope's payload and type.
///
/// An existing entry with the same keyid is replaced rather than duplicated (Ed25519 is
/// deterministic, so the signature is the same one): securesystemslib refuses envelopes that hold
/// two signatures with one keyid, and DSSE thresholds count keys, not entries. The payload is
/// decoded and signed as it is; nothing is re-encoded.
///
/// Errors name the file as `<envelope>`, since the value may not come from a file; a caller that
/// read it from one can set [`Error::file`].
pub fn add_signature(envelope: &mut Value, key: &SigningKey) -> Result<()> {
    let file = Path::new("<envelope>");
    let parts = EnvelopeParts::from_value(file, envelope)?;
    let entry = signature_entry(&parts.payload, &parts.payload_type, key);
    let id = keyid(&key.verifying_key());
    let signatures = envelope
        .get_mut("signatures")
        .and_then(Value::as_array_mut)
        .expect("checked by EnvelopeParts::from_value");
    signatures.retain(|s| s.get("keyid").and_then(Value::as_str) != Some(id.as_str()));
    signatures.push(entry);
    Ok(())
}

/// One signature entry as read: its keyid (empty when absent) and the decoded signature bytes.
#[derive(Debug, Clone)]
pub struct SignatureEntry {
    pub keyid: String,
    pub sig: Vec<u8>,
}

/// An envelope's fields, decoded and checked for shape (not for signatures).
#[derive(Debug, Clone)]
pub struct EnvelopeParts {
    pub payload: Vec<u8>,
    pub payload_type: String,
    pub signatures: Vec<SignatureEntry>,
}

impl EnvelopeParts {
    /// Check the shape DSSE requires: `payload`, `payloadType` and `signatures` present (even if
    /// empty), each signature an object with a `sig`; `keyid` optional. Unknown fields are
    /// ignored, as the spec says. Errors name `file` and the field.
    pub fn from_value(file: &Path, envelope: &Value) -> Result<Self> {
        let object = envelope.as_object().ok_or_else(|| {
            Error::format(
                file,
                None,
                "a DSSE envelope must be a JSON object with `payload`, `payloadType` and \
                 `signatures`",
            )
        })?;
        let field = |name: &str| {
            object.get(name).ok_or_else(|| {
                Error::format(
                    file,
                    Some(name),
                    "missing (a DSSE envelope requires `payload`, `payloadType` and `signatures`)",
                )
            })
        };
        let string = |name: &str| -> Result<&str> {
            field(name)?
                .as_str()
                .ok_or_else(|| Error::format(file, Some(name), "must be a string"))
        };
        let payload = decode_base64(string("payload")?)
            .map_err(|e| Error::format(file, Some("payload"), e))?;
        let payload_type = string("payloadType")?.to_owned();
        let entries = field("signatures")?
            .as_array()
            .ok_or_else(|| Error::format(file, Some("signatures"), "must be an array"))?;
        let mut signatures = Vec::with_capacity(entries.len());
        for (i, entry) in entries.iter().enumerate() {
            let at = |f: &str| format!("signatures[{i}]{f}");
            let entry = entry
                .as_object()
                .ok_or_else(|| Error::format(file, Some(&at("")), "must be an object"))?;
            let keyid = match entry.get("keyid") {
                None | Some(Value::Null) => String::new(),
                Some(Value::String(s)) => s.clone(),
                Some(_) => {
                    return Err(Error::format(file, Some(&at(".keyid")), "must be a string"));
                }
            };
            let sig = entry
                .get("sig")
                .ok_or_else(|| {
                    Error::format(
                        file,
                        Some(&at(".sig")),
                        "missing (every signature needs one)",
                    )
                })?
                .as_str()
                .ok_or_else(|| Error::format(file, Some(&at(".sig")), "must be a string"))?;
            let sig = decode_base64(sig).map_err(|e| Error::format(file, Some(&at(".sig")), e))?;
            signatures.push(SignatureEntry { keyid, sig });
        }
        Ok(Self {
            payload,
            payload_type,
            signatures,
        })
    }
}

const LENIENT: GeneralPurposeConfig =
    GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent);
const STANDARD_LENIENT: GeneralPurpose = GeneralPurpose::new(&alphabet::STANDARD, LENIENT);
const URL_SAFE_LENIENT: GeneralPurpose = GeneralPurpose::new(&alphabet::URL_SAFE, LENIENT);

/// Decode DSSE base64: the standard or the URL-safe alphabet, padded or not (the spec requires
/// verifiers to accept both alphabets, and unpadded forms are common in URL-safe producers).
/// Mixing the alphabets' distinct characters (`+/` with `-_`) is refused.
pub fn decode_base64(text: &str) -> std::result::Result<Vec<u8>, String> {
    let engine = if text.contains(['-', '_']) {
        &URL_SAFE_LENIENT
    } else {
        &STANDARD_LENIENT
    };
    engine
        .decode(text)
        .map_err(|e| format!("not valid base64 (standard or URL-safe): {e}"))
}
