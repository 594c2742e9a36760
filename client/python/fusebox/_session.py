"""Session documents: what another process needs to talk to an allocated sandbox, renew its
lease and release it (the Go SDK's client.Session; the JSON is the same, bytes in standard
base64, so that a session exported by either SDK or by ``fusebox run --keep --session-out``
opens in the other).

The agent key travels sealed (AES-256-GCM under a 32-byte key the caller supplies, with the
format, the sandbox's id and its key as additional data, so that a sealed key moved into
another document does not open), in the clear, or not at all (the caller keeps it and passes
it to connect). Whoever holds the document, and the seal key when there is one, can do what
the allocating agent could: it is as secret as the agent key.
"""

from __future__ import annotations

import base64
import datetime
import json
import os
from typing import Any, Dict, Mapping, Optional, Union

import grpc
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from . import _core
from ._proto.manager.v1 import manager_pb2
from .errors import InvalidArgumentError, LeaseError, SessionKeyError, from_rpc
from .keys import AgentKey

VERSION = "fusebox.session/v1"
SEAL_AES_GCM = "aes-256-gcm"
SEAL_NONE = "none"
SEAL_KEY_SIZE = 32

SessionLike = Union[str, bytes, Mapping[str, Any], os.PathLike]

_BYTES = ("sandbox_public_key", "sandbox_certificate", "agent_public_key")
_REQUIRED = ("sandbox_id", "endpoint", "sandbox_public_key", "manager", "lease_token", "agent_public_key")
_FIELDS = set(_REQUIRED) | {"version", "sandbox_certificate", "agent_key"}


def _b64(b: bytes) -> str:
    return base64.b64encode(b).decode()


def _aad(doc: Mapping[str, Any]) -> bytes:
    return VERSION.encode() + b"\0" + doc["sandbox_id"].encode() + b"\0" + doc["sandbox_public_key"]


def _pkcs8(key: AgentKey) -> bytes:
    return key._key.private_bytes(serialization.Encoding.DER, serialization.PrivateFormat.PKCS8,
                                  serialization.NoEncryption())


def export(resp: manager_pb2.AllocateResponse, manager: str, key: AgentKey, seal_key: Optional[bytes],
           plain: bool) -> str:
    """The session document of an allocation (its answer resp, from the manager at manager,
    for key), as JSON: the agent key sealed with seal_key, in the clear with plain, else left out."""
    if seal_key is not None and plain:
        raise InvalidArgumentError("export_session: seal_key and plain both given: choose one")
    doc: Dict[str, Any] = {
        "version": VERSION, "sandbox_id": resp.sandbox_id, "endpoint": resp.endpoint,
        "sandbox_public_key": resp.sandbox_public_key, "manager": manager, "lease_token": resp.lease_token,
        "agent_public_key": key.public_key,
    }
    if resp.sandbox_certificate:
        doc["sandbox_certificate"] = resp.sandbox_certificate
    if plain:
        doc["agent_key"] = {"seal": SEAL_NONE, "data": _b64(_pkcs8(key))}
    elif seal_key is not None:
        nonce = os.urandom(12)
        data = _aead(seal_key).encrypt(nonce, _pkcs8(key), _aad(doc))
        doc["agent_key"] = {"seal": SEAL_AES_GCM, "nonce": _b64(nonce), "data": _b64(data)}
    out = {k: (_b64(v) if k in _BYTES else v) for k, v in doc.items()}
    return json.dumps(out, indent=2) + "\n"


def _aead(seal_key: bytes) -> AESGCM:
    if not isinstance(seal_key, (bytes, bytearray)) or len(seal_key) != SEAL_KEY_SIZE:
        n = len(seal_key) if isinstance(seal_key, (bytes, bytearray)) else type(seal_key).__name__
        raise InvalidArgumentError(f"seal key: {n} bytes, want {SEAL_KEY_SIZE}")
    return AESGCM(bytes(seal_key))


