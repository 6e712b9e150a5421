"""Fork safety: after ``os.fork()`` the child can use everything afresh —
``Reporter``, ``Monitor.subscribe_nats``, gates, monitors — whatever the
parent had started before the fork (what ``gunicorn --preload`` and
``multiprocessing``'s fork start method do). The parent's own NATS objects
cannot follow the fork; in the child they raise instead of waiting forever,
and the parent keeps working."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import time
import traceback
from pathlib import Path
from typing import Callable

import pytest

import loadgate
from loadgate import AdmissionGate, Monitor, Reporter

from test_nats import WAIT, nats_url, wait_for  # noqa: F401  (nats_url is a fixture)


def child_main(url: str, parents_reporter: Reporter) -> None:
    """Everything a worker or frontend does, started afresh in the child."""
    monitor = Monitor()
    with monitor.subscribe_nats(url, "fork"), \
            Reporter(url, 2, "m", namespace="fork", kv_total_blocks=100) as reporter:
        reporter.report(kv_used_blocks=90)
        # The parent's reporter keeps sending heartbeats from the parent, so
        # the child's monitor sees both workers.
        wait_for(lambda: sorted(monitor.workers("m")), lambda w: w == [1, 2])
        monitor.set_thresholds("m", active_decode_blocks_threshold=0.5)
        reporter.report(active_decode_blocks=80)
        wait_for(lambda: monitor.busy_workers("m"), lambda busy: busy == [2])
        assert monitor.select("m") == 1

    gate = AdmissionGate(1, 1)

    async def queued_handoff() -> None:
        first = gate.try_admit()
        waiter = asyncio.ensure_future(gate.admit())
        await asyncio.sleep(0)
        assert gate.stats()["queued"] == 1
        first.release()
        (await waiter).release()

    asyncio.run(queued_handoff())
    assert gate.stats()["running"] == 0

    # The parent's connection cannot follow the fork: it says so at once.
    with pytest.raises(ConnectionError, match="forked"):
        parents_reporter.report(kv_used_blocks=1)


def run_in_child(child: Callable[[], None]) -> None:
    """Forks, runs `child` there and fails if it raised or hung."""
    pid = os.fork()
    if pid == 0:  # the child
        code = 1
        try:
            child()
            code = 0
        except BaseException:
            traceback.print_exc()
        finally:
            os._exit(code)
    # A bounded wait: it only turns a hang into a failure.
    deadline = time.monotonic() + 2 * WAIT
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            pytest.fail("the forked child hung")
        time.sleep(0.05)
    assert os.waitstatus_to_exitcode(status) == 0, "the child failed (its traceback is above)"


@pytest.mark.filterwarnings("ignore:.*fork.*:DeprecationWarning")
def test_the_parents_scrapes_stay_in_the_parent() -> None:
    from test_scrape import engine, vllm_text

    monitor = Monitor()
    with engine(vllm_text([0.5], [0], model="m")) as e, monitor.scrape(None, 1, e.url, interval=0.01) as parents:
        wait_for(parents.stats, lambda st: st["scrapes"] >= 2)

        def child() -> None:
            # The parent's scrape does not run here: its series are left out.
            assert 'frontend_scrape_registered{worker_id="1"}' not in monitor.metrics_text()
            # The child's own scrape works and shows up.
            with monitor.scrape(None, 2, e.url, interval=0.01) as own:
                wait_for(own.stats, lambda st: st["scrapes"] >= 1)
                assert 'frontend_scrape_registered{worker_id="2"} 1' in monitor.metrics_text()
            # Closing the parent's handle here returns at once and drops the
            # worker from the child's copy of the monitor.
            parents.close()
            assert monitor.workers("m") == []

        run_in_child(child)
        # The parent's scrape is unaffected.
        scrapes = parents.stats()["scrapes"]
        wait_for(parents.stats, lambda st: st["scrapes"] > scrapes)
        assert monitor.workers("m") == [1]
        assert 'frontend_scrape_registered{worker_id="1"} 1' in monitor.metrics_text()


@pytest.mark.filterwarnings("ignore:.*fork.*:DeprecationWarning")
def test_everything_works_in_a_forked_child(nats_url: str) -> None:  # noqa: F811
    parent = Monitor()
    with parent.subscribe_nats(nats_url, "fork"), \
            Reporter(nats_url, 1, "m", namespace="fork", kv_total_blocks=100) as reporter:
        # The parent has used NATS: its I/O thread is running when it forks.
        wait_for(lambda: parent.workers("m"), lambda w: w == [1])
        run_in_child(lambda: child_main(nats_url, reporter))

        # The parent is unaffected: its reports still land.
        parent.set_thresholds("m", active_decode_blocks_threshold=0.5)
        reporter.report(active_decode_blocks=90)
        wait_for(lambda: parent.busy_workers("m"), lambda busy: 1 in busy)
        with pytest.raises(loadgate.LoadgateError):
            parent.check(1)


@pytest.mark.filterwarnings("ignore:.*fork.*:DeprecationWarning")
def test_the_parents_discovery_stays_in_the_parent(tmp_path: Path) -> None:
    from test_discovery import RECORDED, card

    store = tmp_path / "kv"
    shutil.copytree(RECORDED / "kv", store, copy_function=shutil.copy)
    monitor = Monitor()
    parents = monitor.discover_dynamo(path=store, interval=0.01)
    assert len(monitor.workers("tiny")) == 2

    def child() -> None:
        # Closing the parent's watcher here neither waits for its thread
        # (which is not in this process) nor hangs.
        parents.close()
        # The child's own watcher works.
        with Monitor().discover_dynamo(path=store) as own:
            assert own.stats()["workers"] == 2

    run_in_child(child)
    # The parent's watcher is unaffected.
    card(store, 0x84074162003D704A).unlink()
    wait_for(lambda: len(monitor.workers("tiny")), lambda n: n == 1)
    parents.close()


def maintenance_states() -> list[str]:
    """The scheduler states of this process's monitor maintenance threads
    (Linux cuts their name to 15 bytes)."""
    states = []
    for task in Path("/proc/self/task").iterdir():
        try:
            if (task / "comm").read_text().strip() == "loadgate-monito":
                states.append((task / "stat").read_text().rsplit(")", 1)[1].split()[0])
        except OSError:
            pass
    return states


@pytest.mark.filterwarnings("ignore:.*fork.*:DeprecationWarning")
def test_a_forked_childs_queue_is_dispatched_by_its_own_maintenance() -> None:
    monitor = Monitor()
    monitor.add_worker("m", 1, kv_total_blocks=100)
    monitor.set_thresholds("m", active_decode_blocks_threshold=0.5)
    monitor.set_flow_control("m", queue_limit=4)
    # The parent's maintenance thread runs (it has a queue) when it forks;
    # it forks once that thread sleeps (a lock it held at the fork would
    # stay held in the child: make such objects after a fork).
    monitor.report(1, kv_used_blocks=90)
    wait_for(maintenance_states, lambda states: bool(states) and all(s == "S" for s in states))

    def child() -> None:
        async def main() -> None:
            waiting = asyncio.ensure_future(monitor.dispatch("m", blocks=1))
            await asyncio.sleep(0)
            assert not waiting.done()
            # No thread of the parent's is here: the child's own sends it.
            monitor.report(1, kv_used_blocks=0)
            ticket = await asyncio.wait_for(waiting, WAIT)
            assert ticket.worker == 1
            ticket.complete()

        asyncio.run(main())

    run_in_child(child)

    # The parent's own still works.
    async def parent() -> None:
        waiting = asyncio.ensure_future(monitor.dispatch("m", blocks=1))
        await asyncio.sleep(0)
        monitor.report(1, kv_used_blocks=0)
        (await asyncio.wait_for(waiting, WAIT)).complete()

    asyncio.run(parent())
