"""Typed exceptions of the fusebox SDK, and the one place where gRPC status codes become them.

Every error the SDK raises is a :class:`FuseboxError`. Errors that come from a gRPC call carry
the call's status code (``code``) and the server's message (``details``); the exception's
message says what the SDK was doing and what to do next where that is known.
"""

from __future__ import annotations

import re
from typing import List, Optional, TYPE_CHECKING

import grpc

if TYPE_CHECKING:  # pragma: no cover
    from .types import ExecResult

__all__ = [
    "FuseboxError",
    "BadAddressError",
    "InvalidArgumentError",
    "PathEscapeError",
    "NotFoundError",
    "AlreadyExistsError",
    "FailedPreconditionError",
    "OutOfRangeError",
    "PermissionDeniedError",
    "UnauthenticatedError",
    "LimitError",
    "DeadlineExceededError",
    "UnavailableError",
    "LeaseError",
    "PinningError",
    "SessionKeyError",
    "CommandTimeoutError",
    "CommandError",
    "CancelledError",
]


class FuseboxError(Exception):
    """Base class of every error the SDK raises.

    ``code`` is the gRPC status code when the error came from a call (else None) and
    ``details`` the server's message.
    """

    def __init__(self, message: str, code: Optional[grpc.StatusCode] = None, details: str = ""):
        super().__init__(message)
        self.code = code
        self.details = details


class InvalidArgumentError(FuseboxError, ValueError):
    """A malformed request: a bad key, path, template, egress entry or TTL; a signal number
    outside 1..64 or a terminal size outside 1..65535 (INVALID_ARGUMENT)."""


class BadAddressError(InvalidArgumentError):
    """An address that is neither ``unix:///absolute/path`` nor ``tcp://host:port``."""


class PathEscapeError(FuseboxError, PermissionError):
    """A path that would leave the sandbox's workspace (PERMISSION_DENIED from a sandbox)."""


class NotFoundError(FuseboxError, FileNotFoundError):
    """A file, a sandbox, or a process id the sandbox does not list, that does not exist
    (NOT_FOUND)."""


class AlreadyExistsError(FuseboxError, FileExistsError):
    """The destination exists (ALREADY_EXISTS)."""


class FailedPreconditionError(FuseboxError):
    """The operation does not fit the current state (FAILED_PRECONDITION): from a sandbox, a
    file system outcome such as "not a directory"; from the manager's allocation, a request it
    cannot serve as configured, such as an egress allowlist its allocator cannot enforce (it
    refuses rather than hand out a sandbox without it); for a long-lived process, one that has
    exited, standard input that is closed, a resize without a terminal, or an idempotency key
    reused for a different request. Retrying does not help."""


class OutOfRangeError(FuseboxError, ValueError):
    """An offset past the end of what there is (OUT_OF_RANGE): attaching to a process's output
    from an offset beyond what it has written so far."""


class PermissionDeniedError(FuseboxError, PermissionError):
    """The manager's authorisation policy refuses this caller's allocation (PERMISSION_DENIED
    from Allocate): a template or egress destinations outside the caller's grant, or a caller
    that may not allocate at all.

    ``template`` names the refused template and ``destinations`` the refused egress entries,
    when the manager's message names them (else None and []).
    """

    def __init__(self, message: str, code: Optional[grpc.StatusCode] = None, details: str = ""):
        super().__init__(message, code, details)
        m = re.search(r'may not use template "((?:[^"\\]|\\.)*)"', details)
        self.template: Optional[str] = m.group(1) if m else None
        m = re.search(r"egress destinations? (.+?) (?:is|are) outside", details)
        self.destinations: List[str] = [d.strip() for d in m.group(1).split(",")] if m else []


class UnauthenticatedError(FuseboxError, PermissionError):
    """The manager did not accept the caller's credentials (UNAUTHENTICATED): no token, a
    token that is bad, expired or for another audience (see ``token_file``), or a plaintext
    call to a manager that serves TLS."""


class LimitError(FuseboxError):
    """A server limit: disk, processes, message size, pool capacity (RESOURCE_EXHAUSTED)."""


class DeadlineExceededError(FuseboxError, TimeoutError):
    """A call's deadline passed (DEADLINE_EXCEEDED)."""


class UnavailableError(FuseboxError, ConnectionError):
    """The peer cannot be reached or failed transiently (UNAVAILABLE): retry, or check it runs."""


class LeaseError(FuseboxError):
    """Renew or Release refused: the lease is not this caller's (a wrong lease token,
    PERMISSION_DENIED), or it has ended (FAILED_PRECONDITION)."""


class PinningError(FuseboxError):
    """The sandbox's identity does not match the pinned key: the SDK refused to talk to it."""


