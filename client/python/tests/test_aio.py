"""The asyncio API against the real ``fusebox local up``: the core tests' variants."""

from __future__ import annotations

import asyncio
import io
import os
import random
import threading

import pytest

import fusebox
import fusebox.aio
from fusebox import _core
from fusebox._proto.manager.v1 import manager_pb2
from fusebox.keys import AgentKey

from .test_e2e import sandbox_style_certificate, wait_key_ahead, wait_unlisted

pytestmark = pytest.mark.asyncio


async def test_allocate_exec_release(manager_address):
    async with fusebox.aio.allocate(manager_address, labels={"test": "aio"}) as sb:
        sid = sb.id
        res = await sb.exec("echo out; echo err >&2; exit 3")
        assert (res.exit_code, res.stdout, res.stderr) == (3, b"out\n", b"err\n")
        assert (await sb.exec(["cat"], stdin="via stdin")).stdout == b"via stdin"
        chunks = [c async for c in sb.exec_stream("echo a; echo b >&2")]
        assert {(c.stream, c.data) for c in chunks} == {("stdout", b"a\n"), ("stderr", b"b\n")}
        async with fusebox.aio.Manager(manager_address) as m:
            assert sid in {s.sandbox_id for s in await m.list()}
    assert sb.closed
    await asyncio.get_running_loop().run_in_executor(None, wait_unlisted, manager_address, sid)


async def test_lease_renewed_past_ttl(manager_address):
    sb = await fusebox.aio.allocate(manager_address, lease_ttl=2)
    try:
        first = sb.lease_expires
        for _ in range(30):  # about three TTLs in use
            assert (await sb.exec(["true"])).exit_code == 0
            await asyncio.sleep(0.2)
        assert sb.lease_error is None and sb.lease_expires > first
    finally:
        await sb.close()


async def test_kept_manager_makes_each_key_ahead(manager_address):
    async with fusebox.aio.Manager(manager_address) as m:
        used = []
        for _ in range(2):
            ahead = await asyncio.get_running_loop().run_in_executor(None, wait_key_ahead, m)
            sb = await m.allocate(lease_ttl=1.5)
            try:
                assert m._keys._next is not ahead
                used.append(ahead.public_key)
                first = sb.lease_expires
                assert (await sb.exec("echo ok")).stdout == b"ok\n"
                end = asyncio.get_running_loop().time() + 10
                while sb.lease_expires <= first:  # renewed every 0.5 s
                    assert asyncio.get_running_loop().time() < end, f"lease not renewed: {sb.lease_error}"
                    await asyncio.sleep(0.05)
                assert sb.lease_error is None
            finally:
                await sb.close()  # prepares the next key at once
        assert len(set(used)) == 2
        assert (await asyncio.get_running_loop().run_in_executor(None, wait_key_ahead, m)).public_key not in used
    assert m._keys._next is None


async def test_files(manager_address):
    async with fusebox.aio.allocate(manager_address) as sb:
        rnd = random.Random(3)
        files = {f"s/d{i % 30}/f{i}": rnd.randbytes(4096) for i in range(3000)}
        st = await sb.write_files(files)
        assert st.files == 3000 and st.batches <= 4 and st.streamed == 0
        got = await sb.read_files("s/**")
        assert len(got) == 3000 and all(got[p] == d for p, d in files.items())
        big = os.urandom(64 << 20)
        st = await sb.write_files({"big": big})
        assert st.streamed == 1
        assert await sb.read_file("big") == big
        # Over a bulk connection (fusebox-bulk/1), not the gRPC stream, and kept for the next read.
        assert sb._bulk._ctx is not None and not sb._bulk._off and sb._bulk._idle is not None
        with pytest.raises(fusebox.NotFoundError):
            await sb.read_file("missing")
        with pytest.raises(fusebox.PathEscapeError):
            await sb.write_file("../x", b"x")
        await sb.mkdir("a/b", parents=True)
        await sb.symlink("b", "a/l")
        assert (await sb.stat("a/l")).type == "symlink"
        assert [e.path for e in await sb.find("a", type="dir")] == ["a/b"]
        await sb.write_file("a/b/t.txt", "hello needle\n")
        assert [m.line for m in await sb.grep("needle", ["a"])] == [1]
        await sb.rename("a/b/t.txt", "a/t.txt")
        assert [e.path for e in await sb.list("a")] == ["a/b", "a/l", "a/t.txt"]
        await sb.remove("a", recursive=True)
        assert not await sb.exists("a")


class _Held(io.RawIOBase):
    """A writer that takes the first chunk, then holds the transfer until released."""

    def __init__(self):
        self.n = 0
        self.first, self.release = threading.Event(), threading.Event()

    def writable(self) -> bool:
        return True

    def write(self, b) -> int:
        self.n += len(b)
        self.first.set()
        self.release.wait(60)
        return len(b)


async def test_read_file_cancelled(manager_address):
    async with fusebox.aio.allocate(manager_address) as sb:
        big = os.urandom(64 << 20)
        await sb.write_files({"big": big})
        w = _Held()
        t = asyncio.create_task(sb.read_file_to("big", w))
        assert await asyncio.get_running_loop().run_in_executor(None, w.first.wait, 60)
        t.cancel()
        await asyncio.sleep(0.05)  # the task handles its cancellation: the connection is cut
        w.release.set()
        with pytest.raises(asyncio.CancelledError):
            await t
        # The transfer stopped before the file's end, and ended before the call did.
        n = w.n
        assert 0 < n < len(big)
        await asyncio.sleep(0.1)
        assert w.n == n
        assert sb._bulk._idle is None  # the cut connection is not kept
        assert await sb.read_file("big") == big


async def test_task_group_last_logical_write_wins(manager_address):
    async with fusebox.aio.allocate(manager_address) as sb:
        root = (await sb.exec("pwd")).text.strip()
        rnd = random.Random(21)
        for rep in range(10):
            async with sb.task_group() as g:
                tasks = [g.exec(f"sleep 0.{rnd.randint(0, 30):02d}; export X={rep}-{n}; mkdir -p {root}/r{rep}/d{n}; "
                                f"cd {root}/r{rep}/d{n}") for n in range(1, 21)]
            assert all(t.result().state_recorded for t in tasks)
            assert (await sb.exec('echo "$X $PWD"')).text == f"{rep}-20 {root}/r{rep}/d20\n", rep


async def test_pinning(manager_address):
    async with fusebox.aio.Manager(manager_address) as m:
        key = AgentKey.generate()
        resp = await m._rpc.Allocate(_core.allocate_request(key, "", None, None, None), timeout=60)
        try:
            bad = manager_pb2.AllocateResponse()
            bad.CopyFrom(resp)
            bad.sandbox_certificate = sandbox_style_certificate(AgentKey.generate())
            with pytest.raises(fusebox.PinningError, match="not sandbox_public_key"):
                fusebox.aio.Sandbox._connect(m, bad, key, None, fusebox.DEFAULT_BATCH_BYTES, 4)
            other = fusebox.aio.Sandbox._connect(m, resp, AgentKey.generate(), None, fusebox.DEFAULT_BATCH_BYTES, 4)
            with pytest.raises((fusebox.PinningError, fusebox.UnavailableError)):
                await other.exec(["true"])
            other._renewer.cancel()
            await other._channel.close()
        finally:
            await m._release(resp.sandbox_id, resp.lease_token)


async def test_bad_input(manager_address, tmp_path):
    with pytest.raises(fusebox.BadAddressError):
        await fusebox.aio.allocate("localhost:1")
    with pytest.raises(fusebox.UnavailableError, match="fusebox local up"):
        await fusebox.aio.allocate("unix://" + str(tmp_path / "none.sock"), timeout=10)
    with pytest.raises(fusebox.InvalidArgumentError, match="template"):
        await fusebox.aio.allocate(manager_address, template="nope")
    with pytest.raises(fusebox.InvalidArgumentError, match="egress"):
        await fusebox.aio.allocate(manager_address, egress=["no-port"])
    async with fusebox.aio.allocate(manager_address) as sb:
        with pytest.raises(fusebox.CommandTimeoutError) as ei:
            await sb.exec("echo x; sleep 60", timeout=1)
        assert ei.value.result.stdout == b"x\n"
        assert (await sb.exec("echo fine")).stdout == b"fine\n"
