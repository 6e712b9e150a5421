"""`python -m loadgate.demo` runs end to end."""

from __future__ import annotations

import subprocess
import sys


def test_demo_quick_run() -> None:
    r = subprocess.run(
        [sys.executable, "-m", "loadgate.demo", "--quick"], capture_output=True, text=True, timeout=50
    )
    assert r.returncode == 0, r.stdout + r.stderr
    out = r.stdout
    for phase in ("warm-up", "overload", "no threshold", "drained"):
        assert phase in out
    assert "checks:" in out and "FAILED" not in out
    assert "dynamo_frontend_model_rejection_total" in out


def test_demo_rejects_bad_arguments() -> None:
    r = subprocess.run(
        [sys.executable, "-m", "loadgate.demo", "--slots", "0"], capture_output=True, text=True, timeout=30
    )
    assert r.returncode == 2 and "--slots" in r.stderr
