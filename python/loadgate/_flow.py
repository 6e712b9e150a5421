"""The awaitable side of :meth:`Monitor.dispatch` and its ticket.

``await monitor.dispatch(...)`` runs :func:`_drive`: it polls the native
dispatch with a fresh asyncio future each time (the core wakes it, from
whichever thread freed a worker, through ``loop.call_soon_threadsafe``),
awaits that future, and when the queue's next deadline comes first calls
``monitor.expire_flow()`` before polling again. Cancelling the awaiting
task gives the request up at once.
"""

from __future__ import annotations

import asyncio
from typing import Any, Optional, Type

from . import _loadgate


def _wake(fut: "asyncio.Future[None]") -> None:
    if not fut.done():
        fut.set_result(None)


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


async def _drive(handle: Any, monitor: Any) -> FlowTicket:
    loop = asyncio.get_running_loop()
    try:
        while True:
            woken = loop.create_future()
            native = handle._poll(woken)
            if native is not None:
                return FlowTicket(native)
            wait = monitor.time_to_next_flow_deadline()
            if wait is None:
                await woken
            else:
                done, _ = await asyncio.wait({woken}, timeout=wait)
                if not done:
                    monitor.expire_flow()
    except BaseException:
        handle._cancel()
        raise
