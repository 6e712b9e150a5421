"""Every `Monitor` and `Booking` method, including bad input."""

from __future__ import annotations

import gc
import json
import time
from collections import Counter
from typing import Any

import pytest

import loadgate
from loadgate import ManualClock, Monitor, Overloaded, Unavailable, WorkerOverloaded

NULLS = {
    "active_decode_blocks_threshold": None,
    "active_prefill_tokens_threshold": None,
    "active_prefill_tokens_threshold_frac": None,
    "waiting_requests_threshold": None,
}


def saturate(m: Monitor, worker: int, ranks: int = 2, used: int = 95) -> None:
    for rank in range(ranks):
        m.report(worker, rank, kv_used_blocks=used)


def test_constructor_and_repr() -> None:
    m = Monitor(lease_seconds=0.5, staleness="free", stale_after=2, metrics_prefix="fe")
    assert m.models() == []
    assert "Monitor" in repr(m)
    m.add_worker("x", 1)
    assert "fe_frontend_model_workers" in m.metrics_text()


@pytest.mark.parametrize(
    "kwargs,exc,name",
    [
        ({"lease_seconds": 0}, ValueError, "lease_seconds"),
        ({"lease_seconds": -1.0}, ValueError, "lease_seconds"),
        ({"lease_seconds": float("nan")}, ValueError, "lease_seconds"),
        ({"lease_seconds": float("inf")}, ValueError, "lease_seconds"),
        ({"lease_seconds": "1"}, TypeError, "lease_seconds"),
        ({"staleness": "sometimes"}, ValueError, "staleness"),
        ({"staleness": 1}, TypeError, "staleness"),
        ({"stale_after": 0}, ValueError, "stale_after"),
        ({"metrics_prefix": "1bad"}, ValueError, "metrics_prefix"),
        ({"metrics_prefix": b"x"}, TypeError, "metrics_prefix"),
    ],
)
def test_constructor_bad_input(kwargs: dict[str, Any], exc: type[Exception], name: str) -> None:
    with pytest.raises(exc, match=name):
        Monitor(**kwargs)


def test_clock_argument() -> None:
    Monitor(clock=None)
    for bad in (object(), 1.0, time.monotonic):
        with pytest.raises(TypeError, match="clock must be None or a loadgate.ManualClock"):
            Monitor(clock=bad)  # type: ignore[arg-type]
    # One clock may drive a monitor and a gate.
    clock = ManualClock()
    m = Monitor(lease_seconds=1, clock=clock)
    g = loadgate.AdmissionGate(1, clock=clock)
    m.add_worker("m", 1)
    m.mark_overloaded(1)
    clock.advance(1)
    assert not m.is_leased(1) and g.running == 0


def test_constructor_takes_keywords_only() -> None:
    with pytest.raises(TypeError):
        Monitor(1.0)  # type: ignore[misc]


def test_add_remove_workers_and_models(monitor: Monitor) -> None:
    assert monitor.models() == ["m"]
    assert monitor.workers("m") == [1, 2]
    assert monitor.workers("nope") == []
    monitor.add_worker("other", 9, dp_start=4, dp_size=1, kv_total_blocks=10, max_num_batched_tokens=512)
    assert monitor.models() == ["m", "other"]
    monitor.report(9, 4, kv_used_blocks=1)
    with pytest.raises(ValueError, match="dp_rank 0"):
        monitor.report(9, 0, kv_used_blocks=1)
    monitor.remove_worker(9)
    assert monitor.workers("other") == []
    with pytest.raises(KeyError, match="unknown worker 9"):
        monitor.remove_worker(9)
    monitor.add_worker("other", 9)  # the id can be reused
    monitor.add_worker("m", 2**64 - 1, dp_size=0)  # a worker with no ranks is never busy
    assert not monitor.is_busy(2**64 - 1)


