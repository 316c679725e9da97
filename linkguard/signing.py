"""Signed plans: Ed25519 signatures over the bus messages that steer kernel routes.

Consumes: the topology service's private key (to sign), its public key (agents, to verify),
and message bytes. Produces: signed envelopes (:meth:`Signer.seal`) and the verified body
bytes inside one (:func:`unwrap`), or a :class:`SignatureError` naming why not.

Wire format of a signed message (``plans/<host>`` and ``peers/<host>``), one JSON object::

    {"v": 1, "alg": "ed25519", "key_id": "<16 hex>", "sig": "<base64>", "body": "<JSON text>"}

``body`` is the message's JSON (a :class:`~linkguard.models.Plan` or
:class:`~linkguard.models.PeerRoutes`) as a string; ``sig`` is the standard base64 of the
64-byte Ed25519 signature (RFC 8032) of the body's UTF-8 bytes, so the signature covers the
exact bytes that are decoded and no canonical form is needed; ``key_id`` is the first 16 hex
digits of the SHA-256 of the raw 32-byte public key (:func:`key_id`), which names the key
without carrying it. Ed25519 through the ``cryptography`` package (OpenSSL).

Key files (:func:`generate_keys` writes both): the private key is PEM (PKCS #8, unencrypted)
or the raw 32-byte seed, and must not be readable or writable by group or others (mode 0600
or stricter, else :class:`KeyFileError`); the public key is PEM (SubjectPublicKeyInfo) or the
raw 32 bytes. Key material never appears in an error message.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
    Ed25519PublicKey,
)
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from linkguard.config import ConfigError

__all__ = [
    "ALG",
    "ENVELOPE_VERSION",
    "PRIVATE_KEY_FILE",
    "PUBLIC_KEY_FILE",
    "Envelope",
    "KeyFileError",
    "Mismatch",
    "SignatureError",
    "Signer",
    "Unwrapped",
    "Verifier",
    "envelope_of",
    "generate_keys",
    "key_id",
    "mismatch",
    "unwrap",
]

ENVELOPE_VERSION = 1
ALG = "ed25519"
#: the names ``linkguard keys generate`` writes in its ``--out`` directory
PRIVATE_KEY_FILE = "service.key"
PUBLIC_KEY_FILE = "service.pub"
_RAW_KEY_BYTES = 32
_SIGNATURE_BYTES = 64
#: a key file larger than this is not a key (PEM of an Ed25519 key is about 120 bytes)
_MAX_KEY_FILE_BYTES = 16 * 1024


class KeyFileError(ConfigError):
    """A key file that cannot be used: missing, unreadable, not an Ed25519 key in a format
    this module reads, or (private key) readable or writable by group or others."""


class SignatureError(ValueError):
    """A payload that is not a message signed by the expected key. ``reason``, one of:
    ``unsigned`` (not an envelope, and signatures are required), ``bad_envelope`` (an
    envelope that does not parse: fields, version, algorithm, base64, length),
    ``unknown_key`` (``key_id`` names another key), ``bad_signature`` (the signature does
    not match the body)."""

    def __init__(self, reason: str, detail: str, *, key_id: str | None = None) -> None:
        """``key_id``: the key id the envelope names (with ``unknown_key``), else None."""
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail
        self.key_id = key_id


class Envelope(BaseModel):
    """A signed message as it is on the wire (see the module docstring)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    v: int = Field(ge=ENVELOPE_VERSION, le=ENVELOPE_VERSION)  # strict: ``true`` is no 1
    alg: Literal["ed25519"]
    key_id: str = Field(pattern=r"^[0-9a-f]{16}$")
    sig: str = Field(min_length=86, max_length=88, description="base64 of 64 bytes")
    body: str


def key_id(public_key: Ed25519PublicKey) -> str:
    """The first 16 hex digits of the SHA-256 of the raw 32-byte ``public_key``."""
    raw = public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return hashlib.sha256(raw).hexdigest()[:16]


@dataclass(frozen=True)
class Unwrapped:
    """What :func:`unwrap` found: the message bytes to decode, whether they came in an
    envelope, and whether its signature was checked (False without a key)."""

    body: bytes
    signed: bool
    verified: bool


class Verifier:
    """Checks envelopes against one public key (the service's)."""

    def __init__(self, public_key: Ed25519PublicKey) -> None:
        self.public_key = public_key
        self.key_id = key_id(public_key)

    @classmethod
    def from_file(cls, path: Path) -> Verifier:
        """The public key in ``path`` (PEM SubjectPublicKeyInfo or raw 32 bytes).
        Raises :class:`KeyFileError`."""
        data = _read_key_file(path, "public key")
        try:
            if data.lstrip().startswith(b"-----BEGIN"):
                key = serialization.load_pem_public_key(data)
            elif len(data) == _RAW_KEY_BYTES:
                key = Ed25519PublicKey.from_public_bytes(data)
            else:
                raise ValueError
        except (ValueError, TypeError):
            raise KeyFileError(
                f"public key {path}: not an Ed25519 public key (PEM or raw 32 bytes; "
                "`linkguard keys generate` writes one)"
            ) from None
        if not isinstance(key, Ed25519PublicKey):
            raise KeyFileError(f"public key {path}: a {type(key).__name__}, not Ed25519")
        return cls(key)

    def verify(self, envelope: Envelope) -> bytes:
        """The body bytes of ``envelope`` once its key id and signature check out; raises
        :class:`SignatureError` (``unknown_key``, ``bad_envelope``, ``bad_signature``)."""
        if envelope.key_id != self.key_id:
            raise SignatureError(
                "unknown_key",
                f"signed by key {envelope.key_id}, expected {self.key_id}",
                key_id=envelope.key_id,
            )
        try:
            sig = base64.b64decode(envelope.sig, validate=True)
            body = envelope.body.encode("utf-8")
        # ValueError: a sig with non-ASCII characters (b64decode raises it before binascii)
        except (binascii.Error, UnicodeEncodeError, ValueError) as exc:
            raise SignatureError("bad_envelope", f"{type(exc).__name__}: {exc}"[:200]) from None
        if len(sig) != _SIGNATURE_BYTES:
            raise SignatureError("bad_envelope", f"signature of {len(sig)} bytes, not 64")
        try:
            self.public_key.verify(sig, body)
        except InvalidSignature:
            raise SignatureError(
                "bad_signature", f"the signature does not match the body (key {self.key_id})"
            ) from None
        return body


class Signer:
    """Seals messages with the service's private key."""

    def __init__(self, private_key: Ed25519PrivateKey) -> None:
        self._key = private_key
        self.verifier = Verifier(private_key.public_key())
        self.key_id = self.verifier.key_id

    def __repr__(self) -> str:  # never the key itself
        return f"Signer(key_id={self.key_id!r})"

    @classmethod
    def from_file(cls, path: Path) -> Signer:
        """The private key in ``path`` (PEM PKCS #8 unencrypted, or the raw 32-byte seed).
        Raises :class:`KeyFileError`, also when group or others may read or write it."""
        try:
            st = path.stat()
        except OSError as exc:
            raise KeyFileError(f"signing key {path}: {exc.strerror or exc}") from None
        if not stat.S_ISREG(st.st_mode):
            raise KeyFileError(f"signing key {path}: not a regular file")
        if st.st_mode & 0o077:
            raise KeyFileError(
                f"signing key {path} has mode {stat.S_IMODE(st.st_mode):04o}: group or others "
                f"may read or write it; `chmod 600 {path}` (and keep it owned by the service)"
            )
        data = _read_key_file(path, "signing key")
        try:
            if data.lstrip().startswith(b"-----BEGIN"):
                key = serialization.load_pem_private_key(data, password=None)
            elif len(data) == _RAW_KEY_BYTES:
                key = Ed25519PrivateKey.from_private_bytes(data)
            else:
                raise ValueError
        except (ValueError, TypeError):  # never the parser's text: it may quote the file
            raise KeyFileError(
                f"signing key {path}: not an unencrypted Ed25519 private key (PEM PKCS #8 or "
                "raw 32 bytes; `linkguard keys generate` writes one)"
            ) from None
        if not isinstance(key, Ed25519PrivateKey):
            raise KeyFileError(f"signing key {path}: a {type(key).__name__}, not Ed25519")
        return cls(key)

    def seal(self, body: bytes) -> bytes:
        """``body`` (a message's UTF-8 JSON) in a signed envelope, as bytes to publish."""
        sig = base64.b64encode(self._key.sign(body)).decode("ascii")
        doc = {
            "v": ENVELOPE_VERSION,
            "alg": ALG,
            "key_id": self.key_id,
            "sig": sig,
            "body": body.decode("utf-8"),
        }
        return json.dumps(doc, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def envelope_of(payload: bytes) -> Envelope | None:
    """The envelope ``payload`` is, or None when it is not one (a plain message: not a JSON
    object with a ``sig`` member). Raises :class:`SignatureError` (``bad_envelope``) for an
    object with ``sig`` that is not a valid envelope."""
    if b'"sig"' not in payload:  # a plain message: the common case without keys, no parse
        return None
    try:
        doc = json.loads(payload)
    except (ValueError, RecursionError):
        return None  # not JSON: the plain decoder says so
    if not isinstance(doc, dict) or "sig" not in doc:
        return None
    try:
        return Envelope.model_validate(doc)
    except ValidationError as exc:
        errs = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or '<root>'}: {e['msg']}"
            for e in exc.errors()[:3]
        )
        raise SignatureError("bad_envelope", errs) from None


