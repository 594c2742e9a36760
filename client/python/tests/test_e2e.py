"""End-to-end tests of the sync SDK against a real ``fusebox local up`` under gVisor."""

from __future__ import annotations

import io
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric import ed25519

import fusebox
from fusebox import _core
from fusebox._proto.manager.v1 import manager_pb2
from fusebox.keys import AgentKey

PKG = Path(__file__).resolve().parents[1]


def listed(addr: str, sandbox_id: str) -> bool:
    with fusebox.Manager(addr) as m:
        return any(s.sandbox_id == sandbox_id for s in m.list())


def wait_unlisted(addr: str, sandbox_id: str, deadline: float = 60.0) -> None:
    end = time.monotonic() + deadline
    while listed(addr, sandbox_id):
        assert time.monotonic() < end, f"sandbox {sandbox_id} still listed by the manager"
        time.sleep(0.05)


@pytest.fixture(scope="module")
def plain_manager():
    """A ``fusebox local up`` with every latency accelerator off (--fast-path none)."""
    from .conftest import LocalManager, _e2e_prerequisites

    binary, runsc = _e2e_prerequisites()
    lm = LocalManager(Path(tempfile.mkdtemp(prefix="fbxpl-")), binary, runsc, ("--fast-path", "none"))
    try:
        lm.start()
        yield lm.address
    finally:
        lm.stop()


def test_plain_path_allocates(plain_manager):
    """With every accelerator off the SDK allocates and its sandbox works alike."""
    with fusebox.Manager(plain_manager) as m:
        with m.allocate() as sb:
            assert sb.exec("echo plain").stdout == b"plain\n"


# ---- lifecycle ----

def test_allocate_exec_release(manager_address):
    sb = fusebox.Sandbox.allocate(manager_address, labels={"test": "e2e"})
    try:
        assert listed(manager_address, sb.id)
        res = sb.exec(["uname", "-r"])
        assert res.exit_code == 0 and "gvisor" in res.text.lower() or res.text.strip(), res
        res = sb.exec("echo out; echo err >&2; exit 3")
        assert (res.exit_code, res.stdout, res.stderr) == (3, b"out\n", b"err\n")
        assert sb.exec(["cat"], stdin=b"fed through stdin").stdout == b"fed through stdin"
    finally:
        sb.close()
    sb.close()  # idempotent
    wait_unlisted(manager_address, sb.id)


def test_allocation_env_and_cwd(manager_address):
    # Given with the allocation, they reach a warm sandbox with sFuse: every command starts
    # with them, and a command's own env and cwd still win.
    with fusebox.Sandbox.allocate(manager_address, env={"GREETING": "hello", "HOME": "/tmp"}, cwd="/tmp") as sb:
        assert sb.exec("pwd; echo $GREETING $HOME").stdout == b"/tmp\nhello /tmp\n"
        assert sb.exec(["sh", "-c", "pwd; echo $GREETING"], env={"GREETING": "own"}, cwd="/").stdout == b"/\nown\n"
    with pytest.raises(fusebox.InvalidArgumentError, match="not a variable name"):
        fusebox.Sandbox.allocate(manager_address, env={"1X": "y"})
    with pytest.raises(fusebox.InvalidArgumentError, match="env"):
        fusebox.Sandbox.allocate(manager_address, env={"X": 1})


def test_close_destroys(manager_address):
    with fusebox.Sandbox.allocate(manager_address) as sb:
        sid = sb.id
        assert listed(manager_address, sid)
    assert sb.closed
    wait_unlisted(manager_address, sid)


def wait_key_ahead(m, deadline: float = 30.0):
    """Waits until the Manager has a key made ahead, and returns it."""
    end = time.monotonic() + deadline
    while m._keys._next is None:
        assert time.monotonic() < end, "no key was made ahead"
        time.sleep(0.01)
    return m._keys._next


