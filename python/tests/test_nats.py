"""Load reports across machines over a real `nats-server`: `Reporter` on the
worker side, `Monitor.subscribe_nats` on the frontend side. Every
subscribed monitor converges on the same busy set, thresholds stay local,
and a worker that goes silent is removed."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import time
from pathlib import Path
from typing import Callable, Iterator, List, Optional, TypeVar

import pytest

import loadgate
from loadgate import Monitor, Reporter, Unavailable

from conftest import run_python

T = TypeVar("T")

# A bounded wait for convergence: it only turns a hang into a failure, far
# above what a loaded CI machine needs; typical runs settle in milliseconds.
WAIT = 30.0


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def nats_server_binary() -> str:
    found = shutil.which("nats-server")
    if found:
        return found
    if os.access("/usr/sbin/nats-server", os.X_OK):
        return "/usr/sbin/nats-server"
    pytest.fail("nats-server is not installed (python/tests/run.sh installs it)")


@contextlib.contextmanager
def running_nats_server(args: List[str], log: Path, port: Optional[int] = None) -> Iterator[int]:
    """A `nats-server` with `args` on `port` (default: a free loopback
    port): yields the port once the server greets, and stops the server on
    exit."""
    port = port or free_port()
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [nats_server_binary(), *args, "-a", "127.0.0.1", "-p", str(port)],
            stdout=out, stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
                    if s.recv(4).startswith(b"INFO"):
                        break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("nats-server did not start:\n" + Path(log).read_text(errors="replace"))
            time.sleep(0.02)
        yield port
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="module")
def nats_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A `nats-server` of its own on a free loopback port, stopped after the
    module's tests."""
    log = tmp_path_factory.mktemp("nats") / "nats-server.log"
    with running_nats_server([], log) as port:
        yield f"nats://127.0.0.1:{port}"


