"""Unit tests that need no sandbox: packing, addresses, keys and pinning, error mapping."""

from __future__ import annotations

import datetime
import threading
import time
from typing import Optional

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from cryptography.x509.oid import NameOID

import fusebox
from fusebox import _address, _core
from fusebox._pack import encoded_size, pack, prune_mkdirs
from fusebox._proto.sandbox.v1 import sandbox_pb2
from fusebox.errors import from_rpc
from fusebox.keys import AgentKey, KeysAhead, check_public_key, pinned_root


@pytest.mark.parametrize("dirs,want", [
    (["a/b/c", "a/b/d", "a/b"], ["a/b/c", "a/b/d"]),
    (["a/b", "a/b-c", "a/b/c"], ["a/b-c", "a/b/c"]),
    (["x/", "./x", "x", ".", "/"], ["x"]),
    ([], []),
    (["b", "a"], ["a", "b"]),
])
def test_prune_mkdirs(dirs, want):
    assert prune_mkdirs(dirs) == want


def fw(path: str, n: int) -> sandbox_pb2.FileWrite:
    return sandbox_pb2.FileWrite(path=path, data=b"x" * n)


def test_pack_limits_and_completeness():
    limit = 1 << 20
    files = [fw(f"f{i}", (i * 7919) % 300_000) for i in range(60)] + [fw("huge", 2 << 20)]
    batches, streamed = pack(files, ["d1", "d2"], [sandbox_pb2.SymlinkSpec(target="f1", path="l")], limit)
    assert [f.path for f in streamed] == ["huge"]
    seen = [f.path for b in batches for f in b.files]
    assert sorted(seen) == sorted(f.path for f in files if f.path != "huge")
    for b in batches:
        assert b.ByteSize() <= limit, b.ByteSize()
    assert list(batches[0].mkdirs) == ["d1", "d2"] and len(batches[-1].symlinks) == 1
    assert sum(len(b.symlinks) for b in batches) == 1 and sum(len(b.mkdirs) for b in batches) == 2


def test_pack_3000_small_files_in_4_batches():
    files = [fw(f"src/d{i % 30}/f{i}.txt", 4096) for i in range(3000)]
    batches, streamed = pack(files, [], [], fusebox.DEFAULT_BATCH_BYTES)
    assert len(batches) == 4 and not streamed
    assert all(b.ByteSize() <= fusebox.DEFAULT_BATCH_BYTES for b in batches)


def test_pack_streams_large_files_from_their_own_bytes():
    big = b"b" * (2 << 20)
    files = _core.file_writes({"small": b"s" * 100, "big": big, "text": "t"})
    batches, streamed = pack(files, [], [], 1 << 20)
    assert len(streamed) == 1 and streamed[0].path == "big"
    assert streamed[0].data is big, "a streamed file's bytes are not copied"
    assert len(batches) == 1 and {f.path: f.data for f in batches[0].files} == {"small": b"s" * 100, "text": b"t"}
    assert batches[0].ByteSize() <= 1 << 20


def test_pack_only_dirs():
    batches, streamed = pack([], ["a"], [], 100)
    assert len(batches) == 1 and list(batches[0].mkdirs) == ["a"] and not streamed


def test_encoded_size_bounds_real_size():
    for n, p in [(0, "a"), (1, "é/ü"), (4096, "x" * 200), (100000, "deep/" * 20)]:
        f = sandbox_pb2.FileWrite(path=p, data=b"\0" * n, mode=0o755)
        assert sandbox_pb2.WriteFilesRequest(files=[f]).ByteSize() <= encoded_size(f)


@pytest.mark.parametrize("s,network,target", [
    ("unix:///run/fusebox/manager.sock", "unix", "unix:///run/fusebox/manager.sock"),
    ("unix:///a//b/../c.sock", "unix", "unix:///a/c.sock"),
    ("tcp://127.0.0.1:9090", "tcp", "127.0.0.1:9090"),
    ("tcp://[::1]:9090", "tcp", "[::1]:9090"),
])
def test_address_parse(s, network, target):
    a = _address.parse(s)
    assert (a.network, a.grpc_target) == (network, target)


@pytest.mark.parametrize("s", ["", "unix://rel", "tcp://host", "tcp://:1", "tcp://h:0", "tcp://h:70000", "http://h:1",
                               "/run/x.sock", "unix:///a\x00b", None])
def test_address_refused(s):
    with pytest.raises(fusebox.BadAddressError):
        _address.parse(s)  # type: ignore[arg-type]


def self_signed(key, names=(fusebox.SERVER_NAME,)) -> bytes:
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "t")])
    now = datetime.datetime.now(datetime.timezone.utc)
    b = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key()).serial_number(1)
         .not_valid_before(now - datetime.timedelta(hours=1)).not_valid_after(now + datetime.timedelta(days=1)))
    if names:
        b = b.add_extension(x509.SubjectAlternativeName([x509.DNSName(n) for n in names]), critical=False)
    from cryptography.hazmat.primitives import hashes

    algo = None if isinstance(key, ed25519.Ed25519PrivateKey) else hashes.SHA256()
    return b.sign(key, algo).public_bytes(serialization.Encoding.DER)


def spki(key) -> bytes:
    return key.public_key().public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)


@pytest.mark.parametrize("make", [ed25519.Ed25519PrivateKey.generate, lambda: ec.generate_private_key(ec.SECP256R1())])
def test_pinned_root_accepts_matching(make):
    k = make()
    pem = pinned_root(self_signed(k), spki(k))
    assert pem.startswith(b"-----BEGIN CERTIFICATE-----")


def test_pinned_root_refusals():
    k, other = ed25519.Ed25519PrivateKey.generate(), ed25519.Ed25519PrivateKey.generate()
    cases = [
        (self_signed(other), spki(k), "not sandbox_public_key"),
        (self_signed(k, names=()), spki(k), "does not name"),
        (self_signed(k, names=("evil.example",)), spki(k), "does not name"),
        (b"garbage", spki(k), "not a DER X.509"),
        (b"", spki(k), "no sandbox certificate"),
        (self_signed(k), b"", "empty"),
        (self_signed(k), b"junk", "not the DER SubjectPublicKeyInfo"),
    ]
    for cert, key, msg in cases:
        with pytest.raises(fusebox.PinningError, match=msg):
            pinned_root(cert, key)


def rich_certificate(key, names, critical: bool) -> bytes:
    """A certificate with more than the sandbox's: several extensions, a critical SAN, IP names."""
    import ipaddress

    from cryptography.hazmat.primitives import hashes

    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "t"), x509.NameAttribute(NameOID.ORGANIZATION_NAME, "o")])
    now = datetime.datetime.now(datetime.timezone.utc)
    b = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
         .serial_number(x509.random_serial_number()).not_valid_before(now).not_valid_after(now + datetime.timedelta(days=1))
         .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
         .add_extension(x509.KeyUsage(True, False, False, False, False, True, False, False, False), critical=True)
         .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("10.0.0.1"))]
                                                    + [x509.DNSName(n) for n in names]), critical=critical)
         .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False))
    algo = None if isinstance(key, ed25519.Ed25519PrivateKey) else hashes.SHA256()
    return b.sign(key, algo).public_bytes(serialization.Encoding.DER)


def test_certificate_facts_agree_with_cryptography():
    """The SDK's DER reader finds the key and the names that a full X.509 parser finds, and
    pinned_root's PEM is the certificate's own."""
    from fusebox import _der

    for make in (ed25519.Ed25519PrivateKey.generate, lambda: ec.generate_private_key(ec.SECP256R1())):
        for names, critical in [((fusebox.SERVER_NAME,), False), ((fusebox.SERVER_NAME, "b.example"), True), ((), False)]:
            k = make()
            for der in (self_signed(k, names=names), rich_certificate(k, names, critical)):
                c = x509.load_der_x509_certificate(der)
                got_spki, got_names = _der.certificate_facts(der)
                assert got_spki == spki(k) == c.public_key().public_bytes(serialization.Encoding.DER,
                                                                           serialization.PublicFormat.SubjectPublicKeyInfo)
                try:
                    want = c.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(x509.DNSName)
                except x509.ExtensionNotFound:
                    want = []
                assert got_names == want
                if fusebox.SERVER_NAME in names:
                    assert pinned_root(der, spki(k)) == c.public_bytes(serialization.Encoding.PEM)


