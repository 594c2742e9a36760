"""A fake manager and a fake sandbox served by grpcio in the test process, on unix sockets, for
tests of what the SDK does with answers a real manager or sandbox gives rarely or slowly (a
policy denial, a command reaching the sandbox's default timeout of ten minutes).

The SDK talks to them through its real generated clients, as to the real ones: the manager in
plaintext on its unix socket, the sandbox over TLS 1.3 pinned to the key the manager names.
Each behaviour is what the Go servers do (manager/service.go's toStatus and the policy's
messages; the sandbox's ExecExit of a timed-out command).
"""

from __future__ import annotations

import concurrent.futures
import datetime
import threading
from pathlib import Path
from typing import Callable, Iterator, List, Optional, Tuple

import grpc
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519
from cryptography.x509.oid import NameOID

from fusebox import SERVER_NAME
from fusebox._proto.manager.v1 import manager_pb2, manager_pb2_grpc
from fusebox._proto.sandbox.v1 import sandbox_pb2, sandbox_pb2_grpc

Abort = Tuple[grpc.StatusCode, str]


def sandbox_identity() -> Tuple[bytes, bytes, bytes]:
    """A sandbox's Ed25519 key and self-signed certificate for SERVER_NAME: (key PEM,
    certificate DER, SubjectPublicKeyInfo DER)."""
    key = ed25519.Ed25519PrivateKey.generate()
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "fake sandbox")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key()).serial_number(1)
            .not_valid_before(now - datetime.timedelta(hours=1)).not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(SERVER_NAME)]), critical=False)
            .sign(key, None))
    key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    spki = key.public_key().public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return key_pem, cert.public_bytes(serialization.Encoding.DER), spki


def timed_out_exec(req: sandbox_pb2.ExecRequest) -> Iterator[sandbox_pb2.ExecEvent]:
    """What the sandbox answers for a command killed at its timeout after printing: its
    output so far, then an exit with timed_out (the default timeout is 10 minutes)."""
    yield sandbox_pb2.ExecEvent(output=sandbox_pb2.ExecOutput(stream=sandbox_pb2.STREAM_KIND_STDOUT, data=b"partial "))
    yield sandbox_pb2.ExecEvent(output=sandbox_pb2.ExecOutput(stream=sandbox_pb2.STREAM_KIND_STDERR, data=b"warn\n"))
    yield sandbox_pb2.ExecEvent(output=sandbox_pb2.ExecOutput(stream=sandbox_pb2.STREAM_KIND_STDOUT, data=b"output\n"))
    x = sandbox_pb2.ExecExit(exit_code=137, signal="SIGKILL", timed_out=True)
    x.duration.FromSeconds(600)
    yield sandbox_pb2.ExecEvent(exit=x)


def exited_exec(req: sandbox_pb2.ExecRequest) -> Iterator[sandbox_pb2.ExecEvent]:
    """A command that prints on both streams and exits 0."""
    for stream, data in ((sandbox_pb2.STREAM_KIND_STDOUT, b"one "), (sandbox_pb2.STREAM_KIND_STDERR, b"two\n"),
                         (sandbox_pb2.STREAM_KIND_STDOUT, b"three\n")):
        yield sandbox_pb2.ExecEvent(output=sandbox_pb2.ExecOutput(stream=stream, data=data))
    yield sandbox_pb2.ExecEvent(exit=sandbox_pb2.ExecExit(exit_code=0))


class FakeSandbox(sandbox_pb2_grpc.SandboxServicer):
    """A sandbox whose Exec answers with exec(request) (default: timed_out_exec)."""

    def __init__(self) -> None:
        self.exec: Callable[[sandbox_pb2.ExecRequest], Iterator[sandbox_pb2.ExecEvent]] = timed_out_exec
        self.requests: List[sandbox_pb2.ExecRequest] = []

    def Exec(self, request, context):
        self.requests.append(request)
        yield from self.exec(request)


class FakeManager(manager_pb2_grpc.ManagerServicer):
    """A manager that hands out the one fake sandbox, or aborts each call as set."""

    def __init__(self, endpoint: str, cert_der: bytes, spki: bytes) -> None:
        self.endpoint, self.cert_der, self.spki = endpoint, cert_der, spki
        self.allocate_abort: Optional[Abort] = None
        self.renew_abort: Optional[Abort] = None
        self.release_abort: Optional[Abort] = None
        self.lock = threading.Lock()
        self.released: List[str] = []  # guarded by lock
        self.allocated = 0  # guarded by lock
        self.unary = 0  # Allocate calls, guarded by lock

    def _answer(self, context) -> manager_pb2.AllocateResponse:
        if self.allocate_abort is not None:
            context.abort(*self.allocate_abort)
        with self.lock:
            self.allocated += 1
            sid = f"fbx-{self.allocated:012d}"
        r = manager_pb2.AllocateResponse(sandbox_id=sid, endpoint=self.endpoint, sandbox_public_key=self.spki,
                                         sandbox_certificate=self.cert_der, lease_token="token-" + sid)
        r.lease_expires.FromDatetime(datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(minutes=10))
        return r

    def Allocate(self, request, context):
        with self.lock:
            self.unary += 1
        return self._answer(context)

    def AllocateStream(self, request, context):
        """As a manager of this release answers it, for the SDKs of earlier releases: the
        answer alone."""
        yield manager_pb2.AllocateEvent(allocated=self._answer(context))

    def Renew(self, request, context):
        if self.renew_abort is not None:
            context.abort(*self.renew_abort)
        r = manager_pb2.RenewResponse()
        r.lease_expires.FromDatetime(datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(minutes=10))
        return r

    def Release(self, request, context):
        if self.release_abort is not None:
            context.abort(*self.release_abort)
        with self.lock:
            self.released.append(request.sandbox_id)
        return manager_pb2.ReleaseResponse()

    def List(self, request, context):
        return manager_pb2.ListResponse()


class FakeCluster:
    """A FakeManager on a plaintext unix socket and a FakeSandbox on a TLS unix socket."""

    def __init__(self, directory: Path) -> None:
        key_pem, cert_der, spki = sandbox_identity()
        cert_pem = x509.load_der_x509_certificate(cert_der).public_bytes(serialization.Encoding.PEM)
        sandbox_sock, manager_sock = directory / "sandbox.sock", directory / "manager.sock"
        self.sandbox = FakeSandbox()
        self.manager = FakeManager("unix://" + str(sandbox_sock), cert_der, spki)
        self.address = "unix://" + str(manager_sock)
        self._server = grpc.server(concurrent.futures.ThreadPoolExecutor(max_workers=8))
        sandbox_pb2_grpc.add_SandboxServicer_to_server(self.sandbox, self._server)
        manager_pb2_grpc.add_ManagerServicer_to_server(self.manager, self._server)
        self._server.add_secure_port("unix:" + str(sandbox_sock), grpc.ssl_server_credentials([(key_pem, cert_pem)]))
        self._server.add_insecure_port("unix:" + str(manager_sock))
        self._server.start()

    def stop(self) -> None:
        self._server.stop(None).wait()
