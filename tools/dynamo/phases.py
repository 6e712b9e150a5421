"""The recorder's phases, each driving the deployment and recording what it
answers."""

from __future__ import annotations

import json
import signal
import threading
import time

from common import (
    CLOCK,
    DECODE_THRESHOLD,
    MODEL,
    PREFILL_THRESHOLD,
    W3_ENGINE_LIMIT,
    W3_MAX_BATCHED,
    log,
    mark,
)
from harness import body_text, http_call

class Phases:
    """The recorded phases: HTTP probes, prefill and decode overload, workers
    going away, and a worker refusing requests itself (mixed into `Recorder`)."""

    def probe_http(self):
        J = {"content-type": "application/json"}
        self.call("busy_threshold GET", "GET", "/busy_threshold")
        self.call("busy_threshold HEAD", "HEAD", "/busy_threshold")
        self.post_json("busy_threshold POST read", {"model": MODEL})
        self.post_json("busy_threshold POST read unknown model", {"model": "no-such-model"})
        self.post_json(
            "busy_threshold POST set decode",
            {"model": MODEL, "active_decode_blocks_threshold": 0.75},
        )
        self.post_json(
            "busy_threshold POST set all three",
            {
                "model": MODEL,
                "active_decode_blocks_threshold": 0.6,
                "active_prefill_tokens_threshold": 200,
                "active_prefill_tokens_threshold_frac": 0.25,
            },
        )
        self.post_json(
            "busy_threshold POST set unknown model (404)",
            {"model": "no-such-model", "active_decode_blocks_threshold": 0.5},
        )
        self.post_json(
            "busy_threshold POST negative active_prefill_tokens_threshold",
            {"model": MODEL, "active_prefill_tokens_threshold": -5},
        )
        self.post_json(
            "busy_threshold POST fractional active_prefill_tokens_threshold",
            {"model": MODEL, "active_prefill_tokens_threshold": 1.5},
        )
        self.post_json(
            "busy_threshold POST negative active_prefill_tokens_threshold_frac",
            {"model": MODEL, "active_prefill_tokens_threshold_frac": -0.5},
        )
        self.post_json(
            "busy_threshold POST active_decode_blocks_threshold above 1",
            {"model": MODEL, "active_decode_blocks_threshold": 1.5},
        )
        self.post_json(
            "busy_threshold POST negative active_decode_blocks_threshold",
            {"model": MODEL, "active_decode_blocks_threshold": -0.1},
        )
        self.post_json(
            "busy_threshold POST string threshold (wrong type)",
            {"model": MODEL, "active_decode_blocks_threshold": "0.5"},
        )
        self.post_json("busy_threshold POST missing model", {"active_decode_blocks_threshold": 0.5})
        self.post_json(
            "busy_threshold POST unknown field clear",
            {"model": MODEL, "clear": ["active_decode_blocks_threshold"]},
        )
        self.post_json(
            "busy_threshold POST waiting_requests_threshold field",
            {"model": MODEL, "waiting_requests_threshold": 3},
        )
        self.call("busy_threshold POST malformed JSON", "POST", "/busy_threshold", headers=J, body=b'{"model": ')
        self.call("busy_threshold POST empty body", "POST", "/busy_threshold", headers=J, body=b"")
        self.call("busy_threshold POST JSON array", "POST", "/busy_threshold", headers=J, body=b"[]")
        self.call(
            "busy_threshold POST text/plain",
            "POST",
            "/busy_threshold",
            headers={"content-type": "text/plain"},
            body=json.dumps({"model": MODEL}).encode(),
        )
        self.call(
            "busy_threshold POST no content-type",
            "POST",
            "/busy_threshold",
            body=json.dumps({"model": MODEL}).encode(),
        )
        self.call(
            "busy_threshold POST application/json; charset=utf-8",
            "POST",
            "/busy_threshold",
            headers={"content-type": "application/json; charset=utf-8"},
            body=json.dumps({"model": MODEL}).encode(),
        )
        for size in (65537, 2 * 1024 * 1024, 2 * 1024 * 1024 + 1):
            head = json.dumps({"model": MODEL}).encode()[:-1]
            body = head + b" " * (size - len(head) - 1) + b"}"
            assert len(body) == size
            self.call(
                f"busy_threshold POST body of {size} bytes",
                "POST",
                "/busy_threshold",
                headers=J,
                body=body,
                body_what=f'{{"model":"{MODEL}"}} padded with spaces before the closing brace to {size} bytes',
            )
        for method in ("PUT", "DELETE", "PATCH", "OPTIONS"):
            self.call(f"busy_threshold {method}", method, "/busy_threshold", headers=J, body=b"{}")
        self.call("busy_threshold GET after the probes", "GET", "/busy_threshold")
        # Back to the command-line values for the overload phases.
        self.post_json(
            "busy_threshold POST restore",
            {
                "model": MODEL,
                "active_decode_blocks_threshold": DECODE_THRESHOLD,
                "active_prefill_tokens_threshold": PREFILL_THRESHOLD,
            },
        )
        self.call("models GET", "GET", "/v1/models")
        self.call("health GET", "GET", "/health")
        self.call("live GET", "GET", "/live")
        self.call(
            "completions unknown model (404)",
            "POST",
            "/v1/completions",
            headers=J,
            body=json.dumps({"model": "no-such-model", "prompt": "w1 w2", "max_tokens": 2}).encode(),
        )
        self.call(
            "chat unknown model (404)",
            "POST",
            "/v1/chat/completions",
            headers=J,
            body=json.dumps(
                {"model": "no-such-model", "messages": [{"role": "user", "content": "w1"}], "max_tokens": 2}
            ).encode(),
        )
        self.call("completions 200", "POST", "/v1/completions", headers=J, body=self.completion_body(8, 1, 4))
        self.call("chat 200", "POST", "/v1/chat/completions", headers=J, body=self.chat_body(8, 2, 4))
        self.call(
            "completions streamed 200", "POST", "/v1/completions", headers=J, body=self.completion_body(8, 3, 3, True)
        )

    def prefill_overload(self):
        # Decode check effectively off (no rank can use more than all its blocks);
        # every prompt alone is above the prefill threshold, so a rank is busy
        # from the moment one request is booked on it until its prefill completes.
        self.post_json(
            "prefill phase: busy_threshold POST set",
            {"model": MODEL, "active_decode_blocks_threshold": 1.0, "active_prefill_tokens_threshold": PREFILL_THRESHOLD},
        )
        n_tokens = 3 * PREFILL_THRESHOLD // 2  # 150 > 100
        specs = []
        for i in range(14):
            specs.append((f"completions#{i}", "/v1/completions", self.completion_body(n_tokens, 100 + i, 8), True))
        specs.append(("completions_stream", "/v1/completions", self.completion_body(n_tokens, 150, 8, True), True))
        specs.append(("chat", "/v1/chat/completions", self.chat_body(n_tokens, 151, 8), True))
        specs.append(("chat_stream", "/v1/chat/completions", self.chat_body(n_tokens, 152, 8, True), True))
        gauges = []

        def settle():
            for _ in range(6):
                time.sleep(0.05)
                text = self.scrape(self.ports["http"])
                gauges.append(
                    {"t": CLOCK.now(), "lines": [ln for ln in text.splitlines() if ln.startswith("dynamo_frontend_worker_active_")]}
                )

        self.burst("prefill-overload", specs, settle)
        self.loads["prefill-overload"]["gauges_during"] = gauges
        text = self.scrape(self.ports["http"])
        self.keep_metric_lines("frontend_after_prefill_overload", text)

    def decode_overload(self):
        # Prefill check effectively off; prompts of 300 tokens book 19 blocks
        # each (block size 16), so two on a rank exceed half of its 64 blocks.
        self.post_json(
            "decode phase: busy_threshold POST set",
            {
                "model": MODEL,
                "active_decode_blocks_threshold": DECODE_THRESHOLD,
                "active_prefill_tokens_threshold": 1_000_000,
            },
        )
        specs = []
        for i in range(9):
            specs.append((f"completions#{i}", "/v1/completions", self.completion_body(300, 200 + i, 160), True))
        gauges = []
        probes = {}

        def settle():
            time.sleep(3.0)
            text = self.scrape(self.ports["http"])
            gauges.append(
                {"t": CLOCK.now(), "lines": [ln for ln in text.splitlines() if ln.startswith("dynamo_frontend_worker_active_")]}
            )
            J = {"content-type": "application/json"}
            probes["completions"] = self.call(
                "decode-overload:probe completions", "POST", "/v1/completions", headers=J, body=self.completion_body(20, 250, 4)
            )
            probes["completions_stream"] = self.call(
                "decode-overload:probe completions streamed",
                "POST",
                "/v1/completions",
                headers=J,
                body=self.completion_body(20, 251, 4, True),
            )
            probes["chat"] = self.call(
                "decode-overload:probe chat", "POST", "/v1/chat/completions", headers=J, body=self.chat_body(20, 252, 4)
            )
            probes["chat_stream"] = self.call(
                "decode-overload:probe chat streamed",
                "POST",
                "/v1/chat/completions",
                headers=J,
                body=self.chat_body(20, 253, 4, True),
            )
            self.call("decode-overload:busy_threshold GET while loaded", "GET", "/busy_threshold")
            text = self.scrape(self.ports["http"])
            gauges.append(
                {"t": CLOCK.now(), "lines": [ln for ln in text.splitlines() if ln.startswith("dynamo_frontend_worker_active_")]}
            )
            self.keep_metric_lines("frontend_during_decode_overload", text)

        self.burst("decode-overload", specs, settle, stagger=0.25)
        self.loads["decode-overload"]["gauges_during"] = gauges
        self.keep_metric_lines("frontend_after_decode_overload", self.scrape(self.ports["http"]))

    def no_workers(self):
        """Stop worker1 gracefully and kill worker2; record every distinct answer."""
        answers = []
        listing_changes = []
        stop = threading.Event()
        J = {"content-type": "application/json"}

        def poll():
            last = None
            i = 0
            while not stop.is_set():
                i += 1
                rec = http_call(
                    self.ports["http"], "POST", "/v1/completions", headers=J, body=self.completion_body(4, 300 + i, 2), timeout=30
                )
                rec["t"] = CLOCK.now()
                key = (rec.get("status"), body_text(rec) if rec.get("status") != 200 else "")
                if key != last:
                    answers.append(rec)
                    log(f"  no-workers answer {key[0]} {key[1][:100]}")
                    last = key
                time.sleep(0.05)

        def watch():
            last = None
            while not stop.is_set():
                names = sorted(x["path"] for x in self.discovery_listing())
                if names != last:
                    listing_changes.append({"t": CLOCK.now(), "wall": time.time(), "files": names})
                    last = names
                time.sleep(0.1)

        threads = [threading.Thread(target=poll, daemon=True), threading.Thread(target=watch, daemon=True)]
        for th in threads:
            th.start()
        time.sleep(1.0)
        self.procs.signal("worker1", signal.SIGTERM)
        self.procs.wait("worker1", 30)
        mark("worker1 exited", code=self.procs.procs["worker1"].returncode)
        time.sleep(1.0)
        self.discovery_notes["files_after_worker1_sigterm"] = self.discovery_listing()
        before_kill = {x["path"]: x["mtime"] for x in self.discovery_listing()}
        self.procs.signal("worker2", signal.SIGKILL)
        wall_kill = time.time()
        self.procs.wait("worker2", 10)
        t_kill = CLOCK.now()
        # Until the killed worker's records expire and the model is gone for 3 s.
        end = time.monotonic() + 45
        while time.monotonic() < end:
            time.sleep(0.5)
            if answers and answers[-1].get("status") == 404 and CLOCK.now() - answers[-1]["t"] > 3:
                break
        stop.set()
        for th in threads:
            th.join(40)
        self.no_worker_answers = answers
        self.discovery_notes["listing_changes_during_no_workers"] = [
            {"t": c["t"], "t_since_sigkill_worker2": round(c["t"] - t_kill, 3), "files": c["files"]}
            for c in listing_changes
        ]
        # When each of the killed worker's files went away, after its last keep-alive touch.
        gone = {}
        for prev, cur in zip(listing_changes, listing_changes[1:]):
            for path in set(prev["files"]) - set(cur["files"]):
                if path in before_kill and cur["wall"] > wall_kill:
                    gone[path] = {
                        "removed_after_last_touch_s": round(cur["wall"] - before_kill[path], 2),
                        "removed_after_sigkill_s": round(cur["wall"] - wall_kill, 2),
                    }
        self.discovery_notes["killed_worker_files_removed"] = gone
        self.discovery_notes["killed_worker_files_never_removed"] = sorted(
            p for p in before_kill if p not in gone and p in (listing_changes[-1]["files"] if listing_changes else [])
        )
        self.discovery_notes["sigkill_worker2_t"] = t_kill
        for n, rec in enumerate(answers):
            self.http_records[f"no-workers:answer {n}:{rec.get('status')}"] = rec
        self.call("no-workers: busy_threshold GET", "GET", "/busy_threshold")
        self.post_json("no-workers: busy_threshold POST read", {"model": MODEL})
        self.call("no-workers: models GET", "GET", "/v1/models")
        self.keep_metric_lines("frontend_no_workers", self.scrape(self.ports["http"]))

    def worker_gate(self):
        """One worker that admits W3_ENGINE_LIMIT requests, runs one sequence at a time
        (so the others wait in its scheduler queue) and rejects the rest itself."""
        self.procs.start(
            "worker3",
            self.mocker_argv(["--max-num-seqs", "1", "--max-num-batched-tokens", str(W3_MAX_BATCHED)]),
            self.dyn_env(
                DYN_SYSTEM_PORT=self.ports["w3_system"],
                DYN_ENGINE_REQUEST_LIMIT=W3_ENGINE_LIMIT,
                DYN_DYNAMO_REQUEST_QUEUE_LIMIT=0,
            ),
        )
        self.wait_for("frontend lists the model again", self.model_listed)
        self.call("worker-gate: busy_threshold GET on the re-added model", "GET", "/busy_threshold")
        self.post_json(
            "worker-gate: busy_threshold POST set (frontend checks off)",
            {"model": MODEL, "active_decode_blocks_threshold": 1.0, "active_prefill_tokens_threshold": 1_000_000},
        )
        specs = [(f"completions#{i}", "/v1/completions", self.completion_body(20, 400 + i, 40), True) for i in range(8)]
        specs.append(("chat", "/v1/chat/completions", self.chat_body(20, 450, 40), True))
        specs.append(("completions_stream", "/v1/completions", self.completion_body(20, 451, 40, True), True))
        def settle():
            time.sleep(0.5)
            self.keep_metric_lines("worker3_during_worker_gate", self.scrape(self.ports["w3_system"]))

        self.burst("worker-gate", specs, settle)
        self.metrics_full["worker3"] = self.scrape(self.ports["w3_system"])
        self.metrics_full["frontend_after_worker_gate"] = self.scrape(self.ports["http"])
        self.keep_metric_lines("frontend_after_worker_gate", self.metrics_full["frontend_after_worker_gate"])
        self.keep_metric_lines("worker3_after_worker_gate", self.metrics_full["worker3"])
        self.discovery_notes["files_with_worker3"] = self.copy_discovery(self.out / "discovery" / "kv-worker3")

    # ------------------------------------------------------------- output
