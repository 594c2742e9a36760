"""Port forwarding: dial_port and forward_port reach a TCP port on the sandbox's loopback, as the
Go SDK's DialPort and ForwardPort do (internal/portfwd in the repository).

Each forwarded connection is a connection of its own to the sandbox's data socket, with the same
pinned TLS 1.3 handshake as the gRPC channel and bulk transfers (the context of _bulk.context),
but the application protocol ``fusebox-port/1``. After the handshake the agent sends a 5-byte
request (the version, 1, and the port as a 4-byte big-endian number); the sandbox answers with a
1-byte gRPC status code (0: connected), a 2-byte big-endian length and that many bytes of
message. Then the connection carries the TCP connection's bytes unchanged, both ways; each side
ends its direction with TLS's close_notify, which the other passes on as a TCP half-close.

TLS runs over memory buffers (ssl.MemoryBIO) so that one thread can read while another writes:
one lock guards the TLS object, the socket's reads and writes happen outside it.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import ssl
import struct
import threading
from typing import Callable, List, Optional, Set, Tuple

import grpc

from . import _bulk
from .errors import FuseboxError, InvalidArgumentError, PinningError, UnavailableError, from_rpc
from .keys import SERVER_NAME, pinned_root

PROTO = "fusebox-port/1"
VERSION = 1
MAX_MESSAGE = 1024
READ_BUF = 256 << 10
# The most one sendall hands TLS at a time: its records then leave before the next are made.
WRITE_CHUNK = 256 << 10


def check_port(port: int) -> None:
    """Raises InvalidArgumentError for a port outside 1-65535, before any connection is made."""
    if not isinstance(port, int) or isinstance(port, bool) or not 1 <= port <= 65535:
        raise InvalidArgumentError(f"forwarding port {port!r}: port out of range 1-65535",
                                   code=grpc.StatusCode.INVALID_ARGUMENT)


def check_loopback(address: str) -> Tuple[str, int]:
    """Parses a local "host:port" (IPv6 in brackets) whose host must be a loopback address: a
    forward gives whoever connects to it what the agent's key gives."""
    host, sep, port = address.rpartition(":")
    bad = InvalidArgumentError(
        f"local address {address!r}: want HOST:PORT with a loopback host (127.0.0.1, ::1 or localhost): "
        "whoever connects gets what the agent's key gets", code=grpc.StatusCode.INVALID_ARGUMENT)
    if not sep or not port.isdigit() or int(port) > 65535:
        raise bad
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if host == "localhost":
        return "127.0.0.1", int(port)
    try:
        if not ipaddress.ip_address(host).is_loopback:
            raise bad
    except ValueError:
        raise bad from None
    return host, int(port)


class Dialer:
    """Makes a sandbox's forwarding connections: the bulk pool's dialer (the pinned descriptor
    of a unix socket included) and a context like the bulk one, offering PROTO only."""

    def __init__(self, pool: _bulk.Pool):
        self._pool = pool
        self._lock = threading.Lock()  # guards _ctx
        self._ctx: Optional[ssl.SSLContext] = None

    def _setup(self) -> Tuple[Callable[[], socket.socket], ssl.SSLContext]:
        p = self._pool
        with p._lock:
            if p._closed:
                raise UnavailableError("forwarding a port: the sandbox is closed", code=grpc.StatusCode.UNAVAILABLE)
            p._setup()
            dial = p._dial
        with self._lock:
            if self._ctx is None:
                root = pinned_root(p._cert, p._pub)
                key_pem, cert_pem = p._key._credentials()
                ctx = _bulk.context(root, key_pem, cert_pem)
                ctx.set_alpn_protocols([PROTO])
                self._ctx = ctx
            ctx = self._ctx
        assert dial is not None
        return dial, ctx

    def dial(self, port: int) -> "PortConnection":
        """Connects to port on the sandbox's loopback. A refusal raises the error its gRPC code
        maps to (UnavailableError: nothing listens there; InvalidArgumentError; FuseboxError
        with UNIMPLEMENTED: a sandbox server without forwarding); a connection that broke
        raises UnavailableError; a sandbox that did not prove the pinned key PinningError."""
        check_port(port)
        dial, ctx = self._setup()
        doing = f"forwarding port {port}"
        try:
            sock = dial()
        except OSError as e:
            raise UnavailableError(f"{doing}: connecting to the sandbox: {e}", code=grpc.StatusCode.UNAVAILABLE) from None
        c = PortConnection(sock, ctx)
        try:
            c._handshake(doing)
            c.sendall(struct.pack(">BI", VERSION, port))
            h = c._read_exactly(3, doing)
            code, n = h[0], struct.unpack(">H", h[1:])[0]
            if n > MAX_MESSAGE:
                raise UnavailableError(f"{doing}: malformed answer: message of {n} bytes", code=grpc.StatusCode.UNAVAILABLE)
            msg = c._read_exactly(n, doing).decode("utf-8", "replace")
            if code != 0:
                raise from_rpc(_bulk.Refused(_bulk._CODES.get(code, grpc.StatusCode.UNKNOWN), msg), doing)
        except BaseException as e:
            c.close()
            if isinstance(e, FuseboxError):
                raise
            if isinstance(e, ssl.SSLError):
                # The sandbox checks the agent's key after the client's side of the handshake
                # has ended: a refused key shows here, as an alert instead of an answer.
                raise UnavailableError(f"{doing}: {e}", code=grpc.StatusCode.UNAVAILABLE) from None
            if isinstance(e, OSError):
                raise UnavailableError(f"{doing}: {e}", code=grpc.StatusCode.UNAVAILABLE) from None
            raise
        return c


