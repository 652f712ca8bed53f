//! Tests of the attestation cryptography against published vectors and independent encodings.

use std::path::{Path, PathBuf};

use base64::Engine;
use base64::engine::general_purpose::{STANDARD, STANDARD_NO_PAD, URL_SAFE_NO_PAD};
use ed25519_dalek::{Signer, SigningKey, VerifyingKey};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use super::keys::{PRIVATE_KEY_FILE, PUBLIC_KEY_FILE, key_dir_from, load_or_create};
use super::verify::what;
use super::*;
use crate::checkpoint::hash::{HashOptions, hash_path};
use crate::digest::hex;

/// RFC 8032 section 7.1, TEST 1.
const RFC_SECRET: &str = "9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60";
const RFC_PUBLIC: &str = "d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a";
const RFC_EMPTY_SIG: &str = "e5564300c360ac729086e2cc806e828a84877f1eb8e5d974d873e065224901555fb8821590a33bacc61e39701cf9b46bd25bf5f0595bbe24655141438e7a100b";
/// securesystemslib 1.6's `SSlibKey.from_crypto(...).keyid` for the RFC 8032 public key.
const RFC_SSLIB_KEYID: &str = "74c181c7ad8a0855d4b55e44d2ba87aabdddb196832571f15f92fece332e4916";

/// The RFC 8032 key as OpenSSL 3.0 writes it (`openssl pkey`), an encoder independent of ours.
const RFC_PRIVATE_PEM: &str = "-----BEGIN PRIVATE KEY-----
MC4CAQAwBQYDK2VwBCIEIJ1hsZ3v/VpguoRK9JLsLMREScVpezJpGXA7rAMcrn9g
-----END PRIVATE KEY-----
";
const RFC_PUBLIC_PEM: &str = "-----BEGIN PUBLIC KEY-----
MCowBQYDK2VwAyEA11qYAYKxCrfVS/7TyWQHOg7hcvPapiMlrwIaaPcHURo=
-----END PUBLIC KEY-----
";

/// Real keys of other algorithms from `openssl genpkey` (throwaway, test-only).
const EC_P256_PRIVATE_PEM: &str = "-----BEGIN PRIVATE KEY-----
MIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQg6e+4CBBT2Zwntc6O
0RIBrPmRODrclSxPNmXqKAJ8ij6hRANCAAS0bfTmtsY+PH8GWNpKyauuirFu38P+
gMZ6aQ5ZoDsQBiTd9nY+1F8MlXGsExbYEiBa6+CCtC5KhARgW91n+9Mu
-----END PRIVATE KEY-----
";
const EC_P256_PUBLIC_PEM: &str = "-----BEGIN PUBLIC KEY-----
MFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAEtG305rbGPjx/BljaSsmrroqxbt/D
/oDGemkOWaA7EAYk3fZ2PtRfDJVxrBMW2BIgWuvggrQuSoQEYFvdZ/vTLg==
-----END PUBLIC KEY-----
";
const RSA_512_PRIVATE_PEM: &str = "-----BEGIN PRIVATE KEY-----
MIIBVQIBADANBgkqhkiG9w0BAQEFAASCAT8wggE7AgEAAkEAsSB6wGzvqaHAaq4y
UGNoPjM6S1dZ/i15OhUbpZ7TevrxsTTuuse0EFqGgAKhokrSE57eI2PmpFPArcVs
Z9p/KQIDAQABAkEAplytLmKizx5fTVODakGTvSf8TpsiqTsoq0b8CpicZNoRW4S7
ezzPOl8wp34qtB3BOyCQlP3LfTRXVyyG/vZxAQIhANosV9lOFNreIE9DTL5xts0g
q7H1T4pnG5RY+OdMkLzxAiEAz9ZJgvz0ap8XIGj1U8eYmM3pQCLwt1MFdwlMQdml
RbkCICKrFTKUs7+ruFqgCRviGfgyjtXyczc89yb1lGe8xOshAiEAj0afOMCe0h3I
OJyCevX+2WAh6wfrP8Xo3422VzLt/2kCIDU0zhYqaWHXVbkkBB5j1Mhwx12Q4hXN
mKQvyWO4Ljuj
-----END PRIVATE KEY-----
";
const ED448_PRIVATE_PEM: &str = "-----BEGIN PRIVATE KEY-----
MEcCAQAwBQYDK2VxBDsEOYZHA2hUeH50XgZB1MabSoDR+Menbfwqt2lEKyCgxVFf
OB92tVYmy0Uq7YJXy66nXKqBWu5HaOkQhQ==
-----END PRIVATE KEY-----
";

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

fn rfc_key() -> SigningKey {
    SigningKey::from_bytes(&unhex(RFC_SECRET).try_into().unwrap())
}

