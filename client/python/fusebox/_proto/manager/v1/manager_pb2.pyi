from google.protobuf import duration_pb2 as _duration_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Iterable as _Iterable, Mapping as _Mapping, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor
UNIT_STATE_BOUND: UnitState
UNIT_STATE_CREATING: UnitState
UNIT_STATE_DESTROYING: UnitState
UNIT_STATE_FAILED: UnitState
UNIT_STATE_GONE: UnitState
UNIT_STATE_INITIALISING: UnitState
UNIT_STATE_READY: UnitState
UNIT_STATE_UNSPECIFIED: UnitState

class AddTemplatesRequest(_message.Message):
    __slots__ = ["templates"]
    TEMPLATES_FIELD_NUMBER: _ClassVar[int]
    templates: bytes
    def __init__(self, templates: _Optional[bytes] = ...) -> None: ...

class AddTemplatesResponse(_message.Message):
    __slots__ = ["changes"]
    CHANGES_FIELD_NUMBER: _ClassVar[int]
    changes: _containers.RepeatedCompositeFieldContainer[TemplateChange]
    def __init__(self, changes: _Optional[_Iterable[_Union[TemplateChange, _Mapping]]] = ...) -> None: ...

class AllocateEvent(_message.Message):
    __slots__ = ["allocated"]
    ALLOCATED_FIELD_NUMBER: _ClassVar[int]
    allocated: AllocateResponse
    def __init__(self, allocated: _Optional[_Union[AllocateResponse, _Mapping]] = ...) -> None: ...

class AllocateRequest(_message.Message):
    __slots__ = ["agent_public_key", "cwd", "egress", "env", "labels", "lease_ttl", "template"]
    class EnvEntry(_message.Message):
        __slots__ = ["key", "value"]
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    class LabelsEntry(_message.Message):
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
    LABELS_FIELD_NUMBER: _ClassVar[int]
    LEASE_TTL_FIELD_NUMBER: _ClassVar[int]
    TEMPLATE_FIELD_NUMBER: _ClassVar[int]
    agent_public_key: bytes
    cwd: str
    egress: _containers.RepeatedScalarFieldContainer[str]
    env: _containers.ScalarMap[str, str]
    labels: _containers.ScalarMap[str, str]
    lease_ttl: _duration_pb2.Duration
    template: str
    def __init__(self, agent_public_key: _Optional[bytes] = ..., template: _Optional[str] = ..., egress: _Optional[_Iterable[str]] = ..., lease_ttl: _Optional[_Union[_duration_pb2.Duration, _Mapping]] = ..., labels: _Optional[_Mapping[str, str]] = ..., env: _Optional[_Mapping[str, str]] = ..., cwd: _Optional[str] = ...) -> None: ...

class AllocateResponse(_message.Message):
    __slots__ = ["endpoint", "lease_expires", "lease_token", "sandbox_certificate", "sandbox_id", "sandbox_public_key"]
    ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    LEASE_EXPIRES_FIELD_NUMBER: _ClassVar[int]
    LEASE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    SANDBOX_CERTIFICATE_FIELD_NUMBER: _ClassVar[int]
    SANDBOX_ID_FIELD_NUMBER: _ClassVar[int]
    SANDBOX_PUBLIC_KEY_FIELD_NUMBER: _ClassVar[int]
    endpoint: str
    lease_expires: _timestamp_pb2.Timestamp
    lease_token: str
    sandbox_certificate: bytes
    sandbox_id: str
    sandbox_public_key: bytes
    def __init__(self, sandbox_id: _Optional[str] = ..., endpoint: _Optional[str] = ..., sandbox_public_key: _Optional[bytes] = ..., lease_expires: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ..., lease_token: _Optional[str] = ..., sandbox_certificate: _Optional[bytes] = ...) -> None: ...

class ListRequest(_message.Message):
    __slots__ = []
    def __init__(self) -> None: ...

class ListResponse(_message.Message):
    __slots__ = ["sandboxes"]
    SANDBOXES_FIELD_NUMBER: _ClassVar[int]
    sandboxes: _containers.RepeatedCompositeFieldContainer[Sandbox]
    def __init__(self, sandboxes: _Optional[_Iterable[_Union[Sandbox, _Mapping]]] = ...) -> None: ...

class PoolStatusRequest(_message.Message):
    __slots__ = []
    def __init__(self) -> None: ...

class PoolStatusResponse(_message.Message):
    __slots__ = ["allocations", "allocator", "cold_waits", "creations", "demand_per_second", "destructions", "estimator", "failures", "pools", "provisioning_latency", "target", "units"]
    class UnitsEntry(_message.Message):
        __slots__ = ["key", "value"]
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    ALLOCATIONS_FIELD_NUMBER: _ClassVar[int]
    ALLOCATOR_FIELD_NUMBER: _ClassVar[int]
    COLD_WAITS_FIELD_NUMBER: _ClassVar[int]
    CREATIONS_FIELD_NUMBER: _ClassVar[int]
    DEMAND_PER_SECOND_FIELD_NUMBER: _ClassVar[int]
    DESTRUCTIONS_FIELD_NUMBER: _ClassVar[int]
    ESTIMATOR_FIELD_NUMBER: _ClassVar[int]
    FAILURES_FIELD_NUMBER: _ClassVar[int]
    POOLS_FIELD_NUMBER: _ClassVar[int]
    PROVISIONING_LATENCY_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    UNITS_FIELD_NUMBER: _ClassVar[int]
    allocations: int
    allocator: str
    cold_waits: int
    creations: int
    demand_per_second: float
    destructions: int
    estimator: str
    failures: int
    pools: _containers.RepeatedCompositeFieldContainer[TemplatePool]
    provisioning_latency: _duration_pb2.Duration
    target: int
    units: _containers.ScalarMap[str, int]
    def __init__(self, units: _Optional[_Mapping[str, int]] = ..., target: _Optional[int] = ..., estimator: _Optional[str] = ..., demand_per_second: _Optional[float] = ..., provisioning_latency: _Optional[_Union[_duration_pb2.Duration, _Mapping]] = ..., allocations: _Optional[int] = ..., creations: _Optional[int] = ..., destructions: _Optional[int] = ..., failures: _Optional[int] = ..., allocator: _Optional[str] = ..., cold_waits: _Optional[int] = ..., pools: _Optional[_Iterable[_Union[TemplatePool, _Mapping]]] = ...) -> None: ...

class ReleaseRequest(_message.Message):
    __slots__ = ["lease_token", "sandbox_id"]
    LEASE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    SANDBOX_ID_FIELD_NUMBER: _ClassVar[int]
    lease_token: str
    sandbox_id: str
    def __init__(self, sandbox_id: _Optional[str] = ..., lease_token: _Optional[str] = ...) -> None: ...

class ReleaseResponse(_message.Message):
    __slots__ = []
    def __init__(self) -> None: ...

class RemoveTemplateRequest(_message.Message):
    __slots__ = ["template"]
    TEMPLATE_FIELD_NUMBER: _ClassVar[int]
    template: str
    def __init__(self, template: _Optional[str] = ...) -> None: ...

class RemoveTemplateResponse(_message.Message):
    __slots__ = ["change"]
    CHANGE_FIELD_NUMBER: _ClassVar[int]
    change: TemplateChange
    def __init__(self, change: _Optional[_Union[TemplateChange, _Mapping]] = ...) -> None: ...

class RenewRequest(_message.Message):
    __slots__ = ["lease_token", "lease_ttl", "sandbox_id"]
    LEASE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    LEASE_TTL_FIELD_NUMBER: _ClassVar[int]
    SANDBOX_ID_FIELD_NUMBER: _ClassVar[int]
    lease_token: str
    lease_ttl: _duration_pb2.Duration
    sandbox_id: str
    def __init__(self, sandbox_id: _Optional[str] = ..., lease_token: _Optional[str] = ..., lease_ttl: _Optional[_Union[_duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class RenewResponse(_message.Message):
    __slots__ = ["lease_expires"]
    LEASE_EXPIRES_FIELD_NUMBER: _ClassVar[int]
    lease_expires: _timestamp_pb2.Timestamp
    def __init__(self, lease_expires: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class Sandbox(_message.Message):
    __slots__ = ["created", "egress", "endpoint", "error", "labels", "lease_expires", "sandbox_id", "state", "template"]
    class LabelsEntry(_message.Message):
        __slots__ = ["key", "value"]
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    CREATED_FIELD_NUMBER: _ClassVar[int]
    EGRESS_FIELD_NUMBER: _ClassVar[int]
    ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    LEASE_EXPIRES_FIELD_NUMBER: _ClassVar[int]
    SANDBOX_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    TEMPLATE_FIELD_NUMBER: _ClassVar[int]
    created: _timestamp_pb2.Timestamp
    egress: _containers.RepeatedScalarFieldContainer[str]
    endpoint: str
    error: str
    labels: _containers.ScalarMap[str, str]
    lease_expires: _timestamp_pb2.Timestamp
    sandbox_id: str
    state: UnitState
    template: str
    def __init__(self, sandbox_id: _Optional[str] = ..., state: _Optional[_Union[UnitState, str]] = ..., template: _Optional[str] = ..., endpoint: _Optional[str] = ..., created: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ..., lease_expires: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ..., egress: _Optional[_Iterable[str]] = ..., labels: _Optional[_Mapping[str, str]] = ..., error: _Optional[str] = ...) -> None: ...

class TemplateChange(_message.Message):
    __slots__ = ["bound", "change", "drained", "hash", "image", "template"]
    BOUND_FIELD_NUMBER: _ClassVar[int]
    CHANGE_FIELD_NUMBER: _ClassVar[int]
    DRAINED_FIELD_NUMBER: _ClassVar[int]
    HASH_FIELD_NUMBER: _ClassVar[int]
    IMAGE_FIELD_NUMBER: _ClassVar[int]
    TEMPLATE_FIELD_NUMBER: _ClassVar[int]
    bound: int
    change: str
    drained: int
    hash: str
    image: str
    template: str
    def __init__(self, template: _Optional[str] = ..., change: _Optional[str] = ..., hash: _Optional[str] = ..., drained: _Optional[int] = ..., bound: _Optional[int] = ..., image: _Optional[str] = ...) -> None: ...

class TemplatePool(_message.Message):
    __slots__ = ["demand_per_second", "estimator", "hash", "image", "last_error", "last_error_at", "provisioning_latency", "target", "template", "units"]
    class UnitsEntry(_message.Message):
        __slots__ = ["key", "value"]
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    DEMAND_PER_SECOND_FIELD_NUMBER: _ClassVar[int]
    ESTIMATOR_FIELD_NUMBER: _ClassVar[int]
    HASH_FIELD_NUMBER: _ClassVar[int]
    IMAGE_FIELD_NUMBER: _ClassVar[int]
    LAST_ERROR_AT_FIELD_NUMBER: _ClassVar[int]
    LAST_ERROR_FIELD_NUMBER: _ClassVar[int]
    PROVISIONING_LATENCY_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    TEMPLATE_FIELD_NUMBER: _ClassVar[int]
    UNITS_FIELD_NUMBER: _ClassVar[int]
    demand_per_second: float
    estimator: str
    hash: str
    image: str
    last_error: str
    last_error_at: _timestamp_pb2.Timestamp
    provisioning_latency: _duration_pb2.Duration
    target: int
    template: str
    units: _containers.ScalarMap[str, int]
    def __init__(self, template: _Optional[str] = ..., estimator: _Optional[str] = ..., target: _Optional[int] = ..., units: _Optional[_Mapping[str, int]] = ..., demand_per_second: _Optional[float] = ..., provisioning_latency: _Optional[_Union[_duration_pb2.Duration, _Mapping]] = ..., last_error: _Optional[str] = ..., last_error_at: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ..., image: _Optional[str] = ..., hash: _Optional[str] = ...) -> None: ...

class UnitState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = []
