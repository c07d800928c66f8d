from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class AdmissionFrame(_message.Message):
    __slots__ = ("token", "submit", "withdraw")
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    SUBMIT_FIELD_NUMBER: _ClassVar[int]
    WITHDRAW_FIELD_NUMBER: _ClassVar[int]
    token: str
    submit: SubmitRequest
    withdraw: str
    def __init__(self, token: _Optional[str] = ..., submit: _Optional[_Union[SubmitRequest, _Mapping]] = ..., withdraw: _Optional[str] = ...) -> None: ...

class SubmitRequest(_message.Message):
    __slots__ = ("request_id", "tenant", "prompt_tokens", "max_tokens", "retry", "key_hash", "model", "prefix", "block_tokens", "tier", "adapter")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    RETRY_FIELD_NUMBER: _ClassVar[int]
    KEY_HASH_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    PREFIX_FIELD_NUMBER: _ClassVar[int]
    BLOCK_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TIER_FIELD_NUMBER: _ClassVar[int]
    ADAPTER_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    tenant: str
    prompt_tokens: int
    max_tokens: int
    retry: bool
    key_hash: str
    model: str
    prefix: _containers.RepeatedScalarFieldContainer[int]
    block_tokens: int
    tier: str
    adapter: str
    def __init__(self, request_id: _Optional[str] = ..., tenant: _Optional[str] = ..., prompt_tokens: _Optional[int] = ..., max_tokens: _Optional[int] = ..., retry: _Optional[bool] = ..., key_hash: _Optional[str] = ..., model: _Optional[str] = ..., prefix: _Optional[_Iterable[int]] = ..., block_tokens: _Optional[int] = ..., tier: _Optional[str] = ..., adapter: _Optional[str] = ...) -> None: ...

class SubmitReply(_message.Message):
    __slots__ = ("rejected", "message", "counter", "service_tier", "worker_id", "address", "ticket", "request_id", "retry_after_s", "redirect", "shard")
    REJECTED_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    COUNTER_FIELD_NUMBER: _ClassVar[int]
    SERVICE_TIER_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    TICKET_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    RETRY_AFTER_S_FIELD_NUMBER: _ClassVar[int]
    REDIRECT_FIELD_NUMBER: _ClassVar[int]
    SHARD_FIELD_NUMBER: _ClassVar[int]
    rejected: str
    message: str
    counter: float
    service_tier: str
    worker_id: str
    address: str
    ticket: Ticket
    request_id: str
    retry_after_s: float
    redirect: str
    shard: int
    def __init__(self, rejected: _Optional[str] = ..., message: _Optional[str] = ..., counter: _Optional[float] = ..., service_tier: _Optional[str] = ..., worker_id: _Optional[str] = ..., address: _Optional[str] = ..., ticket: _Optional[_Union[Ticket, _Mapping]] = ..., request_id: _Optional[str] = ..., retry_after_s: _Optional[float] = ..., redirect: _Optional[str] = ..., shard: _Optional[int] = ...) -> None: ...

class RoundCall(_message.Message):
    __slots__ = ("call", "method", "body")
    CALL_FIELD_NUMBER: _ClassVar[int]
    METHOD_FIELD_NUMBER: _ClassVar[int]
    BODY_FIELD_NUMBER: _ClassVar[int]
    call: int
    method: str
    body: bytes
    def __init__(self, call: _Optional[int] = ..., method: _Optional[str] = ..., body: _Optional[bytes] = ...) -> None: ...

class RoundAnswer(_message.Message):
    __slots__ = ("call", "body", "error")
    CALL_FIELD_NUMBER: _ClassVar[int]
    BODY_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    call: int
    body: bytes
    error: str
    def __init__(self, call: _Optional[int] = ..., body: _Optional[bytes] = ..., error: _Optional[str] = ...) -> None: ...

class WorkerMessage(_message.Message):
    __slots__ = ("hello", "report", "goodbye")
    HELLO_FIELD_NUMBER: _ClassVar[int]
    REPORT_FIELD_NUMBER: _ClassVar[int]
    GOODBYE_FIELD_NUMBER: _ClassVar[int]
    hello: Hello
    report: StepReport
    goodbye: Goodbye
    def __init__(self, hello: _Optional[_Union[Hello, _Mapping]] = ..., report: _Optional[_Union[StepReport, _Mapping]] = ..., goodbye: _Optional[_Union[Goodbye, _Mapping]] = ...) -> None: ...

