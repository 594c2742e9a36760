"""What the sync and asyncio APIs share: building requests, reading answers, channel setup."""

from __future__ import annotations

import asyncio
import datetime
import inspect
import os
import posixpath
import secrets
import stat as stat_mod
import threading
import weakref
from typing import Any, BinaryIO, Callable, Iterable, Iterator, List, Mapping, Optional, Sequence, Tuple, Union

import grpc
from google.protobuf import duration_pb2

from . import _address
from ._pack import Pending, prune_mkdirs
from ._proto.manager.v1 import manager_pb2
from ._proto.sandbox.v1 import sandbox_pb2
from .errors import CommandError, CommandTimeoutError, FuseboxError, InvalidArgumentError, from_rpc, unreachable
from .keys import PREPARE_AFTER, SERVER_NAME, AgentKey, pinned_root
from .types import DEFAULT_BATCH_BYTES, STREAM_CHUNK, CommandLike, ExecResult, File, Files, ReadStats, Symlink, WriteStats

#: Where ``fusebox local up`` listens by default; $FUSEBOX_MANAGER overrides it.
DEFAULT_MANAGER = "unix:///run/fusebox/manager.sock"

Seconds = Union[float, int, datetime.timedelta]
FilesLike = Union[Mapping[str, Union[bytes, str]], Iterable[Union[File, Tuple[str, bytes]]]]

# How long a client waits past a command's own timeout before it gives up on the stream:
# the sandbox kills the command at its timeout and answers at once.
EXEC_GRACE = 30.0
# Bounds on the manager's calls.
ALLOCATE_TIMEOUT = 60.0
RELEASE_TIMEOUT = 30.0


# The environment variables that say how to reach the manager, as the CLI reads them
# (cmd/fusebox, cmd/internal/managerflags).
ENV_MANAGER = "FUSEBOX_MANAGER"
ENV_CA_FILE = "FUSEBOX_CA_FILE"
ENV_TOKEN_FILE = "FUSEBOX_TOKEN_FILE"
ENV_SERVER_NAME = "FUSEBOX_TLS_SERVER_NAME"


def manager_address() -> str:
    """The manager address to use when none is given: $FUSEBOX_MANAGER or DEFAULT_MANAGER."""
    return os.environ.get(ENV_MANAGER) or DEFAULT_MANAGER


def _setting(v: Optional[str], env: str) -> str:
    """An option's value: as given, or $env when None ("" turns the environment's off)."""
    return os.environ.get(env, "") if v is None else v


