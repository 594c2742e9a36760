from google.protobuf import duration_pb2 as _duration_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Iterable as _Iterable, Mapping as _Mapping, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor
FILE_TYPE_DIR: FileType
FILE_TYPE_FILE: FileType
FILE_TYPE_OTHER: FileType
FILE_TYPE_SYMLINK: FileType
FILE_TYPE_UNSPECIFIED: FileType
STREAM_KIND_STDERR: StreamKind
STREAM_KIND_STDOUT: StreamKind
STREAM_KIND_UNSPECIFIED: StreamKind
WATCH_CHANGE_KIND_CREATE: WatchChangeKind
WATCH_CHANGE_KIND_REMOVE: WatchChangeKind
WATCH_CHANGE_KIND_RENAME: WatchChangeKind
WATCH_CHANGE_KIND_UNSPECIFIED: WatchChangeKind
WATCH_CHANGE_KIND_WRITE: WatchChangeKind

class BulkRequest(_message.Message):
    __slots__ = ["read", "write"]
    READ_FIELD_NUMBER: _ClassVar[int]
    WRITE_FIELD_NUMBER: _ClassVar[int]
    read: ReadFileStreamRequest
    write: WriteFileHeader
    def __init__(self, write: _Optional[_Union[WriteFileHeader, _Mapping]] = ..., read: _Optional[_Union[ReadFileStreamRequest, _Mapping]] = ...) -> None: ...

class BulkStatus(_message.Message):
    __slots__ = ["bytes", "code", "message"]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    bytes: int
    code: int
    message: str
    def __init__(self, code: _Optional[int] = ..., message: _Optional[str] = ..., bytes: _Optional[int] = ...) -> None: ...

class ExecEvent(_message.Message):
    __slots__ = ["exit", "output"]
    EXIT_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_FIELD_NUMBER: _ClassVar[int]
    exit: ExecExit
    output: ExecOutput
    def __init__(self, output: _Optional[_Union[ExecOutput, _Mapping]] = ..., exit: _Optional[_Union[ExecExit, _Mapping]] = ...) -> None: ...

class ExecExit(_message.Message):
    __slots__ = ["duration", "exit_code", "signal", "state_recorded", "timed_out", "truncated"]
    DURATION_FIELD_NUMBER: _ClassVar[int]
    EXIT_CODE_FIELD_NUMBER: _ClassVar[int]
    SIGNAL_FIELD_NUMBER: _ClassVar[int]
    STATE_RECORDED_FIELD_NUMBER: _ClassVar[int]
    TIMED_OUT_FIELD_NUMBER: _ClassVar[int]
    TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    duration: _duration_pb2.Duration
    exit_code: int
    signal: str
    state_recorded: bool
    timed_out: bool
    truncated: bool
    def __init__(self, exit_code: _Optional[int] = ..., signal: _Optional[str] = ..., duration: _Optional[_Union[_duration_pb2.Duration, _Mapping]] = ..., truncated: bool = ..., timed_out: bool = ..., state_recorded: bool = ...) -> None: ...

class ExecOutput(_message.Message):
    __slots__ = ["data", "stream"]
    DATA_FIELD_NUMBER: _ClassVar[int]
    STREAM_FIELD_NUMBER: _ClassVar[int]
    data: bytes
    stream: StreamKind
    def __init__(self, stream: _Optional[_Union[StreamKind, str]] = ..., data: _Optional[bytes] = ...) -> None: ...

class ExecRequest(_message.Message):
    __slots__ = ["argv", "cwd", "env", "logical_order", "script", "stdin", "task_group_id", "timeout", "unset_env"]
    class EnvEntry(_message.Message):
        __slots__ = ["key", "value"]
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    ARGV_FIELD_NUMBER: _ClassVar[int]
    CWD_FIELD_NUMBER: _ClassVar[int]
    ENV_FIELD_NUMBER: _ClassVar[int]
    LOGICAL_ORDER_FIELD_NUMBER: _ClassVar[int]
    SCRIPT_FIELD_NUMBER: _ClassVar[int]
    STDIN_FIELD_NUMBER: _ClassVar[int]
    TASK_GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_FIELD_NUMBER: _ClassVar[int]
    UNSET_ENV_FIELD_NUMBER: _ClassVar[int]
    argv: _containers.RepeatedScalarFieldContainer[str]
    cwd: str
    env: _containers.ScalarMap[str, str]
    logical_order: int
    script: str
    stdin: bytes
    task_group_id: str
    timeout: _duration_pb2.Duration
    unset_env: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, argv: _Optional[_Iterable[str]] = ..., script: _Optional[str] = ..., cwd: _Optional[str] = ..., env: _Optional[_Mapping[str, str]] = ..., unset_env: _Optional[_Iterable[str]] = ..., stdin: _Optional[bytes] = ..., timeout: _Optional[_Union[_duration_pb2.Duration, _Mapping]] = ..., task_group_id: _Optional[str] = ..., logical_order: _Optional[int] = ...) -> None: ...