class SessionKeyError(FuseboxError):
    """A session's agent key does not open with the seal key given (or the document was
    altered), or the key given is not the one the sandbox was allocated for."""


class CancelledError(FuseboxError):
    """The call was cancelled (CANCELLED)."""


class CommandTimeoutError(FuseboxError, TimeoutError):
    """The command ran past its timeout and was killed with its whole process group.

    ``result`` holds what it printed before that and how it ended.
    """

    def __init__(self, message: str, result: "ExecResult"):
        super().__init__(message)
        self.result = result


class CommandError(FuseboxError):
    """A command exited non-zero while ``check=True`` was asked; ``result`` says how."""

    def __init__(self, message: str, result: "ExecResult"):
        super().__init__(message)
        self.result = result


_SANDBOX = {
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgumentError,
    grpc.StatusCode.PERMISSION_DENIED: PathEscapeError,
    grpc.StatusCode.NOT_FOUND: NotFoundError,
    grpc.StatusCode.ALREADY_EXISTS: AlreadyExistsError,
    grpc.StatusCode.FAILED_PRECONDITION: FailedPreconditionError,
    grpc.StatusCode.OUT_OF_RANGE: OutOfRangeError,
    grpc.StatusCode.RESOURCE_EXHAUSTED: LimitError,
    grpc.StatusCode.DEADLINE_EXCEEDED: DeadlineExceededError,
    grpc.StatusCode.UNAVAILABLE: UnavailableError,
    grpc.StatusCode.CANCELLED: CancelledError,
    grpc.StatusCode.UNAUTHENTICATED: UnauthenticatedError,
}

# The manager's calls other than Renew and Release: its PERMISSION_DENIED is the
# authorisation policy's refusal, its FAILED_PRECONDITION a request its allocator cannot serve
# (manager/service.go's toStatus).
_MANAGER = dict(_SANDBOX)
_MANAGER[grpc.StatusCode.PERMISSION_DENIED] = PermissionDeniedError

# Renew and Release: their PERMISSION_DENIED is a wrong lease token, their FAILED_PRECONDITION
# an ended lease.
_LEASE = dict(_MANAGER)
_LEASE[grpc.StatusCode.PERMISSION_DENIED] = LeaseError
_LEASE[grpc.StatusCode.FAILED_PRECONDITION] = LeaseError

_TABLES = {"sandbox": _SANDBOX, "manager": _MANAGER, "lease": _LEASE}

# Substrings of grpc's UNAVAILABLE details that mean the TLS handshake with the sandbox
# failed: with pinned keys that is a peer whose key is not the pinned one (or that refused
# ours).
_HANDSHAKE = ("ssl handshake failed", "certificate verify failed", "peer name", "handshake failed",
              "certificate required", "bad certificate", "unknown ca")


# Substrings of grpc's UNAVAILABLE details that mean no server answered: no socket, a refused
# or failed connection, a name that does not resolve, a TLS handshake that failed. Any other
# UNAVAILABLE is the server's own answer (the manager's allocator failed, say).
_UNREACHED = ("failed to connect", "connection refused", "no such file or directory", "dns resolution failed",
              "name resolution", "handshake failed", "socket closed", "connection reset", "network is unreachable")


def unreachable(err: grpc.RpcError) -> bool:
    """Whether a failed call reached no server at all (rather than being answered with an error)."""
    code = err.code() if callable(getattr(err, "code", None)) else None
    if code != grpc.StatusCode.UNAVAILABLE:
        return False
    details = ((err.details() if callable(getattr(err, "details", None)) else None) or "").lower()
    return any(s in details for s in _UNREACHED)


def from_rpc(err: grpc.RpcError, doing: str, service: str = "sandbox", hint: str = "") -> FuseboxError:
    """Returns the typed exception for a failed gRPC call.

    ``doing`` says what the SDK was doing ("writing foo.txt"), ``service`` whose answer it is
    ("sandbox", "manager", or "lease" for the manager's Renew and Release: their
    PERMISSION_DENIED and FAILED_PRECONDITION mean different things) and ``hint`` what to do
    next, appended to the message.
    """
    code = err.code() if callable(getattr(err, "code", None)) else grpc.StatusCode.UNKNOWN
    details = (err.details() if callable(getattr(err, "details", None)) else None) or str(err)
    table = _TABLES[service]
    cls = table.get(code, FuseboxError)
    if service == "sandbox" and code == grpc.StatusCode.UNAVAILABLE and any(s in details.lower() for s in _HANDSHAKE):
        cls = PinningError
        hint = hint or "the sandbox did not prove the pinned key, or refused this agent's key"
    msg = f"{doing}: {code.name if code else 'UNKNOWN'}: {details}"
    if hint:
        msg += f" ({hint})"
    return cls(msg, code=code, details=details)
