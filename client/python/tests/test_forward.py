"""Port forwarding: dial_port and forward_port against the real ``fusebox local up``, sync and
asyncio, and the refusals that need no sandbox.

Every wait here is bounded by GUARD only so that a broken sandbox fails the test instead of
hanging it; nothing asserts on time.
"""

from __future__ import annotations

import asyncio
import hashlib
import socket
import threading
import time
import urllib.request

import pytest

import fusebox
import fusebox.aio
from fusebox import _forward

GUARD = 120.0

# Echoes every connection's bytes back, then ends its side when the client has ended its own.
ECHO = """
import socket, socketserver, sys
class H(socketserver.BaseRequestHandler):
    def handle(self):
        s = self.request
        while True:
            b = s.recv(1 << 20)
            if not b:
                break
            s.sendall(b)
        s.shutdown(socket.SHUT_WR)
class S(socketserver.ThreadingTCPServer):
    allow_reuse_address = True
    daemon_threads = True
S(('127.0.0.1', int(sys.argv[1])), H).serve_forever()
"""


def _listening(dial, port: int) -> None:
    """Waits until something listens on port in the sandbox (dial_port stops being refused)."""
    end = time.monotonic() + GUARD
    while True:
        try:
            dial(port).close()
            return
        except fusebox.UnavailableError:
            if time.monotonic() > end:
                raise
            time.sleep(0.1)


async def _alistening(sb: fusebox.aio.Sandbox, port: int) -> None:
    end = time.monotonic() + GUARD
    while True:
        try:
            (await sb.dial_port(port)).close()
            return
        except fusebox.UnavailableError:
            if time.monotonic() > end:
                raise
            await asyncio.sleep(0.1)


def _payload(n: int) -> bytes:
    # Not a repetition of a short pattern: a misplaced chunk would show.
    out, block = bytearray(), hashlib.sha256(b"fusebox").digest()
    while len(out) < n:
        block = hashlib.sha256(block).digest()
        out += block * 64
    return bytes(out[:n])


# ---- refusals that need no sandbox ----

def test_check_port_and_loopback():
    for bad in (0, 65536, -1, "80", True):
        with pytest.raises(fusebox.InvalidArgumentError, match="1-65535"):
            _forward.check_port(bad)  # type: ignore[arg-type]
    _forward.check_port(1)
    _forward.check_port(65535)
    assert _forward.check_loopback("127.0.0.1:0") == ("127.0.0.1", 0)
    assert _forward.check_loopback("[::1]:8000") == ("::1", 8000)
    assert _forward.check_loopback("localhost:80") == ("127.0.0.1", 80)
    for bad in ("0.0.0.0:80", "192.168.1.2:80", "example.com:80", "127.0.0.1", "127.0.0.1:x", "[::]:80"):
        with pytest.raises(fusebox.InvalidArgumentError, match="loopback"):
            _forward.check_loopback(bad)


# ---- sync ----

def test_forward_http(sandbox):
    sandbox.write_file("www/hello.txt", b"hello through the forward")
    p = sandbox.start_process(["python3", "-m", "http.server", "3000", "--bind", "127.0.0.1", "--directory", "www"])
    try:
        _listening(sandbox.dial_port, 3000)
        with sandbox.forward_port(3000) as fwd:
            host, port = fwd.address.rsplit(":", 1)
            assert host == "127.0.0.1" and int(port) == fwd.port > 0
            for _ in range(3):  # a connection, so a forwarding connection, each
                with urllib.request.urlopen(f"http://{fwd.address}/hello.txt", timeout=GUARD) as r:
                    assert r.status == 200 and r.read() == b"hello through the forward"
        assert fwd.closed
        with pytest.raises(OSError):
            socket.create_connection(("127.0.0.1", fwd.port), timeout=GUARD).close()
    finally:
        p.signal(9, group=True)


def test_forward_16mib_echo_byte_exact(sandbox):
    sandbox.start_process(["python3", "-c", ECHO, "3001"])
    _listening(sandbox.dial_port, 3001)
    data = _payload(16 << 20)
    with sandbox.forward_port(3001, "127.0.0.1:0") as fwd:
        s = socket.create_connection(("127.0.0.1", fwd.port), timeout=GUARD)
        got = bytearray()

        def read() -> None:
            while True:
                b = s.recv(1 << 20)
                if not b:
                    return
                got.extend(b)
        reader = threading.Thread(target=read)
        reader.start()
        s.sendall(data)
        s.shutdown(socket.SHUT_WR)  # the half-close reaches the program, which then ends its side
        reader.join(GUARD)
        assert not reader.is_alive()
        s.close()
    assert len(got) == len(data) and hashlib.sha256(got).digest() == hashlib.sha256(data).digest()


def test_dial_port_half_close(sandbox):
    sandbox.start_process(["python3", "-c", ECHO, "3002"])
    _listening(sandbox.dial_port, 3002)
    with sandbox.dial_port(3002) as c:
        c.sendall(b"ping")
        c.close_write()
        got = b""
        while True:
            b = c.recv()
            if not b:
                break
            got += b
    assert got == b"ping"


def test_closed_port_and_range(sandbox):
    with pytest.raises(fusebox.UnavailableError, match="nothing listens on port 3999"):
        sandbox.dial_port(3999)
    errors = []
    with sandbox.forward_port(3999, on_error=errors.append) as fwd:
        s = socket.create_connection(("127.0.0.1", fwd.port), timeout=GUARD)
        assert s.recv(1) == b""  # the local connection is closed: its tunnel was refused
        s.close()
    assert len(errors) == 1 and isinstance(errors[0], fusebox.UnavailableError)
    for bad in (0, 65536):
        with pytest.raises(fusebox.InvalidArgumentError, match="1-65535"):
            sandbox.dial_port(bad)
        with pytest.raises(fusebox.InvalidArgumentError, match="1-65535"):
            sandbox.forward_port(bad)
    with pytest.raises(fusebox.InvalidArgumentError, match="loopback"):
        sandbox.forward_port(3000, "0.0.0.0:0")


# ---- asyncio ----

@pytest.mark.asyncio
async def test_aio_forward_http_with_streams(manager_address):
    async with fusebox.aio.allocate(manager_address) as sb:
        await sb.write_file("www/hello.txt", b"hello from asyncio")
        await sb.start_process(["python3", "-m", "http.server", "3000", "--bind", "127.0.0.1", "--directory", "www"])
        await _alistening(sb, 3000)
        async with await sb.forward_port(3000) as fwd:
            reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", fwd.port), GUARD)
            writer.write(b"GET /hello.txt HTTP/1.0\r\nHost: sandbox\r\n\r\n")
            await writer.drain()
            answer = await asyncio.wait_for(reader.read(), GUARD)  # HTTP/1.0: to the end
            writer.close()
            await writer.wait_closed()
        assert fwd.closed
        head, _, body = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.0 200") and body == b"hello from asyncio"


@pytest.mark.asyncio
async def test_aio_dial_port_and_refusals(manager_address):
    async with fusebox.aio.allocate(manager_address) as sb:
        await sb.start_process(["python3", "-c", ECHO, "3001"])
        await _alistening(sb, 3001)
        data = _payload(1 << 20)
        async with await sb.dial_port(3001) as c:
            send = asyncio.ensure_future(c.sendall(data))
            got = bytearray()
            while len(got) < len(data):
                b = await asyncio.wait_for(c.recv(), GUARD)
                assert b
                got += b
            await send
            await c.close_write()
            assert await asyncio.wait_for(c.recv(), GUARD) == b""
        assert bytes(got) == data
        with pytest.raises(fusebox.UnavailableError, match="nothing listens"):
            await sb.dial_port(3999)
        for bad in (0, 65536):
            with pytest.raises(fusebox.InvalidArgumentError):
                await sb.dial_port(bad)
            with pytest.raises(fusebox.InvalidArgumentError):
                await sb.forward_port(bad)
