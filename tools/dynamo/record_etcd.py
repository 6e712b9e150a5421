"""Records what a Dynamo 1.6.1 worker writes to etcd discovery.

Starts etcd (Debian's etcd-server) and nats-server on free loopback ports,
one mocker worker with ``--discovery-backend etcd`` and two data-parallel
ranks, waits for its model card, and writes every key under ``v1/`` with its
value and whether it is on a lease to ``discovery/etcd/records.json``; then
stops the worker gracefully and records which keys are left (none, on a
clean exit). Run by ``record_fixtures.sh`` with the fixtures' virtualenv:

    python tools/dynamo/record_etcd.py --out core/tests/fixtures/dynamo-1.6.1
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import BLOCK_SIZE, BLOCKS, HOST, MODEL, dynamo_env, free_port
from harness import Procs, make_model_dir


def etcd_get(endpoint: str) -> list[dict]:
    out = subprocess.run(
        ["etcdctl", "--endpoints", endpoint, "get", "--prefix", "v1/", "-w", "json"],
        capture_output=True,
        text=True,
        check=True,
        env={"ETCDCTL_API": "3", "PATH": os.environ["PATH"]},
    ).stdout
    records = []
    for kv in json.loads(out).get("kvs", []):
        records.append(
            {
                "key": base64.b64decode(kv["key"]).decode(),
                "value": base64.b64decode(kv.get("value", "")).decode(),
                "leased": bool(kv.get("lease")),
            }
        )
    return records


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True, type=Path)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="dynamo-etcd-"))
    (work / "home").mkdir()
    model = work / "model"
    make_model_dir(model)
    procs = Procs(work)
    client, peer, nats = free_port(), free_port(), free_port()
    endpoint = f"http://{HOST}:{client}"
    procs.start(
        "etcd",
        [
            "etcd", "--data-dir", str(work / "etcd"), "--name", "default",
            "--listen-client-urls", endpoint, "--advertise-client-urls", endpoint,
            "--listen-peer-urls", f"http://{HOST}:{peer}",
            "--initial-advertise-peer-urls", f"http://{HOST}:{peer}",
            "--initial-cluster", f"default=http://{HOST}:{peer}",
        ],
        dict(os.environ),
    )
    procs.start("nats", ["nats-server", "-a", HOST, "-p", str(nats)], dict(os.environ))
    time.sleep(1.5)
    env = dynamo_env(work / "home", nats, DYN_DISCOVERY_BACKEND="etcd", ETCD_ENDPOINTS=endpoint)
    argv = [
        sys.executable, "-m", "dynamo.mocker", "--model-path", str(model), "--model-name", MODEL,
        "--discovery-backend", "etcd", "--request-plane", "tcp", "--event-plane", "nats",
        "--num-gpu-blocks-override", str(BLOCKS), "--block-size", str(BLOCK_SIZE),
        "--data-parallel-size", "2",
    ]
    try:
        procs.start("worker", argv, env)
        deadline = time.monotonic() + 90
        while not any(r["key"].startswith("v1/mdc/") for r in etcd_get(endpoint)):
            if time.monotonic() > deadline:
                raise SystemExit("no model card in etcd after 90 s; see the logs in " + str(work))
            time.sleep(0.5)
        time.sleep(2.0)
        running = etcd_get(endpoint)
        procs.signal("worker", 15)
        procs.wait("worker")
        time.sleep(1.0)
        left = etcd_get(endpoint)
    finally:
        procs.stop_all()
    out = args.out / "discovery" / "etcd"
    out.mkdir(parents=True, exist_ok=True)
    record = {
        "how": "one dynamo.mocker worker, --discovery-backend etcd, --data-parallel-size 2, "
        f"--num-gpu-blocks-override {BLOCKS}; etcd-server 3.4 from Debian",
        "while_running": running,
        "after_sigterm": left,
    }
    (out / "records.json").write_text(json.dumps(record, indent=1) + "\n")
    print(f"{len(running)} keys while running, {len(left)} after SIGTERM -> {out}")


if __name__ == "__main__":
    main()
