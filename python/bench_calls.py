"""Per-call cost of the hot Python calls against a no-op PyO3 call.

Measures, in one run:

* ``_noop()``: a PyO3 function that does nothing and takes nothing;
* ``_noop_arg("llama")``: the same with one positional ``str`` argument, the
  call shape of ``select`` (the module is an abi3 build for CPython 3.10,
  whose limited API has the FASTCALL convention: arguments arrive as an
  array, not packed into a tuple; this baseline shows what one argument
  costs);
* ``Monitor.select("llama")``: round-robin over 8 free workers;
* ``AdmissionGate.try_admit()`` + ``Permit.release()``: one pair per
  iteration on a gate with free slots;

and prints each cost and the ratios the Python issue sets (select <= 1.5x a
no-op call, try_admit + release <= 3x).

Two ways to measure:

* time (default): cases are timed in interleaved rounds and each keeps its
  best round, so a busy machine inflates the spread more than the ratios;
* ``--instructions``: each case runs under ``valgrind --tool=callgrind`` and
  reports instructions per call (the loop's own cost subtracted) -- the same
  numbers on every run, whatever else the machine is doing.

Usage: ``python bench_calls.py [--instructions] [--json]``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import timeit
from importlib.machinery import EXTENSION_SUFFIXES
from typing import Dict, List, Optional

# This file sits next to the source package (python/loadgate); unless a
# development build put the native module there, import the installed one.
_HERE = os.path.dirname(os.path.abspath(__file__))
if not any(os.path.exists(os.path.join(_HERE, "loadgate", "_loadgate" + suffix)) for suffix in EXTENSION_SUFFIXES):
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]

import loadgate  # noqa: E402
from loadgate import _loadgate  # noqa: E402

CASES: Dict[str, str] = {
    "loop": "pass",
    "noop": "noop()",
    "noop_arg": "noop_arg('llama')",
    "select": "select('llama')",
    "try_admit_release": "try_admit().release()",
}


def namespace() -> Dict[str, object]:
    monitor = loadgate.Monitor()
    for worker in range(8):
        monitor.add_worker("llama", worker, kv_total_blocks=1000)
    monitor.set_thresholds("llama", active_decode_blocks_threshold=0.9)
    gate = loadgate.AdmissionGate(64, 16)
    return {
        "noop": _loadgate._noop,
        "noop_arg": _loadgate._noop_arg,
        "select": monitor.select,
        "try_admit": gate.try_admit,
    }


def timed(number: int, rounds: int) -> Dict[str, float]:
    """Best nanoseconds per call of every case, the loop's own cost subtracted."""
    ns = namespace()
    timers = {name: timeit.Timer(stmt, globals=ns) for name, stmt in CASES.items()}
    best = {name: float("inf") for name in CASES}
    for _ in range(rounds):
        for name, timer in timers.items():
            best[name] = min(best[name], timer.timeit(number) / number * 1e9)
    return {name: best[name] - best["loop"] for name in CASES if name != "loop"}


def instructions(number: int) -> Dict[str, float]:
    """Instructions per call of every case under callgrind, loop cost subtracted."""
    if shutil.which("valgrind") is None:
        raise SystemExit("--instructions needs valgrind (apt-get install valgrind)")
    totals: Dict[str, int] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in CASES:
            out = os.path.join(tmp, f"{name}.out")
            cmd = [
                "valgrind", "--tool=callgrind", f"--callgrind-out-file={out}",
                sys.executable, __file__, "--run-case", name, "--number", str(number),
            ]
            r = subprocess.run(cmd, capture_output=True, text=True, check=True)
            match = re.search(r"Collected : (\d+)", r.stderr)
            if match is None:
                raise SystemExit(f"no instruction count from callgrind:\n{r.stderr}")
            totals[name] = int(match.group(1))
    # Startup is the same in every run; the difference to the empty loop is
    # the cost of `number` calls.
    return {name: (totals[name] - totals["loop"]) / number for name in CASES if name != "loop"}


def run_case(name: str, number: int) -> None:
    ns = namespace()
    exec(compile(f"for _ in range({number}):\n    {CASES[name]}\n", "<bench>", "exec"), ns)


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--instructions", action="store_true", help="count instructions with callgrind")
    parser.add_argument("--number", type=int, default=0, help="calls per timed loop")
    parser.add_argument("--rounds", type=int, default=15, help="interleaved timing rounds")
    parser.add_argument("--json", action="store_true", help="print JSON only")
    parser.add_argument("--run-case", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.run_case:
        run_case(args.run_case, args.number)
        return 0
    if args.instructions:
        unit = "instr/call"
        cost = instructions(args.number or 100_000)
    else:
        unit = "ns/call"
        cost = timed(args.number or 100_000, args.rounds)
    result = {
        "unit": unit,
        **{f"{k}": round(v, 1) for k, v in cost.items()},
        "select_vs_noop": round(cost["select"] / cost["noop"], 2),
        "select_vs_noop_arg": round(cost["select"] / cost["noop_arg"], 2),
        "try_admit_release_vs_noop": round(cost["try_admit_release"] / cost["noop"], 2),
    }
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(f"loadgate {loadgate.__version__}, Python {sys.version.split()[0]}, {unit}")
    rows = [
        ("_noop()", cost["noop"], "1.00", "", ""),
        ("_noop_arg('llama')", cost["noop_arg"], f"{cost['noop_arg'] / cost['noop']:.2f}", "1.00", ""),
        ("Monitor.select('llama')", cost["select"], f"{result['select_vs_noop']:.2f}",
         f"{result['select_vs_noop_arg']:.2f}", "<= 1.5 x no-op"),
        ("try_admit() + release()", cost["try_admit_release"], f"{result['try_admit_release_vs_noop']:.2f}",
         "", "<= 3 x no-op"),
    ]
    print(f"{'call':<26}{unit:>12}{'x _noop()':>11}{'x _noop_arg':>13}  target")
    for name, value, r1, r2, target in rows:
        print(f"{name:<26}{value:>12.1f}{r1:>11}{r2:>13}  {target}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