@pytest.mark.parametrize(
    "args,kwargs,exc,match",
    [
        (("m", 1), {}, ValueError, "already registered"),
        (("", 5), {}, ValueError, "model"),
        ((5, 5), {}, TypeError, "model"),
        (("m", -1), {}, ValueError, "worker_id"),
        (("m", 2**64), {}, ValueError, "worker_id"),
        (("m", "7"), {}, TypeError, "worker_id"),
        (("m", 1.0), {}, TypeError, "worker_id"),
        (("m", 5), {"dp_size": -1}, ValueError, "dp_size"),
        (("m", 5), {"dp_size": "2"}, TypeError, "dp_size"),
        (("m", 5), {"dp_start": 2**32}, ValueError, "dp_start"),
        (("m", 5), {"dp_start": 2**32 - 1, "dp_size": 2}, ValueError, "dp_start"),
        (("m", 5), {"kv_total_blocks": -5}, ValueError, "kv_total_blocks"),
        (("m", 5), {"max_num_batched_tokens": 1.5}, TypeError, "max_num_batched_tokens"),
        (("m", 5), {"max_num_seqs": -1}, ValueError, "max_num_seqs"),
        # Sizes are bounded before anything is allocated (2**31 ranks were 120 GB).
        (("m", 5), {"dp_size": 2**31}, ValueError, "max_ranks_per_worker"),
        (("m", 5), {"dp_size": 2**32 - 1}, ValueError, "max_ranks_per_worker"),
        (("x" * 257, 5), {}, ValueError, "max_name_len"),
        (("x" * (10 << 20), 5), {}, ValueError, "max_name_len"),
    ],
)
def test_add_worker_bad_input(monitor: Monitor, args: tuple[Any, ...], kwargs: dict[str, Any], exc: type[Exception], match: str) -> None:
    with pytest.raises(exc, match=match):
        monitor.add_worker(*args, **kwargs)
    assert monitor.workers("m") == [1, 2]  # nothing registered


def test_report_busy_rule_and_latch(monitor: Monitor) -> None:
    assert monitor.busy_workers("m") == []
    state = monitor.set_thresholds("m", active_decode_blocks_threshold=0.9)
    assert state == {"model": "m", **NULLS, "active_decode_blocks_threshold": 0.9, "version": 1}
    monitor.report(1, 0, kv_used_blocks=95)
    assert not monitor.is_busy(1)  # one rank of two
    monitor.report(1, 1, kv_used_blocks=91)
    assert monitor.is_busy(1)
    assert monitor.busy_workers("m") == [1]
    monitor.report(1, 1, active_decode_blocks=0)  # absent kv_used_blocks keeps 91
    assert monitor.is_busy(1)
    monitor.report(1, 1, kv_used_blocks=90)  # at the line is not above it
    assert not monitor.is_busy(1)
    monitor.report(1)  # all fields absent: a no-op for rank 0
    monitor.report(2, 0, kv_total_blocks=0, kv_used_blocks=1000)
    monitor.report(2, 1, kv_total_blocks=0, kv_used_blocks=1000)
    assert not monitor.is_busy(2)  # unknown capacity never trips the decode check


def test_prefill_thresholds(monitor: Monitor) -> None:
    monitor.set_thresholds("m", active_prefill_tokens_threshold=100)
    for rank in (0, 1):
        monitor.report(1, rank, active_prefill_tokens=101)
    assert monitor.is_busy(1)
    monitor.set_thresholds("m", clear=["active_prefill_tokens_threshold"], active_prefill_tokens_threshold_frac=0.5)
    assert not monitor.is_busy(1)  # 101 <= floor(0.5 * 10,000,000)
    for rank in (0, 1):
        monitor.report(1, rank, max_num_batched_tokens=200)
    assert monitor.is_busy(1)  # 101 > floor(0.5 * 200)