def parse(session: SessionLike) -> Dict[str, Any]:
    """Reads and checks a session: a JSON string or bytes, a path to a file holding one, or a
    mapping as json.loads makes it. Byte fields come back decoded."""
    if isinstance(session, os.PathLike) or (isinstance(session, str) and not session.lstrip().startswith("{")):
        try:
            with open(session, "rb") as f:
                session = f.read()
        except OSError as e:
            raise InvalidArgumentError(f"reading session: {e}") from None
    if isinstance(session, (str, bytes)):
        try:
            session = json.loads(session)
        except ValueError as e:
            raise InvalidArgumentError(f"reading session: {e}") from None
    if not isinstance(session, Mapping):
        raise InvalidArgumentError(f"reading session: want a JSON object, got {type(session).__name__}")
    doc = dict(session)
    if doc.get("version") != VERSION:
        raise InvalidArgumentError(f"reading session: version {doc.get('version')!r}, this client reads {VERSION!r}")
    unknown = sorted(set(doc) - _FIELDS)
    if unknown:
        raise InvalidArgumentError(f"reading session: unknown field {unknown[0]!r}")
    for f in _REQUIRED:
        if not doc.get(f):
            raise InvalidArgumentError(f"reading session: {f} is missing")
    try:
        for f in _BYTES:
            doc[f] = base64.b64decode(doc.get(f) or "", validate=True)
        k = doc.get("agent_key")
        if k is not None:
            if k.get("seal") not in (SEAL_AES_GCM, SEAL_NONE):
                raise InvalidArgumentError(
                    f"reading session: agent key sealed with {k.get('seal')!r}, want {SEAL_AES_GCM!r} or {SEAL_NONE!r}")
            doc["agent_key"] = {"seal": k["seal"], "nonce": base64.b64decode(k.get("nonce") or "", validate=True),
                                "data": base64.b64decode(k.get("data") or "", validate=True)}
    except (ValueError, TypeError, AttributeError) as e:
        raise InvalidArgumentError(f"reading session: {e}") from None
    return doc


def open_key(doc: Mapping[str, Any], seal_key: Optional[bytes], key: Optional[AgentKey]) -> AgentKey:
    """The session's agent key: key if given, else the document's, opened with seal_key when
    sealed. SessionKeyError when it does not open or is not the document's agent key."""
    if key is None:
        k = doc.get("agent_key")
        if k is None:
            raise InvalidArgumentError("session: it carries no agent key: pass key=")
        der = k["data"]
        if k["seal"] == SEAL_AES_GCM:
            if seal_key is None:
                raise InvalidArgumentError("session: the agent key is sealed: pass seal_key=")
            try:
                der = _aead(seal_key).decrypt(k["nonce"], k["data"], _aad(doc))
            except InvalidArgumentError:
                raise
            except Exception:
                raise SessionKeyError("session: wrong key: the agent key does not open with this seal key "
                                      "(or the document was altered)") from None
        try:
            key = AgentKey(serialization.load_der_private_key(der, password=None))
        except (ValueError, TypeError) as e:
            raise InvalidArgumentError(f"session: agent key: {e}") from None
    if key.public_key != doc["agent_public_key"]:
        raise SessionKeyError(f"session: wrong key: this agent key is not the one sandbox {doc['sandbox_id']} was allocated for")
    return key


def prepare(session: SessionLike, seal_key: Optional[bytes], key: Optional[AgentKey], batch_bytes: Optional[int],
            concurrency: int):
    """A connect call's arguments, checked before anything is dialed: the document, its agent
    key (open_key) and the batch limit."""
    doc = parse(session)
    k = open_key(doc, seal_key, key)
    batch = _core.batch_bytes(batch_bytes)
    if not isinstance(concurrency, int) or concurrency <= 0:
        raise InvalidArgumentError(f"concurrency: want a positive integer, got {concurrency!r}")
    return doc, k, batch


def response(doc: Mapping[str, Any], renewed: manager_pb2.RenewResponse) -> manager_pb2.AllocateResponse:
    """The allocation answer the session stands for, with the lease's expiry from renewed:
    what a Sandbox is connected from."""
    resp = manager_pb2.AllocateResponse(sandbox_id=doc["sandbox_id"], endpoint=doc["endpoint"],
                                        sandbox_public_key=doc["sandbox_public_key"], lease_token=doc["lease_token"],
                                        sandbox_certificate=doc.get("sandbox_certificate") or b"")
    resp.lease_expires.CopyFrom(renewed.lease_expires)
    return resp


def renew_request(doc: Mapping[str, Any]) -> manager_pb2.RenewRequest:
    return manager_pb2.RenewRequest(sandbox_id=doc["sandbox_id"], lease_token=doc["lease_token"])


def lease_refused(e: grpc.RpcError, sandbox_id: str, hint: str = ""):
    """The error for a Renew that failed: LeaseError when the lease is not held (ended,
    unknown, another token), else the call's own."""
    if e.code() in (grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.NOT_FOUND, grpc.StatusCode.PERMISSION_DENIED):
        return LeaseError(f"session: the sandbox's lease is no longer held: sandbox {sandbox_id}: {e.details()}",
                          code=e.code(), details=e.details())
    return from_rpc(e, f"renewing lease of {sandbox_id}", "lease", hint)


def expires(r: manager_pb2.RenewResponse) -> datetime.datetime:
    return r.lease_expires.ToDatetime(tzinfo=datetime.timezone.utc)
