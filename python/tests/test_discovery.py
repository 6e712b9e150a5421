"""`Monitor.discover_dynamo` on the model cards a real Dynamo 1.6.1 wrote to
its discovery store (recorded in core/tests/fixtures/dynamo-1.6.1/discovery):
its file backend's directory, and its etcd records put into a real etcd.
Workers and capacities are learned with no `add_worker` call, and gone again
when their cards go."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
from pathlib import Path
from typing import Any, Callable, Iterator

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
        assert discovery.source == str(store)
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
        assert discovery.source == str(store)
        assert len(monitor.workers("tiny")) == 2
    monkeypatch.delenv("DYN_FILE_KV")
    with monitor.discover_dynamo(ttl=None) as discovery:
        assert Path(discovery.source).name == "dynamo_store_kv"


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"backend": "consul"}, ValueError, "backend = 'consul' is invalid: must be 'file' .* or 'etcd'"),
        ({"endpoints": "http://127.0.0.1:2379"}, ValueError, "endpoints is for backend='etcd'"),
        ({"backend": "etcd", "endpoints": []}, ValueError, "endpoints must not be empty"),
        ({"backend": "etcd", "endpoints": 5}, TypeError, "endpoints"),
        ({"backend": "etcd", "path": None, "user": "u"}, ValueError, "user and password go together"),
        ({"backend": 1}, TypeError, "backend"),
        ({"namespace": ""}, ValueError, "namespace must not be empty"),
        ({"interval": 0}, ValueError, "interval = 0 is invalid"),
        ({"interval": -1.0}, ValueError, "interval"),
        ({"ttl": "10"}, TypeError, "ttl"),
        ({"path": 5}, TypeError, "path"),
    ],
)
def test_bad_arguments_are_refused_before_anything_starts(kwargs: Any, error: type, match: str, tmp_path: Path) -> None:
    if kwargs.get("backend") != "etcd":
        kwargs.setdefault("path", tmp_path)
    with pytest.raises(error, match=match):
        Monitor().discover_dynamo(**kwargs)


def test_garbage_collection_closes_it(store: Path) -> None:
    monitor = Monitor()
    monitor.discover_dynamo(path=os.fspath(store))
    # The handle was dropped at once: its workers went with it.
    assert monitor.workers("tiny") == []


# ----- etcd ------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def etcd(tmp_path: Path) -> Iterator[str]:
    """A real etcd (Debian's etcd-server) on loopback; its client URL."""
    client, peer = f"http://127.0.0.1:{free_port()}", f"http://127.0.0.1:{free_port()}"
    proc = subprocess.Popen(
        ["etcd", "--data-dir", str(tmp_path / "etcd"), "--name", "default",
         "--listen-client-urls", client, "--advertise-client-urls", client,
         "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
         "--initial-cluster", f"default={peer}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        wait_until("etcd to answer", lambda: etcdctl(client, "endpoint", "health", check=False) == 0)
        yield client
    finally:
        proc.terminate()
        proc.wait(10)


def etcdctl(endpoint: str, *args: str, value: str | None = None, check: bool = True) -> int:
    argv = ["etcdctl", "--endpoints", endpoint, *args]
    if value is not None:
        argv.append(value)
    env = {"ETCDCTL_API": "3", "PATH": os.environ["PATH"]}
    done = subprocess.run(argv, env=env, capture_output=True, check=check)
    return done.returncode


def recorded_etcd_card() -> tuple[str, str, int]:
    records = json.loads((RECORDED / "etcd" / "records.json").read_text())
    card = next(r for r in records["while_running"] if r["key"].startswith("v1/mdc/"))
    return card["key"], card["value"], int(card["key"].rsplit("/", 1)[1], 16)


def test_workers_come_from_etcd_and_go_with_their_cards(etcd: str) -> None:
    key, value, worker = recorded_etcd_card()
    etcdctl(etcd, "put", key, value=value)
    monitor = Monitor()
    with monitor.discover_dynamo(backend="etcd", endpoints=[etcd]) as discovery:
        assert discovery.source == etcd
        assert monitor.workers("tiny") == [worker]  # registered when it returns
        etcdctl(etcd, "del", key)
        wait_until("the worker to leave", lambda: monitor.workers("tiny") == [])
        etcdctl(etcd, "put", key, value=value)
        wait_until("the worker to come back", lambda: monitor.workers("tiny") == [worker])
        assert discovery.stats()["workers_added"] == 2
    assert monitor.workers("tiny") == []


def test_etcd_endpoints_default_to_dynamos_variable(etcd: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ETCD_ENDPOINTS", f" {etcd} ,")
    with Monitor().discover_dynamo(backend="etcd") as discovery:
        assert discovery.source == etcd


def test_an_unreachable_etcd_is_a_connection_error() -> None:
    with pytest.raises(ConnectionError, match="cannot read etcd"):
        Monitor().discover_dynamo(backend="etcd", endpoints=f"http://127.0.0.1:{free_port()}", connect_timeout=0.3)