class ManagerConnection:
    """How to reach a manager: its address, and a tcp:// manager's TLS and token.

    A unix socket manager is guarded by the socket's file permissions and is talked to in
    plaintext (the token is not sent there). A tcp:// manager serves TLS only: ``ca_file``
    (PEM, the CA that signed its certificate) or ``credentials`` are required, and
    ``token_file`` holds the bearer token every call carries (a projected ServiceAccount
    token, read again whenever the file changes). ``server_name`` is the name checked in the
    manager's certificate (default: the address's host). Options left None come from
    $FUSEBOX_CA_FILE, $FUSEBOX_TOKEN_FILE and $FUSEBOX_TLS_SERVER_NAME, as for the CLI.
    """

    def __init__(self, address: Optional[str], credentials: Optional[grpc.ChannelCredentials] = None,
                 ca_file: Optional[Union[str, os.PathLike]] = None, token_file: Optional[Union[str, os.PathLike]] = None,
                 server_name: Optional[str] = None):
        self.address = address if address is not None else manager_address()
        addr = _address.parse(self.address, "manager address")
        self.target = addr.grpc_target
        self.credentials = credentials
        self.options: List[Tuple[str, Any]] = []
        self.tcp = addr.network == "tcp"
        if not self.tcp:
            # A link at the manager's socket name is refused. The channel dials by name (it
            # must reach a restarted manager's new socket), so this is checked when the
            # Manager is made, not at each reconnection as the data channels' pinning does.
            _address.refuse_link(addr.address, "manager socket")
            return
        ca = os.fspath(_setting(ca_file, ENV_CA_FILE))  # type: ignore[arg-type]
        token = os.fspath(_setting(token_file, ENV_TOKEN_FILE))  # type: ignore[arg-type]
        name = _setting(server_name, ENV_SERVER_NAME)
        if credentials is None:
            if not ca:
                raise InvalidArgumentError(
                    f"manager {self.address}: a tcp:// manager serves TLS only: give its CA (ca_file= or ${ENV_CA_FILE}; "
                    f"in a cluster the ConfigMap fusebox-manager-ca, key ca.crt) and a ServiceAccount token "
                    f"(token_file= or ${ENV_TOKEN_FILE}); the SDK never talks plaintext over TCP")
            self.credentials = grpc.ssl_channel_credentials(root_certificates=_read_ca(ca))
        if name:
            self.options.append(("grpc.ssl_target_name_override", name))
        if token:
            self.credentials = grpc.composite_channel_credentials(
                self.credentials, grpc.metadata_call_credentials(TokenFile(token), name="fusebox-token-file"))

    def hint(self) -> str:
        """What to check when no manager answered."""
        if self.tcp:
            return f"is the manager at {self.address} reachable, with its CA in ca_file (${ENV_CA_FILE})?"
        return f"is `fusebox local up` running, and is {self.address} its address?"

    def error(self, e: grpc.RpcError, doing: str, service: str = "manager") -> FuseboxError:
        """The typed error of a failed manager call: the hint only when no manager answered."""
        return from_rpc(e, doing, service, self.hint() if unreachable(e) else "")


def _read_ca(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            pem = f.read()
    except OSError as e:
        raise InvalidArgumentError(f"reading the manager's CA: {e}") from None
    if b"-----BEGIN CERTIFICATE-----" not in pem:
        raise InvalidArgumentError(f"the manager's CA file {path} holds no PEM certificate")
    return pem


class TokenFile(grpc.AuthMetadataPlugin):
    """A bearer token read from a file, again whenever the file changes (the kubelet rotates
    projected tokens); it is sent only over TLS. Reading it fails at once when the file is
    missing or empty."""

    def __init__(self, path: str):
        self.path = path
        self._lock = threading.Lock()
        self._seen: Optional[Tuple[int, int]] = None  # guarded by _lock, as _token
        self._token = ""
        self.token()

    def token(self) -> str:
        try:
            st = os.stat(self.path)
            with self._lock:
                if self._seen == (st.st_mtime_ns, st.st_size):
                    return self._token
            with open(self.path, "rb") as f:
                tok = f.read().decode("utf-8", "replace").strip()
        except OSError as e:
            raise InvalidArgumentError(f"manager token file: {e}") from None
        if not tok:
            raise InvalidArgumentError(f"manager token file {self.path} is empty")
        with self._lock:
            self._seen, self._token = (st.st_mtime_ns, st.st_size), tok
        return tok

    def __call__(self, context: grpc.AuthMetadataContext, callback: grpc.AuthMetadataPluginCallback) -> None:
        try:
            tok = self.token()
        except FuseboxError as e:
            callback((), e)
            return
        callback((("authorization", "Bearer " + tok),), None)


def seconds(v: Optional[Seconds], what: str) -> Optional[float]:
    """Converts a timeout or TTL (seconds or a timedelta) to float seconds; None stays None."""
    if v is None:
        return None
    if isinstance(v, datetime.timedelta):
        v = v.total_seconds()
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise InvalidArgumentError(f"{what}: want seconds (a number) or a timedelta, got {type(v).__name__}")
    if v < 0:
        raise InvalidArgumentError(f"{what}: {v} is negative")
    return float(v)


def duration(s: float) -> duration_pb2.Duration:
    d = duration_pb2.Duration()
    d.FromNanoseconds(int(s * 1e9))
    return d


def allocate_request(key: AgentKey, template: str, egress: Optional[Sequence[str]], lease_ttl: Optional[float],
                     labels: Optional[Mapping[str, str]], env: Optional[Mapping[str, str]] = None,
                     cwd: str = "") -> manager_pb2.AllocateRequest:
    if env is not None and (not isinstance(env, Mapping) or
                            not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items())):
        raise InvalidArgumentError(f"env: want a mapping of str to str, got {env!r}")
    if not isinstance(cwd, str):
        raise InvalidArgumentError(f"cwd: want a str, got {cwd!r}")
    if isinstance(egress, str):
        raise InvalidArgumentError(f"egress: want a list of 'host:port' entries, got the string {egress!r}")
    for e in egress or ():
        if not isinstance(e, str):
            raise InvalidArgumentError(f"egress entry {e!r}: want a 'host:port' string")
    req = manager_pb2.AllocateRequest(agent_public_key=key.public_key, template=template or "",
                                      egress=list(egress or ()), labels=dict(labels or {}),
                                      env=dict(env or {}), cwd=cwd)
    if lease_ttl:
        req.lease_ttl.CopyFrom(duration(lease_ttl))
    return req


