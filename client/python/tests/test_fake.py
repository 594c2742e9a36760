"""The SDK (sync, asyncio and ``python3 -m fusebox run``) against the fake manager and sandbox of
tests/fakes.py: answers the real servers give rarely or slowly, through the real clients."""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path

import grpc
import pytest

import fusebox
import fusebox.aio
from fusebox.__main__ import main

from .fakes import FakeCluster, exited_exec

# The manager's own messages (manager/auth/policy.go, manager/manager.go, manager/auth/token.go).
TEMPLATE_DENIED = ('permission denied: service account agents/bot may not use template "gpu" (allowed: default, small)')
EGRESS_DENIED = ("permission denied: egress destinations evil.example:443, x.example:80 are outside the ceiling of "
                 "service account agents/bot (ceiling: pypi.org:443)")
NO_RULE = ('permission denied: service account agents/bot may not allocate sandboxes: no rule of the manager\'s '
           'authorisation policy names it or its namespace "agents"')
EGRESS_UNSUPPORTED = ("not supported by this manager's allocator: egress allowlist pypi.org:443: the process allocator "
                      "cannot enforce egress; allocate without an allowlist, or run a manager whose allocator enforces one (runsc, kube)")
EXPIRED = ("unauthenticated: the token expired at 2026-12-06T10:00:00Z: projected tokens are renewed by the kubelet; "
           "read the token file again (the SDK does on every call)")
BAD_LEASE = "releasing fbx-000000000001: lease token does not match"
ENDED_LEASE = "renewing fbx-000000000001: lease expired or released"


@pytest.fixture
def cluster():
    # A short directory: unix socket paths must fit sun_path.
    with tempfile.TemporaryDirectory(prefix="fbxfake-") as d:
        c = FakeCluster(Path(d))
        try:
            yield c
        finally:
            c.stop()


def test_default_timeout_raises_command_timeout_error_with_output(cluster):
    with fusebox.Sandbox.allocate(cluster.address) as sb:
        with pytest.raises(fusebox.CommandTimeoutError) as ei:
            sb.exec("sleep 1000")  # no timeout=: the sandbox's default ends it
    res = ei.value.result
    assert res.timed_out and res.stdout == b"partial output\n" and res.stderr == b"warn\n"
    assert "default timeout after 600s" in str(ei.value)
    assert not cluster.sandbox.requests[0].HasField("timeout")


def test_default_timeout_streamed_to_callbacks(cluster):
    got = []
    with fusebox.Sandbox.allocate(cluster.address) as sb:
        with pytest.raises(fusebox.CommandTimeoutError) as ei:
            sb.exec(["sleep", "1000"], stdout=got.append)
        with pytest.raises(fusebox.CommandTimeoutError):
            list(sb.exec_stream("sleep 1000"))
    assert got == [b"partial ", b"output\n"] and ei.value.result.stderr == b"warn\n"


def test_aio_default_timeout_raises_command_timeout_error_with_output(cluster):
    async def run():
        async with fusebox.aio.allocate(cluster.address) as sb:
            with pytest.raises(fusebox.CommandTimeoutError) as ei:
                await sb.exec("sleep 1000")
            return ei.value

    e = asyncio.run(run())
    assert e.result.stdout == b"partial output\n" and e.result.stderr == b"warn\n"


def test_aio_coroutine_callbacks_are_awaited_in_order(cluster):
    cluster.sandbox.exec = exited_exec
    got = []

    async def out(b: bytes) -> None:
        await asyncio.sleep(0.01)
        got.append(("out", b))

    async def err(b: bytes) -> None:
        got.append(("err", b))

    async def run():
        async with fusebox.aio.allocate(cluster.address) as sb:
            res = await sb.exec("echo", stdout=out, stderr=err)
            assert res.exit_code == 0 and res.stdout == b"" and res.stderr == b""
            got.append("returned")

    asyncio.run(run())
    assert got == [("out", b"one "), ("err", b"two\n"), ("out", b"three\n"), "returned"]


