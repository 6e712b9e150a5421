"""Real HTTP: uvicorn on a free loopback port, driven by httpx."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from typing import Any, Dict, List

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

import loadgate
from loadgate import AdmissionGate, Monitor
from loadgate.asgi import (
    PRIORITY_HEADER,
    AdmissionMiddleware,
    ControlApp,
    LoadgateMiddleware,
    Receive,
    Scope,
    Send,
    hold_permit,
)

from conftest import serve

NULLS = {
    "active_decode_blocks_threshold": None,
    "active_prefill_tokens_threshold": None,
    "active_prefill_tokens_threshold_frac": None,
    "waiting_requests_threshold": None,
}


async def json_response(send: Send, status: int, payload: Any) -> None:
    body = json.dumps(payload).encode()
    await send({"type": "http.response.start", "status": status, "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": body})


def frontend_routes(monitor: Monitor) -> Any:
    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        assert scope["type"] == "http"
        if scope["method"] == "POST" and scope["path"] in ("/v1/completions", "/v1/chat/completions", "/v1/messages"):
            body = b""
            while True:
                message = await receive()
                body += message.get("body", b"")
                if not message.get("more_body"):
                    break
            model = json.loads(body)["model"]
            worker = monitor.select(model)  # raises Overloaded / Unavailable
            await json_response(send, 200, {"worker": worker})
        else:
            await json_response(send, 404, {"error": "not found"})

    return app


def style_by_path(scope: Scope) -> str:
    path = scope["path"]
    return "openai" if path.startswith("/v1/chat/") else "anthropic" if path == "/v1/messages" else "dynamo"


@pytest.fixture
def frontend() -> Any:
    monitor = Monitor()
    monitor.add_worker("llama", 1, kv_total_blocks=100)
    monitor.add_worker("llama", 2, kv_total_blocks=100)
    gate = AdmissionGate(2, 1)
    app = LoadgateMiddleware(ControlApp(monitor, gate, app=frontend_routes(monitor)), style=style_by_path)
    with serve(app) as url, httpx.Client(base_url=url, timeout=10) as client:
        yield monitor, gate, client


def test_routes_while_workers_are_free(frontend: Any) -> None:
    monitor, _, client = frontend
    workers = {client.post("/v1/completions", json={"model": "llama"}).json()["worker"] for _ in range(4)}
    assert workers == {1, 2}


def test_529_with_body_and_headers_when_all_workers_are_busy(frontend: Any) -> None:
    monitor, _, client = frontend
    monitor.set_thresholds("llama", active_decode_blocks_threshold=0.9)
    monitor.report(1, kv_used_blocks=95)
    assert client.post("/v1/completions", json={"model": "llama"}).json() == {"worker": 2}
    monitor.report(2, kv_used_blocks=91)
    r = client.post("/v1/completions", json={"model": "llama"})
    assert r.status_code == 529
    assert r.content == b'{"message":"Service temporarily overloaded","type":"Overloaded","code":529}'
    assert r.headers["retry-after"] == "1"
    assert r.headers["x-loadgate-reason"] == "all_workers_busy"
    assert r.headers["content-type"] == "application/json"
    r = client.post("/v1/chat/completions", json={"model": "llama"})
    assert r.status_code == 529
    assert r.json()["error"] == {
        "message": "All workers are busy, please retry later",
        "type": "overloaded_error",
        "param": None,
        "code": "all_workers_busy",
    }
    r = client.post("/v1/messages", json={"model": "llama"})
    assert r.status_code == 529
    assert r.json() == {"type": "error", "error": {"type": "overloaded_error", "message": "All workers are busy, please retry later"}}
    # Workers free again: routed again.
    monitor.report(2, kv_used_blocks=10)
    assert client.post("/v1/completions", json={"model": "llama"}).status_code == 200


def test_503_when_no_workers(frontend: Any) -> None:
    monitor, _, client = frontend
    r = client.post("/v1/completions", json={"model": "unknown-model"})
    assert r.status_code == 503
    assert r.content == b'{"message":"Service temporarily unavailable","type":"Service Unavailable","code":503}'
    assert r.headers["retry-after"] == "1"
    assert r.headers["x-loadgate-reason"] == "no_workers"
    monitor.remove_worker(1)
    monitor.remove_worker(2)
    r = client.post("/v1/chat/completions", json={"model": "llama"})
    assert r.status_code == 503
    assert r.json()["error"]["type"] == "service_unavailable"


def test_busy_threshold_status_table(frontend: Any) -> None:
    monitor, _, client = frontend
    post = lambda payload, **kw: client.post("/busy_threshold", content=payload, **kw)  # noqa: E731
    as_json = {"headers": {"content-type": "application/json"}}

    # GET: every model.
    r = client.get("/busy_threshold")
    assert r.status_code == 200
    assert r.json() == {"thresholds": [{"model": "llama", **NULLS, "version": 0}]}
    # POST without thresholds: a read (unknown model: all null, version 0).
    r = post(json.dumps({"model": "nope"}), **as_json)
    assert (r.status_code, r.json()) == (200, {"model": "nope", **NULLS, "version": 0})
    # POST set: 200 echoing all four fields and the version.
    r = post(json.dumps({"model": "llama", "active_decode_blocks_threshold": 0.85}), **as_json)
    assert (r.status_code, r.json()) == (200, {"model": "llama", **NULLS, "active_decode_blocks_threshold": 0.85, "version": 1})
    assert monitor.thresholds("llama")["active_decode_blocks_threshold"] == 0.85
    r = post(json.dumps({"model": "llama", "clear": ["active_decode_blocks_threshold"]}), **as_json)
    assert (r.status_code, r.json()["active_decode_blocks_threshold"], r.json()["version"]) == (200, None, 2)
    r = post(json.dumps({"model": "llama", "active_prefill_tokens_threshold": 5}), headers={"content-type": "application/json; charset=utf-8"})
    assert r.status_code == 200
    text = "text/plain; charset=utf-8"
    table = [
        (json.dumps({"model": "nope", "active_decode_blocks_threshold": 0.5}), "application/json", 404, "application/json"),
        (json.dumps({"model": "llama", "active_decode_blocks_threshold": 1.5}), "application/json", 400, "application/json"),
        (json.dumps({"model": "llama", "active_prefill_tokens_threshold": -1}), "application/json", 422, "application/json"),
        (json.dumps({"model": "llama", "clear": ["nope"]}), "application/json", 400, "application/json"),
        ("{not json", "application/json", 400, text),
        (json.dumps({"model": "llama", "active_decode_blocks_threshold": "high"}), "application/json", 422, "application/json"),
        (json.dumps({"active_decode_blocks_threshold": 0.5}), "application/json", 422, "application/json"),
        (json.dumps(["llama"]), "application/json", 422, "application/json"),
        (json.dumps({"model": "llama", "clear": "active_decode_blocks_threshold"}), "application/json", 422, "application/json"),
        (json.dumps({"model": "llama"}), "text/plain", 415, text),
        ("x" * (2 * 1024 * 1024 + 1), "application/json", 413, text),
    ]
    for payload, content_type, status, answered_as in table:
        r = post(payload, headers={"content-type": content_type})
        assert r.status_code == status, (payload[:60], content_type, r.text)
        assert r.headers["content-type"] == answered_as
        message = r.json()["error"] if answered_as == "application/json" else r.text
        assert isinstance(message, str) and message
    assert post("{not json", **as_json).text.startswith("Failed to parse the request body as JSON: ")
    r = client.post("/busy_threshold", content=json.dumps({"model": "llama"}))  # no content type
    assert (r.status_code, r.text) == (415, "Expected request with `Content-Type: application/json`")
    r = client.put("/busy_threshold", json={"model": "llama"})
    assert (r.status_code, r.headers["allow"], r.content) == (405, "POST,GET,HEAD", b"")
    assert "content-type" not in r.headers
    assert monitor.thresholds("llama")["version"] == 3  # refused updates changed nothing
    r = client.head("/busy_threshold")
    assert r.status_code == 200 and r.content == b""


def test_busy_threshold_sets_the_waiting_requests_threshold(frontend: Any) -> None:
    monitor, _, client = frontend
    for worker in (1, 2):
        monitor.report(worker, waiting_requests=5)
    r = client.post("/busy_threshold", json={"model": "llama", "waiting_requests_threshold": 4})
    assert (r.status_code, r.json()) == (200, {"model": "llama", **NULLS, "waiting_requests_threshold": 4, "version": 1})
    r = client.post("/v1/completions", json={"model": "llama"})
    assert r.status_code == 529  # every rank over the line: all workers busy
    assert client.get("/busy_threshold").json()["thresholds"][0]["waiting_requests_threshold"] == 4
    for body, status in (
        ({"model": "llama", "waiting_requests_threshold": -1}, 422),
        ({"model": "llama", "waiting_requests_threshold": 1.5}, 422),
    ):
        assert client.post("/busy_threshold", json=body).status_code == status
    r = client.post("/busy_threshold", json={"model": "llama", "clear": ["waiting_requests_threshold"]})
    assert (r.status_code, r.json()["waiting_requests_threshold"], r.json()["version"]) == (200, None, 2)
    assert client.post("/v1/completions", json={"model": "llama"}).status_code == 200


def test_metrics_scrape(frontend: Any) -> None:
    monitor, gate, client = frontend
    monitor.set_thresholds("llama", active_decode_blocks_threshold=0.5)
    monitor.report(1, kv_used_blocks=60, active_prefill_tokens=7)
    monitor.report(2, kv_used_blocks=60)
    assert client.post("/v1/completions", json={"model": "llama"}).status_code == 529
    held = gate.try_admit()
    r = client.get("/metrics")
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/plain; version=0.0.4")
    text = r.text
    assert 'dynamo_frontend_model_rejection_total{model="llama",endpoint="generate"} 1' in text
    assert 'dynamo_frontend_worker_active_prefill_tokens{dp_rank="0",worker_id="1",worker_type="decode"} 7' in text
    assert 'dynamo_frontend_model_busy_workers{model="llama"} 2' in text
    assert "dynamo_engine_request 1" in text
    assert "dynamo_request_queue 0" in text
    assert "dynamo_rejection_request_total 0" in text
    families = {f.name for f in text_string_to_metric_families(text)}  # valid exposition format
    assert {"dynamo_frontend_model_rejection", "dynamo_engine_request", "dynamo_request_queue_wait_seconds"} <= families
    assert client.post("/metrics").status_code == 405
    assert client.head("/metrics").content == b""
    assert held is not None
    held.release()


def streaming_app(gate: AdmissionGate, proceed: threading.Event, chunks: int = 3) -> Any:
    """`/stream`: admitted by AdmissionMiddleware, streams `chunks` chunks,
    pausing after the first until `proceed` is set.
    `/self`: admits itself and streams with `hold_permit`."""

    async def body() -> Any:
        for i in range(chunks):
            yield f"chunk {i}\n".encode()
            while i == 0 and not proceed.is_set():
                await asyncio.sleep(0.005)

    async def stream(send: Send, chunks_iter: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
        async for chunk in chunks_iter:
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b""})

    async def inner(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["path"] == "/self":
            permit = await gate.admit()  # a LoadgateError here becomes 529/503
            await stream(send, hold_permit(permit, body()))
        else:
            await stream(send, body())

    guarded = AdmissionMiddleware(inner, gate, paths=["/stream"])
    return LoadgateMiddleware(guarded)


@pytest.mark.parametrize("path", ["/stream", "/self"])
def test_streamed_response_holds_its_permit_to_the_end(path: str) -> None:
    gate = AdmissionGate(1, 0)
    proceed = threading.Event()
    with serve(streaming_app(gate, proceed)) as url, httpx.Client(base_url=url, timeout=10) as client:
        with client.stream("GET", path) as r:
            assert r.status_code == 200
            chunks = r.iter_bytes()
            assert next(chunks).startswith(b"chunk 0")
            assert gate.running == 1  # held while the body streams
            other = client.get(path)  # the only slot is taken, no queue
            assert other.status_code == 529
            assert other.headers["x-loadgate-reason"] == "worker_at_capacity"
            assert other.json()["message"] == "Service temporarily overloaded"
            assert gate.running == 1
            proceed.set()
            rest = b"".join(chunks)
        assert rest.count(b"chunk") == 2
        deadline = time.monotonic() + 30  # a limit for a hang only
        while gate.running and time.monotonic() < deadline:
            time.sleep(0.005)
        assert gate.running == 0  # released once the last chunk went out
        assert client.get(path).status_code == 200


def test_middleware_marks_the_first_response_at_the_first_body_chunk() -> None:
    gate = AdmissionGate(2, 0, wait_limit=1)
    proceed = threading.Event()
    with serve(streaming_app(gate, proceed)) as url, httpx.Client(base_url=url, timeout=10) as client:
        with client.stream("GET", "/stream") as r:
            chunks = r.iter_bytes()
            assert next(chunks).startswith(b"chunk 0")
            # The body has started: the wait slot is free, the slot held.
            assert (gate.running, gate.waiting) == (1, 0)
            proceed.set()
            assert b"".join(chunks).count(b"chunk") == 2
        deadline = time.monotonic() + 30  # a limit for a hang only
        while gate.running and time.monotonic() < deadline:
            time.sleep(0.005)
        assert (gate.running, gate.waiting) == (0, 0)


def test_client_leaving_mid_stream_releases_the_permit() -> None:
    gate = AdmissionGate(1, 0)
    proceed = threading.Event()
    with serve(streaming_app(gate, proceed, chunks=50)) as url, httpx.Client(base_url=url, timeout=10) as client:
        with client.stream("GET", "/stream") as r:
            next(r.iter_bytes())
            assert gate.running == 1
        proceed.set()  # the app streams on to a closed connection and ends
        deadline = time.monotonic() + 30  # a limit for a hang only
        while gate.running and time.monotonic() < deadline:
            time.sleep(0.005)
        assert gate.running == 0


def test_gate_rejections_over_http() -> None:
    gate = AdmissionGate(1, 1, queue_timeout=0.05)
    proceed = threading.Event()
    with serve(streaming_app(gate, proceed)) as url, httpx.Client(base_url=url, timeout=10) as client:
        with client.stream("GET", "/stream") as r:
            chunks = r.iter_bytes()
            next(chunks)
            slow = client.get("/stream")  # queued, then expired by the deadline
            assert slow.status_code == 529
            assert slow.headers["x-loadgate-reason"] == "queue_timeout"
            proceed.set()
            b"".join(chunks)
        gate.close()
        closed = client.get("/stream")
        assert closed.status_code == 503
        assert closed.headers["x-loadgate-reason"] == "closed"
        assert client.get("/self").status_code == 503  # raised by the app, answered by the middleware
        assert gate.stats()["expired"] == 1


def test_control_app_alone_and_lifespan() -> None:
    monitor = Monitor()
    monitor.add_worker("m", 1)
    control = ControlApp(monitor)
    with serve(control) as url, httpx.Client(base_url=url) as client:
        assert client.get("/nowhere").status_code == 404
        assert client.get("/busy_threshold").json()["thresholds"][0]["model"] == "m"
        assert "dynamo_frontend_model_workers" in client.get("/metrics").text

    async def lifespan() -> List[str]:
        sent: List[str] = []
        incoming = iter([{"type": "lifespan.startup"}, {"type": "lifespan.shutdown"}])

        async def receive() -> Dict[str, Any]:
            return next(incoming)

        async def send(message: Any) -> None:
            sent.append(message["type"])

        await control({"type": "lifespan"}, receive, send)
        return sent

    assert asyncio.run(lifespan()) == ["lifespan.startup.complete", "lifespan.shutdown.complete"]
    with pytest.raises(TypeError, match="monitor"):
        ControlApp("monitor")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="gate"):
        ControlApp(monitor, ["gate"])  # type: ignore[list-item]
    with pytest.raises(ValueError, match="style"):
        LoadgateMiddleware(control, style="xml")
    with pytest.raises(TypeError, match="paths"):
        AdmissionMiddleware(control, AdmissionGate(1), paths="/x")


def test_middleware_leaves_other_errors_and_started_responses_alone() -> None:
    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["path"] == "/boom":
            raise RuntimeError("not a rejection")
        await send({"type": "http.response.start", "status": 200, "headers": []})
        raise loadgate.Overloaded()  # too late to answer 529

    async def call(path: str) -> List[Any]:
        sent: List[Any] = []

        async def receive() -> Dict[str, Any]:
            return {"type": "http.request", "body": b""}

        async def send(message: Any) -> None:
            sent.append(message)

        await LoadgateMiddleware(app)({"type": "http", "path": path, "method": "GET"}, receive, send)
        return sent

    with pytest.raises(RuntimeError):
        asyncio.run(call("/boom"))
    with pytest.raises(loadgate.Overloaded):
        asyncio.run(call("/late"))


TOKEN = "s3cret-token"


@pytest.fixture
def guarded() -> Any:
    monitor = Monitor()
    monitor.add_worker("llama", 1, kv_total_blocks=100)
    with serve(ControlApp(monitor, token=TOKEN)) as url, httpx.Client(base_url=url, timeout=10) as client:
        yield monitor, client


def assert_unauthorized(r: httpx.Response, word: str) -> None:
    assert r.status_code == 401, r.text
    assert r.headers["www-authenticate"] == "Bearer"
    assert r.headers["content-type"] == "application/json"
    error = r.json()["error"]
    assert error.startswith(f"{word} bearer token"), error
    assert TOKEN not in error


def test_control_app_with_a_token_refuses_writes_without_it(guarded: Any) -> None:
    monitor, client = guarded
    write = {"model": "llama", "active_decode_blocks_threshold": 0.5}
    clear = {"model": "llama", "clear": ["active_decode_blocks_threshold"]}
    for headers, word in [
        ({}, "missing"),
        ({"authorization": "Basic czNjcmV0"}, "missing"),
        ({"authorization": "Bearer"}, "missing"),
        ({"authorization": "Bearer wrong"}, "invalid"),
        ({"authorization": f"Bearer {TOKEN.upper()}"}, "invalid"),
    ]:
        for payload in (write, clear):
            assert_unauthorized(client.post("/busy_threshold", json=payload, headers=headers), word)
    assert monitor.thresholds("llama")["version"] == 0  # nothing changed

    # Reads stay open.
    r = client.get("/busy_threshold")
    assert r.status_code == 200 and "www-authenticate" not in r.headers
    assert client.post("/busy_threshold", json={"model": "llama"}).status_code == 200

    # The right token, scheme in any case: applied.
    r = client.post("/busy_threshold", json=write, headers={"authorization": f"bearer {TOKEN}"})
    assert (r.status_code, r.json()["version"]) == (200, 1)
    assert monitor.thresholds("llama")["active_decode_blocks_threshold"] == 0.5
    r = client.post("/busy_threshold", json=clear, headers={"authorization": f"Bearer {TOKEN}"})
    assert (r.status_code, r.json()["active_decode_blocks_threshold"]) == (200, None)
    assert client.get("/metrics").status_code == 200


def test_control_app_protecting_reads() -> None:
    monitor = Monitor()
    monitor.add_worker("llama", 1)
    app = ControlApp(monitor, token=TOKEN, protect_reads=True)
    with serve(app) as url, httpx.Client(base_url=url, timeout=10) as client:
        assert_unauthorized(client.get("/busy_threshold"), "missing")
        assert_unauthorized(client.post("/busy_threshold", json={"model": "llama"}), "missing")
        assert_unauthorized(client.get("/busy_threshold", headers={"authorization": "Bearer nope"}), "invalid")
        r = client.head("/busy_threshold")
        assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer" and r.content == b""
        r = client.get("/busy_threshold", headers={"authorization": f"Bearer {TOKEN}"})
        assert r.status_code == 200 and r.json()["thresholds"][0]["model"] == "llama"


def test_control_auth_configuration() -> None:
    monitor = Monitor()
    with pytest.raises(ValueError, match="empty"):
        ControlApp(monitor, token="")
    with pytest.raises(ValueError, match="visible ASCII"):
        ControlApp(monitor, token="two words")
    with pytest.raises(ValueError, match="protect_reads needs a token"):
        ControlApp(monitor, protect_reads=True)
    with pytest.raises(TypeError):
        loadgate.ControlAuth(b"bytes")  # type: ignore[arg-type]
    auth = loadgate.ControlAuth(TOKEN, protect_reads=True)
    assert auth.protect_reads and loadgate.ControlAuth.CHALLENGE == "Bearer"
    assert TOKEN not in repr(auth)

    # The method the app calls, directly.
    monitor.add_worker("llama", 1)
    write = json.dumps({"model": "llama", "active_decode_blocks_threshold": 0.5}).encode()
    status, headers, body = monitor.handle_busy_threshold("POST", "application/json", write, auth=auth)
    assert status == 401 and json.loads(body)["error"].startswith("missing bearer token")
    assert headers == [("content-type", "application/json"), ("www-authenticate", "Bearer")]
    status, headers, _ = monitor.handle_busy_threshold(
        "POST", "application/json", write, authorization=f"Bearer {TOKEN}", auth=auth
    )
    assert (status, headers) == (200, [("content-type", "application/json")])
    status, _, _ = monitor.handle_busy_threshold("POST", "application/json", write)
    assert status == 200  # no auth: as before
    with pytest.raises(TypeError):
        monitor.handle_busy_threshold("GET", None, b"", auth="token")  # type: ignore[arg-type]


# ----- priority classes ------------------------------------------------------


def held_app(proceed: threading.Event) -> Any:
    """`/hold` answers once `proceed` is set; anything else at once."""

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        while scope["path"] == "/hold" and not proceed.is_set():
            await asyncio.sleep(0.005)
        await json_response(send, 200, {"path": scope["path"]})

    return app


class Requests:
    """GET requests sent from threads (one client each), answers kept."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.threads: List[threading.Thread] = []
        self.responses: Dict[int, httpx.Response] = {}

    def start(self, path: str, headers: Dict[str, str]) -> int:
        i = len(self.threads)

        def get() -> None:
            with httpx.Client(base_url=self.url, timeout=20) as client:
                self.responses[i] = client.get(path, headers=headers)

        t = threading.Thread(target=get)
        self.threads.append(t)
        t.start()
        return i

    def wait(self, i: int) -> httpx.Response:
        self.threads[i].join(30)
        return self.responses[i]


def wait_until(check: Any) -> None:
    deadline = time.monotonic() + 30  # a limit for a hang only
    while not check() and time.monotonic() < deadline:
        time.sleep(0.002)
    assert check()


H = PRIORITY_HEADER


@pytest.mark.parametrize(
    "options,cases",
    [
        (
            {"priorities": {"interactive": 0, "batch": 2}},
            [
                ({}, 0),  # absent: default_priority, 0
                ({H: "1"}, 1),
                ({H: "2"}, 2),
                ({H: "0001"}, 1),
                ({H: "interactive"}, 0),
                ({H: "batch"}, 2),
                ({H: "7"}, 2),  # past the last class: the last
                ({H: "bogus"}, 2),  # unknown: the least important class
                ({H: "-1"}, 2),
                ({H: "1.5"}, 2),
                ({H: ""}, 2),
            ],
        ),
        (
            {"priority_header": "X-Tier", "priorities": {"gold": 0}, "default_priority": 1, "unknown_priority": 0},
            [
                ({}, 1),
                ({H: "2"}, 1),  # not the configured header: absent
                ({"x-tier": "gold"}, 0),
                ({"x-tier": "2"}, 2),
                ({"x-tier": "silver"}, 0),
            ],
        ),
        ({"priority_header": None, "default_priority": 2}, [({}, 2), ({H: "0"}, 2)]),
    ],
)
def test_middleware_takes_the_class_from_a_header(options: Dict[str, Any], cases: List[Any]) -> None:
    gate = AdmissionGate(1, 16, classes=3)
    proceed = threading.Event()
    app = AdmissionMiddleware(held_app(proceed), gate, **options)
    with serve(app) as url:
        requests = Requests(url)
        try:
            holder = requests.start("/hold", {})
            wait_until(lambda: gate.running == 1)
            expected = [0, 0, 0]
            for headers, cls in cases:
                expected[cls] += 1
                requests.start("/queued", headers)
                # Each request waits in the class its header names.
                wait_until(lambda: [c["queued"] for c in gate.stats()["classes"]] == expected)
        finally:
            proceed.set()
        assert requests.wait(holder).status_code == 200
        for i in range(1, len(requests.threads)):
            assert requests.wait(i).status_code == 200
    assert (gate.running, gate.queued) == (0, 0)


def test_middleware_answers_a_displaced_request_529() -> None:
    gate = AdmissionGate(1, 1, classes=2)
    proceed = threading.Event()
    app = LoadgateMiddleware(AdmissionMiddleware(held_app(proceed), gate, priorities={"batch": 1}, style="openai"))
    with serve(app) as url:
        requests = Requests(url)
        try:
            holder = requests.start("/hold", {H: "0"})
            wait_until(lambda: gate.running == 1)
            batch = requests.start("/queued", {H: "batch"})
            wait_until(lambda: gate.queued == 1)
            urgent = requests.start("/queued", {H: "0"})  # the queue is full: displaces the batch request
            r = requests.wait(batch)
            assert r.status_code == 529
            assert r.headers["x-loadgate-reason"] == "displaced"
            assert r.headers["retry-after"] == "1"
            assert r.headers["content-type"] == "application/json"
            assert r.json()["error"] == {
                "message": loadgate.Displaced().message,
                "type": "overloaded_error",
                "param": None,
                "code": "displaced",
            }
        finally:
            proceed.set()
        assert requests.wait(holder).status_code == 200
        assert requests.wait(urgent).status_code == 200
    s = gate.stats()
    assert s["displaced"] == 1 and [c["displaced"] for c in s["classes"]] == [0, 1]