class FileContent(_message.Message):
    __slots__ = ["data", "mode", "path"]
    DATA_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    data: bytes
    mode: int
    path: str
    def __init__(self, path: _Optional[str] = ..., data: _Optional[bytes] = ..., mode: _Optional[int] = ...) -> None: ...

class FileInfo(_message.Message):
    __slots__ = ["mode", "modified", "path", "size", "symlink_target", "type"]
    MODE_FIELD_NUMBER: _ClassVar[int]
    MODIFIED_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    SYMLINK_TARGET_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    mode: int
    modified: _timestamp_pb2.Timestamp
    path: str
    size: int
    symlink_target: str
    type: FileType
    def __init__(self, path: _Optional[str] = ..., type: _Optional[_Union[FileType, str]] = ..., size: _Optional[int] = ..., mode: _Optional[int] = ..., modified: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ..., symlink_target: _Optional[str] = ...) -> None: ...

class FileWrite(_message.Message):
    __slots__ = ["data", "mode", "path"]
    DATA_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    data: bytes
    mode: int
    path: str
    def __init__(self, path: _Optional[str] = ..., data: _Optional[bytes] = ..., mode: _Optional[int] = ...) -> None: ...

class FindRequest(_message.Message):
    __slots__ = ["max_depth", "max_results", "name", "path", "type"]
    MAX_DEPTH_FIELD_NUMBER: _ClassVar[int]
    MAX_RESULTS_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    max_depth: int
    max_results: int
    name: str
    path: str
    type: FileType
    def __init__(self, path: _Optional[str] = ..., name: _Optional[str] = ..., type: _Optional[_Union[FileType, str]] = ..., max_depth: _Optional[int] = ..., max_results: _Optional[int] = ...) -> None: ...

class FindResponse(_message.Message):
    __slots__ = ["entries", "truncated"]
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    entries: _containers.RepeatedCompositeFieldContainer[FileInfo]
    truncated: bool
    def __init__(self, entries: _Optional[_Iterable[_Union[FileInfo, _Mapping]]] = ..., truncated: bool = ...) -> None: ...

class GetReadFilesPlanRequest(_message.Message):
    __slots__ = ["max_batch_bytes", "paths"]
    MAX_BATCH_BYTES_FIELD_NUMBER: _ClassVar[int]
    PATHS_FIELD_NUMBER: _ClassVar[int]
    max_batch_bytes: int
    paths: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, paths: _Optional[_Iterable[str]] = ..., max_batch_bytes: _Optional[int] = ...) -> None: ...

class GrepMatch(_message.Message):
    __slots__ = ["line", "path", "text"]
    LINE_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    line: int
    path: str
    text: str
    def __init__(self, path: _Optional[str] = ..., line: _Optional[int] = ..., text: _Optional[str] = ...) -> None: ...

class GrepRequest(_message.Message):
    __slots__ = ["case_insensitive", "exclude", "include", "max_matches", "paths", "pattern"]
    CASE_INSENSITIVE_FIELD_NUMBER: _ClassVar[int]
    EXCLUDE_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_FIELD_NUMBER: _ClassVar[int]
    MAX_MATCHES_FIELD_NUMBER: _ClassVar[int]
    PATHS_FIELD_NUMBER: _ClassVar[int]
    PATTERN_FIELD_NUMBER: _ClassVar[int]
    case_insensitive: bool
    exclude: _containers.RepeatedScalarFieldContainer[str]
    include: _containers.RepeatedScalarFieldContainer[str]
    max_matches: int
    paths: _containers.RepeatedScalarFieldContainer[str]
    pattern: str
    def __init__(self, pattern: _Optional[str] = ..., paths: _Optional[_Iterable[str]] = ..., include: _Optional[_Iterable[str]] = ..., exclude: _Optional[_Iterable[str]] = ..., case_insensitive: bool = ..., max_matches: _Optional[int] = ...) -> None: ...

