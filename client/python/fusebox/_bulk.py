"""Bulk downloads: read_file and read_file_to over a connection of their own to the sandbox's
data socket, as the Go SDK's ReadFileTo does (internal/bulk in the repository).

The connection makes the same pinned TLS 1.3 handshake as the gRPC channel (the sandbox's
certificate, checked by keys.pinned_root, as the only root, verified for SERVER_NAME; the
agent's key as the client certificate), but negotiates the application protocol
``fusebox-bulk/1`` instead of HTTP/2: the file's bytes then come in chunks of up to 1 MiB, a
4-byte big-endian length and the data, instead of HTTP/2 frames that grpcio hands to Python one
protobuf message at a time, each copied several times. A sandbox server without bulk transfers
refuses the handshake, and the Sandbox then uses the gRPC stream, which means the same, for good.

Python's ssl reads one TLS record (16 KiB) per system call pair when it owns the socket; here
TLS runs over memory buffers (ssl.MemoryBIO) that a thread fills from the socket in large reads,
ahead of the decryption, so that the sandbox, which has only the host socket's default send
buffer in flight, never waits for this side to decrypt or to write to the destination.
"""

from __future__ import annotations

import asyncio
import os
import queue
import socket
import ssl
import struct
import threading
from typing import BinaryIO, Callable, Optional, Tuple

import grpc

from ._proto.sandbox.v1 import sandbox_pb2
from ._address import parse, pin_socket
from .errors import PinningError
from .keys import SERVER_NAME, pinned_root

PROTO = "fusebox-bulk/1"
MAX_CHUNK = 1 << 20
MAX_CONTROL = 64 << 10
# The read-ahead: READ_BUF bytes a read, at most AHEAD reads waiting for the decryption.
READ_BUF = 256 << 10
AHEAD = 8


class NoBulk(Exception):
    """No bulk connection could be made: the transfer has not started; use the gRPC stream."""


class Refused(grpc.RpcError):
    """The sandbox answered with an error status, as the gRPC call would have: errors.from_rpc
    maps it as it maps the call's."""

    def __init__(self, code: grpc.StatusCode, message: str):
        super().__init__(message)
        self._code, self._message = code, message

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._message


_CODES = {c.value[0]: c for c in grpc.StatusCode}


def context(root_pem: bytes, key_pem: bytes, cert_pem: bytes) -> ssl.SSLContext:
    """The pinned TLS 1.3 client context of bulk connections: the sandbox's certificate as the
    only root, verified for SERVER_NAME, and the agent's key as the client certificate."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    ctx.check_hostname = True
    ctx.verify_mode = ssl.CERT_REQUIRED
    ctx.load_verify_locations(cadata=root_pem.decode())
    # ssl loads a key only from a file: an anonymous in-memory one (memfd), closed at once.
    fd = os.memfd_create("fusebox-agent-key", os.MFD_CLOEXEC)
    try:
        os.write(fd, key_pem + b"\n" + cert_pem)
        ctx.load_cert_chain(f"/proc/self/fd/{fd}")
    finally:
        os.close(fd)
    ctx.set_alpn_protocols([PROTO])
    return ctx


class Conn:
    """One bulk connection: TLS over memory buffers, the socket read ahead on a thread."""

    def __init__(self, sock: socket.socket, ctx: ssl.SSLContext, server_name: str):
        self._sock = sock
        self._in, self._out = ssl.MemoryBIO(), ssl.MemoryBIO()
        self._tls = ctx.wrap_bio(self._in, self._out, server_hostname=server_name)
        # The read-ahead's buffers, made once: a fresh bytes object per read would be a fresh
        # mapping (glibc maps allocations this large) and its page faults, every read.
        self._bufs = [bytearray(READ_BUF) for _ in range(AHEAD)]
        self._free: "queue.SimpleQueue[int]" = queue.SimpleQueue()  # indexes of free buffers; -1 stops
        self._full: "queue.SimpleQueue[Tuple[int, int]]" = queue.SimpleQueue()  # (index, bytes); (-1, 0) at the end
        for i in range(AHEAD):
            self._free.put(i)
        self._reader: Optional[threading.Thread] = None
        self._eof = False
        self.broken = False

    def handshake(self) -> None:
        while True:
            try:
                self._tls.do_handshake()
                break
            except ssl.SSLWantReadError:
                self._flush()
                self._feed_direct()
        self._flush()
        if self._tls.selected_alpn_protocol() != PROTO:
            raise NoBulk("the sandbox did not negotiate bulk transfers")
        # From here on the socket is read ahead, on a thread that ends with the connection.
        self._reader = threading.Thread(target=self._read_ahead, name="fusebox-bulk-read", daemon=True)
        self._reader.start()

    def _flush(self) -> None:
        data = self._out.read()
        if data:
            self._sock.sendall(data)

    def _feed_direct(self) -> None:
        data = self._sock.recv(READ_BUF)
        if not data:
            raise ConnectionError("the sandbox closed the connection during the handshake")
        self._in.write(data)

    def _read_ahead(self) -> None:
        try:
            while True:
                i = self._free.get()
                if i < 0:
                    break
                n = self._sock.recv_into(self._bufs[i])
                if not n:
                    break
                self._full.put((i, n))
        except OSError:
            pass
        self._full.put((-1, 0))

    def _feed(self) -> None:
        i, n = self._full.get()
        if i < 0:
            self._eof = True
            self._in.write_eof()
            return
        self._in.write(memoryview(self._bufs[i])[:n])
        self._free.put(i)

    def read_into(self, buf: memoryview) -> None:
        """Fills buf with the next decrypted bytes; ConnectionError if the stream ends first."""
        off, n = 0, len(buf)
        while off < n:
            try:
                k = self._tls.read(n - off, buf[off:])
            except ssl.SSLWantReadError:
                if self._eof:
                    raise ConnectionError("the connection ended inside a frame") from None
                self._feed()
                continue
            except ssl.SSLZeroReturnError:
                raise ConnectionError("the connection ended inside a frame") from None
            if k == 0:
                raise ConnectionError("the connection ended inside a frame")
            off += k

    def write(self, data: bytes) -> None:
        self._tls.write(data)
        self._flush()

    def abort(self) -> None:
        """Cuts the connection from another thread: a read waiting on it ends with
        ConnectionError (and its caller then closes the connection)."""
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def close(self) -> None:
        self.abort()
        # The reader ends at the shutdown, or at this should it wait for a free buffer.
        self._free.put(-1)
        if self._reader is not None:
            self._reader.join()
        self._sock.close()


def _write_msg(c: Conn, m) -> None:
    b = m.SerializeToString()
    c.write(struct.pack(">I", len(b)) + b)


def _read_msg(c: Conn, m) -> None:
    h = bytearray(4)
    c.read_into(memoryview(h))
    (n,) = struct.unpack(">I", h)
    if n > MAX_CONTROL:
        raise ConnectionError(f"control message of {n} bytes, the limit is {MAX_CONTROL}")
    b = bytearray(n)
    c.read_into(memoryview(b))
    m.ParseFromString(bytes(b))


def _check(st: sandbox_pb2.BulkStatus) -> None:
    if st.code != 0:
        raise Refused(_CODES.get(st.code, grpc.StatusCode.UNKNOWN), st.message)


class Pool:
    """Makes a sandbox's bulk connections and keeps one idle for the next transfer. Safe for
    concurrent use. The pinned context and the socket's descriptor are made at the first
    transfer, off the allocation's path."""

    def __init__(self, resp, key):
        # What the first transfer needs of the allocation's answer (an AllocateResponse).
        self._cert, self._pub, self._endpoint = resp.sandbox_certificate, resp.sandbox_public_key, resp.endpoint
        self._key = key
        self._lock = threading.Lock()  # guards every field below
        self._dial: Optional[Callable[[], socket.socket]] = None
        self._ctx: Optional[ssl.SSLContext] = None
        self._fd: Optional[int] = None
        self._idle: Optional[Conn] = None
        self._off = False
        self._closed = False

    def _setup(self) -> None:
        """Makes the pinned context and the dialer, once; called with _lock held."""
        if self._ctx is not None:
            return
        root = pinned_root(self._cert, self._pub)
        key_pem, cert_pem = self._key._credentials()
        addr = parse(self._endpoint, "sandbox endpoint")
        ctx = context(root, key_pem, cert_pem)
        self._dial, self._fd = dialer(addr.network, addr.address)
        self._ctx = ctx

    def _get(self) -> Conn:
        with self._lock:
            if self._off or self._closed:
                raise NoBulk("bulk transfers are off")
            c, self._idle = self._idle, None
            if c is None:
                self._setup()
            dial, ctx = self._dial, self._ctx
        if c is not None:
            return c
        assert dial is not None and ctx is not None
        try:
            sock = dial()
        except OSError as e:
            raise NoBulk(str(e)) from None
        c = Conn(sock, ctx, SERVER_NAME)
        try:
            c.handshake()
        except (ssl.SSLCertVerificationError, OSError, NoBulk) as e:
            c.close()
            if not isinstance(e, ssl.SSLCertVerificationError):
                # A server without bulk transfers (its ALPN refusal), or one that cannot make
                # the handshake for another reason: the gRPC channel will say which.
                with self._lock:
                    self._off = True
            if isinstance(e, ssl.SSLCertVerificationError):
                raise PinningError(f"bulk connection: the sandbox did not prove the pinned key: {e}") from None
            raise NoBulk(str(e)) from None
        return c

    def _put(self, c: Conn) -> None:
        with self._lock:
            if self._idle is None and not self._closed:
                self._idle = c
                return
        c.close()

    def close(self) -> None:
        """Closes the idle connection and the descriptor the dialer pins; transfers in flight
        end with their own connections."""
        with self._lock:
            self._closed = True
            c, self._idle = self._idle, None
            fd, self._fd = self._fd, None
        if c is not None:
            c.close()
        if fd is not None:
            os.close(fd)

    def read(self, path: str, writer: BinaryIO, using: Optional[Callable[[Conn], None]] = None) -> int:
        """Streams the file at path into writer; returns the bytes written. Raises NoBulk when
        no connection could be made, Refused with the sandbox's status, ConnectionError when
        the connection broke. using, if given, is handed the connection before the transfer
        starts, so that another thread can abort it."""
        c = self._get()
        if using is not None:
            using(c)
        ok = False
        try:
            n = _receive(c, path, writer)
            ok = True
            return n
        finally:
            if ok:
                self._put(c)
            else:
                c.close()


async def read_async(pool: Pool, path: str, writer: BinaryIO) -> int:
    """Pool.read for asyncio: the transfer runs on a worker thread (the decryption and the
    writer's writes with it) while the event loop goes on. Cancelling the awaiting task cuts the
    connection, waits for the thread to stop, and re-raises the cancellation: nothing of the
    transfer runs on after it."""
    loop = asyncio.get_running_loop()
    conns: "list[Conn]" = []
    done = loop.run_in_executor(None, pool.read, path, writer, conns.append)
    try:
        return await asyncio.shield(done)
    except asyncio.CancelledError:
        for c in conns:
            c.abort()
        try:
            await done
        except BaseException:
            pass
        raise


def _receive(c: Conn, path: str, writer: BinaryIO) -> int:
    _write_msg(c, sandbox_pb2.BulkRequest(read=sandbox_pb2.ReadFileStreamRequest(path=path)))
    st = sandbox_pb2.BulkStatus()
    _read_msg(c, st)
    _check(st)
    buf = memoryview(bytearray(max(1, min(MAX_CHUNK, st.bytes))))
    h = memoryview(bytearray(4))
    n = 0
    while True:
        c.read_into(h)
        (k,) = struct.unpack(">I", h)
        if k == 0:
            break
        if k > len(buf):
            raise ConnectionError(f"chunk of {k} bytes for a buffer of {len(buf)}")
        c.read_into(buf[:k])
        writer.write(buf[:k])
        n += k
    _read_msg(c, st)
    _check(st)
    if st.bytes != n:
        raise ConnectionError(f"{n} bytes arrived, the sandbox says it sent {st.bytes}")
    return n


def dialer(network: str, address: str) -> Tuple[Callable[[], socket.socket], Optional[int]]:
    """A function that connects a socket to the data endpoint, and the descriptor it pins
    (a unix socket is dialed through /proc/self/fd/N of a descriptor opened without following
    links, as the gRPC channel is; the caller closes it), or None."""
    if network == "unix":
        target, fd = pin_socket(address, "sandbox endpoint")
        path = target[len("unix://"):]

        def dial_unix() -> socket.socket:
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                s.connect(path)
            except BaseException:
                s.close()
                raise
            return s
        return dial_unix, fd
    host, _, port = address.rpartition(":")

    def dial_tcp() -> socket.socket:
        return socket.create_connection((host.strip("[]"), int(port)))
    return dial_tcp, None

