"""The two facts the SDK pins on, read from a sandbox certificate's DER: its
SubjectPublicKeyInfo and its DNS names.

A strict reader of DER (RFC 5280's Certificate structure, definite minimal lengths, no
trailing bytes), written out because the general parsers cost about a millisecond per
certificate with Debian's OpenSSL 3 and this check sits on every allocation's path. It reads
nothing else: the certificate's signature, validity and the server's proof of the key are
checked by the TLS stack, which gets this same certificate as its only root.
"""

from __future__ import annotations

from typing import List, Tuple

SEQUENCE, INTEGER, OID, OCTET_STRING, BOOLEAN = 0x30, 0x02, 0x06, 0x04, 0x01
VERSION, EXTENSIONS, DNS_NAME = 0xA0, 0xA3, 0x82  # [0] and [3] EXPLICIT; GeneralName [2]
SUBJECT_ALT_NAME = bytes([0x55, 0x1D, 0x11])  # 2.5.29.17


class DERError(ValueError):
    """The bytes are not the DER of the structure expected."""


def _header(b: bytes, i: int, end: int) -> Tuple[int, int, int]:
    """Reads the element starting at b[i] inside b[:end]: (tag, start of contents, end)."""
    if i + 2 > end:
        raise DERError(f"truncated at byte {i}")
    tag, n = b[i], b[i + 1]
    i += 2
    if tag & 0x1F == 0x1F:
        raise DERError(f"multi-byte tag at byte {i - 2}")
    if n & 0x80:
        k = n & 0x7F
        if k == 0 or k > 3 or i + k > end:
            raise DERError(f"bad length at byte {i - 1}")
        n = int.from_bytes(b[i:i + k], "big")
        if n < 0x80 or b[i] == 0:
            raise DERError(f"length at byte {i - 1} is not minimal")
        i += k
    if i + n > end:
        raise DERError(f"element at byte {i} runs past its container")
    return tag, i, i + n


def _children(b: bytes, start: int, end: int) -> List[Tuple[int, int, int, int]]:
    """The elements that exactly fill b[start:end]: (tag, offset, contents start, end)."""
    out = []
    i = start
    while i < end:
        tag, s, e = _header(b, i, end)
        out.append((tag, i, s, e))
        i = e
    return out


def _expect(tag: int, want: int, what: str) -> None:
    if tag != want:
        raise DERError(f"{what}: tag 0x{tag:02x}, want 0x{want:02x}")


def certificate_facts(cert: bytes) -> Tuple[bytes, List[str]]:
    """Returns (the DER SubjectPublicKeyInfo, the subjectAltName DNS names) of a certificate.

    Raises DERError unless cert is one DER Certificate with nothing after it.
    """
    tag, s, e = _header(cert, 0, len(cert))
    _expect(tag, SEQUENCE, "certificate")
    if e != len(cert):
        raise DERError(f"{len(cert) - e} bytes after the certificate")
    top = _children(cert, s, e)  # tbsCertificate, signatureAlgorithm, signatureValue
    if len(top) != 3:
        raise DERError(f"certificate has {len(top)} elements, want 3")
    _expect(top[0][0], SEQUENCE, "tbsCertificate")
    tbs = _children(cert, top[0][2], top[0][3])
    k = 1 if tbs and tbs[0][0] == VERSION else 0
    if len(tbs) < k + 6:
        raise DERError("tbsCertificate is too short")
    _expect(tbs[k][0], INTEGER, "serialNumber")
    for j, what in enumerate(("signature", "issuer", "validity", "subject", "subjectPublicKeyInfo"), k + 1):
        _expect(tbs[j][0], SEQUENCE, what)
    _, off, _, end = tbs[k + 5]
    spki = cert[off:end]
    names: List[str] = []
    for tag, _, cs, ce in tbs[k + 6:]:
        if tag != EXTENSIONS:
            continue
        (t, _, xs, xe), *rest = _children(cert, cs, ce) or [(0, 0, 0, 0)]
        _expect(t, SEQUENCE, "extensions")
        if rest:
            raise DERError("bytes after the extensions")
        for t, _, es, ee in _children(cert, xs, xe):
            _expect(t, SEQUENCE, "extension")
            parts = _children(cert, es, ee)
            if len(parts) == 3 and parts[1][0] == BOOLEAN:
                parts = [parts[0], parts[2]]
            if len(parts) != 2:
                raise DERError("extension: want extnID, [critical,] extnValue")
            _expect(parts[0][0], OID, "extnID")
            _expect(parts[1][0], OCTET_STRING, "extnValue")
            if cert[parts[0][2]:parts[0][3]] != SUBJECT_ALT_NAME:
                continue
            gn = _children(cert, parts[1][2], parts[1][3])
            if len(gn) != 1:
                raise DERError("subjectAltName: want one GeneralNames")
            _expect(gn[0][0], SEQUENCE, "GeneralNames")
            for gt, _, gs, ge in _children(cert, gn[0][2], gn[0][3]):
                if gt == DNS_NAME:
                    try:
                        names.append(cert[gs:ge].decode("ascii"))
                    except UnicodeDecodeError:
                        raise DERError("dNSName is not ASCII") from None
    return spki, names