class AllocateArgs:
    """A Manager.allocate call's arguments, checked: the key, the request, the lease TTL and
    the call's deadline in seconds, the batch limit and the concurrency."""

    def __init__(self, key: AgentKey, template: str, egress: Optional[Sequence[str]], lease_ttl: Optional[Seconds],
                 labels: Optional[Mapping[str, str]], batch_bytes_: Optional[int], concurrency: int, timeout: Optional[Seconds],
                 env: Optional[Mapping[str, str]] = None, cwd: str = ""):
        self.ttl = seconds(lease_ttl, "lease_ttl")
        self.deadline = seconds(timeout, "timeout")
        if not isinstance(concurrency, int) or concurrency <= 0:
            raise InvalidArgumentError(f"concurrency: want a positive integer, got {concurrency!r}")
        self.concurrency = concurrency
        self.batch_bytes = batch_bytes(batch_bytes_)
        self.key = key
        self.request = allocate_request(key, template, egress, self.ttl, labels, env, cwd)


def data_channel_args(resp: manager_pb2.AllocateResponse, key: AgentKey, batch_bytes: int):
    """Checks the allocation's sandbox identity and returns (target, credentials, options).

    Raises PinningError when the certificate's key is not the pinned key (the caller then
    releases the sandbox).
    """
    root = pinned_root(resp.sandbox_certificate, resp.sandbox_public_key)
    addr = _address.parse(resp.endpoint, "sandbox endpoint")
    key_pem, cert_pem = key._credentials()
    creds = grpc.ssl_channel_credentials(root_certificates=root, private_key=key_pem, certificate_chain=cert_pem)
    return addr.grpc_target, creds, channel_options(batch_bytes)


def data_channel(make, resp: manager_pb2.AllocateResponse, key: AgentKey, batch_bytes: int):
    """The data channel to an allocation's sandbox, made by ``make(target, credentials,
    options)`` (grpc.secure_channel or grpc.aio.secure_channel). A unix socket is dialed by
    the descriptor of the socket found at its name, never through a link (_address.pin_socket);
    the descriptor is closed when the channel object is gone."""
    target, creds, options = data_channel_args(resp, key, batch_bytes)
    fd = None
    addr = _address.parse(resp.endpoint, "sandbox endpoint")
    if addr.network == "unix":
        target, fd = _address.pin_socket(addr.address, "sandbox endpoint")
    try:
        channel = make(target, creds, options=options)
    except BaseException:
        if fd is not None:
            os.close(fd)
        raise
    if fd is not None:
        weakref.finalize(channel, os.close, fd)
    return channel


