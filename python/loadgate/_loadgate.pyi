"""Type stub of the native module ``loadgate._loadgate`` (checked against the
built module by ``tests/test_stub.py`` with mypy's stubtest)."""

from os import PathLike
from types import TracebackType
from typing import (
    Any,
    ClassVar,
    Coroutine,
    Dict,
    Generator,
    Iterable,
    Literal,
    List,
    Mapping,
    Optional,
    Sequence,
    Tuple,
    Type,
    Union,
    final,
    overload,
)

from ._flow import FlowTicket

__all__ = [
    "__version__",
    "REASON_HEADER",
    "MAX_BUSY_THRESHOLD_BODY",
    "ERROR_STYLES",
    "_PRIORITY_HEADER",
    "_TENANT_HEADER",
    "_DEADLINE_HEADER",
    "_QUEUE_HEADER",
    "_flow_headers",
    "_FlowDispatch",
    "_FlowTicket",
    "overload_status_code",
    "_reason_info",
    "_check_status_code",
    "_error_response",
    "_noop",
    "_noop_arg",
    "Monitor",
    "Route",
    "ControlAuth",
    "_PriorityNames",
    "Booking",
    "Subscription",
    "BookingSync",
    "Reporter",
    "Scrape",
    "Discovery",
    "AdmissionGate",
    "PriorityClass",
    "Permit",
    "Admission",
    "ManualClock",
]
__version__: str
REASON_HEADER: str
MAX_BUSY_THRESHOLD_BODY: int
ERROR_STYLES: Tuple[str, ...]
_PRIORITY_HEADER: str
_TENANT_HEADER: str
_DEADLINE_HEADER: str
_QUEUE_HEADER: str

def _flow_headers(
    tenant: Optional[bytes], deadline_ms: Optional[bytes], queue: Optional[bytes]
) -> Tuple[Optional[str], Optional[float], Optional[bool]]: ...

def overload_status_code() -> int: ...
def _reason_info(reason: str) -> Tuple[str, int]: ...
def _check_status_code(status_code: int) -> int: ...
def _error_response(
    reason: str, style: str, status: int, retry_after: Optional[float]
) -> Tuple[str, List[Tuple[str, str]]]: ...
def _noop() -> None: ...
def _noop_arg(_arg: object) -> None: ...

_Threshold = Union[float, int, None]

@final
class Monitor:
    def __new__(
        cls,
        *,
        lease_seconds: float = 1.0,
        staleness: str = "keep",
        stale_after: float = 3.0,
        metrics_prefix: str = "dynamo",
        max_models: int = 256,
        max_workers: int = 16384,
        max_workers_per_model: int = 4096,
        max_ranks_per_worker: int = 1024,
        max_ranks: int = 65536,
        max_name_len: int = 256,
        clock: Optional[ManualClock] = None,
        maintenance: str = "background",
        dynamo_env: bool = False,
        routing: str = "round_robin",
        reroutes: int = 1,
    ) -> Monitor: ...
    def add_worker(
        self,
        model: str,
        worker_id: int,
        *,
        dp_size: int = 1,
        dp_start: int = 0,
        kv_total_blocks: Optional[int] = None,
        max_num_batched_tokens: Optional[int] = None,
        max_num_seqs: Optional[int] = None,
    ) -> None: ...
    def remove_worker(self, worker_id: int) -> None: ...
    def workers(self, model: str) -> List[int]: ...
    def models(self) -> List[str]: ...
    def report(
        self,
        worker_id: int,
        dp_rank: int = 0,
        *,
        active_decode_blocks: Optional[int] = None,
        kv_used_blocks: Optional[int] = None,
        active_prefill_tokens: Optional[int] = None,
        kv_total_blocks: Optional[int] = None,
        max_num_batched_tokens: Optional[int] = None,
        waiting_requests: Optional[int] = None,
        max_num_seqs: Optional[int] = None,
    ) -> None: ...
    def set_thresholds(
        self,
        model: str,
        *,
        active_decode_blocks_threshold: Optional[float] = None,
        active_prefill_tokens_threshold: Optional[int] = None,
        active_prefill_tokens_threshold_frac: Optional[float] = None,
        waiting_requests_threshold: Optional[int] = None,
        clear: Sequence[str] = (),
    ) -> Dict[str, Any]: ...
    def set_default_thresholds(
        self,
        *,
        active_decode_blocks_threshold: Optional[float] = None,
        active_prefill_tokens_threshold: Optional[int] = None,
        active_prefill_tokens_threshold_frac: Optional[float] = None,
        waiting_requests_threshold: Optional[int] = None,
        clear: Sequence[str] = (),
    ) -> Dict[str, Any]: ...
    def thresholds(self, model: str) -> Dict[str, Any]: ...
    def set_staleness(self, model: str, staleness: str, stale_after: Optional[float] = None) -> None: ...
    def sweep(self) -> int: ...
    def maintain(self) -> Optional[float]: ...
    def set_flow_control(
        self,
        model: str,
        *,
        queue_limit: int,
        queue_tokens: Optional[int] = None,
        deadline: float = 60.0,
        prompt_weight: float = 1.0,
        output_weight: float = 2.0,
        tenant_weights: Optional[Mapping[str, float]] = None,
        output_estimate: int = 256,
        max_tenants: int = 4096,
        scale_up_limit: int = 0,
        policy: str = "round_robin",
    ) -> None: ...
    def set_default_flow_control(
        self,
        *,
        queue_limit: int,
        queue_tokens: Optional[int] = None,
        deadline: float = 60.0,
        prompt_weight: float = 1.0,
        output_weight: float = 2.0,
        tenant_weights: Optional[Mapping[str, float]] = None,
        output_estimate: int = 256,
        max_tenants: int = 4096,
        scale_up_limit: int = 0,
        policy: str = "round_robin",
    ) -> None: ...
    def dispatch(
        self,
        model: str,
        *,
        tenant: Optional[str] = None,
        priority: int = 0,
        prompt_tokens: int = 0,
        max_tokens: Optional[int] = None,
        deadline: Optional[float] = None,
        queue: bool = True,
        blocks: Optional[int] = None,
    ) -> _FlowDispatch: ...
    def redispatch(self, ticket: Union[FlowTicket, _FlowTicket]) -> _FlowDispatch: ...
    def is_busy(self, worker_id: int) -> bool: ...
    def is_leased(self, worker_id: int) -> bool: ...
    def busy_workers(self, model: str) -> List[int]: ...
    def select(self, model: str, *, policy: str = "round_robin", endpoint: Optional[str] = None) -> int: ...
    def route(self, model: str) -> Route: ...
    def select_min_cost(self, model: str, costs: Mapping[int, float]) -> int: ...
    def check(self, worker_id: int, *, endpoint: Optional[str] = None) -> None: ...
    def mark_overloaded(self, worker_id: int) -> None: ...
    def book(
        self, worker_id: int, dp_rank: int, blocks: int, *, prefill_tokens: Optional[int] = None
    ) -> Booking: ...
    def handle_busy_threshold(
        self,
        method: str,
        content_type: Optional[str],
        body: bytes,
        *,
        authorization: Optional[str] = None,
        auth: Optional[ControlAuth] = None,
    ) -> Tuple[int, List[Tuple[str, str]], bytes]: ...
    def handle_slo(
        self,
        method: str,
        content_type: Optional[str],
        body: bytes,
        *,
        authorization: Optional[str] = None,
        auth: Optional[ControlAuth] = None,
    ) -> Tuple[int, List[Tuple[str, str]], bytes]: ...
    def metrics_text(self) -> str: ...
    def subscribe_nats(
        self,
        url: str,
        namespace: str = "default",
        *,
        expire_after: float = 3.0,
        dynamo: Optional[Tuple[str, str]] = None,
        announce_bookings: bool = False,
        user: Optional[str] = None,
        password: Optional[str] = None,
        token: Optional[str] = None,
        credentials: Optional[Union[str, PathLike[str]]] = None,
        tls_ca: Optional[Union[str, PathLike[str]]] = None,
        tls_cert: Optional[Union[str, PathLike[str]]] = None,
        tls_key: Optional[Union[str, PathLike[str]]] = None,
        connect_timeout: float = 2.0,
    ) -> Subscription: ...
    def set_slo(
        self, model: str, *, ttft: Optional[float], tpot: Optional[float], advisory: bool = False
    ) -> None: ...
    def slo(self, model: str) -> Optional[Dict[str, Any]]: ...
    def predict(self, worker_id: int, dp_rank: int, prompt_tokens: int) -> Dict[str, Any]: ...
    def sync_bookings(
        self,
        url: str,
        namespace: str = "default",
        *,
        frontend_id: str,
        mode: Literal["shared", "leased"] = "shared",
        lease: float = 1.0,
        debounce: float = 0.002,
        heartbeat: float = 1.0,
        snapshot_every: float = 10.0,
        expire_after: float = 3.0,
        max_frontends: int = 64,
        max_entries: int = 262144,
        user: Optional[str] = None,
        password: Optional[str] = None,
        token: Optional[str] = None,
        credentials: Optional[Union[str, PathLike[str]]] = None,
        tls_ca: Optional[Union[str, PathLike[str]]] = None,
        tls_cert: Optional[Union[str, PathLike[str]]] = None,
        tls_key: Optional[Union[str, PathLike[str]]] = None,
        connect_timeout: float = 2.0,
    ) -> BookingSync: ...
    def scrape(
        self,
        model: Optional[str],
        worker_id: int,
        url: str,
        *,
        engine: str = "vllm",
        interval: float = 0.5,
        timeout: float = 2.0,
        max_num_seqs: Optional[int] = None,
    ) -> Scrape: ...
    def discover_dynamo(
        self,
        namespace: str = "dynamo",
        *,
        backend: str = "file",
        path: Optional[Union[str, PathLike[str]]] = None,
        component: Optional[str] = None,
        endpoint: Optional[str] = None,
        interval: float = 0.5,
        ttl: Optional[float] = 10.0,
        endpoints: Union[str, Sequence[str], None] = None,
        user: Optional[str] = None,
        password: Optional[str] = None,
        connect_timeout: float = 2.0,
    ) -> Discovery: ...

@final
class Route:
    def select(self, *, policy: str = "round_robin", endpoint: Optional[str] = None) -> int: ...
    @property
    def model(self) -> str: ...

@final
class Scrape:
    def close(self) -> None: ...
    def stats(self) -> Dict[str, Any]: ...
    @property
    def closed(self) -> bool: ...
    def __enter__(self) -> Scrape: ...
    def __exit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
        /,
    ) -> bool: ...

@final
class Discovery:
    def close(self) -> None: ...
    def stats(self) -> Dict[str, Any]: ...
    @property
    def source(self) -> str: ...
    @property
    def closed(self) -> bool: ...
    def __enter__(self) -> Discovery: ...
    def __exit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
        /,
    ) -> bool: ...

@final
class ControlAuth:
    CHALLENGE: ClassVar[str]
    def __new__(cls, token: str, *, protect_reads: bool = False) -> ControlAuth: ...
    @property
    def protect_reads(self) -> bool: ...

@final
class _PriorityNames:
    def __new__(cls, names: List[Tuple[str, int]], default: int, unknown: int) -> _PriorityNames: ...
    def class_of(self, value: Optional[bytes]) -> int: ...

@final
class Booking:
    def add_output_blocks(self, n: int) -> None: ...
    def prefill_done(self) -> None: ...
    def first_token(self) -> None: ...
    def tokens(self, n: int = 1) -> None: ...
    def expect_output(self, max_tokens: Optional[int] = None) -> None: ...
    def finish(self, output_tokens: Optional[int] = None) -> None: ...
    @property
    def output_tokens(self) -> int: ...
    @property
    def reserved_blocks(self) -> int: ...
    def release(self) -> None: ...
    @property
    def blocks(self) -> int: ...
    @property
    def prefill_tokens(self) -> int: ...
    @property
    def worker_id(self) -> int: ...
    @property
    def dp_rank(self) -> int: ...
    @property
    def released(self) -> bool: ...
    def __enter__(self) -> Booking: ...
    def __exit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
        /,
    ) -> bool: ...

@final
class Subscription:
    @property
    def router_id(self) -> Optional[int]: ...
    def close(self) -> None: ...
    def stats(self) -> Dict[str, int]: ...
    def refusals(self) -> Dict[str, int]: ...
    def metrics_text(self) -> str: ...
    def __enter__(self) -> Subscription: ...
    def __exit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
        /,
    ) -> bool: ...

@final
class BookingSync:
    @property
    def frontend_id(self) -> str: ...
    def close(self) -> None: ...
    def stats(self) -> Dict[str, int]: ...
    def remote_queues(self) -> List[Tuple[str, str, int, int]]: ...
    def __enter__(self) -> BookingSync: ...
    def __exit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
        /,
    ) -> bool: ...

@final
class Reporter:
    def __new__(
        cls,
        url: str,
        worker_id: int,
        model: str,
        *,
        namespace: str = "default",
        dp_size: int = 1,
        dp_start: int = 0,
        kv_total_blocks: Optional[int] = None,
        max_num_batched_tokens: Optional[int] = None,
        max_num_seqs: Optional[int] = None,
        heartbeat: float = 1.0,
        dynamo: Optional[Tuple[str, str]] = None,
        user: Optional[str] = None,
        password: Optional[str] = None,
        token: Optional[str] = None,
        credentials: Optional[Union[str, PathLike[str]]] = None,
        tls_ca: Optional[Union[str, PathLike[str]]] = None,
        tls_cert: Optional[Union[str, PathLike[str]]] = None,
        tls_key: Optional[Union[str, PathLike[str]]] = None,
        connect_timeout: float = 2.0,
    ) -> Reporter: ...
    def report(
        self,
        dp_rank: int = 0,
        *,
        active_decode_blocks: Optional[int] = None,
        kv_used_blocks: Optional[int] = None,
        active_prefill_tokens: Optional[int] = None,
        kv_total_blocks: Optional[int] = None,
        max_num_batched_tokens: Optional[int] = None,
        waiting_requests: Optional[int] = None,
        max_num_seqs: Optional[int] = None,
    ) -> None: ...
    def close(self) -> None: ...
    def __enter__(self) -> Reporter: ...
    def __exit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
        /,
    ) -> bool: ...

@final
class PriorityClass:
    def __new__(
        cls,
        *,
        queue: Optional[int] = None,
        queue_timeout: Optional[float] = None,
        reserved: int = 0,
    ) -> PriorityClass: ...
    @property
    def queue(self) -> Optional[int]: ...
    @property
    def queue_timeout(self) -> Optional[float]: ...
    @property
    def reserved(self) -> int: ...
    def __eq__(self, value: object, /) -> bool: ...
    def __hash__(self) -> int: ...

_Classes = Union[int, Iterable[PriorityClass], None]

@final
class AdmissionGate:
    def __new__(
        cls,
        limit: int,
        queue: int = 16,
        *,
        wait_limit: Optional[int] = None,
        queue_timeout: Optional[float] = None,
        adaptive_lifo: bool = False,
        metrics_prefix: str = "dynamo",
        classes: _Classes = None,
        clock: Optional[ManualClock] = None,
    ) -> AdmissionGate: ...
    @classmethod
    def from_env(
        cls, limit: Optional[int] = None, *, classes: _Classes = None, clock: Optional[ManualClock] = None
    ) -> AdmissionGate: ...
    def try_admit(self, *, priority: int = 0) -> Optional[Permit]: ...
    def admit(self, *, priority: int = 0) -> Admission: ...
    def admit_blocking(self, timeout: Optional[float] = None, *, priority: int = 0) -> Permit: ...
    def set_limit(self, limit: int) -> None: ...
    def close(self) -> None: ...
    def expire(self) -> int: ...
    @property
    def limit(self) -> int: ...
    @property
    def queue_limit(self) -> int: ...
    @property
    def wait_limit(self) -> Optional[int]: ...
    @property
    def waiting(self) -> int: ...
    @property
    def running(self) -> int: ...
    @property
    def queued(self) -> int: ...
    @property
    def closed(self) -> bool: ...
    @property
    def queue_timeout(self) -> Optional[float]: ...
    @property
    def classes(self) -> int: ...
    def stats(self) -> Dict[str, Any]: ...
    def metrics_text(self) -> str: ...

@final
class Permit:
    def release(self) -> None: ...
    def first_response(self) -> None: ...
    @property
    def released(self) -> bool: ...
    def __enter__(self) -> Permit: ...
    def __exit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
        /,
    ) -> bool: ...

@final
class Admission(Coroutine[Any, Any, Permit]):
    def __await__(self) -> Generator[Any, None, Permit]: ...
    def __next__(self) -> Any: ...
    def send(self, value: None, /) -> Any: ...
    @overload
    def throw(
        self, typ: Type[BaseException], val: Union[BaseException, object] = None, tb: Optional[TracebackType] = None, /
    ) -> Any: ...
    @overload
    def throw(self, typ: BaseException, val: None = None, tb: Optional[TracebackType] = None, /) -> Any: ...
    def close(self) -> None: ...
    @property
    def cr_await(self) -> Any: ...
    @property
    def __name__(self) -> str: ...
    @property
    def __qualname__(self) -> str: ...
    def __aenter__(self) -> Admission: ...
    async def __aexit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
        /,
    ) -> None: ...

@final
class ManualClock:
    def __new__(cls) -> ManualClock: ...
    def advance(self, seconds: float) -> None: ...
    def now(self) -> float: ...

@final
class _FlowDispatch:
    def __await__(self) -> Generator[Any, None, FlowTicket]: ...
    def _start(self) -> Tuple[bool, Any]: ...
    def _cancel(self) -> bool: ...

@final
class _FlowTicket:
    @property
    def worker(self) -> int: ...
    @property
    def dp_rank(self) -> int: ...
    @property
    def completed(self) -> bool: ...
    def add_output_blocks(self, n: int) -> None: ...
    def report_output(self, tokens: int) -> None: ...
    def prefill_done(self) -> None: ...
    def chunk(self) -> None: ...
    def complete(self, output_tokens: Optional[int] = None) -> None: ...
