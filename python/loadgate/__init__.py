"""loadgate: request rejection (load shedding) for LLM serving.

* :class:`Monitor` (frontends) keeps every worker's per-rank load, decides
  which workers are busy by per-model thresholds, routes around them, and
  raises :class:`Overloaded` (529) or :class:`Unavailable` (503) when it
  cannot route. ``monitor.route(model)`` gives a :class:`Route` handle
  whose ``select()`` skips the model lookup on every request. With
  ``monitor.set_flow_control(model, queue_limit=...)``, ``await
  monitor.dispatch(model, tenant=...)`` waits in the model's queue instead,
  shared fairly between tenants by tokens (a :class:`FlowTicket`).
* :class:`AdmissionGate` (workers) caps a worker's own concurrency at exactly
  ``limit`` running plus ``queue`` waiting and raises :class:`AtCapacity`
  for the rest; wait for a slot with ``await gate.admit()`` (asyncio) or
  ``gate.admit_blocking()`` (threads). With priority classes
  (``classes=``, :class:`PriorityClass`), a request passes
  ``priority=`` and a more important one may displace a queued less
  important one (:class:`Displaced`).

Across machines, workers publish their load over NATS with :class:`Reporter`
and each frontend feeds its monitor with :meth:`Monitor.subscribe_nats`
(a :class:`Subscription`); every frontend converges on the same busy set.
Frontend replicas share their bookings with :meth:`Monitor.sync_bookings`
(a :class:`BookingSync`), so that together they admit what one would.

Helpers: :mod:`loadgate.asgi` (middleware and the ``/busy_threshold`` and
``/metrics`` app), :mod:`loadgate.prometheus` (a ``prometheus_client``
collector), and ``python -m loadgate.demo``.
"""

from ._errors import (
    AtCapacity,
    Closed,
    Displaced,
    LoadgateError,
    Overloaded,
    QueueTimeout,
    Unavailable,
    WorkerOverloaded,
)
from ._flow import FlowTicket
from ._loadgate import (
    ERROR_STYLES,
    MAX_BUSY_THRESHOLD_BODY,
    REASON_HEADER,
    Admission,
    AdmissionGate,
    Booking,
    BookingSync,
    ControlAuth,
    Discovery,
    ManualClock,
    Monitor,
    Permit,
    PriorityClass,
    Reporter,
    Route,
    Scrape,
    Subscription,
    __version__,
    overload_status_code,
)

__all__ = [
    "__version__",
    "REASON_HEADER",
    "MAX_BUSY_THRESHOLD_BODY",
    "ERROR_STYLES",
    "overload_status_code",
    "LoadgateError",
    "Overloaded",
    "WorkerOverloaded",
    "AtCapacity",
    "QueueTimeout",
    "Displaced",
    "Unavailable",
    "Closed",
    "Monitor",
    "Route",
    "ControlAuth",
    "Booking",
    "FlowTicket",
    "Subscription",
    "BookingSync",
    "Scrape",
    "Discovery",
    "Reporter",
    "AdmissionGate",
    "PriorityClass",
    "Admission",
    "Permit",
    "ManualClock",
]
