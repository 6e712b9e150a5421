"""`Monitor.route(model)` and the `Route` handle: picks like `Monitor.select`."""

from __future__ import annotations

import gc
import threading
from collections import Counter

import pytest

import loadgate
from loadgate import ManualClock, Monitor, Overloaded, Route, Unavailable

POLICIES = ("round_robin", "random", "power_of_two", "p2c")


def saturate(m: Monitor, worker: int) -> None:
    m.report(worker, kv_used_blocks=95)


def make_monitor(workers: int = 4) -> Monitor:
    m = Monitor()
    for w in range(1, workers + 1):
        m.add_worker("m", w, kv_total_blocks=100)
    m.set_thresholds("m", active_decode_blocks_threshold=0.9)
    return m


def test_handle_model_repr_and_export() -> None:
    route = make_monitor().route("m")
    assert isinstance(route, Route) and loadgate.Route is Route
    assert route.model == "m"
    assert repr(route) == '<loadgate.Route model="m">'
    with pytest.raises(AttributeError):
        route.model = "x"  # type: ignore[misc]
    with pytest.raises(TypeError):
        Route()


def test_round_robin_picks_the_same_workers_as_select() -> None:
    by_route, by_select = make_monitor(), make_monitor()
    for m in (by_route, by_select):
        saturate(m, 2)
    route = by_route.route("m")
    picks = [route.select() for _ in range(12)]
    assert picks == [by_select.select("m") for _ in range(12)]
    assert picks == [route.select(policy="round_robin") for _ in range(12)]
    assert Counter(picks) == {1: 4, 3: 4, 4: 4}
    # The handle and the monitor share the model's cursor: alternating them
    # walks the same cycle as either alone.
    mixed = [route.select() if i % 2 else by_route.select("m") for i in range(12)]
    assert mixed == [by_select.select("m") for _ in range(12)]


@pytest.mark.parametrize("policy", POLICIES)
def test_every_policy_picks_only_eligible_workers(policy: str) -> None:
    m = make_monitor()
    route = m.route("m")
    saturate(m, 1)
    saturate(m, 3)
    assert {route.select(policy=policy) for _ in range(200)} <= {2, 4}
    assert {m.select("m", policy=policy) for _ in range(200)} <= {2, 4}
    saturate(m, 4)
    # One eligible worker: every policy must pick it, through either path.
    assert {route.select(policy=policy) for _ in range(50)} == {2}
    assert {m.select("m", policy=policy) for _ in range(50)} == {2}


def test_sees_workers_added_and_removed_after_it_was_made() -> None:
    m = Monitor()
    route = m.route("late")
    assert "late" in m.models() and m.workers("late") == []
    with pytest.raises(Unavailable):
        route.select()
    m.add_worker("late", 7)
    assert route.select() == 7
    m.add_worker("late", 8)
    assert {route.select() for _ in range(4)} == {7, 8}
    m.remove_worker(7)
    assert {route.select() for _ in range(4)} == {8}
    m.remove_worker(8)
    with pytest.raises(Unavailable):
        route.select()
    # A second handle to the same model routes over the same workers.
    m.add_worker("late", 9)
    assert m.route("late").select() == route.select() == 9


def test_unavailable_and_overloaded() -> None:
    m = make_monitor(workers=2)
    with pytest.raises(Unavailable) as unavailable:
        m.route("no-workers").select()
    assert type(unavailable.value) is Unavailable
    assert (unavailable.value.status_code, unavailable.value.reason) == (503, "no_workers")
    route = m.route("m")
    saturate(m, 1)
    saturate(m, 2)
    for policy in POLICIES:
        with pytest.raises(Overloaded) as info:
            route.select(policy=policy)
        assert type(info.value) is Overloaded
        assert (info.value.status_code, info.value.reason) == (529, "all_workers_busy")
    m.report(2, kv_used_blocks=0)
    assert route.select() == 2


def test_overload_lease_on_the_monitors_clock() -> None:
    clock = ManualClock()
    m = Monitor(lease_seconds=2, clock=clock)
    m.add_worker("m", 1)
    m.add_worker("m", 2)
    route = m.route("m")
    m.mark_overloaded(1)
    clock.advance(1.5)
    assert {route.select() for _ in range(4)} == {2}
    clock.advance(0.5)
    assert {route.select() for _ in range(4)} == {1, 2}


