"""Fixtures: a real ``fusebox local up`` under gVisor, started for the test session.

The manager runs from the repository's bin/ (``make build``; $FUSEBOX_BIN overrides it) with
the pinned runsc ($FUSEBOX_RUNSC), on a unix socket in a fresh temporary directory. Missing
binaries or root fail the session instead of skipping it, so that CI cannot pass without
running the tests; FUSEBOX_SKIP_RUNSC=1 skips the end-to-end tests instead (unit tests still run).
Every address used is a unix socket.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

import fusebox

REPO = Path(__file__).resolve().parents[3]
DEFAULT_RUNSC = "/var/cache/fusebox/runsc-v0.0.0-20260905035102-160fafc42237/runsc"
# Deadlines that only keep a broken manager from hanging the session; nothing asserts on time.
START_DEADLINE = 180.0


class ManagerProcess:
    """A manager process the tests started (``proc``), writing to ``log_path``."""

    proc: subprocess.Popen | None
    log_path: Path

    def log(self) -> str:
        """The log's last 20,000 characters, for a failure's message."""
        try:
            return self.log_path.read_text(errors="replace")[-20000:]
        except OSError:
            return ""

    def terminate(self) -> None:
        """Stops the process: SIGTERM, then SIGKILL if it has not exited within a minute."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class LocalManager(ManagerProcess):
    """A running ``fusebox local up``: its address, state directory and log."""

    def __init__(self, base: Path, binary: Path, runsc: str, args: tuple = ()):
        self.base, self.binary, self.runsc, self.args = base, binary, runsc, tuple(args)
        self.state = base / "state"
        self.socket = base / "run" / "manager.sock"
        self.address = "unix://" + str(self.socket)
        self.log_path = base / "manager.log"
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        self.socket.parent.mkdir(parents=True)
        log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            [str(self.binary), "local", "up", "--runsc", self.runsc, "--state-dir", str(self.state),
             "--listen", self.address, "--pool-size", "2", "--lease-ttl", "2m", *self.args],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + START_DEADLINE
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"fusebox local up exited with {self.proc.returncode}:\n{self.log()}")
            if self.socket.exists():
                try:
                    with fusebox.Manager(self.address) as m:
                        if any(s.state == "READY" for s in m.list()):
                            return
                except fusebox.FuseboxError:
                    pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"fusebox local up did not serve a ready pool within {START_DEADLINE}s:\n{self.log()}")
            time.sleep(0.1)

    def stop(self) -> None:
        self.terminate()
        self._force_clean()

    def _force_clean(self) -> None:
        """Removes every container a failing test left, runsc's null-netns mount, the files."""
        root = self.state / "runsc"
        if root.exists():
            out = subprocess.run([self.runsc, "--root", str(root), "list", "-quiet"], capture_output=True, text=True)
            for cid in out.stdout.split():
                subprocess.run([self.runsc, "--root", str(root), "delete", "-force", cid], capture_output=True)
            libc = ctypes.CDLL(None, use_errno=True)
            while libc.umount2(str(root / "null-netns").encode(), 2) == 0:  # MNT_DETACH; stacked mounts
                pass
        shutil.rmtree(self.base, ignore_errors=True)


def _e2e_prerequisites() -> tuple[Path, str]:
    binary = Path(os.environ.get("FUSEBOX_BIN") or REPO / "bin" / "fusebox")
    runsc = os.environ.get("FUSEBOX_RUNSC") or DEFAULT_RUNSC
    problems = []
    if not os.access(binary, os.X_OK) or not os.access(binary.parent / "fusebox-sandbox", os.X_OK):
        problems.append(f"{binary} and fusebox-sandbox beside it are missing: run `make build` (or set $FUSEBOX_BIN)")
    if not os.access(runsc, os.X_OK):
        problems.append(f"runsc {runsc} is missing: run `make runsc` (or set $FUSEBOX_RUNSC)")
    if os.geteuid() != 0:
        problems.append("the gVisor tests need root")
    if problems:
        msg = "; ".join(problems)
        if os.environ.get("FUSEBOX_SKIP_RUNSC") == "1":
            pytest.skip(msg + " (skipped: FUSEBOX_SKIP_RUNSC=1)")
        pytest.fail(msg + "; set FUSEBOX_SKIP_RUNSC=1 to skip the end-to-end tests", pytrace=False)
    return binary, runsc


@pytest.fixture(scope="session")
def local_manager():
    """The session's ``fusebox local up``."""
    binary, runsc = _e2e_prerequisites()
    # A short path: sandbox socket paths under it must fit sun_path (108 bytes).
    m = LocalManager(Path(tempfile.mkdtemp(prefix="fbxpy-")), binary, runsc)
    try:
        m.start()
        yield m
    finally:
        m.stop()


@pytest.fixture(scope="session")
def manager_address(local_manager: LocalManager) -> str:
    return local_manager.address


@pytest.fixture
def sandbox(manager_address: str):
    """A fresh sandbox, released after the test."""
    with fusebox.Sandbox.allocate(manager_address, labels={"test": "pytest"}) as sb:
        yield sb


@pytest.fixture(autouse=True)
def _manager_log_on_failure(request):
    yield
    rep = getattr(request.node, "rep_call", None)
    if rep is not None and rep.failed and "local_manager" in request.fixturenames:
        print("manager log (tail):\n" + request.getfixturevalue("local_manager").log()[-4000:])


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    if rep.when == "call":
        item.rep_call = rep
