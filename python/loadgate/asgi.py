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
  sent, streamed or not.
* :func:`hold_permit` and :func:`release_on_end` keep a permit until a
  streamed body ends, for apps that admit requests themselves.
* :class:`ControlApp` serves ``GET``/``POST /busy_threshold`` (optionally
  guarded by a bearer token) and ``GET /metrics`` for a
  :class:`~loadgate.Monitor` (and optionally gates), and passes every other
  request to an app of yours.

Example (a frontend)::

    monitor = loadgate.Monitor()
    app = LoadgateMiddleware(ControlApp(monitor, app=my_routes), style="openai")
"""

from __future__ import annotations

import json
from typing import (
    Any,
    AsyncGenerator,
    AsyncIterable,
    Awaitable,
    Callable,
    Dict,
    Iterable,
    List,
    Mapping,
    MutableMapping,
    Optional,
    Sequence,
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
    "PRIORITY_HEADER",
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
PRIORITY_HEADER = "x-loadgate-priority"

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


def error_response(
    exc: LoadgateError, style: str = "dynamo", retry_after: Optional[float] = None
) -> Tuple[int, Headers, bytes]:
    """``(status, headers, body)`` answering `exc`; `retry_after` (seconds)
    overrides the exception's own."""
    wait = exc.retry_after if retry_after is None else retry_after
    text, extra = _loadgate._error_response(exc.reason, style, exc.status_code, wait)
    body = text.encode()
    headers: Headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
    ]
    headers += [(name.encode("latin-1"), value.encode("latin-1")) for name, value in extra]
    return exc.status_code, headers, body


async def send_error(
    send: Send, exc: LoadgateError, style: str = "dynamo", retry_after: Optional[float] = None
) -> None:
    """Sends the complete HTTP answer to `exc`."""
    status, headers, body = error_response(exc, style, retry_after)
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


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
    """Wraps `send` and remembers whether the response has started."""

    __slots__ = ("send", "started")

    def __init__(self, send: Send) -> None:
        self.send = send
        self.started = False

    async def __call__(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self.started = True
        await self.send(message)


class LoadgateMiddleware:
    """Answers a :class:`~loadgate.LoadgateError` raised by `app` with the
    loadgate HTTP error (status, body in `style`, ``Retry-After`` and the
    reason header). An error raised after the response started cannot
    change it, and propagates to the server.

    `style` is ``"dynamo"`` (default), ``"openai"``, ``"anthropic"``, or a
    function of the ASGI scope returning one. `retry_after` (seconds), when
    given, overrides the exceptions' own."""

    def __init__(self, app: ASGIApp, *, style: Style = "dynamo", retry_after: Optional[float] = None) -> None:
        _check_style(style)
        self.app = app
        self.style = style
        self.retry_after = retry_after

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
                raise
            await send_error(send, error, _style_for(self.style, scope), self.retry_after)


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
        names: Dict[str, int] = {}
        for name, number in (priorities or {}).items():
            if not isinstance(name, str):
                raise TypeError(f"priorities keys must be str, not {type(name).__name__}")
            names[name.strip()] = _class_number(number, f"priorities[{name!r}]")
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

    def _guarded(self, scope: Scope) -> bool:
        if scope["type"] != "http":
            return False
        return self.paths is None or str(scope.get("path", "")).startswith(self.paths)

    def priority(self, scope: Scope) -> int:
        """The priority class of the request `scope` describes."""
        if self._header_name is None:
            return self.default_priority
        raw = _header(scope, self._header_name)
        if raw is None:
            return self.default_priority
        value = raw.strip(" \t")
        named = self.priorities.get(value)
        if named is not None:
            return named
        if value.isascii() and value.isdigit():
            digits = value.lstrip("0") or "0"
            # Anything past 255 is past the last class too: no need to
            # parse a long number.
            return _MAX_PRIORITY if len(digits) > 3 else min(int(digits), _MAX_PRIORITY)
        return self.unknown_priority

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


def _header(scope: Scope, name: bytes) -> Optional[str]:
    for key, value in scope.get("headers", ()):
        if key.lower() == name:
            return bytes(value).decode("latin-1")
    return None


class ControlApp:
    """The operator endpoints of a frontend (and its workers' gates):

    * ``GET /busy_threshold`` lists every model's thresholds; ``POST
      /busy_threshold`` reads or updates one model's (the core handler:
      404 unknown model, 400 invalid value or JSON, 422 wrong types, 415
      not JSON, 413 over 64 KiB);
    * ``GET /metrics`` renders the monitor's and the gates' metrics in the
      Prometheus text format.

    With a `token`, a write to ``/busy_threshold`` (a ``POST`` that sets or
    clears a threshold) must carry ``Authorization: Bearer <token>``, or is
    answered 401 with ``WWW-Authenticate: Bearer`` and ``{"error": "missing
    bearer token: ..."}`` or ``{"error": "invalid bearer token"}``, and
    changes nothing. Reads stay open unless `protect_reads` is true (then
    every ``/busy_threshold`` request needs the token; ``/metrics`` stays
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
            await self._busy_threshold(self.monitor, scope, receive, send)
        elif kind == "http" and path == self.metrics_path:
            await self._metrics(scope, send)
        elif self.app is not None:
            await self.app(scope, receive, send)
        elif kind == "lifespan":
            await self._lifespan(receive, send)
        elif kind == "http":
            body = json.dumps({"error": f"no route for {path}"}).encode()
            await _respond(send, 404, [_JSON], body)

    async def _busy_threshold(self, monitor: Monitor, scope: Scope, receive: Receive, send: Send) -> None:
        method = str(scope["method"]).upper()
        body = b""
        if method == "POST":
            body = await _read_body(receive, _loadgate.MAX_BUSY_THRESHOLD_BODY)
        content_type = _header(scope, b"content-type")
        authorization = _header(scope, b"authorization")
        status, out = monitor.handle_busy_threshold(
            method, content_type, body, authorization=authorization, auth=self.auth
        )
        headers = [_JSON]
        if status == 401:
            headers.append((b"www-authenticate", ControlAuth.CHALLENGE.encode()))
        elif status == 405:
            headers.append((b"allow", b"GET, HEAD, POST"))
        await _respond(send, status, headers, out, head=method == "HEAD")

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
