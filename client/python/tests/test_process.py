"""Long-lived processes and terminals: unit tests of the requests and answers, then the sync
and asyncio APIs against the real ``fusebox local up``.

Every wait here is bounded by GUARD only so that a broken sandbox fails the test instead of
hanging it; nothing asserts on time.
"""

from __future__ import annotations

import asyncio
import datetime
import signal
import threading
from typing import Callable, List, Optional

import grpc
import pytest

import fusebox
import fusebox.aio
from fusebox import _process
from fusebox._proto.sandbox.v1 import process_pb2, sandbox_pb2
from fusebox.errors import from_rpc

from .test_unit import FakeRpcError

GUARD = 120.0

# Waits for the file "go" in the workspace, so that its output comes after start_process
# has returned, then idles until signalled.
LATE_OUTPUT = "echo early; while [ ! -e go ]; do sleep 0.05; done; echo late; echo to-stderr >&2; exec sleep 1000"
LISTED_SLEEPS = r"""for f in /proc/[0-9]*/cmdline; do tr '\0' ' ' < "$f" 2>/dev/null; echo; done | grep -c '^sleep 1000 $' || true"""


# ---- units: requests and answers ----

def test_start_request():
    r = _process.start_request("echo hi", "sub", {"A": 1}, ["B"], (24, 80), "web", "k1", "g", 3)
    assert (r.script, r.cwd, dict(r.env), list(r.unset_env)) == ("echo hi", "sub", {"A": "1"}, ["B"])
    assert (r.pty.rows, r.pty.cols, r.tag, r.idempotency_key) == (24, 80, "web", "k1")
    assert (r.task_group_id, r.logical_order) == ("g", 3)
    r = _process.start_request(["sleep", "1"], None, None, None, None, "", None)
    assert list(r.argv) == ["sleep", "1"] and not r.HasField("pty") and r.idempotency_key == "" and r.cwd == ""
    for bad in ("", " ", [], [1]):
        with pytest.raises(fusebox.InvalidArgumentError):
            _process.start_request(bad, None, None, None, None, "", None)  # type: ignore[arg-type]
    for pty in ((24,), (24, -1), ("24", 80), 24, (True, 80)):
        with pytest.raises(fusebox.InvalidArgumentError, match="pty"):
            _process.start_request("true", None, None, None, pty, "", None)  # type: ignore[arg-type]


def test_signal_wait_and_attach_requests():
    assert _process.signal_request("p1", signal.SIGTERM, True) == process_pb2.SignalRequest(id="p1", signal=15, group=True)
    assert _process.signal_request("p1", 9, False).signal == 9
    for bad in ("TERM", True, 1.0, 1 << 40):
        with pytest.raises(fusebox.InvalidArgumentError):
            _process.signal_request("p1", bad, False)  # type: ignore[arg-type]
    req, deadline = _process.wait_request("p1", None)
    assert not req.HasField("timeout") and deadline is None
    req, deadline = _process.wait_request("p1", datetime.timedelta(seconds=2))
    assert req.timeout.ToNanoseconds() == 2_000_000_000 and deadline is not None and deadline > 2
    req, _ = _process.wait_request("p1", 0)  # asks without waiting: never the wire's zero (no timeout)
    assert req.timeout.ToNanoseconds() == 1
    with pytest.raises(fusebox.InvalidArgumentError):
        _process.wait_request("p1", -1)
    with pytest.raises(fusebox.InvalidArgumentError):
        _process.attach_request("p1", -1)
    assert _process.stdin_request("p1", "é").data == "é".encode()
    with pytest.raises(fusebox.InvalidArgumentError):
        _process.stdin_request("p1", 3)  # type: ignore[arg-type]
    with pytest.raises(fusebox.InvalidArgumentError):
        _process.resize_request("p1", 0, -3)