def renew_every(ttl: Optional[float], expires: datetime.datetime) -> float:
    """How often a lease is renewed: every third of its TTL (the lease's remaining time when
    the manager's default TTL applies), at most ten times a second."""
    if not ttl:
        ttl = max((expires - datetime.datetime.now(datetime.timezone.utc)).total_seconds(), 0.3)
    return max(ttl / 3, 0.1)


def next_key_after(ahead: bool) -> Optional[float]:
    """When a kept Manager makes the next allocation's key, in seconds after an allocation
    answers (None: it makes none ahead). Made at once, the key would compete with the
    allocation's first call for the CPU."""
    return PREPARE_AFTER if ahead else None


def start_connecting(channel: grpc.Channel) -> None:
    """Starts a sync channel's connection and TLS handshake now rather than at its first call,
    so that they overlap the caller's next steps (about 0.3 ms of an allocation here).

    grpc.Channel has no public call for it (subscribe(try_to_connect=True) starts a polling
    thread); this uses the core channel's own call where grpcio has it, and otherwise leaves
    the connection to the first call, as before. grpc.aio's channel has get_state(True).
    """
    core = getattr(channel, "_channel", None)
    check = getattr(core, "check_connectivity_state", None)
    if check is not None:
        check(True)


def channel_options(batch_bytes: int) -> List[Tuple[str, Any]]:
    limit = batch_bytes + (1 << 20)
    return [
        ("grpc.ssl_target_name_override", SERVER_NAME),
        ("grpc.default_authority", SERVER_NAME),
        ("grpc.max_send_message_length", limit),
        ("grpc.max_receive_message_length", limit),
        # One connection per sandbox, not shared with other channels to other sandboxes.
        ("grpc.use_local_subchannel_pool", 1),
        ("grpc.keepalive_time_ms", 30_000),
        ("grpc.keepalive_timeout_ms", 10_000),
        ("grpc.http2.lookahead_bytes", 8 << 20),
    ]


def exec_request(command: CommandLike, cwd: str, env: Optional[Mapping[str, str]], unset: Optional[Sequence[str]],
                 stdin: Union[bytes, str, None], timeout: Optional[float], group: str = "", order: int = 0) -> sandbox_pb2.ExecRequest:
    req = sandbox_pb2.ExecRequest(cwd=cwd or "", task_group_id=group, logical_order=order)
    if isinstance(command, str):
        if not command.strip():
            raise InvalidArgumentError("exec: the script is empty")
        req.script = command
    else:
        argv = list(command)
        if not argv or not all(isinstance(a, str) for a in argv):
            raise InvalidArgumentError(f"exec: want a script string or a non-empty list of strings, got {command!r}")
        req.argv.extend(argv)
    if env:
        req.env.update({str(k): str(v) for k, v in env.items()})
    if unset:
        req.unset_env.extend(unset)
    if stdin:
        req.stdin = stdin.encode() if isinstance(stdin, str) else bytes(stdin)
    if timeout:
        req.timeout.CopyFrom(duration(timeout))
    return req


def rpc_deadline(timeout: Optional[float]) -> Optional[float]:
    """The client-side deadline of an Exec: the command's timeout plus a grace, or none."""
    return timeout + EXEC_GRACE if timeout else None


def describe(command: CommandLike) -> str:
    s = command if isinstance(command, str) else " ".join(command)
    return s if len(s) <= 80 else s[:77] + "..."


def exit_result(x: sandbox_pb2.ExecExit, stdout: bytes, stderr: bytes) -> ExecResult:
    return ExecResult(exit_code=x.exit_code, signal=x.signal, duration=x.duration.ToNanoseconds() / 1e9,
                      truncated=x.truncated, timed_out=x.timed_out, state_recorded=x.state_recorded,
                      stdout=stdout, stderr=stderr)


def timed_out_message(command: CommandLike, timeout: Optional[float], res: ExecResult) -> str:
    """Says that the command ran into its timeout, or into the sandbox's default timeout when
    it set none."""
    if timeout:
        return (f"command {describe(command)!r} timed out after {timeout:g}s and was killed with its process group "
                f"(give it a longer timeout)")
    return (f"command {describe(command)!r} ran into the sandbox's default timeout after {res.duration:.0f}s and was "
            f"killed with its process group (give it a timeout= of its own)")


def check_result(res: ExecResult, command: CommandLike, timeout: Optional[float], check: bool) -> ExecResult:
    if res.timed_out:
        raise CommandTimeoutError(timed_out_message(command, timeout, res), res)
    if check and res.exit_code != 0:
        how = f"was killed by {res.signal}" if res.signal else f"exited with status {res.exit_code}"
        tail = res.stderr[-500:].decode("utf-8", "replace").strip()
        raise CommandError(f"command {describe(command)!r} {how}" + (f": {tail}" if tail else ""), res)
    return res


Sink = Union[Callable[[bytes], object], BinaryIO, None]


def sink(s: Sink, buf) -> Callable[[bytes], object]:
    """The function that takes a command's output for s: buf.write when s is None, s itself
    when callable (asyncio awaits what it returns when that is awaitable), or a binary file's
    write and flush."""
    if s is None:
        return buf.write
    if callable(s):
        return s
    if hasattr(s, "write"):
        def w(b: bytes) -> None:
            s.write(b)
            if hasattr(s, "flush"):
                s.flush()
        return w
    raise InvalidArgumentError(f"output sink: want a callable or a binary file, got {type(s).__name__}")


def awaitable(x: object) -> bool:
    return inspect.isawaitable(x)


def add_batch(st: WriteStats, r: sandbox_pb2.WriteFilesResponse) -> None:
    """Counts a WriteFiles answer into st."""
    st.files += r.files_written
    st.dirs += r.dirs_created
    st.symlinks += r.symlinks_created
    st.bytes += r.bytes_written
    st.batches += 1


def add_stream(st: WriteStats, r: sandbox_pb2.WriteFileStreamResponse) -> None:
    """Counts a WriteFileStream answer into st."""
    st.files += 1
    st.bytes += r.bytes_written
    st.streamed += 1


def files_of(plan: sandbox_pb2.ReadFilesPlan) -> Files:
    """The (still empty) result of a read planned as plan."""
    return Files(ReadStats(missing=list(plan.missing), batches=len(plan.batches), streamed=len(plan.streamed),
                           bytes=plan.total_bytes))


def new_group_id() -> str:
    return secrets.token_hex(12)


def file_writes(files: FilesLike) -> List[Pending]:
    out = []
    items: Iterable[Any] = files.items() if isinstance(files, Mapping) else files
    for it in items:
        if isinstance(it, File):
            p, data, mode = it.path, it.data, it.mode
        else:
            try:
                p, data = it
            except (TypeError, ValueError):
                raise InvalidArgumentError(f"write_files: want File objects, (path, data) pairs or a mapping, got {it!r}") from None
            mode = 0
        if not isinstance(p, str) or not p:
            raise InvalidArgumentError(f"write_files: bad path {p!r}")
        if isinstance(data, str):
            data = data.encode()
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise InvalidArgumentError(f"write_files: {p}: want bytes or str data, got {type(data).__name__}")
        out.append(Pending(p, bytes(data), mode & 0o7777))
    return out


def symlink_specs(symlinks: Optional[Iterable[Union[Symlink, Tuple[str, str]]]]) -> List[sandbox_pb2.SymlinkSpec]:
    out = []
    for l in symlinks or ():
        if isinstance(l, Symlink):
            out.append(sandbox_pb2.SymlinkSpec(target=l.target, path=l.path))
        else:
            target, p = l
            out.append(sandbox_pb2.SymlinkSpec(target=target, path=p))
    return out


def walk_tree(local_dir: Union[str, os.PathLike], remote_dir: str):
    """Reads the local tree: (file writes, pruned mkdirs, symlinks), as WriteTree in Go does.

    Regular files, directories (empty ones included) and relative symlinks; modes are kept.
    """
    root = os.fspath(local_dir)
    if not os.path.isdir(root):
        raise InvalidArgumentError(f"write_tree: {root} is not a local directory")
    files, dirs, links = [], [], []

    def remote(rel: str) -> str:
        rel = rel.replace(os.sep, "/")
        return posixpath.normpath(posixpath.join(remote_dir, rel)) if remote_dir else rel

    if remote_dir:
        dirs.append(posixpath.normpath(remote_dir))
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        for name in list(dirnames) + filenames:
            full = os.path.join(dirpath, name)
            rel = os.path.relpath(full, root)
            st = os.lstat(full)
            if stat_mod.S_ISLNK(st.st_mode):
                target = os.readlink(full)
                if os.path.isabs(target):
                    raise InvalidArgumentError(f"write_tree: {full}: absolute symlink target {target!r} cannot be kept inside the workspace")
                links.append(sandbox_pb2.SymlinkSpec(target=target.replace(os.sep, "/"), path=remote(rel)))
            elif stat_mod.S_ISDIR(st.st_mode):
                dirs.append(remote(rel))
            elif stat_mod.S_ISREG(st.st_mode):
                with open(full, "rb") as f:
                    files.append(Pending(remote(rel), f.read(), stat_mod.S_IMODE(st.st_mode)))
            # Devices, sockets and pipes have no meaning in a workspace.
    return files, prune_mkdirs(dirs), links


def stream_header(path: str, mode: int, size: Optional[int]) -> sandbox_pb2.WriteFileHeader:
    h = sandbox_pb2.WriteFileHeader(path=path, mode=mode & 0o7777)
    if size is not None and size >= 0:
        h.size = size
    return h


def chunks_of(data: bytes, header: sandbox_pb2.WriteFileHeader) -> Iterator[sandbox_pb2.WriteFileChunk]:
    """The WriteFileStream messages for data: the header with the first chunk."""
    mv = memoryview(data)
    yield sandbox_pb2.WriteFileChunk(header=header, data=bytes(mv[:STREAM_CHUNK]))
    for off in range(STREAM_CHUNK, len(data), STREAM_CHUNK):
        yield sandbox_pb2.WriteFileChunk(data=bytes(mv[off:off + STREAM_CHUNK]))


def chunks_from(reader, header: sandbox_pb2.WriteFileHeader) -> Iterator[sandbox_pb2.WriteFileChunk]:
    """The WriteFileStream messages read from a binary file object."""
    first = True
    while True:
        buf = reader.read(STREAM_CHUNK)
        if not buf and not first:
            return
        msg = sandbox_pb2.WriteFileChunk(data=buf or b"")
        if first:
            msg.header.CopyFrom(header)
            first = False
        yield msg
        if not buf:
            return


def batch_bytes(v: Optional[int]) -> int:
    if v is None:
        return DEFAULT_BATCH_BYTES
    if not isinstance(v, int) or v <= 0:
        raise InvalidArgumentError(f"batch_bytes: want a positive integer, got {v!r}")
    return v


def find_type(t: Optional[str]) -> int:
    if not t:
        return sandbox_pb2.FILE_TYPE_UNSPECIFIED
    from .types import _TYPE_CODES

    if t not in _TYPE_CODES:
        raise InvalidArgumentError(f"find: type {t!r}: want 'file', 'dir', 'symlink' or 'other'")
    return _TYPE_CODES[t]


def closed_locally(closed: bool) -> bool:
    """Whether an asyncio.CancelledError from reading a grpc.aio stream comes from the stream's
    own close() (grpc.aio ends a read of a call cancelled locally so), to be swallowed, rather
    than from the task's cancellation, which is never swallowed. Call it in the except clause."""
    task = asyncio.current_task()
    return closed and not (task is not None and getattr(task, "cancelling", lambda: 0)())
