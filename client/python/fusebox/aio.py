"""The asyncio API (grpc.aio): the same :class:`Sandbox`, :class:`Manager` and
:class:`TaskGroup` as :mod:`fusebox`, with coroutines::

    import fusebox.aio

    async with fusebox.aio.allocate("unix:///run/fusebox/manager.sock") as sb:
        await sb.write_tree("./repo", "repo")
        res = await sb.exec("cd repo && python3 -m pytest -q", timeout=600)

Create and use these objects on one event loop.
"""

from __future__ import annotations

import asyncio
import datetime
import io
import ssl
from typing import AsyncIterator, Awaitable, BinaryIO, Callable, Generator, List, Mapping, Optional, Sequence, Union

import grpc
import grpc.aio

from . import _bulk, _core, _forward, _process, _session, _watch
from ._pack import pack, prune_mkdirs
from ._proto.manager.v1 import manager_pb2, manager_pb2_grpc
from ._proto.sandbox.v1 import process_pb2, process_pb2_grpc, sandbox_pb2, sandbox_pb2_grpc
from ._process import SignalLike, TerminalSize
from .errors import FuseboxError, InvalidArgumentError, NotFoundError, UnavailableError, from_rpc
from .keys import AgentKey, KeysAhead
from .types import (CommandLike, ExecResult, FileInfo, Files, GrepMatch, GrepResult, Listing, OutputChunk,
                    OutputDropped, ProcessExit, ProcessInfo, ProcessOutput, SandboxInfo, Symlink, WriteStats)

__all__ = ["allocate", "Manager", "Sandbox", "TaskGroup", "ExecStream", "Process", "OutputStream", "Watch"]

#: A watch's stream for asyncio (see :meth:`Sandbox.watch`).
Watch = _watch.AsyncWatch

#: Where a command's output goes: a callable (a coroutine function's results are awaited, in
#: order), a binary file, or None to collect it.
Sink = Union[Callable[[bytes], object], Callable[[bytes], Awaitable[object]], BinaryIO, None]


class Manager:
    """An asyncio connection to a fusebox manager (see :class:`fusebox.Manager`, whose
    ``credentials``, ``ca_file``, ``token_file`` and ``server_name`` it takes); it makes the
    agent key of its next allocation ahead, in a background thread."""

    def __init__(self, address: Optional[str] = None, *, credentials: Optional[grpc.ChannelCredentials] = None,
                 ca_file: Optional[str] = None, token_file: Optional[str] = None, server_name: Optional[str] = None,
                 _ahead: bool = True):
        self._conn = _core.ManagerConnection(address, credentials, ca_file, token_file, server_name)
        self.address = self._conn.address
        self._keys = KeysAhead()  # not for allocate()'s one-allocation Manager
        self._ahead = _ahead
        if _ahead:
            self._keys.prepare()
        if self._conn.credentials is not None:
            self._channel = grpc.aio.secure_channel(self._conn.target, self._conn.credentials, options=self._conn.options)
        else:
            self._channel = grpc.aio.insecure_channel(self._conn.target)
        self._rpc = manager_pb2_grpc.ManagerStub(self._channel)

    def _err(self, e: grpc.RpcError, doing: str, service: str = "manager") -> FuseboxError:
        return self._conn.error(e, doing, service)

    async def allocate(self, *, template: str = "", egress: Optional[Sequence[str]] = None,
                       lease_ttl: Optional[_core.Seconds] = None, labels: Optional[Mapping[str, str]] = None,
                       env: Optional[Mapping[str, str]] = None, cwd: str = "",
                       key: Optional[AgentKey] = None, batch_bytes: Optional[int] = None, concurrency: int = 4,
                       timeout: Optional[_core.Seconds] = _core.ALLOCATE_TIMEOUT) -> "Sandbox":
        """Allocates a fresh sandbox and connects to it with pinned mTLS (see
        :meth:`fusebox.Manager.allocate`); the lease is renewed by a task until close()."""
        a = _core.AllocateArgs(key or self._keys.take(), template, egress, lease_ttl, labels, batch_bytes, concurrency, timeout,
                                env, cwd)
        resp = await self._allocate(a.request, a.key, a.deadline)
        try:
            return Sandbox._connect(self, resp, a.key, a.ttl, a.batch_bytes, a.concurrency)
        except BaseException:
            await asyncio.shield(self._release(resp.sandbox_id, resp.lease_token))
            raise

    async def _allocate(self, req: manager_pb2.AllocateRequest, key: AgentKey, deadline: Optional[float]):
        call = self._rpc.Allocate(req, timeout=deadline)
        try:
            await asyncio.sleep(0)  # the call starts...
            key._credentials()  # ...and the client certificate is made while the manager allocates
        except BaseException:
            await asyncio.shield(self._reap(call))
            raise
        try:
            return await call
        except grpc.RpcError as e:
            raise self._err(e, "allocating sandbox") from None

    async def _reap(self, call) -> None:
        """Releases what an Allocate call the caller gave up on allocated, if anything."""
        try:
            r = await call
        except grpc.RpcError:
            return
        await self._release(r.sandbox_id, r.lease_token)

    async def _release(self, sandbox_id: str, token: str) -> Optional[FuseboxError]:
        try:
            await self._rpc.Release(manager_pb2.ReleaseRequest(sandbox_id=sandbox_id, lease_token=token),
                                    timeout=_core.RELEASE_TIMEOUT)
        except grpc.RpcError as e:
            err = self._err(e, f"releasing {sandbox_id}", "lease")
            return None if isinstance(err, NotFoundError) else err
        return None

    async def list(self) -> List[SandboxInfo]:
        """The sandboxes the manager knows, bound or not."""
        try:
            resp = await self._rpc.List(manager_pb2.ListRequest(), timeout=30)
        except grpc.RpcError as e:
            raise self._err(e, "listing sandboxes") from None
        return [SandboxInfo._from_proto(s) for s in resp.sandboxes]

    async def pool_status(self) -> manager_pb2.PoolStatusResponse:
        """The pool's state and the estimator's target (the raw PoolStatusResponse)."""
        try:
            return await self._rpc.PoolStatus(manager_pb2.PoolStatusRequest(), timeout=30)
        except grpc.RpcError as e:
            raise self._err(e, "reading pool status") from None

    async def close(self) -> None:
        self._keys.close()
        await self._channel.close()

    async def __aenter__(self) -> "Manager":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()