def test_waiting_requests_threshold(monitor: Monitor) -> None:
    monitor.report(1, 0, waiting_requests=9)
    s = monitor.set_thresholds("m", waiting_requests_threshold=8)
    assert s == {"model": "m", **NULLS, "waiting_requests_threshold": 8, "version": 1}
    assert not monitor.is_busy(1)  # rank 1 never reported waiting requests: free
    monitor.report(1, 1, waiting_requests=8)
    assert not monitor.is_busy(1)  # strict: 8 is not above 8
    monitor.report(1, 1, waiting_requests=9)
    assert monitor.is_busy(1) and monitor.busy_workers("m") == [1]
    monitor.report(1, 1, kv_used_blocks=0)  # another field keeps it
    assert monitor.is_busy(1)
    s = monitor.set_thresholds("m", waiting_requests_threshold=2**64 - 1)  # any u64
    assert s["waiting_requests_threshold"] == 2**64 - 1 and not monitor.is_busy(1)
    monitor.set_thresholds("m", waiting_requests_threshold=0)
    assert monitor.is_busy(1)  # effective before the call returned
    s = monitor.set_thresholds("m", clear=["waiting_requests_threshold"])
    assert s["waiting_requests_threshold"] is None and s["version"] == 4
    assert not monitor.is_busy(1)
    assert 'dynamo_frontend_worker_waiting_requests{dp_rank="1",worker_id="1",worker_type="decode"} 9' in monitor.metrics_text()
    with pytest.raises(ValueError, match="waiting_requests"):
        monitor.report(1, waiting_requests=2**64 - 1)  # reserved for "never reported"
    with pytest.raises(ValueError, match="waiting_requests"):
        monitor.report(1, waiting_requests=-1)
    with pytest.raises(TypeError, match="waiting_requests"):
        monitor.report(1, waiting_requests=1.5)


def test_report_bad_input(monitor: Monitor) -> None:
    with pytest.raises(KeyError, match="unknown worker 77"):
        monitor.report(77, kv_used_blocks=1)
    with pytest.raises(ValueError, match="dp_rank 2"):
        monitor.report(1, 2, kv_used_blocks=1)
    with pytest.raises(ValueError, match="dp_rank"):
        monitor.report(1, -1)
    with pytest.raises(ValueError, match="kv_used_blocks"):
        monitor.report(1, kv_used_blocks=-1)
    with pytest.raises(TypeError, match="active_decode_blocks"):
        monitor.report(1, active_decode_blocks="3")
    with pytest.raises(ValueError, match="active_prefill_tokens"):
        monitor.report(1, active_prefill_tokens=2**64 - 1)  # reserved for "never reported"
    with pytest.raises(TypeError, match="worker_id"):
        monitor.report(None)  # type: ignore[arg-type]
    refused = [line for line in monitor.metrics_text().splitlines() if line.startswith("dynamo_frontend_load_reports_refused_total{")]
    assert 'dynamo_frontend_load_reports_refused_total{reason="unknown_worker"} 1' in refused


def test_thresholds_merge_clear_and_version(monitor: Monitor) -> None:
    assert monitor.thresholds("m") == {"model": "m", **NULLS, "version": 0}
    assert monitor.thresholds("unknown") == {"model": "unknown", **NULLS, "version": 0}
    monitor.set_thresholds("m", active_decode_blocks_threshold=0.5)
    s = monitor.set_thresholds("m", active_prefill_tokens_threshold=10, active_prefill_tokens_threshold_frac=64)
    assert s["active_decode_blocks_threshold"] == 0.5 and s["active_prefill_tokens_threshold"] == 10
    assert s["active_prefill_tokens_threshold_frac"] == 64.0 and s["version"] == 2
    s = monitor.set_thresholds("m", clear=("active_decode_blocks_threshold", "active_prefill_tokens_threshold"))
    assert s["active_decode_blocks_threshold"] is None and s["active_prefill_tokens_threshold"] is None
    assert s["version"] == 3
    assert monitor.set_thresholds("m") == monitor.thresholds("m")  # empty update is a read
    assert monitor.thresholds("m")["version"] == 3


