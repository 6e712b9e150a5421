"""Environment variables, each in a fresh interpreter (the overload status is
read once per process)."""

from __future__ import annotations

import json
from typing import Dict, Optional

import pytest

from conftest import run_python

OVERLOAD_PROBE = """
import json, loadgate
m = loadgate.Monitor()
m.add_worker("m", 1, kv_total_blocks=10)
m.set_thresholds("m", active_decode_blocks_threshold=0.5)
m.report(1, kv_used_blocks=9)
try:
    m.select("m")
except loadgate.Overloaded as e:
    routed = {"status": e.status_code, "code": e.body()["code"]}
try:
    m.select("none")
except loadgate.Unavailable as e:
    unavailable = e.status_code
print(json.dumps({"code": loadgate.overload_status_code(), "routed": routed,
                  "unavailable": unavailable, "at_capacity": loadgate.AtCapacity().status_code}))
"""


def probe(code: str, env: Dict[str, str]) -> Dict[str, object]:
    r = run_python(code, env)
    assert r.returncode == 0, r.stderr
    result: Dict[str, object] = json.loads(r.stdout)
    return result


@pytest.mark.parametrize(
    "value,code",
    [
        (None, 529),
        ("429", 429),
        (" 503 ", 503),
        ("999", 999),
        ("200", 200),
        ("", 529),
        ("abc", 529),
        ("199", 529),  # 1xx is never an answer
        ("1000", 529),
        ("-529", 529),
    ],
)
def test_overload_status_code(value: str, code: int) -> None:
    env = {} if value is None else {"DYN_HTTP_OVERLOAD_STATUS_CODE": value}
    out = probe(OVERLOAD_PROBE, env)
    assert out == {"code": code, "routed": {"status": code, "code": code}, "unavailable": 503, "at_capacity": code}


GATE_PROBE = """
import json, loadgate
try:
    g = loadgate.AdmissionGate.from_env(4)
    print(json.dumps({"limit": g.limit, "queue": g.queue_limit, "timeout": g.queue_timeout}))
except ValueError as e:
    print(json.dumps({"error": str(e)}))
"""


@pytest.mark.parametrize(
    "env,expected",
    [
        ({}, {"limit": 4, "queue": 16, "timeout": None}),
        ({"DYN_DYNAMO_REQUEST_QUEUE_LIMIT": "3"}, {"limit": 4, "queue": 3, "timeout": None}),
        ({"DYN_DYNAMO_REQUEST_QUEUE_LIMIT": " 0 "}, {"limit": 4, "queue": 0, "timeout": None}),
        ({"DYN_DYNAMO_REQUEST_QUEUE_TIMEOUT_MS": "250"}, {"limit": 4, "queue": 16, "timeout": 0.25}),
        (
            {"DYN_DYNAMO_REQUEST_QUEUE_LIMIT": "1", "DYN_DYNAMO_REQUEST_QUEUE_TIMEOUT_MS": "1500"},
            {"limit": 4, "queue": 1, "timeout": 1.5},
        ),
    ],
)
def test_gate_env(env: Dict[str, str], expected: Dict[str, object]) -> None:
    assert probe(GATE_PROBE, env) == expected


@pytest.mark.parametrize(
    "var,value",
    [
        ("DYN_DYNAMO_REQUEST_QUEUE_LIMIT", ""),
        ("DYN_DYNAMO_REQUEST_QUEUE_LIMIT", "-1"),
        ("DYN_DYNAMO_REQUEST_QUEUE_LIMIT", "lots"),
        ("DYN_DYNAMO_REQUEST_QUEUE_LIMIT", "2097152"),
        ("DYN_DYNAMO_REQUEST_QUEUE_TIMEOUT_MS", "0"),
        ("DYN_DYNAMO_REQUEST_QUEUE_TIMEOUT_MS", "1.5"),
        ("DYN_DYNAMO_REQUEST_QUEUE_TIMEOUT_MS", "soon"),
    ],
)
def test_gate_env_invalid(var: str, value: str) -> None:
    error = probe(GATE_PROBE, {var: value})["error"]
    assert isinstance(error, str) and var in error  # a clear error naming the variable


WAIT_PROBE = """
import json, loadgate
try:
    g = loadgate.AdmissionGate.from_env(4)
    print(json.dumps({"wait_limit": g.wait_limit}))
except ValueError as e:
    print(json.dumps({"error": str(e)}))
"""
WAIT_LIMIT = "DYN_BACKEND_ADMISSION_ENGINE_WAIT_LIMIT"


@pytest.mark.parametrize(
    "value,expected",
    [
        (None, {"wait_limit": None}),
        (" 3 ", {"wait_limit": 3}),
        ("0", None),
        ("", None),
        ("2097152", None),
        ("many", None),
    ],
)
def test_gate_wait_limit_env(value: Optional[str], expected: Optional[Dict[str, object]]) -> None:
    out = probe(WAIT_PROBE, {} if value is None else {WAIT_LIMIT: value})
    if expected is None:
        assert WAIT_LIMIT in out["error"]  # a clear error naming the variable
    else:
        assert out == expected


GATE_ALL_PROBE = """
import json, loadgate
try:
    g = loadgate.AdmissionGate.from_env()
    print(json.dumps({"limit": g.limit, "queue": g.queue_limit}))
except ValueError as e:
    print(json.dumps({"error": str(e)}))
"""

NEW_LIMIT, OLD_LIMIT = "DYN_BACKEND_ADMISSION_ENGINE_REQUEST_LIMIT", "DYN_ENGINE_REQUEST_LIMIT"
NEW_QUEUE, OLD_QUEUE = "DYN_BACKEND_ADMISSION_REQUEST_QUEUE_LIMIT", "DYN_DYNAMO_REQUEST_QUEUE_LIMIT"


@pytest.mark.parametrize(
    "env,expected",
    [
        ({NEW_LIMIT: "8"}, {"limit": 8, "queue": 16}),
        ({OLD_LIMIT: "3", OLD_QUEUE: "2"}, {"limit": 3, "queue": 2}),
        ({NEW_LIMIT: "8", OLD_LIMIT: "3", NEW_QUEUE: "0", OLD_QUEUE: "5"}, {"limit": 8, "queue": 0}),
    ],
)
def test_gate_env_newest_names_win(env: Dict[str, str], expected: Dict[str, object]) -> None:
    assert probe(GATE_ALL_PROBE, env) == expected


@pytest.mark.parametrize(
    "env,named",
    [
        ({}, NEW_LIMIT),
        ({NEW_LIMIT: "8", OLD_LIMIT: "zero"}, OLD_LIMIT),
        ({NEW_LIMIT: "0"}, NEW_LIMIT),
        ({NEW_LIMIT: "8", NEW_QUEUE: "-2", OLD_QUEUE: "4"}, NEW_QUEUE),
    ],
)
def test_gate_env_all_errors_name_the_variable(env: Dict[str, str], named: str) -> None:
    error = probe(GATE_ALL_PROBE, env)["error"]
    assert isinstance(error, str) and named in error


def test_env_changes_after_start_reach_from_env() -> None:
    code = """
import os, loadgate
os.environ["DYN_DYNAMO_REQUEST_QUEUE_LIMIT"] = "5"
print(loadgate.AdmissionGate.from_env(2).queue_limit)
"""
    r = run_python(code)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "5"


def test_import_starts_no_thread() -> None:
    code = """
import threading
before = threading.active_count()
import loadgate, loadgate.asgi
m = loadgate.Monitor(); g = loadgate.AdmissionGate(1)
print(threading.active_count() - before)
"""
    r = run_python(code)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "0"


CLASSES_PROBE = """
import json, loadgate
from loadgate import AdmissionGate, PriorityClass
def shape(g):
    return {"classes": g.classes, "queues": [c["queue_limit"] for c in g.stats()["classes"]]}
out = {"int": shape(AdmissionGate.from_env(2, classes=3))}
out["list"] = shape(AdmissionGate.from_env(2, classes=[PriorityClass(), PriorityClass(queue=1)]))
try:
    AdmissionGate.from_env(2, classes=[PriorityClass(queue=6)])
except ValueError as e:
    out["error"] = str(e)
print(json.dumps(out))
"""


def test_from_env_takes_classes_that_copy_the_environment_queue() -> None:
    out = probe(CLASSES_PROBE, {NEW_QUEUE: "5"})
    assert out == {
        "int": {"classes": 3, "queues": [5, 5, 5]},
        "list": {"classes": 2, "queues": [5, 1]},
        "error": "class 0: queue = 6 is out of range: must be at most 5",
    }