class _Allocating:
    """What :func:`allocate` returns: await it for a Sandbox, or use it with ``async with``."""

    def __init__(self, coro: Awaitable["Sandbox"]):
        self._coro = coro
        self._sb: Optional[Sandbox] = None

    def __await__(self) -> Generator[None, None, "Sandbox"]:
        return self._coro.__await__()  # type: ignore[attr-defined]

    async def __aenter__(self) -> "Sandbox":
        self._sb = await self._coro
        return self._sb

    async def __aexit__(self, *exc) -> None:
        assert self._sb is not None
        await self._sb.close()


def allocate(manager: Optional[str] = None, *, credentials: Optional[grpc.ChannelCredentials] = None,
             ca_file: Optional[str] = None, token_file: Optional[str] = None, server_name: Optional[str] = None,
             **options) -> _Allocating:
    """Connects to the manager, allocates a sandbox and returns it (``await``) or manages it
    (``async with``); the manager connection closes with the sandbox. ``credentials``,
    ``ca_file``, ``token_file`` and ``server_name`` secure a tcp:// manager (see
    :class:`fusebox.Manager`); ``options`` are those of :meth:`Manager.allocate`."""
    conn = dict(credentials=credentials, ca_file=ca_file, token_file=token_file, server_name=server_name)

    async def run() -> Sandbox:
        m = Manager(manager, **conn, _ahead=False)
        try:
            sb = await m.allocate(**options)
        except BaseException:
            await m.close()
            raise
        sb._owned = m
        return sb
    return _Allocating(run())


