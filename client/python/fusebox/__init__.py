"""fusebox: run AI agents' generated code in single-use gVisor sandboxes.

Allocate a sandbox from a fusebox manager, talk to it directly over key-pinned mTLS, and
release it::

    import fusebox

    with fusebox.Sandbox.allocate("unix:///run/fusebox/manager.sock") as sb:
        sb.write_tree("./repo", "repo")
        res = sb.exec("cd repo && python3 -m pytest -q", timeout=600)
        print(res.exit_code, res.text)

The agent's key is generated in memory and never written anywhere. :mod:`fusebox.aio` is the
same API for asyncio.
"""

from ._core import DEFAULT_MANAGER
from ._sync import ExecStream, Manager, OutputStream, Process, Sandbox, TaskGroup
from ._forward import Forward, PortConnection
from ._watch import Watch
from .errors import (AlreadyExistsError, BadAddressError, CancelledError, CommandError, CommandTimeoutError,
                     DeadlineExceededError, FailedPreconditionError, FuseboxError, InvalidArgumentError, LeaseError,
                     LimitError, NotFoundError, OutOfRangeError, PathEscapeError, PermissionDeniedError, PinningError,
                     SessionKeyError, UnauthenticatedError, UnavailableError)
from .keys import SERVER_NAME, AgentKey
from .types import (DEFAULT_BATCH_BYTES, ExecResult, File, FileInfo, Files, GrepMatch, GrepResult, Listing, OutputChunk,
                    OutputDropped, ProcessExit, ProcessInfo, ProcessOutput, ReadStats, SandboxInfo, Symlink, WatchChange,
                    WatchOverflow, WriteStats)


def allocate(manager=None, **options) -> Sandbox:
    """Allocates a sandbox (see :meth:`Sandbox.allocate`)."""
    return Sandbox.allocate(manager, **options)


__all__ = [
    "allocate", "Manager", "Sandbox", "TaskGroup", "ExecStream", "AgentKey", "SERVER_NAME", "DEFAULT_MANAGER",
    "DEFAULT_BATCH_BYTES", "ExecResult", "OutputChunk", "File", "Symlink", "WriteStats", "ReadStats", "Files",
    "FileInfo", "Listing", "GrepMatch", "GrepResult", "SandboxInfo",
    "Process", "OutputStream", "ProcessInfo", "ProcessOutput", "OutputDropped", "ProcessExit",
    "Watch", "WatchChange", "WatchOverflow",
    "Forward", "PortConnection",
    "FuseboxError", "BadAddressError", "InvalidArgumentError", "PathEscapeError", "NotFoundError", "AlreadyExistsError",
    "FailedPreconditionError", "OutOfRangeError", "PermissionDeniedError", "UnauthenticatedError", "LimitError", "DeadlineExceededError", "UnavailableError", "LeaseError", "PinningError", "SessionKeyError",
    "CommandTimeoutError", "CommandError", "CancelledError",
]