class PortConnection:
    """A connection to a port on the sandbox's loopback, as a connected socket is used:
    ``sendall``, ``recv`` (b"" once the program there has ended its side), ``close_write``
    (the program reads its end, as a TCP half-close), ``close``; a context manager. One thread
    may read while another writes; two threads reading (or writing) at once are not supported.
    Errors of a broken connection are ConnectionError."""

    def __init__(self, sock: socket.socket, ctx: ssl.SSLContext):
        self._sock = sock
        self._in, self._out = ssl.MemoryBIO(), ssl.MemoryBIO()
        self._tls = ctx.wrap_bio(self._in, self._out, server_hostname=SERVER_NAME)
        self._lock = threading.Lock()   # guards _tls, _in, _out and _eof
        self._wlock = threading.Lock()  # held while TLS output is made and sent: records leave in order
        self._eof = False
        self._write_closed = False
        self._closed = False
        # Data decrypted ahead of close_write's close_notify (see there), returned first by recv.
        self._held = b""

    def _handshake(self, doing: str) -> None:
        while True:
            try:
                self._tls.do_handshake()
                break
            except ssl.SSLWantReadError:
                self._flush()
                data = self._sock.recv(READ_BUF)
                if not data:
                    raise UnavailableError(f"{doing}: the sandbox closed the connection during the TLS handshake",
                                           code=grpc.StatusCode.UNAVAILABLE) from None
                self._in.write(data)
            except ssl.SSLCertVerificationError as e:
                raise PinningError(f"{doing}: the sandbox did not prove the pinned key: {e}") from None
            except ssl.SSLError as e:
                if "NO_APPLICATION_PROTOCOL" in str(e).upper() or "no application protocol" in str(e):
                    raise FuseboxError(f"{doing}: the sandbox server does not offer port forwarding",
                                       code=grpc.StatusCode.UNIMPLEMENTED) from None
                raise
        self._flush()
        if self._tls.selected_alpn_protocol() != PROTO:
            raise FuseboxError(f"{doing}: the sandbox server does not offer port forwarding",
                               code=grpc.StatusCode.UNIMPLEMENTED)

    def _flush(self) -> None:
        with self._wlock:
            with self._lock:
                data = self._out.read()
            if data:
                self._sock.sendall(data)

    def _read_exactly(self, n: int, doing: str) -> bytes:
        b = bytearray()
        while len(b) < n:
            k = self.recv(n - len(b))
            if not k:
                raise UnavailableError(f"{doing}: the connection ended before the sandbox's answer",
                                       code=grpc.StatusCode.UNAVAILABLE)
            b += k
        return bytes(b)

    def sendall(self, data: bytes) -> None:
        """Sends every byte of data to the program in the sandbox."""
        mv = memoryview(data)
        for off in range(0, len(mv), WRITE_CHUNK):
            with self._wlock:
                with self._lock:
                    if self._write_closed:
                        raise BrokenPipeError("the connection's sending side is closed")
                    self._tls.write(mv[off:off + WRITE_CHUNK])
                    out = self._out.read()
                self._sock.sendall(out)

    def recv(self, n: int = READ_BUF) -> bytes:
        """Up to n bytes from the program in the sandbox, waiting for at least one; b"" once it
        has ended its side of the connection."""
        while True:
            with self._lock:
                if self._held:
                    data, self._held = self._held[:n], self._held[n:]
                    return data
                try:
                    data: Optional[bytes] = self._tls.read(n)
                except ssl.SSLWantReadError:
                    data = None
                except ssl.SSLZeroReturnError:
                    return b""  # close_notify: the program's end of its side
                except ssl.SSLEOFError:
                    raise ConnectionResetError("the sandbox's connection ended without ending the stream") from None
                pending = self._out.pending > 0
                eof = self._eof
            if pending:  # a reply that reading made (a key update's)
                self._flush()
            if data is not None:
                return data
            if eof:
                raise ConnectionResetError("the sandbox's connection ended without ending the stream")
            raw = self._sock.recv(READ_BUF)
            with self._lock:
                if raw:
                    self._in.write(raw)
                else:
                    self._eof = True
                    self._in.write_eof()

    def close_write(self) -> None:
        """Ends what the program in the sandbox reads (it reads end of file), as a TCP
        half-close does; what it writes can still be read."""
        with self._wlock:
            with self._lock:
                if self._write_closed:
                    return
                self._write_closed = True
                # unwrap() calls SSL_shutdown twice: the first sends close_notify, the second
                # looks for the peer's and throws away the application data it reads on the
                # way. So what has arrived is set aside first: the plaintext OpenSSL holds,
                # and the records not yet read, which go back once close_notify is out.
                held = b""
                while self._tls.pending():
                    held += self._tls.read(self._tls.pending())
                self._held += held
                raw = b"" if self._eof else self._in.read()
                try:
                    self._tls.unwrap()  # sends close_notify; the peer's is read by recv
                except ssl.SSLWantReadError:
                    pass
                if raw:
                    self._in.write(raw)
                out = self._out.read()
            self._sock.sendall(out)

    def shutdown(self, how: int) -> None:
        """socket.shutdown's meaning: SHUT_WR is close_write; SHUT_RD and SHUT_RDWR also end
        a recv waiting in another thread."""
        if how == socket.SHUT_WR:
            self.close_write()
            return
        try:
            self._sock.shutdown(how)
        except OSError:
            pass

    def close(self) -> None:
        """Ends the connection both ways; a recv waiting in another thread ends."""
        if self._closed:
            return
        self._closed = True
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._sock.close()

    def __enter__(self) -> "PortConnection":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _pipe_local_to_remote(local: socket.socket, remote: PortConnection) -> None:
    while True:
        data = local.recv(READ_BUF)
        if not data:
            remote.close_write()
            return
        remote.sendall(data)


