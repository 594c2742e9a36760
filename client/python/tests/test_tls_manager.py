"""The SDK against a manager on TCP with TLS and ServiceAccount tokens, as in a cluster.

The test starts ``fusebox-manager`` (the service binary; ``fusebox manager`` is the same command
under the CLI; bin/, ``make build``) on 127.0.0.1 with a certificate
from a CA it makes, the process allocator (no gVisor: the sandboxes' isolation is not what is
tested here) and token review against a fake Kubernetes API on 127.0.0.1 that answers
TokenReview for the tokens below. Every address used is loopback or a unix socket.
"""

from __future__ import annotations

import asyncio
import base64
import datetime
import ipaddress
import json
import os
import shutil
import subprocess
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

import fusebox
import fusebox.aio
from fusebox.__main__ import main

from .conftest import REPO, START_DEADLINE, ManagerProcess

AUDIENCE = "fusebox-test-manager"
# The name the manager's certificate carries (not the address's host: server_name says it).
MANAGER_NAME = "fusebox-manager.test"
# Tokens the fake API server knows, and whose ServiceAccount each is.
TOKENS = {"agent-token": "system:serviceaccount:agents:bot", "limited-token": "system:serviceaccount:others:limited"}
POLICY = """rules:
- namespaces: [agents]
  egress: ["pypi.org:443"]
- serviceAccounts: [others/limited]
  templates: [gpu]
"""


def _expired_jwt() -> str:
    """A token shaped as a ServiceAccount JWT with the manager's audience, expired an hour ago
    (the manager refuses it before any review)."""
    def seg(d: dict) -> str:
        return base64.urlsafe_b64encode(json.dumps(d).encode()).rstrip(b"=").decode()
    past = int(time.time()) - 3600
    return ".".join([seg({"alg": "RS256"}), seg({"aud": [AUDIENCE], "exp": past, "sub": "system:serviceaccount:agents:bot"}), "c2ln"])


def _pb_fields(buf: bytes):
    """The (field number, value) pairs of a protobuf message's length-delimited and varint
    fields: enough to read a TokenReview's spec."""
    i, out = 0, []
    while i < len(buf):
        key, i = _varint(buf, i)
        num, wire = key >> 3, key & 7
        if wire == 0:
            v, i = _varint(buf, i)
        elif wire == 2:
            n, i = _varint(buf, i)
            v, i = buf[i:i + n], i + n
        else:
            raise ValueError(f"protobuf wire type {wire}")
        out.append((num, v))
    return out


def _varint(buf: bytes, i: int):
    v = shift = 0
    while True:
        b = buf[i]
        i += 1
        v |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return v, i


def _token_review_spec(body: bytes, content_type: str) -> dict:
    """A TokenReview request's spec, from JSON or from the API's protobuf envelope ("k8s\\0",
    then runtime.Unknown whose field 2 is the TokenReview; its field 2 is the spec: token 1,
    audiences 2), as the manager's client sends it."""
    if "json" in content_type:
        return json.loads(body)["spec"]
    assert body[:4] == b"k8s\x00", body[:8]
    raw = next(v for n, v in _pb_fields(body[4:]) if n == 2)
    spec = next(v for n, v in _pb_fields(raw) if n == 2)
    f = _pb_fields(spec)
    return {"token": next((v.decode() for n, v in f if n == 1), ""), "audiences": [v.decode() for n, v in f if n == 2]}


class _TokenReviews(BaseHTTPRequestHandler):
    """The Kubernetes API's TokenReview, for TOKENS only; it answers in JSON, which the
    client accepts whatever it sent."""

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        if self.path != "/apis/authentication.k8s.io/v1/tokenreviews":
            self.send_error(404)
            return
        spec = _token_review_spec(self.rfile.read(int(self.headers["Content-Length"])), self.headers.get("Content-Type", ""))
        user = TOKENS.get(spec.get("token", ""))
        st = {"authenticated": True, "user": {"username": user}, "audiences": spec.get("audiences", [])} if user \
            else {"authenticated": False, "error": "invalid bearer token"}
        body = json.dumps({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": spec, "status": st}).encode()
        self.send_response(201)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


def _pki(d: Path) -> None:
    """ca.crt, and tls.crt/tls.key for MANAGER_NAME signed by it."""
    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "fusebox test CA")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
          .serial_number(1).not_valid_before(now - datetime.timedelta(hours=1)).not_valid_after(now + datetime.timedelta(days=1))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True).sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, MANAGER_NAME)]))
            .issuer_name(ca_name).public_key(key.public_key()).serial_number(2)
            .not_valid_before(now - datetime.timedelta(hours=1)).not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(MANAGER_NAME)]), critical=False)
            .sign(ca_key, hashes.SHA256()))
    (d / "ca.crt").write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    (d / "tls.crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (d / "tls.key").write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                  serialization.NoEncryption()))


class TLSManager(ManagerProcess):
    """A running ``fusebox-manager`` on TCP with TLS and token review, and its files."""

    def __init__(self, base: Path, binary: Path):
        self.base, self.binary = base, binary
        self.ca_file = str(base / "ca.crt")
        self.token_file = str(base / "token")
        self.address = ""
        self.log_path = base / "manager.log"
        self.api = ThreadingHTTPServer(("127.0.0.1", 0), _TokenReviews)
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        _pki(self.base)
        Path(self.token_file).write_text("agent-token\n")
        (self.base / "policy.yaml").write_text(POLICY)
        threading.Thread(target=self.api.serve_forever, daemon=True).start()
        (self.base / "kubeconfig").write_text(json.dumps({
            "apiVersion": "v1", "kind": "Config", "current-context": "test",
            "clusters": [{"name": "test", "cluster": {"server": f"http://127.0.0.1:{self.api.server_address[1]}"}}],
            "users": [{"name": "test", "user": {}}],
            "contexts": [{"name": "test", "context": {"cluster": "test", "user": "test"}}]}))
        log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            [str(self.binary), "--listen", "tcp://127.0.0.1:0", "--metrics-listen", "",
             "--allocator", "process", "--insecure-process-runtime", "--state-dir", str(self.base / "state"),
             "--estimator", "fixed", "--pool-size", "1", "--pool-max", "2", "--lease-ttl", "2m",
             "--tls-cert-file", str(self.base / "tls.crt"), "--tls-key-file", str(self.base / "tls.key"),
             "--token-audience", AUDIENCE, "--kubeconfig", str(self.base / "kubeconfig"),
             "--auth-policy", str(self.base / "policy.yaml")],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + START_DEADLINE
        while not self.address:
            if self.proc.poll() is not None:
                raise RuntimeError(f"fusebox-manager exited with {self.proc.returncode}:\n{self.log()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"fusebox-manager did not get ready within {START_DEADLINE}s:\n{self.log()}")
            for line in self.log().splitlines():
                try:
                    rec = json.loads(line)
                except ValueError:
                    continue
                if rec.get("msg") == "ready":
                    self.address = rec["listen"]
            time.sleep(0.05)

    def stop(self) -> None:
        self.terminate()
        self.api.shutdown()
        shutil.rmtree(self.base, ignore_errors=True)


@pytest.fixture(scope="module")
def tls_manager():
    binary = Path(os.environ.get("FUSEBOX_BIN") or REPO / "bin" / "fusebox").parent / "fusebox-manager"
    if not os.access(binary, os.X_OK) or not os.access(binary.parent / "fusebox-sandbox", os.X_OK):
        msg = f"{binary} and fusebox-sandbox beside it are missing: run `make build` (or set $FUSEBOX_BIN to bin/fusebox)"
        if os.environ.get("FUSEBOX_SKIP_RUNSC") == "1":
            pytest.skip(msg + " (skipped: FUSEBOX_SKIP_RUNSC=1)")
        pytest.fail(msg, pytrace=False)
    # A short path: sandbox socket paths under it must fit sun_path (108 bytes).
    m = TLSManager(Path(tempfile.mkdtemp(prefix="fbxtls-")), binary)
    try:
        m.start()
        yield m
    finally:
        m.stop()


@pytest.fixture
def env_clean(monkeypatch):
    for k in ("FUSEBOX_MANAGER", "FUSEBOX_CA_FILE", "FUSEBOX_TOKEN_FILE", "FUSEBOX_TLS_SERVER_NAME"):
        monkeypatch.delenv(k, raising=False)
    return monkeypatch


def test_allocate_over_tls_with_a_token(tls_manager, env_clean):
    m = tls_manager
    with fusebox.Manager(m.address, ca_file=m.ca_file, token_file=m.token_file, server_name=MANAGER_NAME) as mgr:
        with mgr.allocate(egress=["pypi.org:443"]) as sb:
            assert sb.exec("echo over tls").stdout == b"over tls\n"
    with fusebox.Sandbox.allocate(m.address, ca_file=m.ca_file, token_file=m.token_file, server_name=MANAGER_NAME) as sb:
        assert sb.run("true").exit_code == 0

    async def aio():
        async with fusebox.aio.allocate(m.address, ca_file=m.ca_file, token_file=m.token_file, server_name=MANAGER_NAME) as sb:
            return (await sb.exec("echo aio")).stdout

    assert asyncio.run(aio()) == b"aio\n"


def test_environment_as_for_the_cli(tls_manager, env_clean, capfd):
    m = tls_manager
    env_clean.setenv("FUSEBOX_MANAGER", m.address)
    env_clean.setenv("FUSEBOX_CA_FILE", m.ca_file)
    env_clean.setenv("FUSEBOX_TOKEN_FILE", m.token_file)
    env_clean.setenv("FUSEBOX_TLS_SERVER_NAME", MANAGER_NAME)
    with fusebox.Sandbox.allocate() as sb:
        assert sb.exec("echo env").stdout == b"env\n"
    assert main(["run", "-q", "--manager", m.address, "--", "echo", "cli"]) == 0
    assert capfd.readouterr().out == "cli\n"


def test_server_name_is_checked(tls_manager, env_clean):
    m = tls_manager
    # The certificate names MANAGER_NAME, not 127.0.0.1.
    with pytest.raises(fusebox.UnavailableError, match="reachable, with its CA"):
        fusebox.Sandbox.allocate(m.address, ca_file=m.ca_file, token_file=m.token_file, timeout=10)


def test_tcp_without_tls_is_refused(tls_manager, env_clean):
    for make in (lambda: fusebox.Manager(tls_manager.address),
                 lambda: fusebox.Sandbox.allocate(tls_manager.address, token_file=tls_manager.token_file),
                 lambda: fusebox.aio.Manager(tls_manager.address)):
        with pytest.raises(fusebox.InvalidArgumentError, match="serves TLS only.*ca_file"):
            make()
    assert main(["run", "--manager", tls_manager.address, "--", "true"]) == 1


def test_refused_tokens(tls_manager, env_clean, tmp_path):
    m = tls_manager
    for token, why in (("no-such-token", "invalid bearer token"), (_expired_jwt(), "expired")):
        tf = tmp_path / "token"
        tf.write_text(token)
        with pytest.raises(fusebox.UnauthenticatedError, match=why) as ei:
            fusebox.Sandbox.allocate(m.address, ca_file=m.ca_file, token_file=str(tf), server_name=MANAGER_NAME)
        assert "fusebox local up" not in str(ei.value)
    # No token at all.
    with pytest.raises(fusebox.UnauthenticatedError, match="no bearer token"):
        fusebox.Sandbox.allocate(m.address, ca_file=m.ca_file, server_name=MANAGER_NAME)


def test_token_file_read_again_when_it_changes(tls_manager, env_clean, tmp_path):
    m = tls_manager
    tf = tmp_path / "token"
    tf.write_text("agent-token")
    with fusebox.Manager(m.address, ca_file=m.ca_file, token_file=str(tf), server_name=MANAGER_NAME) as mgr:
        mgr.list()
        tf.write_text("rotated-away")  # another size: read again
        with pytest.raises(fusebox.UnauthenticatedError):
            mgr.list()
        tf.write_text("agent-token")
        mgr.list()


def test_policy_denials(tls_manager, env_clean, tmp_path):
    m = tls_manager
    opts = dict(ca_file=m.ca_file, server_name=MANAGER_NAME)
    with pytest.raises(fusebox.PermissionDeniedError) as ei:
        fusebox.Sandbox.allocate(m.address, token_file=m.token_file, egress=["pypi.org:443", "evil.example:443"], **opts)
    assert ei.value.destinations == ["evil.example:443"] and ei.value.template is None
    assert not isinstance(ei.value, fusebox.LeaseError)
    tf = tmp_path / "limited"
    tf.write_text("limited-token")
    with pytest.raises(fusebox.PermissionDeniedError) as ei:
        fusebox.Sandbox.allocate(m.address, token_file=str(tf), **opts)
    assert ei.value.template == "default" and "others/limited" in str(ei.value)
