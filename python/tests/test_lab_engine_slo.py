"""SLO admission over real HTTP: the lab's `engine` binary, engines of two
speeds, behind a frontend built from loadgate's Python pieces (a `Monitor`
scraping each engine, `FlowMiddleware` and an httpx streaming proxy), at
three times the fleet's measured capacity, open loop, with a long-output
mix. The same frontend runs twice: given only the SLO (`set_slo`; flow
control at its defaults), and with a static threshold (busy while a
request waits in the engine; the queue's deadline the TTFT target).

Asserted: every request is accounted for, every 529 carries
`Retry-After`, no admitted stream is cut, and the SLO frontend learned
from the streams it proxied (its fit observed them). Goodput and the
admitted requests' p99 time to first token of both frontends are printed
(`-s` shows them), not asserted: they are timings.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Awaitable, Callable, Dict, List, Optional, Sequence, Tuple

import pytest

from loadgate import Monitor
from loadgate.flow_asgi import FlowMiddleware

from conftest import serve
from test_lab_engine import (
    MODEL,
    OUTPUT_TOKENS,
    PROMPT_WORDS,
    Message,
    Outcome,
    Scope,
    Upstream,
    calibrate,
    chat_body,
    client,
    engine_bin,  # noqa: F401 (a fixture)
    engines,
    percentile,
    stream_once,
    wait_for,
    worker_id,
)

SEATS = 2
# Two engines at the step model's speed and two at half of it.
ENGINES: List[List[str]] = [
    ["--max-num-seqs", str(SEATS), "--speedup-ratio", str(speed)] for speed in (1, 1, 0.5, 0.5)
]
# The mix: three answers in four short, one long.
SHORT, LONG = 32, 160
TTFT, TPOT = 0.5, 0.025  # the SLO, seconds
OVERLOAD = 3.0
LOAD_SECONDS = 5.0
SCRAPE_INTERVAL = 0.02


def good(o: Outcome) -> bool:
    """Completed within the SLO: its first token and its time per token."""
    if not o.completed or o.first_token is None:
        return False
    tpot = (o.end - o.first_token) / max(1, o.tokens - 1)
    return o.first_token - o.intended <= TTFT and tpot <= TPOT


async def open_loop(url: str, rate: float, seconds: float, seed: int) -> List[Outcome]:
    """Poisson arrivals at `rate` for `seconds`, each of the mix, each sent at
    its intended time whatever became of the earlier ones."""
    rng = random.Random(seed)
    plan = []
    t = rng.expovariate(rate)
    while t < seconds:
        plan.append((t, LONG if rng.random() < 0.25 else SHORT))
        t += rng.expovariate(rate)
    loop = asyncio.get_running_loop()
    async with client() as c:
        start = loop.time() + 0.1
        tasks = []
        for offset, want in plan:
            delay = start + offset - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            # The intended time rides along (`user`), so the frontend can
            # tell where a late first token spent its time.
            body = json.dumps({**json.loads(chat_body(want)), "user": repr(start + offset)}).encode()
            tasks.append(asyncio.create_task(stream_once(c, url, body, start + offset, want)))
        return list(await asyncio.gather(*tasks))


def first_token(line: str) -> bool:
    """Whether a streamed line carries a token (not the opening role chunk
    or the end)."""
    if not line.startswith("data: {"):
        return False
    choices = json.loads(line[len("data: ") :])["choices"]
    return bool(choices and choices[0]["delta"].get("content"))


class Proxy(Upstream):
    """The app behind `FlowMiddleware`: streams the booked worker's answer
    back one server-sent event per body message (one token each), so the
    middleware's chunks are the answer's tokens."""

    def __init__(self, urls: Dict[int, str]) -> None:
        super().__init__(urls)
        # Each request's intended time: when the middleware handed it on,
        # and when its engine's first token came.
        self.timings: Dict[float, Tuple[float, float]] = {}

    async def __call__(
        self, scope: Scope, receive: Callable[[], Awaitable[Message]], send: Callable[[Message], Awaitable[None]]
    ) -> None:
        body = await self.body(receive)
        handed = time.monotonic()
        intended = float(json.loads(body)["user"])
        resp = await self.post(scope["loadgate.worker"], scope["path"], body, send)
        try:
            async for line in resp.aiter_lines():
                if line:
                    if intended not in self.timings and first_token(line):
                        self.timings[intended] = (handed, time.monotonic())
                    event = (line + "\n\n").encode()
                    await send({"type": "http.response.body", "body": event, "more_body": True})
            await send({"type": "http.response.body", "body": b""})
        finally:
            await resp.aclose()


@dataclass
class Learned:
    """What a frontend's monitor held at the end of its run."""

    slo: Optional[Dict[str, object]]
    fits: List[Dict[str, object]]
    # The proxy's timings (`Proxy.timings`).
    timings: Dict[float, Tuple[float, float]]


def run_frontend(urls: Sequence[str], rate: float, slo: bool) -> tuple[List[Outcome], Learned]:
    """One frontend over the engines, driven open loop at `rate`."""
    monitor = Monitor()
    scrapes = [monitor.scrape(None, worker_id(u), u + "/metrics", interval=SCRAPE_INTERVAL) for u in urls]
    try:
        wait_for(lambda: sorted(monitor.workers(MODEL)), lambda w: w == sorted(map(worker_id, urls)))
        if slo:
            monitor.set_slo(MODEL, ttft=TTFT, tpot=TPOT)
            monitor.set_flow_control(MODEL, queue_limit=4096, policy="power_of_two")
        else:
            monitor.set_thresholds(MODEL, waiting_requests_threshold=0)
            monitor.set_flow_control(MODEL, queue_limit=4096, deadline=TTFT)
        proxy = Proxy({worker_id(u): u for u in urls})
        cost = lambda scope: (PROMPT_WORDS + 8, None)  # noqa: E731 (the prompt's tokens, about)
        app = FlowMiddleware(proxy, monitor, model=MODEL, cost=cost, style="openai")
        with serve(app) as front:
            try:
                outcomes = asyncio.run(open_loop(front, rate, LOAD_SECONDS, seed=11))
            finally:
                proxy.close()
        fits = [monitor.predict(worker_id(u), 0, PROMPT_WORDS) for u in urls]
        learned = Learned(monitor.slo(MODEL), fits, proxy.timings)
    finally:
        for s in scrapes:
            s.close()
    return outcomes, learned


def summary(name: str, outcomes: Sequence[Outcome]) -> str:
    completed = [o for o in outcomes if o.completed]
    rejected = [o for o in outcomes if o.status == 529]
    within = [o for o in outcomes if good(o)]
    span = max(o.end for o in outcomes) - min(o.intended for o in outcomes)
    ttft = [o.first_token - o.intended for o in completed if o.first_token is not None]
    p99 = percentile(ttft, 99) * 1000 if ttft else float("nan")
    return (
        f"{name}: goodput {len(within) / span:.1f} req/s ({len(within)} of {len(outcomes)} within the SLO), "
        f"{len(completed)} completed, {len(rejected)} rejected; admitted TTFT p99 {p99:.0f} ms"
    )


def where_late(outcomes: Sequence[Outcome], timings: Dict[float, Tuple[float, float]]) -> str:
    """Where the admitted requests whose first token missed the target spent
    their time: before the proxy (the frontend's queue and middleware), in
    the engine until its first token, and from there to the client (median
    and p90, ms)."""
    parts: List[List[float]] = [[], [], []]
    for o in outcomes:
        if not o.completed or o.first_token is None or o.first_token - o.intended <= TTFT:
            continue
        handed, first = timings[o.intended]
        for i, x in enumerate((handed - o.intended, first - handed, o.first_token - first)):
            parts[i].append(x * 1000)
    if not parts[0]:
        return "no admitted request missed the TTFT target"
    cells = [f"{percentile(p, 50):.0f} / {percentile(p, 90):.0f}" for p in parts]
    return (
        f"{len(parts[0])} admitted late; ms (median / p90): frontend {cells[0]}, engine to first token "
        f"{cells[1]}, proxy to client {cells[2]}"
    )


def check(outcomes: Sequence[Outcome]) -> None:
    completed = [o for o in outcomes if o.completed]
    rejected = [o for o in outcomes if o.status == 529 and o.error is None]
    errors = [o for o in outcomes if not o.completed and not (o.status == 529 and o.error is None)]
    assert errors == [], errors[:5]
    assert len(outcomes) == len(completed) + len(rejected)
    assert all(o.retry_after is not None and float(o.retry_after) >= 0 for o in rejected)
    admitted = [o for o in outcomes if o.status == 200]
    assert all(o.done and o.tokens == o.want for o in admitted), "an admitted stream was cut"
    assert rejected and completed, "three times the capacity is shed in part and served in part"


@pytest.mark.timeout(900)  # building the binary first, when it is missing, takes minutes
def test_the_slo_alone_against_a_static_threshold_over_http(engine_bin: Path, tmp_path: Path) -> None:  # noqa: F811
    with engines(engine_bin, ENGINES, tmp_path) as urls:
        capacity = asyncio.run(calibrate(urls, [1] * len(urls)))
        assert capacity > 0
        rate = OVERLOAD * capacity
        by_slo, learned = run_frontend(urls, rate, slo=True)
        static, by_threshold = run_frontend(urls, rate, slo=False)

    check(by_slo)
    check(static)
    # The SLO frontend learned from the streams it proxied: its answers'
    # lengths (the reservation's table) and its ranks' step fits.
    slo, fits = learned.slo, learned.fits
    assert slo is not None and not slo["advisory"]
    assert any(float(f["fit_error"]) < 1.0 for f in fits), fits
    print(
        f"\n{len(urls)} engines (two at half speed) of {SEATS} seats, answers of {SHORT} or {LONG} tokens "
        f"(one in four long), SLO TTFT {TTFT * 1000:.0f} ms and TPOT {TPOT * 1000:.0f} ms; capacity "
        f"{capacity:.1f} req/s measured ({OUTPUT_TOKENS}-token answers), offered {rate:.1f} req/s for {LOAD_SECONDS:.0f} s"
    )
    print(summary("only the SLO", by_slo))
    print(f"  {where_late(by_slo, learned.timings)}")
    print(summary("static threshold (busy on a waiting request; queue deadline the TTFT target)", static))
    print(f"  {where_late(static, by_threshold.timings)}")
    print(f"SLO decisions: {slo}; trusted fits {sum(1 for f in fits if f['trusted'])} of {len(fits)}")