@pytest.mark.parametrize(
    "kwargs,exc,match",
    [
        ({"active_decode_blocks_threshold": 1.5}, ValueError, "active_decode_blocks_threshold"),
        ({"active_decode_blocks_threshold": -0.1}, ValueError, "active_decode_blocks_threshold"),
        ({"active_decode_blocks_threshold": float("nan")}, ValueError, "active_decode_blocks_threshold"),
        ({"active_decode_blocks_threshold": "0.5"}, TypeError, "active_decode_blocks_threshold"),
        ({"active_prefill_tokens_threshold": -1}, ValueError, "active_prefill_tokens_threshold"),
        ({"active_prefill_tokens_threshold": 1.5}, TypeError, "active_prefill_tokens_threshold"),
        ({"active_prefill_tokens_threshold_frac": float("inf")}, ValueError, "active_prefill_tokens_threshold_frac"),
        ({"active_prefill_tokens_threshold_frac": -2}, ValueError, "active_prefill_tokens_threshold_frac"),
        ({"waiting_requests_threshold": -1}, ValueError, "waiting_requests_threshold"),
        ({"waiting_requests_threshold": 2**64}, ValueError, "waiting_requests_threshold"),
        ({"waiting_requests_threshold": 0.5}, TypeError, "waiting_requests_threshold"),
        ({"waiting_requests_threshold": 1, "clear": ["waiting_requests_threshold"]}, ValueError, "both set and cleared"),
        ({"clear": ["nope"]}, ValueError, "nope"),
        ({"clear": "active_decode_blocks_threshold"}, TypeError, "clear"),
        ({"clear": [1]}, TypeError, "clear"),
        ({"clear": 5}, TypeError, "clear"),
        ({"active_decode_blocks_threshold": 0.5, "clear": ["active_decode_blocks_threshold"]}, ValueError, "both set and cleared"),
    ],
)
def test_set_thresholds_bad_input(monitor: Monitor, kwargs: dict[str, Any], exc: type[Exception], match: str) -> None:
    monitor.set_thresholds("m", active_prefill_tokens_threshold=5)
    with pytest.raises(exc, match=match):
        monitor.set_thresholds("m", **kwargs)
    assert monitor.thresholds("m")["version"] == 1  # nothing changed


def test_set_thresholds_unknown_model(monitor: Monitor) -> None:
    with pytest.raises(KeyError, match="unknown model"):
        monitor.set_thresholds("nope", active_decode_blocks_threshold=0.5)
    with pytest.raises(TypeError, match="model"):
        monitor.set_thresholds(None)  # type: ignore[arg-type]


def test_select_policies_and_errors(monitor: Monitor) -> None:
    assert Counter(monitor.select("m") for _ in range(10)) == {1: 5, 2: 5}
    for policy in ("round_robin", "random", "power_of_two", "p2c"):
        assert monitor.select("m", policy=policy) in (1, 2)
    assert monitor.select("m", endpoint="chat") in (1, 2)
    monitor.set_thresholds("m", active_decode_blocks_threshold=0.9)
    saturate(monitor, 1)
    assert {monitor.select("m") for _ in range(6)} == {2}
    saturate(monitor, 2)
    with pytest.raises(Overloaded) as info:
        monitor.select("m", endpoint="chat")
    assert type(info.value) is Overloaded
    assert (info.value.status_code, info.value.reason) == (529, "all_workers_busy")
    with pytest.raises(Unavailable) as unavailable:
        monitor.select("no-such-model")
    assert unavailable.value.status_code == 503
    text = monitor.metrics_text()
    assert 'dynamo_frontend_model_rejection_total{model="m",endpoint="chat"} 1' in text


def test_select_bad_input(monitor: Monitor) -> None:
    with pytest.raises(ValueError, match="policy"):
        monitor.select("m", policy="fastest")
    with pytest.raises(TypeError, match="policy"):
        monitor.select("m", policy=1)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="model"):
        monitor.select(b"m")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="endpoint"):
        monitor.select("m", endpoint=3)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        monitor.select("m", "random")  # type: ignore[misc]