fn write(dir: &Path, name: &str, contents: impl AsRef<[u8]>) -> PathBuf {
    let path = dir.join(name);
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).unwrap();
    }
    std::fs::write(&path, contents).unwrap();
    path
}

fn sample_statement() -> Statement {
    statement(
        &[
            Subject {
                name: "model.safetensors".into(),
                sha256: "ab".repeat(32),
            },
            Subject {
                name: "sub/config.json".into(),
                sha256: "cd".repeat(32),
            },
        ],
        json!({ "note": "??>>??~~>>??~~ a payload whose base64 has + and / in it ??>>" }),
    )
}

fn signed(key: &SigningKey) -> (Vec<u8>, Value) {
    let payload = serde_json::to_vec(&sample_statement()).unwrap();
    let envelope = sign_envelope(&payload, PAYLOAD_TYPE, key);
    (payload, envelope)
}

fn verify_value(dir: &Path, envelope: &Value, key: &VerifyingKey) -> crate::Result<Outcome> {
    let path = write(
        dir,
        "envelope.json",
        serde_json::to_vec_pretty(envelope).unwrap(),
    );
    verify_envelope(&path, key)
}

fn failed(outcome: Outcome) -> Vec<Mismatch> {
    match outcome {
        Outcome::Failed(m) => m,
        Outcome::Verified(v) => panic!("expected a failure, verified by {}", v.keyid),
    }
}

fn verified(outcome: Outcome) -> Verified {
    match outcome {
        Outcome::Verified(v) => *v,
        Outcome::Failed(m) => panic!("expected verification, failed: {m:?}"),
    }
}

fn err_mentions(result: crate::Result<impl std::fmt::Debug>, file: &Path, needle: &str) {
    let e = result.expect_err("expected an error");
    assert_eq!(e.file, file, "{e}");
    assert!(
        e.to_string().contains(needle),
        "`{e}` should mention `{needle}`"
    );
}

#[test]
fn pae_matches_the_dsse_test_vector() {
    assert_eq!(
        pae("http://example.com/HelloWorld", b"hello world"),
        b"DSSEv1 29 http://example.com/HelloWorld 11 hello world"
    );
    assert_eq!(pae("", b""), b"DSSEv1 0  0 ");
    // Byte lengths, not character counts.
    assert_eq!(pae("t", "é".as_bytes()), "DSSEv1 1 t 2 é".as_bytes());
}

#[test]
fn keyid_is_securesystemslibs_default() {
    let key = rfc_key().verifying_key();
    assert_eq!(hex(key.as_bytes()), RFC_PUBLIC);
    let canonical = format!(
        r#"{{"keytype":"ed25519","keyval":{{"public":"{RFC_PUBLIC}"}},"scheme":"ed25519"}}"#
    );
    let by_hand = hex(&Sha256::digest(canonical.as_bytes()));
    assert_eq!(keyid(&key), by_hand);
    assert_eq!(keyid(&key), RFC_SSLIB_KEYID);
}

#[test]
fn signatures_match_rfc_8032() {
    let key = rfc_key();
    assert_eq!(hex(&key.sign(b"").to_bytes()), RFC_EMPTY_SIG);
}

#[test]
fn pem_encoding_matches_openssl() {
    let key = rfc_key();
    assert_eq!(keys::private_key_pem(&key).as_str(), RFC_PRIVATE_PEM);
    assert_eq!(public_key_pem(&key.verifying_key()), RFC_PUBLIC_PEM);
    let dir = tempfile::tempdir().unwrap();
    let private = write(dir.path(), "k.key", RFC_PRIVATE_PEM);
    let public = write(dir.path(), "k.pub", RFC_PUBLIC_PEM);
    assert_eq!(read_signing_key(&private).unwrap(), key);
    assert_eq!(read_verifying_key(&public).unwrap(), key.verifying_key());
    // PKCS#8 v2 (with the public key, as `ring` writes it) and text around the block are read.
    let v2 = ed25519_dalek::pkcs8::EncodePrivateKey::to_pkcs8_pem(
        &key,
        ed25519_dalek::pkcs8::spki::der::pem::LineEnding::CRLF,
    )
    .unwrap();
    let v2 = write(dir.path(), "v2.key", format!("comment\r\n{}", v2.as_str()));
    assert_eq!(read_signing_key(&v2).unwrap(), key);
}

#[test]
fn round_trip_generate_write_read_sign_verify() {
    let dir = tempfile::tempdir().unwrap();
    let keydir = dir.path().join("new/keys");
    let key = generate_key().unwrap();
    assert_ne!(key, generate_key().unwrap());
    let (private, public) = write_keypair(&keydir, &key).unwrap();
    assert_eq!(private, keydir.join(PRIVATE_KEY_FILE));
    assert_eq!(public, keydir.join(PUBLIC_KEY_FILE));
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&private).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600, "private key mode {mode:o}");
        let mode = std::fs::metadata(&keydir).unwrap().permissions().mode();
        assert_eq!(mode & 0o077, 0, "key dir mode {mode:o}");
    }
    let read = read_signing_key(&private).unwrap();
    assert_eq!(read, key);
    let public_key = read_verifying_key(&public).unwrap();
    assert_eq!(public_key, key.verifying_key());

    let (payload, envelope) = signed(&read);
    assert_eq!(envelope["payloadType"], PAYLOAD_TYPE);
    assert_eq!(envelope["signatures"][0]["keyid"], keyid(&public_key));
    let v = verified(verify_value(dir.path(), &envelope, &public_key).unwrap());
    assert_eq!(v.keyid, keyid(&public_key));
    assert_eq!(
        v.statement.to_value(),
        serde_json::from_slice::<Value>(&payload).unwrap()
    );
    assert_eq!(v.statement, sample_statement());
    assert_eq!(v.statement.statement_type, STATEMENT_TYPE);
    assert_eq!(v.statement.predicate_type, PREDICATE_TYPE);

    // Never overwritten, and the error names the file.
    err_mentions(
        write_keypair(&keydir, &generate_key().unwrap()),
        &private,
        "refusing to overwrite",
    );
    assert_eq!(read_signing_key(&private).unwrap(), key);
}

#[test]
fn default_key_is_created_once_then_loaded() {
    let dir = tempfile::tempdir().unwrap();
    let keydir = dir.path().join("cfg");
    let (key, path, created) = load_or_create(&keydir).unwrap();
    assert!(created);
    assert_eq!(path, keydir.join(PRIVATE_KEY_FILE));
    let (again, path2, created2) = load_or_create(&keydir).unwrap();
    assert!(!created2);
    assert_eq!(path2, path);
    assert_eq!(again, key);
}

#[test]
fn default_key_dir_rules() {
    let os = |s: &str| Some(std::ffi::OsString::from(s));
    assert_eq!(
        key_dir_from(os("/c"), os("/x"), os("/h")),
        Some(PathBuf::from("/c"))
    );
    assert_eq!(
        key_dir_from(None, os("/x"), os("/h")),
        Some(PathBuf::from("/x/cardproof"))
    );
    assert_eq!(
        key_dir_from(os(""), os("relative"), os("/h")),
        Some(PathBuf::from("/h/.config/cardproof"))
    );
    assert_eq!(key_dir_from(None, None, None), None);
}

#[test]
fn tampered_payload_fails_the_signature() {
    let dir = tempfile::tempdir().unwrap();
    let key = rfc_key();
    let (mut payload, mut envelope) = signed(&key);
    // One byte, still valid JSON: "ab…" becomes "bb…" in the first digest.
    let at = payload.windows(2).position(|w| w == b"ab").unwrap();
    payload[at] = b'b';
    envelope["payload"] = json!(STANDARD.encode(&payload));
    let m = failed(verify_value(dir.path(), &envelope, &key.verifying_key()).unwrap());
    assert_eq!(m.len(), 1);
    assert_eq!(m[0].what, what::SIGNATURE, "{m:?}");

    // The payload type is signed too.
    let (_, mut envelope) = signed(&key);
    let mut entry = envelope["signatures"][0].clone();
    let payload = STANDARD
        .decode(envelope["payload"].as_str().unwrap())
        .unwrap();
    let other = key.sign(&pae("application/vnd.in-toto.other+json", &payload));
    entry["sig"] = json!(STANDARD.encode(other.to_bytes()));
    envelope["signatures"] = json!([entry]);
    let m = failed(verify_value(dir.path(), &envelope, &key.verifying_key()).unwrap());
    assert_eq!(m[0].what, what::SIGNATURE);
}

#[test]
fn tampered_signature_fails() {
    let dir = tempfile::tempdir().unwrap();
    let key = rfc_key();
    let (_, mut envelope) = signed(&key);
    let mut sig = STANDARD
        .decode(envelope["signatures"][0]["sig"].as_str().unwrap())
        .unwrap();
    sig[5] ^= 1;
    envelope["signatures"][0]["sig"] = json!(STANDARD.encode(&sig));
    let m = failed(verify_value(dir.path(), &envelope, &key.verifying_key()).unwrap());
    assert_eq!(m.len(), 1);
    assert_eq!(m[0].what, what::SIGNATURE);

    // A signature of the wrong length is a failed signature, not a malformed envelope (another
    // algorithm's co-signature may sit next to ours).
    envelope["signatures"][0]["sig"] = json!(STANDARD.encode([1u8; 70]));
    let m = failed(verify_value(dir.path(), &envelope, &key.verifying_key()).unwrap());
    assert_eq!(m[0].what, what::SIGNATURE);
    assert!(m[0].detail.contains("70 bytes"), "{m:?}");
}

#[test]
fn keyid_of_another_key_fails() {
    let dir = tempfile::tempdir().unwrap();
    let key = rfc_key();
    let other = generate_key().unwrap();
    let (_, mut envelope) = signed(&key);
    envelope["signatures"][0]["keyid"] = json!(keyid(&other.verifying_key()));
    let m = failed(verify_value(dir.path(), &envelope, &key.verifying_key()).unwrap());
    assert_eq!(m.len(), 1);
    assert_eq!(m[0].what, what::KEYID);
    assert!(m[0].detail.contains("belongs to another key"), "{m:?}");

    // An empty or absent keyid is allowed (DSSE makes it optional).
    envelope["signatures"][0]["keyid"] = json!("");
    verified(verify_value(dir.path(), &envelope, &key.verifying_key()).unwrap());
    envelope["signatures"][0]
        .as_object_mut()
        .unwrap()
        .remove("keyid");
    verified(verify_value(dir.path(), &envelope, &key.verifying_key()).unwrap());
}

#[test]
fn a_different_key_fails() {
    let dir = tempfile::tempdir().unwrap();
    let (_, mut envelope) = signed(&rfc_key());
    let other = generate_key().unwrap().verifying_key();
    let m = failed(verify_value(dir.path(), &envelope, &other).unwrap());
    assert_eq!(m.len(), 1);
    assert_eq!(m[0].what, what::KEYID, "{m:?}");
    // Without the keyid hint, the signature itself is what fails.
    envelope["signatures"][0]["keyid"] = json!("");
    let m = failed(verify_value(dir.path(), &envelope, &other).unwrap());
    assert_eq!(m[0].what, what::SIGNATURE, "{m:?}");
}

#[test]
fn co_signed_envelopes_pass_with_either_key() {
    let dir = tempfile::tempdir().unwrap();
    let first = rfc_key();
    let second = generate_key().unwrap();
    let (_, mut envelope) = signed(&first);
    add_signature(&mut envelope, &second).unwrap();
    // Signing again with a key already present replaces its entry, never duplicates it.
    add_signature(&mut envelope, &second).unwrap();
    assert_eq!(envelope["signatures"].as_array().unwrap().len(), 2);
    for key in [&first, &second] {
        let v = verified(verify_value(dir.path(), &envelope, &key.verifying_key()).unwrap());
        assert_eq!(v.keyid, keyid(&key.verifying_key()));
    }
    let stranger = generate_key().unwrap().verifying_key();
    let m = failed(verify_value(dir.path(), &envelope, &stranger).unwrap());
    assert_eq!(m.len(), 2, "one mismatch per signature: {m:?}");

    let mut not_an_envelope = json!({ "payload": "", "payloadType": PAYLOAD_TYPE });
    err_mentions(
        add_signature(&mut not_an_envelope, &first),
        Path::new("<envelope>"),
        "signatures",
    );
}

#[test]
fn url_safe_and_unpadded_base64_are_accepted() {
    let dir = tempfile::tempdir().unwrap();
    let key = rfc_key();
    let (payload, envelope) = signed(&key);
    let sig = STANDARD
        .decode(envelope["signatures"][0]["sig"].as_str().unwrap())
        .unwrap();
    let url = json!({
        "payload": URL_SAFE_NO_PAD.encode(&payload),
        "payloadType": PAYLOAD_TYPE,
        "signatures": [{ "keyid": keyid(&key.verifying_key()), "sig": URL_SAFE_NO_PAD.encode(&sig) }],
    });
    assert!(
        url["payload"].as_str().unwrap().contains(['-', '_']),
        "the test payload must exercise the URL-safe alphabet"
    );
    verified(verify_value(dir.path(), &url, &key.verifying_key()).unwrap());
    let unpadded = json!({
        "payload": STANDARD_NO_PAD.encode(&payload),
        "payloadType": PAYLOAD_TYPE,
        "signatures": [{ "sig": STANDARD_NO_PAD.encode(&sig) }],
    });
    verified(verify_value(dir.path(), &unpadded, &key.verifying_key()).unwrap());
}

#[test]
fn no_signatures_fails() {
    let dir = tempfile::tempdir().unwrap();
    let (_, mut envelope) = signed(&rfc_key());
    envelope["signatures"] = json!([]);
    let m = failed(verify_value(dir.path(), &envelope, &rfc_key().verifying_key()).unwrap());
    assert_eq!(m[0].what, what::SIGNATURE);
}

#[test]
fn bad_key_files_are_errors_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let cases: &[(&str, &str, &str)] = &[
        ("notpem.key", "just some text\n", "not a PEM key file"),
        (
            "corrupt.key",
            "-----BEGIN PRIVATE KEY-----\nMC4CAQAw!!!!YDK2VwBCIEIJ1hsZ3v\n-----END PRIVATE KEY-----\n",
            "corrupt base64",
        ),
        (
            "truncated.key",
            "-----BEGIN PRIVATE KEY-----\nMC4CAQAwBQYDK2VwBCIE\n-----END PRIVATE KEY-----\n",
            "not valid PKCS#8 DER",
        ),
        (
            "unclosed.key",
            "-----BEGIN PRIVATE KEY-----\nMC4CAQAwBQYDK2VwBCIE\n",
            "no `-----END PRIVATE KEY-----` line",
        ),
        ("ec.key", EC_P256_PRIVATE_PEM, "EC (P-256) private key"),
        ("rsa.key", RSA_512_PRIVATE_PEM, "RSA private key"),
        ("ed448.key", ED448_PRIVATE_PEM, "Ed448 private key"),
        ("public.key", RFC_PUBLIC_PEM, "this is a public key"),
        (
            "pkcs1.key",
            "-----BEGIN RSA PRIVATE KEY-----\nMIIBOgIBAAJBAK==\n-----END RSA PRIVATE KEY-----\n",
            "RSA private key (PKCS#1)",
        ),
        (
            "sec1.key",
            "-----BEGIN EC PARAMETERS-----\nBggqhkjOPQMBBw==\n-----END EC PARAMETERS-----\n\
             -----BEGIN EC PRIVATE KEY-----\nMHcCAQEE\n-----END EC PRIVATE KEY-----\n",
            "EC private key (SEC1)",
        ),
        (
            "encrypted.key",
            "-----BEGIN ENCRYPTED PRIVATE KEY-----\nMIIB\n-----END ENCRYPTED PRIVATE KEY-----\n",
            "password-encrypted",
        ),
        (
            "legacy.key",
            "-----BEGIN RSA PRIVATE KEY-----\nProc-Type: 4,ENCRYPTED\nDEK-Info: AES-128-CBC,00\n\nMIIB\n-----END RSA PRIVATE KEY-----\n",
            "legacy encrypted key",
        ),
        (
            "ssh.key",
            "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjE=\n-----END OPENSSH PRIVATE KEY-----\n",
            "OpenSSH private key",
        ),
    ];
    for (name, contents, needle) in cases {
        let path = write(d, name, contents);
        err_mentions(read_signing_key(&path), &path, needle);
    }
    let binary = write(d, "binary.der", [0x30u8, 0x82, 0xff, 0xfe, 0x00]);
    err_mentions(read_signing_key(&binary), &binary, "not a PEM file");
    let missing = d.join("missing.key");
    err_mentions(read_signing_key(&missing), &missing, "no such file");

    let ec_pub = write(d, "ec.pub", EC_P256_PUBLIC_PEM);
    err_mentions(
        read_verifying_key(&ec_pub),
        &ec_pub,
        "EC (P-256) public key",
    );
    let rsa = write(d, "rsa.pem", RSA_512_PRIVATE_PEM);
    err_mentions(read_verifying_key(&rsa), &rsa, "is a private key");
    let cert = write(
        d,
        "cert.pem",
        "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n",
    );
    err_mentions(read_verifying_key(&cert), &cert, "X.509 certificate");
    // The identity point: every signature of the form (R = identity, s = 0) would verify.
    let mut weak = [0u8; 32];
    weak[0] = 1;
    let spki = [
        &[
            0x30, 0x2a, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x03, 0x21, 0x00,
        ][..],
        &weak,
    ]
    .concat();
    let weak_pem = format!(
        "-----BEGIN PUBLIC KEY-----\n{}\n-----END PUBLIC KEY-----\n",
        STANDARD.encode(spki)
    );
    let weak = write(d, "weak.pub", weak_pem);
    err_mentions(read_verifying_key(&weak), &weak, "small-order");
}

/// A private key passed where the public key is wanted (`--pub`) was read and its public key
/// derived, silently: it is refused, whatever its algorithm or wrapping, and even beside the
/// public key in one file.
#[test]
fn a_private_key_is_refused_where_the_public_key_is_wanted() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let both = format!("{RFC_PUBLIC_PEM}{RFC_PRIVATE_PEM}");
    for (name, contents) in [
        ("cardproof.key", RFC_PRIVATE_PEM),
        ("both.pem", both.as_str()),
        ("rsa.key", RSA_512_PRIVATE_PEM),
        (
            "sec1.key",
            "-----BEGIN EC PRIVATE KEY-----\nMHcCAQEE\n-----END EC PRIVATE KEY-----\n",
        ),
        (
            "encrypted.key",
            "-----BEGIN ENCRYPTED PRIVATE KEY-----\nMIIB\n-----END ENCRYPTED PRIVATE KEY-----\n",
        ),
        (
            "ssh.key",
            "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjE=\n-----END OPENSSH PRIVATE KEY-----\n",
        ),
    ] {
        let path = write(d, name, contents);
        err_mentions(
            read_verifying_key(&path),
            &path,
            "is a private key; pass the public key (cardproof.pub",
        );
    }
    // The public key itself still reads.
    let public = write(d, "cardproof.pub", RFC_PUBLIC_PEM);
    assert_eq!(
        read_verifying_key(&public).unwrap(),
        rfc_key().verifying_key()
    );
}