class GrepResponse(_message.Message):
    __slots__ = ["binary_files_skipped", "files_searched", "matches", "truncated"]
    BINARY_FILES_SKIPPED_FIELD_NUMBER: _ClassVar[int]
    FILES_SEARCHED_FIELD_NUMBER: _ClassVar[int]
    MATCHES_FIELD_NUMBER: _ClassVar[int]
    TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    binary_files_skipped: int
    files_searched: int
    matches: _containers.RepeatedCompositeFieldContainer[GrepMatch]
    truncated: bool
    def __init__(self, matches: _Optional[_Iterable[_Union[GrepMatch, _Mapping]]] = ..., truncated: bool = ..., files_searched: _Optional[int] = ..., binary_files_skipped: _Optional[int] = ...) -> None: ...

class InitializeTLSRequest(_message.Message):
    __slots__ = ["agent_public_key", "cwd", "egress", "env"]
    class EnvEntry(_message.Message):
        __slots__ = ["key", "value"]
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    AGENT_PUBLIC_KEY_FIELD_NUMBER: _ClassVar[int]
    CWD_FIELD_NUMBER: _ClassVar[int]
    EGRESS_FIELD_NUMBER: _ClassVar[int]
    ENV_FIELD_NUMBER: _ClassVar[int]
    agent_public_key: bytes
    cwd: str
    egress: _containers.RepeatedScalarFieldContainer[str]
    env: _containers.ScalarMap[str, str]
    def __init__(self, agent_public_key: _Optional[bytes] = ..., egress: _Optional[_Iterable[str]] = ..., env: _Optional[_Mapping[str, str]] = ..., cwd: _Optional[str] = ...) -> None: ...

class InitializeTLSResponse(_message.Message):
    __slots__ = ["sandbox_certificate", "sandbox_public_key"]
    SANDBOX_CERTIFICATE_FIELD_NUMBER: _ClassVar[int]
    SANDBOX_PUBLIC_KEY_FIELD_NUMBER: _ClassVar[int]
    sandbox_certificate: bytes
    sandbox_public_key: bytes
    def __init__(self, sandbox_public_key: _Optional[bytes] = ..., sandbox_certificate: _Optional[bytes] = ...) -> None: ...

class ListRequest(_message.Message):
    __slots__ = ["max_depth", "max_entries", "path", "recursive"]
    MAX_DEPTH_FIELD_NUMBER: _ClassVar[int]
    MAX_ENTRIES_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    RECURSIVE_FIELD_NUMBER: _ClassVar[int]
    max_depth: int
    max_entries: int
    path: str
    recursive: bool
    def __init__(self, path: _Optional[str] = ..., recursive: bool = ..., max_depth: _Optional[int] = ..., max_entries: _Optional[int] = ...) -> None: ...

class ListResponse(_message.Message):
    __slots__ = ["entries", "truncated"]
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    entries: _containers.RepeatedCompositeFieldContainer[FileInfo]
    truncated: bool
    def __init__(self, entries: _Optional[_Iterable[_Union[FileInfo, _Mapping]]] = ..., truncated: bool = ...) -> None: ...

class MkdirRequest(_message.Message):
    __slots__ = ["mode", "parents", "path"]
    MODE_FIELD_NUMBER: _ClassVar[int]
    PARENTS_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    mode: int
    parents: bool
    path: str
    def __init__(self, path: _Optional[str] = ..., parents: bool = ..., mode: _Optional[int] = ...) -> None: ...

class MkdirResponse(_message.Message):
    __slots__ = []
    def __init__(self) -> None: ...

class PlannedFile(_message.Message):
    __slots__ = ["mode", "path", "size"]
    MODE_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    mode: int
    path: str
    size: int
    def __init__(self, path: _Optional[str] = ..., size: _Optional[int] = ..., mode: _Optional[int] = ...) -> None: ...

class ReadBatch(_message.Message):
    __slots__ = ["files", "total_bytes"]
    FILES_FIELD_NUMBER: _ClassVar[int]
    TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    files: _containers.RepeatedCompositeFieldContainer[PlannedFile]
    total_bytes: int
    def __init__(self, files: _Optional[_Iterable[_Union[PlannedFile, _Mapping]]] = ..., total_bytes: _Optional[int] = ...) -> None: ...

class ReadFileChunk(_message.Message):
    __slots__ = ["data", "size"]
    DATA_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    data: bytes
    size: int
    def __init__(self, data: _Optional[bytes] = ..., size: _Optional[int] = ...) -> None: ...

class ReadFileStreamRequest(_message.Message):
    __slots__ = ["offset", "path"]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    offset: int
    path: str
    def __init__(self, path: _Optional[str] = ..., offset: _Optional[int] = ...) -> None: ...

class ReadFilesPlan(_message.Message):
    __slots__ = ["batches", "missing", "streamed", "total_bytes"]
    BATCHES_FIELD_NUMBER: _ClassVar[int]
    MISSING_FIELD_NUMBER: _ClassVar[int]
    STREAMED_FIELD_NUMBER: _ClassVar[int]
    TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    batches: _containers.RepeatedCompositeFieldContainer[ReadBatch]
    missing: _containers.RepeatedScalarFieldContainer[str]
    streamed: _containers.RepeatedCompositeFieldContainer[PlannedFile]
    total_bytes: int
    def __init__(self, batches: _Optional[_Iterable[_Union[ReadBatch, _Mapping]]] = ..., streamed: _Optional[_Iterable[_Union[PlannedFile, _Mapping]]] = ..., missing: _Optional[_Iterable[str]] = ..., total_bytes: _Optional[int] = ...) -> None: ...

class ReadFilesRequest(_message.Message):
    __slots__ = ["paths"]
    PATHS_FIELD_NUMBER: _ClassVar[int]
    paths: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, paths: _Optional[_Iterable[str]] = ...) -> None: ...

class ReadFilesResponse(_message.Message):
    __slots__ = ["files"]
    FILES_FIELD_NUMBER: _ClassVar[int]
    files: _containers.RepeatedCompositeFieldContainer[FileContent]
    def __init__(self, files: _Optional[_Iterable[_Union[FileContent, _Mapping]]] = ...) -> None: ...

class RemoveRequest(_message.Message):
    __slots__ = ["missing_ok", "path", "recursive"]
    MISSING_OK_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    RECURSIVE_FIELD_NUMBER: _ClassVar[int]
    missing_ok: bool
    path: str
    recursive: bool
    def __init__(self, path: _Optional[str] = ..., recursive: bool = ..., missing_ok: bool = ...) -> None: ...

class RemoveResponse(_message.Message):
    __slots__ = []
    def __init__(self) -> None: ...

class RenameRequest(_message.Message):
    __slots__ = ["overwrite", "to"]
    FROM_FIELD_NUMBER: _ClassVar[int]
    OVERWRITE_FIELD_NUMBER: _ClassVar[int]
    TO_FIELD_NUMBER: _ClassVar[int]
    overwrite: bool
    to: str
    def __init__(self, to: _Optional[str] = ..., overwrite: bool = ..., **kwargs) -> None: ...

class RenameResponse(_message.Message):
    __slots__ = []
    def __init__(self) -> None: ...

class StatRequest(_message.Message):
    __slots__ = ["follow_symlinks", "path"]
    FOLLOW_SYMLINKS_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    follow_symlinks: bool
    path: str
    def __init__(self, path: _Optional[str] = ..., follow_symlinks: bool = ...) -> None: ...

class StatResponse(_message.Message):
    __slots__ = ["info"]
    INFO_FIELD_NUMBER: _ClassVar[int]
    info: FileInfo
    def __init__(self, info: _Optional[_Union[FileInfo, _Mapping]] = ...) -> None: ...

class SymlinkRequest(_message.Message):
    __slots__ = ["path", "target"]
    PATH_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    path: str
    target: str
    def __init__(self, target: _Optional[str] = ..., path: _Optional[str] = ...) -> None: ...

class SymlinkResponse(_message.Message):
    __slots__ = []
    def __init__(self) -> None: ...

class SymlinkSpec(_message.Message):
    __slots__ = ["path", "target"]
    PATH_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    path: str
    target: str
    def __init__(self, target: _Optional[str] = ..., path: _Optional[str] = ...) -> None: ...

class WatchChange(_message.Message):
    __slots__ = ["count", "is_dir", "kind", "old_path", "path"]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    IS_DIR_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    OLD_PATH_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    count: int
    is_dir: bool
    kind: WatchChangeKind
    old_path: str
    path: str
    def __init__(self, path: _Optional[str] = ..., kind: _Optional[_Union[WatchChangeKind, str]] = ..., is_dir: bool = ..., old_path: _Optional[str] = ..., count: _Optional[int] = ...) -> None: ...