class Sandbox:
    """A bound sandbox over pinned mTLS, for asyncio (see :class:`fusebox.Sandbox`)."""

    id: str
    endpoint: str

    @classmethod
    def allocate(cls, manager: Optional[str] = None, **options) -> _Allocating:
        """Same as :func:`fusebox.aio.allocate`."""
        return allocate(manager, **options)

    @classmethod
    def connect(cls, session: _session.SessionLike, *, seal_key: Optional[bytes] = None, key: Optional[AgentKey] = None,
                credentials: Optional[grpc.ChannelCredentials] = None, ca_file: Optional[str] = None,
                token_file: Optional[str] = None, server_name: Optional[str] = None,
                batch_bytes: Optional[int] = None, concurrency: int = 4) -> _Allocating:
        """Talks to the sandbox of an exported session from this process (see
        :meth:`fusebox.Sandbox.connect`): ``await`` it for the Sandbox, or use it with
        ``async with`` (which releases the sandbox at the end; :meth:`detach` leaves it)."""
        async def run() -> Sandbox:
            doc, k, batch = _session.prepare(session, seal_key, key, batch_bytes, concurrency)
            m = Manager(doc["manager"], credentials=credentials, ca_file=ca_file, token_file=token_file,
                        server_name=server_name, _ahead=False)
            try:
                try:
                    r = await m._rpc.Renew(_session.renew_request(doc), timeout=_core.RELEASE_TIMEOUT)
                except grpc.RpcError as e:
                    raise _session.lease_refused(e, doc["sandbox_id"], m._conn.hint()) from None
                sb = cls._connect(m, _session.response(doc, r), k, None, batch, concurrency)
            except BaseException:
                await m.close()
                raise
            sb._owned = m
            return sb
        return _Allocating(run())

    @classmethod
    def _connect(cls, mgr: Manager, resp: manager_pb2.AllocateResponse, key: AgentKey, ttl: Optional[float],
                 batch_bytes: int, concurrency: int) -> "Sandbox":
        """The Sandbox of an allocation's answer, on a data channel made now."""
        sb = cls.__new__(cls)
        sb._resp, sb._key = resp, key
        channel = _core.data_channel(grpc.aio.secure_channel, resp, key, batch_bytes)
        channel.get_state(try_to_connect=True)  # the handshake starts now, not at the first call
        sb.id, sb.endpoint = resp.sandbox_id, resp.endpoint
        sb._batch, sb._conc = batch_bytes, concurrency
        sb._mgr, sb._owned, sb._token = mgr, None, resp.lease_token
        sb._channel = channel
        sb._rpc = sandbox_pb2_grpc.SandboxStub(sb._channel)
        sb._expires = resp.lease_expires.ToDatetime(tzinfo=datetime.timezone.utc)
        sb._lease_error = None
        sb._closed = False
        sb._bulk = _bulk.Pool(resp, key)
        sb._renewer = asyncio.get_running_loop().create_task(sb._renew(_core.renew_every(ttl, sb._expires)))
        return sb

    async def _renew(self, every: float) -> None:
        # The manager's next key is prepared when _core.next_key_after says, or at close,
        # whichever comes first: not beside this sandbox's first call.
        wait = every
        key_after = _core.next_key_after(self._mgr._ahead)
        if key_after is not None:
            loop = asyncio.get_running_loop()
            start = loop.time()
            try:
                await asyncio.sleep(min(key_after, every))
            finally:
                self._mgr._keys.prepare()
            wait = max(every - (loop.time() - start), 0)
        while True:
            await asyncio.sleep(wait)
            wait = every
            try:
                r = await self._mgr._rpc.Renew(manager_pb2.RenewRequest(sandbox_id=self.id, lease_token=self._token), timeout=every)
                self._expires, self._lease_error = r.lease_expires.ToDatetime(tzinfo=datetime.timezone.utc), None
            except grpc.RpcError as e:
                self._lease_error = self._mgr._err(e, f"renewing lease of {self.id}", "lease")

    @property
    def lease_expires(self) -> datetime.datetime:
        """When the lease currently ends (renewed in the background)."""
        return self._expires

    @property
    def lease_error(self) -> Optional[FuseboxError]:
        """The last renewal's error, or None when it succeeded."""
        return self._lease_error

    @property
    def closed(self) -> bool:
        return self._closed

    async def close(self) -> None:
        """Stops renewing, releases the sandbox (it is destroyed) and closes the connections.
        Safe to call more than once."""
        if self._closed:
            return
        self._closed = True
        self._bulk.close()
        self._renewer.cancel()
        try:
            await self._renewer
        except asyncio.CancelledError:
            pass
        err = await asyncio.shield(self._mgr._release(self.id, self._token))
        await self._channel.close()
        if self._owned is not None:
            await self._owned.close()
        if err is not None:
            raise err

    async def detach(self) -> None:
        """Stops renewing and closes the connections, leaving the sandbox running until its
        lease ends or a holder of its session releases it (see
        :meth:`fusebox.Sandbox.detach`). After it, close() does nothing."""
        if self._closed:
            return
        self._closed = True
        self._bulk.close()
        self._renewer.cancel()
        try:
            await self._renewer
        except asyncio.CancelledError:
            pass
        await self._channel.close()
        if self._owned is not None:
            await self._owned.close()

    async def renew(self) -> datetime.datetime:
        """Renews the lease now and returns the new expiry; :class:`fusebox.LeaseError` when
        it is no longer held."""
        try:
            r = await self._mgr._rpc.Renew(manager_pb2.RenewRequest(sandbox_id=self.id, lease_token=self._token),
                                           timeout=_core.RELEASE_TIMEOUT)
        except grpc.RpcError as e:
            raise _session.lease_refused(e, self.id) from None
        self._expires, self._lease_error = _session.expires(r), None
        return self._expires

    def export_session(self, seal_key: Optional[bytes] = None, *, plain: bool = False) -> str:
        """The session document (JSON) for :meth:`Sandbox.connect` in another process (see
        :meth:`fusebox.Sandbox.export_session`). The manager is not called."""
        return _session.export(self._resp, self._mgr.address, self._key, seal_key, plain)

    async def __aenter__(self) -> "Sandbox":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    def __repr__(self) -> str:
        return f"<fusebox.aio.Sandbox {self.id} {'closed' if self._closed else self.endpoint}>"

    # ---- exec ----

    async def exec(self, command: CommandLike, *, cwd: str = "", env: Optional[Mapping[str, str]] = None,
                   unset: Optional[Sequence[str]] = None, stdin: Union[bytes, str, None] = None,
                   timeout: Optional[_core.Seconds] = None, check: bool = False, stdout: Sink = None,
                   stderr: Sink = None) -> ExecResult:
        """Runs a command and returns how it ended (see :meth:`fusebox.Sandbox.exec`)."""
        return await self._exec(command, cwd, env, unset, stdin, timeout, check, stdout, stderr, "", 0)

    def _start(self, command, cwd, env, unset, stdin, timeout, group, order) -> "ExecStream":
        t = _core.seconds(timeout, "timeout")
        req = _core.exec_request(command, cwd, env, unset, stdin, t, group, order)
        return ExecStream(self._rpc.Exec(req, timeout=_core.rpc_deadline(t)), command, t)

    async def _exec(self, command, cwd, env, unset, stdin, timeout, check, stdout, stderr, group, order) -> ExecResult:
        s = self._start(command, cwd, env, unset, stdin, timeout, group, order)
        out, err = io.BytesIO(), io.BytesIO()
        sinks = {"stdout": _core.sink(stdout, out), "stderr": _core.sink(stderr, err)}
        try:
            async for c in s._events():
                r = sinks[c.stream](c.data)
                if _core.awaitable(r):
                    await r  # a coroutine callback: its output in order, and back-pressure
        finally:
            if s._result is None:
                s.cancel()
        res = s._result
        assert res is not None
        res.stdout, res.stderr = out.getvalue(), err.getvalue()
        return _core.check_result(res, command, s._timeout, check)

    def exec_stream(self, command: CommandLike, *, cwd: str = "", env: Optional[Mapping[str, str]] = None,
                    unset: Optional[Sequence[str]] = None, stdin: Union[bytes, str, None] = None,
                    timeout: Optional[_core.Seconds] = None) -> "ExecStream":
        """Starts a command; ``async for`` over the result yields its output as it streams."""
        return self._start(command, cwd, env, unset, stdin, timeout, "", 0)

    async def run(self, *argv: str, **kw) -> ExecResult:
        """Runs argv and collects its output."""
        return await self.exec(list(argv), **kw)

    def task_group(self) -> "TaskGroup":
        """Starts a task group: concurrent commands whose logically last change wins."""
        return TaskGroup(self)

    # ---- long-lived processes ----

    def _processes(self) -> process_pb2_grpc.ProcessesStub:
        stub = getattr(self, "_procs_stub", None)
        if stub is None:
            stub = self._procs_stub = process_pb2_grpc.ProcessesStub(self._channel)
        return stub

    async def _process_call(self, method: str, req, doing: str, timeout: Optional[float] = 300):
        try:
            return await getattr(self._processes(), method)(req, timeout=timeout)
        except grpc.RpcError as e:
            raise from_rpc(e, doing) from None

    async def start_process(self, command: CommandLike, *, cwd: Optional[str] = None,
                            env: Optional[Mapping[str, str]] = None, unset: Optional[Sequence[str]] = None,
                            pty: Optional[TerminalSize] = None, tag: str = "",
                            idempotency_key: Optional[str] = None) -> "Process":
        """Starts a long-lived process and returns its handle as soon as it runs (see
        :meth:`fusebox.Sandbox.start_process`)."""
        return await self._start_process(command, cwd, env, unset, pty, tag, idempotency_key, "", 0)

    async def _start_process(self, command, cwd, env, unset, pty, tag, idempotency_key, group, order) -> "Process":
        req = _process.start_request(command, cwd, env, unset, pty, tag, idempotency_key, group, order)
        r = await self._process_call("StartProcess", req, f"starting process {_core.describe(command)!r}")
        return Process(self, r.process.id, r.existing)

    async def list_processes(self) -> List[ProcessInfo]:
        """The sandbox's running processes and its most recently exited ones, in the order
        they started."""
        r = await self._process_call("ListProcesses", process_pb2.ListProcessesRequest(), "listing processes")
        return _process.infos(r)

    def process(self, id: str) -> "Process":
        """A handle to the process ``id``, started through this connection or any other; it
        checks nothing (see :meth:`fusebox.Sandbox.process`)."""
        return Process(self, id)

    # ---- ports ----

    def _port_dialer(self) -> _forward.Dialer:
        d = getattr(self, "_ports", None)
        if d is None:
            d = self._ports = _forward.Dialer(self._bulk)
        return d

    async def dial_port(self, port: int) -> _forward.AsyncPortConnection:
        """Connects to ``port`` on the sandbox's loopback (see
        :meth:`fusebox.Sandbox.dial_port`); the connection's ``sendall``, ``recv`` and
        ``close_write`` are awaited (each runs on a worker thread)."""
        _forward.check_port(port)
        conn = await asyncio.get_running_loop().run_in_executor(None, self._port_dialer().dial, port)
        return _forward.AsyncPortConnection(conn)

    async def forward_port(self, port: int, local_address: str = "127.0.0.1:0", *,
                           on_error: Optional[Callable[[BaseException], None]] = None) -> _forward.AsyncForward:
        """Forwards ``local_address`` to ``port`` on the sandbox's loopback (see
        :meth:`fusebox.Sandbox.forward_port`). The tunnels run on threads of their own;
        ``await close()`` (or ``async with``) ends the forward."""
        return _forward.AsyncForward(_forward.Forward(self._port_dialer(), port, local_address, on_error))

    # ---- files ----

    async def write_files(self, files: _core.FilesLike, mkdirs: Sequence[str] = (),
                          symlinks: Sequence[Union[Symlink, tuple]] = ()) -> WriteStats:
        """Writes files in bin-packed batches sent concurrently, streaming large ones (see
        :meth:`fusebox.Sandbox.write_files`)."""
        return await self._write(_core.file_writes(files), prune_mkdirs(list(mkdirs)), _core.symlink_specs(symlinks))

    async def write_file(self, path: str, data: Union[bytes, str], mode: int = 0) -> None:
        """Writes one file of any size."""
        await self.write_files([fusebox_file(path, data, mode)])

    async def write_tree(self, local_dir, remote_dir: str = "") -> WriteStats:
        """Copies a local directory tree into ``remote_dir`` of the workspace."""
        files, dirs, links = await asyncio.get_running_loop().run_in_executor(None, _core.walk_tree, local_dir, remote_dir)
        return await self._write(files, dirs, links)

    async def write_file_from(self, path: str, reader: BinaryIO, size: Optional[int] = None, mode: int = 0) -> int:
        """Streams a binary file object into ``path`` (atomically)."""
        try:
            r = await self._rpc.WriteFileStream(_agen(_core.chunks_from(reader, _core.stream_header(path, mode, size))))
        except grpc.RpcError as e:
            raise from_rpc(e, f"streaming {path}") from None
        return r.bytes_written

    async def _write(self, files, mkdirs, links) -> WriteStats:
        batches, streamed = pack(files, mkdirs, links, self._batch)
        st = WriteStats()
        sem = asyncio.Semaphore(self._conc)

        async def batch(b):
            async with sem:
                try:
                    r = await self._rpc.WriteFiles(b)
                except grpc.RpcError as e:
                    raise from_rpc(e, f"writing batch of {len(b.files)} files") from None
            _core.add_batch(st, r)

        async def stream(f):
            async with sem:
                data = f.data  # once: reading a bytes field copies it
                hdr = _core.stream_header(f.path, f.mode, len(data))
                try:
                    r = await self._rpc.WriteFileStream(_agen(_core.chunks_of(data, hdr)))
                except grpc.RpcError as e:
                    raise from_rpc(e, f"streaming {f.path}") from None
            _core.add_stream(st, r)

        await _gather([batch(b) for b in batches] + [stream(f) for f in streamed])
        return st

    async def read_files(self, *paths: str) -> Files:
        """Fetches files through the two-step plan (see :meth:`fusebox.Sandbox.read_files`)."""
        if not paths:
            raise InvalidArgumentError("read_files: give at least one path or glob")
        try:
            plan = await self._rpc.GetReadFilesPlan(sandbox_pb2.GetReadFilesPlanRequest(paths=list(paths), max_batch_bytes=self._batch))
        except grpc.RpcError as e:
            raise from_rpc(e, "planning read") from None
        out = _core.files_of(plan)
        sem = asyncio.Semaphore(self._conc)

        async def batch(b):
            async with sem:
                try:
                    r = await self._rpc.ReadFiles(sandbox_pb2.ReadFilesRequest(paths=[f.path for f in b.files]))
                except grpc.RpcError as e:
                    raise from_rpc(e, f"reading batch of {len(b.files)} files") from None
            for f in r.files:
                out[f.path] = f.data

        async def stream(p):
            async with sem:
                out[p] = await self.read_file(p)

        await _gather([batch(b) for b in plan.batches] + [stream(f.path) for f in plan.streamed])
        return out

    async def read_file(self, path: str) -> bytes:
        """Returns one file's contents (streamed)."""
        buf = io.BytesIO()
        await self.read_file_to(path, buf)
        return buf.getvalue()

    async def read_file_to(self, path: str, writer: BinaryIO) -> int:
        """Streams the file at ``path`` into a binary file object; returns the bytes written.
        Over a bulk connection (as :meth:`fusebox.Sandbox.read_file_to`) the writer is called
        from a worker thread, one call at a time; cancelling the call stops the transfer before
        it returns."""
        try:
            return await _bulk.read_async(self._bulk, path, writer)
        except _bulk.NoBulk:
            pass  # nothing was read: the gRPC stream below
        except grpc.RpcError as e:
            raise from_rpc(e, f"reading {path}") from None
        except (ConnectionError, ssl.SSLError) as e:
            raise UnavailableError(f"reading {path}: bulk connection: {e}") from None
        n = 0
        call = self._rpc.ReadFileStream(sandbox_pb2.ReadFileStreamRequest(path=path))
        try:
            async for c in call:
                writer.write(c.data)
                n += len(c.data)
        except grpc.RpcError as e:
            raise from_rpc(e, f"reading {path}") from None
        finally:
            call.cancel()
        return n

    async def _unary(self, method: str, req, doing: str):
        try:
            return await getattr(self._rpc, method)(req, timeout=300)
        except grpc.RpcError as e:
            raise from_rpc(e, doing) from None

    async def stat(self, path: str, follow_symlinks: bool = False) -> FileInfo:
        """Describes ``path``."""
        r = await self._unary("Stat", sandbox_pb2.StatRequest(path=path, follow_symlinks=follow_symlinks), f"stat {path}")
        return FileInfo._from_proto(r.info)

    async def exists(self, path: str) -> bool:
        """Whether ``path`` exists."""
        try:
            await self.stat(path)
            return True
        except NotFoundError:
            return False

    async def list(self, path: str = "", recursive: bool = False, max_depth: int = 0, max_entries: int = 0) -> Listing:
        """Lists the directory ``path``."""
        r = await self._unary("List", sandbox_pb2.ListRequest(path=path, recursive=recursive, max_depth=max_depth,
                                                              max_entries=max_entries), f"list {path or '.'}")
        return Listing([FileInfo._from_proto(e) for e in r.entries], r.truncated)

    async def mkdir(self, path: str, parents: bool = False, mode: int = 0) -> None:
        """Creates the directory ``path``."""
        await self._unary("Mkdir", sandbox_pb2.MkdirRequest(path=path, parents=parents, mode=mode), f"mkdir {path}")

    async def remove(self, path: str, recursive: bool = False, missing_ok: bool = False) -> None:
        """Removes ``path``."""
        await self._unary("Remove", sandbox_pb2.RemoveRequest(path=path, recursive=recursive, missing_ok=missing_ok), f"remove {path}")

    async def rename(self, src: str, dst: str, overwrite: bool = False) -> None:
        """Moves ``src`` to ``dst``."""
        await self._unary("Rename", sandbox_pb2.RenameRequest(to=dst, overwrite=overwrite, **{"from": src}), f"rename {src} to {dst}")

    async def symlink(self, target: str, path: str) -> None:
        """Creates a symlink at ``path`` to ``target`` (inside the workspace)."""
        await self._unary("Symlink", sandbox_pb2.SymlinkRequest(target=target, path=path), f"symlink {path} -> {target}")

    async def find(self, path: str = "", name: str = "", type: Optional[str] = None, max_depth: int = 0,
                   max_results: int = 0) -> Listing:
        """Finds entries under ``path`` (see :meth:`fusebox.Sandbox.find`)."""
        r = await self._unary("Find", sandbox_pb2.FindRequest(path=path, name=name, type=_core.find_type(type),
                                                              max_depth=max_depth, max_results=max_results),
                              f"find {name or '*'} in {path or '.'}")
        return Listing([FileInfo._from_proto(e) for e in r.entries], r.truncated)

    async def grep(self, pattern: str, paths: Sequence[str] = (), include: Sequence[str] = (), exclude: Sequence[str] = (),
                   case_insensitive: bool = False, max_matches: int = 0) -> GrepResult:
        """Searches file contents for an RE2 ``pattern``."""
        if isinstance(paths, str):
            paths = [paths]
        r = await self._unary("Grep", sandbox_pb2.GrepRequest(pattern=pattern, paths=list(paths), include=list(include),
                                                              exclude=list(exclude), case_insensitive=case_insensitive,
                                                              max_matches=max_matches), f"grep {pattern!r}")
        return GrepResult([GrepMatch(m.path, m.line, m.text) for m in r.matches], r.truncated, r.files_searched,
                          r.binary_files_skipped)

    def watch(self, path: str, recursive: bool = False, include: Sequence[str] = (), exclude: Sequence[str] = (),
              queue_size: int = 0) -> Watch:
        """Watches the directory ``path`` (see :meth:`fusebox.Sandbox.watch`). ``await`` the
        result, or enter it with ``async with``, to wait until the watches are in place; then
        ``async for`` over it::

            async with sb.watch("src", recursive=True) as w:
                async for ev in w:
                    print(ev)
        """
        return Watch(self._rpc.Watch(_watch.request(path, recursive, include, exclude, queue_size)), path)


def fusebox_file(path: str, data: Union[bytes, str], mode: int):
    from .types import File

    return File(path, data.encode() if isinstance(data, str) else data, mode)


async def _agen(it):
    for x in it:
        yield x


async def _gather(coros) -> None:
    """Runs coros concurrently; on the first error cancels the rest, waits for them, and raises it."""
    tasks = [asyncio.ensure_future(c) for c in coros]
    if not tasks:
        return
    try:
        await asyncio.gather(*tasks)
    except BaseException:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise


class ExecStream:
    """A running command's output; ``async for`` yields :class:`OutputChunk`, then ``result``
    says how it ended. ``cancel()`` (or leaving ``async with`` early) kills the command."""

    def __init__(self, call, command: CommandLike, timeout: Optional[float]):
        self._call, self._command, self._timeout = call, command, timeout
        self._result: Optional[ExecResult] = None
        self._started = False

    async def _events(self) -> AsyncIterator[OutputChunk]:
        if self._started:
            raise FuseboxError("exec stream: already iterated")
        self._started = True
        try:
            async for ev in self._call:
                kind = ev.WhichOneof("event")
                if kind == "output":
                    yield OutputChunk("stderr" if ev.output.stream == sandbox_pb2.STREAM_KIND_STDERR else "stdout", ev.output.data)
                elif kind == "exit":
                    self._result = _core.exit_result(ev.exit, b"", b"")
        except grpc.RpcError as e:
            raise from_rpc(e, f"exec {_core.describe(self._command)!r}") from None
        if self._result is None:
            raise FuseboxError(f"exec {_core.describe(self._command)!r}: stream ended without an exit status")

    async def __aiter__(self) -> AsyncIterator[OutputChunk]:
        async for c in self._events():
            yield c
        _core.check_result(self._result, self._command, self._timeout, False)  # type: ignore[arg-type]

    @property
    def result(self) -> ExecResult:
        if self._result is None:
            raise FuseboxError("exec stream: the command has not finished; iterate the stream first")
        return self._result

    async def wait(self) -> ExecResult:
        """Drains the rest of the output and returns the result."""
        if not self._started:
            async for _ in self:
                pass
        return self.result

    def cancel(self) -> None:
        self._call.cancel()

    async def __aenter__(self) -> "ExecStream":
        return self

    async def __aexit__(self, *exc) -> None:
        if self._result is None:
            self.cancel()