def test_answers():
    started = datetime.datetime(2026, 1, 2, 3, 4, 5, tzinfo=datetime.timezone.utc)
    m = process_pb2.ProcessInfo(id="p7", tag="t", argv=["a", "b"], state=process_pb2.PROCESS_STATE_EXITED, exit_code=143,
                                signal="SIGTERM", pid=12, pty=True, output_start=5, output_end=9, task_group_id="g")
    m.started_at.FromDatetime(started)
    i = fusebox.ProcessInfo._from_proto(m)
    assert (i.id, i.tag, i.argv, i.state, i.running, i.exit_code, i.signal) == ("p7", "t", ["a", "b"], "exited", False, 143, "SIGTERM")
    assert (i.started_at, i.ended_at, i.pid, i.pty, i.output_start, i.output_end, i.task_group) == (started, None, 12, True, 5, 9, "g")
    assert fusebox.ProcessInfo._from_proto(process_pb2.ProcessInfo(state=process_pb2.PROCESS_STATE_RUNNING)).running

    ev = process_pb2.AttachEvent(output=process_pb2.ProcessOutput(offset=3, stream=sandbox_pb2.STREAM_KIND_STDERR, data=b"x"))
    assert _process.event(ev) == fusebox.ProcessOutput(3, "stderr", b"x")
    ev = process_pb2.AttachEvent(output=process_pb2.ProcessOutput(offset=0, stream=sandbox_pb2.STREAM_KIND_STDOUT, data=b"y"))
    assert _process.event(ev) == fusebox.ProcessOutput(0, "stdout", b"y")
    d = _process.event(process_pb2.AttachEvent(dropped=process_pb2.OutputDropped(from_offset=2, to_offset=10)))
    assert d == fusebox.OutputDropped(2, 10) and d.size == 8
    x = _process.event(process_pb2.AttachEvent(exit=process_pb2.ProcessExit(exit_code=1, signal="", output_end=4)))
    assert x == fusebox.ProcessExit(1, "", None, 4)
    assert _process.event(process_pb2.AttachEvent()) is None


@pytest.mark.parametrize("code,cls", [
    (grpc.StatusCode.NOT_FOUND, fusebox.NotFoundError),
    (grpc.StatusCode.OUT_OF_RANGE, fusebox.OutOfRangeError),
    (grpc.StatusCode.FAILED_PRECONDITION, fusebox.FailedPreconditionError),
    (grpc.StatusCode.RESOURCE_EXHAUSTED, fusebox.LimitError),
    (grpc.StatusCode.INVALID_ARGUMENT, fusebox.InvalidArgumentError),
])
def test_process_error_mapping(code, cls):
    e = from_rpc(FakeRpcError(code, "the reason"), "attaching to p1")
    assert type(e) is cls and e.code == code and str(e) == f"attaching to p1: {code.name}: the reason"


# ---- sync, against a real sandbox ----

class Follower:
    """A process's output read on a thread from an offset: stdout and stderr apart, the
    gaps, how it ended, and whether the offsets ran without a hole."""

    def __init__(self, p: fusebox.Process, from_offset: int = 0):
        self.stream = p.attach(from_offset)
        self.stdout, self.stderr = bytearray(), bytearray()
        self.dropped: List[fusebox.OutputDropped] = []
        self.next = from_offset
        self.holes: List[str] = []
        self.error: Optional[BaseException] = None
        self.done = False
        self.cond = threading.Condition()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            for c in self.stream:
                with self.cond:
                    if isinstance(c, fusebox.OutputDropped):
                        self.dropped.append(c)
                        self.next = c.to_offset
                    else:
                        if c.offset != self.next:
                            self.holes.append(f"chunk at {c.offset}, want {self.next}")
                        self.next = c.offset + len(c.data)
                        (self.stderr if c.stream == "stderr" else self.stdout).extend(c.data)
                    self.cond.notify_all()
        except BaseException as e:  # noqa: B902 - reported by until()
            self.error = e
        finally:
            with self.cond:
                self.done = True
                self.cond.notify_all()

    def until(self, what: str, pred: Callable[["Follower"], bool]) -> None:
        with self.cond:
            self.cond.wait_for(lambda: pred(self) or self.done, timeout=GUARD)
            assert pred(self), f"{what}: stdout {bytes(self.stdout)!r}, stderr {bytes(self.stderr)!r}, error {self.error!r}"

    def end(self) -> None:
        """Waits for the stream to end (the process's exit) and re-raises its error."""
        self.until("the end of the stream", lambda f: f.done)
        self.thread.join()
        if self.error is not None:
            raise self.error


def listed_sleeps(sb) -> int:
    return int(sb.exec(LISTED_SLEEPS).stdout)


def test_process_outlives_start_and_rereads(sandbox):
    p = sandbox.start_process(LATE_OUTPUT, tag="late")
    assert not p.existing and p.id
    sandbox.write_file("go", b"")  # only now, after start_process returned, does it go on
    f = Follower(sandbox.process(p.id))
    f.until("the late output", lambda f: f.stdout == b"early\nlate\n" and f.stderr == b"to-stderr\n")
    f.stream.close()
    f.end()  # close() ends an iteration without an error
    assert f.stream.exit is None and not f.holes and not f.dropped

    info = p.info()
    assert info.running and info.tag == "late" and info.script == LATE_OUTPUT and info.pid > 1 and not info.pty
    assert info.output_start == 0 and info.output_end == len(b"early\nlate\nto-stderr\n") and info.started_at is not None
    assert [i.id for i in sandbox.list_processes()] == [p.id]

    p.signal(signal.SIGTERM)
    done = sandbox.process(p.id).wait()
    assert (done.running, done.state, done.signal, done.exit_code) == (False, "exited", "SIGTERM", 143)
    assert done.ended_at is not None and done.ended_at >= done.started_at

    again = Follower(sandbox.process(p.id), 0)  # the whole output again, from offset 0, after the exit
    again.end()
    assert (bytes(again.stdout), bytes(again.stderr), again.holes, again.dropped) == (b"early\nlate\n", b"to-stderr\n", [], [])
    x = again.stream.exit
    assert x is not None and (x.exit_code, x.signal, x.output_end) == (143, "SIGTERM", done.output_end)
    tail = Follower(p, done.output_end - 1)  # the last byte only: every line ends with it
    tail.end()
    assert bytes(tail.stdout + tail.stderr) == b"\n" and not tail.holes


def test_process_idempotency_key(sandbox):
    a = sandbox.start_process(["sleep", "1000"], idempotency_key="key-1", tag="once")
    b = sandbox.start_process(["sleep", "1000"], idempotency_key="key-1", tag="once")
    assert b.id == a.id and b.existing and not a.existing
    assert [i.id for i in sandbox.list_processes()] == [a.id]
    with pytest.raises(fusebox.FailedPreconditionError):
        sandbox.start_process(["sleep", "999"], idempotency_key="key-1", tag="once")
    c = sandbox.start_process(["sleep", "1000"], idempotency_key="key-2")
    assert c.id != a.id and not c.existing


def test_process_repl_over_stdin(sandbox):
    p = sandbox.start_process(["python3", "-i", "-q", "-u"], tag="repl")
    f = Follower(p)
    for line, answer in [("1+2\n", b"3\n"), ("x = 6 * 7\n", b""), ("x\n", b"42\n"), ("'ab' * 3\n", b"'ababab'\n")]:
        before = bytes(f.stdout)
        p.write_stdin(line)
        if answer:
            f.until(f"the answer to {line!r}", lambda f: f.stdout == before + answer)
    p.close_stdin()
    info = p.wait()
    assert not info.running and info.exit_code == 0
    f.end()
    assert f.stream.exit is not None and f.stream.exit.exit_code == 0 and b">>> " in f.stderr
    with pytest.raises(fusebox.FailedPreconditionError):
        p.write_stdin("1\n")


def test_process_pty_size_after_resize(sandbox):
    p = sandbox.start_process("stty size; read l; stty size", pty=(24, 80))
    f = Follower(p)
    f.until("the first size", lambda f: b"24 80\r\n" in f.stdout)
    p.resize(50, 132)
    p.write_stdin("go\n")
    f.until("the size after the resize", lambda f: b"50 132\r\n" in f.stdout)
    info = p.wait()
    assert info.exit_code == 0 and info.pty
    f.end()
    assert f.stderr == b""  # a terminal is one stream
    with pytest.raises(fusebox.FailedPreconditionError):
        p.resize(10, 10)


def test_process_group_signal(sandbox):
    p = sandbox.start_process(["sh", "-c", "sleep 1000 & sleep 1000"])
    for _ in range(int(GUARD / 0.1)):  # until both sleeps run
        if listed_sleeps(sandbox) == 2:
            break
        threading.Event().wait(0.1)
    assert listed_sleeps(sandbox) == 2
    assert p.wait(timeout=0).running  # still running: not an error
    p.signal(signal.SIGTERM, group=True)
    info = p.wait()
    assert (info.running, info.signal, info.exit_code) == (False, "SIGTERM", 143)
    assert listed_sleeps(sandbox) == 0
    with pytest.raises(fusebox.FailedPreconditionError):
        p.signal(signal.SIGTERM, group=True)


def test_process_in_task_group(sandbox):
    with sandbox.task_group() as g:
        p = g.start_process(["echo", "hi"])
    info = p.wait()
    assert (info.exit_code, info.task_group, info.argv) == (0, g.id, ["echo", "hi"])


def test_process_bad_input(sandbox):
    unknown = sandbox.process("p999")
    for call in (lambda: unknown.wait(), lambda: unknown.write_stdin("x"), lambda: unknown.signal(signal.SIGTERM),
                 lambda: unknown.resize(1, 1), lambda: list(unknown.attach()), unknown.close_stdin, unknown.info):
        with pytest.raises(fusebox.NotFoundError):
            call()
    with pytest.raises(fusebox.NotFoundError):
        sandbox.start_process(["no-such-program"])
    with pytest.raises(fusebox.InvalidArgumentError):
        sandbox.start_process("true", pty=(0, 80))

    p = sandbox.start_process(["sleep", "1000"])
    for sig in (0, 65):
        with pytest.raises(fusebox.InvalidArgumentError, match=f"signalling {p.id}"):
            p.signal(sig)
    with pytest.raises(fusebox.OutOfRangeError, match=f"attaching to {p.id}"):
        list(p.attach(1 << 40))
    with pytest.raises(fusebox.FailedPreconditionError, match=f"resizing {p.id}"):
        p.resize(10, 10)

    q = sandbox.start_process(["true"])
    assert q.wait().exit_code == 0
    with pytest.raises(fusebox.FailedPreconditionError, match=f"writing to {q.id}"):
        q.write_stdin("late")


# ---- asyncio, against a real sandbox ----

class AsyncFollower:
    """Follower for asyncio: a task reads the output."""

    def __init__(self, p: fusebox.aio.Process, from_offset: int = 0):
        self.stream = p.attach(from_offset)
        self.stdout, self.stderr = bytearray(), bytearray()
        self.next = from_offset
        self.holes: List[str] = []
        self.changed = asyncio.Event()
        self.task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        try:
            async for c in self.stream:
                if isinstance(c, fusebox.OutputDropped):
                    self.next = c.to_offset
                else:
                    if c.offset != self.next:
                        self.holes.append(f"chunk at {c.offset}, want {self.next}")
                    self.next = c.offset + len(c.data)
                    (self.stderr if c.stream == "stderr" else self.stdout).extend(c.data)
                self.changed.set()
        finally:
            self.changed.set()

    async def until(self, what: str, pred: Callable[["AsyncFollower"], bool]) -> None:
        async def wait() -> None:
            while not pred(self) and not self.task.done():
                self.changed.clear()
                await self.changed.wait()
        try:
            await asyncio.wait_for(wait(), GUARD)
        except asyncio.TimeoutError:
            pass
        assert pred(self), f"{what}: stdout {bytes(self.stdout)!r}, stderr {bytes(self.stderr)!r}"

    async def end(self) -> None:
        await asyncio.wait_for(self.task, GUARD)


@pytest.mark.asyncio
async def test_aio_process_outlives_start_and_rereads(manager_address):
    async with fusebox.aio.allocate(manager_address) as sb:
        p = await sb.start_process(LATE_OUTPUT, tag="late")
        assert not p.existing
        await sb.write_file("go", b"")
        f = AsyncFollower(sb.process(p.id))
        await f.until("the late output", lambda f: f.stdout == b"early\nlate\n" and f.stderr == b"to-stderr\n")
        f.stream.close()
        await f.end()  # close() ends an iteration without an error
        assert f.stream.exit is None and not f.holes
        info = await p.info()
        assert info.running and info.tag == "late" and info.output_end == len(b"early\nlate\nto-stderr\n")
        assert [i.id for i in await sb.list_processes()] == [p.id]

        await p.signal(signal.SIGTERM)
        done = await sb.process(p.id).wait()
        assert (done.running, done.signal, done.exit_code) == (False, "SIGTERM", 143)
        again = AsyncFollower(sb.process(p.id), 0)
        await again.end()
        assert (bytes(again.stdout), bytes(again.stderr), again.holes) == (b"early\nlate\n", b"to-stderr\n", [])
        x = again.stream.exit
        assert x is not None and (x.exit_code, x.signal, x.output_end) == (143, "SIGTERM", done.output_end)