def test_python_m_fusebox_run_default_timeout(cluster, capfd):
    code = main(["run", "--manager", cluster.address, "--", "sleep", "1000"])
    out, err = capfd.readouterr()
    assert code == 137
    assert out == "partial output\n" and "warn\n" in err
    assert "ran into the sandbox's default timeout after 600s" in err and "Traceback" not in err
    assert cluster.manager.released == ["fbx-000000000001"]


@pytest.mark.parametrize("code,details,cls", [
    (grpc.StatusCode.PERMISSION_DENIED, TEMPLATE_DENIED, fusebox.PermissionDeniedError),
    (grpc.StatusCode.PERMISSION_DENIED, EGRESS_DENIED, fusebox.PermissionDeniedError),
    (grpc.StatusCode.PERMISSION_DENIED, NO_RULE, fusebox.PermissionDeniedError),
    (grpc.StatusCode.FAILED_PRECONDITION, EGRESS_UNSUPPORTED, fusebox.FailedPreconditionError),
    (grpc.StatusCode.UNAUTHENTICATED, EXPIRED, fusebox.UnauthenticatedError),
])
def test_allocation_refusals_have_their_own_classes(cluster, code, details, cls):
    cluster.manager.allocate_abort = (code, details)
    for allocate in (lambda: fusebox.Sandbox.allocate(cluster.address, egress=["pypi.org:443"]),
                     lambda: asyncio.run(_aio_allocate(cluster.address))):
        with pytest.raises(cls) as ei:
            allocate()
        e = ei.value
        assert not isinstance(e, fusebox.LeaseError) and e.code == code and e.details == details
        assert details in str(e) and "fusebox local up" not in str(e)  # the manager answered
    if details is TEMPLATE_DENIED:
        assert e.template == "gpu" and e.destinations == []
    if details is EGRESS_DENIED:
        assert e.template is None and e.destinations == ["evil.example:443", "x.example:80"]
    if cls is fusebox.PermissionDeniedError or cls is fusebox.UnauthenticatedError:
        assert isinstance(e, PermissionError)


async def _aio_allocate(address: str):
    sb = await fusebox.aio.allocate(address, egress=["pypi.org:443"])
    await sb.close()


@pytest.mark.parametrize("details", [BAD_LEASE, ENDED_LEASE])
def test_lease_refusals_stay_lease_errors(cluster, details):
    code = grpc.StatusCode.PERMISSION_DENIED if details is BAD_LEASE else grpc.StatusCode.FAILED_PRECONDITION
    cluster.manager.release_abort = (code, details)
    sb = fusebox.Sandbox.allocate(cluster.address)
    with pytest.raises(fusebox.LeaseError, match="lease"):
        sb.close()

    async def run():
        sb = await fusebox.aio.allocate(cluster.address)
        await sb.close()

    with pytest.raises(fusebox.LeaseError):
        asyncio.run(run())


def test_unavailable_answer_gets_no_local_up_hint(cluster):
    cluster.manager.allocate_abort = (grpc.StatusCode.UNAVAILABLE, "allocator failed: creating sandbox: runsc exited 1")
    with pytest.raises(fusebox.UnavailableError) as ei:
        fusebox.Sandbox.allocate(cluster.address)
    assert "fusebox local up" not in str(ei.value)


def test_nothing_listening_gets_the_hint(tmp_path):
    with pytest.raises(fusebox.UnavailableError, match="is `fusebox local up` running"):
        fusebox.Sandbox.allocate("unix://" + str(tmp_path / "none.sock"), timeout=10)


def test_allocates_with_allocate(cluster):
    """The sync and asyncio SDKs allocate with the unary Allocate (not AllocateStream, which
    the manager keeps for earlier SDKs), dial after the answer, and their sandboxes work."""
    cluster.sandbox.exec = exited_exec
    with fusebox.Sandbox.allocate(cluster.address) as sb:
        assert sb.exec("true").exit_code == 0

    async def run():
        async with fusebox.aio.allocate(cluster.address) as sb:
            return await sb.exec("true")

    assert asyncio.run(run()).exit_code == 0
    assert cluster.manager.allocated == 2 and cluster.manager.unary == 2
