"""File watches (the Sandbox service's Watch call), shared by the sync and asyncio APIs: the
request, the events, and the two streams, which return from opening once the sandbox's
watches are in place (the stream's ready event), so that every change made after it is
reported or counted in a :class:`WatchOverflow`."""

from __future__ import annotations

import asyncio
from typing import AsyncIterator, Iterator, Optional, Sequence, Union

import grpc
import grpc.aio

from . import _core
from ._proto.sandbox.v1 import sandbox_pb2
from .errors import FuseboxError, InvalidArgumentError, from_rpc
from .types import WatchChange, WatchOverflow

WatchEvent = Union[WatchChange, WatchOverflow]

_KINDS = {
    sandbox_pb2.WATCH_CHANGE_KIND_CREATE: "create",
    sandbox_pb2.WATCH_CHANGE_KIND_WRITE: "write",
    sandbox_pb2.WATCH_CHANGE_KIND_REMOVE: "remove",
    sandbox_pb2.WATCH_CHANGE_KIND_RENAME: "rename",
}


def _globs(g: Union[str, Sequence[str]], what: str) -> list:
    if isinstance(g, str):
        return [g]
    out = list(g)
    if not all(isinstance(x, str) for x in out):
        raise InvalidArgumentError(f"watch: {what} must be glob strings, got {g!r}")
    return out


def request(path: str, recursive: bool, include: Union[str, Sequence[str]], exclude: Union[str, Sequence[str]],
            queue_size: int) -> sandbox_pb2.WatchRequest:
    """The WatchRequest of ``Sandbox.watch``'s arguments."""
    if not isinstance(queue_size, int) or queue_size < 0 or queue_size >= 1 << 32:
        raise InvalidArgumentError(f"watch: queue_size must be 0 (the sandbox's default) or positive, got {queue_size!r}")
    return sandbox_pb2.WatchRequest(path=path, recursive=recursive, include=_globs(include, "include"),
                                    exclude=_globs(exclude, "exclude"), queue_size=queue_size)


def event(ev: sandbox_pb2.WatchEvent) -> Optional[WatchEvent]:
    """The SDK's form of one event of the stream; None for the ready event (or an unknown one)."""
    which = ev.WhichOneof("event")
    if which == "change":
        c = ev.change
        return WatchChange(path=c.path, kind=_KINDS.get(c.kind, "write"), is_dir=c.is_dir,  # type: ignore[arg-type]
                           old_path=c.old_path, count=c.count)
    if which == "overflow":
        return WatchOverflow(dropped=ev.overflow.dropped, unknown=ev.overflow.unknown)
    return None


def _ready(ev, doing: str) -> int:
    if ev is None or ev.WhichOneof("event") != "ready":
        raise FuseboxError(f"{doing}: the sandbox did not answer with the ready event")
    return ev.ready.queue_size


class Watch:
    """A watch's events as they come (see ``Sandbox.watch``): iterate it for
    :class:`WatchChange` and :class:`WatchOverflow` items. The iteration ends after the
    watched directory's own removal (a "remove" of its path); ``close()`` (or leaving its
    ``with`` block) stops watching, from any thread, and ends an iteration in progress."""

    def __init__(self, call, path: str):
        self._call, self._doing = call, f"watching {path or '.'}"
        self._closed = False
        try:
            #: The queue size the sandbox applies.
            self.queue_size = _ready(next(call, None), self._doing)
        except grpc.RpcError as e:
            call.cancel()
            raise from_rpc(e, self._doing) from None
        except BaseException:
            call.cancel()
            raise

    def __iter__(self) -> Iterator[WatchEvent]:
        try:
            for ev in self._call:
                x = event(ev)
                if x is not None:
                    yield x
        except grpc.RpcError as e:
            if self._closed and e.code() == grpc.StatusCode.CANCELLED:
                return
            raise from_rpc(e, self._doing) from None
        finally:
            self._call.cancel()

    def close(self) -> None:
        """Stops watching; the sandbox releases the watch."""
        self._closed = True
        self._call.cancel()

    def __enter__(self) -> "Watch":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class AsyncWatch:
    """A watch for asyncio (see ``fusebox.aio.Sandbox.watch`` and :class:`Watch`): ``await``
    it, or enter it with ``async with``, to wait until the sandbox's watches are in place;
    ``async for`` yields :class:`WatchChange` and :class:`WatchOverflow` items (waiting for
    the watches first if that was not awaited). ``close()`` (or leaving ``async with``) stops
    watching."""

    def __init__(self, call, path: str):
        self._call, self._doing = call, f"watching {path or '.'}"
        self._closed = False
        #: The queue size the sandbox applies, once the watch is ready.
        self.queue_size = 0
        self._ready: Optional[asyncio.Future] = None

    async def ready(self) -> "AsyncWatch":
        """Waits until the sandbox's watches are in place (once; later calls return at once)."""
        if self._ready is None:
            self._ready = asyncio.ensure_future(self._read_ready())
        await asyncio.shield(self._ready)
        return self

    async def _read_ready(self) -> None:
        try:
            ev = await self._call.read()
        except grpc.RpcError as e:
            self._call.cancel()
            raise from_rpc(e, self._doing) from None
        if ev is grpc.aio.EOF:
            ev = None
        try:
            self.queue_size = _ready(ev, self._doing)
        except BaseException:
            self._call.cancel()
            raise

    def __await__(self):
        return self.ready().__await__()

    async def __aiter__(self) -> AsyncIterator[WatchEvent]:
        try:
            await self.ready()
            while True:
                ev = await self._call.read()
                if ev is grpc.aio.EOF:
                    return
                x = event(ev)
                if x is not None:
                    yield x
        except grpc.RpcError as e:
            if self._closed and e.code() == grpc.StatusCode.CANCELLED:
                return
            raise from_rpc(e, self._doing) from None
        except asyncio.CancelledError:
            if not _core.closed_locally(self._closed):
                raise
            return
        finally:
            self._call.cancel()

    def close(self) -> None:
        """Stops watching; the sandbox releases the watch."""
        self._closed = True
        self._call.cancel()

    async def __aenter__(self) -> "AsyncWatch":
        try:
            return await self.ready()
        except BaseException:
            self.close()
            raise

    async def __aexit__(self, *exc) -> None:
        self.close()