def test_kept_manager_makes_each_key_ahead(manager_address):
    """A kept Manager's allocations each use a fresh key, made ahead with its certificate
    (never handed out twice), and the lease keeper that prepares the next one still renews."""
    with fusebox.Manager(manager_address) as m:
        used = []
        for _ in range(3):
            ahead = wait_key_ahead(m)
            assert ahead._cert_pem is not None  # the certificate was made ahead too
            with m.allocate(lease_ttl=1.5) as sb:
                assert m._keys._next is not ahead  # taken by this allocation
                used.append(ahead.public_key)
                first = sb.lease_expires
                assert sb.exec("echo ok").stdout == b"ok\n"
                end = time.monotonic() + 10
                while sb.lease_expires <= first:  # renewed every 0.5 s by the keeper
                    assert time.monotonic() < end, f"lease not renewed: {sb.lease_error}"
                    time.sleep(0.05)
                assert sb.lease_error is None
                assert listed(manager_address, sb.id)
            assert wait_key_ahead(m).public_key not in used
        assert len(set(used)) == 3
        # A key the caller brings leaves the one made ahead waiting.
        ahead = wait_key_ahead(m)
        with m.allocate(key=AgentKey.generate("p256")) as sb:
            assert sb.stat(".").type == "dir"
        assert m._keys._next is ahead
    assert m._keys._next is None  # closing drops it


def test_one_allocation_makes_no_key_ahead(manager_address):
    with fusebox.Sandbox.allocate(manager_address) as sb:
        sb.stat(".")
        time.sleep(0.2)  # past PREPARE_AFTER
        assert sb._lease.keeper.mgr._keys._next is None and not sb._lease.keeper.mgr._keys._making


def test_lease_renewed_past_ttl(manager_address):
    ttl = 2.0
    with fusebox.Sandbox.allocate(manager_address, lease_ttl=ttl) as sb:
        first = sb.lease_expires
        end = time.monotonic() + 3 * ttl
        while time.monotonic() < end:  # in use for three TTLs
            assert sb.exec(["true"]).exit_code == 0
            time.sleep(0.2)
        assert sb.lease_error is None
        assert sb.lease_expires > first
        assert sb.exec("echo alive").stdout == b"alive\n"
        assert listed(manager_address, sb.id)


def test_exec_stream_env_cwd_state(sandbox):
    chunks = list(sandbox.exec_stream("for i in 1 2 3; do echo $i; echo e$i >&2; done"))
    out = b"".join(c.data for c in chunks if c.stream == "stdout")
    err = b"".join(c.data for c in chunks if c.stream == "stderr")
    assert (out, err) == (b"1\n2\n3\n", b"e1\ne2\ne3\n")
    assert sandbox.exec("mkdir -p sub && cd sub && export KEPT=yes").state_recorded
    assert sandbox.exec("echo $KEPT $(basename $PWD)").stdout == b"yes sub\n"
    assert sandbox.exec(["sh", "-c", "echo $ONLY"], env={"ONLY": "here"}).stdout == b"here\n"
    assert sandbox.exec(["sh", "-c", "echo ${KEPT:-gone}"], unset=["KEPT"]).stdout == b"gone\n"
    got = []
    res = sandbox.exec("echo streamed", stdout=got.append)
    assert got == [b"streamed\n"] and res.stdout == b""
    with pytest.raises(fusebox.CommandError, match="status 4"):
        sandbox.exec("exit 4", check=True)


# ---- pinning ----

def raw_allocate(m: fusebox.Manager, key: AgentKey) -> manager_pb2.AllocateResponse:
    return m._rpc.Allocate(_core.allocate_request(key, "", None, None, {"test": "pinning"}), timeout=60)


def connect(m, resp, key):
    return fusebox.Sandbox._connect(m, resp, key, None, fusebox.DEFAULT_BATCH_BYTES, 4)


def test_wrong_sandbox_key_refused(manager_address):
    with fusebox.Manager(manager_address) as m:
        key = AgentKey.generate()
        resp = raw_allocate(m, key)
        try:
            bad = manager_pb2.AllocateResponse()
            bad.CopyFrom(resp)
            bad.sandbox_public_key = AgentKey.generate().public_key  # not the sandbox's key
            with pytest.raises(fusebox.PinningError, match="not sandbox_public_key"):
                connect(m, bad, key)
            # Both replaced by an attacker's consistent pair: the check passes, but the real
            # sandbox cannot prove that key, so the TLS handshake fails.
            forged_key = AgentKey.generate()
            forged = manager_pb2.AllocateResponse()
            forged.CopyFrom(resp)
            forged.sandbox_public_key = forged_key.public_key
            forged.sandbox_certificate = sandbox_style_certificate(forged_key)
            sb = connect(m, forged, key)
            with pytest.raises(fusebox.PinningError):
                sb.exec(["true"])
            sb._finalizer.detach()
            sb._lease.stop()
            sb._channel.close()
            # The real answer works.
            good = connect(m, resp, key)
            assert good.exec("echo pinned").stdout == b"pinned\n"
            good.close()
        finally:
            m._release(resp.sandbox_id, resp.lease_token)


def sandbox_style_certificate(k: AgentKey) -> bytes:
    """A self-signed certificate for k naming SERVER_NAME, as a sandbox makes one (DER)."""
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import serialization
    from cryptography.x509.oid import NameOID

    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "forged")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(k._key.public_key())
            .serial_number(1).not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(fusebox.SERVER_NAME)]), critical=False)
            .sign(k._key, None))
    return cert.public_bytes(serialization.Encoding.DER)


def test_certificate_with_other_key_refused(manager_address):
    with fusebox.Manager(manager_address) as m:
        key = AgentKey.generate()
        resp = raw_allocate(m, key)
        try:
            bad = manager_pb2.AllocateResponse()
            bad.CopyFrom(resp)
            bad.sandbox_certificate = sandbox_style_certificate(AgentKey.generate())
            with pytest.raises(fusebox.PinningError, match="not sandbox_public_key"):
                connect(m, bad, key)
            bad.sandbox_certificate = b""
            with pytest.raises(fusebox.PinningError, match="no sandbox certificate"):
                connect(m, bad, key)
        finally:
            m._release(resp.sandbox_id, resp.lease_token)


def test_second_agent_key_cannot_talk(manager_address):
    with fusebox.Manager(manager_address) as m:
        key = AgentKey.generate()
        resp = raw_allocate(m, key)
        try:
            other = connect(m, resp, AgentKey.generate("p256"))
            with pytest.raises((fusebox.PinningError, fusebox.UnavailableError)):
                other.write_file("intruder", b"x")
            other._finalizer.detach()
            other._lease.stop()
            other._channel.close()
            good = connect(m, resp, key)
            assert not good.exists("intruder")
            good.close()
        finally:
            m._release(resp.sandbox_id, resp.lease_token)


@pytest.mark.parametrize("kind", ["ed25519", "p256"])
def test_key_types(manager_address, kind):
    with fusebox.Sandbox.allocate(manager_address, key=AgentKey.generate(kind)) as sb:
        assert sb.exec("echo ok").stdout == b"ok\n"


# ---- files ----

def test_3000_small_files_in_at_most_4_rpcs(sandbox):
    rnd = random.Random(17)
    files = {f"src/d{i % 30}/f{i}.txt": rnd.randbytes(4096) for i in range(3000)}
    st = sandbox.write_files(files)
    assert st.files == 3000 and st.bytes == 3000 * 4096
    assert st.batches + st.streamed <= 4 and st.streamed == 0, st
    got = sandbox.read_files("src/**")
    assert len(got) == 3000 and got.stats.missing == []
    for p, data in files.items():
        assert got[p] == data, p


def test_64mib_streamed(sandbox):
    data = os.urandom(64 << 20)
    st = sandbox.write_files({"big.bin": data})
    assert st.streamed == 1 and st.batches == 0 and st.bytes == len(data)
    assert sandbox.read_file("big.bin") == data
    # Over a bulk connection (fusebox-bulk/1), not the gRPC stream, and kept for the next read.
    assert sandbox._bulk._ctx is not None and not sandbox._bulk._off and sandbox._bulk._idle is not None
    got = sandbox.read_files("big.bin")
    assert got.stats.streamed == 1 and got["big.bin"] == data
    n = sandbox.write_file_from("copy.bin", io.BytesIO(data[:5 << 20]), size=5 << 20)
    assert n == 5 << 20 and sandbox.stat("copy.bin").size == 5 << 20


@pytest.mark.parametrize("path", ["../escape", "/etc/passwd", "a/../../x"])
def test_path_escape(sandbox, path):
    with pytest.raises(fusebox.PathEscapeError):
        sandbox.write_files({path: b"x"})
    with pytest.raises(fusebox.PathEscapeError):
        sandbox.read_file(path)


def test_symlink_escape(sandbox):
    with pytest.raises(fusebox.PathEscapeError):
        sandbox.symlink("../../etc", "out")


def test_file_operations(sandbox, tmp_path):
    (tmp_path / "pkg" / "empty").mkdir(parents=True)
    (tmp_path / "pkg" / "mod.py").write_text("def f():\n    return 'needle'\n")
    (tmp_path / "run.sh").write_text("#!/bin/sh\necho ran\n")
    (tmp_path / "run.sh").chmod(0o755)
    (tmp_path / "link").symlink_to("pkg/mod.py")
    st = sandbox.write_tree(tmp_path, "repo")
    assert (st.files, st.symlinks) == (2, 1)
    assert sandbox.exec("./repo/run.sh").stdout == b"ran\n"
    assert sandbox.stat("repo/pkg/empty").type == "dir"
    link = sandbox.stat("repo/link")
    assert link.type == "symlink" and link.symlink_target == "pkg/mod.py"
    assert sandbox.stat("repo/link", follow_symlinks=True).type == "file"
    names = sorted(e.path for e in sandbox.list("repo", recursive=True))
    assert "repo/pkg/mod.py" in names and "repo/pkg/empty" in names, names
    assert [e.path for e in sandbox.find("repo", name="*.py", type="file")] == ["repo/pkg/mod.py"]
    g = sandbox.grep("needle", ["repo"], include=["*.py"])
    assert [(m.path, m.line) for m in g] == [("repo/pkg/mod.py", 2)]
    sandbox.mkdir("a/b/c", parents=True)
    sandbox.rename("repo/run.sh", "a/b/c/run.sh")
    assert sandbox.exists("a/b/c/run.sh") and not sandbox.exists("repo/run.sh")
    sandbox.write_file("a/b/c/run.sh", b"new")
    with pytest.raises(fusebox.AlreadyExistsError):
        sandbox.rename("repo/pkg/mod.py", "a/b/c/run.sh")
    sandbox.remove("a", recursive=True)
    assert not sandbox.exists("a")
    with pytest.raises(fusebox.NotFoundError):
        sandbox.stat("a")
    sandbox.remove("a", missing_ok=True)
    got = sandbox.read_files("repo/**/*.py", "nothing/*.x")
    assert list(got) == ["repo/pkg/mod.py"] and got.stats.missing == ["nothing/*.x"]
    st = sandbox.write_files({"m/x/1": b"1", "m/y/2": b"2"}, mkdirs=["m/x", "m", "m/z/w", "m/z"],
                             symlinks=[fusebox.Symlink("x/1", "m/l")])
    assert st.dirs >= 2 and st.symlinks == 1
    assert sandbox.read_file("m/l") == b"1" and sandbox.stat("m/z/w").type == "dir"


# ---- task groups ----

def test_task_group_last_logical_write_wins(sandbox):
    rnd = random.Random(20)
    root = sandbox.exec("pwd").text.strip()
    for rep in range(10):
        with sandbox.task_group() as g:
            futs = [g.submit(f"sleep 0.{rnd.randint(0, 30):02d}; export X={rep}-{n}; mkdir -p {root}/r{rep}/d{n}; cd {root}/r{rep}/d{n}")
                    for n in range(1, 21)]
        assert all(f.result().state_recorded for f in futs), rep
        res = sandbox.exec('echo "$X $PWD"')
        assert res.text == f"{rep}-20 {root}/r{rep}/d20\n", (rep, res)


# ---- bad input ----

def no_leak(addr: str, before: set) -> None:
    with fusebox.Manager(addr) as m:
        bound = {s.sandbox_id for s in m.list() if s.state == "BOUND"}
    assert bound <= before, f"sandboxes left bound: {bound - before}"


def bound_now(addr: str) -> set:
    with fusebox.Manager(addr) as m:
        return {s.sandbox_id for s in m.list() if s.state == "BOUND"}


@pytest.mark.parametrize("addr", ["localhost:9090", "unix://relative/path", "tcp://nohostport", "http://x:1", ""])
def test_bad_manager_address(addr):
    with pytest.raises(fusebox.BadAddressError, match="manager address"):
        fusebox.Sandbox.allocate(addr)


def test_manager_down(tmp_path):
    with pytest.raises(fusebox.UnavailableError, match="fusebox local up"):
        fusebox.Sandbox.allocate("unix://" + str(tmp_path / "nobody.sock"), timeout=10)


def test_unknown_template(manager_address):
    before = bound_now(manager_address)
    with pytest.raises(fusebox.InvalidArgumentError, match="template"):
        fusebox.Sandbox.allocate(manager_address, template="no-such-template")
    no_leak(manager_address, before)


@pytest.mark.parametrize("egress", [["no-port"], ["host:99999"], ["*.:443"]])
def test_malformed_egress(manager_address, egress):
    before = bound_now(manager_address)
    with pytest.raises(fusebox.InvalidArgumentError, match="egress"):
        fusebox.Sandbox.allocate(manager_address, egress=egress)
    no_leak(manager_address, before)


def test_egress_given_as_string(manager_address):
    with pytest.raises(fusebox.InvalidArgumentError, match="egress"):
        fusebox.Sandbox.allocate(manager_address, egress="pypi.org:443")


def test_command_timeout(sandbox):
    with pytest.raises(fusebox.CommandTimeoutError, match="timed out after 1s") as ei:
        sandbox.exec("echo started; sleep 60", timeout=1)
    r = ei.value.result
    assert r.timed_out and r.stdout == b"started\n"
    assert sandbox.exec("echo still usable").stdout == b"still usable\n"


def test_bad_exec_input(sandbox):
    for bad in ([], "", [1, 2]):
        with pytest.raises(fusebox.InvalidArgumentError):
            sandbox.exec(bad)
    with pytest.raises(fusebox.InvalidArgumentError, match="timeout"):
        sandbox.exec("true", timeout=-1)


# ---- python3 -m fusebox run ----

def test_run_cli(manager_address, tmp_path):
    (tmp_path / "x.py").write_text("print('hi from', __name__)\n")
    env = dict(os.environ, PYTHONPATH=str(PKG), FUSEBOX_MANAGER=manager_address)
    p = subprocess.run([sys.executable, "-m", "fusebox", "run", "--upload", str(tmp_path), "--", "python3", "x.py"],
                       env=env, capture_output=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert p.stdout == b"hi from __main__\n"
    assert b"uploaded 1 files" in p.stderr
    p = subprocess.run([sys.executable, "-m", "fusebox", "run", "-q", "--", "sh", "-c", "echo e >&2; exit 7"],
                       env=env, capture_output=True, timeout=120)
    assert (p.returncode, p.stdout, p.stderr) == (7, b"", b"e\n")
    p = subprocess.run([sys.executable, "-m", "fusebox", "run", "--timeout", "1s", "--", "sleep", "60"],
                       env=env, capture_output=True, timeout=120)
    assert p.returncode != 0 and b"timed out" in p.stderr
    p = subprocess.run([sys.executable, "-m", "fusebox", "run", "--manager", "bogus", "--", "true"],
                       env=env, capture_output=True, timeout=120)
    assert p.returncode == 1 and b"manager address" in p.stderr


class _BrokenKey(AgentKey):
    """An agent key whose client certificate cannot be made (it is made while Allocate runs)."""

    def _credentials(self):
        raise RuntimeError("no certificate for this key")


def test_failure_beside_allocate_releases(manager_address):
    before = bound_now(manager_address)
    key = _BrokenKey(ed25519.Ed25519PrivateKey.generate())
    with pytest.raises(RuntimeError, match="no certificate"):
        fusebox.Sandbox.allocate(manager_address, key=key)
    no_leak(manager_address, before)
