"""The exceptions loadgate raises, one class per rejection reason.

Every rejection is a :class:`LoadgateError` carrying what an HTTP frontend
needs to answer it: ``status_code`` (the overload status, 529 by default, or
503), ``reason`` (a stable machine-readable name) and ``retry_after``
(seconds). :meth:`LoadgateError.body` and :meth:`LoadgateError.headers` build
the response exactly as the core does for every binding.
"""

from __future__ import annotations

import json
from typing import Any, ClassVar, Dict, Optional

from . import _loadgate

__all__ = [
    "LoadgateError",
    "Overloaded",
    "WorkerOverloaded",
    "AtCapacity",
    "QueueTimeout",
    "Displaced",
    "Unavailable",
    "Closed",
]


class LoadgateError(Exception):
    """A request loadgate rejected.

    Subclasses fix ``reason``; the message, status and ``Retry-After`` follow
    from it unless given. ``LoadgateError`` itself needs ``reason=``.
    """

    #: The reason subclasses raise with.
    default_reason: ClassVar[Optional[str]] = None

    status_code: int
    reason: str
    retry_after: Optional[float]

    def __init__(
        self,
        message: Optional[str] = None,
        *,
        reason: Optional[str] = None,
        status_code: Optional[int] = None,
        retry_after: Optional[float] = 1.0,
    ) -> None:
        if reason is None:
            reason = self.default_reason
        if reason is None:
            raise TypeError(f"{type(self).__name__}() needs reason=")
        default_message, default_status = _loadgate._reason_info(reason)
        if status_code is None:
            status_code = default_status
        elif isinstance(status_code, bool) or not isinstance(status_code, int):
            raise TypeError("status_code must be an int")
        else:
            _loadgate._check_status_code(status_code)
        if retry_after is not None:
            if isinstance(retry_after, bool) or not isinstance(retry_after, (int, float)):
                raise TypeError("retry_after must be a number of seconds or None")
            if not 0 <= retry_after < float("inf"):
                raise ValueError(
                    f"retry_after = {retry_after} is invalid: must be a finite number >= 0"
                )
        super().__init__(default_message if message is None else message)
        self.reason = reason
        self.status_code = status_code
        self.retry_after = None if retry_after is None else float(retry_after)

    @property
    def message(self) -> str:
        """The human message."""
        return str(self.args[0]) if self.args else ""

    def body(self, style: str = "dynamo") -> Dict[str, Any]:
        """The JSON error body: ``"dynamo"`` (flat ``{message, type, code}``),
        ``"openai"`` (``{"error": {...}}``) or ``"anthropic"``
        (``{"type": "error", "error": {...}}``)."""
        text, _ = _loadgate._error_response(self.reason, style, self.status_code, self.retry_after)
        body: Dict[str, Any] = json.loads(text)
        return body

    def headers(self) -> Dict[str, str]:
        """``Retry-After`` (whole seconds, rounded up, at least 1) and the
        machine-readable reason header (``x-loadgate-reason``)."""
        _, headers = _loadgate._error_response(
            self.reason, "dynamo", self.status_code, self.retry_after
        )
        # The body's own header goes with the body (`asgi.error_response`).
        return {name: value for name, value in headers if name != "content-type"}

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}({self.message!r}, reason={self.reason!r}, "
            f"status_code={self.status_code}, retry_after={self.retry_after!r})"
        )


class Overloaded(LoadgateError):
    """Workers are registered but none is eligible (the overload status, 529
    by default). Base of every overload; retry later."""

    default_reason = "all_workers_busy"


class WorkerOverloaded(Overloaded):
    """A pinned worker is busy or under an overload lease; retry on another."""

    default_reason = "worker_overloaded"


class AtCapacity(Overloaded):
    """The worker's engine slots and queue are full ("Server overloaded:
    worker at capacity")."""

    default_reason = "worker_at_capacity"


class QueueTimeout(Overloaded):
    """The request waited in the worker's queue past the deadline (or past the
    caller's own ``admit_blocking`` timeout)."""

    default_reason = "queue_timeout"


class Displaced(Overloaded):
    """The request waited in the worker's full queue and gave its place to a
    more important request (a higher priority class)."""

    default_reason = "displaced"


class Unavailable(LoadgateError):
    """No worker is registered for the model (HTTP 503)."""

    default_reason = "no_workers"


class Closed(LoadgateError):
    """The worker's admission gate is closed (HTTP 503)."""

    default_reason = "closed"
