"""Parsing of the addresses fusebox uses: ``unix:///absolute/path`` and ``tcp://host:port``."""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from typing import Tuple

from .errors import BadAddressError, UnavailableError


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


def refuse_link(path: str, what: str) -> None:
    """Raises UnavailableError if ``path`` is a symbolic link. A missing socket is left to the
    first call to report."""
    try:
        st = os.lstat(path)
    except OSError:
        return
    if stat.S_ISLNK(st.st_mode):
        raise UnavailableError(f"{what} {path} is a symbolic link: fusebox dials a socket only by its own name")


def pin_socket(path: str, what: str) -> Tuple[str, int]:
    """Opens the unix socket at ``path`` without following a link (O_PATH, O_NOFOLLOW) and
    returns a grpcio target naming that very socket (/proc/self/fd/N) with the descriptor,
    which must stay open as long as the channel dials (close it when the channel is gone): a
    link put at ``path`` later, or before, is never followed. Linux only."""
    try:
        fd = os.open(path, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as e:
        raise UnavailableError(f"{what} {path}: {e.strerror}") from e
    try:
        mode = os.fstat(fd).st_mode
    except OSError as e:
        os.close(fd)
        raise UnavailableError(f"{what} {path}: {e.strerror}") from e
    if not stat.S_ISSOCK(mode):
        os.close(fd)
        kind = "a symbolic link" if stat.S_ISLNK(mode) else "not a unix socket"
        raise UnavailableError(f"{what} {path} is {kind}: fusebox dials a socket only by its own name")
    return f"unix:///proc/self/fd/{fd}", fd
