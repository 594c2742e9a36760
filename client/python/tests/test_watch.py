"""File watches: unit tests of the request and the events, then the sync and asyncio APIs
against the real ``fusebox local up``.

Every wait here is bounded by GUARD only so that a broken sandbox fails the test instead of
hanging it; nothing asserts on time.
"""

from __future__ import annotations

import asyncio

import pytest

import fusebox
import fusebox.aio
from fusebox import _watch
from fusebox._proto.sandbox.v1 import sandbox_pb2

GUARD = 120.0


# ---- units: the request and the events ----

def test_request():
    r = _watch.request("src", True, "*.py", ["node_modules", ".git"], 10)
    assert (r.path, r.recursive, list(r.include), list(r.exclude), r.queue_size) == \
        ("src", True, ["*.py"], ["node_modules", ".git"], 10)
    for bad in (-1, 1 << 32, 1.5):
        with pytest.raises(fusebox.InvalidArgumentError):
            _watch.request("", False, (), (), bad)  # type: ignore[arg-type]
    with pytest.raises(fusebox.InvalidArgumentError):
        _watch.request("", False, [1], (), 0)  # type: ignore[list-item]


def test_events():
    ev = sandbox_pb2.WatchEvent(change=sandbox_pb2.WatchChange(
        path="b", kind=sandbox_pb2.WATCH_CHANGE_KIND_RENAME, old_path="a", count=1))
    assert _watch.event(ev) == fusebox.WatchChange(path="b", kind="rename", old_path="a", count=1)
    ev = sandbox_pb2.WatchEvent(overflow=sandbox_pb2.WatchOverflow(dropped=7))
    assert _watch.event(ev) == fusebox.WatchOverflow(dropped=7)
    assert _watch.event(sandbox_pb2.WatchEvent(ready=sandbox_pb2.WatchReady(queue_size=3))) is None


# ---- sync, against a real sandbox ----

def until(w, path: str) -> list:
    """Reads ``w``'s events until a change of ``path``, and returns them all."""
    seen = []
    for ev in w:
        seen.append(ev)
        if isinstance(ev, fusebox.WatchChange) and ev.path == path:
            return seen
    raise AssertionError(f"the watch ended before a change of {path}: {seen}")


def test_watch_sees_a_write(sandbox):
    sandbox.exec("mkdir -p src", check=True)
    with sandbox.watch("src", recursive=True, exclude=["*.tmp"]) as w:
        assert w.queue_size > 0
        sandbox.exec("mkdir src/new && echo hi > src/new/a.py && echo no > src/b.tmp && echo more >> src/new/a.py",
                     check=True)
        seen = until(w, "src/new/a.py")
    assert fusebox.WatchChange(path="src/new", kind="create", is_dir=True) in seen
    assert seen[-1].kind == "create" and seen[-1].count >= 1
    assert not [ev for ev in seen if isinstance(ev, fusebox.WatchChange) and ev.path.endswith(".tmp")]
    # Closed, the iteration ends without an error.
    assert list(w) == []


def test_watch_outside_the_workspace_refused(sandbox):
    sandbox.exec("ln -s /etc out && touch file", check=True)
    for path in ("../x", "/etc", "out"):
        with pytest.raises(fusebox.PathEscapeError):
            sandbox.watch(path)
    with pytest.raises(fusebox.NotFoundError):
        sandbox.watch("missing")
    with pytest.raises(fusebox.FailedPreconditionError):
        sandbox.watch("file")


# ---- asyncio ----

@pytest.mark.asyncio
async def test_aio_watch_sees_a_write(manager_address):
    async with fusebox.aio.allocate(manager_address) as sb:
        async with sb.watch("") as w:
            await sb.write_file("hello.txt", b"hi")

            async def first() -> fusebox.WatchChange:
                async for ev in w:
                    if isinstance(ev, fusebox.WatchChange) and ev.path == "hello.txt":
                        return ev
                raise AssertionError("the watch ended before the write")

            ev = await asyncio.wait_for(first(), GUARD)
            assert ev.kind in ("create", "rename")  # written in place, or atomically renamed there

        # Awaited rather than entered; closed, its iteration ends without an error.
        w2 = await sb.watch("")
        w2.close()
        assert [ev async for ev in w2] == []


@pytest.mark.asyncio
async def test_aio_watch_outside_the_workspace_refused(manager_address):
    async with fusebox.aio.allocate(manager_address) as sb:
        await sb.exec("ln -s / root", check=True)
        for path in ("../x", "/etc", "root/etc"):
            with pytest.raises(fusebox.PathEscapeError):
                await sb.watch(path)
        with pytest.raises(fusebox.NotFoundError):
            async with sb.watch("missing"):
                pass