def test_select_min_cost(monitor: Monitor) -> None:
    monitor.add_worker("m", 3)
    assert monitor.select_min_cost("m", {1: 5.0, 2: 1.0, 3: 3}) == 2
    assert monitor.select_min_cost("m", {1: 5.0, 2: float("nan")}) == 1  # NaN ranks last
    assert monitor.select_min_cost("m", {1: 1.0, 2: 1.0}) == 1  # ties keep the first
    monitor.set_thresholds("m", active_decode_blocks_threshold=0.9)
    saturate(monitor, 2)
    assert monitor.select_min_cost("m", {2: 0.0, 3: 9.0, 99: -1.0}) == 3  # busy and unknown skipped

    class Costs:  # any mapping-like object with items()
        def items(self) -> list[tuple[int, float]]:
            return [(1, 2.0), (3, 1.0)]

    assert monitor.select_min_cost("m", Costs()) == 3  # type: ignore[arg-type]
    with pytest.raises(Overloaded):
        monitor.select_min_cost("m", {2: 1.0})
    with pytest.raises(Overloaded):
        monitor.select_min_cost("m", {})
    with pytest.raises(Unavailable):
        monitor.select_min_cost("nope", {1: 1.0})
    with pytest.raises(TypeError, match="costs"):
        monitor.select_min_cost("m", [1, 2])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="costs"):
        monitor.select_min_cost("m", {-1: 1.0})
    with pytest.raises(TypeError, match="costs"):
        monitor.select_min_cost("m", {1: "cheap"})  # type: ignore[dict-item]


def test_check_and_overload_lease() -> None:
    # A lease far longer than the test, so nothing here races its end.
    m = Monitor(lease_seconds=600)
    m.add_worker("m", 1)
    m.add_worker("m", 2)
    m.check(1)
    assert not m.is_leased(1)
    m.mark_overloaded(1)
    assert m.is_leased(1)
    with pytest.raises(WorkerOverloaded) as info:
        m.check(1, endpoint="chat")
    assert (info.value.status_code, info.value.reason) == (529, "worker_overloaded")
    assert {m.select("m") for _ in range(4)} == {2}
    m.report(1, kv_used_blocks=0)  # a report showing it not busy ends the lease
    assert not m.is_leased(1)
    # A lease lasts exactly its time, on the monitor's clock.
    clock = ManualClock()
    short = Monitor(lease_seconds=2, clock=clock)
    short.add_worker("m", 1)
    short.add_worker("m", 2)
    short.mark_overloaded(1)
    clock.advance(1.5)
    assert short.is_leased(1)
    with pytest.raises(WorkerOverloaded):
        short.check(1)
    assert {short.select("m") for _ in range(4)} == {2}
    clock.advance(0.5)
    assert not short.is_leased(1)
    short.check(1)
    assert {short.select("m") for _ in range(4)} == {1, 2}
    # Marking again starts a new lease from now.
    short.mark_overloaded(1)
    clock.advance(1.75)
    assert short.is_leased(1)
    clock.advance(0.25)
    assert not short.is_leased(1)
    for call in (m.check, m.mark_overloaded, m.is_leased, m.is_busy):
        with pytest.raises(KeyError, match="unknown worker 5"):
            call(5)
        with pytest.raises(ValueError, match="worker_id"):
            call(-5)


def test_staleness_acts_with_no_sweep_call() -> None:
    # The monitor's own maintenance follows its clock.
    clock = ManualClock()
    m = Monitor(staleness="busy", stale_after=2, clock=clock)
    m.add_worker("m", 1)
    m.report(1, kv_used_blocks=0)
    assert not m.is_busy(1)
    # Time passes with no report (the clock moves on until the worker
    # counts as busy; nothing here calls sweep).
    deadline = time.monotonic() + 30
    while not m.is_busy(1):
        assert time.monotonic() < deadline, "the silent worker never counted as busy"
        clock.advance(0.5)
        time.sleep(0.005)
    assert clock.now() >= 2


