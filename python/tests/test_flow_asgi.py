"""`loadgate.flow_asgi.FlowMiddleware` in front of a real Starlette app under
uvicorn, driven by httpx: requests wait in the model's queue while the one
worker is busy and go in order, the app sees its worker and ticket, the
headers choose the tenant, band, deadline and opt-out, a refusal is the
loadgate error, and a malformed header is a 400."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any, Callable, List

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from conftest import flow_queued, serve
from loadgate import Monitor
from loadgate.flow_asgi import FlowMiddleware


def fleet(**flow: Any) -> Monitor:
    m = Monitor()
    m.add_worker("llama", 7, kv_total_blocks=100)
    m.set_thresholds("llama", active_decode_blocks_threshold=0.5)
    m.set_flow_control("llama", **{"queue_limit": 8, **flow})
    return m


def app(release: threading.Event, seen: List[str]) -> Any:
    async def generate(request: Request) -> JSONResponse:
        ticket = request.scope["loadgate.ticket"]
        seen.append(request.headers.get("x-loadgate-tenant", ""))
        # Hold the worker until the test lets go.
        while not release.is_set():
            await asyncio.sleep(0.005)
        ticket.report_output(3)
        return JSONResponse({"worker": request.scope["loadgate.worker"]})

    return Starlette(routes=[Route("/v1/chat/completions", generate, methods=["POST"])])


def until(cond: Callable[[], bool]) -> None:
    """Waits until `cond()` holds; the limit only turns a hang into a failure."""
    limit = time.monotonic() + 30
    while not cond():
        assert time.monotonic() < limit, "condition not reached"
        time.sleep(0.002)


def test_requests_wait_for_the_worker_and_go_in_order() -> None:
    m = fleet()
    release = threading.Event()
    seen: List[str] = []
    # 60 blocks per request: one request fills the worker.
    guarded = FlowMiddleware(app(release, seen), m, model="llama", cost=lambda scope: (960, 16))
    with serve(guarded) as url, httpx.Client(base_url=url, timeout=20) as client:
        results: dict = {}
        threads = []

        def call(tenant: str) -> None:
            r = client.post("/v1/chat/completions", headers={"x-loadgate-tenant": tenant}, json={})
            results[tenant] = r

        def send(tenant: str) -> None:
            t = threading.Thread(target=call, args=(tenant,))
            t.start()
            threads.append(t)

        # In order: a holds the worker, then b and then c join its queue.
        send("a")
        until(lambda: seen == ["a"])
        send("b")
        until(lambda: flow_queued(m, "llama") == 1)
        send("c")
        until(lambda: flow_queued(m, "llama") == 2)
        assert seen == ["a"], "b and c wait while a holds the worker"
        release.set()
        for t in threads:
            t.join(20)
        assert [results[t].status_code for t in ("a", "b", "c")] == [200, 200, 200]
        assert results["a"].json() == {"worker": 7}
        assert seen == ["a", "b", "c"]
    assert not m.is_busy(7), "every ticket completed"


def test_headers_choose_deadline_and_opt_out_and_refusals_are_loadgate_errors() -> None:
    m = fleet()
    m.report(7, kv_used_blocks=90)
    release = threading.Event()
    guarded = FlowMiddleware(app(release, []), m, model="llama")
    with serve(guarded) as url, httpx.Client(base_url=url, timeout=20) as client:
        r = client.post("/v1/chat/completions", headers={"x-loadgate-queue": "never"}, json={})
        assert r.status_code == 529
        assert r.headers["x-loadgate-reason"] == "all_workers_busy"
        r = client.post("/v1/chat/completions", headers={"x-loadgate-deadline-ms": "30"}, json={})
        assert r.status_code == 529
        assert r.headers["x-loadgate-reason"] == "queue_deadline"
        assert int(r.headers["retry-after"]) >= 1
        assert r.json()["code"] == 529  # Dynamo 1.6.1's one overload body
        for name, value in [("x-loadgate-deadline-ms", "soon"), ("x-loadgate-queue", "maybe")]:
            r = client.post("/v1/chat/completions", headers={name: value}, json={})
            assert r.status_code == 400
            assert name in r.json()["message"]
        r = client.post("/v1/chat/completions", headers={"x-loadgate-tenant": "x" * 300}, json={})
        assert r.status_code == 400
        r = client.post("/v1/chat/completions", headers={"x-loadgate-tenant": b"\xff\xfe"}, json={})
        assert r.status_code == 400
        assert "tenant" in r.json()["message"]
        m.remove_worker(7)
        r = client.post("/v1/chat/completions", json={})
        assert r.status_code == 503
        assert r.headers["x-loadgate-reason"] == "no_workers"


def refusing_app(refusers: List[int], reason: str, bodies: List[bytes]) -> Any:
    """A frontend's proxy whose workers in `refusers` answer 529 with
    `reason` (as a worker's gate at capacity does); the others echo the
    request body."""

    async def generate(request: Request) -> Any:
        body = await request.body()
        bodies.append(body)
        worker = request.scope["loadgate.worker"]
        if worker in refusers:
            return JSONResponse(
                {"message": "Server overloaded", "code": 529},
                status_code=529,
                headers={"x-loadgate-reason": reason} if reason else {},
            )
        return JSONResponse({"worker": worker, "body": body.decode()})

    return Starlette(routes=[Route("/v1/chat/completions", generate, methods=["POST"])])


def two_workers(**config: Any) -> Monitor:
    m = Monitor(**config)
    for w in (7, 8):
        m.add_worker("llama", w, kv_total_blocks=100)
    return m


def test_a_workers_refusal_is_sent_to_another_worker_with_its_body() -> None:
    m = two_workers()
    bodies: List[bytes] = []
    guarded = FlowMiddleware(refusing_app([7], "worker_at_capacity", bodies), m, model="llama")
    with serve(guarded) as url, httpx.Client(base_url=url, timeout=20) as client:
        # Round-robin sends the first request to worker 7, which refuses.
        r = client.post("/v1/chat/completions", content=b'{"prompt": "hi"}')
        assert r.status_code == 200
        assert r.json() == {"worker": 8, "body": '{"prompt": "hi"}'}
        assert bodies == [b'{"prompt": "hi"}'] * 2
        assert m.is_leased(7)


def test_a_refusal_by_every_worker_is_the_clients_529() -> None:
    m = two_workers()
    guarded = FlowMiddleware(refusing_app([7, 8], "", []), m, model="llama")
    with serve(guarded) as url, httpx.Client(base_url=url, timeout=20) as client:
        r = client.post("/v1/chat/completions", json={})
        assert r.status_code == 529
        assert r.headers["x-loadgate-reason"] == "all_workers_busy"
        assert m.is_leased(7) and m.is_leased(8)


def test_a_529_that_is_not_a_workers_refusal_passes_through() -> None:
    m = two_workers()
    guarded = FlowMiddleware(refusing_app([7, 8], "queue_full", []), m, model="llama")
    with serve(guarded) as url, httpx.Client(base_url=url, timeout=20) as client:
        r = client.post("/v1/chat/completions", json={})
        assert r.status_code == 529
        assert r.headers["x-loadgate-reason"] == "queue_full"
        assert not m.is_leased(7) and not m.is_leased(8)


def test_with_the_queue_a_refusal_waits_for_the_worker_again() -> None:
    m = fleet()
    bodies: List[bytes] = []
    refusers = [7]
    guarded = FlowMiddleware(refusing_app(refusers, "queue_timeout", bodies), m, model="llama")
    with serve(guarded) as url, httpx.Client(base_url=url, timeout=20) as client:
        result: dict = {}
        t = threading.Thread(target=lambda: result.update(r=client.post("/v1/chat/completions", content=b"x")))
        t.start()
        # Refused once, the request waits in the queue while worker 7 is
        # leased; its next report (free, and accepting again) sends it.
        until(lambda: len(bodies) == 1 and flow_queued(m, "llama") == 1)
        refusers.clear()
        m.report(7, kv_used_blocks=0)
        t.join(20)
        assert result["r"].status_code == 200
        assert result["r"].json() == {"worker": 7, "body": "x"}


def test_a_body_over_the_replay_limit_is_answered_as_the_worker_refused() -> None:
    m = two_workers()
    guarded = FlowMiddleware(
        refusing_app([7], "worker_at_capacity", []), m, model="llama", max_replay_body=4
    )
    with serve(guarded) as url, httpx.Client(base_url=url, timeout=20) as client:
        r = client.post("/v1/chat/completions", content=b"too long")
        assert r.status_code == 529
        assert r.headers["x-loadgate-reason"] == "worker_at_capacity"
