"""Sessions: a sandbox allocated in one process used, renewed and released from another with
its exported session; units of the document first, then the real ``fusebox local up``, other
Python processes, and the Go CLI reading the same documents.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import textwrap

import pytest

import fusebox
import fusebox.aio
from fusebox import _session
from fusebox._proto.manager.v1 import manager_pb2

from .conftest import _e2e_prerequisites

GUARD = 120.0


def _resp(key: fusebox.AgentKey, sandbox_id: str = "fbx-1") -> manager_pb2.AllocateResponse:
    other = fusebox.AgentKey.generate()  # stands in for the sandbox's key
    return manager_pb2.AllocateResponse(sandbox_id=sandbox_id, endpoint="unix:///run/fbx-1.sock",
                                        sandbox_public_key=other.public_key, lease_token="token-1")


# ---- units: the document ----

@pytest.mark.parametrize("kind", ["ed25519", "p256"])
def test_export_parse_open(kind):
    key = fusebox.AgentKey.generate(kind)
    seal = os.urandom(32)
    sealed = _session.parse(_session.export(_resp(key), "unix:///m.sock", key, seal, False))
    assert _session.open_key(sealed, seal, None).public_key == key.public_key
    plain = _session.parse(_session.export(_resp(key), "unix:///m.sock", key, None, True))
    assert plain["agent_key"]["seal"] == "none"
    assert _session.open_key(plain, None, None).public_key == key.public_key
    bare = _session.parse(_session.export(_resp(key), "unix:///m.sock", key, None, False))
    assert "agent_key" not in bare
    assert _session.open_key(bare, None, key) is key


def test_wrong_keys_refused():
    key = fusebox.AgentKey.generate()
    seal = os.urandom(32)
    text = _session.export(_resp(key), "unix:///m.sock", key, seal, False)
    doc = _session.parse(text)
    with pytest.raises(fusebox.SessionKeyError, match="does not open with this seal key"):
        _session.open_key(doc, os.urandom(32), None)
    with pytest.raises(fusebox.InvalidArgumentError, match="pass seal_key"):
        _session.open_key(doc, None, None)
    with pytest.raises(fusebox.InvalidArgumentError, match="want 32"):
        _session.open_key(doc, seal[:16], None)
    moved = dict(doc, sandbox_id="fbx-2")
    with pytest.raises(fusebox.SessionKeyError):
        _session.open_key(moved, seal, None)
    with pytest.raises(fusebox.SessionKeyError, match="not the one sandbox fbx-1"):
        _session.open_key(doc, None, fusebox.AgentKey.generate())
    with pytest.raises(fusebox.InvalidArgumentError, match="choose one"):
        _session.export(_resp(key), "unix:///m.sock", key, seal, True)


@pytest.mark.parametrize("change,want", [
    (lambda d: d.update(version="fusebox.session/v9"), "version"),
    (lambda d: d.update(lease_token=""), "lease_token is missing"),
    (lambda d: d.update(surprise=1), "surprise"),
    (lambda d: d["agent_key"].update(seal="rot13"), "rot13"),
    (lambda d: d.update(sandbox_public_key="!!"), "reading session"),
])
def test_parse_refusals(change, want):
    key = fusebox.AgentKey.generate()
    d = json.loads(_session.export(_resp(key), "unix:///m.sock", key, None, True))
    change(d)
    with pytest.raises(fusebox.InvalidArgumentError, match=want):
        _session.parse(json.dumps(d))


# ---- end to end ----

_OTHER = textwrap.dedent("""
    import datetime, os, sys
    import fusebox
    seal = bytes.fromhex(os.environ["SEAL"])
    sb = fusebox.Sandbox.connect(sys.argv[1], seal_key=seal)
    print(sb.exec("cat /workspace/from-first").text.strip())
    sb.write_file("from-second", "second")
    print(sb.renew() > datetime.datetime.now(datetime.timezone.utc))
    if sys.argv[2] == "release":
        sb.close()
    else:
        sb.detach()
    print("ok")
""")


def _other_process(session_path: str, seal: bytes, then: str) -> list:
    env = dict(os.environ, SEAL=seal.hex(), PYTHONPATH=os.path.dirname(os.path.dirname(fusebox.__file__)))
    r = subprocess.run([sys.executable, "-c", _OTHER, session_path, then], env=env, capture_output=True,
                       text=True, timeout=GUARD)
    assert r.returncode == 0, r.stderr
    return r.stdout.split()


def test_session_in_another_process(manager_address, tmp_path):
    seal = os.urandom(32)
    sb = fusebox.Sandbox.allocate(manager_address)
    try:
        sb.write_file("from-first", "first")
        path = tmp_path / "s.json"
        path.write_text(sb.export_session(seal))
        assert _other_process(str(path), seal, "detach") == ["first", "True", "ok"]
        # The first process still holds it; the second's write is there.
        assert sb.read_file("from-second") == b"second"
        assert _other_process(str(path), seal, "release") == ["first", "True", "ok"]
        with pytest.raises(fusebox.LeaseError, match="no longer held"):
            sb.renew()
        with pytest.raises(fusebox.LeaseError, match="no longer held"):
            fusebox.Sandbox.connect(path, seal_key=seal)
    finally:
        sb.detach()


def test_session_wrong_key_refused_before_dialing(manager_address):
    with fusebox.Sandbox.allocate(manager_address) as sb:
        doc = sb.export_session(os.urandom(32))
        with pytest.raises(fusebox.SessionKeyError):
            fusebox.Sandbox.connect(doc, seal_key=os.urandom(32))
        bare = sb.export_session()
        with pytest.raises(fusebox.SessionKeyError):
            fusebox.Sandbox.connect(bare, key=fusebox.AgentKey.generate())
        with pytest.raises(fusebox.InvalidArgumentError, match="pass key"):
            fusebox.Sandbox.connect(bare)
        # Still the first agent's, untouched.
        assert sb.exec("echo still").text == "still\n"


def test_aio_session(manager_address):
    async def main():
        async with fusebox.aio.Sandbox.allocate(manager_address) as sb:
            doc = sb.export_session(plain=True)
            other = await fusebox.aio.Sandbox.connect(doc)
            assert (await other.exec("echo via-aio")).text == "via-aio\n"
            await other.renew()
            await other.detach()
            assert other.closed
            assert (await sb.exec("echo first")).text == "first\n"
            # Released by a connected Sandbox: the allocating one's lease is gone.
            async with fusebox.aio.Sandbox.connect(doc):
                pass
            with pytest.raises(fusebox.LeaseError):
                await sb.renew()
            await sb.detach()
    asyncio.run(asyncio.wait_for(main(), GUARD))


def test_go_cli_reads_python_session_and_back(manager_address, tmp_path):
    binary, _ = _e2e_prerequisites()
    seal = os.urandom(32)
    key_file = tmp_path / "k"
    key_file.write_bytes(seal)
    with fusebox.Sandbox.allocate(manager_address) as sb:
        path = tmp_path / "py.json"
        path.write_text(sb.export_session(seal))
        r = subprocess.run([str(binary), "exec", "--session", str(path), "--session-key", str(key_file), "--", "echo", "from-go"],
                           capture_output=True, text=True, timeout=GUARD)
        assert (r.returncode, r.stdout) == (0, "from-go\n"), r.stderr
    # And a session the CLI wrote opens here.
    go_path = tmp_path / "go.json"
    r = subprocess.run([str(binary), "run", "--manager", manager_address, "--keep", "--session-out", str(go_path),
                        "--session-key", str(key_file), "-q"], capture_output=True, text=True, timeout=GUARD)
    assert r.returncode == 0, r.stderr
    with fusebox.Sandbox.connect(go_path, seal_key=seal) as sb:
        assert sb.exec("echo from-python").text == "from-python\n"
    with pytest.raises(fusebox.LeaseError):
        fusebox.Sandbox.connect(go_path, seal_key=seal)