class WatchEvent(_message.Message):
    __slots__ = ["change", "overflow", "ready"]
    CHANGE_FIELD_NUMBER: _ClassVar[int]
    OVERFLOW_FIELD_NUMBER: _ClassVar[int]
    READY_FIELD_NUMBER: _ClassVar[int]
    change: WatchChange
    overflow: WatchOverflow
    ready: WatchReady
    def __init__(self, ready: _Optional[_Union[WatchReady, _Mapping]] = ..., change: _Optional[_Union[WatchChange, _Mapping]] = ..., overflow: _Optional[_Union[WatchOverflow, _Mapping]] = ...) -> None: ...

class WatchOverflow(_message.Message):
    __slots__ = ["dropped", "unknown"]
    DROPPED_FIELD_NUMBER: _ClassVar[int]
    UNKNOWN_FIELD_NUMBER: _ClassVar[int]
    dropped: int
    unknown: bool
    def __init__(self, dropped: _Optional[int] = ..., unknown: bool = ...) -> None: ...

class WatchReady(_message.Message):
    __slots__ = ["queue_size"]
    QUEUE_SIZE_FIELD_NUMBER: _ClassVar[int]
    queue_size: int
    def __init__(self, queue_size: _Optional[int] = ...) -> None: ...

class WatchRequest(_message.Message):
    __slots__ = ["exclude", "include", "path", "queue_size", "recursive"]
    EXCLUDE_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    QUEUE_SIZE_FIELD_NUMBER: _ClassVar[int]
    RECURSIVE_FIELD_NUMBER: _ClassVar[int]
    exclude: _containers.RepeatedScalarFieldContainer[str]
    include: _containers.RepeatedScalarFieldContainer[str]
    path: str
    queue_size: int
    recursive: bool
    def __init__(self, path: _Optional[str] = ..., recursive: bool = ..., include: _Optional[_Iterable[str]] = ..., exclude: _Optional[_Iterable[str]] = ..., queue_size: _Optional[int] = ...) -> None: ...

class WriteFileChunk(_message.Message):
    __slots__ = ["data", "header"]
    DATA_FIELD_NUMBER: _ClassVar[int]
    HEADER_FIELD_NUMBER: _ClassVar[int]
    data: bytes
    header: WriteFileHeader
    def __init__(self, header: _Optional[_Union[WriteFileHeader, _Mapping]] = ..., data: _Optional[bytes] = ...) -> None: ...

class WriteFileHeader(_message.Message):
    __slots__ = ["mode", "path", "size"]
    MODE_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    mode: int
    path: str
    size: int
    def __init__(self, path: _Optional[str] = ..., mode: _Optional[int] = ..., size: _Optional[int] = ...) -> None: ...

class WriteFileStreamResponse(_message.Message):
    __slots__ = ["bytes_written"]
    BYTES_WRITTEN_FIELD_NUMBER: _ClassVar[int]
    bytes_written: int
    def __init__(self, bytes_written: _Optional[int] = ...) -> None: ...

class WriteFilesRequest(_message.Message):
    __slots__ = ["files", "mkdirs", "symlinks"]
    FILES_FIELD_NUMBER: _ClassVar[int]
    MKDIRS_FIELD_NUMBER: _ClassVar[int]
    SYMLINKS_FIELD_NUMBER: _ClassVar[int]
    files: _containers.RepeatedCompositeFieldContainer[FileWrite]
    mkdirs: _containers.RepeatedScalarFieldContainer[str]
    symlinks: _containers.RepeatedCompositeFieldContainer[SymlinkSpec]
    def __init__(self, mkdirs: _Optional[_Iterable[str]] = ..., files: _Optional[_Iterable[_Union[FileWrite, _Mapping]]] = ..., symlinks: _Optional[_Iterable[_Union[SymlinkSpec, _Mapping]]] = ...) -> None: ...

class WriteFilesResponse(_message.Message):
    __slots__ = ["bytes_written", "dirs_created", "files_written", "symlinks_created"]
    BYTES_WRITTEN_FIELD_NUMBER: _ClassVar[int]
    DIRS_CREATED_FIELD_NUMBER: _ClassVar[int]
    FILES_WRITTEN_FIELD_NUMBER: _ClassVar[int]
    SYMLINKS_CREATED_FIELD_NUMBER: _ClassVar[int]
    bytes_written: int
    dirs_created: int
    files_written: int
    symlinks_created: int
    def __init__(self, files_written: _Optional[int] = ..., dirs_created: _Optional[int] = ..., symlinks_created: _Optional[int] = ..., bytes_written: _Optional[int] = ...) -> None: ...

class StreamKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = []

class FileType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = []

class WatchChangeKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = []
