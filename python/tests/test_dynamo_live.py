"""loadgate beside a live Dynamo 1.6.1 deployment on loopback: nats-server,
two mocker workers (one with two data-parallel ranks) and Dynamo's own
frontend with its busy thresholds, all started here. A loadgate monitor
learns the workers from Dynamo's file discovery store (no `add_worker`),
follows their `kv_metrics` and `forward-pass-metrics` over NATS, and is
held to Dynamo's own answers:

* the workers and capacities are the model cards';
* in an idle spell under ``staleness="busy"``, no worker is ever busy;
* under decode load, and under prefill load, "every worker busy" in
  loadgate agrees with Dynamo's 529 on the same probe, in at least 99 % of
  the probes outside transitions (a probe within one report interval of a
  change in either verdict is a transition: 0.5 s for the workers'
  ``kv_metrics``, 0.1 s for the router's booking events). Dynamo decides prefill on its
  router's bookings, which loadgate reads from the router's
  ``active_sequences_events`` (the frontend runs with
  ``--router-replica-sync``).

Skipped unless ``LOADGATE_DYNAMO_PYTHON`` names a Python with ai-dynamo and
ai-dynamo-runtime 1.6.1 and tokenizers installed
(``tools/dynamo/record_fixtures.sh`` makes one at /tmp/dynamo-venv; the
project's tests never need it). ``LOADGATE_DYNAMO_IDLE`` sets the idle spell
(60 s by default). The figures are printed (``pytest -s``)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Tuple

import pytest

import loadgate
from loadgate import Monitor

DYNAMO_PYTHON = os.environ.get("LOADGATE_DYNAMO_PYTHON", "")
TOOLS = Path(__file__).resolve().parents[2] / "tools" / "dynamo"
sys.path.insert(0, str(TOOLS))  # common.py: Dynamo's environment on loopback
HOST = "127.0.0.1"
MODEL = "tiny"
BLOCKS = 64
BLOCK_SIZE = 16
DECODE_THRESHOLD = 0.5
# Dynamo publishes kv_metrics when a worker's load changes, about every
# 0.2 s under load: a decode probe within this of a change in either verdict
# is a transition.
REPORT_INTERVAL = 0.5
# A router publishes each booking change as it makes it: a prefill probe
# within this (delivery, and the probe's own round trip) of a change is a
# transition.
EVENT_INTERVAL = 0.1
# The prefill case's answers (tokens) and clients.
LONG_ANSWER = 20
PREFILL_CLIENTS = 24

pytestmark = pytest.mark.skipif(
    not DYNAMO_PYTHON or shutil.which("nats-server") is None,
    reason="set LOADGATE_DYNAMO_PYTHON to a Python with ai-dynamo 1.6.1 (tools/dynamo/record_fixtures.sh makes one)",
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def wait_until(what: str, cond: Any, limit: float = 120.0) -> None:
    deadline = time.monotonic() + limit
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def post(port: int, path: str, body: Dict[str, Any], timeout: float = 120.0) -> Tuple[int, bytes]:
    request = urllib.request.Request(
        f"http://{HOST}:{port}{path}",
        data=json.dumps(body).encode(),
        headers={"content-type": "application/json"},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as answer:
            return answer.status, answer.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def prompt(n_tokens: int, salt: int) -> str:
    """n_tokens words of the tiny tokenizer's vocabulary, distinct per salt."""
    return " ".join(f"w{(salt * 37 + i) % 256}" for i in range(n_tokens))


class Deployment:
    """Dynamo 1.6.1 on loopback: nats-server, two mockers, the frontend."""

    def __init__(self) -> None:
        self.work = Path(tempfile.mkdtemp(prefix="loadgate-dynamo-live-"))
        self.kv = self.work / "kv"
        self.http = free_port()
        self.nats = free_port()
        self.procs: List[subprocess.Popen[bytes]] = []
        self.logs: List[Any] = []

    def env(self) -> Dict[str, str]:
        from common import dynamo_env  # tools/dynamo/common.py

        env: Dict[str, str] = dynamo_env(
            self.work, self.nats, DYN_DISCOVERY_BACKEND="file", DYN_FILE_KV=str(self.kv)
        )
        return env

    def start(self, name: str, argv: List[str]) -> None:
        log = open(self.work / f"{name}.log", "wb")
        self.logs.append(log)
        self.procs.append(
            subprocess.Popen(argv, env=self.env(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        )

    def up(self) -> None:
        model = self.work / "model"
        subprocess.run(
            [DYNAMO_PYTHON, "-c", f"import sys; sys.path.insert(0, {str(TOOLS)!r}); "
             f"from pathlib import Path; from harness import make_model_dir; make_model_dir(Path({str(model)!r}))"],
            check=True,
        )
        self.start("nats-server", ["nats-server", "-a", HOST, "-p", str(self.nats)])
        mocker = [DYNAMO_PYTHON, "-m", "dynamo.mocker", "--model-path", str(model), "--model-name", MODEL,
                  "--discovery-backend", "file", "--request-plane", "tcp", "--event-plane", "nats",
                  "--num-gpu-blocks-override", str(BLOCKS), "--block-size", str(BLOCK_SIZE)]
        self.start("worker1", mocker)
        self.start("worker2", [*mocker, "--data-parallel-size", "2"])
        wait_until("two model cards", lambda: len(self.cards()) >= 2)
        self.start("frontend", [DYNAMO_PYTHON, "-m", "dynamo.frontend", "--http-host", HOST, "--http-port",
                                str(self.http), "--discovery-backend", "file", "--request-plane", "tcp",
                                "--event-plane", "nats", "--router-mode", "kv", "--router-replica-sync",
                                "--active-decode-blocks-threshold", str(DECODE_THRESHOLD)])
        wait_until("the frontend to list the model", self.model_listed)

    def cards(self) -> List[Dict[str, Any]]:
        mdc = self.kv / "v1" / "mdc"
        return [json.loads(p.read_text()) for p in mdc.glob("*")] if mdc.exists() else []

    def model_listed(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://{HOST}:{self.http}/v1/models", timeout=2) as answer:
                return MODEL in answer.read().decode()
        except OSError:
            return False

    def down(self) -> None:
        for p in reversed(self.procs):
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        for log in self.logs:
            log.close()
        shutil.rmtree(self.work, ignore_errors=True)


@pytest.fixture(scope="module")
def deployment() -> Iterator[Deployment]:
    d = Deployment()
    try:
        d.up()
        yield d
    finally:
        d.down()


@pytest.fixture(scope="module")
def monitor(deployment: Deployment) -> Iterator[Monitor]:
    m = Monitor(staleness="busy", stale_after=3.0)
    with m.discover_dynamo("dynamo", path=deployment.kv), m.subscribe_nats(
        f"nats://{HOST}:{deployment.nats}", "dynamo", dynamo=("backend", "generate")
    ):
        yield m


def all_busy(m: Monitor) -> bool:
    m.sweep()
    try:
        m.select(MODEL)
        return False
    except loadgate.Overloaded:
        return True


def agreement(name: str, probes: List[Tuple[float, bool, bool, bool]], interval: float) -> float:
    """The share of steady probes on which loadgate and Dynamo agree; a
    change of either verdict opens a transition of `interval` seconds."""
    changes = [
        probes[i][0]
        for i in range(1, len(probes))
        if probes[i][1] != probes[i - 1][1] or probes[i][3] != probes[i - 1][3]
    ]
    steady = [
        p for p in probes
        if p[2] == p[3] and not any(abs(p[0] - c) <= interval for c in changes)
    ]
    agree = sum(1 for _, dynamo, lg, _ in steady if dynamo == lg)
    busy_both = sum(1 for _, dynamo, lg, _ in steady if dynamo and lg)
    rate = agree / len(steady) if steady else 0.0
    print(
        f"\n{name}: {len(probes)} probes, {len(steady)} outside transitions, {agree} agree "
        f"({100 * rate:.2f} %), {busy_both} busy in both, {sum(p[1] for p in probes)} Dynamo 529s"
    )
    assert busy_both > 0, "the load never made every worker busy"
    assert len(steady) - busy_both > 0, "no probe outside transitions found a free worker"
    return rate


def probe(deployment: Deployment, monitor: Monitor, n: int) -> Tuple[float, bool, bool, bool]:
    """Loadgate's verdict, Dynamo's answer to a tiny request, loadgate's again."""
    before = all_busy(monitor)
    status, _ = post(deployment.http, "/v1/completions", {"model": MODEL, "prompt": prompt(4, n), "max_tokens": 1})
    after = all_busy(monitor)
    assert status in (200, 529), status
    return (time.monotonic(), status == 529, before, after)


def set_both(deployment: Deployment, monitor: Monitor, decode: float, prefill: int) -> None:
    """The same thresholds in Dynamo's frontend and in loadgate."""
    status, body = post(deployment.http, "/busy_threshold", {
        "model": MODEL, "active_decode_blocks_threshold": decode, "active_prefill_tokens_threshold": prefill})
    assert status == 200, body
    monitor.set_thresholds(MODEL, active_decode_blocks_threshold=decode, active_prefill_tokens_threshold=prefill)


def test_workers_and_capacities_come_from_dynamos_discovery(deployment: Deployment, monitor: Monitor) -> None:
    cards = {c["instance_id"]: c["card_json"]["runtime_config"] for c in deployment.cards()}
    assert sorted(monitor.workers(MODEL)) == sorted(cards)
    for worker, rc in cards.items():
        # Every declared rank takes a report; the next one does not exist.
        for rank in range(rc["data_parallel_size"]):
            monitor.report(worker, rank, kv_total_blocks=rc["total_kv_blocks"])
        with pytest.raises(ValueError, match="has no dp_rank"):
            monitor.report(worker, rc["data_parallel_size"], kv_total_blocks=1)
    shown = {w: (rc["data_parallel_size"], rc["total_kv_blocks"], rc["max_num_batched_tokens"]) for w, rc in cards.items()}
    print(f"\nlearned from discovery (ranks, KV blocks, batched tokens): {shown}")


def test_idle_workers_stay_free_under_staleness_busy(monitor: Monitor) -> None:
    monitor.set_thresholds(MODEL, active_decode_blocks_threshold=DECODE_THRESHOLD)
    seconds = float(os.environ.get("LOADGATE_DYNAMO_IDLE", "60"))
    end = time.monotonic() + seconds
    samples = busy = 0
    while time.monotonic() < end:
        monitor.sweep()
        samples += 1
        busy += len(monitor.busy_workers(MODEL))
        time.sleep(0.1)
    print(f"\nidle {seconds:.0f} s: {samples} samples, {busy} busy workers seen")
    assert samples > 0 and busy == 0


def test_decode_busy_agrees_with_dynamos_529(deployment: Deployment, monitor: Monitor) -> None:
    set_both(deployment, monitor, DECODE_THRESHOLD, 1_000_000)
    stop = threading.Event()

    def load(salt: int) -> None:
        # 300-token prompts hold 19 of a rank's 64 blocks each while they
        # decode: two on a rank exceed half of it.
        while not stop.is_set():
            post(deployment.http, "/v1/completions",
                 {"model": MODEL, "prompt": prompt(300, salt), "max_tokens": 160})
            salt += 50

    # Free, then loaded for 12 s, then draining: both verdicts turn and
    # turn back.
    probes: List[Tuple[float, bool, bool, bool]] = []
    threads = [threading.Thread(target=load, args=(i,), daemon=True) for i in range(8)]
    started = time.monotonic()
    while time.monotonic() - started < 30.0:
        elapsed = time.monotonic() - started
        waiting = [t for t in threads if t.ident is None]
        if waiting and elapsed > 3.0 + 0.3 * (len(threads) - len(waiting)):
            waiting[0].start()
        if elapsed > 15.0:
            stop.set()
        probes.append(probe(deployment, monitor, len(probes)))
        time.sleep(0.05)
    stop.set()
    for t in threads:
        t.join(120)

    assert agreement("decode", probes, REPORT_INTERVAL) >= 0.99


def test_prefill_busy_agrees_with_dynamos_529(deployment: Deployment, monitor: Monitor) -> None:
    # Decode out of the way (a rank is decode-busy only over all its
    # blocks). Clients send 170-token prompts for answers of 20 tokens,
    # back to back: a request is booked as prefill only until its prefill
    # completes, then decodes for most of its life, so the ranks turn
    # prefill-busy and free again all the time. Dynamo's router marks a
    # request's prefill done, or its worker does first: then the router
    # publishes no mark of its own, and its busy check sees the release only
    # at the rank's next publication, as loadgate does.
    set_both(deployment, monitor, 1.0, 100)
    stop = threading.Event()

    def load(salt: int) -> None:
        while not stop.is_set():
            post(deployment.http, "/v1/completions", {
                "model": MODEL, "prompt": prompt(170, salt), "max_tokens": LONG_ANSWER,
                "min_tokens": LONG_ANSWER, "ignore_eos": True})
            salt += PREFILL_CLIENTS

    threads = [threading.Thread(target=load, args=(1000 + i,), daemon=True) for i in range(PREFILL_CLIENTS)]
    probes: List[Tuple[float, bool, bool, bool]] = []
    started = time.monotonic()
    while time.monotonic() - started < 25.0:
        elapsed = time.monotonic() - started
        if elapsed > 3.0 and threads[0].ident is None:
            for t in threads:
                t.start()
        if elapsed > 15.0:
            stop.set()
        probes.append(probe(deployment, monitor, len(probes)))
        time.sleep(0.02)
    stop.set()
    for t in threads:
        t.join(120)
    assert agreement("prefill", probes, EVENT_INTERVAL) >= 0.99


def dynamo_status(deployment: Deployment, n: int) -> int:
    status, _ = post(deployment.http, "/v1/completions", {"model": MODEL, "prompt": prompt(4, 9000 + n), "max_tokens": 1})
    assert status in (200, 529), status
    return status


def wait_status(deployment: Deployment, want: int, limit: float = 10.0) -> float:
    """Probes Dynamo until it answers `want`; returns the seconds it took."""
    started = time.monotonic()
    n = 0
    while dynamo_status(deployment, n) != want:
        assert time.monotonic() - started < limit, f"Dynamo never answered {want}"
        n += 1
        time.sleep(0.02)
    return time.monotonic() - started


def test_bookings_made_through_loadgate_alone_turn_dynamo_to_529(deployment: Deployment, monitor: Monitor) -> None:
    """A second loadgate monitor announces its own bookings
    (`announce_bookings=True`); Dynamo's frontend counts them as a replica
    router's: with nothing else running, they turn its answer to 529, and
    releasing them turns it back. The first monitor, following Dynamo's
    routers, counts them too. `LOADGATE_RECORD_ANNOUNCED=<dir>` writes what
    was announced, and Dynamo's answers, as fixtures
    (core/tests/fixtures/dynamo-1.6.1/announced)."""
    from harness import NatsRecorder  # tools/dynamo/harness.py

    url = f"nats://{HOST}:{deployment.nats}"
    recorder = NatsRecorder(deployment.nats)
    recorder.start()
    lg = Monitor()
    steps: List[Dict[str, Any]] = []
    with lg.discover_dynamo("dynamo", path=deployment.kv), \
            lg.subscribe_nats(url, "dynamo", dynamo=("backend", "generate"), announce_bookings=True) as sub:
        wait_until("the workers", lambda: len(lg.workers(MODEL)) == 2)
        ranks = [(w, r) for w in lg.workers(MODEL) for r in range(2 if w in two_rank_workers(deployment) else 1)]
        # Decode: 40 of 64 blocks on every rank, over Dynamo's threshold of half.
        set_both(deployment, monitor, DECODE_THRESHOLD, 1_000_000)
        wait_status(deployment, 200)
        held = [lg.book(w, r, 40) for w, r in ranks]
        took = wait_status(deployment, 529)
        steps.append({"step": "decode-booked", "ranks": ranks, "blocks": 40, "status": 529, "after_s": round(took, 3)})
        wait_until("the other monitor to count them", lambda: all_busy(monitor), 10)
        for b in held:
            b.release()
        took = wait_status(deployment, 200)
        steps.append({"step": "decode-released", "status": 200, "after_s": round(took, 3)})
        # Prefill: 500 prompt tokens on every rank, over Dynamo's 100.
        set_both(deployment, monitor, 1.0, 100)
        held = [lg.book(w, r, 0, prefill_tokens=500) for w, r in ranks]
        took = wait_status(deployment, 529)
        steps.append({"step": "prefill-booked", "prefill_tokens": 500, "status": 529, "after_s": round(took, 3)})
        # The prefill done: Dynamo applies a replica's mark without
        # republishing the rank, so its answer may stay 529 until the
        # rank's next Add or Free (recorded, not asserted).
        for b in held:
            b.prefill_done()
        time.sleep(0.5)
        steps.append({"step": "prefill-done", "status": dynamo_status(deployment, 0)})
        for b in held:
            b.release()
        took = wait_status(deployment, 200)
        steps.append({"step": "prefill-released", "status": 200, "after_s": round(took, 3)})
        stats = sub.stats()
        router = sub.router_id
    recorder.close()
    set_both(deployment, monitor, DECODE_THRESHOLD, 1_000_000)
    ours = [m for m in recorder.messages if m["subject"].endswith(".active_sequences_events")
            and router_of(m["payload"]) == router]
    print(f"\nannounced: {stats['bookings_announced']} events ({len(ours)} seen on the wire), "
          f"Dynamo's answers: {[(s['step'], s['status'], s.get('after_s')) for s in steps]}")
    assert stats["bookings_announced"] == 5 * len(ranks) and stats["announce_lost"] == 0
    assert len(ours) == 5 * len(ranks)
    record = os.environ.get("LOADGATE_RECORD_ANNOUNCED")
    if record:
        write_announced(Path(record), ours, steps, ranks, router)


def two_rank_workers(deployment: Deployment) -> List[int]:
    return [c["instance_id"] for c in deployment.cards()
            if c["card_json"]["runtime_config"]["data_parallel_size"] == 2]


def decode_event(payload: bytes) -> Dict[str, Any]:
    """The envelope and event of an active_sequences_events message, decoded by
    the Dynamo Python's msgpack."""
    code = ("import sys, json, msgpack; env = msgpack.unpackb(sys.stdin.buffer.read(), raw=False); "
            "ev = msgpack.unpackb(env.pop('payload'), raw=False); print(json.dumps([env, ev]))")
    out = subprocess.run([DYNAMO_PYTHON, "-c", code], input=payload, capture_output=True, check=True).stdout
    env, ev = json.loads(out)
    return {"envelope": env, "decoded": ev}


def router_of(payload: bytes) -> Optional[int]:
    try:
        return int(decode_event(payload)["decoded"]["router_id"])
    except (subprocess.CalledProcessError, KeyError, ValueError):
        return None


def write_announced(out: Path, messages: List[Dict[str, Any]], steps: List[Dict[str, Any]],
                    ranks: List[Tuple[int, int]], router: Optional[int]) -> None:
    import base64

    out.mkdir(parents=True, exist_ok=True)
    with open(out / "announced.jsonl", "w") as f:
        for m in messages:
            line = {"subject": m["subject"], "payload_b64": base64.b64encode(m["payload"]).decode(),
                    **decode_event(m["payload"])}
            f.write(json.dumps(line) + "\n")
    (out / "steps.json").write_text(json.dumps({"router_id": router, "ranks": ranks, "steps": steps}, indent=1) + "\n")