class OutputStream:
    """A long-lived process's output from an offset, as it streams (see :meth:`Process.attach`
    and :class:`fusebox.OutputStream`): ``async for`` yields :class:`ProcessOutput` and
    :class:`OutputDropped` items and ends once the process has exited and its output was
    read to the end; ``exit`` then says how it ended. ``close()`` (or leaving ``async with``)
    stops following; the process runs on."""

    def __init__(self, call, process_id: str):
        self._call, self._id = call, process_id
        self._exit: Optional[ProcessExit] = None
        self._started = False
        self._closed = False

    async def __aiter__(self) -> AsyncIterator[Union[ProcessOutput, OutputDropped]]:
        if self._started:
            raise FuseboxError(f"attaching to {self._id}: the stream was already iterated")
        self._started = True
        try:
            async for ev in self._call:
                x = _process.event(ev)
                if isinstance(x, ProcessExit):
                    self._exit = x
                    return
                if x is not None:
                    yield x
        except grpc.RpcError as e:
            if self._closed and e.code() == grpc.StatusCode.CANCELLED:
                return
            raise from_rpc(e, f"attaching to {self._id}") from None
        except asyncio.CancelledError:
            if not _core.closed_locally(self._closed):
                raise
            return
        finally:
            self._call.cancel()
        if not self._closed:
            raise FuseboxError(f"attaching to {self._id}: the stream ended without an exit event")

    @property
    def exit(self) -> Optional[ProcessExit]:
        """How the process ended, once the iteration has ended with its exit; else None."""
        return self._exit

    def close(self) -> None:
        """Stops following the output; an iteration in progress ends."""
        self._closed = True
        self._call.cancel()

    async def __aenter__(self) -> "OutputStream":
        return self

    async def __aexit__(self, *exc) -> None:
        self.close()


