"""Writing the fixtures: NATS messages and their summary, HTTP answers, metric
lines, discovery records, and how the run went."""

from __future__ import annotations

import base64
import collections
import datetime
import json
import os
import shutil
import statistics
import subprocess
import sys

from common import (
    BLOCKS,
    BLOCK_SIZE,
    CLOCK,
    DECODE_THRESHOLD,
    KEEP_PER_SUBJECT_PHASE,
    KEEP_PER_SUBJECT_PHASE_LARGE,
    MODEL,
    PREFILL_THRESHOLD,
    TIMELINE,
    W3_ENGINE_LIMIT,
    W3_MAX_BATCHED,
    relative,
)
from inspect_msgpack import (
    compact_json,
    load_score,
    mp_describe,
    mp_get,
    mp_plain,
    mp_schema,
    normalize_wire_type,
)

class Writer:
    """Writes the recording as fixtures under `--out` (mixed into `Recorder`)."""

    def write(self):
        out = self.out
        (out / "nats").mkdir(parents=True, exist_ok=True)
        (out / "http").mkdir(parents=True, exist_ok=True)
        (out / "metrics").mkdir(parents=True, exist_ok=True)
        msgs = self.nats.messages
        (out / "nats" / "summary.json").write_text(compact_json(self._nats_summary(msgs)))
        answers = self.http_records
        if self.args.lite:
            answers = {k: v for k, v in answers.items() if "overload" in k or "worker-gate" in k}
        (out / "http" / "answers.json").write_text(json.dumps(answers, indent=1) + "\n")
        (out / "http" / "loads.json").write_text(json.dumps(self.loads, indent=1) + "\n")
        (out / "metrics" / "selected-lines.json").write_text(json.dumps(self.metrics_lines, indent=1) + "\n")
        self.write_run()
        if self.args.lite:
            return

        # NATS: a capped sample of raw messages, and statistics over all of them.
        kept = []
        per = collections.Counter()
        first_of_publisher = set()
        for m in msgs:
            large = m["subject"].endswith(".kv-events")
            cap = KEEP_PER_SUBJECT_PHASE_LARGE if large else KEEP_PER_SUBJECT_PHASE
            key = (m["subject"], m["phase"])
            env = self._decode(m["payload"])
            pub = mp_get(env, "publisher_id") if env else None
            pub_key = (m["subject"], pub["value"] if pub else None)
            if per[key] < cap or pub_key not in first_of_publisher:
                per[key] += 1
                first_of_publisher.add(pub_key)
                kept.append(m)
        with open(out / "nats" / "messages.jsonl", "w") as f:
            for m in kept:
                rec = {
                    "t": m["t"],
                    "wall_ms": m["wall_ms"],
                    "phase": m["phase"],
                    "subject": m["subject"],
                    "reply": m["reply"],
                    "headers_b64": base64.b64encode(m["headers"]).decode() if m["headers"] else None,
                    "payload_b64": base64.b64encode(m["payload"]).decode(),
                }
                f.write(json.dumps(rec, separators=(",", ":")) + "\n")
        # One raw binary file per subject (its first message), for byte-level tests.
        raw_dir = out / "nats" / "raw"
        raw_dir.mkdir(exist_ok=True)
        firsts = {}
        for m in msgs:
            firsts.setdefault(m["subject"], m)
        examples = {}
        for subj, m in firsts.items():
            (raw_dir / f"{subj}.msgpack").write_bytes(m["payload"])
            env = self._decode(m["payload"])
            examples[subj] = {
                "phase": m["phase"],
                "size": len(m["payload"]),
                "decoded": mp_plain(env) if env else None,
            }
        # And, per subject, the message that shows the most load, taken under load.
        best = {}
        for m in msgs:
            if m["phase"] in ("idle", "startup", "idle-after-load"):
                continue
            env = self._decode(m["payload"])
            inner = mp_get(env, "payload") if env else None
            inner = self._decode(inner["value"]) if inner and inner["type"].startswith("bin") else None
            if inner is None:
                continue
            score = load_score(m["subject"], inner)
            if score > 0 and score > best.get(m["subject"], (0, None))[0]:
                best[m["subject"]] = (score, m, env)
        for subj, (score, m, env) in best.items():
            (raw_dir / f"{subj}.loaded.msgpack").write_bytes(m["payload"])
            examples[f"{subj} (most loaded)"] = {"phase": m["phase"], "size": len(m["payload"]), "decoded": mp_plain(env)}
        (out / "nats" / "decoded-examples.json").write_text(json.dumps(examples, indent=1) + "\n")

        # Metrics.
        for name, text in self.metrics_full.items():
            if name in ("frontend_after_load", "worker2", "worker3"):
                (out / "metrics" / f"{name}.prom").write_text(text)
        families = {}
        for name, text in self.metrics_full.items():
            if name not in ("frontend_after_load", "frontend_after_worker_gate", "worker2", "worker3"):
                continue
            fam = {}
            for ln in text.splitlines():
                if ln.startswith("# TYPE "):
                    _, _, n, t = ln.split(" ", 3)
                    fam[n] = {"type": t, "labels": set()}
                elif ln and not ln.startswith("#"):
                    n = ln.split("{", 1)[0].split(" ", 1)[0]
                    base = n
                    for suf in ("_bucket", "_sum", "_count"):
                        if n.endswith(suf) and n[: -len(suf)] in fam:
                            base = n[: -len(suf)]
                    if "{" in ln and base in fam:
                        inner = ln.split("{", 1)[1].rsplit("}", 1)[0]
                        for part in inner.split('",'):
                            if "=" in part:
                                fam[base]["labels"].add(part.split("=", 1)[0].strip(","))
            families[name] = {k: {"type": v["type"], "labels": sorted(v["labels"])} for k, v in sorted(fam.items())}
        (out / "metrics" / "families.json").write_text(compact_json(families))
        (out / "discovery" / "notes.json").write_text(json.dumps(self.discovery_notes, indent=1) + "\n")
        if self.args.keep_logs:
            shutil.copytree(self.logs, out / "logs", dirs_exist_ok=True)

    def write_run(self):
        run = {
            "recorded_at_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "command": ["record_fixtures.py", *(relative(a) for a in sys.argv[1:])],
            "versions": self.versions(),
            "ports": self.ports,
            "model_dir": self.model_info,
            "constants": {
                "model": MODEL,
                "num_gpu_blocks_override": BLOCKS,
                "block_size": BLOCK_SIZE,
                "active_decode_blocks_threshold": DECODE_THRESHOLD,
                "active_prefill_tokens_threshold": PREFILL_THRESHOLD,
                "router_mode": self.args.router_mode,
                "worker3_engine_request_limit": W3_ENGINE_LIMIT,
                "worker3_request_queue_limit": 0,
                "worker3_max_num_seqs": 1,
                "worker3_max_num_batched_tokens": W3_MAX_BATCHED,
                "jetstream": self.args.jetstream,
            },
            "nats_server_info": self.nats.info,
            "timeline": TIMELINE,
        }
        (self.out / "run.json").write_text(json.dumps(run, indent=1) + "\n")

    @staticmethod
    def _decode(payload):
        try:
            node, end = mp_describe(payload)
            return node if end == len(payload) else None
        except Exception:
            return None

    def _nats_summary(self, msgs):
        by_subject = collections.defaultdict(list)
        for m in msgs:
            by_subject[m["subject"]].append(m)
        phase_span = {}
        for ev in TIMELINE:
            if ev["event"].startswith("phase "):
                phase_span.setdefault(ev["phase"], [ev["t"], None])
        ordered = [e for e in TIMELINE if e["event"].startswith("phase ")]
        for a, b in zip(ordered, ordered[1:]):
            phase_span[a["phase"]][1] = b["t"]
        if ordered:
            phase_span[ordered[-1]["phase"]][1] = CLOCK.now()
        summary = {"phases_s": phase_span, "subjects": {}}
        for subj, ms in sorted(by_subject.items()):
            schemas = collections.Counter()
            schema_widths = collections.defaultdict(lambda: collections.defaultdict(set))
            per_phase = collections.Counter(m["phase"] for m in ms)
            streams = collections.defaultdict(list)  # (publisher, worker, rank) -> [(t, phase, seq)]
            nil_or_not = collections.defaultdict(collections.Counter)
            with_headers = sum(1 for m in ms if m["headers"])
            for m in ms:
                env = self._decode(m["payload"])
                if env is None:
                    schemas["<not msgpack>"] += 1
                    continue
                raw_schema = mp_schema(env)
                norm = {k: normalize_wire_type(t) for k, t in raw_schema.items()}
                norm_key = json.dumps(norm, sort_keys=False)
                schemas[norm_key] += 1
                for k, t in raw_schema.items():
                    schema_widths[norm_key][k].add(t)
                pub = mp_get(env, "publisher_id")
                seq = mp_get(env, "sequence")
                inner = None
                p = mp_get(env, "payload")
                if p is not None and p["type"].startswith("bin"):
                    inner = self._decode(p["value"])
                worker = mp_get(inner, "worker_id") if inner else None
                if worker is None and inner is not None:
                    worker = mp_get(inner, "worker", "worker_id")
                rank = mp_get(inner, "dp_rank") if inner else None
                if rank is None and inner is not None:
                    rank = mp_get(inner, "worker", "dp_rank")
                streams[
                    (
                        pub["value"] if pub else None,
                        str(worker["value"]) if worker else None,
                        rank["value"] if rank else None,
                    )
                ].append((m["t"], m["phase"], seq["value"] if seq else None))
                if inner is not None and inner["type"].endswith("map"):
                    for k, v in inner["value"]:
                        nil_or_not[k][v["type"]] += 1
                if inner is not None and subj.endswith("active_sequences_events"):
                    data = mp_get(inner, "data")
                    if data is not None:
                        kind = data["value"] if "str" in data["type"] else [k for k, _ in data["value"]][0]
                        nil_or_not["data kinds"][str(kind)] += 1
            stream_stats = []
            for (pub, worker, rank), pts in sorted(streams.items(), key=lambda kv: str(kv[0])):
                per = {}
                for ph in per_phase:
                    ts = [t for t, p, _ in pts if p == ph]
                    if not ts:
                        continue
                    span = phase_span.get(ph)
                    dur = (span[1] - span[0]) if span and span[1] else None
                    gaps = [round(b - a, 3) for a, b in zip(ts, ts[1:])]
                    per[ph] = {
                        "count": len(ts),
                        "per_second": round(len(ts) / dur, 3) if dur else None,
                        "median_gap_s": statistics.median(gaps) if gaps else None,
                        "max_gap_s": max(gaps) if gaps else None,
                    }
                seqs = [s for _, _, s in pts if s is not None]
                stream_stats.append(
                    {
                        "publisher_id": pub,
                        "worker_id": worker,
                        "dp_rank": rank,
                        "count": len(pts),
                        "sequence_first_last": [seqs[0], seqs[-1]] if seqs else None,
                        "sequence_strictly_increasing_by_1": all(b == a + 1 for a, b in zip(seqs, seqs[1:])),
                        "by_phase": per,
                    }
                )
            summary["subjects"][subj] = {
                "count": len(ms),
                "with_nats_headers": with_headers,
                "by_phase": dict(per_phase),
                "envelope_schemas": [
                    {
                        "count": c,
                        "schema": json.loads(sch) if sch.startswith("{") else sch,
                        "wire_types_seen": {
                            k: sorted(v) for k, v in schema_widths[sch].items() if len(v) > 1 or "int" in next(iter(v))
                        },
                    }
                    for sch, c in schemas.items()
                ],
                "payload_key_wire_types": {k: dict(v) for k, v in nil_or_not.items()},
                "streams": stream_stats,
            }
        return summary

    def versions(self):
        v = {}
        try:
            from importlib import metadata

            for dist in ("ai-dynamo", "ai-dynamo-runtime", "tokenizers", "pydantic", "uvloop"):
                try:
                    v[dist] = metadata.version(dist)
                except metadata.PackageNotFoundError:
                    v[dist] = None
        except Exception:
            pass
        try:
            v["nats-server"] = subprocess.run(["nats-server", "--version"], capture_output=True, text=True).stdout.strip()
        except OSError:
            v["nats-server"] = None
        v["python"] = sys.version.split()[0]
        v["platform"] = f"{os.uname().sysname} {os.uname().release} {os.uname().machine}"
        return v