#[test]
fn bad_envelopes_are_errors_naming_the_file_and_field() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let key = rfc_key();
    let public = key.verifying_key();
    let (payload, good) = signed(&key);

    let not_json = write(d, "notjson.json", "{\"payload\": ");
    err_mentions(verify_envelope(&not_json, &public), &not_json, "not JSON");
    let e = verify_envelope(&not_json, &public).unwrap_err();
    assert!(e.at.is_some(), "a JSON error carries its line and column");

    let array = write(d, "array.json", "[]");
    err_mentions(verify_envelope(&array, &public), &array, "JSON object");

    let mut cases: Vec<(&str, Value, &str)> = Vec::new();
    for field in ["payload", "payloadType", "signatures"] {
        let mut v = good.clone();
        v.as_object_mut().unwrap().remove(field);
        cases.push((field, v, "missing"));
    }
    let mut v = good.clone();
    v["signatures"][0].as_object_mut().unwrap().remove("sig");
    cases.push(("signatures[0].sig", v, "missing"));
    let mut v = good.clone();
    v["payloadType"] = json!("application/json");
    cases.push(("payloadType", v, "application/json"));
    let mut v = good.clone();
    v["payload"] = json!("not base64 at all!");
    cases.push(("payload", v, "not valid base64"));
    let mut v = good.clone();
    v["signatures"][0]["sig"] = json!("a+b-c");
    cases.push(("signatures[0].sig", v, "not valid base64"));
    let mut v = good.clone();
    v["signatures"] = json!({});
    cases.push(("signatures", v, "must be an array"));
    let mut v = good.clone();
    v["signatures"][0]["keyid"] = json!(7);
    cases.push(("signatures[0].keyid", v, "must be a string"));
    for (i, (field, envelope, needle)) in cases.into_iter().enumerate() {
        let path = write(d, &format!("case{i}.json"), envelope.to_string());
        let e = verify_envelope(&path, &public).expect_err(field);
        assert_eq!(e.file, path);
        let text = e.to_string();
        assert!(
            text.contains(&format!("{field}: ")) && text.contains(needle),
            "`{text}` should name `{field}` and say `{needle}`"
        );
    }

    // Correctly signed, but not an in-toto Statement v1: parsed only after verifying, then refused.
    let bad_statements: &[(&[u8], &str)] = &[
        (b"not json", "payload: not JSON"),
        (br#"{"_type":"https://in-toto.io/Statement/v0.1","subject":[{"digest":{}}],"predicateType":"x"}"#, "payload._type"),
        (br#"{"_type":"https://in-toto.io/Statement/v1","subject":[],"predicateType":"x"}"#, "payload.subject"),
        (br#"{"_type":"https://in-toto.io/Statement/v1","subject":[{"name":"a"}],"predicateType":"x"}"#, "payload.subject[0].digest"),
        (br#"{"_type":"https://in-toto.io/Statement/v1","subject":[{"digest":{"sha256":"ab"}}]}"#, "payload.predicateType"),
        (br#"{"_type":"https://in-toto.io/Statement/v1","subject":[{"name":7,"digest":{"sha256":"ab"}}],"predicateType":"x"}"#, "payload.subject[0].name"),
    ];
    for (i, (body, needle)) in bad_statements.iter().enumerate() {
        let envelope = sign_envelope(body, PAYLOAD_TYPE, &key);
        let path = write(d, &format!("statement{i}.json"), envelope.to_string());
        err_mentions(verify_envelope(&path, &public), &path, needle);
    }
    // An unsigned bad payload is a failed signature, never parsed.
    let mut v = sign_envelope(b"not json", PAYLOAD_TYPE, &key);
    v["signatures"][0]["sig"] = good["signatures"][0]["sig"].clone();
    let m = failed(verify_value(d, &v, &public).unwrap());
    assert_eq!(m[0].what, what::SIGNATURE);
    assert!(!payload.is_empty());
}

#[test]
fn check_subjects_reports_changed_missing_and_extra_files() {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = dir.path().join("ckpt");
    write(&ckpt, "model.safetensors", b"weights".as_slice());
    write(&ckpt, "config.json", b"{}".as_slice());
    write(&ckpt, "sub/tokenizer.json", b"tok".as_slice());
    write(
        &ckpt,
        "README.md",
        b"# card, excluded by default".as_slice(),
    );
    let manifest = hash_path(&ckpt, &HashOptions::default(), &|_| {}).unwrap();
    let subs = subjects(&manifest);
    assert_eq!(
        subs.iter().map(|s| s.name.as_str()).collect::<Vec<_>>(),
        ["config.json", "model.safetensors", "sub/tokenizer.json"]
    );
    assert_eq!(subs[1].sha256, hex(&Sha256::digest(b"weights")));
    let st = statement(&subs, json!({}));
    let written = st.to_value();
    assert_eq!(
        written["subject"][2],
        json!({ "name": "sub/tokenizer.json", "digest": { "sha256": hex(&Sha256::digest(b"tok")) } })
    );
    let keys: Vec<&String> = written.as_object().unwrap().keys().collect();
    assert_eq!(keys, ["_type", "subject", "predicateType", "predicate"]);
    // The typed statement is written byte for byte as the spec's object was before it.
    assert_eq!(
        serde_json::to_string(&st).unwrap(),
        json!({
            "_type": STATEMENT_TYPE,
            "subject": subs
                .iter()
                .map(|s| json!({ "name": s.name, "digest": { "sha256": s.sha256 } }))
                .collect::<Vec<_>>(),
            "predicateType": PREDICATE_TYPE,
            "predicate": {},
        })
        .to_string()
    );

    assert_eq!(check_subjects(&st, &ckpt).unwrap(), []);
    // Editing the card does not matter.
    write(&ckpt, "README.md", b"# edited".as_slice());
    assert_eq!(check_subjects(&st, &ckpt).unwrap(), []);

    write(&ckpt, "model.safetensors", b"weightz".as_slice());
    std::fs::remove_file(ckpt.join("config.json")).unwrap();
    write(&ckpt, "sub/extra.bin", b"new".as_slice());
    let m = check_subjects(&st, &ckpt).unwrap();
    let summary: Vec<(&str, bool)> = m
        .iter()
        .map(|m| (m.what.as_str(), m.detail.contains('`')))
        .collect();
    assert_eq!(
        summary,
        [
            (what::SUBJECT, true),
            (what::DIGEST, true),
            (what::FILE, true)
        ],
        "{m:?}"
    );
    assert!(m[0].detail.contains("config.json"));
    assert!(m[1].detail.contains(&hex(&Sha256::digest(b"weights"))));
    assert!(m[1].detail.contains(&hex(&Sha256::digest(b"weightz"))));
    assert!(m[2].detail.contains("sub/extra.bin"));

    let missing = dir.path().join("gone");
    err_mentions(check_subjects(&st, &missing), &missing, "no such file");
}

/// Writes a signed envelope for the independent Python check (`tests/attest_check.py`):
///
/// ```sh
/// CARDPROOF_ATTEST_OUT=/tmp/attest cargo test --lib attest::tests::export_for_python -- --ignored
/// python3 tests/attest_check.py /tmp/attest/envelope.json /tmp/attest/cardproof.pub
/// ```
///
/// Also writes `envelope.cosigned.json` (a second key's signature added), and
/// `envelope.tampered.json` and `other.pub`, on which the script must fail.
#[test]
#[ignore = "writes files for tests/attest_check.py; set CARDPROOF_ATTEST_OUT"]
fn export_for_python() {
    let out = PathBuf::from(
        std::env::var_os("CARDPROOF_ATTEST_OUT").expect("set CARDPROOF_ATTEST_OUT to a directory"),
    );
    std::fs::create_dir_all(&out).unwrap();
    let keys = tempfile::tempdir().unwrap();
    let key = generate_key().unwrap();
    let (_, public) = write_keypair(keys.path(), &key).unwrap();
    std::fs::copy(&public, out.join("cardproof.pub")).unwrap();
    let other = generate_key().unwrap();
    write(
        &out,
        "other.pub",
        public_key_pem(&other.verifying_key()).as_bytes(),
    );

    let (mut payload, envelope) = signed(&key);
    let path = write(&out, "envelope.json", envelope.to_string());
    verified(verify_envelope(&path, &key.verifying_key()).unwrap());

    let mut cosigned = envelope.clone();
    add_signature(&mut cosigned, &other).unwrap();
    write(&out, "envelope.cosigned.json", cosigned.to_string());

    let at = payload.windows(2).position(|w| w == b"ab").unwrap();
    payload[at] = b'b';
    let mut tampered = envelope;
    tampered["payload"] = json!(STANDARD.encode(&payload));
    write(&out, "envelope.tampered.json", tampered.to_string());
}

#[test]
fn sign_file_then_check_report() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("model");
    write(&model, "config.json", "{}");
    write(&model, "model.safetensors", "weights");
    let out = dir.path().join("out");
    let measurement = json!({
        "run_id": "run-1",
        "runs": [],
        "protocol": {},
        "candidate": {"path": model.display().to_string()},
    });
    let file = write(&out, "measurement.json", measurement.to_string());
    let keys = create_keypair(&dir.path().join("keys")).unwrap();
    assert_eq!(
        keys.keyid,
        keyid(&read_verifying_key(&keys.public).unwrap())
    );
    let key = read_signing_key(&keys.private).unwrap();

    // Without --checkpoint, the subjects are the files of the model the measurement names.
    let signed = sign_file(&file, None, &key, None).unwrap();
    assert_eq!(signed.envelope, out.join("measurement.dsse.json"));
    assert_eq!(signed.file, file);
    assert_eq!(signed.predicate_type, MEASUREMENT_PREDICATE_TYPE);
    assert_eq!(signed.subjects, 2);
    assert_eq!(signed.keyid, keys.keyid);
    assert_eq!(
        signed.sha256,
        crate::checkpoint::hash::hash_file(&signed.envelope).unwrap()
    );

    let request = |public: &Path, checkpoint: Option<&Path>| {
        check_report(&ReportRequest {
            envelope: &signed.envelope,
            public_key: public,
            checkpoint,
            card: None,
            study: None,
        })
        .unwrap()
    };
    let report = request(&keys.public, Some(&model));
    assert!(report.verified(), "{:?}", report.mismatches);
    assert_eq!(report.keyid, keys.keyid);
    assert_eq!(report.subjects_checked.as_deref(), Some(model.as_path()));
    // A signed measurement binds no card.
    assert_eq!(report.card_checked, None);
    assert_eq!(
        report.predicate_type.as_deref(),
        Some(MEASUREMENT_PREDICATE_TYPE)
    );
    assert_eq!(report.run_id.as_deref(), Some("run-1"));
    assert_eq!(report.verdict, None);

    // A changed checkpoint file is a mismatch, not an error.
    write(&model, "model.safetensors", "other weights");
    let report = request(&keys.public, Some(&model));
    assert!(!report.verified());
    assert!(
        report.mismatches.iter().all(|m| m.what == what::DIGEST),
        "{:?}",
        report.mismatches
    );
    // Another key: the signature fails and nothing is read from the statement.
    let other = create_keypair(&dir.path().join("other")).unwrap();
    let report = request(&other.public, None);
    assert!(!report.verified());
    assert_eq!(report.keyid, other.keyid);
    assert_eq!(
        (report.predicate_type, report.run_id, report.verdict),
        (None, None, None)
    );

    // --out, and the default envelope name.
    let elsewhere = dir.path().join("signed.dsse.json");
    let signed = sign_file(&file, Some(&model), &key, Some(&elsewhere)).unwrap();
    assert_eq!(signed.envelope, elsewhere);
    assert_eq!(
        default_envelope_path(Path::new("a/report.json")),
        Path::new("a/report.dsse.json")
    );
    assert_eq!(
        default_envelope_path(Path::new("notes")),
        Path::new("notes.dsse.json")
    );
    // A key directory is never reused.
    err_mentions(
        create_keypair(&dir.path().join("keys")),
        &dir.path().join("keys").join(PRIVATE_KEY_FILE),
        "refusing to overwrite",
    );
}

#[test]
fn a_statements_extra_fields_are_kept_as_signed() {
    // The spec lets producers add fields; the typed statement shows what was signed.
    let payload = json!({
        "_type": STATEMENT_TYPE,
        "subject": [{"name": "a", "digest": {"sha256": "ab"}, "uri": "hf://x/a"}],
        "predicateType": "https://example.com/p",
        "predicate": {"k": 1},
        "x-producer": "someone",
    });
    let st = super::statement::parse_statement(Path::new("p.json"), payload.to_string().as_bytes())
        .unwrap();
    assert_eq!(st.subject[0].name.as_deref(), Some("a"));
    assert_eq!(st.predicate_type, "https://example.com/p");
    assert_eq!(st.to_value(), payload);
}
