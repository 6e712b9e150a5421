"""ASGI middleware for a frontend with flow control (docs/flow-control.md).

:class:`FlowMiddleware` puts every HTTP request through
``await monitor.dispatch(...)``: it waits in the model's queue when every
worker is busy, and goes to the app once a worker is booked for it. The app
finds its worker in ``scope["loadgate.worker"]`` and its
:class:`~loadgate.FlowTicket` in ``scope["loadgate.ticket"]`` (to report
output as it streams); the ticket completes when the response's last body
message has been sent, or when the app fails.

The request's own settings come from headers:

* ``x-loadgate-tenant`` (configurable, e.g. ``x-llm-d-inference-fairness-id``):
  its tenant;
* ``x-loadgate-priority``: its priority band, as :class:`AdmissionMiddleware`
  reads it (a number, or a name from ``priorities``);
* ``x-loadgate-deadline-ms``: how long it may wait, in milliseconds;
* ``x-loadgate-queue: never``: refused at once instead of waiting.

Clients choose these headers: where they must not choose their tenant or
band, set or strip them at a proxy you trust. A refusal is answered with the
loadgate error (529 ``queue_full`` or ``queue_deadline``, 503
``no_workers``, with ``Retry-After`` from the queue's drain rate and the
``x-loadgate-reason`` header); a malformed header with 400.

A worker that refuses a request before starting it (the app answers with
the overload status, 529 by default, and a worker's reason:
``worker_at_capacity``, ``queue_timeout`` or ``displaced``, or no reason
header, as a Dynamo worker's "Server overloaded") is not the client's
answer: the middleware holds the refusal back and hands the request to
:meth:`Monitor.redispatch`, which leases the refusing worker and puts the
request back into its queue at its place (with flow control) or sends it
to another free worker (without, at most the monitor's ``reroutes`` times);
then the app runs again with the new worker and the same request body.
Only when the monitor refuses it too does the client hear a 529. The
request body is kept for that, up to ``max_replay_body`` bytes; a larger
one is passed on once, and its worker's refusal answered as it is.
"""

from __future__ import annotations

import json
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple, Union

from . import _loadgate
from ._errors import LoadgateError
from ._flow import FlowTicket
from ._loadgate import Monitor
from .asgi import (
    PRIORITY_HEADER,
    ASGIApp,
    Message,
    Receive,
    Scope,
    Send,
    Style,
    _check_style,
    _class_number,
    _priority_map,
    _raw_header,
    _style_for,
    send_error,
)

__all__ = ["FlowMiddleware", "TENANT_HEADER", "DEADLINE_HEADER", "QUEUE_HEADER"]

#: The tenant's header by default.
TENANT_HEADER = _loadgate._TENANT_HEADER
#: A request's own deadline, in milliseconds.
DEADLINE_HEADER = _loadgate._DEADLINE_HEADER
#: ``never`` refuses a request at once instead of queueing it.
QUEUE_HEADER = _loadgate._QUEUE_HEADER

_DEADLINE = DEADLINE_HEADER.encode()
_QUEUE = QUEUE_HEADER.encode()
_REASON = _loadgate.REASON_HEADER.lower().encode()
#: A worker's reasons for refusing a request it never started.
_WORKER_REFUSALS = frozenset({b"worker_at_capacity", b"queue_timeout", b"displaced"})

#: ``(prompt_tokens, max_tokens)`` of a request, from its scope.
Cost = Callable[[Scope], Tuple[int, Optional[int]]]


def _lower(name: str, what: str) -> bytes:
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"{what} must be a non-empty str")
    return name.strip().lower().encode("latin-1")


class FlowMiddleware:
    """Dispatches every HTTP request of `app` through `monitor`'s queue for
    `model` (a name, or a function of the scope). `cost` gives a request's
    ``(prompt_tokens, max_tokens)`` when the frontend knows them (they
    weigh its tenant's share and the queue's token bound); without it each
    request costs the queue's output estimate. `blocks` is passed to
    :meth:`Monitor.dispatch` as is (``None``: the prompt in blocks of 16).
    A worker's refusal goes back to the monitor (module docs), with the
    request body kept up to `max_replay_body` bytes. See the module docs
    for the headers."""

    def __init__(
        self,
        app: ASGIApp,
        monitor: Monitor,
        *,
        model: Union[str, Callable[[Scope], str]],
        cost: Optional[Cost] = None,
        tenant_header: str = TENANT_HEADER,
        priority_header: str = PRIORITY_HEADER,
        priorities: Optional[Mapping[str, int]] = None,
        default_priority: int = 0,
        unknown_priority: int = 255,
        style: Style = "dynamo",
        max_replay_body: int = 8 << 20,
    ) -> None:
        _check_style(style)
        if not isinstance(max_replay_body, int) or max_replay_body < 0:
            raise ValueError("max_replay_body must be an int >= 0")
        self.max_replay_body = max_replay_body
        names = _priority_map(priorities)
        self.app = app
        self.monitor = monitor
        self.model = model
        self.cost = cost
        self.style = style
        self._tenant = _lower(tenant_header, "tenant_header")
        self._priority = _lower(priority_header, "priority_header")
        self._names = _loadgate._PriorityNames(
            list(names.items()),
            _class_number(default_priority, "default_priority"),
            _class_number(unknown_priority, "unknown_priority"),
        )

    def _settings(self, scope: Scope) -> Dict[str, Any]:
        tenant, deadline, queue = _loadgate._flow_headers(
            _raw_header(scope, self._tenant),
            _raw_header(scope, _DEADLINE),
            _raw_header(scope, _QUEUE),
        )
        settings: Dict[str, Any] = {
            "tenant": tenant,
            "priority": self._names.class_of(_raw_header(scope, self._priority)),
        }
        if deadline is not None:
            settings["deadline"] = deadline
        if queue is not None:
            settings["queue"] = queue
        if self.cost is not None:
            settings["prompt_tokens"], settings["max_tokens"] = self.cost(scope)
        return settings

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        model = self.model(scope) if callable(self.model) else self.model
        try:
            ticket: FlowTicket = await self.monitor.dispatch(model, **self._settings(scope))
        except LoadgateError as exc:
            await send_error(send, exc, _style_for(self.style, scope))
            return
        except ValueError as exc:
            await _bad_request(send, str(exc))
            return
        body = _Replay(receive, self.max_replay_body)
        while True:
            refusal = _HeldRefusal(send, ticket)
            routed = {**scope, "loadgate.worker": ticket.worker, "loadgate.ticket": ticket}
            try:
                await self.app(routed, body.receive, refusal.send)
            except BaseException:
                ticket.complete()
                raise
            if not refusal.held:
                ticket.complete()
                return
            if not body.replayable:
                ticket.complete()
                await refusal.release()
                return
            try:
                ticket = await self.monitor.redispatch(ticket)
            except LoadgateError as exc:
                await send_error(send, exc, _style_for(self.style, scope))
                return
            body.rewind()


class _HeldRefusal:
    """Wraps `send` for one try at a worker: a response that is the
    worker's refusal of a request it never started is held back (`held`),
    any other goes out; each chunk of a streamed body is the ticket's
    (:meth:`FlowTicket.chunk`: the SLO observes the stream), and the
    ticket completes with its last body message."""

    def __init__(self, send: Send, ticket: FlowTicket) -> None:
        self._send = send
        self._ticket = ticket
        self.held = False
        self._messages: List[Message] = []
        self._started = False
        self._streaming = False

    async def send(self, message: Message) -> None:
        if not self._started and message["type"] == "http.response.start":
            self._started = True
            self.held = _is_worker_refusal(message)
        if self.held:
            self._messages.append(message)
            return
        try:
            await self._send(message)
        finally:
            if message["type"] == "http.response.body":
                more = bool(message.get("more_body", False))
                # A streamed body's chunks; a body sent whole is no stream.
                self._streaming = self._streaming or more
                if self._streaming and message.get("body"):
                    self._ticket.chunk()
                if not more:
                    self._ticket.complete()

    async def release(self) -> None:
        """Sends the held refusal as it was (it cannot be tried again)."""
        for message in self._messages:
            await self._send(message)


def _is_worker_refusal(start: Message) -> bool:
    if start.get("status") != _loadgate.overload_status_code():
        return False
    for name, value in start.get("headers", ()):
        if bytes(name).lower() == _REASON:
            return bytes(value).strip().lower() in _WORKER_REFUSALS
    return True


class _Replay:
    """Keeps the request body the app reads, up to `limit` bytes, so that
    the request can be sent to another worker: after `rewind`, `receive`
    gives the kept messages again, then what the client sends next."""

    def __init__(self, receive: Receive, limit: int) -> None:
        self._receive = receive
        self._limit = limit
        self._kept: List[Message] = []
        self._size = 0
        self._next = 0
        self.replayable = True

    async def receive(self) -> Message:
        if self._next < len(self._kept):
            self._next += 1
            return self._kept[self._next - 1]
        message = await self._receive()
        if message["type"] == "http.request" and self.replayable:
            self._size += len(message.get("body", b""))
            if self._size > self._limit:
                self.replayable = False
                self._kept.clear()
            else:
                self._kept.append(message)
                self._next += 1
        return message

    def rewind(self) -> None:
        self._next = 0


async def _bad_request(send: Send, message: str) -> None:
    body = json.dumps({"message": message, "type": "Bad Request", "code": 400}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": 400, "headers": headers})
    await send({"type": "http.response.body", "body": body})