def _pipe_remote_to_local(remote: PortConnection, local: socket.socket) -> None:
    while True:
        data = remote.recv(READ_BUF)
        if not data:
            local.shutdown(socket.SHUT_WR)
            return
        local.sendall(data)


class Forward:
    """A forward of a local loopback port to a port in the sandbox (``Sandbox.forward_port``).

    ``address`` is where to connect ("127.0.0.1:PORT"), ``port`` the local port. Each
    connection accepted there is tunnelled over a forwarding connection of its own, both ways,
    half-closes included; one whose tunnel cannot be opened (nothing listens on the port in the
    sandbox) is closed, and its error passed to ``on_error`` if given. ``close`` (or leaving
    the ``with`` block) stops accepting, ends the tunnels and waits for their threads.
    """

    def __init__(self, dialer: Dialer, port: int, local_address: str,
                 on_error: Optional[Callable[[BaseException], None]] = None):
        check_port(port)
        host, lport = check_loopback(local_address)
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        ln = socket.socket(family, socket.SOCK_STREAM)
        try:
            ln.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            ln.bind((host, lport))
            ln.listen(128)
        except OSError as e:
            ln.close()
            raise FuseboxError(f"forwarding port {port}: listening on {local_address}: {e}") from None
        self._ln, self._dialer, self.remote_port, self._on_error = ln, dialer, port, on_error
        self.port: int = ln.getsockname()[1]
        self.address: str = f"[{host}]:{self.port}" if family == socket.AF_INET6 else f"{host}:{self.port}"
        self._lock = threading.Lock()  # guards _socks, _threads and _closed
        self._socks: Set[object] = set()  # local sockets and forwarding connections to end at close
        self._threads: List[threading.Thread] = []
        self._closed = False
        t = threading.Thread(target=self._serve, name=f"fusebox-forward-{port}", daemon=True)
        self._threads.append(t)
        t.start()

    def _track(self, s: object) -> bool:
        with self._lock:
            if self._closed:
                return False
            self._socks.add(s)
            return True

    def _untrack(self, s: object) -> None:
        with self._lock:
            self._socks.discard(s)

    def _serve(self) -> None:
        while True:
            try:
                local, _ = self._ln.accept()
            except OSError:
                return  # closed
            local.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if not self._track(local):
                local.close()
                return
            t = threading.Thread(target=self._tunnel, args=(local,), name=f"fusebox-tunnel-{self.remote_port}", daemon=True)
            with self._lock:
                self._threads = [x for x in self._threads if x.is_alive()]
                self._threads.append(t)
            t.start()

    def _tunnel(self, local: socket.socket) -> None:
        remote: Optional[PortConnection] = None
        try:
            remote = self._dialer.dial(self.remote_port)
            if not self._track(remote):
                return
            back = threading.Thread(target=self._direction, args=(_pipe_remote_to_local, remote, local, remote), daemon=True)
            back.start()
            self._direction(_pipe_local_to_remote, local, remote, remote)
            back.join()
        except BaseException as e:
            with self._lock:
                closed = self._closed
            if self._on_error is not None and not closed:
                self._on_error(e)
        finally:
            if remote is not None:
                remote.close()
                self._untrack(remote)
            local.close()
            self._untrack(local)

    @staticmethod
    def _direction(fn, src, dst, remote: PortConnection) -> None:
        try:
            fn(src, dst)
        except (OSError, ssl.SSLError):
            # One direction failed: both end, as a broken TCP connection would.
            remote.close()
            try:
                (src if isinstance(src, socket.socket) else dst).shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def close(self) -> None:
        """Stops accepting, ends every tunnel, and returns once their threads have ended."""
        with self._lock:
            already = self._closed
            self._closed = True
            socks = list(self._socks)
            threads = list(self._threads)
        if not already:
            try:
                self._ln.shutdown(socket.SHUT_RDWR)  # wakes the accept
            except OSError:
                pass
            self._ln.close()
        for s in socks:
            if isinstance(s, socket.socket):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
            else:
                s.close()  # type: ignore[attr-defined]
        for t in threads:
            if t is not threading.current_thread():
                t.join()

    @property
    def closed(self) -> bool:
        with self._lock:
            return self._closed

    def __enter__(self) -> "Forward":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<fusebox.Forward {self.address} -> port {self.remote_port}{' closed' if self.closed else ''}>"


# ---- asyncio: the same threads, awaited without blocking the event loop ----

class AsyncPortConnection:
    """:class:`PortConnection` for asyncio: each call runs on a worker thread."""

    def __init__(self, conn: PortConnection):
        self._conn = conn

    async def sendall(self, data: bytes) -> None:
        await asyncio.get_running_loop().run_in_executor(None, self._conn.sendall, data)

    async def recv(self, n: int = READ_BUF) -> bytes:
        return await asyncio.get_running_loop().run_in_executor(None, self._conn.recv, n)

    async def close_write(self) -> None:
        await asyncio.get_running_loop().run_in_executor(None, self._conn.close_write)

    def close(self) -> None:
        self._conn.close()

    async def __aenter__(self) -> "AsyncPortConnection":
        return self

    async def __aexit__(self, *exc) -> None:
        self.close()


class AsyncForward:
    """:class:`Forward` for asyncio: the tunnels run on threads of their own, so the forward
    works whether or not the event loop is busy; ``await close()`` (or ``async with``) ends
    it."""

    def __init__(self, fwd: Forward):
        self._fwd = fwd
        self.address, self.port, self.remote_port = fwd.address, fwd.port, fwd.remote_port

    async def close(self) -> None:
        await asyncio.get_running_loop().run_in_executor(None, self._fwd.close)

    @property
    def closed(self) -> bool:
        return self._fwd.closed

    async def __aenter__(self) -> "AsyncForward":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    def __repr__(self) -> str:
        return repr(self._fwd).replace("fusebox.Forward", "fusebox.aio.Forward")
