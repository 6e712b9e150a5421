"""The type stub matches the built module, and the package type-checks."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import loadgate

PACKAGE = Path(loadgate.__file__).resolve().parent


def test_py_typed_and_stub_ship_with_the_package() -> None:
    assert (PACKAGE / "py.typed").is_file()
    assert (PACKAGE / "_loadgate.pyi").is_file()


def test_stubtest() -> None:
    env = {**os.environ, "MYPYPATH": ""}
    r = subprocess.run(
        [sys.executable, "-m", "mypy.stubtest", "loadgate._loadgate"],
        capture_output=True, text=True, env=env, timeout=300,
    )
    assert r.returncode == 0, r.stdout + r.stderr


def test_package_type_checks_strictly() -> None:
    r = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-incremental", "-p", "loadgate"],
        capture_output=True, text=True, timeout=300,
    )
    assert r.returncode == 0, r.stdout + r.stderr
