//! Ed25519 signing keys on disk: PKCS#8 PEM for the private key, SPKI PEM for the public key.
//!
//! These are the formats every toolkit reads (OpenSSL `pkey`, Python `cryptography`,
//! securesystemslib, Go's `x509`), so a key made here can be inspected or reused elsewhere and a
//! public key made elsewhere can verify here. Only Ed25519 is accepted: it has one signature
//! encoding, deterministic signatures and no parameters to get wrong. Files of other key types get
//! an error that says what they are, because "not an Ed25519 key" alone leaves a user guessing.

use std::fs::OpenOptions;
use std::io::Write;
use std::path::{Path, PathBuf};

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use ed25519_dalek::pkcs8::spki::der::pem::LineEnding;
use ed25519_dalek::pkcs8::spki::der::zeroize::Zeroizing;
use ed25519_dalek::pkcs8::spki::{AlgorithmIdentifierRef, SubjectPublicKeyInfoRef};
use ed25519_dalek::pkcs8::{
    EncodePrivateKey, EncodePublicKey, KeypairBytes, ObjectIdentifier, PrivateKeyInfoRef,
};
use ed25519_dalek::{SigningKey, VerifyingKey};
use sha2::{Digest, Sha256};

use crate::digest::hex;
use crate::error::{Error, Result};

/// File name of the private key in a key directory.
pub const PRIVATE_KEY_FILE: &str = "cardproof.key";
/// File name of the public key in a key directory.
pub const PUBLIC_KEY_FILE: &str = "cardproof.pub";

/// Key files are tiny (a PKCS#8 Ed25519 PEM is 119 bytes); anything far larger is the wrong file,
/// and is refused before it is read into memory.
const MAX_KEY_FILE: u64 = 64 * 1024;

const OID_ED25519: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.3.101.112");

/// A fresh key from the operating system's CSPRNG (`getrandom`), which is the only source a
/// signing seed should come from.
pub fn generate_key() -> Result<SigningKey> {
    let mut seed = Zeroizing::new([0u8; 32]);
    getrandom::fill(seed.as_mut_slice()).map_err(|e| {
        Error::new(
            "<getrandom>",
            crate::ErrorKind::Io(std::io::Error::other(format!(
                "the operating system's random number generator failed: {e}"
            ))),
        )
    })?;
    Ok(SigningKey::from_bytes(&seed))
}

/// The private key as PKCS#8 v1 PEM (`-----BEGIN PRIVATE KEY-----`, the 32-byte seed only).
///
/// v1 rather than v2 (which embeds the public key) because OpenSSL 1.1 and the tools built on it
/// cannot read Ed25519 v2 documents; the public key is derived from the seed anyway.
pub fn private_key_pem(key: &SigningKey) -> Zeroizing<String> {
    let bytes = KeypairBytes {
        secret_key: key.to_bytes(),
        public_key: None,
    };
    // Encoding a 32-byte seed into a fixed ASN.1 template cannot fail.
    bytes
        .to_pkcs8_pem(LineEnding::LF)
        .expect("PKCS#8 encoding of an Ed25519 seed")
}

/// The public key as SPKI PEM (`-----BEGIN PUBLIC KEY-----`), what `openssl pkey -pubout` writes.
pub fn public_key_pem(key: &VerifyingKey) -> String {
    // Encoding 32 bytes into a fixed ASN.1 template cannot fail.
    key.to_public_key_pem(LineEnding::LF)
        .expect("SPKI encoding of an Ed25519 public key")
}

/// A key pair written by [`create_keypair`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyPair {
    /// `DIR/cardproof.key`.
    pub private: PathBuf,
    /// `DIR/cardproof.pub`.
    pub public: PathBuf,
    /// The public key's keyid ([`keyid`]).
    pub keyid: String,
}

/// `cardproof keygen`: a fresh key written with [`write_keypair`].
pub fn create_keypair(dir: &Path) -> Result<KeyPair> {
    let key = generate_key()?;
    let (private, public) = write_keypair(dir, &key)?;
    Ok(KeyPair {
        private,
        public,
        keyid: keyid(&key.verifying_key()),
    })
}

/// Write `DIR/cardproof.key` (mode 0600 on unix) and `DIR/cardproof.pub`, creating `DIR` (0700
/// on unix) if missing. Returns the two paths.
///
/// The private key file is created with its final mode in the same `open` call, so it is never
/// readable by others, not even between creation and a later `chmod`. Existing files are never
/// overwritten (`create_new`, which is atomic): losing a signing key silently would orphan every
/// report signed with it. The public key is refused too when present, since one left over from an
/// older key would no longer match the new private key.
pub fn write_keypair(dir: &Path, key: &SigningKey) -> Result<(PathBuf, PathBuf)> {
    create_private_dir(dir)?;
    let private = dir.join(PRIVATE_KEY_FILE);
    let public = dir.join(PUBLIC_KEY_FILE);
    for path in [&private, &public] {
        if path.symlink_metadata().is_ok() {
            return Err(Error::usage(
                path,
                "a key file already exists here; refusing to overwrite it (move it away first)",
            ));
        }
    }
    write_new(&private, private_key_pem(key).as_bytes(), true)?;
    if let Err(e) = write_new(
        &public,
        public_key_pem(&key.verifying_key()).as_bytes(),
        false,
    ) {
        // Leave no private key without its public half: the next attempt starts clean.
        let _ = std::fs::remove_file(&private);
        return Err(e);
    }
    Ok((private, public))
}

fn create_private_dir(dir: &Path) -> Result<()> {
    if dir.is_dir() {
        return Ok(());
    }
    let mut builder = std::fs::DirBuilder::new();
    builder.recursive(true);
    #[cfg(unix)]
    std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
    builder.create(dir).map_err(|e| Error::io(dir, e))
}

/// Create `path` (failing if it exists) and write `bytes`; `secret` files get mode 0600 at
/// creation. A partial file is removed on error.
fn write_new(path: &Path, bytes: &[u8], secret: bool) -> Result<()> {
    let mut options = OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, if secret { 0o600 } else { 0o644 });
    #[cfg(not(unix))]
    let _ = secret;
    let mut file = options.open(path).map_err(|e| {
        if e.kind() == std::io::ErrorKind::AlreadyExists {
            Error::usage(
                path,
                "a key file already exists here; refusing to overwrite it (move it away first)",
            )
        } else {
            Error::io(path, e)
        }
    })?;
    if let Err(e) = file.write_all(bytes).and_then(|()| file.sync_all()) {
        drop(file);
        let _ = std::fs::remove_file(path);
        return Err(Error::io(path, e));
    }
    Ok(())
}

/// Read an Ed25519 private key from a PKCS#8 PEM file (`-----BEGIN PRIVATE KEY-----`, v1 or v2).
///
/// Errors say what the file is when it is not that: not PEM at all, corrupt base64, an encrypted
/// key, a key of another algorithm (RSA, EC with its curve, DSA, Ed448, X25519), a public key
/// given where the private one is needed, an OpenSSH key or a certificate.
pub fn read_signing_key(path: &Path) -> Result<SigningKey> {
    let text = read_key_file(path)?;
    let blocks = pem_blocks(path, &text)?;
    let block = blocks
        .iter()
        .find(|b| b.label.ends_with("PRIVATE KEY"))
        .unwrap_or(&blocks[0]);
    match block.label.as_str() {
        "PRIVATE KEY" => signing_key_from_pkcs8(path, &block.decode(path)?),
        "PUBLIC KEY" | "RSA PUBLIC KEY" | "SSH2 PUBLIC KEY" => Err(Error::usage(
            path,
            "this is a public key, but signing needs the private key (the `.key` file, not the \
             `.pub`)",
        )),
        label => Err(Error::unsupported(path, None, describe_other_label(label))),
    }
}

/// Read an Ed25519 public key from an SPKI PEM file (`-----BEGIN PUBLIC KEY-----`).
///
/// Anything else is refused, naming what it is: a private key above all (of any algorithm, even
/// beside a public key in the same file: a verifier never needs one, and a private key passed as
/// `--pub` is a key being handed around that should not be), a public key of another algorithm,
/// a certificate, an OpenSSH key.
pub fn read_verifying_key(path: &Path) -> Result<VerifyingKey> {
    let text = read_key_file(path)?;
    let blocks = pem_blocks(path, &text)?;
    if blocks.iter().any(|b| b.label.ends_with("PRIVATE KEY")) {
        return Err(Error::usage(
            path,
            format!(
                "is a private key; pass the public key ({PUBLIC_KEY_FILE}, which `cardproof \
                 keygen` writes beside {PRIVATE_KEY_FILE}; `openssl pkey -in KEY -pubout` derives \
                 it): verifying never needs the private key"
            ),
        ));
    }
    let block = blocks
        .iter()
        .find(|b| b.label == "PUBLIC KEY")
        .unwrap_or(&blocks[0]);
    let key = match block.label.as_str() {
        "PUBLIC KEY" => {
            let der = block.decode(path)?;
            let info = SubjectPublicKeyInfoRef::try_from(der.as_slice()).map_err(|e| {
                Error::format(
                    path,
                    None,
                    format!("the PUBLIC KEY block is not valid SPKI DER: {e}"),
                )
            })?;
            require_ed25519(path, &info.algorithm, "public")?;
            VerifyingKey::try_from(info).map_err(|e| {
                Error::format(path, None, format!("not a valid Ed25519 public key: {e}"))
            })?
        }
        label => return Err(Error::unsupported(path, None, describe_other_label(label))),
    };
    if key.is_weak() {
        return Err(Error::format(
            path,
            None,
            "the Ed25519 public key is a small-order point, under which forged signatures verify",
        ));
    }
    Ok(key)
}

fn signing_key_from_pkcs8(path: &Path, der: &[u8]) -> Result<SigningKey> {
    let info = PrivateKeyInfoRef::try_from(der).map_err(|e| {
        Error::format(
            path,
            None,
            format!("the PRIVATE KEY block is not valid PKCS#8 DER: {e}"),
        )
    })?;
    require_ed25519(path, &info.algorithm, "private")?;
    SigningKey::try_from(info).map_err(|e| {
        Error::format(
            path,
            None,
            format!("not a valid Ed25519 PKCS#8 private key: {e}"),
        )
    })
}

fn require_ed25519(path: &Path, algorithm: &AlgorithmIdentifierRef<'_>, which: &str) -> Result<()> {
    if algorithm.oid == OID_ED25519 {
        return Ok(());
    }
    Err(Error::unsupported(
        path,
        None,
        format!(
            "this is {} {which} key; cardproof signs and verifies with Ed25519 keys only",
            algorithm_name(algorithm)
        ),
    ))
}

/// A reader's name for a key algorithm ("an RSA", "an EC P-256"), with the OID when unknown.
fn algorithm_name(algorithm: &AlgorithmIdentifierRef<'_>) -> String {
    match algorithm.oid.to_string().as_str() {
        "1.3.101.112" => "an Ed25519".into(),
        "1.3.101.113" => "an Ed448".into(),
        "1.3.101.110" => "an X25519 (key agreement, not signing)".into(),
        "1.3.101.111" => "an X448 (key agreement, not signing)".into(),
        "1.2.840.113549.1.1.1" => "an RSA".into(),
        "1.2.840.113549.1.1.10" => "an RSA-PSS".into(),
        "1.2.840.10040.4.1" => "a DSA".into(),
        "1.2.840.10045.2.1" => {
            let curve = match algorithm.parameters_oid().map(|o| o.to_string()) {
                Ok(oid) => match oid.as_str() {
                    "1.2.840.10045.3.1.7" => "P-256".to_owned(),
                    "1.3.132.0.34" => "P-384".to_owned(),
                    "1.3.132.0.35" => "P-521".to_owned(),
                    "1.3.132.0.10" => "secp256k1".to_owned(),
                    other => format!("curve {other}"),
                },
                Err(_) => "unknown-curve".to_owned(),
            };
            format!("an EC ({curve})")
        }
        other => format!("an unsupported (algorithm OID {other})"),
    }
}

/// What a PEM block that is neither `PRIVATE KEY` nor `PUBLIC KEY` holds, for the error.
fn describe_other_label(label: &str) -> String {
    let what = match label {
        "RSA PRIVATE KEY" => "this is an RSA private key (PKCS#1)",
        "EC PRIVATE KEY" => "this is an EC private key (SEC1)",
        "DSA PRIVATE KEY" => "this is a DSA private key",
        "EC PARAMETERS" => "this holds EC parameters, not a key",
        "RSA PUBLIC KEY" => "this is an RSA public key (PKCS#1)",
        "ENCRYPTED PRIVATE KEY" => {
            return "this is a password-encrypted PKCS#8 key; cardproof reads unencrypted keys \
                    only (`openssl pkey -in KEY -out PLAIN.key` decrypts it)"
                .into();
        }
        "OPENSSH PRIVATE KEY" => {
            return "this is an OpenSSH private key; cardproof reads PKCS#8 PEM \
                    (`-----BEGIN PRIVATE KEY-----`)"
                .into();
        }
        "CERTIFICATE" => {
            return "this is an X.509 certificate; pass the bare public key \
                    (`openssl x509 -pubkey -noout -in CERT`)"
                .into();
        }
        other => {
            return format!(
                "this is a PEM `{other}` block, not an Ed25519 key (`PRIVATE KEY` or `PUBLIC KEY`)"
            );
        }
    };
    format!("{what}; cardproof signs and verifies with Ed25519 keys only")
}

fn read_key_file(path: &Path) -> Result<Zeroizing<String>> {
    let meta = std::fs::metadata(path).map_err(|e| Error::io(path, e))?;
    if meta.is_dir() {
        return Err(Error::usage(path, "is a directory, not a key file"));
    }
    if meta.len() > MAX_KEY_FILE {
        return Err(Error::format(
            path,
            None,
            format!(
                "is {} bytes, too large for a key file (an Ed25519 PEM is under 200)",
                meta.len()
            ),
        ));
    }
    // Regular files only, read through the capped reader: a FIFO passed as a key never blocks.
    let bytes = Zeroizing::new(crate::files::read_capped(path, MAX_KEY_FILE, "a key file")?);
    match std::str::from_utf8(&bytes) {
        Ok(text) => Ok(Zeroizing::new(text.to_owned())),
        Err(_) => Err(Error::format(
            path,
            None,
            "not a PEM file (binary data; a DER key converts with `openssl pkey -inform DER -in \
             KEY -out KEY.pem`)",
        )),
    }
}

/// One `-----BEGIN LABEL-----` … `-----END LABEL-----` block, body still base64.
struct PemBlock {
    label: String,
    /// 1-based line of the BEGIN line, for errors.
    line: usize,
    body: Zeroizing<String>,
}

impl PemBlock {
    fn decode(&self, path: &Path) -> Result<Zeroizing<Vec<u8>>> {
        STANDARD
            .decode(self.body.as_bytes())
            .map(Zeroizing::new)
            .map_err(|e| {
                Error::format(
                    path,
                    Some(&format!("line {}", self.line)),
                    format!("corrupt base64 in the PEM `{}` block: {e}", self.label),
                )
            })
    }
}

/// Split PEM text into blocks, tolerating text around them (as `openssl` output has) and CRLF.
/// Encapsulated headers (`Proc-Type: 4,ENCRYPTED`, legacy OpenSSL encryption) are refused.
fn pem_blocks(path: &Path, text: &str) -> Result<Vec<PemBlock>> {
    let mut blocks = Vec::new();
    let mut lines = text.lines().enumerate();
    while let Some((n, line)) = lines.next() {
        let Some(label) = line
            .trim()
            .strip_prefix("-----BEGIN ")
            .and_then(|l| l.strip_suffix("-----"))
        else {
            continue;
        };
        let end = format!("-----END {label}-----");
        let mut body = Zeroizing::new(String::new());
        let mut closed = false;
        for (_, line) in lines.by_ref() {
            let line = line.trim();
            if line == end {
                closed = true;
                break;
            }
            if line.contains(':') {
                return Err(Error::unsupported(
                    path,
                    Some(&format!("line {}", n + 1)),
                    format!(
                        "the PEM `{label}` block has headers (`{line}`): a legacy encrypted key; \
                         cardproof reads unencrypted PKCS#8 keys only"
                    ),
                ));
            }
            body.push_str(line);
        }
        if !closed {
            return Err(Error::format(
                path,
                Some(&format!("line {}", n + 1)),
                format!("the PEM `{label}` block has no `{end}` line"),
            ));
        }
        blocks.push(PemBlock {
            label: label.to_owned(),
            line: n + 1,
            body,
        });
    }
    if blocks.is_empty() {
        return Err(Error::format(
            path,
            None,
            "not a PEM key file: no `-----BEGIN …-----` line",
        ));
    }
    Ok(blocks)
}

/// securesystemslib's default keyid for an Ed25519 key: the hex SHA-256 of the canonical JSON
/// `{"keytype":"ed25519","keyval":{"public":"<64 hex>"},"scheme":"ed25519"}` (keys sorted, no
/// spaces; `compute_default_keyid` in `securesystemslib/signer/_utils.py`).
///
/// Emitting exactly this keyid matters: securesystemslib's `Envelope.verify` skips every signature
/// whose keyid differs from the key's, so any other keyid makes an otherwise valid report fail
/// there. The keyid is an unauthenticated hint, never a substitute for checking the signature.
pub fn keyid(key: &VerifyingKey) -> String {
    let canonical = format!(
        "{{\"keytype\":\"ed25519\",\"keyval\":{{\"public\":\"{}\"}},\"scheme\":\"ed25519\"}}",
        hex(key.as_bytes())
    );
    hex(&Sha256::digest(canonical.as_bytes()))
}

/// The user's key directory: `$CARDPROOF_CONFIG_DIR` if set, else `$XDG_CONFIG_HOME/cardproof`,
/// else `~/.config/cardproof` (the XDG default, used on every platform so that the place is the
/// same wherever the documentation is read).
pub fn default_key_dir() -> Result<PathBuf> {
    let home = std::env::var_os("HOME").or_else(|| std::env::var_os("USERPROFILE"));
    key_dir_from(
        std::env::var_os("CARDPROOF_CONFIG_DIR"),
        std::env::var_os("XDG_CONFIG_HOME"),
        home,
    )
    .ok_or_else(|| {
        Error::usage(
            Path::new("~/.config/cardproof"),
            "cannot find the home directory to keep the signing key in; set CARDPROOF_CONFIG_DIR \
             (or HOME)",
        )
    })
}

/// [`default_key_dir`]'s rule on given variables (testable without touching the environment).
/// Empty values count as unset; a relative `XDG_CONFIG_HOME` is ignored, as the XDG base
/// directory specification requires.
pub fn key_dir_from(
    config_dir: Option<std::ffi::OsString>,
    xdg_config_home: Option<std::ffi::OsString>,
    home: Option<std::ffi::OsString>,
) -> Option<PathBuf> {
    let set = |v: Option<std::ffi::OsString>| v.filter(|v| !v.is_empty()).map(PathBuf::from);
    if let Some(dir) = set(config_dir) {
        return Some(dir);
    }
    if let Some(xdg) = set(xdg_config_home).filter(|p| p.is_absolute()) {
        return Some(xdg.join("cardproof"));
    }
    set(home).map(|h| h.join(".config").join("cardproof"))
}

/// Load `cardproof.key` from [`default_key_dir`], creating the key pair on first use. Returns the
/// key, the private key's path and `true` when it was just created (the caller announces that on
/// stderr, with the path of the public key to publish).
pub fn default_signing_key() -> Result<(SigningKey, PathBuf, bool)> {
    load_or_create(&default_key_dir()?)
}

/// [`default_signing_key`] for a given directory.
pub fn load_or_create(dir: &Path) -> Result<(SigningKey, PathBuf, bool)> {
    let path = dir.join(PRIVATE_KEY_FILE);
    if path.symlink_metadata().is_ok() {
        return Ok((read_signing_key(&path)?, path, false));
    }
    let key = generate_key()?;
    let (path, _) = write_keypair(dir, &key)?;
    Ok((key, path, true))
}