def wait_for(read: Callable[[], T], want: Callable[[T], bool], timeout: float = WAIT) -> T:
    """Polls `read()` until `want` holds of its value; fails after `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        value = read()
        if want(value):
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"no convergence within {timeout} s; last value: {value!r}")
        time.sleep(0.01)


def test_two_monitors_converge_and_thresholds_stay_local(nats_url: str) -> None:
    a, b = Monitor(), Monitor()
    with a.subscribe_nats(nats_url, "converge") as sub_a, b.subscribe_nats(nats_url, "converge") as sub_b, \
            Reporter(nats_url, 1, "m", namespace="converge", dp_size=2, kv_total_blocks=100) as r1, \
            Reporter(nats_url, 2, "m", namespace="converge", dp_size=2, dp_start=4, kv_total_blocks=100) as r2:
        for m in (a, b):
            wait_for(lambda: m.workers("m"), lambda w: w == [1, 2])
            m.set_thresholds("m", active_decode_blocks_threshold=0.5)
        assert a.busy_workers("m") == b.busy_workers("m") == []

        # Both ranks of worker 2 above the line: worker 2 turns busy everywhere.
        r2.report(4, kv_used_blocks=80)
        r2.report(5, kv_used_blocks=90)
        start = time.monotonic()
        for m in (a, b):
            wait_for(lambda: m.busy_workers("m"), lambda busy: busy == [2])
        converged = time.monotonic() - start
        assert a.select("m") == b.select("m") == 1
        with pytest.raises(loadgate.WorkerOverloaded):
            a.check(2)

        # Worker 1 too (ranks 0 and 1), then worker 2 recovers on one rank.
        r1.report(0, kv_used_blocks=60)
        r1.report(kv_used_blocks=70)
        r1.report(1, kv_used_blocks=70)
        r2.report(5, kv_used_blocks=10)
        for m in (a, b):
            wait_for(lambda: m.busy_workers("m"), lambda busy: busy == [1])
        assert a.is_busy(1) and b.is_busy(1)

        # A threshold set on one monitor does not reach the other.
        a.set_thresholds("m", active_decode_blocks_threshold=0.95)
        assert a.busy_workers("m") == []
        assert b.busy_workers("m") == [1]
        assert b.thresholds("m")["active_decode_blocks_threshold"] == 0.5
        assert b.thresholds("m")["version"] == 1
        r1.report(0, active_decode_blocks=1)  # more traffic: still local
        landed = 'dynamo_frontend_worker_active_decode_blocks{dp_rank="0",worker_id="1",worker_type="decode"} 1\n'
        for m in (a, b):
            wait_for(m.metrics_text, lambda text: landed in text)
        assert a.busy_workers("m") == [] and b.busy_workers("m") == [1]

        for sub in (sub_a, sub_b):
            s = sub.stats()
            assert set(s) == {
                "applied", "announced", "out_of_order", "malformed", "refused", "expired", "router_bookings",
                "bookings_announced", "announce_lost",
            }
            assert s["router_bookings"] == 0  # no Dynamo router here
            assert s["bookings_announced"] == s["announce_lost"] == 0  # nothing announced
            assert s["announced"] == 2  # one per worker
            assert s["applied"] >= 6  # the reports above (heartbeats add more)
            assert (s["out_of_order"], s["malformed"], s["refused"], s["expired"]) == (0, 0, 0, 0)
    print(f"two monitors converged in {converged * 1000:.1f} ms")


def test_silent_worker_expires_then_select_is_unavailable(nats_url: str) -> None:
    m = Monitor()
    sub = m.subscribe_nats(nats_url, "expiry", expire_after=0.5)
    try:
        reporters: List[Reporter] = [
            Reporter(nats_url, wid, "m", namespace="expiry", dp_size=2, heartbeat=0.1) for wid in (7, 8)
        ]
        wait_for(lambda: m.workers("m"), lambda w: w == [7, 8])
        # Heartbeats keep both alive past expire_after: once the subscriber
        # has applied 40 more of them, neither worker has expired. A reporter
        # sends at most one message per rank (two) per heartbeat (0.1 s), so
        # 40 span at least ten heartbeats of one of them: longer than
        # expire_after (0.5 s) plus a sweep. core/tests/cluster_nats.rs
        # checks the bounds of expiry on a manual clock.
        heard = sub.stats()["applied"]
        wait_for(lambda: sub.stats()["applied"], lambda n: n >= heard + 40)
        assert m.workers("m") == [7, 8]
        assert sub.stats()["expired"] == 0

        reporters[0].close()
        reporters[0].close()  # idempotent
        with pytest.raises(RuntimeError, match="closed"):
            reporters[0].report(kv_used_blocks=1)
        wait_for(lambda: m.workers("m"), lambda w: w == [8])
        assert m.select("m") == 8
        assert sub.stats()["expired"] == 1

        reporters[1].close()
        wait_for(lambda: m.workers("m"), lambda w: w == [])
        with pytest.raises(Unavailable):
            m.select("m")
        assert sub.stats()["expired"] == 2
    finally:
        sub.close()
    sub.close()  # idempotent
    assert sub.stats()["expired"] == 2  # counters stay readable


def test_namespaces_are_separate(nats_url: str) -> None:
    m, other = Monitor(), Monitor()
    with m.subscribe_nats(nats_url, "ns-a") as sub, other.subscribe_nats(nats_url, "ns-b"):
        with Reporter(nats_url, 1, "m", namespace="ns-b", heartbeat=0.1), \
                Reporter(nats_url, 2, "m", namespace="ns-a", heartbeat=0.1):
            wait_for(lambda: m.workers("m"), lambda w: w == [2])
            # Worker 1's announcements have gone through the server: ns-b's
            # monitor registered it.
            wait_for(lambda: other.workers("m"), lambda w: w == [1])
            # A worker that joins ns-a after that comes behind them: the
            # server delivers to m's connection in order, and m registers
            # new workers one at a time in arrival order. So once worker 3
            # is registered, any of worker 1's that reached ns-a would be.
            with Reporter(nats_url, 3, "m", namespace="ns-a", heartbeat=0.1):
                wait_for(lambda: m.workers("m"), lambda w: 3 in w)
                assert m.workers("m") == [2, 3]
        assert sub.stats()["announced"] == 2


def test_default_namespace(nats_url: str) -> None:
    m = Monitor()
    with m.subscribe_nats(nats_url) as sub, Reporter(nats_url, 3, "d", kv_total_blocks=10) as r:
        wait_for(lambda: m.workers("d"), lambda w: w == [3])
        m.set_thresholds("d", active_decode_blocks_threshold=0.5)
        r.report(kv_used_blocks=9)
        wait_for(lambda: m.busy_workers("d"), lambda busy: busy == [3])
        assert sub.stats()["malformed"] == 0


def test_waiting_requests_travel_to_the_frontend(nats_url: str) -> None:
    m = Monitor()
    with m.subscribe_nats(nats_url, namespace="waiting") as sub, \
            Reporter(nats_url, 4, "w", namespace="waiting", dp_size=2) as r:
        wait_for(lambda: m.workers("w"), lambda w: w == [4])
        m.set_thresholds("w", waiting_requests_threshold=2)
        r.report(0, waiting_requests=3)
        r.report(1, waiting_requests=3)
        wait_for(lambda: m.busy_workers("w"), lambda busy: busy == [4])
        r.report(1, waiting_requests=2)
        wait_for(lambda: m.busy_workers("w"), lambda busy: busy == [])
        with pytest.raises(ValueError, match="waiting_requests"):
            r.report(waiting_requests=-1)
        assert sub.stats()["malformed"] == 0


def test_unreachable_server_raises_connection_error_naming_the_url() -> None:
    url = f"nats://127.0.0.1:{free_port()}"
    with pytest.raises(ConnectionError, match=url):
        Monitor().subscribe_nats(url)
    with pytest.raises(ConnectionError, match=url):
        Reporter(url, 1, "m")


@pytest.mark.parametrize("url", ["nats://", "nats://host:notaport", "nats://[::1", "::::"])
def test_malformed_url_is_a_value_error_naming_it(url: str) -> None:
    with pytest.raises(ValueError, match="not a NATS server URL"):
        Monitor().subscribe_nats(url)
    with pytest.raises(ValueError, match="not a NATS server URL"):
        Reporter(url, 1, "m")


@pytest.mark.parametrize("namespace", ["", "a.b", "a b", "*", ">", "x>"])
def test_bad_namespace_is_a_value_error(namespace: str) -> None:
    # Checked before connecting: no server is needed.
    url = "nats://127.0.0.1:1"
    with pytest.raises(ValueError, match="namespace"):
        Monitor().subscribe_nats(url, namespace)
    with pytest.raises(ValueError, match="namespace"):
        Reporter(url, 1, "m", namespace=namespace)


def test_bad_settings_are_refused_before_connecting() -> None:
    url = "nats://127.0.0.1:1"
    with pytest.raises(ValueError, match="expire_after"):
        Monitor().subscribe_nats(url, expire_after=0)
    with pytest.raises(ValueError, match="heartbeat"):
        Reporter(url, 1, "m", heartbeat=-1.0)
    with pytest.raises(ValueError, match="model"):
        Reporter(url, 1, "")
    with pytest.raises(ValueError, match="dp_start"):
        Reporter(url, 1, "m", dp_start=2**32 - 1, dp_size=2)
    with pytest.raises(ValueError, match="worker_id"):
        Reporter(url, -1, "m")
    with pytest.raises(TypeError, match="url"):
        Reporter(b"nats://x", 1, "m")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="namespace"):
        Monitor().subscribe_nats(url, 5)  # type: ignore[arg-type]


def test_report_checks_ranks_like_monitor_report(nats_url: str) -> None:
    m = Monitor()
    m.add_worker("m", 1, dp_size=2, dp_start=2)
    with Reporter(nats_url, 1, "m", dp_size=2, dp_start=2) as r:
        r.report(2, kv_used_blocks=1)
        r.report(3, active_prefill_tokens=0)
        for rank in (0, 4):
            with pytest.raises(ValueError, match=f"dp_rank {rank}"):
                m.report(1, rank, kv_used_blocks=1)
            with pytest.raises(ValueError, match=f"dp_rank {rank}"):
                r.report(rank, kv_used_blocks=1)
        with pytest.raises(ValueError, match="dp_rank"):
            r.report(-1)
        with pytest.raises(ValueError, match="kv_used_blocks"):
            r.report(2, kv_used_blocks=-1)
        with pytest.raises(TypeError, match="active_decode_blocks"):
            r.report(2, active_decode_blocks=1.5)  # type: ignore[arg-type]
    with pytest.raises(RuntimeError, match="closed"):
        r.report(2)


def test_threads_start_on_first_connection_not_at_import(nats_url: str) -> None:
    code = f"""