def test_endpoint_counts_the_rejection_under_it() -> None:
    m = make_monitor(workers=1)
    route = m.route("m")
    assert route.select(endpoint="chat") == 1
    assert route.select(endpoint=None) == 1
    saturate(m, 1)
    with pytest.raises(Overloaded):
        route.select(endpoint="chat")
    with pytest.raises(Overloaded):
        route.select(policy="random", endpoint="chat")
    with pytest.raises(Overloaded):
        route.select()
    text = m.metrics_text()
    assert 'dynamo_frontend_model_rejection_total{model="m",endpoint="chat"} 2' in text
    assert text.count('dynamo_frontend_model_rejection_total{model="m",') == 2  # chat, default


def test_default_endpoint_is_shared_with_select() -> None:
    m = make_monitor(workers=1)
    route = m.route("m")
    saturate(m, 1)
    with pytest.raises(Overloaded):
        m.select("m")
    with pytest.raises(Overloaded):
        route.select()
    series = [
        line for line in m.metrics_text().splitlines()
        if line.startswith('dynamo_frontend_model_rejection_total{model="m",')
    ]
    assert len(series) == 1 and series[0].endswith(" 2")


def test_bad_policy_and_endpoint() -> None:
    route = make_monitor().route("m")
    with pytest.raises(ValueError, match='policy = "fastest" is invalid') as info:
        route.select(policy="fastest")
    assert "policy" in str(info.value) and "round_robin" in str(info.value)
    with pytest.raises(ValueError, match="policy"):
        route.select(policy="")
    with pytest.raises(TypeError, match="policy must be a str"):
        route.select(policy=1)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="endpoint must be a str"):
        route.select(endpoint=3)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        route.select("random")  # type: ignore[call-arg]
    # A bad policy is rejected however often it comes, and a good one after
    # it is parsed afresh.
    for _ in range(3):
        with pytest.raises(ValueError, match='"nope"'):
            route.select(policy="nope")
        assert route.select(policy="random") in (1, 2, 3, 4)


def test_bad_model_is_refused_like_other_monitor_methods() -> None:
    m = Monitor(max_name_len=5)
    for bad in (None, 1, b"m", ["m"]):
        with pytest.raises(TypeError, match="model must be a str"):
            m.route(bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="empty") as empty:
        m.route("")
    with pytest.raises(ValueError) as add_empty:
        m.add_worker("", 1)
    assert str(empty.value) == str(add_empty.value)
    with pytest.raises(ValueError, match="max_name_len") as long:
        m.route("abcdef")
    with pytest.raises(ValueError) as add_long:
        m.add_worker("abcdef", 1)
    assert str(long.value) == str(add_long.value)
    assert m.models() == []  # nothing was created
    assert m.route("abcde").model == "abcde"


def test_a_new_model_counts_against_max_models() -> None:
    m = Monitor(max_models=1)
    m.add_worker("a", 1)
    with pytest.raises(ValueError, match="max_models"):
        m.route("b")
    assert m.models() == ["a"]
    m.remove_worker(1)  # "a" is idle now: dropped to make room
    b = m.route("b")
    assert m.models() == ["b"]
    with pytest.raises(ValueError, match="max_models"):
        m.route("c")  # "b" has a handle: kept
    del b
    assert m.route("c").model == "c"


def test_shared_between_threads() -> None:
    m = make_monitor(workers=2)
    route = m.route("m")
    errors: list[BaseException] = []
    picks: list[Counter[int]] = []

    def reader() -> None:
        seen: Counter[int] = Counter()
        try:
            for i in range(2000):
                try:
                    seen[route.select(policy=POLICIES[i % len(POLICIES)])] += 1
                except Overloaded:
                    seen[0] += 1
        except BaseException as e:  # surfaced below
            errors.append(e)
        picks.append(seen)

    def writer() -> None:
        try:
            for i in range(2000):
                m.report(1 + i % 2, kv_used_blocks=i % 100)
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=f) for f in (reader, writer, reader, reader)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert len(picks) == 3
    for seen in picks:
        assert sum(seen.values()) == 2000 and set(seen) <= {0, 1, 2}


def test_survives_the_monitor() -> None:
    m = make_monitor(workers=2)
    route = m.route("m")
    del m
    gc.collect()
    assert route.model == "m"
    assert {route.select() for _ in range(4)} == {1, 2}
    assert route.select(policy="random", endpoint="chat") in (1, 2)
    # A handle made from a monitor that is then dropped at once.
    lone = Monitor().route("solo")
    gc.collect()
    with pytest.raises(Unavailable):
        lone.select()
