"""SLO admission's advisory part from Python (docs/behaviour.md): the SLO set
and checked, a booking's stream observed (`first_token`, `tokens`), each
rank's step time fitted, and `predict` giving what a new request would
see; on a manual clock, against a known step function."""

from __future__ import annotations

import math

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
    assert m.slo("m") == pytest.approx({"ttft": 2.0, "tpot": 0.1})
    for ttft, tpot, name in [(math.nan, 0.1, "ttft"), (0, 0.1, "ttft"), (2.0, -1, "tpot"), (2.0, 1e9, "tpot")]:
        with pytest.raises(ValueError, match=name):
            m.set_slo("m", ttft=ttft, tpot=tpot)
    with pytest.raises(TypeError):
        m.set_slo("m", ttft="2", tpot=0.1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="together"):
        m.set_slo("m", ttft=2.0, tpot=None)
    with pytest.raises(KeyError, match="nope"):
        m.set_slo("nope", ttft=2.0, tpot=0.1)
    assert m.slo("m") == pytest.approx({"ttft": 2.0, "tpot": 0.1}), "a refused call changes nothing"
    m.set_slo("m", ttft=None, tpot=None)
    assert m.slo("m") is None


def test_streamed_tokens_fit_the_rank_and_predict_the_engine() -> None:
    m, clock = fleet()
    m.set_slo("m", ttft=2.0, tpot=0.1)
    live: list[tuple[Booking, bool]] = []
    for i in range(1500):
        if len(live) < 30 and (len(live) < 2 or i % 3 == 0):
            prompt = 16 + (i * 97) % 1500
            live.append((m.book(1, 0, prompt // 16, prefill_tokens=prompt), False))
        elif len(live) > 1 and i % 5 == 0:
            live.pop(i % len(live))[0].release()
        prefill = sum(b.prefill_tokens for b, _ in live)
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
    assert p["tpot"] == pytest.approx(step(0, 9, kv + 500), rel=0.1)
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
