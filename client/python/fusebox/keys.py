"""Agent keys and the pinning of a sandbox's certificate.

The agent's key is generated in memory and never written anywhere: its private half goes
only to grpcio's TLS stack, in memory. grpcio can pin a peer only through a root
certificate, so the sandbox sends its self-signed certificate with its public key;
:func:`pinned_root` refuses the certificate unless its SubjectPublicKeyInfo is exactly the
pinned key, and the SDK then uses it as the only root, verified for :data:`SERVER_NAME`.
"""

from __future__ import annotations

import base64
import datetime
import threading
from typing import Literal, Optional, Union

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519
from cryptography.x509.oid import NameOID

from . import _der
from .errors import InvalidArgumentError, PinningError

#: The DNS name every sandbox certificate carries; the SDK verifies the sandbox for it. The
#: .invalid top-level domain never resolves: the name means only "the pinned sandbox".
SERVER_NAME = "sandbox.fusebox.invalid"

KeyType = Literal["ed25519", "p256"]
_PrivateKey = Union[ed25519.Ed25519PrivateKey, ec.EllipticCurvePrivateKey]


# The DER SubjectPublicKeyInfo of each key type the sandbox may hold, up to the key itself:
# Go's x509.MarshalPKIXPublicKey writes exactly these (id-Ed25519; id-ecPublicKey with
# prime256v1 and an uncompressed point), and the pin is compared byte for byte anyway.
_SPKI_PREFIXES = {
    "Ed25519": (bytes.fromhex("302a300506032b6570032100"), 32),
    "ECDSA P-256": (bytes.fromhex("3059301306072a8648ce3d020106082a8648ce3d03010703420004"), 64),
}


# PKCS #8 PrivateKeyInfo of an Ed25519 key up to its 32 raw bytes (RFC 8410).
_ED25519_PKCS8_PREFIX = bytes.fromhex("302e020100300506032b657004220420")


def _pem(label: str, der: bytes) -> bytes:
    b64 = base64.b64encode(der)
    lines = b"\n".join(b64[i:i + 64] for i in range(0, len(b64), 64))
    return b"-----BEGIN %s-----\n%s\n-----END %s-----\n" % (label.encode(), lines, label.encode())


class AgentKey:
    """An agent's keypair (Ed25519 by default, or ECDSA P-256), held in this process only.

    Its public half (:attr:`public_key`, DER SubjectPublicKeyInfo) goes with an allocation;
    the private half and the self-signed client certificate exist only as bytes in memory.
    """

    def __init__(self, private_key: _PrivateKey):
        if isinstance(private_key, ec.EllipticCurvePrivateKey):
            if not isinstance(private_key.curve, ec.SECP256R1):
                raise InvalidArgumentError(f"agent key: ECDSA curve {private_key.curve.name} (want P-256 or an Ed25519 key)")
        elif not isinstance(private_key, ed25519.Ed25519PrivateKey):
            raise InvalidArgumentError(f"agent key: {type(private_key).__name__} (want Ed25519 or ECDSA P-256)")
        self._key = private_key
        if isinstance(private_key, ed25519.Ed25519PrivateKey):
            # Fixed DER around the raw key, as cryptography encodes it (tested), without the
            # encoder lookups that cost OpenSSL 3 about 0.2 ms on every allocation.
            raw = private_key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
            self.public_key: bytes = _SPKI_PREFIXES["Ed25519"][0] + raw
        else:
            self.public_key = private_key.public_key().public_bytes(
                serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
        self._cert_pem: bytes | None = None
        self._key_pem: bytes | None = None

    @classmethod
    def generate(cls, kind: KeyType = "ed25519") -> "AgentKey":
        """Generates a fresh key in memory: "ed25519" (the default) or "p256"."""
        if kind == "ed25519":
            return cls(ed25519.Ed25519PrivateKey.generate())
        if kind == "p256":
            return cls(ec.generate_private_key(ec.SECP256R1()))
        raise InvalidArgumentError(f"agent key type {kind!r}: want 'ed25519' or 'p256'")

    def _credentials(self) -> tuple[bytes, bytes]:
        """Returns (private key PEM, self-signed certificate PEM), made once, in memory."""
        if self._cert_pem is None:
            name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "fusebox pinned key")])
            now = datetime.datetime.now(datetime.timezone.utc)
            cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
                    .public_key(self._key.public_key()).serial_number(x509.random_serial_number())
                    .not_valid_before(now - datetime.timedelta(hours=1))
                    .not_valid_after(now + datetime.timedelta(days=3650))
                    .sign(self._key, None if isinstance(self._key, ed25519.Ed25519PrivateKey) else hashes.SHA256()))
            if isinstance(self._key, ed25519.Ed25519PrivateKey):
                raw = self._key.private_bytes(serialization.Encoding.Raw, serialization.PrivateFormat.Raw,
                                              serialization.NoEncryption())
                self._key_pem = _pem("PRIVATE KEY", _ED25519_PKCS8_PREFIX + raw)
            else:
                self._key_pem = self._key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                        serialization.NoEncryption())
            self._cert_pem = cert.public_bytes(serialization.Encoding.PEM)
        assert self._key_pem is not None
        return self._key_pem, self._cert_pem

    def __repr__(self) -> str:  # never shows the private key
        kind = "Ed25519" if isinstance(self._key, ed25519.Ed25519PrivateKey) else "ECDSA P-256"
        return f"<AgentKey {kind} {self.public_key[-8:].hex()}>"