import os, time, loadgate
def threads(): return len(os.listdir("/proc/self/task"))
m = loadgate.Monitor(); g = loadgate.AdmissionGate(1)
print(threads())
s = m.subscribe_nats({nats_url!r}); r = loadgate.Reporter({nats_url!r}, 1, "m")
print(threads() > 1)
r.close(); s.close()
"""
    if not os.path.isdir("/proc/self/task"):
        pytest.skip("needs /proc")
    r = run_python(code)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["1", "True"]


def test_a_frontend_refuses_what_its_limits_do_not_allow_and_counts_why(nats_url: str) -> None:
    m = Monitor(max_ranks_per_worker=2, max_models=1)
    with m.subscribe_nats(nats_url, "limits") as sub, \
            Reporter(nats_url, 1, "m", namespace="limits", dp_size=2) as ok, \
            Reporter(nats_url, 2, "m", namespace="limits", dp_size=4) as wide, \
            Reporter(nats_url, 3, "other", namespace="limits") as other:
        ok.report(1, kv_used_blocks=5)
        wait_for(lambda: m.workers("m"), lambda w: w == [1])
        wait_for(lambda: sub.refusals(), lambda r: r["too_many_ranks"] > 0 and r["too_many_models"] > 0)
        assert m.models() == ["m"] and m.workers("m") == [1]
        assert sub.stats()["refused"] >= 2
        assert all(n == 0 for reason, n in sub.refusals().items()
                   if reason not in ("too_many_ranks", "too_many_models"))
        text = sub.metrics_text()
        assert 'dynamo_frontend_load_messages_refused_total{reason="too_many_ranks"}' in text
        del wide, other


def test_reference_event_plane_both_ways(nats_url: str) -> None:
    """A Reporter speaking the reference's envelope is read by a monitor that
    follows the reference's subject; its workers are declared by hand."""
    m = Monitor()
    m.add_worker("m", 5, dp_size=2, kv_total_blocks=100)
    with m.subscribe_nats(nats_url, "dyn", dynamo=("*", "*")) as sub, \
            Reporter(nats_url, 5, "m", namespace="dyn", dp_size=2, dynamo=("vllm worker", "generate")) as r, \
            Reporter(nats_url, 6, "m", namespace="dyn", dynamo=("backend", "generate")) as undeclared:
        m.set_thresholds("m", active_decode_blocks_threshold=0.4)
        r.report(0, kv_used_blocks=42)
        r.report(1, kv_used_blocks=42)
        undeclared.report(kv_used_blocks=1)
        wait_for(lambda: m.busy_workers("m"), lambda busy: busy == [5])
        wait_for(lambda: sub.refusals()["unknown_worker"], lambda n: n > 0)
        assert m.workers("m") == [5]  # envelopes never register a worker
        assert sub.stats()["announced"] == 0


def rank_gauges(m: Monitor, worker: int, rank: int) -> tuple:
    """(active decode blocks, active prefill tokens) of one rank, as `m`'s metrics show."""
    out = [0, 0]
    for line in m.metrics_text().splitlines():
        for i, name in enumerate(("worker_active_decode_blocks{", "worker_active_prefill_tokens{")):
            if name in line and f'dp_rank="{rank}",worker_id="{worker}"' in line:
                out[i] = int(line.rsplit(" ", 1)[1])
    return tuple(out)


def test_bookings_announced_to_dynamos_routers_are_counted_by_another_monitor(nats_url: str) -> None:
    """`announce_bookings=True`: a's own bookings go out as a Dynamo router's
    active_sequences_events; b, following the endpoint's routers, holds them
    (blocks, then prefill until done) and frees them; a counts its own once."""
    a, b = Monitor(), Monitor()
    for m in (a, b):
        m.add_worker("m", 5, dp_size=2, kv_total_blocks=100)
    endpoint = ("backend", "generate")
    with a.subscribe_nats(nats_url, "dyn", dynamo=endpoint, announce_bookings=True) as sa, \
            b.subscribe_nats(nats_url, "dyn", dynamo=endpoint) as sb:
        router = sa.router_id
        assert isinstance(router, int) and sb.router_id is None
        with pytest.raises(ValueError, match="already announced"):
            a.subscribe_nats(nats_url, "dyn", dynamo=endpoint, announce_bookings=True)
        booking = a.book(5, 1, 7, prefill_tokens=170)
        wait_for(lambda: rank_gauges(b, 5, 1), lambda g: g == (7, 170))
        assert sb.stats()["router_bookings"] == 1
        booking.prefill_done()
        wait_for(lambda: rank_gauges(b, 5, 1), lambda g: g == (7, 0))
        booking.release()
        wait_for(lambda: rank_gauges(b, 5, 1), lambda g: g == (0, 0))
        assert rank_gauges(a, 5, 1) == (0, 0)
        stats = sa.stats()
        assert stats["bookings_announced"] == 3 and stats["announce_lost"] == 0
        assert stats["router_bookings"] == 0, "a skips its own events"
    # Closed: a monitor may announce again, under the same router id.
    assert sa.router_id is None
    with a.subscribe_nats(nats_url, "dyn", dynamo=endpoint, announce_bookings=True) as again:
        assert again.router_id == router
    with pytest.raises(ValueError, match="announce_bookings.*dynamo"):
        Monitor().subscribe_nats(nats_url, "dyn", announce_bookings=True)
    with pytest.raises(ValueError, match="announce_bookings"):
        Monitor().subscribe_nats(nats_url, "dyn", dynamo=("*", "generate"), announce_bookings=True)


@pytest.mark.parametrize(
    "dynamo,exc",
    [("backend", TypeError), (("backend",), TypeError), ((1, "generate"), TypeError), (("", "generate"), ValueError)],
)
def test_reference_event_plane_bad_arguments(nats_url: str, dynamo: object, exc: type) -> None:
    with pytest.raises(exc, match="dynamo|component|endpoint|namespace"):
        Monitor().subscribe_nats(nats_url, "dyn", dynamo=dynamo)  # type: ignore[arg-type]
    with pytest.raises(exc, match="dynamo|component|endpoint|namespace"):
        Reporter(nats_url, 1, "m", namespace="dyn", dynamo=dynamo)  # type: ignore[arg-type]
