"""The figures the lab's engine is checked against (benches/lab/src/calibrate.rs,
docs/overload.md "The engine against Dynamo's mocker"), from Dynamo 1.6.1's own
offline replay of its mocker.

Not part of any test: Dynamo is no dependency of loadgate. To re-run, in a scratch
virtual environment:

    pip install --no-deps ai-dynamo==1.6.1 ai-dynamo-runtime==1.6.1 typing_extensions
    python benches/lab/dynamo/replay.py

The workload: 2 workers with the mocker's default engine, 3000 requests of 1024
prompt and 256 output tokens, Poisson arrivals, round-robin routing, good when TTFT
<= 1 s and the mean inter-token gap <= 50 ms; arrival seeds 1 to 10.
"""

import json
import statistics
import sys

from dynamo.replay.api import run_synthetic_trace_replay

SEEDS = range(1, 11)
REQUESTS = 3000


def good(rate: float, seed: int) -> tuple:
    """Share of requests good at `rate`, and the median TTFT (ms)."""
    rep = run_synthetic_trace_replay(
        1024, 256, REQUESTS, num_workers=2, request_rate=rate, arrival_seed=seed,
        sla_ttft_ms=1000.0, sla_itl_ms=50.0,
    )
    s = dict(rep.summary)
    return s["goodput_completed_requests"] / REQUESTS, s["median_ttft_ms"]


def main() -> None:
    # C*: the highest rate on a 0.5 req/s grid at which every seed has >= 99 % good.
    capacity = 0.0
    rate = 38.0
    while rate <= 48.0:
        if all(good(rate, s)[0] >= 0.99 for s in SEEDS):
            capacity = rate
        rate += 0.5
    out = {"capacity": capacity, "seeds": list(SEEDS)}
    low = [good(2.0, s)[1] for s in SEEDS]
    out["p50_ttft_low_ms"] = statistics.mean(low)
    out["good_at"] = {}
    for x in (1.25, 2.0, 3.0):
        shares = [good(x * capacity, s)[0] for s in SEEDS]
        out["good_at"][x] = {"mean": statistics.mean(shares), "min": min(shares), "max": max(shares)}
    json.dump(out, sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main()