def test_staleness_and_sweep() -> None:
    # The host's own sweeps, with nothing running between them.
    clock = ManualClock()
    m = Monitor(staleness="busy", stale_after=2, clock=clock, maintenance="manual")
    m.add_worker("m", 1)
    m.report(1, kv_used_blocks=0)
    assert m.sweep() == 0  # saw a report: not stale
    clock.advance(1.5)
    assert m.sweep() == 0 and not m.is_busy(1)  # silent for less than stale_after
    clock.advance(0.5)
    assert m.sweep() == 1
    assert m.is_busy(1)
    m.report(1, kv_used_blocks=0)  # a report ends it at once
    assert not m.is_busy(1) and m.sweep() == 0
    clock.advance(2)
    assert m.sweep() == 1 and m.is_busy(1)
    m.set_staleness("m", "keep")
    assert not m.is_busy(1)
    with pytest.raises(ValueError, match="maintenance"):
        Monitor(maintenance="sometimes")
    with pytest.raises(ValueError, match="staleness"):
        m.set_staleness("m", "maybe")
    with pytest.raises(ValueError, match="stale_after"):
        m.set_staleness("m", "free", 0)
    with pytest.raises(KeyError, match="unknown model"):
        m.set_staleness("nope", "free", 1.0)


def test_booking(monitor: Monitor) -> None:
    monitor.set_thresholds("m", active_decode_blocks_threshold=0.5)
    monitor.report(1, 1, kv_used_blocks=60)
    booking = monitor.book(1, 0, 40)
    assert (booking.worker_id, booking.dp_rank, booking.blocks, booking.released) == (1, 0, 40, False)
    assert not monitor.is_busy(1)
    booking.add_output_blocks(11)
    assert booking.blocks == 51
    assert monitor.is_busy(1)  # 51 active decode blocks > 50 on rank 0, 60 on rank 1
    assert "blocks=51" in repr(booking)
    booking.release()
    booking.release()  # idempotent
    assert booking.released and booking.blocks == 0
    assert not monitor.is_busy(1)
    with pytest.raises(RuntimeError, match="released"):
        booking.add_output_blocks(1)
    with monitor.book(1, 0, 60) as b:
        assert monitor.is_busy(1)
    assert b.released and not monitor.is_busy(1)
    monitor.book(1, 0, 60)  # dropped at once: freed on garbage collection
    gc.collect()
    assert not monitor.is_busy(1)
    text = monitor.metrics_text()
    assert 'dynamo_frontend_worker_active_decode_blocks{dp_rank="0",worker_id="1",worker_type="decode"} 0' in text


def test_prefill_booking(monitor: Monitor) -> None:
    # Workers that never report prefill tokens (Dynamo 1.6.1's): the router's
    # bookings alone feed the prefill threshold.
    monitor.set_thresholds("m", active_prefill_tokens_threshold=100)
    a = monitor.book(1, 0, 4, prefill_tokens=80)
    b = monitor.book(1, 1, 4, prefill_tokens=120)
    assert (a.prefill_tokens, b.prefill_tokens) == (80, 120)
    assert not monitor.is_busy(1)  # rank 0 holds 80, not above 100
    with monitor.book(1, 0, 1, prefill_tokens=30) as c:
        assert monitor.is_busy(1)  # 110 and 120: both ranks above the line
        c.prefill_done()
        assert c.prefill_tokens == 0 and c.blocks == 1
        assert not monitor.is_busy(1)
    a.prefill_done()
    a.prefill_done()  # idempotent
    assert a.prefill_tokens == 0 and a.blocks == 4
    b.release()
    b.prefill_done()  # after release: nothing to do
    assert b.prefill_tokens == 0
    a.release()
    assert not monitor.is_busy(1)
    with pytest.raises(ValueError, match="prefill_tokens"):
        monitor.book(1, 0, 1, prefill_tokens=-1)
    with pytest.raises(TypeError, match="prefill_tokens"):
        monitor.book(1, 0, 1, prefill_tokens="many")  # type: ignore[arg-type]


def test_book_bad_input(monitor: Monitor) -> None:
    with pytest.raises(KeyError, match="unknown worker 9"):
        monitor.book(9, 0, 1)
    with pytest.raises(ValueError, match="dp_rank 5"):
        monitor.book(1, 5, 1)
    with pytest.raises(ValueError, match="blocks"):
        monitor.book(1, 0, -1)
    with pytest.raises(TypeError, match="dp_rank"):
        monitor.book(1, None, 1)  # type: ignore[arg-type]
    b = monitor.book(1, 0, 1)
    with pytest.raises(ValueError, match="n"):
        b.add_output_blocks(-1)
    b.release()