def unwrap(payload: bytes, verifier: Verifier | None, *, require: bool = True) -> Unwrapped:
    """The message inside ``payload``.

    With ``verifier``: an envelope must carry its key id and a valid signature, and a plain
    message is refused (``unsigned``) unless ``require`` is False. Without one: an envelope's
    body is returned unverified (``verified`` False) and a plain message as it is. Raises
    :class:`SignatureError`; a payload that is neither JSON nor an envelope comes back as a
    plain message for the decoder to refuse (unless signatures are required)."""
    env = envelope_of(payload)
    if env is None:
        if verifier is not None and require:
            raise SignatureError("unsigned", "not a signed envelope; signatures are required")
        return Unwrapped(payload, signed=False, verified=False)
    if verifier is None:
        try:
            body = env.body.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise SignatureError("bad_envelope", str(exc)[:200]) from None
        return Unwrapped(body, signed=True, verified=False)
    return Unwrapped(verifier.verify(env), signed=True, verified=True)


@dataclass(frozen=True)
class Mismatch:
    """Why an agent drops the service's plans for good, and which side must change:
    ``missing`` is ``service_signing_key`` (the service does not sign, this agent requires
    it) or ``agent_public_key`` (the service signs with ``key_id``, a key this agent does not
    have); ``hint`` says the fix."""

    reason: str
    missing: Literal["service_signing_key", "agent_public_key"]
    key_id: str | None
    hint: str


def mismatch(exc: SignatureError, own_key_id: str | None) -> Mismatch | None:
    """The configuration mismatch behind ``exc`` (a plan or peer routes refused by an agent
    that verifies with the key ``own_key_id``), or None when ``exc`` is a bad message rather
    than a mismatch (``bad_envelope``, ``bad_signature``: a forgery or a corrupted message,
    dropped and counted like any). Pure."""
    if exc.reason == "unsigned":
        return Mismatch(
            exc.reason,
            "service_signing_key",
            None,
            "the topology service does not sign plans: set signing_key on the topology "
            "service (`linkguard keys generate`; its service.pub is this agent's "
            "service_public_key), or require_signed_plans: false here while rolling keys out",
        )
    if exc.reason == "unknown_key":
        return Mismatch(
            exc.reason,
            "agent_public_key",
            exc.key_id,
            f"plans are signed with key {exc.key_id}, unknown here (this agent verifies with "
            f"{own_key_id}): set service_public_key to the public key of the service's "
            "signing_key (its service.pub), or sign the service with the key this agent has",
        )
    return None


def generate_keys(out: Path, *, force: bool = False) -> tuple[Path, Path]:
    """Write a new key pair in ``out`` (created if missing): ``service.key`` (PEM PKCS #8,
    mode 0600) and ``service.pub`` (PEM SubjectPublicKeyInfo, mode 0644). Returns their
    paths. Raises FileExistsError when either exists and ``force`` is False (nothing is
    written then), OSError when ``out`` cannot be written."""
    if out.exists() and not out.is_dir():
        raise NotADirectoryError(f"{out} is not a directory")
    out.mkdir(parents=True, exist_ok=True)
    key_path, pub_path = out / PRIVATE_KEY_FILE, out / PUBLIC_KEY_FILE
    there = [p for p in (key_path, pub_path) if p.exists()]
    if there and not force:
        raise FileExistsError(
            f"{' and '.join(map(str, there))} already exist{'s' if len(there) == 1 else ''}; "
            "--force replaces the key pair (every agent then needs the new public key)"
        )
    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    pub = key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    _write(key_path, pem, 0o600)
    _write(pub_path, pub, 0o644)
    return key_path, pub_path


def _write(path: Path, data: bytes, mode: int) -> None:
    """Write ``data`` to ``path`` through a temporary file created with ``mode`` (a private
    key is never readable by others, not even for a moment), then rename."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, mode)
    try:
        os.fchmod(fd, mode)  # the umask may have taken bits off a 0644 public key
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _read_key_file(path: Path, what: str) -> bytes:
    try:
        with path.open("rb") as f:
            data = f.read(_MAX_KEY_FILE_BYTES + 1)
    except OSError as exc:
        raise KeyFileError(f"{what} {path}: {exc.strerror or exc}") from None
    if len(data) > _MAX_KEY_FILE_BYTES:
        raise KeyFileError(f"{what} {path}: larger than {_MAX_KEY_FILE_BYTES} bytes")
    return data