class Process:
    """A handle to a long-lived process in a sandbox, for asyncio (see
    :class:`fusebox.Process`): cheap, holding nothing open; any number, from any connection,
    may name one process."""

    def __init__(self, sandbox: Sandbox, id: str, existing: bool = False):
        self._sb = sandbox
        #: The process's id in its sandbox.
        self.id = id
        #: For a handle start_process returned: its idempotency key was already known, and
        #: the process is the one an earlier request started.
        self.existing = existing

    def __repr__(self) -> str:
        return f"<fusebox.aio.Process {self.id} in {self._sb.id}>"

    def attach(self, from_offset: int = 0) -> OutputStream:
        """Streams the process's output from ``from_offset`` until it has exited (see
        :meth:`fusebox.Process.attach`); ``async for`` over the result."""
        req = _process.attach_request(self.id, from_offset)
        return OutputStream(self._sb._processes().Attach(req), self.id)

    async def write_stdin(self, data: Union[bytes, str]) -> None:
        """Writes ``data`` to the process's standard input; returns once every byte is
        written. Raises FailedPreconditionError once the process has exited or its input is
        closed."""
        await self._sb._process_call("WriteStdin", _process.stdin_request(self.id, data), f"writing to {self.id}")

    async def close_stdin(self) -> None:
        """Closes the process's standard input (on a terminal: writes Ctrl-D)."""
        await self._sb._process_call("WriteStdin", process_pb2.WriteStdinRequest(id=self.id, eof=True),
                                     f"closing the input of {self.id}")

    async def signal(self, sig: SignalLike, group: bool = False) -> None:
        """Sends ``sig`` to the process, or with ``group`` to its whole process group (see
        :meth:`fusebox.Process.signal`)."""
        await self._sb._process_call("Signal", _process.signal_request(self.id, sig, group), f"signalling {self.id}")

    async def wait(self, timeout: Optional[_core.Seconds] = None) -> ProcessInfo:
        """Waits until the process has exited and its output was read to the end, or until
        ``timeout`` passes (it is then still ``running``: not an error); see
        :meth:`fusebox.Process.wait`."""
        req, deadline = _process.wait_request(self.id, timeout)
        r = await self._sb._process_call("Wait", req, f"waiting for {self.id}", deadline)
        return ProcessInfo._from_proto(r.process)

    async def resize(self, rows: int, cols: int) -> None:
        """Sets the size of the process's terminal; raises FailedPreconditionError without one."""
        await self._sb._process_call("Resize", _process.resize_request(self.id, rows, cols), f"resizing {self.id}")

    async def info(self) -> ProcessInfo:
        """The process as the sandbox lists it now; NotFoundError once it no longer does."""
        i = _process.find(await self._sb.list_processes(), self.id)
        if i is None:
            raise NotFoundError(f"process {self.id}: the sandbox does not list it")
        return i