def test_handle_busy_threshold(monitor: Monitor) -> None:
    post = lambda body, ct="application/json": monitor.handle_busy_threshold("POST", ct, body)  # noqa: E731
    status, headers, body = post(b'{"model": "m", "active_decode_blocks_threshold": 0.8}')
    assert status == 200 and isinstance(body, bytes)
    assert headers == [("content-type", "application/json")]
    assert json.loads(body) == {"model": "m", **NULLS, "active_decode_blocks_threshold": 0.8, "version": 1}
    assert monitor.thresholds("m")["active_decode_blocks_threshold"] == 0.8
    status, _, body = monitor.handle_busy_threshold("GET", None, b"")
    assert status == 200 and json.loads(body)["thresholds"][0]["model"] == "m"
    assert post(b'{"model": "x", "active_decode_blocks_threshold": 0.8}')[0] == 404
    assert post(b"{", "application/json")[0] == 400
    assert post(b'{"model": "m"}', "text/plain")[0] == 415
    assert monitor.handle_busy_threshold("DELETE", None, b"") == (405, [("allow", "POST,GET,HEAD")], b"")
    with pytest.raises(TypeError, match="body"):
        monitor.handle_busy_threshold("POST", "application/json", "{}")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="method"):
        monitor.handle_busy_threshold(None, None, b"")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="content_type"):
        monitor.handle_busy_threshold("GET", 1, b"")  # type: ignore[arg-type]


def test_metrics_text_and_removed_worker_series(monitor: Monitor) -> None:
    monitor.report(2, 1, active_decode_blocks=7, active_prefill_tokens=3)
    text = monitor.metrics_text()
    for name in (
        "dynamo_frontend_model_rejection_total",
        "dynamo_frontend_worker_active_decode_blocks",
        "dynamo_frontend_worker_active_prefill_tokens",
        "dynamo_frontend_model_busy_workers",
        "dynamo_frontend_model_threshold_version",
    ):
        assert f"# TYPE {name} " in text
    assert 'dynamo_frontend_worker_active_prefill_tokens{dp_rank="1",worker_id="2",worker_type="decode"} 3' in text
    monitor.remove_worker(2)
    assert 'worker_id="2"' not in monitor.metrics_text()


def test_shared_between_threads(monitor: Monitor) -> None:
    import threading

    monitor.set_thresholds("m", active_decode_blocks_threshold=0.9)
    errors: list[BaseException] = []

    def writer() -> None:
        try:
            for i in range(2000):
                monitor.report(1, i % 2, kv_used_blocks=i % 100)
        except BaseException as e:  # surfaced below
            errors.append(e)

    def reader() -> None:
        try:
            for _ in range(2000):
                try:
                    assert monitor.select("m") in (1, 2)
                except loadgate.Overloaded:
                    pass
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=f) for f in (writer, reader, writer, reader)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors


def test_model_arguments_must_be_str(monitor: Monitor) -> None:
    calls = [
        lambda: monitor.workers(1),  # type: ignore[arg-type]
        lambda: monitor.busy_workers(None),  # type: ignore[arg-type]
        lambda: monitor.thresholds(b"m"),  # type: ignore[arg-type]
        lambda: monitor.select_min_cost(1, {}),  # type: ignore[arg-type]
        lambda: monitor.set_staleness(1, "keep"),  # type: ignore[arg-type]
        lambda: monitor.add_worker(["m"], 3),  # type: ignore[arg-type]
    ]
    for call in calls:
        with pytest.raises(TypeError, match="model must be a str"):
            call()
    with pytest.raises(TypeError, match="staleness must be a str"):
        monitor.set_staleness("m", 1)  # type: ignore[arg-type]


