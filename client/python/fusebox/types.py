"""Plain data types shared by the sync and asyncio APIs."""

from __future__ import annotations

import datetime
from dataclasses import dataclass, field
from typing import Dict, Iterator, List, Literal, Optional, Sequence, Union

from ._proto.manager.v1 import manager_pb2
from ._proto.sandbox.v1 import process_pb2, sandbox_pb2

#: The largest WriteFiles or ReadFiles batch the SDK builds: gRPC's default 4 MiB message
#: limit minus room for framing and metadata (as the Go SDK).
DEFAULT_BATCH_BYTES = int(3.5 * (1 << 20))
#: The size of one WriteFileStream message.
STREAM_CHUNK = 2 << 20

#: A command: a string runs as a bash script (its exported variables and final working
#: directory persist for later commands), a sequence of strings as argv.
CommandLike = Union[str, Sequence[str]]


@dataclass
class OutputChunk:
    """A piece of a command's output as it streamed: ``stream`` is "stdout" or "stderr"."""

    stream: Literal["stdout", "stderr"]
    data: bytes


@dataclass
class ExecResult:
    """How a command ended.

    ``exit_code`` is the exit status, or 128 + the signal number; ``signal`` the signal's name
    ("SIGKILL") when one ended it. ``duration`` is the process's own run time inside the
    sandbox, in seconds. ``stdout`` and ``stderr`` hold the output when it was collected
    (not when it went to callbacks).
    """

    exit_code: int
    signal: str = ""
    duration: float = 0.0
    truncated: bool = False
    timed_out: bool = False
    state_recorded: bool = False
    stdout: bytes = b""
    stderr: bytes = b""

    @property
    def ok(self) -> bool:
        """Whether the command exited with status 0."""
        return self.exit_code == 0

    @property
    def text(self) -> str:
        """Standard output decoded as UTF-8 (undecodable bytes replaced)."""
        return self.stdout.decode("utf-8", "replace")


@dataclass
class File:
    """A file to write; ``mode`` 0 means 0644."""

    path: str
    data: bytes
    mode: int = 0


@dataclass
class Symlink:
    """A symlink to create at ``path``; ``target`` must resolve inside the workspace."""

    target: str
    path: str


@dataclass
class WriteStats:
    """What a write did: counts, bytes, and the WriteFiles and WriteFileStream RPCs it took."""

    files: int = 0
    dirs: int = 0
    symlinks: int = 0
    bytes: int = 0
    batches: int = 0
    streamed: int = 0


@dataclass
class ReadStats:
    """What a read fetched: its plan's batches and streams, bytes, and what matched nothing."""

    missing: List[str] = field(default_factory=list)
    batches: int = 0
    streamed: int = 0
    bytes: int = 0


class Files(Dict[str, bytes]):
    """The files a read returned, path to contents, with the read's :class:`ReadStats` as ``stats``."""

    stats: ReadStats

    def __init__(self, stats: ReadStats):
        super().__init__()
        self.stats = stats


FileType = Literal["file", "dir", "symlink", "other", ""]
_TYPES = {sandbox_pb2.FILE_TYPE_FILE: "file", sandbox_pb2.FILE_TYPE_DIR: "dir",
          sandbox_pb2.FILE_TYPE_SYMLINK: "symlink", sandbox_pb2.FILE_TYPE_OTHER: "other"}
_TYPE_CODES = {v: k for k, v in _TYPES.items()}


@dataclass
class FileInfo:
    """One entry of the workspace: ``type`` is "file", "dir", "symlink" or "other"."""

    path: str
    type: FileType
    size: int
    mode: int
    modified: Optional[datetime.datetime]
    symlink_target: str = ""

    @classmethod
    def _from_proto(cls, m: sandbox_pb2.FileInfo) -> "FileInfo":
        mod = m.modified.ToDatetime(tzinfo=datetime.timezone.utc) if m.HasField("modified") else None
        return cls(path=m.path, type=_TYPES.get(m.type, ""), size=m.size, mode=m.mode, modified=mod,  # type: ignore[arg-type]
                   symlink_target=m.symlink_target)


@dataclass
class Listing:
    """Entries of a list or find; ``truncated`` says the server's limit cut it short."""

    entries: List[FileInfo]
    truncated: bool = False

    def __iter__(self) -> Iterator[FileInfo]:
        return iter(self.entries)

    def __len__(self) -> int:
        return len(self.entries)


@dataclass
class GrepMatch:
    """A matching line: its file, 1-based line number and text."""

    path: str
    line: int
    text: str


@dataclass
class GrepResult:
    """The matches of a grep, and what it searched."""

    matches: List[GrepMatch]
    truncated: bool = False
    files_searched: int = 0
    binary_files_skipped: int = 0

    def __iter__(self) -> Iterator[GrepMatch]:
        return iter(self.matches)

    def __len__(self) -> int:
        return len(self.matches)


@dataclass
class SandboxInfo:
    """A sandbox as the manager lists it; ``state`` is e.g. "BOUND", "READY", "DESTROYING"."""

    sandbox_id: str
    state: str
    template: str
    endpoint: str
    created: Optional[datetime.datetime]
    lease_expires: Optional[datetime.datetime]
    egress: List[str]
    labels: Dict[str, str]
    error: str = ""

    @classmethod
    def _from_proto(cls, m: manager_pb2.Sandbox) -> "SandboxInfo":
        def ts(f: str) -> Optional[datetime.datetime]:
            return getattr(m, f).ToDatetime(tzinfo=datetime.timezone.utc) if m.HasField(f) else None
        return cls(sandbox_id=m.sandbox_id, state=manager_pb2.UnitState.Name(m.state).removeprefix("UNIT_STATE_"),
                   template=m.template, endpoint=m.endpoint, created=ts("created"), lease_expires=ts("lease_expires"),
                   egress=list(m.egress), labels=dict(m.labels), error=m.error)


ProcessState = Literal["running", "exited", ""]
_STATES = {process_pb2.PROCESS_STATE_RUNNING: "running", process_pb2.PROCESS_STATE_EXITED: "exited"}


def _time(m, f: str) -> Optional[datetime.datetime]:
    return getattr(m, f).ToDatetime(tzinfo=datetime.timezone.utc) if m.HasField(f) else None


@dataclass
class ProcessInfo:
    """A long-lived process as the sandbox reports it.

    ``argv`` or ``script`` is the command as requested; ``state`` is "running" or "exited"
    (exited: its process group killed and reaped and its output read to the end). Once
    exited, ``exit_code`` is the exit status or 128 + the signal number, ``signal`` the
    signal's name ("SIGTERM") when one ended it, and ``ended_at`` is set. ``pid`` is its id
    inside the sandbox; ``pty`` says it runs on a terminal. The sandbox still holds the
    output ``[output_start, output_end)``; ``output_end`` is everything it has written so far.
    """

    id: str
    tag: str = ""
    argv: List[str] = field(default_factory=list)
    script: str = ""
    state: ProcessState = ""
    exit_code: int = 0
    signal: str = ""
    started_at: Optional[datetime.datetime] = None
    ended_at: Optional[datetime.datetime] = None
    pid: int = 0
    pty: bool = False
    output_start: int = 0
    output_end: int = 0
    task_group: str = ""

    @property
    def running(self) -> bool:
        """Whether the process is still running."""
        return self.state == "running"

    @classmethod
    def _from_proto(cls, m: process_pb2.ProcessInfo) -> "ProcessInfo":
        return cls(id=m.id, tag=m.tag, argv=list(m.argv), script=m.script, state=_STATES.get(m.state, ""),  # type: ignore[arg-type]
                   exit_code=m.exit_code, signal=m.signal, started_at=_time(m, "started_at"),
                   ended_at=_time(m, "ended_at"), pid=m.pid, pty=m.pty, output_start=m.output_start,
                   output_end=m.output_end, task_group=m.task_group_id)


@dataclass
class ProcessOutput:
    """A piece of a long-lived process's output: ``data`` starts at ``offset`` in the
    process's output (stdout and stderr together, counted from 0 at its start); ``stream``
    is "stdout" or "stderr" (a process on a terminal writes "stdout" only)."""

    offset: int
    stream: Literal["stdout", "stderr"]
    data: bytes


@dataclass
class OutputDropped:
    """The output ``[from_offset, to_offset)`` is lost: the sandbox no longer held it (the
    offset asked for was older than its buffer, or the reader fell behind). The output goes
    on at ``to_offset``."""

    from_offset: int
    to_offset: int

    @property
    def size(self) -> int:
        """How many bytes were lost."""
        return self.to_offset - self.from_offset


@dataclass
class ProcessExit:
    """How a long-lived process ended, as an attached stream reports it last: ``exit_code``
    (128 + the signal number when a signal ended it), ``signal`` ("SIGKILL"), ``ended_at``,
    and ``output_end``, where its output ends."""

    exit_code: int
    signal: str = ""
    ended_at: Optional[datetime.datetime] = None
    output_end: int = 0

    @classmethod
    def _from_proto(cls, m: process_pb2.ProcessExit) -> "ProcessExit":
        return cls(exit_code=m.exit_code, signal=m.signal, ended_at=_time(m, "ended_at"), output_end=m.output_end)


@dataclass
class WatchChange:
    """A change under a watched directory (see ``Sandbox.watch``): ``kind`` is "create",
    "write", "remove" (also a move out of the watched tree) or "rename" (``old_path`` set for
    a rename within the tree, empty for a move into it). Paths are relative to the workspace
    root. ``count`` is how many of the sandbox kernel's events it stands for: writes to a path
    whose event had not yet been sent are coalesced into it (a create followed by writes stays
    a create)."""

    path: str
    kind: Literal["create", "write", "remove", "rename"]
    is_dir: bool = False
    old_path: str = ""
    count: int = 1


@dataclass
class WatchOverflow:
    """Changes were lost before the events that follow: ``dropped`` of them because the
    watch's queue was full, or with ``unknown`` an unknown number more, when the sandbox
    kernel's own queue overflowed. Rescan what you watch if you must not miss a change."""

    dropped: int = 0
    unknown: bool = False