class KeysAhead:
    """One fresh agent key, with its certificate, made ahead in a background thread for the
    next allocation that brings no key of its own, as the Go SDK's kept Manager does: the
    key's generation and its certificate's signature then cost that allocation nothing.

    Each key is handed out once (take) and exists only in this process's memory; close drops
    the one waiting. Safe for concurrent use.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._next: Optional[AgentKey] = None  # guarded by _lock, as _making and _closed
        self._making = False
        self._closed = False

    def take(self) -> AgentKey:
        """Returns the key made ahead, or a fresh one made now when none is waiting."""
        with self._lock:
            key, self._next = self._next, None
        if key is None:
            key = AgentKey.generate()
        return key

    def prepare(self) -> None:
        """Starts making the next key in a background thread, unless one is waiting or being
        made (or the owner has closed)."""
        if self._start():
            threading.Thread(target=self._make, name="fusebox-key-ahead", daemon=True).start()

    def make(self) -> None:
        """Makes the next key in the calling thread, unless one is waiting or being made (or
        the owner has closed)."""
        if self._start():
            self._make()

    def _start(self) -> bool:
        """Reports whether a key should be made now, and if so marks it being made."""
        with self._lock:
            if self._closed or self._next is not None or self._making:
                return False
            self._making = True
            return True

    def _make(self) -> None:
        key: Optional[AgentKey] = None
        try:
            key = AgentKey.generate()
            key._credentials()
        except Exception:  # the next allocation makes its own key, and reports what fails
            key = None
        with self._lock:
            self._making = False
            if key is not None and not self._closed and self._next is None:
                self._next = key

    def close(self) -> None:
        """Drops the waiting key; prepare and make do nothing from now on."""
        with self._lock:
            self._closed, self._next = True, None


#: How long after an allocation answers the next key is made (KeysAhead): made at once, it
#: would compete with the allocation's first call for the CPU (the Go SDK waits for the
#: first call for the same reason).
PREPARE_AFTER = 0.05


def check_public_key(der: bytes, what: str = "sandbox key") -> None:
    """Raises PinningError unless der is a DER SubjectPublicKeyInfo of an Ed25519 or P-256 key."""
    if not der:
        raise PinningError(f"{what}: empty")
    for prefix, n in _SPKI_PREFIXES.values():
        if der.startswith(prefix) and len(der) == len(prefix) + n:
            return
    raise PinningError(f"{what}: not the DER SubjectPublicKeyInfo of an Ed25519 or ECDSA P-256 key "
                       f"({len(der)} bytes; want Ed25519 or ECDSA P-256)")


def pinned_root(certificate_der: bytes, sandbox_public_key: bytes) -> bytes:
    """Returns the sandbox certificate as PEM, to be the connection's only root, after checking it.

    It raises PinningError unless the certificate is one DER certificate whose
    SubjectPublicKeyInfo equals sandbox_public_key byte for byte and which names SERVER_NAME.
    The TLS stack then verifies the sandbox for SERVER_NAME against this root alone, so the
    server must prove it holds the pinned key.
    """
    check_public_key(sandbox_public_key)
    if not certificate_der:
        raise PinningError("the manager returned no sandbox certificate: the manager or sandbox predates "
                           "sandbox_certificate; upgrade them (the Python SDK pins through it)")
    try:
        spki, names = _der.certificate_facts(certificate_der)
    except _der.DERError as e:
        raise PinningError(f"sandbox certificate: not a DER X.509 certificate: {e}") from None
    if spki != sandbox_public_key:
        raise PinningError("sandbox certificate: its key is not sandbox_public_key; refusing to trust it")
    if SERVER_NAME not in names:
        raise PinningError(f"sandbox certificate: does not name {SERVER_NAME} (names {names})")
    return _pem("CERTIFICATE", certificate_der)