def test_limits_bound_models_workers_and_ranks() -> None:
    m = Monitor(max_models=2, max_workers=3, max_ranks_per_worker=4, max_ranks=6, max_name_len=5)
    m.add_worker("a", 1, dp_size=4)
    with pytest.raises(ValueError, match="max_ranks_per_worker"):
        m.add_worker("a", 2, dp_size=5)
    with pytest.raises(ValueError, match="max_name_len"):
        m.add_worker("abcdef", 2)
    with pytest.raises(ValueError, match="max_ranks"):
        m.add_worker("a", 2, dp_size=3)
    m.add_worker("b", 2, dp_size=2)
    m.set_thresholds("b", active_decode_blocks_threshold=0.5)
    with pytest.raises(ValueError, match="max_models"):
        m.add_worker("c", 3, dp_size=0)
    m.add_worker("b", 3, dp_size=0)
    with pytest.raises(ValueError, match="max_workers"):
        m.add_worker("b", 4, dp_size=0)
    assert m.models() == ["a", "b"]
    assert m.workers("a") == [1] and m.workers("b") == [2, 3]


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"max_models": 0}, "max_models"),
        ({"max_workers": 0}, "max_workers"),
        ({"max_workers_per_model": 2**25}, "max_workers_per_model"),
        ({"max_ranks_per_worker": 0}, "max_ranks_per_worker"),
        ({"max_ranks_per_worker": 2**32}, "max_ranks_per_worker"),
        ({"max_ranks": -1}, "max_ranks"),
        ({"max_name_len": 0}, "max_name_len"),
    ],
)
def test_limits_out_of_range(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        Monitor(**kwargs)


def test_dynamos_threshold_variables_set_every_new_models_thresholds(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DYN_ACTIVE_DECODE_BLOCKS_THRESHOLD", " 0.5 ")
    monkeypatch.setenv("DYN_ACTIVE_PREFILL_TOKENS_THRESHOLD", "None")
    m = Monitor(dynamo_env=True)
    # The model comes with its first worker: its thresholds are there.
    m.add_worker("m", 1, kv_total_blocks=100)
    m.report(1, kv_used_blocks=90)
    assert m.is_busy(1)
    assert m.thresholds("m")["active_decode_blocks_threshold"] == 0.5
    assert m.thresholds("m")["active_prefill_tokens_threshold"] is None
    # Without dynamo_env the variables are not read.
    plain = Monitor()
    plain.add_worker("m", 1, kv_total_blocks=100)
    plain.report(1, kv_used_blocks=90)
    assert not plain.is_busy(1)
    monkeypatch.setenv("DYN_ACTIVE_PREFILL_TOKENS_THRESHOLD_FRAC", "-1")
    with pytest.raises(ValueError, match='DYN_ACTIVE_PREFILL_TOKENS_THRESHOLD_FRAC.*"-1"'):
        Monitor(dynamo_env=True)


def test_default_settings_reach_models_created_later() -> None:
    m = Monitor()
    m.add_worker("old", 1, kv_total_blocks=100)
    d = m.set_default_thresholds(active_decode_blocks_threshold=0.5)
    assert d["active_decode_blocks_threshold"] == 0.5
    m.set_default_flow_control(queue_limit=4)
    m.add_worker("new", 2, kv_total_blocks=100)
    m.report(1, kv_used_blocks=90)
    m.report(2, kv_used_blocks=90)
    assert not m.is_busy(1), "a model that existed keeps its thresholds"
    assert m.is_busy(2)
    assert 'frontend_queue_requests{model="new"} 0' in m.metrics_text()
    assert 'model="old"' not in "".join(
        line for line in m.metrics_text().splitlines() if line.startswith("dynamo_frontend_queue_requests")
    )
    # Per-model settings override them.
    m.set_thresholds("new", active_decode_blocks_threshold=0.95)
    assert not m.is_busy(2)
    with pytest.raises(ValueError, match="active_decode_blocks_threshold"):
        m.set_default_thresholds(active_decode_blocks_threshold=3.0)
    assert m.set_default_thresholds()["active_decode_blocks_threshold"] == 0.5
    with pytest.raises(ValueError):
        m.set_default_flow_control(queue_limit=4, prompt_weight=-1.0)
    m.set_default_flow_control(queue_limit=0)
