"""What the sync and asyncio APIs share for long-lived processes: requests, and the typed
values made of the Processes service's answers."""

from __future__ import annotations

import signal as _signal
from typing import Mapping, Optional, Sequence, Tuple, Union

from . import _core
from ._proto.sandbox.v1 import process_pb2, sandbox_pb2
from .errors import InvalidArgumentError
from .types import CommandLike, OutputDropped, ProcessExit, ProcessInfo, ProcessOutput

#: A signal: its number or a :class:`signal.Signals`.
SignalLike = Union[int, _signal.Signals]

#: A terminal's size: (rows, cols).
TerminalSize = Tuple[int, int]

_UINT32 = (1 << 32) - 1
_INT32 = (1 << 31) - 1


def _size(rows: object, cols: object, what: str) -> process_pb2.TerminalSize:
    """The wire form of a terminal size; the sandbox checks the range (1..65535 each)."""
    for v in (rows, cols):
        if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= _UINT32:
            raise InvalidArgumentError(f"{what}: want (rows, cols) as two positive integers, got {(rows, cols)!r}")
    return process_pb2.TerminalSize(rows=rows, cols=cols)  # type: ignore[arg-type]


def start_request(command: CommandLike, cwd: Optional[str], env: Optional[Mapping[str, str]],
                  unset: Optional[Sequence[str]], pty: Optional[TerminalSize], tag: str, idempotency_key: Optional[str],
                  group: str = "", order: int = 0) -> process_pb2.StartProcessRequest:
    """A StartProcessRequest: ``command`` as :meth:`fusebox.Sandbox.exec` takes it."""
    req = process_pb2.StartProcessRequest(cwd=cwd or "", tag=tag or "", idempotency_key=idempotency_key or "",
                                          task_group_id=group, logical_order=order)
    if isinstance(command, str):
        if not command.strip():
            raise InvalidArgumentError("start_process: the script is empty")
        req.script = command
    else:
        argv = list(command)
        if not argv or not all(isinstance(a, str) for a in argv):
            raise InvalidArgumentError(f"start_process: want a script string or a non-empty list of strings, got {command!r}")
        req.argv.extend(argv)
    if env:
        req.env.update({str(k): str(v) for k, v in env.items()})
    if unset:
        req.unset_env.extend(unset)
    if pty is not None:
        try:
            rows, cols = pty
        except (TypeError, ValueError):
            raise InvalidArgumentError(f"start_process: pty: want (rows, cols), got {pty!r}") from None
        req.pty.CopyFrom(_size(rows, cols, "start_process: pty"))
    return req


def wait_request(pid: str, timeout: Optional[_core.Seconds]) -> Tuple[process_pb2.WaitRequest, Optional[float]]:
    """A WaitRequest and the call's client-side deadline (None: none). A timeout of 0 asks
    once, without waiting (the wire's zero would mean no timeout)."""
    t = _core.seconds(timeout, "wait: timeout")
    req = process_pb2.WaitRequest(id=pid)
    if t is None:
        return req, None
    req.timeout.FromNanoseconds(max(int(t * 1e9), 1))
    return req, t + _core.EXEC_GRACE


def signal_request(pid: str, sig: SignalLike, group: bool) -> process_pb2.SignalRequest:
    """A SignalRequest; the sandbox checks the number's range (1..64)."""
    if isinstance(sig, bool) or not isinstance(sig, int) or not -_INT32 - 1 <= sig <= _INT32:
        raise InvalidArgumentError(f"signal: want a signal number or a signal.Signals, got {sig!r}")
    return process_pb2.SignalRequest(id=pid, signal=int(sig), group=bool(group))


def resize_request(pid: str, rows: int, cols: int) -> process_pb2.ResizeRequest:
    return process_pb2.ResizeRequest(id=pid, size=_size(rows, cols, "resize"))


def stdin_request(pid: str, data: Union[bytes, str]) -> process_pb2.WriteStdinRequest:
    if isinstance(data, str):
        data = data.encode()
    elif not isinstance(data, (bytes, bytearray, memoryview)):
        raise InvalidArgumentError(f"write_stdin: want bytes or str, got {type(data).__name__}")
    return process_pb2.WriteStdinRequest(id=pid, data=bytes(data))


def attach_request(pid: str, from_offset: int) -> process_pb2.AttachRequest:
    if isinstance(from_offset, bool) or not isinstance(from_offset, int) or not 0 <= from_offset < 1 << 64:
        raise InvalidArgumentError(f"attach: from_offset: want a non-negative integer, got {from_offset!r}")
    return process_pb2.AttachRequest(id=pid, from_offset=from_offset)


def event(ev: process_pb2.AttachEvent) -> Union[ProcessOutput, OutputDropped, ProcessExit, None]:
    """The typed value of one Attach event (None for a kind this SDK does not know)."""
    kind = ev.WhichOneof("event")
    if kind == "output":
        o = ev.output
        return ProcessOutput(o.offset, "stderr" if o.stream == sandbox_pb2.STREAM_KIND_STDERR else "stdout", o.data)
    if kind == "dropped":
        return OutputDropped(ev.dropped.from_offset, ev.dropped.to_offset)
    if kind == "exit":
        return ProcessExit._from_proto(ev.exit)
    return None


def find(infos: Sequence[ProcessInfo], pid: str) -> Optional[ProcessInfo]:
    return next((i for i in infos if i.id == pid), None)


def infos(resp: process_pb2.ListProcessesResponse) -> list:
    return [ProcessInfo._from_proto(p) for p in resp.processes]
