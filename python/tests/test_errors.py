"""The exception classes: hierarchy, attributes, bodies and headers."""

from __future__ import annotations

import pickle

import pytest

import loadgate
from loadgate import (
    AtCapacity,
    Closed,
    LoadgateError,
    Overloaded,
    QueueTimeout,
    Unavailable,
    WorkerOverloaded,
)

OVERLOAD = [
    (Overloaded, "all_workers_busy", "All workers are busy, please retry later"),
    (WorkerOverloaded, "worker_overloaded", "Selected worker is overloaded, please retry later"),
    (AtCapacity, "worker_at_capacity", "Server overloaded: worker at capacity"),
    (
        QueueTimeout,
        "queue_timeout",
        "Server overloaded: request rejected after exceeding the backend admission queue delay",
    ),
]
UNAVAILABLE = [
    (Unavailable, "no_workers", "No workers available"),
    (Closed, "closed", "Service is shutting down: admission gate closed"),
]


def test_version_and_status() -> None:
    assert loadgate.__version__ == "0.4.0"
    assert loadgate.overload_status_code() == 529
    assert loadgate.REASON_HEADER == "x-loadgate-reason"
    # The public package exports every public constant of the native module.
    assert loadgate.MAX_BUSY_THRESHOLD_BODY == loadgate._loadgate.MAX_BUSY_THRESHOLD_BODY
    native = {n for n in dir(loadgate._loadgate) if not n.startswith("_")}
    assert native - set(loadgate.__all__) == set()


def test_hierarchy() -> None:
    for cls in (Overloaded, Unavailable, Closed):
        assert issubclass(cls, LoadgateError)
    for cls in (WorkerOverloaded, AtCapacity, QueueTimeout):
        assert issubclass(cls, Overloaded)
    assert issubclass(LoadgateError, Exception)
    assert not issubclass(Unavailable, Overloaded)
    assert not issubclass(Closed, Overloaded)


@pytest.mark.parametrize("cls,reason,message", OVERLOAD)
def test_overload_classes(cls: type[LoadgateError], reason: str, message: str) -> None:
    e = cls()
    assert (e.status_code, e.reason, e.retry_after) == (529, reason, 1.0)
    assert str(e) == message
    assert e.message == message
    # Dynamo 1.6.1's flat body: one text for every overload.
    assert e.body() == {"message": "Service temporarily overloaded", "type": "Overloaded", "code": 529}
    assert e.body("openai") == {
        "error": {"message": message, "type": "overloaded_error", "param": None, "code": reason}
    }
    assert e.body("anthropic") == {
        "type": "error",
        "error": {"type": "overloaded_error", "message": message},
    }
    assert e.headers() == {"retry-after": "1", "x-loadgate-reason": reason}


@pytest.mark.parametrize("cls,reason,message", UNAVAILABLE)
def test_unavailable_classes(cls: type[LoadgateError], reason: str, message: str) -> None:
    e = cls()
    assert (e.status_code, e.reason, e.retry_after) == (503, reason, 1.0)
    assert str(e) == message
    assert e.body() == {
        "message": "Service temporarily unavailable",
        "type": "Service Unavailable",
        "code": 503,
    }
    assert e.body("openai")["error"]["type"] == "service_unavailable"
    assert e.body("anthropic")["error"]["type"] == "api_error"
    assert e.headers()["x-loadgate-reason"] == reason


def test_custom_message_status_and_retry_after() -> None:
    e = Overloaded("busy now", status_code=429, retry_after=2.5)
    assert str(e) == "busy now"
    assert e.status_code == 429
    assert e.body()["code"] == 429
    assert e.headers()["retry-after"] == "3"  # whole seconds, rounded up
    assert Overloaded(retry_after=0).headers()["retry-after"] == "1"
    assert Overloaded(retry_after=None).headers()["retry-after"] == "1"
    e = LoadgateError("why", reason="no_workers")
    assert (e.reason, e.status_code) == ("no_workers", 503)
    assert "Overloaded" in repr(Overloaded()) and "all_workers_busy" in repr(Overloaded())


def test_bad_arguments() -> None:
    with pytest.raises(TypeError, match="reason"):
        LoadgateError("no reason")
    with pytest.raises(ValueError, match="reason"):
        LoadgateError(reason="nope")
    with pytest.raises(TypeError, match="reason"):
        LoadgateError(reason=5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="status_code"):
        Overloaded(status_code=42)
    with pytest.raises(TypeError, match="status_code"):
        Overloaded(status_code="529")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="retry_after"):
        Overloaded(retry_after=-1)
    with pytest.raises(ValueError, match="retry_after"):
        Overloaded(retry_after=float("nan"))
    with pytest.raises(TypeError, match="retry_after"):
        Overloaded(retry_after="1")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="style"):
        Overloaded().body("xml")
    with pytest.raises(TypeError, match="style"):
        Overloaded().body(1)  # type: ignore[arg-type]


def test_raise_catch_and_pickle() -> None:
    with pytest.raises(Overloaded) as info:
        raise AtCapacity()
    assert info.value.reason == "worker_at_capacity"
    copy = pickle.loads(pickle.dumps(QueueTimeout("late", retry_after=3)))
    assert isinstance(copy, QueueTimeout)
    assert (str(copy), copy.reason, copy.retry_after, copy.status_code) == ("late", "queue_timeout", 3.0, 529)