class Hello(_message.Message):
    __slots__ = ("worker_id", "address", "kv_tokens", "max_running", "free_tokens", "running", "ended", "watermark_tokens", "max_loras")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    KV_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MAX_RUNNING_FIELD_NUMBER: _ClassVar[int]
    FREE_TOKENS_FIELD_NUMBER: _ClassVar[int]
    RUNNING_FIELD_NUMBER: _ClassVar[int]
    ENDED_FIELD_NUMBER: _ClassVar[int]
    WATERMARK_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MAX_LORAS_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    address: str
    kv_tokens: int
    max_running: int
    free_tokens: int
    running: _containers.RepeatedCompositeFieldContainer[RunningRequest]
    ended: _containers.RepeatedCompositeFieldContainer[RunningRequest]
    watermark_tokens: int
    max_loras: int
    def __init__(self, worker_id: _Optional[str] = ..., address: _Optional[str] = ..., kv_tokens: _Optional[int] = ..., max_running: _Optional[int] = ..., free_tokens: _Optional[int] = ..., running: _Optional[_Iterable[_Union[RunningRequest, _Mapping]]] = ..., ended: _Optional[_Iterable[_Union[RunningRequest, _Mapping]]] = ..., watermark_tokens: _Optional[int] = ..., max_loras: _Optional[int] = ...) -> None: ...

class RunningRequest(_message.Message):
    __slots__ = ("request_id", "tenant", "prompt_tokens", "output_tokens", "max_tokens", "ticket_expires_at", "adapter")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TICKET_EXPIRES_AT_FIELD_NUMBER: _ClassVar[int]
    ADAPTER_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    tenant: str
    prompt_tokens: int
    output_tokens: int
    max_tokens: int
    ticket_expires_at: float
    adapter: str
    def __init__(self, request_id: _Optional[str] = ..., tenant: _Optional[str] = ..., prompt_tokens: _Optional[int] = ..., output_tokens: _Optional[int] = ..., max_tokens: _Optional[int] = ..., ticket_expires_at: _Optional[float] = ..., adapter: _Optional[str] = ...) -> None: ...

class StepReport(_message.Message):
    __slots__ = ("started", "new_tokens", "finished", "free_tokens", "running", "waiting", "step_seconds", "adapters", "host_adapters", "adapter_load_seconds", "adapter_loads", "kv_events", "arrived", "ack")
    class AdapterLoadSecondsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    class AdapterLoadsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    STARTED_FIELD_NUMBER: _ClassVar[int]
    NEW_TOKENS_FIELD_NUMBER: _ClassVar[int]
    FINISHED_FIELD_NUMBER: _ClassVar[int]
    FREE_TOKENS_FIELD_NUMBER: _ClassVar[int]
    RUNNING_FIELD_NUMBER: _ClassVar[int]
    WAITING_FIELD_NUMBER: _ClassVar[int]
    STEP_SECONDS_FIELD_NUMBER: _ClassVar[int]
    ADAPTERS_FIELD_NUMBER: _ClassVar[int]
    HOST_ADAPTERS_FIELD_NUMBER: _ClassVar[int]
    ADAPTER_LOAD_SECONDS_FIELD_NUMBER: _ClassVar[int]
    ADAPTER_LOADS_FIELD_NUMBER: _ClassVar[int]
    KV_EVENTS_FIELD_NUMBER: _ClassVar[int]
    ARRIVED_FIELD_NUMBER: _ClassVar[int]
    ACK_FIELD_NUMBER: _ClassVar[int]
    started: _containers.RepeatedCompositeFieldContainer[Started]
    new_tokens: _containers.RepeatedCompositeFieldContainer[TokenCount]
    finished: _containers.RepeatedCompositeFieldContainer[Finished]
    free_tokens: int
    running: int
    waiting: int
    step_seconds: float
    adapters: _containers.RepeatedScalarFieldContainer[str]
    host_adapters: _containers.RepeatedScalarFieldContainer[str]
    adapter_load_seconds: _containers.ScalarMap[str, float]
    adapter_loads: _containers.ScalarMap[str, int]
    kv_events: _containers.RepeatedCompositeFieldContainer[KvEvent]
    arrived: _containers.RepeatedScalarFieldContainer[str]
    ack: int
    def __init__(self, started: _Optional[_Iterable[_Union[Started, _Mapping]]] = ..., new_tokens: _Optional[_Iterable[_Union[TokenCount, _Mapping]]] = ..., finished: _Optional[_Iterable[_Union[Finished, _Mapping]]] = ..., free_tokens: _Optional[int] = ..., running: _Optional[int] = ..., waiting: _Optional[int] = ..., step_seconds: _Optional[float] = ..., adapters: _Optional[_Iterable[str]] = ..., host_adapters: _Optional[_Iterable[str]] = ..., adapter_load_seconds: _Optional[_Mapping[str, float]] = ..., adapter_loads: _Optional[_Mapping[str, int]] = ..., kv_events: _Optional[_Iterable[_Union[KvEvent, _Mapping]]] = ..., arrived: _Optional[_Iterable[str]] = ..., ack: _Optional[int] = ...) -> None: ...

