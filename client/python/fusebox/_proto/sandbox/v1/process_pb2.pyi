from google.protobuf import duration_pb2 as _duration_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from fusebox.sandbox.v1 import sandbox_pb2 as _sandbox_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Iterable as _Iterable, Mapping as _Mapping, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor
PROCESS_STATE_EXITED: ProcessState
PROCESS_STATE_RUNNING: ProcessState
PROCESS_STATE_UNSPECIFIED: ProcessState

class AttachEvent(_message.Message):
    __slots__ = ["dropped", "exit", "output"]
    DROPPED_FIELD_NUMBER: _ClassVar[int]
    EXIT_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_FIELD_NUMBER: _ClassVar[int]
    dropped: OutputDropped
    exit: ProcessExit
    output: ProcessOutput
    def __init__(self, output: _Optional[_Union[ProcessOutput, _Mapping]] = ..., dropped: _Optional[_Union[OutputDropped, _Mapping]] = ..., exit: _Optional[_Union[ProcessExit, _Mapping]] = ...) -> None: ...

class AttachRequest(_message.Message):
    __slots__ = ["from_offset", "id"]
    FROM_OFFSET_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    from_offset: int
    id: str
    def __init__(self, id: _Optional[str] = ..., from_offset: _Optional[int] = ...) -> None: ...

class ListProcessesRequest(_message.Message):
    __slots__ = []
    def __init__(self) -> None: ...

class ListProcessesResponse(_message.Message):
    __slots__ = ["processes", "server_goroutines"]
    PROCESSES_FIELD_NUMBER: _ClassVar[int]
    SERVER_GOROUTINES_FIELD_NUMBER: _ClassVar[int]
    processes: _containers.RepeatedCompositeFieldContainer[ProcessInfo]
    server_goroutines: int
    def __init__(self, processes: _Optional[_Iterable[_Union[ProcessInfo, _Mapping]]] = ..., server_goroutines: _Optional[int] = ...) -> None: ...

class OutputDropped(_message.Message):
    __slots__ = ["from_offset", "to_offset"]
    FROM_OFFSET_FIELD_NUMBER: _ClassVar[int]
    TO_OFFSET_FIELD_NUMBER: _ClassVar[int]
    from_offset: int
    to_offset: int
    def __init__(self, from_offset: _Optional[int] = ..., to_offset: _Optional[int] = ...) -> None: ...

class ProcessExit(_message.Message):
    __slots__ = ["ended_at", "exit_code", "output_end", "signal"]
    ENDED_AT_FIELD_NUMBER: _ClassVar[int]
    EXIT_CODE_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_END_FIELD_NUMBER: _ClassVar[int]
    SIGNAL_FIELD_NUMBER: _ClassVar[int]
    ended_at: _timestamp_pb2.Timestamp
    exit_code: int
    output_end: int
    signal: str
    def __init__(self, exit_code: _Optional[int] = ..., signal: _Optional[str] = ..., ended_at: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ..., output_end: _Optional[int] = ...) -> None: ...

class ProcessInfo(_message.Message):
    __slots__ = ["argv", "ended_at", "exit_code", "id", "output_end", "output_start", "pid", "pty", "script", "signal", "started_at", "state", "tag", "task_group_id"]
    ARGV_FIELD_NUMBER: _ClassVar[int]
    ENDED_AT_FIELD_NUMBER: _ClassVar[int]
    EXIT_CODE_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_END_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_START_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    PTY_FIELD_NUMBER: _ClassVar[int]
    SCRIPT_FIELD_NUMBER: _ClassVar[int]
    SIGNAL_FIELD_NUMBER: _ClassVar[int]
    STARTED_AT_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    TAG_FIELD_NUMBER: _ClassVar[int]
    TASK_GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    argv: _containers.RepeatedScalarFieldContainer[str]
    ended_at: _timestamp_pb2.Timestamp
    exit_code: int
    id: str
    output_end: int
    output_start: int
    pid: int
    pty: bool
    script: str
    signal: str
    started_at: _timestamp_pb2.Timestamp
    state: ProcessState
    tag: str
    task_group_id: str
    def __init__(self, id: _Optional[str] = ..., tag: _Optional[str] = ..., argv: _Optional[_Iterable[str]] = ..., script: _Optional[str] = ..., state: _Optional[_Union[ProcessState, str]] = ..., exit_code: _Optional[int] = ..., signal: _Optional[str] = ..., started_at: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ..., ended_at: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ..., pid: _Optional[int] = ..., pty: bool = ..., output_start: _Optional[int] = ..., output_end: _Optional[int] = ..., task_group_id: _Optional[str] = ...) -> None: ...

class ProcessOutput(_message.Message):
    __slots__ = ["data", "offset", "stream"]
    DATA_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    STREAM_FIELD_NUMBER: _ClassVar[int]
    data: bytes
    offset: int
    stream: _sandbox_pb2.StreamKind
    def __init__(self, offset: _Optional[int] = ..., stream: _Optional[_Union[_sandbox_pb2.StreamKind, str]] = ..., data: _Optional[bytes] = ...) -> None: ...

class ResizeRequest(_message.Message):
    __slots__ = ["id", "size"]
    ID_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    id: str
    size: TerminalSize
    def __init__(self, id: _Optional[str] = ..., size: _Optional[_Union[TerminalSize, _Mapping]] = ...) -> None: ...

class ResizeResponse(_message.Message):
    __slots__ = []
    def __init__(self) -> None: ...

class SignalRequest(_message.Message):
    __slots__ = ["group", "id", "signal"]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    SIGNAL_FIELD_NUMBER: _ClassVar[int]
    group: bool
    id: str
    signal: int
    def __init__(self, id: _Optional[str] = ..., signal: _Optional[int] = ..., group: bool = ...) -> None: ...

class SignalResponse(_message.Message):
    __slots__ = []
    def __init__(self) -> None: ...

class StartProcessRequest(_message.Message):
    __slots__ = ["argv", "cwd", "env", "idempotency_key", "logical_order", "pty", "script", "tag", "task_group_id", "unset_env"]
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
    IDEMPOTENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    LOGICAL_ORDER_FIELD_NUMBER: _ClassVar[int]
    PTY_FIELD_NUMBER: _ClassVar[int]
    SCRIPT_FIELD_NUMBER: _ClassVar[int]
    TAG_FIELD_NUMBER: _ClassVar[int]
    TASK_GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    UNSET_ENV_FIELD_NUMBER: _ClassVar[int]
    argv: _containers.RepeatedScalarFieldContainer[str]
    cwd: str
    env: _containers.ScalarMap[str, str]
    idempotency_key: str
    logical_order: int
    pty: TerminalSize
    script: str
    tag: str
    task_group_id: str
    unset_env: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, argv: _Optional[_Iterable[str]] = ..., script: _Optional[str] = ..., cwd: _Optional[str] = ..., env: _Optional[_Mapping[str, str]] = ..., unset_env: _Optional[_Iterable[str]] = ..., task_group_id: _Optional[str] = ..., logical_order: _Optional[int] = ..., pty: _Optional[_Union[TerminalSize, _Mapping]] = ..., tag: _Optional[str] = ..., idempotency_key: _Optional[str] = ...) -> None: ...

class StartProcessResponse(_message.Message):
    __slots__ = ["existing", "process"]
    EXISTING_FIELD_NUMBER: _ClassVar[int]
    PROCESS_FIELD_NUMBER: _ClassVar[int]
    existing: bool
    process: ProcessInfo
    def __init__(self, process: _Optional[_Union[ProcessInfo, _Mapping]] = ..., existing: bool = ...) -> None: ...

class TerminalSize(_message.Message):
    __slots__ = ["cols", "rows"]
    COLS_FIELD_NUMBER: _ClassVar[int]
    ROWS_FIELD_NUMBER: _ClassVar[int]
    cols: int
    rows: int
    def __init__(self, rows: _Optional[int] = ..., cols: _Optional[int] = ...) -> None: ...

class WaitRequest(_message.Message):
    __slots__ = ["id", "timeout"]
    ID_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_FIELD_NUMBER: _ClassVar[int]
    id: str
    timeout: _duration_pb2.Duration
    def __init__(self, id: _Optional[str] = ..., timeout: _Optional[_Union[_duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class WaitResponse(_message.Message):
    __slots__ = ["exited", "process"]
    EXITED_FIELD_NUMBER: _ClassVar[int]
    PROCESS_FIELD_NUMBER: _ClassVar[int]
    exited: bool
    process: ProcessInfo
    def __init__(self, process: _Optional[_Union[ProcessInfo, _Mapping]] = ..., exited: bool = ...) -> None: ...

class WriteStdinRequest(_message.Message):
    __slots__ = ["data", "eof", "id"]
    DATA_FIELD_NUMBER: _ClassVar[int]
    EOF_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    data: bytes
    eof: bool
    id: str
    def __init__(self, id: _Optional[str] = ..., data: _Optional[bytes] = ..., eof: bool = ...) -> None: ...

class WriteStdinResponse(_message.Message):
    __slots__ = []
    def __init__(self) -> None: ...

class ProcessState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = []
