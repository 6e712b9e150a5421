"""`Monitor.discover_dynamo` on the model cards a real Dynamo 1.6.1 wrote to
its file discovery backend (the recorded store in
core/tests/fixtures/dynamo-1.6.1/discovery): workers and capacities learned
with no `add_worker` call, and gone again when their cards go."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path
from typing import Any, Callable

import pytest

from loadgate import Discovery, Monitor

RECORDED = Path(__file__).resolve().parents[2] / "core/tests/fixtures/dynamo-1.6.1/discovery"
ONE_RANK = 0x84074162003D704A
TWO_RANKS = 0xFB1EE5F806650F6A


def wait_until(what: str, cond: Callable[[], bool]) -> None:
    deadline = time.monotonic() + 20.0
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


@pytest.fixture
def store(tmp_path: Path) -> Path:
    """A copy of the recorded store, its files written now (not stale)."""
    shutil.copytree(RECORDED / "kv", tmp_path / "kv", copy_function=shutil.copy)
    return tmp_path / "kv"


def card(store: Path, worker: int) -> Path:
    return store / "v1" / "mdc" / f"dynamo%2Fbackend%2Fgenerate%2F{worker:x}"


def test_workers_and_capacities_come_from_the_store(store: Path) -> None:
    monitor = Monitor()
    with monitor.discover_dynamo("dynamo", path=store, interval=0.02) as discovery:
        assert isinstance(discovery, Discovery) and not discovery.closed
        assert discovery.path == str(store)
        # Registered when discover_dynamo returns.
        assert sorted(monitor.workers("tiny")) == [ONE_RANK, TWO_RANKS]
        stats = discovery.stats()
        assert (stats["workers"], stats["workers_added"]) == (2, 2)
        assert stats["refused"] == dict.fromkeys(
            ("too_large", "malformed", "mismatched", "over_limit", "registration"), 0
        )
        # Load reports for the learned ranks apply against the learned
        # capacities (a worker is busy when every rank is): 33 of 64 blocks
        # is over half, 4097 of 8192 tokens too.
        monitor.set_thresholds("tiny", active_decode_blocks_threshold=0.5, active_prefill_tokens_threshold_frac=0.5)
        for rank in (0, 1):
            monitor.report(TWO_RANKS, rank, kv_used_blocks=32)
        assert not monitor.is_busy(TWO_RANKS)
        for rank in (0, 1):
            monitor.report(TWO_RANKS, rank, kv_used_blocks=33)
        assert monitor.is_busy(TWO_RANKS)
        monitor.report(ONE_RANK, 0, active_prefill_tokens=4097)
        assert monitor.is_busy(ONE_RANK)
        with pytest.raises(ValueError, match="has no dp_rank 2"):
            monitor.report(TWO_RANKS, 2, kv_used_blocks=1)
        # A card that goes takes its worker with it.
        card(store, ONE_RANK).unlink()
        wait_until("the worker to leave", lambda: monitor.workers("tiny") == [TWO_RANKS])
        assert discovery.stats()["workers_removed"] == 1
    # Closing removes what it registered.
    assert discovery.closed and monitor.workers("tiny") == []
    assert discovery.stats()["workers"] == 0
    discovery.close()  # again: nothing


def test_other_namespaces_and_hostile_records(store: Path) -> None:
    (store / "v1" / "mdc" / "junk").write_bytes(b"\x00not a card")
    monitor = Monitor()
    with monitor.discover_dynamo("elsewhere", path=store) as discovery:
        stats: Any = discovery.stats()
        assert stats["workers"] == 0 and stats["skipped"] == 2
        assert stats["refused"]["malformed"] == 1 and "junk" in stats["last_error"]
    assert monitor.models() == []


def test_the_default_path_is_dynamos(store: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DYN_FILE_KV", str(store))
    monitor = Monitor()
    with monitor.discover_dynamo() as discovery:
        assert discovery.path == str(store)
        assert len(monitor.workers("tiny")) == 2
    monkeypatch.delenv("DYN_FILE_KV")
    with monitor.discover_dynamo(ttl=None) as discovery:
        assert Path(discovery.path).name == "dynamo_store_kv"


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"backend": "etcd"}, ValueError, "backend = 'etcd' is invalid: must be 'file'"),
        ({"backend": 1}, TypeError, "backend"),
        ({"namespace": ""}, ValueError, "namespace must not be empty"),
        ({"interval": 0}, ValueError, "interval = 0 is invalid"),
        ({"interval": -1.0}, ValueError, "interval"),
        ({"ttl": "10"}, TypeError, "ttl"),
        ({"path": 5}, TypeError, "path"),
    ],
)
def test_bad_arguments_are_refused_before_anything_starts(kwargs: Any, error: type, match: str, tmp_path: Path) -> None:
    kwargs.setdefault("path", tmp_path)
    with pytest.raises(error, match=match):
        Monitor().discover_dynamo(**kwargs)


def test_garbage_collection_closes_it(store: Path) -> None:
    monitor = Monitor()
    monitor.discover_dynamo(path=os.fspath(store))
    # The handle was dropped at once: its workers went with it.
    assert monitor.workers("tiny") == []