class TaskGroup:
    """Concurrent commands sharing one starting state (see :class:`fusebox.TaskGroup`).

    :meth:`exec` assigns the logical order when it is called, not when it is awaited, so
    ``await asyncio.gather(g.exec(a), g.exec(b))`` orders a before b.
    """

    def __init__(self, sandbox: Sandbox):
        self.id = _core.new_group_id()
        self._sb = sandbox
        self._order = 0
        self._tasks: List[asyncio.Task] = []

    def exec(self, command: CommandLike, **kw) -> "asyncio.Task[ExecResult]":
        """Assigns the next logical order now and starts the command; await the task for its result."""
        self._order += 1
        t = asyncio.get_running_loop().create_task(self._sb._exec(
            command, kw.get("cwd", ""), kw.get("env"), kw.get("unset"), kw.get("stdin"), kw.get("timeout"),
            kw.get("check", False), kw.get("stdout"), kw.get("stderr"), self.id, self._order))
        self._tasks.append(t)
        return t

    def start_process(self, command: CommandLike, *, cwd: Optional[str] = None,
                      env: Optional[Mapping[str, str]] = None, unset: Optional[Sequence[str]] = None,
                      pty: Optional[TerminalSize] = None, tag: str = "",
                      idempotency_key: Optional[str] = None) -> Awaitable[Process]:
        """Assigns the next logical order now and starts a long-lived process as a command of
        the group (see :meth:`fusebox.TaskGroup.start_process`); await the result for its
        handle. The group does not wait for it."""
        self._order += 1
        return self._sb._start_process(command, cwd, env, unset, pty, tag, idempotency_key, self.id, self._order)

    async def wait(self) -> List[ExecResult]:
        """Waits for every command; returns their results in logical order."""
        await asyncio.wait(self._tasks) if self._tasks else None
        return [t.result() for t in self._tasks]

    async def __aenter__(self) -> "TaskGroup":
        return self

    async def __aexit__(self, *exc) -> None:
        if self._tasks:
            await asyncio.wait(self._tasks)