@pytest.mark.asyncio
async def test_aio_process_idempotency_key_and_task_group(manager_address):
    async with fusebox.aio.allocate(manager_address) as sb:
        a = await sb.start_process(["sleep", "1000"], idempotency_key="key-1")
        b = await sb.start_process(["sleep", "1000"], idempotency_key="key-1")
        assert b.id == a.id and b.existing and not a.existing
        with pytest.raises(fusebox.FailedPreconditionError):
            await sb.start_process(["sleep", "999"], idempotency_key="key-1")
        async with sb.task_group() as g:
            q = await g.start_process(["echo", "hi"])
        info = await q.wait()
        assert (info.exit_code, info.task_group) == (0, g.id)


@pytest.mark.asyncio
async def test_aio_process_repl_over_stdin(manager_address):
    async with fusebox.aio.allocate(manager_address) as sb:
        p = await sb.start_process(["python3", "-i", "-q", "-u"])
        f = AsyncFollower(p)
        for line, answer in [("1+2\n", b"3\n"), ("x = 6 * 7\n", b""), ("x\n", b"42\n")]:
            before = bytes(f.stdout)
            await p.write_stdin(line)
            if answer:
                await f.until(f"the answer to {line!r}", lambda f: f.stdout == before + answer)
        await p.close_stdin()
        assert (await p.wait()).exit_code == 0
        await f.end()
        assert f.stream.exit is not None and f.stream.exit.exit_code == 0
        with pytest.raises(fusebox.FailedPreconditionError):
            await p.write_stdin("1\n")


@pytest.mark.asyncio
async def test_aio_process_pty_size_after_resize(manager_address):
    async with fusebox.aio.allocate(manager_address) as sb:
        p = await sb.start_process("stty size; read l; stty size", pty=(24, 80))
        f = AsyncFollower(p)
        await f.until("the first size", lambda f: b"24 80\r\n" in f.stdout)
        await p.resize(50, 132)
        await p.write_stdin(b"go\n")
        await f.until("the size after the resize", lambda f: b"50 132\r\n" in f.stdout)
        info = await p.wait()
        assert info.exit_code == 0 and info.pty
        await f.end()


@pytest.mark.asyncio
async def test_aio_process_group_signal(manager_address):
    async with fusebox.aio.allocate(manager_address) as sb:
        async def sleeps() -> int:
            return int((await sb.exec(LISTED_SLEEPS)).stdout)

        p = await sb.start_process(["sh", "-c", "sleep 1000 & sleep 1000"])
        for _ in range(int(GUARD / 0.1)):
            if await sleeps() == 2:
                break
            await asyncio.sleep(0.1)
        assert await sleeps() == 2
        assert (await p.wait(timeout=0)).running
        await p.signal(signal.Signals.SIGTERM, group=True)
        info = await p.wait()
        assert (info.running, info.signal, info.exit_code) == (False, "SIGTERM", 143)
        assert await sleeps() == 0


@pytest.mark.asyncio
async def test_aio_process_bad_input(manager_address):
    async with fusebox.aio.allocate(manager_address) as sb:
        unknown = sb.process("p999")
        with pytest.raises(fusebox.NotFoundError):
            await unknown.wait()
        with pytest.raises(fusebox.NotFoundError):
            await unknown.write_stdin("x")
        with pytest.raises(fusebox.NotFoundError):
            async for _ in unknown.attach():
                pass
        p = await sb.start_process(["sleep", "1000"])
        for sig in (0, 65):
            with pytest.raises(fusebox.InvalidArgumentError):
                await p.signal(sig)
        with pytest.raises(fusebox.OutOfRangeError):
            async for _ in p.attach(1 << 40):
                pass
        q = await sb.start_process(["true"])
        assert (await q.wait()).exit_code == 0
        with pytest.raises(fusebox.FailedPreconditionError):
            await q.write_stdin("late")
