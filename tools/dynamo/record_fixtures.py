#!/usr/bin/env python3
"""Record what a real Dynamo 1.6.1 deployment sends and answers, as test fixtures.

Brings up, on loopback only: a nats-server, two mocker workers (one with
``--data-parallel-size 2``) and a frontend with the KV router and both busy
thresholds set, all on the file discovery backend and the TCP request plane,
with a tiny tokenizer made here (no model is ever downloaded). Then:

- subscribes to NATS ``>`` and records every message (subject, headers, raw
  payload), while idle, under prefill and decode overload, while workers go
  away and while a worker rejects requests itself;
- copies the discovery records from the ``DYN_FILE_KV`` directory as they are
  on disk, and times their keep-alive and expiry;
- records exact HTTP answers (status, headers, body bytes): 529 for each
  threshold, 503 and 404 without workers, every ``/busy_threshold`` case, and
  the ``/metrics`` text of the frontend and the workers.

Run it with a Python that has ai-dynamo 1.6.1 installed (``record_fixtures.sh``
makes one). Everything is written under ``--out``; see its README.md.

This file holds the run (its processes and the order of its phases); beside
it, ``common.py`` (settings, logging, the timeline), ``inspect_msgpack.py``
(wire types and schemas of the recorded payloads), ``harness.py`` (the NATS
recorder, HTTP helper, processes and tokenizer), ``phases.py`` (what each
phase drives and records) and ``writer.py`` (the fixture files).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import shutil
import socket
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

from common import (
    BLOCKS,
    BLOCK_SIZE,
    CLOCK,
    DECODE_THRESHOLD,
    HOST,
    MODEL,
    PHASE,
    PREFILL_THRESHOLD,
    dynamo_env,
    free_port,
    log,
    mark,
    set_phase,
)
from harness import NatsRecorder, Procs, body_text, http_call, make_model_dir, prompt
from phases import Phases
from writer import Writer

# ----------------------------------------------------------------- the run


class Recorder(Phases, Writer):
    def __init__(self, args) -> None:
        self.args = args
        self.out = Path(args.out).resolve()
        self.work = Path(tempfile.mkdtemp(prefix="dynamo-fixtures-"))
        self.kv = self.work / "kv"
        self.kv.mkdir()
        self.model = self.work / "model"
        (self.work / "home").mkdir()
        self.logs = self.work / "logs"
        self.logs.mkdir()
        self.procs = Procs(self.logs)
        self.ports = {
            "nats": free_port(),
            "http": free_port(),
            "w1_system": free_port(below=32768),
            "w2_system": free_port(below=32768),
            "w3_system": free_port(below=32768),
        }
        self.http_records: dict[str, dict] = {}
        self.loads: dict[str, dict] = {}
        self.metrics_lines: dict[str, list[str]] = {}
        self.discovery_notes: dict = {}
        self.metrics_full: dict[str, str] = {}
        self.model_info: dict = {}
        self.py = args.python or sys.executable

    # -- environment

    def dyn_env(self, **extra) -> dict:
        return dynamo_env(
            self.work / "home",
            self.ports["nats"],
            DYN_DISCOVERY_BACKEND="file",
            DYN_FILE_KV=str(self.kv),
            **extra,
        )

    def mocker_argv(self, name_extra=()):
        return [
            self.py,
            "-m",
            "dynamo.mocker",
            "--model-path",
            str(self.model),
            "--model-name",
            MODEL,
            "--discovery-backend",
            "file",
            "--request-plane",
            "tcp",
            "--event-plane",
            "nats",
            "--num-gpu-blocks-override",
            str(BLOCKS),
            "--block-size",
            str(BLOCK_SIZE),
            *name_extra,
        ]

    def frontend_argv(self):
        return [
            self.py,
            "-m",
            "dynamo.frontend",
            "--http-host",
            HOST,
            "--http-port",
            str(self.ports["http"]),
            "--discovery-backend",
            "file",
            "--request-plane",
            "tcp",
            "--event-plane",
            "nats",
            "--router-mode",
            self.args.router_mode,
            "--active-decode-blocks-threshold",
            str(DECODE_THRESHOLD),
            "--active-prefill-tokens-threshold",
            str(PREFILL_THRESHOLD),
        ]

    # -- HTTP shortcuts

    def call(self, key, method, path, **kw):
        rec = http_call(self.ports["http"], method, path, **kw)
        rec["t"] = CLOCK.now()
        rec["phase"] = PHASE["name"]
        if key is not None:
            self.http_records[key] = rec
        log(f"  {method} {path} -> {rec.get('status', rec.get('error'))} {body_text(rec)[:110]}")
        return rec

    def post_json(self, key, obj, path="/busy_threshold", **kw):
        return self.call(
            key, "POST", path, headers={"content-type": "application/json"}, body=json.dumps(obj).encode(), **kw
        )

    def completion_body(self, n_tokens, salt, max_tokens, stream=False):
        return json.dumps(
            {"model": MODEL, "prompt": prompt(n_tokens, salt), "max_tokens": max_tokens, "stream": stream}
        ).encode()

    def chat_body(self, n_tokens, salt, max_tokens, stream=False):
        return json.dumps(
            {
                "model": MODEL,
                "messages": [{"role": "user", "content": prompt(n_tokens, salt)}],
                "max_tokens": max_tokens,
                "stream": stream,
            }
        ).encode()

    def scrape(self, port, path="/metrics") -> str:
        rec = http_call(port, "GET", path, raw=True)
        return rec["raw_body"].decode() if rec.get("status") == 200 else ""

    def keep_metric_lines(self, key, text):
        wanted = (
            "dynamo_frontend_failures_total",
            "dynamo_frontend_model_rejection_total",
            "dynamo_frontend_worker_active_",
            "dynamo_frontend_model_total_kv_blocks",
            "dynamo_frontend_model_max_num_batched_tokens",
            "dynamo_frontend_model_ready",
            "dynamo_frontend_requests_total",
            "dynamo_frontend_router_",
            "dynamo_engine_request",
            "dynamo_request_queue",
            "dynamo_rejection_request_total",
        )
        lines = [
            ln
            for ln in text.splitlines()
            if not ln.startswith("#") and any(ln.startswith(w) for w in wanted) and "_bucket{" not in ln
        ]
        self.metrics_lines[key] = lines

    # -- waiting

    def wait_for(self, what, pred, timeout=90.0, every=0.25):
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            try:
                if pred():
                    mark(f"ready: {what}")
                    return True
            except Exception:
                pass
            time.sleep(every)
        raise RuntimeError(f"timed out waiting for {what}; logs in {self.logs}")

    def model_listed(self) -> bool:
        rec = http_call(self.ports["http"], "GET", "/v1/models", timeout=5)
        return rec.get("status") == 200 and f'"id":"{MODEL}"' in body_text(rec)

    def mdc_count(self) -> int:
        d = self.kv / "v1" / "mdc"
        return len(list(d.iterdir())) if d.is_dir() else 0

    # -- load

    def burst(self, key, specs, settle=None, stagger=0.0):
        """Send every request of specs at once, or stagger seconds apart (one thread each).

        specs: list of (label, path, body, keep_full). Keeps the first full answer
        of each (label, status) and a line per request. Returns the records in order.
        """
        results: list[dict | None] = [None] * len(specs)
        barrier = threading.Barrier(len(specs))

        def one(i, label, path, body):
            barrier.wait()
            time.sleep(i * stagger)
            rec = http_call(
                self.ports["http"], "POST", path, headers={"content-type": "application/json"}, body=body
            )
            rec["label"] = label
            rec["t_sent"] = CLOCK.now() - rec["elapsed_s"]
            results[i] = rec

        threads = [
            threading.Thread(target=one, args=(i, lab, path, body), daemon=True)
            for i, (lab, path, body, _) in enumerate(specs)
        ]
        mark(f"burst {key}", requests=len(specs))
        for th in threads:
            th.start()
        if settle is not None:
            settle()
        for th in threads:
            th.join(300)
        counts = collections.Counter(r.get("status", r.get("error")) for r in results)
        mark(f"burst {key} done", statuses=dict(counts))
        self.loads[key] = {
            "requests": [
                {
                    "label": r["label"],
                    "status": r.get("status"),
                    "error": r.get("error"),
                    "elapsed_s": r["elapsed_s"],
                    "body_head": body_text(r)[:100],
                }
                for r in results
            ],
            "statuses": {str(k): v for k, v in counts.items()},
        }
        # Keep the first full answer of each (label, status).
        seen = set()
        for r, (lab, _, _, keep) in zip(results, specs):
            k = (lab.split("#")[0], r.get("status"))
            if keep and k not in seen:
                seen.add(k)
                self.http_records[f"{key}:{k[0]}:{k[1]}"] = r
        return results

    # -- discovery

    def discovery_listing(self):
        out = []
        for p in sorted(self.kv.rglob("*")):
            if p.is_file():
                st = p.stat()
                out.append({"path": str(p.relative_to(self.kv)), "size": st.st_size, "mtime": st.st_mtime})
        return out

    def copy_discovery(self, dest: Path):
        if self.args.lite:
            return self.discovery_listing()
        if dest.exists():
            shutil.rmtree(dest)
        shutil.copytree(self.kv, dest)
        return self.discovery_listing()

    def time_keepalive(self, seconds):
        """Watch the discovery files' mtimes; returns each file's distinct touch times."""
        seen: dict[str, list[float]] = collections.defaultdict(list)
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            for item in self.discovery_listing():
                times = seen[item["path"]]
                if not times or times[-1] != item["mtime"]:
                    times.append(item["mtime"])
            time.sleep(0.2)
        gaps = []
        for times in seen.values():
            gaps += [round(b - a, 3) for a, b in zip(times, times[1:])]
        return {
            "watched_s": seconds,
            "files": len(seen),
            "touch_intervals_s": sorted(set(round(g, 1) for g in gaps)),
            "median_interval_s": statistics.median(gaps) if gaps else None,
        }

    # ------------------------------------------------------------- phases

    def run(self):
        log(f"work dir {self.work}")
        self.model_info = make_model_dir(self.model)
        nats_argv = ["nats-server", "-a", HOST, "-p", str(self.ports["nats"])]
        if self.args.jetstream:
            nats_argv += ["-js", "-sd", str(self.work / "jetstream")]
        self.procs.start("nats-server", nats_argv, os.environ.copy())
        self.wait_for("nats-server", lambda: socket.create_connection((HOST, self.ports["nats"]), 1).close() or True)
        self.nats = NatsRecorder(self.ports["nats"])
        self.nats.start()

        self.procs.start(
            "worker1", self.mocker_argv(), self.dyn_env(DYN_SYSTEM_PORT=self.ports["w1_system"])
        )
        self.procs.start(
            "worker2",
            self.mocker_argv(["--data-parallel-size", "2"]),
            self.dyn_env(DYN_SYSTEM_PORT=self.ports["w2_system"]),
        )
        self.wait_for("two model cards in discovery", lambda: self.mdc_count() >= 2)
        self.procs.start("frontend", self.frontend_argv(), self.dyn_env())
        self.wait_for("frontend lists the model", self.model_listed)
        time.sleep(2)

        # Idle: what the workers send when nothing happens.
        set_phase("idle")
        keepalive = self.time_keepalive(self.args.idle_seconds)
        self.discovery_notes["keepalive_while_running"] = keepalive
        self.discovery_notes["files_while_running"] = self.copy_discovery(self.out / "discovery" / "kv")
        self.metrics_full["frontend_idle"] = self.scrape(self.ports["http"])

        set_phase("http-probe")
        self.probe_http()

        set_phase("prefill-overload")
        self.prefill_overload()

        set_phase("cooldown")
        time.sleep(4)

        set_phase("decode-overload")
        self.decode_overload()

        set_phase("idle-after-load")
        time.sleep(self.args.idle_seconds)
        self.metrics_full["frontend_after_load"] = self.scrape(self.ports["http"])
        self.metrics_full["worker1"] = self.scrape(self.ports["w1_system"])
        self.metrics_full["worker2"] = self.scrape(self.ports["w2_system"])
        self.keep_metric_lines("frontend_after_load", self.metrics_full["frontend_after_load"])

        set_phase("no-workers")
        self.no_workers()

        set_phase("worker-gate")
        self.worker_gate()

        set_phase("shutdown")
        self.procs.stop_all()
        self.nats.close()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="fixture folder to (re)write")
    ap.add_argument("--python", help="Python with ai-dynamo installed (default: this one)")
    ap.add_argument("--router-mode", default="kv", help="frontend --router-mode (default kv)")
    ap.add_argument("--idle-seconds", type=float, default=12.0)
    ap.add_argument("--jetstream", action="store_true", help="start nats-server with -js")
    ap.add_argument("--keep-logs", action="store_true", help="copy the processes' logs into --out/logs")
    ap.add_argument(
        "--lite",
        action="store_true",
        help="write only run.json, the overload answers, the selected metric lines and the NATS summary",
    )
    args = ap.parse_args()
    out = Path(args.out)
    for sub in ("nats", "http", "metrics", "discovery", "logs"):
        if (out / sub).exists():
            shutil.rmtree(out / sub)
    out.mkdir(parents=True, exist_ok=True)
    rec = Recorder(args)
    ok = False
    try:
        rec.run()
        ok = True
    finally:
        rec.procs.stop_all()
        if hasattr(rec, "nats"):
            rec.nats.close()
            rec.write()
        if ok:
            shutil.rmtree(rec.work, ignore_errors=True)
            log(f"done; fixtures in {rec.out}")
        else:
            log(f"failed; the processes' logs are in {rec.logs}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
