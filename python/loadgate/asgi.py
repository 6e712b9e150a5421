"""ASGI 3 glue for loadgate, with no framework dependency.

* :class:`LoadgateMiddleware` turns a :class:`~loadgate.LoadgateError` raised
  by the wrapped app (before it started its response) into the right HTTP
  answer: status (529 by default or 503), JSON body in the ``dynamo``,
  ``openai`` or ``anthropic`` style, ``Retry-After`` and the machine-readable
  reason header.
* :class:`AdmissionMiddleware` puts a worker's :class:`~loadgate.AdmissionGate`
  in front of an app: each request waits for a slot (``await gate.admit()``,
  in the priority class its ``x-loadgate-priority`` header names), marks its
  first response at the first body chunk (freeing its wait slot on a gate
  with a wait limit) and keeps the slot until its response body has been
  sent, streamed or not. :class:`EnvAdmissionMiddleware` is the same with
  its gate from the ``DYN_*`` environment variables, for hosts that build
  middleware from the class alone (vLLM's ``--middleware``).
* :func:`exception_handler` (and the ready-made
  :func:`loadgate_exception_handler`) answers a rejection from inside a
  Starlette or FastAPI app: ``app.add_exception_handler(LoadgateError,
  ...)``.
* :func:`hold_permit` and :func:`release_on_end` keep a permit until a
  streamed body ends, for apps that admit requests themselves.
* :class:`ControlApp` serves ``GET``/``POST /busy_threshold`` (optionally
  guarded by a bearer token) and ``GET /metrics`` for a
  :class:`~loadgate.Monitor` (and optionally gates), and passes every other
  request to an app of yours.

Example (a frontend)::

    monitor = loadgate.Monitor()
    app = LoadgateMiddleware(ControlApp(monitor, app=my_routes), style="openai")

Starlette and FastAPI answer an exception escaping a route themselves (their
outermost layer, ``ServerErrorMiddleware``, sends a 500 and then re-raises),
so a middleware wrapping such an app from outside would see the rejection
only after a 500 went out. Any of these answers it properly:

* wrapping from outside, ``LoadgateMiddleware(ControlApp(monitor,
  app=fastapi_app))`` (or ``LoadgateMiddleware(fastapi_app)``): the
  middleware registers its own :func:`exception_handler` for
  ``LoadgateError`` on every Starlette or FastAPI app it finds down the
  ``.app`` chain (through :class:`ControlApp`, :class:`AdmissionMiddleware`
  and any middleware that keeps the app it wraps as ``.app``), unless the app
  already has a handler for it or has already started serving. As a
  fallback (a rejection raised by one of the app's own middlewares, an app
  mounted inside another, an app already serving, or another framework
  that answers 500 and re-raises), a complete 500 answer is held back until
  the app returns: if the app then raises a rejection, the 500 is dropped
  and the rejection answered instead;
* ``app.add_middleware(LoadgateMiddleware, style="openai")``: it sits
  between the framework's error layer and its routes, and sees the
  rejection first (add it last, so that it wraps the other middlewares);
* ``app.add_exception_handler(LoadgateError, exception_handler("openai"))``.
"""

from __future__ import annotations

import importlib
import json
import sys
from typing import (
    Any,
    AsyncGenerator,
    AsyncIterable,
    Awaitable,
    Callable,
    ClassVar,
    Dict,
    Iterable,
    List,
    Mapping,
    MutableMapping,
    Optional,
    Sequence,
    Set,
    Tuple,
    TypeVar,
    Union,
)

from . import _loadgate
from ._errors import LoadgateError
from ._loadgate import AdmissionGate, ControlAuth, Monitor, Permit

__all__ = [
    "LoadgateMiddleware",
    "AdmissionMiddleware",
    "EnvAdmissionMiddleware",
    "PRIORITY_HEADER",
    "style_by_path",
    "exception_handler",
    "loadgate_exception_handler",
    "ControlApp",
    "hold_permit",
    "release_on_end",
    "error_response",
    "send_error",
]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]
#: An error body style, or a function choosing one per request (e.g. by path).
Style = Union[str, Callable[[Scope], str]]
Headers = List[Tuple[bytes, bytes]]

T = TypeVar("T")

_STYLES = _loadgate.ERROR_STYLES

#: The request header :class:`AdmissionMiddleware` reads the priority class
#: from by default.
PRIORITY_HEADER = _loadgate._PRIORITY_HEADER

#: The largest ``priority`` an admission takes.
_MAX_PRIORITY = 255


def _check_style(style: Style) -> None:
    if isinstance(style, str):
        if style not in _STYLES:
            raise ValueError(f"style = {style!r} is invalid: must be one of {', '.join(_STYLES)}")
    elif not callable(style):
        raise TypeError("style must be a str or a callable taking the ASGI scope")


def _style_for(style: Style, scope: Scope) -> str:
    return style if isinstance(style, str) else style(scope)


def style_by_path(scope: Scope) -> str:
    """The error body style for the API a request's path belongs to:
    ``"anthropic"`` for the Anthropic Messages API (``/v1/messages`` and
    below), ``"openai"`` for any other path under ``/v1/``, ``"dynamo"``
    otherwise. Pass it as ``style=`` to answer each API in its own shape."""
    path = str(scope.get("path", ""))
    if path == "/v1/messages" or path.startswith("/v1/messages/"):
        return "anthropic"
    return "openai" if path.startswith("/v1/") else "dynamo"


def error_response(
    exc: LoadgateError, style: str = "dynamo", retry_after: Optional[float] = None
) -> Tuple[int, Headers, bytes]:
    """``(status, headers, body)`` answering `exc`; `retry_after` (seconds)
    overrides the exception's own."""
    wait = exc.retry_after if retry_after is None else retry_after
    text, extra = _loadgate._error_response(exc.reason, style, exc.status_code, wait)
    body = text.encode()
    headers: Headers = [(b"content-length", str(len(body)).encode())]
    headers += [(name.encode("latin-1"), value.encode("latin-1")) for name, value in extra]
    return exc.status_code, headers, body


async def send_error(
    send: Send, exc: LoadgateError, style: str = "dynamo", retry_after: Optional[float] = None
) -> None:
    """Sends the complete HTTP answer to `exc`."""
    status, headers, body = error_response(exc, style, retry_after)
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


#: A Starlette/FastAPI exception handler: ``(request, exc) -> Response``.
ExceptionHandler = Callable[[Any, Exception], Awaitable[Any]]


def _starlette_response(status: int, headers: Headers, body: bytes) -> Any:
    responses: Any = importlib.import_module("starlette.responses")
    return responses.Response(
        content=body,
        status_code=status,
        headers={name.decode("latin-1"): value.decode("latin-1") for name, value in headers},
    )


def exception_handler(style: Style = "dynamo", *, retry_after: Optional[float] = None) -> ExceptionHandler:
    """A Starlette or FastAPI exception handler answering a
    :class:`~loadgate.LoadgateError` with its own status code, ``headers()``
    (``Retry-After`` and ``x-loadgate-reason``) and ``body(style)``::

        app.add_exception_handler(LoadgateError, exception_handler("openai"))

    `style` is a body style or a function of the ASGI scope returning one
    (such as :func:`style_by_path`); `retry_after` (seconds), when given,
    overrides the exceptions' own. The handler imports Starlette only when
    it answers. It answers rejections raised by the app's routes (and
    dependencies); one raised by a middleware of the app reaches the app's
    500 handler instead: wrap the app with :class:`LoadgateMiddleware` for
    those."""
    _check_style(style)

    async def handle_loadgate_error(request: Any, exc: Exception) -> Any:
        error = _loadgate_error(exc)
        if error is None:
            raise exc
        status, headers, body = error_response(error, _style_for(style, request.scope), retry_after)
        return _starlette_response(status, headers, body)

    return handle_loadgate_error


_dynamo_handler = exception_handler()


async def loadgate_exception_handler(request: Any, exc: Exception) -> Any:
    """:func:`exception_handler` with the ``dynamo`` body style, ready to
    register: ``app.add_exception_handler(LoadgateError,
    loadgate_exception_handler)``."""
    return await _dynamo_handler(request, exc)


def _loadgate_error(exc: BaseException) -> Optional[LoadgateError]:
    """`exc` itself, or the only error of an exception group (anyio task
    groups in some frameworks wrap errors raised by the app)."""
    if isinstance(exc, LoadgateError):
        return exc
    inner = getattr(exc, "exceptions", None)
    if isinstance(inner, tuple) and len(inner) == 1:
        return _loadgate_error(inner[0])
    return None


class _ResponseTracker:
    """Wraps `send` and remembers whether the response has started. A
    complete 500 answer (its start and one final body message), the way
    frameworks answer an exception escaping a route before re-raising it,
    is held back until :meth:`flush`, so that the answer to a rejection can
    replace it."""

    __slots__ = ("send", "started", "held")

    def __init__(self, send: Send) -> None:
        self.send = send
        self.started = False
        self.held: List[Message] = []

    async def __call__(self, message: Message) -> None:
        kind = message["type"]
        if self.held:
            if len(self.held) == 1 and kind == "http.response.body" and not message.get("more_body", False):
                self.held.append(message)
                return
            await self.flush()  # not a complete 500 answer: let it through
        elif not self.started and kind == "http.response.start" and message.get("status") == 500:
            self.held.append(message)
            return
        if kind == "http.response.start":
            self.started = True
        await self.send(message)

    async def flush(self) -> None:
        """Sends what is held back."""
        held, self.held = self.held, []
        if held:
            self.started = True
        for message in held:
            await self.send(message)


def _install_handler(app: object, handler: ExceptionHandler) -> List[Any]:
    """Registers `handler` for :class:`~loadgate.LoadgateError` on each
    Starlette (or FastAPI) app down the ``.app`` chain from `app` that has
    no handler for it yet and has not built its middleware stack (it does
    at its first event); returns those apps."""
    module = sys.modules.get("starlette.applications")
    starlette = getattr(module, "Starlette", None)
    if not isinstance(starlette, type):
        return []  # Starlette was never imported: no app of it exists
    installed: List[Any] = []
    seen: Set[int] = set()
    node: Any = app
    while node is not None and id(node) not in seen and len(seen) < 64:
        seen.add(id(node))
        target: Any = node
        if isinstance(target, starlette):
            handlers = getattr(node, "exception_handlers", None)
            if (
                getattr(node, "middleware_stack", None) is None
                and isinstance(handlers, dict)
                and LoadgateError not in handlers
            ):
                node.add_exception_handler(LoadgateError, handler)
                installed.append(node)
        node = getattr(node, "app", None)
    return installed


class LoadgateMiddleware:
    """Answers a :class:`~loadgate.LoadgateError` raised by `app` with the
    loadgate HTTP error (status, body in `style`, ``Retry-After`` and the
    reason header). An error raised after the response started cannot
    change it, and propagates to the server.

    `style` is ``"dynamo"`` (default), ``"openai"``, ``"anthropic"``, or a
    function of the ASGI scope returning one (such as
    :func:`style_by_path`). `retry_after` (seconds), when given, overrides
    the exceptions' own.

    Starlette and FastAPI apps answer an exception escaping a route with a
    500 of their own, before a middleware outside them sees it. So that
    wrapping them from outside works, the middleware registers its
    :func:`exception_handler` (same `style` and `retry_after`) for
    ``LoadgateError`` on each Starlette or FastAPI app down the ``.app``
    chain from `app` (through :class:`ControlApp`,
    :class:`AdmissionMiddleware` and other middleware keeping the app it
    wraps as ``.app``) that has no handler for it and has not started
    serving yet. And as a fallback for the rest, a complete 500 answer is
    held back until `app` returns: when `app` then raises a rejection, the
    500 is dropped and the rejection answered. (A 500 whose body is
    streamed in several parts is never held.)

    Inside a Starlette or FastAPI app, ``app.add_middleware(
    LoadgateMiddleware, style=...)`` works as is: add it last, so that it
    wraps the app's other middleware."""

    def __init__(self, app: ASGIApp, *, style: Style = "dynamo", retry_after: Optional[float] = None) -> None:
        _check_style(style)
        self.app = app
        self.style = style
        self.retry_after = retry_after
        self._handled_apps = _install_handler(app, exception_handler(style, retry_after=retry_after))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        tracker = _ResponseTracker(send)
        try:
            await self.app(scope, receive, tracker)
        except Exception as exc:
            error = _loadgate_error(exc)
            if error is None or tracker.started:
                await tracker.flush()
                raise
            # Anything held back (a framework's 500 for this very error) is
            # dropped.
            await send_error(send, error, _style_for(self.style, scope), self.retry_after)
            return
        await tracker.flush()


def release_on_end(permit: Permit, send: Send) -> Send:
    """A `send` that marks the permit's first response at the first body
    message (``permit.first_response()``, which frees its wait slot on a
    gate with a wait limit) and releases `permit` once the last body message
    (one without ``more_body``) has been sent. Release the permit in a
    ``finally`` too, for responses that end with an error."""
    responded = False

    async def send_then_release(message: Message) -> None:
        nonlocal responded
        if not responded and message["type"] == "http.response.body":
            responded = True
            permit.first_response()
        try:
            await send(message)
        finally:
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                permit.release()

    return send_then_release


async def hold_permit(
    permit: Permit, body: Union[AsyncIterable[T], Iterable[T]]
) -> AsyncGenerator[T, None]:
    """Yields the chunks of `body` and releases `permit` when the body ends,
    fails, or is closed early (a client that went away). Use it as the body
    of a streamed response so that the slot is held until the last chunk."""
    try:
        if hasattr(body, "__aiter__"):
            async for chunk in body:
                yield chunk
        else:
            for chunk in body:
                yield chunk
    finally:
        permit.release()


def _class_number(value: object, name: str) -> int:
    """A priority class number given to :class:`AdmissionMiddleware`."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, not {type(value).__name__}")
    if not 0 <= value <= _MAX_PRIORITY:
        raise ValueError(f"{name} = {value} is invalid: must be an integer from 0 to {_MAX_PRIORITY}")
    return value


def _priority_map(priorities: Optional[Mapping[str, int]]) -> Dict[str, int]:
    """The `priorities` argument of the middlewares: names (surrounding
    spaces ignored) to priority class numbers, each checked."""
    names: Dict[str, int] = {}
    for name, number in (priorities or {}).items():
        if not isinstance(name, str):
            raise TypeError(f"priorities keys must be str, not {type(name).__name__}")
        names[name.strip()] = _class_number(number, f"priorities[{name!r}]")
    return names


class AdmissionMiddleware:
    """Guards `app` with a worker's admission gate: every HTTP request (or
    only those whose path starts with one of `paths`) waits for a slot,
    marks its first response at the first body chunk (see
    :func:`release_on_end`) and keeps the slot until its response body has
    been sent. A rejected request is answered with the loadgate error (529
    ``worker_at_capacity``, ``queue_timeout`` or ``displaced``, 503
    ``closed``, with ``Retry-After`` and the ``x-loadgate-reason`` header).

    On a gate with priority classes (``AdmissionGate(..., classes=...)``),
    each request is admitted in the class its `priority_header`
    (``x-loadgate-priority`` by default) names:

    * header absent: `default_priority` (default 0, the most important);
    * a key of `priorities`, a map of names to classes such as
      ``{"interactive": 0, "batch": 2}`` (compared exactly, surrounding
      spaces ignored): that class;
    * otherwise a decimal integer: that class (one past the gate's last
      class counts as the last);
    * anything else (an unknown name, a negative or malformed number):
      `unknown_priority`, by default the gate's least important class.

    With ``priority_header=None`` no header is read: every request is in
    `default_priority`. A queued request that gives its place to a more
    important arrival is answered 529 with ``x-loadgate-reason:
    displaced``. Clients choose the header: where they must not choose
    their class, set or strip it at a proxy you trust."""

    def __init__(
        self,
        app: ASGIApp,
        gate: AdmissionGate,
        *,
        paths: Optional[Sequence[str]] = None,
        style: Style = "dynamo",
        priority_header: Optional[str] = PRIORITY_HEADER,
        priorities: Optional[Mapping[str, int]] = None,
        default_priority: int = 0,
        unknown_priority: Optional[int] = None,
    ) -> None:
        _check_style(style)
        if isinstance(paths, str):
            raise TypeError("paths must be a sequence of path prefixes, not a str")
        header: Optional[bytes] = None
        if priority_header is not None:
            if not isinstance(priority_header, str):
                raise TypeError("priority_header must be a str or None")
            if not priority_header.strip():
                raise ValueError("priority_header must not be empty (use None to read no header)")
            header = priority_header.strip().lower().encode("latin-1")
        names = _priority_map(priorities)
        self.app = app
        self.gate = gate
        self.paths = None if paths is None else tuple(paths)
        self.style = style
        self.priority_header = None if header is None else header.decode("latin-1")
        self.priorities = names
        self.default_priority = _class_number(default_priority, "default_priority")
        self.unknown_priority = (
            gate.classes - 1 if unknown_priority is None else _class_number(unknown_priority, "unknown_priority")
        )
        self._header_name = header
        self._names = _loadgate._PriorityNames(list(names.items()), self.default_priority, self.unknown_priority)

    def _guarded(self, scope: Scope) -> bool:
        if scope["type"] != "http":
            return False
        return self.paths is None or str(scope.get("path", "")).startswith(self.paths)

    def priority(self, scope: Scope) -> int:
        """The priority class of the request `scope` describes."""
        if self._header_name is None:
            return self.default_priority
        return self._names.class_of(_raw_header(scope, self._header_name))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if not self._guarded(scope):
            await self.app(scope, receive, send)
            return
        try:
            permit = await self.gate.admit(priority=self.priority(scope))
        except LoadgateError as exc:
            await send_error(send, exc, _style_for(self.style, scope))
            return
        try:
            await self.app(scope, receive, release_on_end(permit, send))
        finally:
            permit.release()


class EnvAdmissionMiddleware(AdmissionMiddleware):
    """An :class:`AdmissionMiddleware` that builds its own gate from the
    environment (:meth:`AdmissionGate.from_env`), for hosts that build
    middleware from the class alone, with ``app.add_middleware(cls)``, such
    as vLLM::

        DYN_BACKEND_ADMISSION_ENGINE_REQUEST_LIMIT=8 \\
            vllm serve MODEL --middleware loadgate.asgi.EnvAdmissionMiddleware

    The gate reads the engine request limit from
    ``DYN_BACKEND_ADMISSION_ENGINE_REQUEST_LIMIT`` (older name
    ``DYN_ENGINE_REQUEST_LIMIT``; required), the queue size from
    ``DYN_BACKEND_ADMISSION_REQUEST_QUEUE_LIMIT`` (older name
    ``DYN_DYNAMO_REQUEST_QUEUE_LIMIT``; default 16), the queue deadline from
    ``DYN_DYNAMO_REQUEST_QUEUE_TIMEOUT_MS`` and the wait limit from
    ``DYN_BACKEND_ADMISSION_ENGINE_WAIT_LIMIT``. A missing limit or an
    invalid value raises ``ValueError`` naming the variable, when the
    middleware is built: Starlette and FastAPI build their middleware at
    their first event (the lifespan startup, or else the first request).

    Two defaults differ from :class:`AdmissionMiddleware`: only paths
    under ``/v1/`` are guarded (the OpenAI and Anthropic APIs; health
    checks, ``/metrics`` and the like are not), and the error body takes
    the shape of the API the path belongs to (:func:`style_by_path`). The
    other keywords are :class:`AdmissionMiddleware`'s; to change them where
    only a class can be named, subclass this one and pass them to
    ``super().__init__``. Every instance has a gate of its own: the limit
    holds per server process (one per API server process of vLLM). The gate
    is the ``gate`` attribute."""

    #: The path prefixes guarded by default.
    DEFAULT_PATHS: ClassVar[Tuple[str, ...]] = ("/v1/",)

    def __init__(
        self,
        app: ASGIApp,
        *,
        paths: Optional[Sequence[str]] = DEFAULT_PATHS,
        style: Style = style_by_path,
        priority_header: Optional[str] = PRIORITY_HEADER,
        priorities: Optional[Mapping[str, int]] = None,
        default_priority: int = 0,
        unknown_priority: Optional[int] = None,
    ) -> None:
        try:
            gate = AdmissionGate.from_env()
        except ValueError as exc:
            raise ValueError(f"{type(self).__name__}: {exc}") from None
        super().__init__(
            app,
            gate,
            paths=paths,
            style=style,
            priority_header=priority_header,
            priorities=priorities,
            default_priority=default_priority,
            unknown_priority=unknown_priority,
        )


_JSON = (b"content-type", b"application/json")
_METRICS_TYPE = (b"content-type", b"text/plain; version=0.0.4; charset=utf-8")


async def _respond(send: Send, status: int, headers: Headers, body: bytes, head: bool = False) -> None:
    headers = headers + [(b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": b"" if head else body})


async def _read_body(receive: Receive, limit: int) -> bytes:
    """The request body, cut at `limit` + 1 bytes (enough to know it is too
    large) so that an oversized body is never held in full."""
    chunks: List[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            break
        chunk = message.get("body", b"")
        if size <= limit:
            chunks.append(chunk[: limit + 1 - size])
            size += len(chunk)
        if not message.get("more_body", False):
            break
    return b"".join(chunks)


def _raw_header(scope: Scope, name: bytes) -> Optional[bytes]:
    for key, value in scope.get("headers", ()):
        if key.lower() == name:
            return bytes(value)
    return None


def _header(scope: Scope, name: bytes) -> Optional[str]:
    raw = _raw_header(scope, name)
    return None if raw is None else raw.decode("latin-1")


class ControlApp:
    """The operator endpoints of a frontend (and its workers' gates):

    * ``GET /busy_threshold`` lists every model's thresholds; ``POST
      /busy_threshold`` reads or updates one model's (the core handler,
      answering as Dynamo 1.6.1 does: 404 unknown model, 400 invalid value,
      422 wrong types, and in plain text 400 malformed JSON, 415 not JSON,
      413 over 2 MiB; 405 with an empty body);
    * ``GET /slo`` lists every model's SLO; ``POST /slo`` reads one
      (``{"model"}``), sets it (``{"model", "ttft", "tpot", "advisory"}``,
      seconds) or clears it (``{"model", "clear": true}``), with the same
      refusals (:meth:`Monitor.set_slo`);
    * ``GET /metrics`` renders the monitor's and the gates' metrics in the
      Prometheus text format.

    With a `token`, a write to ``/busy_threshold`` or ``/slo`` (a ``POST``
    that sets or clears a threshold or an SLO) must carry ``Authorization: Bearer <token>``, or is
    answered 401 with ``WWW-Authenticate: Bearer`` and ``{"error": "missing
    bearer token: ..."}`` or ``{"error": "invalid bearer token"}``, and
    changes nothing. Reads stay open unless `protect_reads` is true (then
    every ``/busy_threshold`` and ``/slo`` request needs the token; ``/metrics`` stays
    open). An empty token raises ``ValueError``, and so does `protect_reads`
    without a token. Bind the control port to a private interface too.

    Any other request goes to `app`, or gets 404 without one. Lifespan
    events go to `app`, or are acknowledged without one."""

    def __init__(
        self,
        monitor: Optional[Monitor] = None,
        gate: Union[AdmissionGate, Sequence[AdmissionGate], None] = None,
        *,
        app: Optional[ASGIApp] = None,
        busy_threshold_path: str = "/busy_threshold",
        slo_path: str = "/slo",
        metrics_path: str = "/metrics",
        token: Optional[str] = None,
        protect_reads: bool = False,
    ) -> None:
        if monitor is not None and not isinstance(monitor, Monitor):
            raise TypeError("monitor must be a loadgate.Monitor or None")
        gates: Sequence[AdmissionGate]
        if gate is None:
            gates = ()
        elif isinstance(gate, AdmissionGate):
            gates = (gate,)
        else:
            gates = tuple(gate)
        if not all(isinstance(g, AdmissionGate) for g in gates):
            raise TypeError("gate must be a loadgate.AdmissionGate, a sequence of them, or None")
        if token is None and protect_reads:
            raise ValueError("protect_reads needs a token")
        self.auth = None if token is None else ControlAuth(token, protect_reads=protect_reads)
        self.monitor = monitor
        self.gates = gates
        self.app = app
        self.busy_threshold_path = busy_threshold_path
        self.slo_path = slo_path
        self.metrics_path = metrics_path

    def metrics_text(self) -> str:
        """The monitor's and the gates' metrics, in that order."""
        parts = [] if self.monitor is None else [self.monitor.metrics_text()]
        parts += [g.metrics_text() for g in self.gates]
        return "".join(parts)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        path = scope.get("path")
        if kind == "http" and self.monitor is not None and path == self.busy_threshold_path:
            await self._control(self.monitor.handle_busy_threshold, scope, receive, send)
        elif kind == "http" and self.monitor is not None and path == self.slo_path:
            await self._control(self.monitor.handle_slo, scope, receive, send)
        elif kind == "http" and path == self.metrics_path:
            await self._metrics(scope, send)
        elif self.app is not None:
            await self.app(scope, receive, send)
        elif kind == "lifespan":
            await self._lifespan(receive, send)
        elif kind == "http":
            body = json.dumps({"error": f"no route for {path}"}).encode()
            await _respond(send, 404, [_JSON], body)

    async def _control(self, handle: Any, scope: Scope, receive: Receive, send: Send) -> None:
        """One request of a control endpoint, answered by the monitor's
        `handle` (``handle_busy_threshold`` or ``handle_slo``)."""
        method = str(scope["method"]).upper()
        body = b""
        if method == "POST":
            body = await _read_body(receive, _loadgate.MAX_BUSY_THRESHOLD_BODY)
        content_type = _header(scope, b"content-type")
        authorization = _header(scope, b"authorization")
        status, headers, out = handle(method, content_type, body, authorization=authorization, auth=self.auth)
        raw = [(name.encode(), value.encode()) for name, value in headers]
        await _respond(send, status, raw, out, head=method == "HEAD")

    async def _metrics(self, scope: Scope, send: Send) -> None:
        method = str(scope["method"]).upper()
        if method not in ("GET", "HEAD"):
            body = json.dumps({"error": f"method {method} not allowed; use GET"}).encode()
            await _respond(send, 405, [_JSON, (b"allow", b"GET, HEAD")], body)
            return
        await _respond(send, 200, [_METRICS_TYPE], self.metrics_text().encode(), head=method == "HEAD")

    @staticmethod
    async def _lifespan(receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return
