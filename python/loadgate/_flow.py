"""The awaitable side of :meth:`Monitor.dispatch` and its ticket.

``await monitor.dispatch(...)`` runs :func:`_drive`: a request sent or
refused at once is answered without a trip through the event loop;
otherwise it awaits the asyncio future that the monitor's maintenance
thread settles (:func:`_settle`, through ``loop.call_soon_threadsafe``)
when a worker frees up or the request's deadline comes. Cancelling the
awaiting task gives the request up at once, or completes the dispatch
that was made for it meanwhile.
"""

from __future__ import annotations

import asyncio
from typing import Any, Optional, Type

from . import _loadgate


def _settle(fut: "asyncio.Future[Any]", ok: bool, value: Any) -> None:
    """Settles a waiting dispatch's future on its loop; a ticket that
    arrives for a future already cancelled is completed."""
    if fut.done():
        if ok:
            value.complete()
    elif ok:
        fut.set_result(value)
    else:
        fut.set_exception(value)


class FlowTicket:
    """A request sent to a worker by :meth:`Monitor.dispatch`.

    ``worker`` is the worker it was sent to, ``dp_rank`` the rank its blocks
    are booked on (grow them with :meth:`add_output_blocks`). Report output as it comes
    (:meth:`report_output`, charged to the tenant at once), mark the first
    token (:meth:`prefill_done`), and :meth:`complete` it with its output
    tokens: the worker's booking is released and the tenant settled. As an
    async context manager it completes on exit with what was reported.
    """

    __slots__ = ("_native",)

    def __init__(self, native: "_loadgate._FlowTicket") -> None:
        self._native = native

    @property
    def worker(self) -> int:
        """The worker the request was sent to."""
        return int(self._native.worker)

    @property
    def dp_rank(self) -> int:
        """The data-parallel rank of the worker it was booked on."""
        return int(self._native.dp_rank)

    @property
    def completed(self) -> bool:
        """Whether it was completed."""
        return bool(self._native.completed)

    def add_output_blocks(self, n: int) -> None:
        """``n`` more KV blocks of generated output, booked on the worker."""
        self._native.add_output_blocks(n)

    def report_output(self, tokens: int) -> None:
        """``tokens`` more output tokens."""
        self._native.report_output(tokens)

    def prefill_done(self) -> None:
        """The first token came: the prompt stops counting as prefill."""
        self._native.prefill_done()

    def chunk(self) -> None:
        """One chunk of the streamed response went out: while no output is
        reported, it counts as one token (the first as the first token) for
        the SLO's observations and the answer's KV reservation.
        :class:`~loadgate.flow_asgi.FlowMiddleware` calls it."""
        self._native.chunk()

    def complete(self, output_tokens: Optional[int] = None) -> None:
        """The request finished with ``output_tokens`` in all (default: what
        was reported). Idempotent."""
        self._native.complete(output_tokens)

    async def __aenter__(self) -> "FlowTicket":
        return self

    async def __aexit__(
        self, exc_type: Optional[Type[BaseException]], exc: Optional[BaseException], tb: Any
    ) -> bool:
        self.complete()
        return False

    def __repr__(self) -> str:
        state = "completed" if self.completed else "running"
        return f"<loadgate.FlowTicket worker={self.worker} {state}>"


async def _drive(handle: Any) -> FlowTicket:
    ready, value = handle._start()
    if ready:
        return FlowTicket(value)
    try:
        native = await value
    except asyncio.CancelledError:
        if not handle._cancel() and value.done() and not value.cancelled():
            # Sent just before the cancel: nobody takes the ticket.
            if value.exception() is None:
                value.result().complete()
        raise
    return FlowTicket(native)