class KvEvent(_message.Message):
    __slots__ = ("kind", "medium", "hashes")
    KIND_FIELD_NUMBER: _ClassVar[int]
    MEDIUM_FIELD_NUMBER: _ClassVar[int]
    HASHES_FIELD_NUMBER: _ClassVar[int]
    kind: str
    medium: str
    hashes: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, kind: _Optional[str] = ..., medium: _Optional[str] = ..., hashes: _Optional[_Iterable[int]] = ...) -> None: ...

class Started(_message.Message):
    __slots__ = ("request_id", "prompt_tokens", "tenant", "max_tokens", "cached_tokens")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    CACHED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    prompt_tokens: int
    tenant: str
    max_tokens: int
    cached_tokens: int
    def __init__(self, request_id: _Optional[str] = ..., prompt_tokens: _Optional[int] = ..., tenant: _Optional[str] = ..., max_tokens: _Optional[int] = ..., cached_tokens: _Optional[int] = ...) -> None: ...

class TokenCount(_message.Message):
    __slots__ = ("request_id", "tokens")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    tokens: int
    def __init__(self, request_id: _Optional[str] = ..., tokens: _Optional[int] = ...) -> None: ...

class Finished(_message.Message):
    __slots__ = ("request_id", "output_tokens", "reason")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    output_tokens: int
    reason: str
    def __init__(self, request_id: _Optional[str] = ..., output_tokens: _Optional[int] = ..., reason: _Optional[str] = ...) -> None: ...

class Goodbye(_message.Message):
    __slots__ = ("reason",)
    REASON_FIELD_NUMBER: _ClassVar[int]
    reason: str
    def __init__(self, reason: _Optional[str] = ...) -> None: ...

class DispatcherMessage(_message.Message):
    __slots__ = ("welcome", "drain", "abort", "released", "pace", "revoke", "acked")
    WELCOME_FIELD_NUMBER: _ClassVar[int]
    DRAIN_FIELD_NUMBER: _ClassVar[int]
    ABORT_FIELD_NUMBER: _ClassVar[int]
    RELEASED_FIELD_NUMBER: _ClassVar[int]
    PACE_FIELD_NUMBER: _ClassVar[int]
    REVOKE_FIELD_NUMBER: _ClassVar[int]
    ACKED_FIELD_NUMBER: _ClassVar[int]
    welcome: Welcome
    drain: Drain
    abort: Abort
    released: Released
    pace: Pace
    revoke: Revoke
    acked: int
    def __init__(self, welcome: _Optional[_Union[Welcome, _Mapping]] = ..., drain: _Optional[_Union[Drain, _Mapping]] = ..., abort: _Optional[_Union[Abort, _Mapping]] = ..., released: _Optional[_Union[Released, _Mapping]] = ..., pace: _Optional[_Union[Pace, _Mapping]] = ..., revoke: _Optional[_Union[Revoke, _Mapping]] = ..., acked: _Optional[int] = ...) -> None: ...

class Pace(_message.Message):
    __slots__ = ("report_interval_s",)
    REPORT_INTERVAL_S_FIELD_NUMBER: _ClassVar[int]
    report_interval_s: float
    def __init__(self, report_interval_s: _Optional[float] = ...) -> None: ...

class Welcome(_message.Message):
    __slots__ = ("dispatcher_id",)
    DISPATCHER_ID_FIELD_NUMBER: _ClassVar[int]
    dispatcher_id: str
    def __init__(self, dispatcher_id: _Optional[str] = ...) -> None: ...

class Drain(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class Released(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class Abort(_message.Message):
    __slots__ = ("request_id",)
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    def __init__(self, request_id: _Optional[str] = ...) -> None: ...

class Revoke(_message.Message):
    __slots__ = ("request_id",)
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    def __init__(self, request_id: _Optional[str] = ...) -> None: ...

class Ticket(_message.Message):
    __slots__ = ("request_id", "tenant", "worker_id", "expires_at", "signature", "prompt_tokens", "max_tokens", "cache_group", "priority", "adapter", "adapter_path")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_AT_FIELD_NUMBER: _ClassVar[int]
    SIGNATURE_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    CACHE_GROUP_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    ADAPTER_FIELD_NUMBER: _ClassVar[int]
    ADAPTER_PATH_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    tenant: str
    worker_id: str
    expires_at: float
    signature: bytes
    prompt_tokens: int
    max_tokens: int
    cache_group: str
    priority: int
    adapter: str
    adapter_path: str
    def __init__(self, request_id: _Optional[str] = ..., tenant: _Optional[str] = ..., worker_id: _Optional[str] = ..., expires_at: _Optional[float] = ..., signature: _Optional[bytes] = ..., prompt_tokens: _Optional[int] = ..., max_tokens: _Optional[int] = ..., cache_group: _Optional[str] = ..., priority: _Optional[int] = ..., adapter: _Optional[str] = ..., adapter_path: _Optional[str] = ...) -> None: ...

class GenerateRequest(_message.Message):
    __slots__ = ("ticket", "endpoint", "body", "prompt_tokens", "max_tokens", "choices", "trace_context")
    class TraceContextEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    TICKET_FIELD_NUMBER: _ClassVar[int]
    ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    BODY_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    CHOICES_FIELD_NUMBER: _ClassVar[int]
    TRACE_CONTEXT_FIELD_NUMBER: _ClassVar[int]
    ticket: Ticket
    endpoint: str
    body: bytes
    prompt_tokens: int
    max_tokens: int
    choices: int
    trace_context: _containers.ScalarMap[str, str]
    def __init__(self, ticket: _Optional[_Union[Ticket, _Mapping]] = ..., endpoint: _Optional[str] = ..., body: _Optional[bytes] = ..., prompt_tokens: _Optional[int] = ..., max_tokens: _Optional[int] = ..., choices: _Optional[int] = ..., trace_context: _Optional[_Mapping[str, str]] = ...) -> None: ...

class GenerateChunk(_message.Message):
    __slots__ = ("data", "status", "content_type", "completion_tokens", "prompt_tokens", "finish_reason", "refusal")
    DATA_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    CONTENT_TYPE_FIELD_NUMBER: _ClassVar[int]
    COMPLETION_TOKENS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    REFUSAL_FIELD_NUMBER: _ClassVar[int]
    data: bytes
    status: int
    content_type: str
    completion_tokens: int
    prompt_tokens: int
    finish_reason: str
    refusal: Refusal
    def __init__(self, data: _Optional[bytes] = ..., status: _Optional[int] = ..., content_type: _Optional[str] = ..., completion_tokens: _Optional[int] = ..., prompt_tokens: _Optional[int] = ..., finish_reason: _Optional[str] = ..., refusal: _Optional[_Union[Refusal, _Mapping]] = ...) -> None: ...

class Refusal(_message.Message):
    __slots__ = ("code", "detail", "retryable")
    CODE_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    RETRYABLE_FIELD_NUMBER: _ClassVar[int]
    code: str
    detail: str
    retryable: bool
    def __init__(self, code: _Optional[str] = ..., detail: _Optional[str] = ..., retryable: _Optional[bool] = ...) -> None: ...
