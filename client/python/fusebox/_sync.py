"""The synchronous API: :class:`Manager`, :class:`Sandbox`, :class:`TaskGroup`, :class:`ExecStream`."""

from __future__ import annotations

import concurrent.futures
import datetime
import heapq
import io
import itertools
import ssl
import threading
import time
import weakref
from typing import BinaryIO, Callable, Dict, Iterator, List, Mapping, Optional, Sequence, Union

import grpc
import grpc.experimental

from . import _bulk, _core, _forward, _process, _session, _watch
from ._pack import pack, prune_mkdirs
from ._proto.manager.v1 import manager_pb2, manager_pb2_grpc
from ._proto.sandbox.v1 import process_pb2, process_pb2_grpc, sandbox_pb2, sandbox_pb2_grpc
from ._process import SignalLike, TerminalSize
from .errors import FuseboxError, InvalidArgumentError, NotFoundError, UnavailableError, from_rpc
from .keys import AgentKey, KeysAhead
from .types import (CommandLike, ExecResult, File, FileInfo, Files, GrepMatch, GrepResult, Listing, OutputChunk,
                    OutputDropped, ProcessExit, ProcessInfo, ProcessOutput, SandboxInfo, Symlink, WriteStats)

Sink = _core.Sink


class Manager:
    """A connection to a fusebox manager, for an agent that allocates many sandboxes.

    ``address`` is ``unix:///path`` or ``tcp://host:port`` (default: $FUSEBOX_MANAGER, else
    ``unix:///run/fusebox/manager.sock``). A unix socket manager (``fusebox local up``) needs
    nothing more. A tcp:// manager serves TLS only: ``ca_file`` is the PEM CA that signed its
    certificate (or give ``credentials``), ``token_file`` the file holding the ServiceAccount
    token every call carries (read again when it changes), ``server_name`` the name checked
    in its certificate (default: the address's host); each defaults to $FUSEBOX_CA_FILE,
    $FUSEBOX_TOKEN_FILE and $FUSEBOX_TLS_SERVER_NAME, as for the CLI. A tcp:// manager without
    TLS is refused (InvalidArgumentError): the SDK never talks plaintext over TCP. It is safe
    to share between threads; close it (or use it as a context manager) when done.

    It makes the agent key of its next allocation ahead, in the background (a fresh key for
    every allocation, held in memory only), so that an allocation does not wait for one.
    """

    def __init__(self, address: Optional[str] = None, *, credentials: Optional[grpc.ChannelCredentials] = None,
                 ca_file: Optional[str] = None, token_file: Optional[str] = None, server_name: Optional[str] = None,
                 _ahead: bool = True):
        self._conn = _core.ManagerConnection(address, credentials, ca_file, token_file, server_name)
        self.address = self._conn.address
        # Keys made ahead: not for the one allocation of Sandbox.allocate's own Manager.
        self._keys = KeysAhead()
        self._ahead = _ahead
        self._keeper = _Keeper(self)
        if self._conn.credentials is not None:
            self._channel = grpc.secure_channel(self._conn.target, self._conn.credentials, options=self._conn.options)
        else:
            self._channel = grpc.insecure_channel(self._conn.target, options=self._conn.options)
        self._rpc = manager_pb2_grpc.ManagerStub(self._channel)
        if _ahead:
            self._keeper.want_key(0)

    def _err(self, e: grpc.RpcError, doing: str, service: str = "manager") -> FuseboxError:
        return self._conn.error(e, doing, service)

    def allocate(self, *, template: str = "", egress: Optional[Sequence[str]] = None,
                 lease_ttl: Optional[_core.Seconds] = None, labels: Optional[Mapping[str, str]] = None,
                 env: Optional[Mapping[str, str]] = None, cwd: str = "",
                 key: Optional[AgentKey] = None, batch_bytes: Optional[int] = None, concurrency: int = 4,
                 timeout: Optional[_core.Seconds] = _core.ALLOCATE_TIMEOUT) -> "Sandbox":
        """Allocates a fresh sandbox and connects to it directly with pinned mTLS.

        ``egress`` lists the destinations it may reach ("host:port", "*.domain:port"; none by
        default); ``env`` and ``cwd`` are the environment variables and working directory
        (absolute, or relative to the workspace) every command starts with, over the
        template's, given to the sandbox when it is initialised (a warm sandbox serves them);
        ``lease_ttl`` (seconds or a timedelta; the manager's default when None) is
        renewed in the background until the sandbox is closed; ``key`` is the agent key (a
        fresh Ed25519 key by default, made in memory, ahead of the call). The returned Sandbox
        releases the sandbox on close(); the manager destroys it then.
        """
        a = _core.AllocateArgs(key or self._keys.take(), template, egress, lease_ttl, labels, batch_bytes, concurrency, timeout,
                                env, cwd)
        resp = self._allocate(a.request, a.key, a.deadline)
        try:
            return Sandbox._connect(self, resp, a.key, a.ttl, a.batch_bytes, a.concurrency)
        except BaseException:
            self._release(resp.sandbox_id, resp.lease_token)
            raise

    def _allocate(self, req: manager_pb2.AllocateRequest, key: AgentKey, deadline: Optional[float]):
        fut = self._rpc.Allocate.future(req, timeout=deadline)
        try:
            key._credentials()  # the client certificate, made while the manager allocates
        except BaseException:
            # The manager may allocate all the same: wait for its answer and release what it gave.
            if fut.exception() is None:
                got = fut.result()
                self._release(got.sandbox_id, got.lease_token)
            raise
        try:
            return fut.result()
        except grpc.RpcError as e:
            raise self._err(e, "allocating sandbox") from None

    def _release(self, sandbox_id: str, token: str) -> Optional[FuseboxError]:
        try:
            self._rpc.Release(manager_pb2.ReleaseRequest(sandbox_id=sandbox_id, lease_token=token), timeout=_core.RELEASE_TIMEOUT)
        except grpc.RpcError as e:
            err = self._err(e, f"releasing {sandbox_id}", "lease")
            return None if isinstance(err, NotFoundError) else err  # already destroyed
        return None

    def list(self) -> List[SandboxInfo]:
        """The sandboxes the manager knows, bound or not."""
        try:
            resp = self._rpc.List(manager_pb2.ListRequest(), timeout=30)
        except grpc.RpcError as e:
            raise self._err(e, "listing sandboxes") from None
        return [SandboxInfo._from_proto(s) for s in resp.sandboxes]

    def pool_status(self) -> manager_pb2.PoolStatusResponse:
        """The pool's state and the estimator's target (the raw PoolStatusResponse)."""
        try:
            return self._rpc.PoolStatus(manager_pb2.PoolStatusRequest(), timeout=30)
        except grpc.RpcError as e:
            raise self._err(e, "reading pool status") from None

    def close(self) -> None:
        """Closes the connection; sandboxes allocated through it should be closed first."""
        self._keeper.close()
        self._keys.close()
        self._channel.close()

    def __enter__(self) -> "Manager":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class _Lease:
    """A sandbox's lease, renewed by its Manager's keeper until stopped. It holds no reference
    to the Sandbox, so that a Sandbox nobody closed can still be collected (and then released)."""

    def __init__(self, keeper: "_Keeper", sandbox_id: str, token: str, expires: datetime.datetime, every: float):
        self.keeper, self.id, self.token, self.every = keeper, sandbox_id, token, every
        self.lock = threading.Lock()
        self.expires, self.error = expires, None  # guarded by lock
        self.stopped = False  # guarded by the keeper's lock

    def stop(self) -> None:
        """Ends the renewals; one already on its way may still reach the manager."""
        self.keeper.remove(self)

    def _renewed(self, fut: grpc.Future) -> None:
        try:
            r = fut.result()
        except grpc.RpcError as e:
            with self.lock:
                self.error = self.keeper.mgr._err(e, f"renewing lease of {self.id}", "lease")
            return
        except Exception:  # cancelled: the channel was closed
            return
        with self.lock:
            self.expires, self.error = r.lease_expires.ToDatetime(tzinfo=datetime.timezone.utc), None


class _Keeper:
    """A Manager's background work, on one thread: it renews each of the Manager's leases every
    third of its TTL (each renewal a future, so that a slow answer holds up no other lease),
    and makes the Manager's next key ahead (KeysAhead) when asked. The thread starts with the
    first job (a Manager that makes keys ahead asks for one when made, so that its thread is
    not started on an allocation's path) and ends after IDLE_EXIT without one, so that a
    Manager nobody closed can still be collected.
    """

    #: Seconds without leases or keys to make after which the thread ends.
    IDLE_EXIT = 30.0

    def __init__(self, mgr: Manager):
        self.mgr = mgr
        self._cond = threading.Condition()
        # Guarded by _cond: leases by when they are due (stopped ones dropped lazily), when
        # the next key is due (None: not asked for), the thread, and whether closed.
        self._due: List[tuple] = []
        self._seq = itertools.count()
        self._key_due: Optional[float] = None
        self._thread: Optional[threading.Thread] = None
        self._closed = False

    def add(self, lease: _Lease, key_after: Optional[float] = None) -> None:
        """Renews lease every lease.every seconds from now until it is stopped, and with
        key_after does what want_key does, under one lock and one wake-up."""
        with self._cond:
            heapq.heappush(self._due, (time.monotonic() + lease.every, next(self._seq), lease))
            if key_after is not None:
                self._want_key(key_after)
            self._wake()

    def remove(self, lease: _Lease) -> None:
        with self._cond:
            lease.stopped = True

    def want_key(self, after: float) -> None:
        """Has the next key made after seconds from now, unless one is already asked for sooner."""
        with self._cond:
            self._want_key(after)
            self._wake()

    def _want_key(self, after: float) -> None:
        # Called with _cond held.
        due = time.monotonic() + after
        if self._key_due is None or due < self._key_due:
            self._key_due = due

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()

    def _wake(self) -> None:
        # Called with _cond held.
        if self._closed:
            return
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="fusebox-keeper", daemon=True)
            self._thread.start()
        self._cond.notify()

    def _next_jobs(self) -> Optional[tuple]:
        """Waits for due work: returns (leases to renew, whether to make a key), or None when
        the thread should end. Called with _cond held."""
        idle_since = None
        while not self._closed:
            now = time.monotonic()
            while self._due and self._due[0][2].stopped:
                heapq.heappop(self._due)
            dues = ([self._due[0][0]] if self._due else []) + ([self._key_due] if self._key_due is not None else [])
            first = min(dues, default=None)
            if first is None:
                idle_since = idle_since or now
                if now - idle_since >= self.IDLE_EXIT:
                    return None
                self._cond.wait(self.IDLE_EXIT - (now - idle_since))
                continue
            idle_since = None
            if first > now:
                self._cond.wait(first - now)
                continue
            renew = []
            while self._due and self._due[0][0] <= now:
                _, _, lease = heapq.heappop(self._due)
                if not lease.stopped:
                    renew.append(lease)
                    heapq.heappush(self._due, (now + lease.every, next(self._seq), lease))
            make_key = self._key_due is not None and self._key_due <= now
            if make_key:
                self._key_due = None
            return renew, make_key
        return None

    def _run(self) -> None:
        while True:
            with self._cond:
                jobs = self._next_jobs()
                if jobs is None:
                    self._thread = None
                    return
            renew, make_key = jobs
            for lease in renew:
                try:
                    fut = self.mgr._rpc.Renew.future(manager_pb2.RenewRequest(sandbox_id=lease.id, lease_token=lease.token),
                                                timeout=lease.every)
                except ValueError:  # the channel was closed under us
                    with self._cond:
                        self._thread = None
                        return
                fut.add_done_callback(lease._renewed)
            if make_key:
                self.mgr._keys.make()


def _leave(lease: _Lease, channel: grpc.Channel, owned: Optional[Manager]) -> None:
    """Stops renewing and closes the connections, leaving the sandbox running."""
    lease.stop()
    channel.close()
    if owned is not None:
        owned.close()


def _finish(lease: _Lease, channel: grpc.Channel, owned: Optional[Manager]) -> Optional[FuseboxError]:
    """Stops renewing, releases the sandbox and closes the connections; returns the release's error."""
    lease.stop()
    err = lease.keeper.mgr._release(lease.id, lease.token)
    channel.close()
    if owned is not None:
        owned.close()
    return err


class Sandbox:
    """A bound sandbox, talked to directly over pinned mTLS; close() releases it (it is destroyed).

    Make one with :meth:`Sandbox.allocate` or :meth:`Manager.allocate`, preferably as a
    context manager. It is safe for concurrent use from several threads.
    """

    id: str
    endpoint: str

    @classmethod
    def allocate(cls, manager: Optional[str] = None, *, credentials: Optional[grpc.ChannelCredentials] = None,
                 ca_file: Optional[str] = None, token_file: Optional[str] = None, server_name: Optional[str] = None,
                 **options) -> "Sandbox":
        """Connects to the manager at ``manager``, allocates, and returns the Sandbox.

        The manager connection is closed with the sandbox. ``credentials``, ``ca_file``,
        ``token_file`` and ``server_name`` secure a tcp:// manager (see :class:`Manager`);
        ``options`` are those of :meth:`Manager.allocate`.
        """
        m = Manager(manager, credentials=credentials, ca_file=ca_file, token_file=token_file, server_name=server_name,
                    _ahead=False)
        try:
            sb = m.allocate(**options)
        except BaseException:
            m.close()
            raise
        sb._finalizer.detach()
        sb._finalizer = weakref.finalize(sb, _finish, sb._lease, sb._channel, m)
        return sb

    @classmethod
    def connect(cls, session: _session.SessionLike, *, seal_key: Optional[bytes] = None, key: Optional[AgentKey] = None,
                credentials: Optional[grpc.ChannelCredentials] = None, ca_file: Optional[str] = None,
                token_file: Optional[str] = None, server_name: Optional[str] = None,
                batch_bytes: Optional[int] = None, concurrency: int = 4) -> "Sandbox":
        """Talks to the sandbox of an exported session (:meth:`export_session`, or ``fusebox
        run --keep --session-out``) from this process: a JSON string or bytes, a path to the
        file, or the parsed mapping.

        The agent key is the session's, opened with ``seal_key`` when sealed, or ``key`` for a
        session exported without one; either must be the key the sandbox was allocated for
        (else :class:`SessionKeyError`, before anything is dialed). The lease is renewed once
        to check it is still held (:class:`LeaseError` when it was released or has expired),
        then the sandbox is dialed directly, with the pinned keys: the manager sees only the
        renewal. ``credentials``, ``ca_file``, ``token_file`` and ``server_name`` reach a
        tcp:// manager (see :class:`Manager`); the address is the session's.

        The Sandbox renews the lease in the background like an allocated one; close() releases
        the sandbox (for every holder of the session), :meth:`detach` leaves it running.
        """
        doc, key, batch = _session.prepare(session, seal_key, key, batch_bytes, concurrency)
        m = Manager(doc["manager"], credentials=credentials, ca_file=ca_file, token_file=token_file,
                    server_name=server_name, _ahead=False)
        try:
            try:
                r = m._rpc.Renew(_session.renew_request(doc), timeout=_core.RELEASE_TIMEOUT)
            except grpc.RpcError as e:
                raise _session.lease_refused(e, doc["sandbox_id"], m._conn.hint()) from None
            sb = cls._connect(m, _session.response(doc, r), key, None, batch, concurrency)
        except BaseException:
            m.close()
            raise
        sb._finalizer.detach()
        sb._finalizer = weakref.finalize(sb, _finish, sb._lease, sb._channel, m)
        return sb

    @classmethod
    def _connect(cls, mgr: Manager, resp: manager_pb2.AllocateResponse, key: AgentKey, ttl: Optional[float],
                 batch_bytes: int, concurrency: int) -> "Sandbox":
        """The Sandbox of an allocation's answer, on a data channel made now."""
        sb = cls.__new__(cls)
        channel = _core.data_channel(grpc.secure_channel, resp, key, batch_bytes)
        _core.start_connecting(channel)
        sb.id, sb.endpoint = resp.sandbox_id, resp.endpoint
        sb._batch, sb._conc = batch_bytes, concurrency
        sb._resp, sb._key, sb._manager_address = resp, key, mgr.address
        sb._channel = channel
        sb._rpc = sandbox_pb2_grpc.SandboxStub(sb._channel)
        expires = resp.lease_expires.ToDatetime(tzinfo=datetime.timezone.utc)
        sb._lease = _Lease(mgr._keeper, resp.sandbox_id, resp.lease_token, expires, _core.renew_every(ttl, expires))
        mgr._keeper.add(sb._lease, key_after=_core.next_key_after(mgr._ahead))
        sb._finalizer = weakref.finalize(sb, _finish, sb._lease, sb._channel, None)
        sb._bulk = _bulk.Pool(resp, key)
        sb._bulk_finalizer = weakref.finalize(sb, sb._bulk.close)
        return sb

    # ---- lifecycle ----

    @property
    def lease_expires(self) -> datetime.datetime:
        """When the lease currently ends (renewed in the background)."""
        with self._lease.lock:
            return self._lease.expires

    @property
    def lease_error(self) -> Optional[FuseboxError]:
        """The last renewal's error, or None when it succeeded."""
        with self._lease.lock:
            return self._lease.error

    @property
    def closed(self) -> bool:
        return not self._finalizer.alive

    def close(self) -> None:
        """Stops renewing, releases the sandbox (the manager destroys it) and closes the
        connections. Safe to call more than once; a Sandbox that is garbage-collected unclosed
        is released the same way."""
        bf = getattr(self, "_bulk_finalizer", None)
        if bf is not None:
            bf()
        err = self._finalizer()
        if err is not None:
            raise err

    def detach(self) -> None:
        """Stops renewing and closes the connections, leaving the sandbox running until its
        lease ends or a holder of its session (:meth:`export_session`) releases it. After it,
        close() does nothing."""
        bf = getattr(self, "_bulk_finalizer", None)
        if bf is not None:
            bf()
        info = self._finalizer.detach()
        if info is not None:
            _leave(*info[2])

    def renew(self) -> datetime.datetime:
        """Renews the lease now, by its own length, besides the background renewals, and
        returns the new expiry; :class:`LeaseError` when the lease is no longer held."""
        try:
            r = self._lease.keeper.mgr._rpc.Renew(
                manager_pb2.RenewRequest(sandbox_id=self.id, lease_token=self._lease.token), timeout=_core.RELEASE_TIMEOUT)
        except grpc.RpcError as e:
            raise _session.lease_refused(e, self.id) from None
        with self._lease.lock:
            self._lease.expires, self._lease.error = _session.expires(r), None
            return self._lease.expires

    def export_session(self, seal_key: Optional[bytes] = None, *, plain: bool = False) -> str:
        """The session document (JSON) with which :meth:`Sandbox.connect`, in any process, the
        Go SDK's client.Connect, or the CLI's ``--session FILE`` talk to this sandbox and renew
        and release it. The agent key is sealed with AES-256-GCM under ``seal_key`` (32 bytes,
        e.g. ``os.urandom(32)`` kept in your secret store), or with ``plain=True`` put in the
        clear, or else left out (connect then needs ``key=``). The document grants what this
        agent has: protect it (and the seal key) like the agent key. The manager is not called."""
        return _session.export(self._resp, self._manager_address, self._key, seal_key, plain)

    def __enter__(self) -> "Sandbox":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<fusebox.Sandbox {self.id} {'closed' if self.closed else self.endpoint}>"

    # ---- exec ----

    def exec(self, command: CommandLike, *, cwd: str = "", env: Optional[Mapping[str, str]] = None,
             unset: Optional[Sequence[str]] = None, stdin: Union[bytes, str, None] = None,
             timeout: Optional[_core.Seconds] = None, check: bool = False, stdout: Sink = None,
             stderr: Sink = None) -> ExecResult:
        """Runs a command and returns how it ended.

        ``command`` is a bash script (a string: its exported variables and final directory
        persist for later commands) or an argv list. ``env`` and ``unset`` change the
        environment of this command only; ``stdin`` is written to its standard input.
        ``timeout`` (seconds) kills it with its process group and raises CommandTimeoutError;
        ``check`` raises CommandError on a non-zero exit. Output is collected into the result,
        or passed as it streams to ``stdout``/``stderr`` (callables or binary files).
        """
        return self._exec(command, cwd, env, unset, stdin, timeout, check, stdout, stderr, "", 0)

    def _exec(self, command, cwd, env, unset, stdin, timeout, check, stdout, stderr, group, order) -> ExecResult:
        s = self.exec_stream(command, cwd=cwd, env=env, unset=unset, stdin=stdin, timeout=timeout, _group=group, _order=order)
        out, err = io.BytesIO(), io.BytesIO()
        sinks = {"stdout": _core.sink(stdout, out), "stderr": _core.sink(stderr, err)}
        with s:
            for c in s._events():
                sinks[c.stream](c.data)
        res = s._result
        assert res is not None
        res.stdout, res.stderr = out.getvalue(), err.getvalue()
        return _core.check_result(res, command, s._timeout, check)

    def exec_stream(self, command: CommandLike, *, cwd: str = "", env: Optional[Mapping[str, str]] = None,
                    unset: Optional[Sequence[str]] = None, stdin: Union[bytes, str, None] = None,
                    timeout: Optional[_core.Seconds] = None, _group: str = "", _order: int = 0) -> "ExecStream":
        """Starts a command and returns an iterator over its output as it streams.

        Iterate it for :class:`OutputChunk` objects; ``result`` then says how the command
        ended. Closing the stream early (or leaving its ``with`` block) kills the command.
        """
        t = _core.seconds(timeout, "timeout")
        req = _core.exec_request(command, cwd, env, unset, stdin, t, _group, _order)
        return ExecStream(self._rpc.Exec(req, timeout=_core.rpc_deadline(t)), command, t)

    def run(self, *argv: str, **kw) -> ExecResult:
        """Runs argv and collects its output (``sb.run("ls", "-l")``)."""
        return self.exec(list(argv), **kw)

    def task_group(self) -> "TaskGroup":
        """Starts a task group: concurrent commands whose logically last change wins."""
        return TaskGroup(self)

    # ---- long-lived processes ----

    def _processes(self) -> process_pb2_grpc.ProcessesStub:
        stub = getattr(self, "_procs_stub", None)
        if stub is None:
            stub = self._procs_stub = process_pb2_grpc.ProcessesStub(self._channel)
        return stub

    def _process_call(self, method: str, req, doing: str, timeout: Optional[float] = 300):
        try:
            return getattr(self._processes(), method)(req, timeout=timeout)
        except grpc.RpcError as e:
            raise from_rpc(e, doing) from None

    def start_process(self, command: CommandLike, *, cwd: Optional[str] = None, env: Optional[Mapping[str, str]] = None,
                      unset: Optional[Sequence[str]] = None, pty: Optional[TerminalSize] = None, tag: str = "",
                      idempotency_key: Optional[str] = None) -> "Process":
        """Starts a long-lived process and returns its handle as soon as it runs.

        ``command``, ``cwd``, ``env`` and ``unset`` are as for :meth:`exec`; the process
        starts from the sandbox's state in a group of its own. It runs until it exits or is
        signalled, outliving this call and this connection, and has no timeout. With ``pty``
        (rows, cols) it runs on a new terminal of that size (its stdin, stdout and stderr, and
        its controlling terminal): its output is then all "stdout", with the terminal's output
        processing ("\\n" becomes "\\r\\n" until the process turns that off, e.g. ``stty
        raw``). ``tag`` is a label of the caller's, shown by :meth:`list_processes`. With
        ``idempotency_key`` a retried call returns the process the first one started (its
        ``existing`` set) while the sandbox still lists it; the key with a different request
        raises FailedPreconditionError. At the sandbox's limit of running processes it raises
        LimitError.
        """
        return self._start_process(command, cwd, env, unset, pty, tag, idempotency_key, "", 0)

    def _start_process(self, command, cwd, env, unset, pty, tag, idempotency_key, group, order) -> "Process":
        req = _process.start_request(command, cwd, env, unset, pty, tag, idempotency_key, group, order)
        r = self._process_call("StartProcess", req, f"starting process {_core.describe(command)!r}")
        return Process(self, r.process.id, r.existing)

    def list_processes(self) -> List[ProcessInfo]:
        """The sandbox's running processes and its most recently exited ones, in the order
        they started."""
        r = self._process_call("ListProcesses", process_pb2.ListProcessesRequest(), "listing processes")
        return _process.infos(r)

    def process(self, id: str) -> "Process":
        """A handle to the process ``id``, started through this connection or any other. It
        checks nothing: a call on a handle to an id the sandbox does not list raises
        NotFoundError."""
        return Process(self, id)

    # ---- ports ----

    def _port_dialer(self) -> _forward.Dialer:
        d = getattr(self, "_ports", None)
        if d is None:
            d = self._ports = _forward.Dialer(self._bulk)
        return d

    def dial_port(self, port: int) -> _forward.PortConnection:
        """Connects to ``port`` on the sandbox's loopback (127.0.0.1, else ::1) over a pinned
        connection of its own, and returns the connection, used as a connected socket
        (``sendall``, ``recv``, ``close_write``, ``close``). A port outside 1-65535 raises
        InvalidArgumentError before any connection is made; a port nothing listens on in the
        sandbox raises UnavailableError, whose message says so."""
        return self._port_dialer().dial(port)

    def forward_port(self, port: int, local_address: str = "127.0.0.1:0", *,
                     on_error: Optional[Callable[[BaseException], None]] = None) -> _forward.Forward:
        """Listens on ``local_address`` (a loopback HOST:PORT; port 0: one the system picks)
        and tunnels each connection accepted there to ``port`` on the sandbox's loopback, as
        :meth:`dial_port` connects, both ways, half-closes included. Returns the forward:
        ``address`` ("127.0.0.1:PORT") and ``port`` say where to connect; ``close()`` (or
        leaving its ``with`` block) ends it and its tunnels. A connection whose tunnel cannot be
        opened is closed, and its error passed to ``on_error`` if given. A port outside 1-65535
        or a host that is not loopback raises InvalidArgumentError."""
        return _forward.Forward(self._port_dialer(), port, local_address, on_error)

    # ---- files ----

    def write_files(self, files: _core.FilesLike, mkdirs: Sequence[str] = (),
                    symlinks: Sequence[Union[Symlink, tuple]] = ()) -> WriteStats:
        """Writes files (a {path: data} mapping, File objects or (path, data) pairs), creating
        ``mkdirs`` (pruned) and ``symlinks``, in as few RPCs as the batch limit allows.

        Small files are bin-packed into batches of at most 3.5 MiB sent concurrently; larger
        files are streamed. Each file appears atomically; on error some files may have been
        written, none partially.
        """
        return self._write(_core.file_writes(files), prune_mkdirs(list(mkdirs)), _core.symlink_specs(symlinks))

    def write_file(self, path: str, data: Union[bytes, str], mode: int = 0) -> None:
        """Writes one file of any size (in a batch when small, else streamed)."""
        self._write(_core.file_writes([File(path, data.encode() if isinstance(data, str) else data, mode)]), [], [])

    def write_tree(self, local_dir, remote_dir: str = "") -> WriteStats:
        """Copies the local directory tree into ``remote_dir`` of the workspace: regular files,
        directories (empty ones too) and relative symlinks, keeping file modes."""
        files, dirs, links = _core.walk_tree(local_dir, remote_dir)
        return self._write(files, dirs, links)

    def write_file_from(self, path: str, reader: BinaryIO, size: Optional[int] = None, mode: int = 0) -> int:
        """Streams a binary file object into ``path``; the file appears atomically, never
        partially. With ``size`` the sandbox checks that exactly that many bytes arrived."""
        hdr = _core.stream_header(path, mode, size)
        try:
            return self._rpc.WriteFileStream(_core.chunks_from(reader, hdr)).bytes_written
        except grpc.RpcError as e:
            raise from_rpc(e, f"streaming {path}") from None

    def _write(self, files, mkdirs, links) -> WriteStats:
        batches, streamed = pack(files, mkdirs, links, self._batch)
        st = WriteStats()
        lock = threading.Lock()
        sem = threading.Semaphore(self._conc)
        futures: List[tuple] = []

        def start(f, what):
            sem.acquire()
            f = f()
            f.add_done_callback(lambda _: sem.release())
            futures.append((f, what))

        try:
            for b in batches:
                start(lambda b=b: self._rpc.WriteFiles.future(b), ("batch", len(b.files)))
            for f in streamed:
                data = f.data  # once: reading a bytes field copies it
                hdr = _core.stream_header(f.path, f.mode, len(data))
                start(lambda data=data, hdr=hdr: self._rpc.WriteFileStream.future(_core.chunks_of(data, hdr)), ("stream", f.path))
            first_err = None
            for fut, (kind, what) in futures:
                try:
                    r = fut.result()
                except grpc.RpcError as e:
                    if first_err is None:
                        doing = f"writing batch of {what} files" if kind == "batch" else f"streaming {what}"
                        first_err = from_rpc(e, doing)
                        for g, _ in futures:
                            g.cancel()
                    continue
                with lock:
                    (_core.add_batch if kind == "batch" else _core.add_stream)(st, r)
            if first_err is not None:
                raise first_err
        except BaseException:
            for g, _ in futures:
                g.cancel()
            raise
        return st

    def read_files(self, *paths: str) -> Files:
        """Fetches the files matching ``paths`` (plain paths, directories, or globs with *, ?,
        [...] and **) through a plan: the sandbox says which files go in which batch and which
        are streamed, and the SDK fetches them concurrently. What matched nothing is listed in
        ``result.stats.missing``, not raised."""
        if not paths:
            raise InvalidArgumentError("read_files: give at least one path or glob")
        try:
            plan = self._rpc.GetReadFilesPlan(sandbox_pb2.GetReadFilesPlanRequest(paths=list(paths), max_batch_bytes=self._batch))
        except grpc.RpcError as e:
            raise from_rpc(e, "planning read") from None
        out = _core.files_of(plan)
        sem = threading.Semaphore(self._conc)  # batches in flight, as for writes
        futs = []
        pool = concurrent.futures.ThreadPoolExecutor(max_workers=self._conc) if plan.streamed else None
        try:
            for b in plan.batches:
                sem.acquire()
                fut = self._rpc.ReadFiles.future(sandbox_pb2.ReadFilesRequest(paths=[f.path for f in b.files]))
                fut.add_done_callback(lambda _: sem.release())
                futs.append((fut, len(b.files)))
            sfuts = [(pool.submit(self.read_file, f.path), f.path) for f in plan.streamed] if pool else []
            for fut, n in futs:
                try:
                    for f in fut.result().files:
                        out[f.path] = f.data
                except grpc.RpcError as e:
                    raise from_rpc(e, f"reading batch of {n} files") from None
            for sf, p in sfuts:
                out[p] = sf.result()
        finally:
            for fut, _ in futs:
                fut.cancel()
            if pool:
                pool.shutdown(wait=True, cancel_futures=True)
        return out

    def read_file(self, path: str) -> bytes:
        """Returns one file's contents (streamed, whatever its size)."""
        buf = io.BytesIO()
        self.read_file_to(path, buf)
        return buf.getvalue()

    def read_file_to(self, path: str, writer: BinaryIO) -> int:
        """Streams the file at ``path`` into a binary file object; returns the bytes written."""
        bulk = getattr(self, "_bulk", None)
        if bulk is not None:
            try:
                return bulk.read(path, writer)
            except _bulk.NoBulk:
                pass  # nothing was read: the gRPC stream below
            except grpc.RpcError as e:
                raise from_rpc(e, f"reading {path}") from None
            except (ConnectionError, ssl.SSLError) as e:
                raise UnavailableError(f"reading {path}: bulk connection: {e}") from None
        n = 0
        call = self._rpc.ReadFileStream(sandbox_pb2.ReadFileStreamRequest(path=path))
        try:
            for c in call:
                writer.write(c.data)
                n += len(c.data)
        except grpc.RpcError as e:
            raise from_rpc(e, f"reading {path}") from None
        finally:
            call.cancel()
        return n

    def _unary(self, method: str, req, doing: str):
        try:
            return getattr(self._rpc, method)(req, timeout=300)
        except grpc.RpcError as e:
            raise from_rpc(e, doing) from None

    def stat(self, path: str, follow_symlinks: bool = False) -> FileInfo:
        """Describes ``path`` (the link itself for a symlink unless ``follow_symlinks``)."""
        r = self._unary("Stat", sandbox_pb2.StatRequest(path=path, follow_symlinks=follow_symlinks), f"stat {path}")
        return FileInfo._from_proto(r.info)

    def exists(self, path: str) -> bool:
        """Whether ``path`` exists (a dangling symlink counts)."""
        try:
            self.stat(path)
            return True
        except NotFoundError:
            return False

    def list(self, path: str = "", recursive: bool = False, max_depth: int = 0, max_entries: int = 0) -> Listing:
        """Lists the directory ``path``; with ``recursive``, ``max_depth`` levels deep (0: all)."""
        r = self._unary("List", sandbox_pb2.ListRequest(path=path, recursive=recursive, max_depth=max_depth,
                                                        max_entries=max_entries), f"list {path or '.'}")
        return Listing([FileInfo._from_proto(e) for e in r.entries], r.truncated)

    def mkdir(self, path: str, parents: bool = False, mode: int = 0) -> None:
        """Creates the directory ``path`` (and its parents with ``parents``)."""
        self._unary("Mkdir", sandbox_pb2.MkdirRequest(path=path, parents=parents, mode=mode), f"mkdir {path}")

    def remove(self, path: str, recursive: bool = False, missing_ok: bool = False) -> None:
        """Removes ``path`` (a directory's contents too with ``recursive``)."""
        self._unary("Remove", sandbox_pb2.RemoveRequest(path=path, recursive=recursive, missing_ok=missing_ok), f"remove {path}")

    def rename(self, src: str, dst: str, overwrite: bool = False) -> None:
        """Moves ``src`` to ``dst``, replacing an existing destination only with ``overwrite``."""
        self._unary("Rename", sandbox_pb2.RenameRequest(to=dst, overwrite=overwrite, **{"from": src}), f"rename {src} to {dst}")

    def symlink(self, target: str, path: str) -> None:
        """Creates a symlink at ``path`` to ``target``, which must stay inside the workspace."""
        self._unary("Symlink", sandbox_pb2.SymlinkRequest(target=target, path=path), f"symlink {path} -> {target}")

    def find(self, path: str = "", name: str = "", type: Optional[str] = None, max_depth: int = 0,
             max_results: int = 0) -> Listing:
        """Finds entries under ``path`` whose base name matches the glob ``name``, of ``type``
        ("file", "dir", "symlink", "other"; any when None), ``max_depth`` levels deep (0: all)."""
        r = self._unary("Find", sandbox_pb2.FindRequest(path=path, name=name, type=_core.find_type(type), max_depth=max_depth,
                                                        max_results=max_results), f"find {name or '*'} in {path or '.'}")
        return Listing([FileInfo._from_proto(e) for e in r.entries], r.truncated)

    def grep(self, pattern: str, paths: Sequence[str] = (), include: Sequence[str] = (), exclude: Sequence[str] = (),
             case_insensitive: bool = False, max_matches: int = 0) -> GrepResult:
        """Searches file contents for an RE2 ``pattern`` under ``paths`` (the workspace when
        empty), in files matching ``include`` globs and not ``exclude`` globs."""
        if isinstance(paths, str):
            paths = [paths]
        r = self._unary("Grep", sandbox_pb2.GrepRequest(pattern=pattern, paths=list(paths), include=list(include),
                                                        exclude=list(exclude), case_insensitive=case_insensitive,
                                                        max_matches=max_matches), f"grep {pattern!r}")
        return GrepResult([GrepMatch(m.path, m.line, m.text) for m in r.matches], r.truncated, r.files_searched,
                          r.binary_files_skipped)

    def watch(self, path: str, recursive: bool = False, include: Sequence[str] = (), exclude: Sequence[str] = (),
              queue_size: int = 0) -> "_watch.Watch":
        """Watches the directory ``path`` ("" for the workspace root; with ``recursive`` the
        whole tree, directories made later included) and returns once the sandbox's watches
        are in place. Iterate the result for :class:`WatchChange` and :class:`WatchOverflow`
        items; close it (or leave its ``with`` block) to stop. ``include`` and ``exclude`` are
        globs on base names; ``queue_size`` bounds the changes the sandbox holds for you (0:
        its default). Raises PathEscapeError for a path leaving the workspace, NotFoundError,
        FailedPreconditionError for a file, LimitError beyond the sandbox's watches::

            with sb.watch("src", recursive=True, include=["*.py"]) as w:
                for ev in w:
                    print(ev)
        """
        req = _watch.request(path, recursive, include, exclude, queue_size)
        return _watch.Watch(self._rpc.Watch(req), path)


class ExecStream:
    """A running command's output as it streams. Iterate for :class:`OutputChunk`; then
    ``result`` says how it ended. Closing it early kills the command (with its process group)."""

    def __init__(self, call, command: CommandLike, timeout: Optional[float]):
        self._call, self._command, self._timeout = call, command, timeout
        self._result: Optional[ExecResult] = None
        self._started = False

    def _events(self) -> Iterator[OutputChunk]:
        if self._started:
            raise FuseboxError("exec stream: already iterated")
        self._started = True
        try:
            for ev in self._call:
                kind = ev.WhichOneof("event")
                if kind == "output":
                    yield OutputChunk("stderr" if ev.output.stream == sandbox_pb2.STREAM_KIND_STDERR else "stdout", ev.output.data)
                elif kind == "exit":
                    self._result = _core.exit_result(ev.exit, b"", b"")
        except grpc.RpcError as e:
            raise from_rpc(e, f"exec {_core.describe(self._command)!r}") from None
        if self._result is None:
            raise FuseboxError(f"exec {_core.describe(self._command)!r}: stream ended without an exit status")

    def __iter__(self) -> Iterator[OutputChunk]:
        yield from self._events()
        _core.check_result(self._result, self._command, self._timeout, False)  # type: ignore[arg-type]

    @property
    def result(self) -> ExecResult:
        """How the command ended (its output is not collected here: it was iterated)."""
        if self._result is None:
            raise FuseboxError("exec stream: the command has not finished; iterate the stream first")
        return self._result

    def wait(self) -> ExecResult:
        """Drains the rest of the output and returns the result."""
        if not self._started:
            for _ in self:
                pass
        return self.result

    def cancel(self) -> None:
        """Ends the stream; the sandbox kills the command."""
        self._call.cancel()

    def __enter__(self) -> "ExecStream":
        return self

    def __exit__(self, *exc) -> None:
        if self._result is None:
            self.cancel()


class OutputStream:
    """A long-lived process's output from an offset, as it streams (see :meth:`Process.attach`).

    Iterate it for :class:`ProcessOutput` and :class:`OutputDropped` items: what the sandbox
    still holds, then live output. The iteration ends once the process has exited and its
    output was read to the end; ``exit`` then says how it ended. ``close()`` (or leaving its
    ``with`` block) stops following, from any thread; the process runs on.
    """

    def __init__(self, call, process_id: str):
        self._call, self._id = call, process_id
        self._exit: Optional[ProcessExit] = None
        self._started = False
        self._closed = False

    def __iter__(self) -> Iterator[Union[ProcessOutput, OutputDropped]]:
        if self._started:
            raise FuseboxError(f"attaching to {self._id}: the stream was already iterated")
        self._started = True
        try:
            for ev in self._call:
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

    def __enter__(self) -> "OutputStream":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class Process:
    """A handle to a long-lived process in a sandbox (see :meth:`Sandbox.start_process`).

    Handles are cheap and hold nothing open: any number, from any connection to the sandbox,
    may name one process (:meth:`Sandbox.process`). A call on a handle to an id the sandbox
    does not list raises NotFoundError; one that needs the process running (writing to its
    input, a signal, a resize) raises FailedPreconditionError once it has exited. It is safe
    for concurrent use from several threads.
    """

    def __init__(self, sandbox: Sandbox, id: str, existing: bool = False):
        self._sb = sandbox
        #: The process's id in its sandbox.
        self.id = id
        #: For a handle start_process returned: its idempotency key was already known, and
        #: the process is the one an earlier request started.
        self.existing = existing

    def __repr__(self) -> str:
        return f"<fusebox.Process {self.id} in {self._sb.id}>"

    def attach(self, from_offset: int = 0) -> OutputStream:
        """Streams the process's output from ``from_offset`` (0: its first byte; offsets
        count stdout and stderr together): what the sandbox still holds, then live output,
        until the process has exited. Output older than the sandbox's buffer comes as an
        :class:`OutputDropped` first, saying exactly which bytes are lost. Iterating raises
        OutOfRangeError for an offset past what the process has written, NotFoundError for an
        unknown id."""
        req = _process.attach_request(self.id, from_offset)
        return OutputStream(self._sb._processes().Attach(req), self.id)

    def write_stdin(self, data: Union[bytes, str]) -> None:
        """Writes ``data`` (a str as UTF-8) to the process's standard input; returns once
        every byte is written. Raises FailedPreconditionError once the process has exited or
        its input is closed."""
        self._sb._process_call("WriteStdin", _process.stdin_request(self.id, data), f"writing to {self.id}")

    def close_stdin(self) -> None:
        """Closes the process's standard input (it reads end of file). On a terminal it
        writes the terminal's end-of-file character (Ctrl-D) instead, which ends the input of
        a program reading lines; the terminal stays open."""
        self._sb._process_call("WriteStdin", process_pb2.WriteStdinRequest(id=self.id, eof=True),
                               f"closing the input of {self.id}")

    def signal(self, sig: SignalLike, group: bool = False) -> None:
        """Sends ``sig`` (a number or a :class:`signal.Signals`) to the process, or with
        ``group`` to its whole process group (every descendant that stayed in it). Raises
        InvalidArgumentError for a number outside 1..64, FailedPreconditionError once the
        process has exited."""
        self._sb._process_call("Signal", _process.signal_request(self.id, sig, group), f"signalling {self.id}")

    def wait(self, timeout: Optional[_core.Seconds] = None) -> ProcessInfo:
        """Waits until the process has exited and its output was read to the end, and
        returns it (``running`` false). With ``timeout`` (seconds or a timedelta; 0 asks
        without waiting) it returns when that passes too: the process is then still
        ``running``, which is not an error."""
        req, deadline = _process.wait_request(self.id, timeout)
        r = self._sb._process_call("Wait", req, f"waiting for {self.id}", deadline)
        return ProcessInfo._from_proto(r.process)

    def resize(self, rows: int, cols: int) -> None:
        """Sets the size of the process's terminal (1..65535 each); its foreground process
        group gets SIGWINCH. Raises FailedPreconditionError for a process started without
        ``pty``."""
        self._sb._process_call("Resize", _process.resize_request(self.id, rows, cols), f"resizing {self.id}")

    def info(self) -> ProcessInfo:
        """The process as the sandbox lists it now. Raises NotFoundError once it no longer
        does (only the most recently exited processes stay listed)."""
        i = _process.find(self._sb.list_processes(), self.id)
        if i is None:
            raise NotFoundError(f"process {self.id}: the sandbox does not list it")
        return i


class TaskGroup:
    """Commands that may run concurrently and share one starting state.

    Each command gets its logical order when :meth:`exec` or :meth:`submit` is called (issue
    time); among the group's commands the logically last change to a variable or to the
    working directory wins, however their completions interleave, and the group's changes
    are visible to the next group. Start the next group only after this one's commands have
    returned (leaving its ``with`` block waits for them).
    """

    def __init__(self, sandbox: Sandbox, max_workers: int = 32):
        self.id = _core.new_group_id()
        self._sb = sandbox
        self._lock = threading.Lock()
        self._order = 0  # guarded by _lock
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="fusebox-group")
        self._futures: List[concurrent.futures.Future] = []

    def _next(self) -> int:
        with self._lock:
            self._order += 1
            return self._order

    def exec(self, command: CommandLike, **kw) -> ExecResult:
        """Assigns the next logical order, then runs the command (arguments as Sandbox.exec)."""
        return self._run(self._next(), command, kw)

    def submit(self, command: CommandLike, **kw) -> "concurrent.futures.Future[ExecResult]":
        """Assigns the next logical order now and runs the command in the background."""
        order = self._next()
        f = self._pool.submit(self._run, order, command, kw)
        self._futures.append(f)
        return f

    def start_process(self, command: CommandLike, *, cwd: Optional[str] = None, env: Optional[Mapping[str, str]] = None,
                      unset: Optional[Sequence[str]] = None, pty: Optional[TerminalSize] = None, tag: str = "",
                      idempotency_key: Optional[str] = None) -> Process:
        """Assigns the next logical order, then starts a long-lived process as a command of
        the group (arguments as :meth:`Sandbox.start_process`): it starts from the group's
        state, and a script's exported variables and final directory count for the group
        when it exits while the group is still the current one. The group does not wait for
        it."""
        return self._sb._start_process(command, cwd, env, unset, pty, tag, idempotency_key, self.id, self._next())

    def _run(self, order: int, command: CommandLike, kw: Dict) -> ExecResult:
        return self._sb._exec(command, kw.get("cwd", ""), kw.get("env"), kw.get("unset"), kw.get("stdin"), kw.get("timeout"),
                              kw.get("check", False), kw.get("stdout"), kw.get("stderr"), self.id, order)

    def wait(self) -> List[ExecResult]:
        """Waits for every submitted command; returns their results in logical order (the
        first error is raised after all have finished)."""
        concurrent.futures.wait(self._futures)
        return [f.result() for f in self._futures]

    def __enter__(self) -> "TaskGroup":
        return self

    def __exit__(self, *exc) -> None:
        concurrent.futures.wait(self._futures)
        self._pool.shutdown(wait=True)