def test_certificate_facts_mutations():
    """Truncated, extended or corrupted certificates raise only DERError; where the reader
    still accepts one, a full X.509 parser that accepts it finds the same key and names."""
    import random
    import warnings

    from fusebox import _der

    k = ed25519.Ed25519PrivateKey.generate()
    der = self_signed(k)
    rnd = random.Random(7)
    variants = [der[:n] for n in range(len(der))] + [der + b"\0", der + der]
    for _ in range(3000):
        b = bytearray(der)
        for _ in range(rnd.randint(1, 3)):
            b[rnd.randrange(len(b))] = rnd.randrange(256)
        variants.append(bytes(b))
    accepted = 0
    for v in variants:
        try:
            got = _der.certificate_facts(v)
        except _der.DERError:
            continue
        accepted += 1
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # a corrupted serial number is negative
                c = x509.load_der_x509_certificate(v)
            want_spki = c.public_key().public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
            want_names = c.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(x509.DNSName)
        except Exception:  # the full parser refuses it: the TLS stack would refuse the root too
            continue
        assert got == (want_spki, want_names), v.hex()
    assert accepted > 0


def test_keys_ahead():
    ka = KeysAhead()
    a, b = ka.take(), ka.take()  # none waiting: made on the spot, fresh each time
    assert isinstance(a, AgentKey) and a.public_key != b.public_key
    ka.prepare()
    ka.prepare()  # one at a time
    end = time.monotonic() + 10
    while ka._next is None:
        assert time.monotonic() < end
        time.sleep(0.005)
    made = ka._next
    assert made._cert_pem is not None and made._key_pem is not None
    assert ka.take() is made and ka._next is None
    assert ka.take() is not made  # handed out once
    ka.prepare()
    ka.close()
    time.sleep(0.2)
    assert ka._next is None and not ka._making
    ka.prepare()
    assert not ka._making  # closed: nothing more is made


def test_manager_makes_keys_ahead_unless_told():
    m = fusebox.Manager("unix:///nonexistent/manager.sock")
    try:
        end = time.monotonic() + 10
        while m._keys._next is None:  # made by the keeper's thread, started with the Manager
            assert time.monotonic() < end
            time.sleep(0.005)
    finally:
        m.close()
    assert m._keys._next is None  # dropped
    one = fusebox.Manager("unix:///nonexistent/manager.sock", _ahead=False)
    try:
        time.sleep(0.1)
        assert not one._ahead and one._keys._next is None and one._keeper._thread is None
    finally:
        one.close()


class _Renewals:
    """A fake manager for the keeper: Renew futures answered at once, except for hung ids,
    whose answer never comes (until unhang)."""

    def __init__(self, hung=()):
        from fusebox._proto.manager.v1 import manager_pb2
        self.pb, self.hung, self.calls, self.lock = manager_pb2, set(hung), [], threading.Lock()
        self.unhung = threading.Event()
        self._rpc = self
        self.Renew = self
        self._keys = KeysAhead()

    def future(self, req, timeout):
        with self.lock:
            self.calls.append((req.sandbox_id, threading.current_thread().name))
        resp = self.pb.RenewResponse()
        resp.lease_expires.FromDatetime(datetime.datetime(2030, 1, 1))
        return _Done(resp, self.unhung if req.sandbox_id in self.hung else None)

    def _err(self, e, doing):
        return fusebox.FuseboxError(doing)

    def count(self, sid):
        with self.lock:
            return sum(1 for c in self.calls if c[0] == sid)


def _until(cond, what: str, deadline: float = 10.0) -> None:
    end = time.monotonic() + deadline
    while not cond():
        assert time.monotonic() < end, what
        time.sleep(0.005)


class _Done:
    def __init__(self, resp, hung: Optional[threading.Event]):
        self.resp, self.hung = resp, hung

    def result(self):
        if self.hung is not None:
            self.hung.wait()  # a keeper that waited for answers would stop here
        return self.resp

    def add_done_callback(self, fn):
        if self.hung is None:
            fn(self)


def test_keeper_renews_every_lease_on_one_thread():
    from fusebox._sync import _Keeper, _Lease
    fake = _Renewals(hung={"hung"})
    k = _Keeper(fake)
    leases = [_Lease(k, f"s{i}", "tok", None, 0.05) for i in range(40)] + [_Lease(k, "hung", "tok", None, 0.05)]
    for l in leases:
        k.add(l)
    # A renewal that never answers holds up no other lease.
    _until(lambda: all(fake.count(l.id) >= 3 for l in leases), "every lease renewed three times")
    assert {name for _, name in fake.calls} == {"fusebox-keeper"}
    assert leases[0].expires == datetime.datetime(2030, 1, 1, tzinfo=datetime.timezone.utc) and leases[0].error is None
    leases[1].stop()
    stopped_at, other = fake.count("s1"), fake.count("s0")
    _until(lambda: fake.count("s0") >= other + 3, "the other leases still renewed")
    assert fake.count("s1") <= stopped_at + 1  # at most one already on its way
    k.want_key(0)
    _until(lambda: fake._keys._next is not None, "a key made on the keeper's thread")
    thread = k._thread
    k.close()
    thread.join(5)
    assert not thread.is_alive()
    fake.unhung.set()


def test_keeper_thread_ends_when_idle():
    from fusebox._sync import _Keeper, _Lease
    fake = _Renewals()
    k = _Keeper(fake)
    k.IDLE_EXIT = 0.1
    l = _Lease(k, "s", "tok", None, 0.02)
    k.add(l)
    thread = k._thread
    _until(lambda: fake.count("s") >= 2, "renewed")
    l.stop()
    thread.join(5)
    assert not thread.is_alive() and k._thread is None
    n = fake.count("s")
    k.add(_Lease(k, "t", "tok", None, 0.02))  # a new job starts a new thread
    _until(lambda: fake.count("t") >= 2, "renewed by a new thread")
    assert fake.count("s") == n
    k.close()


def test_check_public_key_types():
    check_public_key(spki(ec.generate_private_key(ec.SECP256R1())))
    with pytest.raises(fusebox.PinningError, match="want Ed25519 or ECDSA P-256"):
        check_public_key(spki(ec.generate_private_key(ec.SECP384R1())))
    with pytest.raises(fusebox.PinningError):
        check_public_key(spki(rsa.generate_private_key(65537, 2048)))


def test_agent_key():
    for kind in ("ed25519", "p256"):
        k = AgentKey.generate(kind)  # type: ignore[arg-type]
        key_pem, cert_pem = k._credentials()
        cert = x509.load_pem_x509_certificate(cert_pem)
        assert cert.public_key().public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo) == k.public_key
        # The hand-made encodings are cryptography's own.
        assert key_pem == k._key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                               serialization.NoEncryption())
        assert serialization.load_pem_private_key(key_pem, None).public_key().public_bytes(
            serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo) == k.public_key
        check_public_key(k.public_key)
        assert b"PRIVATE" not in repr(k).encode()
    with pytest.raises(fusebox.InvalidArgumentError):
        AgentKey.generate("rsa")  # type: ignore[arg-type]
    with pytest.raises(fusebox.InvalidArgumentError):
        AgentKey(ec.generate_private_key(ec.SECP384R1()))


class FakeRpcError(grpc.RpcError):
    def __init__(self, code, details):
        self._c, self._d = code, details

    def code(self):
        return self._c

    def details(self):
        return self._d


@pytest.mark.parametrize("code,service,cls", [
    (grpc.StatusCode.PERMISSION_DENIED, "sandbox", fusebox.PathEscapeError),
    (grpc.StatusCode.PERMISSION_DENIED, "manager", fusebox.PermissionDeniedError),
    (grpc.StatusCode.PERMISSION_DENIED, "lease", fusebox.LeaseError),
    (grpc.StatusCode.UNAUTHENTICATED, "manager", fusebox.UnauthenticatedError),
    (grpc.StatusCode.NOT_FOUND, "sandbox", fusebox.NotFoundError),
    (grpc.StatusCode.INVALID_ARGUMENT, "manager", fusebox.InvalidArgumentError),
    (grpc.StatusCode.RESOURCE_EXHAUSTED, "sandbox", fusebox.LimitError),
    (grpc.StatusCode.ALREADY_EXISTS, "sandbox", fusebox.AlreadyExistsError),
    (grpc.StatusCode.FAILED_PRECONDITION, "sandbox", fusebox.FailedPreconditionError),
    (grpc.StatusCode.FAILED_PRECONDITION, "manager", fusebox.FailedPreconditionError),
    (grpc.StatusCode.FAILED_PRECONDITION, "lease", fusebox.LeaseError),
    (grpc.StatusCode.DEADLINE_EXCEEDED, "sandbox", fusebox.DeadlineExceededError),
    (grpc.StatusCode.UNAVAILABLE, "manager", fusebox.UnavailableError),
    (grpc.StatusCode.CANCELLED, "sandbox", fusebox.CancelledError),
    (grpc.StatusCode.INTERNAL, "sandbox", fusebox.FuseboxError),
])
def test_error_mapping(code, service, cls):
    e = from_rpc(FakeRpcError(code, "the reason"), "doing x", service, "try y")
    assert type(e) is cls and e.code == code and e.details == "the reason"
    assert str(e) == f"doing x: {code.name}: the reason (try y)"


def test_handshake_failure_is_pinning_error():
    e = from_rpc(FakeRpcError(grpc.StatusCode.UNAVAILABLE, "Ssl handshake failed: SSL_ERROR_SSL: certificate verify failed"), "exec")
    assert isinstance(e, fusebox.PinningError)


def test_exec_request():
    r = _core.exec_request("export A=1", "", {"B": "2"}, ["C"], "in", 1.5, "g", 3)
    assert r.script == "export A=1" and dict(r.env) == {"B": "2"} and list(r.unset_env) == ["C"]
    assert r.stdin == b"in" and r.timeout.ToNanoseconds() == 1_500_000_000 and (r.task_group_id, r.logical_order) == ("g", 3)
    assert list(_core.exec_request(["ls", "-l"], "", None, None, None, None).argv) == ["ls", "-l"]
    for bad in ("", "  ", [], [1], ["a", None]):
        with pytest.raises(fusebox.InvalidArgumentError):
            _core.exec_request(bad, "", None, None, None, None)  # type: ignore[arg-type]


def test_seconds():
    assert _core.seconds(datetime.timedelta(minutes=1), "t") == 60.0
    assert _core.seconds(None, "t") is None
    for bad in (-1, "10", True):
        with pytest.raises(fusebox.InvalidArgumentError):
            _core.seconds(bad, "t")  # type: ignore[arg-type]


def test_file_writes_input():
    fs = _core.file_writes({"a": "text", "b": b"\0"})
    assert [(f.path, f.data) for f in fs] == [("a", b"text"), ("b", b"\0")]
    fs = _core.file_writes([fusebox.File("x", b"1", 0o755), ("y", b"2")])
    assert [(f.path, f.mode) for f in fs] == [("x", 0o755), ("y", 0)]
    for bad in ([("", b"x")], [("a", 3)], [42]):
        with pytest.raises(fusebox.InvalidArgumentError):
            _core.file_writes(bad)  # type: ignore[arg-type]


def test_parse_duration():
    from fusebox.__main__ import parse_duration

    assert parse_duration("1m30s") == 90 and parse_duration("500ms") == 0.5 and parse_duration("2.5") == 2.5
    import argparse

    for bad in ("1x", "s", "-1", "1m junk"):
        with pytest.raises(argparse.ArgumentTypeError):
            parse_duration(bad)


def test_start_connecting_dials_before_any_call(tmp_path):
    """The sync channel's connection starts at start_connecting, with no call made."""
    import socket

    path = str(tmp_path / "s.sock")
    ln = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    ln.bind(path)
    ln.listen(1)
    ln.settimeout(10)
    ch = grpc.insecure_channel("unix://" + path)
    try:
        _core.start_connecting(ch)
        conn, _ = ln.accept()
        conn.close()
    finally:
        ch.close()
        ln.close()


def test_manager_connection_settings(tmp_path, monkeypatch):
    for k in ("FUSEBOX_MANAGER", "FUSEBOX_CA_FILE", "FUSEBOX_TOKEN_FILE", "FUSEBOX_TLS_SERVER_NAME"):
        monkeypatch.delenv(k, raising=False)
    # A tcp:// manager without TLS is refused before any connection.
    with pytest.raises(fusebox.InvalidArgumentError, match="serves TLS only"):
        _core.ManagerConnection("tcp://127.0.0.1:9")
    # A unix socket manager needs nothing, and sends no token (none is read).
    c = _core.ManagerConnection("unix:///run/x.sock", token_file=str(tmp_path / "missing"))
    assert c.credentials is None and c.options == [] and "fusebox local up" in c.hint()
    ca = tmp_path / "ca.crt"
    ca.write_bytes(b"not a certificate")
    with pytest.raises(fusebox.InvalidArgumentError, match="holds no PEM certificate"):
        _core.ManagerConnection("tcp://127.0.0.1:9", ca_file=str(ca))
    ca.write_bytes(b"-----BEGIN CERTIFICATE-----\nMA==\n-----END CERTIFICATE-----\n")
    with pytest.raises(fusebox.InvalidArgumentError, match="token file"):
        _core.ManagerConnection("tcp://127.0.0.1:9", ca_file=str(ca), token_file=str(tmp_path / "missing"))
    tok = tmp_path / "token"
    tok.write_text("")
    with pytest.raises(fusebox.InvalidArgumentError, match="is empty"):
        _core.ManagerConnection("tcp://127.0.0.1:9", ca_file=str(ca), token_file=str(tok))
    # The CLI's environment variables, when the options are not given.
    tok.write_text(" t0k \n")
    monkeypatch.setenv("FUSEBOX_MANAGER", "tcp://127.0.0.1:9")
    monkeypatch.setenv("FUSEBOX_CA_FILE", str(ca))
    monkeypatch.setenv("FUSEBOX_TOKEN_FILE", str(tok))
    monkeypatch.setenv("FUSEBOX_TLS_SERVER_NAME", "m.test")
    c = _core.ManagerConnection(None)
    assert c.address == "tcp://127.0.0.1:9" and c.credentials is not None
    assert c.options == [("grpc.ssl_target_name_override", "m.test")] and "reachable, with its CA" in c.hint()
    # "" turns an environment variable off.
    with pytest.raises(fusebox.InvalidArgumentError, match="serves TLS only"):
        _core.ManagerConnection(None, ca_file="")


def test_token_file_read_again_when_changed(tmp_path):
    p = tmp_path / "token"
    p.write_text("one\n")
    tf = _core.TokenFile(str(p))
    got = []
    tf(None, lambda md, err: got.append((md, err)))
    p.write_text("second")
    tf(None, lambda md, err: got.append((md, err)))
    p.unlink()
    tf(None, lambda md, err: got.append((md, err)))
    assert got[0] == ((("authorization", "Bearer one"),), None) and got[1] == ((("authorization", "Bearer second"),), None)
    assert got[2][0] == () and isinstance(got[2][1], fusebox.InvalidArgumentError)


def test_sockets_are_dialed_without_following_links(tmp_path):
    import os
    import socket

    sock = tmp_path / "data.sock"
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(str(sock))
    srv.listen(1)
    link = tmp_path / "link.sock"
    link.symlink_to(sock)
    plain = tmp_path / "file"
    plain.write_text("x")
    try:
        target, fd = _address.pin_socket(str(sock), "sandbox endpoint")
        assert target == f"unix:///proc/self/fd/{fd}"
        # The pinned name reaches the socket that was found at the name.
        c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        c.connect(target[len("unix://"):])
        c.close()
        os.close(fd)
        for p, want in ((link, "symbolic link"), (plain, "not a unix socket"), (tmp_path / "none", "No such file")):
            with pytest.raises(fusebox.UnavailableError, match=want):
                _address.pin_socket(str(p), "sandbox endpoint")
        # The manager's socket: a link is refused when the Manager is made.
        with pytest.raises(fusebox.UnavailableError, match="symbolic link"):
            fusebox.Manager("unix://" + str(link))
        fusebox.Manager("unix://" + str(sock)).close()
    finally:
        srv.close()
