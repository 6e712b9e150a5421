"""SLO admission from Python (docs/behaviour.md): the SLO set and checked, a
booking's stream observed (`first_token`, `tokens`), each rank's step time
fitted, `predict` giving what a new request would see, the answer's KV
reserved and settled (`expect_output`, `finish`), and the verdicts enforced
or only counted; on a manual clock, against a known step function."""

from __future__ import annotations

import asyncio
import math
from typing import Any

import pytest

from loadgate import Booking, ManualClock, Monitor


def step(prefill: float, running: float, kv: float) -> float:
    """The engine: 5 ms a step, 20 us a prompt token, 100 us a request,
    0.1 us a context token."""
    return 0.005 + 2e-5 * prefill + 1e-4 * running + 1e-7 * kv


def fleet() -> tuple[Monitor, ManualClock]:
    clock = ManualClock()
    m = Monitor(clock=clock, maintenance="manual")
    m.add_worker("m", 1, kv_total_blocks=10_000, max_num_batched_tokens=2048)
    return m, clock


def test_the_slo_is_checked_and_cleared() -> None:
    m, _ = fleet()
    assert m.slo("m") is None
    m.set_slo("m", ttft=2.0, tpot=0.1)
    counts = {"would_admit": 0, "would_queue": 0, "would_refuse": 0, "refused_late": 0}
    want = {"ttft": 2.0, "tpot": 0.1, "advisory": False, **counts}
    assert m.slo("m") == pytest.approx(want)
    for ttft, tpot, name in [(math.nan, 0.1, "ttft"), (0, 0.1, "ttft"), (2.0, -1, "tpot"), (2.0, 1e9, "tpot")]:
        with pytest.raises(ValueError, match=name):
            m.set_slo("m", ttft=ttft, tpot=tpot)
    with pytest.raises(TypeError):
        m.set_slo("m", ttft="2", tpot=0.1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="together"):
        m.set_slo("m", ttft=2.0, tpot=None)
    with pytest.raises(KeyError, match="nope"):
        m.set_slo("nope", ttft=2.0, tpot=0.1)
    assert m.slo("m") == pytest.approx(want), "a refused call changes nothing"
    m.set_slo("m", ttft=1.0, tpot=0.05, advisory=True)
    assert m.slo("m") == pytest.approx(want | {"ttft": 1.0, "tpot": 0.05, "advisory": True})
    m.set_slo("m", ttft=None, tpot=None)
    assert m.slo("m") is None


def test_streamed_tokens_fit_the_rank_and_predict_the_engine() -> None:
    m, clock = fleet()
    m.set_slo("m", ttft=2.0, tpot=0.1)
    live: list[tuple[Booking, bool]] = []
    carried = 0.0
    for i in range(1500):
        if len(live) < 30 and (len(live) < 2 or i % 3 == 0):
            prompt = 16 + (i * 97) % 1500
            live.append((m.book(1, 0, prompt // 16, prefill_tokens=prompt), False))
        elif len(live) > 1 and i % 5 == 0:
            live.pop(i % len(live))[0].release()
        prefill = sum(b.prefill_tokens for b, _ in live)
        if i >= 750:
            carried += min(prefill, 2048) / 750
        blocks = sum(b.blocks for b, _ in live)
        clock.advance(step(min(prefill, 2048), len(live), blocks * 16))
        for k, (b, started) in enumerate(live):
            if started:
                b.tokens()
            else:
                b.first_token()
                live[k] = (b, True)
        if i % 16 == 0:
            m.maintain()
    m.maintain()
    for b, _ in live:
        b.release()
    held = [m.book(1, 0, 50) for _ in range(8)]
    p = m.predict(1, 0, 500)
    assert p["trusted"] and p["fit_error"] < 0.05, p
    kv = 8 * 50 * 16
    # Its later tokens come in steps that carry the prefill the rank's
    # steps carried on average.
    assert p["tpot"] == pytest.approx(step(carried, 9, kv + 500), rel=0.1)
    assert p["ttft"] == pytest.approx(step(500, 8, kv), rel=0.1)
    assert 'dynamo_frontend_slo_step_fit_trusted{dp_rank="0",worker_id="1"} 1' in m.metrics_text()
    for b in held:
        b.release()


def test_hooks_after_release_or_before_the_first_token_do_nothing() -> None:
    m, clock = fleet()
    m.set_slo("m", ttft=2.0, tpot=0.1)
    b = m.book(1, 0, 4, prefill_tokens=64)
    b.tokens(3)  # before the first token: nothing
    clock.advance(0.2)
    b.first_token()
    assert b.prefill_tokens == 0
    with pytest.raises((TypeError, ValueError, OverflowError)):
        b.tokens(-1)
    b.release()
    b.first_token()
    b.tokens(2)
    m.maintain()
    assert m.predict(1, 0, 10)["trusted"] is False


def decode_blocks(m: Monitor) -> int:
    """Rank 0 of worker 1's booked blocks, from the metrics."""
    for line in m.metrics_text().splitlines():
        if line.startswith("dynamo_frontend_worker_active_decode_blocks{") and 'worker_id="1"' in line:
            return int(float(line.rsplit(" ", 1)[1]))
    raise AssertionError("no active_decode_blocks sample for worker 1")


def test_answers_reserve_their_kv_and_settle_as_they_stream() -> None:
    m, _ = fleet()
    m.set_slo("m", ttft=2.0, tpot=0.1)
    # 32 answers of 800 tokens learned: a new booking expects 800 (50 blocks).
    for _ in range(32):
        b = m.book(1, 0, 4, prefill_tokens=64)
        b.first_token()
        b.tokens(799)
        b.finish()
    m.maintain()
    with m.book(1, 0, 4) as b:
        assert (b.reserved_blocks, b.blocks) == (50, 54)
        assert decode_blocks(m) == 54
        b.expect_output(max_tokens=160)  # the request's limit bounds it
        assert b.reserved_blocks == 10
        with pytest.raises((TypeError, ValueError, OverflowError)):
            b.expect_output(max_tokens=-1)
        b.first_token()
        b.tokens(319)  # past its limit: the actual
        assert (b.output_tokens, b.reserved_blocks) == (320, 20)
    assert decode_blocks(m) == 0
    assert 'dynamo_frontend_slo_reserved_output_tokens{model="m"} 800' in m.metrics_text()
    b.finish()  # after release: nothing


def test_an_enforced_verdict_marks_the_rank_busy_and_advisory_only_counts() -> None:
    m, _ = fleet()
    m.add_worker("m", 2, kv_total_blocks=1000)
    m.set_slo("m", ttft=2.0, tpot=0.1, advisory=True)
    for _ in range(32):
        b = m.book(1, 0, 4, prefill_tokens=64)
        b.finish(output_tokens=800)
    m.maintain()
    # Worker 2: 18 requests of 5 blocks and 50 reserved pass 95 % of its KV.
    held = [m.book(2, 0, 5) for _ in range(18)]
    assert not m.is_busy(2), "advisory: the thresholds decide"
    picks = [m.select("m", policy="round_robin") for _ in range(4)]
    assert sorted(picks) == [1, 1, 2, 2]
    slo = m.slo("m")
    assert slo is not None and (slo["would_admit"], slo["would_refuse"]) == (2, 2)
    m.set_slo("m", ttft=2.0, tpot=0.1)
    assert m.is_busy(2) and not m.is_busy(1)
    assert all(m.select("m", policy="random") == 1 for _ in range(20))
    for b in held:
        b.release()
    assert not m.is_busy(2)


def test_the_engines_own_seats_bound_the_seats_a_late_report_teaches() -> None:
    m, _ = fleet()
    m.add_worker("m", 2, kv_total_blocks=1_000_000, max_num_seqs=20)
    m.set_slo("m", ttft=2.0, tpot=0.1)
    held = [m.book(2, 0, 4) for _ in range(30)]
    # A late report counts the last bookings as seated (28), but the
    # engine runs 20 at most: the rank holds at 20, which no probe passes.
    m.report(2, waiting_requests=2)
    del held[19:]
    m.report(2, waiting_requests=0)
    assert not m.is_busy(2)
    while not m.is_busy(2):
        held.append(m.book(2, 0, 4))
        assert len(held) < 100, "never busy"
    assert len(held) == 21
    # A report may carry the engine's seats too.
    del held[9:]
    m.report(2, max_num_seqs=10)
    while not m.is_busy(2):
        held.append(m.book(2, 0, 4))
    assert len(held) == 11
    with pytest.raises(ValueError, match="max_num_seqs"):
        m.report(2, max_num_seqs=-1)


def test_the_slo_pair_in_the_environment_is_every_new_models(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOADGATE_SLO_TTFT", "1.5")
    monkeypatch.setenv("LOADGATE_SLO_TPOT", "0.05")
    m = Monitor(dynamo_env=True)
    m.add_worker("m", 1, kv_total_blocks=100)
    slo = m.slo("m")
    assert slo is not None and (slo["ttft"], slo["tpot"], slo["advisory"]) == (1.5, 0.05, False)
    monkeypatch.delenv("LOADGATE_SLO_TPOT")
    with pytest.raises(ValueError, match="LOADGATE_SLO_TPOT"):
        Monitor(dynamo_env=True)


def test_the_flow_middleware_observes_streamed_answers_itself() -> None:
    import httpx
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import StreamingResponse
    from starlette.routing import Route

    from conftest import serve
    from loadgate.flow_asgi import FlowMiddleware

    async def generate(request: Request) -> StreamingResponse:
        async def chunks() -> Any:
            for i in range(20):
                await asyncio.sleep(0.001)
                yield f"data: {i}\n\n".encode()

        return StreamingResponse(chunks(), media_type="text/event-stream")

    m = Monitor(maintenance="manual")
    m.add_worker("m", 1, kv_total_blocks=10_000)
    m.set_flow_control("m", queue_limit=8)
    m.set_slo("m", ttft=2.0, tpot=0.1, advisory=True)
    app = Starlette(routes=[Route("/v1/chat/completions", generate, methods=["POST"])])
    guarded = FlowMiddleware(app, m, model="m")
    with serve(guarded) as url, httpx.Client(base_url=url, timeout=20) as client:
        for _ in range(40):
            with client.stream("POST", "/v1/chat/completions", json={}) as r:
                assert r.status_code == 200
                assert sum(1 for line in r.iter_lines() if line.startswith("data:")) == 20
    m.maintain()
    # Nothing reported output: the chunks were the tokens, and the answers
    # of 20 were learned for the reservations to come.
    assert 'dynamo_frontend_slo_reserved_output_tokens{model="m"} 20' in m.metrics_text()
    assert m.predict(1, 0, 10)["fit_error"] < 1.0


def test_the_control_app_sets_and_clears_an_slo_at_run_time() -> None:
    import httpx

    from conftest import serve
    from loadgate.asgi import ControlApp

    m = Monitor()
    m.add_worker("m", 1, kv_total_blocks=100)
    with serve(ControlApp(m, token="s3cret")) as url, httpx.Client(base_url=url) as client:
        body = {"model": "m", "ttft": 1.0, "tpot": 0.05, "advisory": True}
        assert client.post("/slo", json=body).status_code == 401
        assert m.slo("m") is None
        ok = client.post("/slo", json=body, headers={"authorization": "Bearer s3cret"})
        assert ok.status_code == 200 and ok.json()["advisory"] is True
        assert client.get("/slo").json()["slos"][0]["ttft"] == 1.0
        bad = client.post("/slo", json={"model": "m", "ttft": -1, "tpot": 0.05}, headers={"authorization": "Bearer s3cret"})
        assert bad.status_code == 400 and "ttft" in bad.json()["error"]
        cleared = client.post("/slo", json={"model": "m", "clear": True}, headers={"authorization": "Bearer s3cret"})
        assert cleared.status_code == 200 and cleared.json()["ttft"] is None
    assert m.slo("m") is None
