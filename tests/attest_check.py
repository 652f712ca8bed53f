#!/usr/bin/env python3
"""Verify a cardproof DSSE envelope with tooling independent of cardproof.

Usage: python3 tests/attest_check.py ENVELOPE PUBKEY_PEM

Two independent paths, both of which must pass:

1. securesystemslib (the reference DSSE implementation in Python): the envelope is read with
   `dsse.Envelope.from_dict`, the key is an `SSlibKey` built from the PEM's raw public key
   (keytype/scheme "ed25519", keyval.public = 64 hex digits) with the keyid securesystemslib
   computes itself (`compute_default_keyid`), and `Envelope.verify([key], 1)` checks it. This also
   proves that cardproof writes the keyid securesystemslib expects: `verify` skips signatures whose
   keyid differs from the key's.
2. `cryptography` alone: Ed25519PublicKey from the PEM, the DSSE PAE rebuilt by hand from the
   spec, one signature must verify. This path does not depend on securesystemslib's API.

Then the payload must be an in-toto Statement v1 (`_type`, non-empty `subject` with sha256 digests,
`predicateType`). Prints what was checked; exits 0 when everything passed, 1 on any failure, and 2
on unusable input or missing packages (`pip install securesystemslib cryptography`).
"""

import base64
import hashlib
import json
import sys

PAYLOAD_TYPE = "application/vnd.in-toto+json"
STATEMENT_TYPE = "https://in-toto.io/Statement/v1"


def b64decode(text):
    """Standard or URL-safe base64, padded or not, as DSSE requires of verifiers."""
    text = text.strip()
    text += "=" * (-len(text) % 4)
    if "-" in text or "_" in text:
        return base64.urlsafe_b64decode(text)
    return base64.b64decode(text, validate=True)


def pae(payload_type, payload):
    """DSSEv1 pre-authentication encoding, from the spec (lengths in bytes)."""
    t = payload_type.encode("utf-8")
    return b"DSSEv1 %d %s %d %s" % (len(t), t, len(payload), payload)


def load_public_key(path):
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
    from cryptography.hazmat.primitives.serialization import (
        Encoding,
        PublicFormat,
        load_pem_public_key,
    )

    with open(path, "rb") as f:
        key = load_pem_public_key(f.read())
    if not isinstance(key, Ed25519PublicKey):
        raise ValueError(f"{path}: not an Ed25519 public key ({type(key).__name__})")
    raw = key.public_bytes(Encoding.Raw, PublicFormat.Raw)
    return key, raw.hex()


def check_securesystemslib(envelope_dict, public_hex):
    """Path 1: securesystemslib's own envelope parsing, keyid rule and verification."""
    from securesystemslib.dsse import Envelope
    from securesystemslib.signer import SSlibKey

    try:
        from securesystemslib.signer._utils import compute_default_keyid

        keyval = {"public": public_hex}
        keyid = compute_default_keyid("ed25519", "ed25519", keyval)
    except ImportError:  # older layouts: the rule, as securesystemslib documents it
        canonical = json.dumps(
            {"keytype": "ed25519", "keyval": {"public": public_hex}, "scheme": "ed25519"},
            sort_keys=True,
            separators=(",", ":"),
        )
        keyid = hashlib.sha256(canonical.encode()).hexdigest()
    key = SSlibKey(keyid, "ed25519", "ed25519", {"public": public_hex})
    # from_dict mutates the signature entries; give it its own copy.
    envelope = Envelope.from_dict(json.loads(json.dumps(envelope_dict)))
    if envelope.payload_type != PAYLOAD_TYPE:
        raise ValueError(f"payloadType is {envelope.payload_type!r}, expected {PAYLOAD_TYPE!r}")
    accepted = envelope.verify([key], 1)
    return keyid, sorted(accepted)


def check_cryptography(envelope_dict, public_key):
    """Path 2: plain Ed25519 over a hand-built PAE; returns the index of a verifying signature."""
    from cryptography.exceptions import InvalidSignature

    payload = b64decode(envelope_dict["payload"])
    payload_type = envelope_dict["payloadType"]
    if payload_type != PAYLOAD_TYPE:
        raise ValueError(f"payloadType is {payload_type!r}, expected {PAYLOAD_TYPE!r}")
    message = pae(payload_type, payload)
    for i, entry in enumerate(envelope_dict["signatures"]):
        try:
            public_key.verify(b64decode(entry["sig"]), message)
            return i, payload
        except InvalidSignature:
            continue
    raise ValueError("no signature verifies under the given key")


def check_statement(payload):
    statement = json.loads(payload)
    if statement.get("_type") != STATEMENT_TYPE:
        raise ValueError(f"_type is {statement.get('_type')!r}, expected {STATEMENT_TYPE!r}")
    subjects = statement.get("subject")
    if not isinstance(subjects, list) or not subjects:
        raise ValueError("subject is missing or empty")
    for s in subjects:
        sha = s.get("digest", {}).get("sha256", "")
        if len(sha) != 64 or any(c not in "0123456789abcdef" for c in sha):
            raise ValueError(f"subject {s.get('name')!r} has no sha256 hex digest")
    if not isinstance(statement.get("predicateType"), str):
        raise ValueError("predicateType is missing")
    return statement


def main(argv):
    if len(argv) != 3:
        print(__doc__.strip().splitlines()[2], file=sys.stderr)
        return 2
    envelope_path, key_path = argv[1], argv[2]
    try:
        import cryptography  # noqa: F401
        import securesystemslib  # noqa: F401
    except ImportError as e:
        print(f"missing package: {e} (pip install securesystemslib cryptography)", file=sys.stderr)
        return 2
    try:
        with open(envelope_path, encoding="utf-8") as f:
            envelope = json.load(f)
        public_key, public_hex = load_public_key(key_path)
    except (OSError, ValueError) as e:
        print(f"unusable input: {e}", file=sys.stderr)
        return 2

    print(f"envelope: {envelope_path}")
    print(f"key:      {key_path} (ed25519 {public_hex})")
    ok = True

    try:
        keyid, accepted = check_securesystemslib(envelope, public_hex)
        print(f"PASS securesystemslib {securesystemslib.__version__}: Envelope.verify([key], 1) "
              f"accepted keyid {', '.join(accepted)} (computed by securesystemslib: {keyid})")
    except Exception as e:  # any failure of this path is a failed check
        ok = False
        print(f"FAIL securesystemslib: {type(e).__name__}: {e}")

    try:
        index, payload = check_cryptography(envelope, public_key)
        print(f"PASS cryptography {cryptography.__version__}: signature {index + 1} of "
              f"{len(envelope['signatures'])} verifies over the hand-built DSSEv1 PAE")
        statement = check_statement(payload)
        print(f"PASS statement: {STATEMENT_TYPE}, predicateType {statement['predicateType']}, "
              f"{len(statement['subject'])} subject(s)")
    except Exception as e:
        ok = False
        print(f"FAIL cryptography path: {type(e).__name__}: {e}")

    print("OK: verified independently" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