def test_middleware_priority_rules_and_options() -> None:
    gate = AdmissionGate(1, classes=4)
    mw = AdmissionMiddleware(held_app(threading.Event()), gate, priorities={" fast ": 1})
    assert (mw.priority_header, mw.default_priority, mw.unknown_priority) == (PRIORITY_HEADER, 0, 3)

    def scope(*values: bytes) -> Scope:
        return {"type": "http", "path": "/", "headers": [(b"x-loadgate-priority", v) for v in values]}

    assert mw.priority(scope()) == 0
    assert mw.priority(scope(b"fast")) == 1  # names are trimmed too
    assert mw.priority(scope(b"2", b"0")) == 2  # the first header counts
    assert mw.priority(scope(b" 2\t")) == 2
    assert mw.priority(scope(b"9" * 5000)) == 255  # past the last class, not parsed
    assert mw.priority(scope(b"\xb2")) == 3  # a superscript two is not a number
    assert mw.priority(scope(b"FAST")) == 3  # names compare exactly
    assert AdmissionMiddleware(mw.app, AdmissionGate(1)).unknown_priority == 0
    for kwargs, exc, match in [
        ({"priorities": {"a": 256}}, ValueError, r"priorities\['a'\] = 256 is invalid: must be an integer from 0 to 255"),
        ({"priorities": {"a": "0"}}, TypeError, r"priorities\['a'\] must be an int, not str"),
        ({"priorities": {1: 0}}, TypeError, "priorities keys must be str"),
        ({"default_priority": -1}, ValueError, "default_priority = -1"),
        ({"default_priority": True}, TypeError, "default_priority must be an int"),
        ({"unknown_priority": 300}, ValueError, "unknown_priority = 300"),
        ({"priority_header": " "}, ValueError, "priority_header must not be empty"),
        ({"priority_header": b"x"}, TypeError, "priority_header must be a str or None"),
    ]:
        with pytest.raises(exc, match=match):
            AdmissionMiddleware(mw.app, gate, **kwargs)
