"""Parsing of the addresses fusebox uses: ``unix:///absolute/path`` and ``tcp://host:port``."""

from __future__ import annotations

from dataclasses import dataclass

from .errors import BadAddressError


@dataclass(frozen=True)
class Address:
    """A parsed endpoint: ``network`` is "unix" or "tcp"; ``address`` a path or host:port."""

    network: str
    address: str

    def __str__(self) -> str:
        return f"{self.network}://{self.address}"

    @property
    def grpc_target(self) -> str:
        """The address as a grpcio target."""
        if self.network == "unix":
            return "unix://" + self.address
        return self.address


def parse(s: str, what: str = "address") -> Address:
    """Parses ``unix:///absolute/path`` or ``tcp://host:port``; anything else raises BadAddressError."""
    if not isinstance(s, str):
        raise BadAddressError(f"{what}: want a string like unix:///run/fusebox/manager.sock or tcp://host:port, got {type(s).__name__}")
    if s.startswith("unix://"):
        p = s[len("unix://"):]
        if not p.startswith("/") or "\x00" in p:
            raise BadAddressError(f"{what} {s!r} has no absolute socket path: write unix:///absolute/path")
        return Address("unix", _clean(p))
    if s.startswith("tcp://"):
        hp = s[len("tcp://"):]
        host, sep, port = hp.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536 or "/" in hp:
            raise BadAddressError(f"{what} {s!r} is not tcp://host:port")
        return Address("tcp", hp)
    raise BadAddressError(f"{what} {s!r} must be unix:///absolute/path or tcp://host:port")


def _clean(p: str) -> str:
    import posixpath

    return posixpath.normpath(p) if p != "/" else p
