"""loadgate in front of real FastAPI and Starlette apps under uvicorn, driven
by raw httpx and by the official openai and anthropic clients.

Every way of putting loadgate in front of such an app must answer a
rejection with its status (529 here, or 503), body, ``Retry-After`` and
``x-loadgate-reason``: LoadgateMiddleware wrapping the app from outside,
``app.add_middleware(...)``, and ``app.add_exception_handler(LoadgateError,
...)``."""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

import anthropic
import httpx
import openai
import pytest
from fastapi import FastAPI
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

import loadgate
from loadgate import AdmissionGate, LoadgateError, Monitor
from loadgate.asgi import (
    AdmissionMiddleware,
    ControlApp,
    EnvAdmissionMiddleware,
    LoadgateMiddleware,
    Receive,
    Scope,
    Send,
    exception_handler,
    loadgate_exception_handler,
    style_by_path,
)

from conftest import serve

BUSY = "All workers are busy, please retry later"
API_PATHS = ["/v1/chat/completions", "/v1/completions", "/v1/messages"]
ENV_NAMES = [
    "DYN_BACKEND_ADMISSION_ENGINE_REQUEST_LIMIT",
    "DYN_ENGINE_REQUEST_LIMIT",
    "DYN_BACKEND_ADMISSION_REQUEST_QUEUE_LIMIT",
    "DYN_DYNAMO_REQUEST_QUEUE_LIMIT",
    "DYN_DYNAMO_REQUEST_QUEUE_TIMEOUT_MS",
    "DYN_BACKEND_ADMISSION_ENGINE_WAIT_LIMIT",
]


def reply(path: str, model: str) -> Dict[str, Any]:
    """A minimal valid answer of the API `path` belongs to."""
    if path == "/v1/messages":
        return {
            "id": "msg_1",
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": [{"type": "text", "text": "hi"}],
            "stop_reason": "end_turn",
            "stop_sequence": None,
            "usage": {"input_tokens": 1, "output_tokens": 1},
        }
    usage = {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}
    if path == "/v1/completions":
        choice: Dict[str, Any] = {"index": 0, "text": "hi", "finish_reason": "stop", "logprobs": None}
        return {"id": "cmpl-1", "object": "text_completion", "created": 0, "model": model, "choices": [choice], "usage": usage}
    choice = {"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}
    return {"id": "chatcmpl-1", "object": "chat.completion", "created": 0, "model": model, "choices": [choice], "usage": usage}


class Backend:
    """The fake server: a monitor routing model "llama" to worker 1 (busy
    above 90% of its KV blocks) and the worker's gate, 1 slot and no
    queue. An API route picks the worker (``Overloaded`` when it is busy,
    ``Unavailable`` for an unknown model), then takes the gate's slot
    (``AtCapacity`` while a test holds it)."""

    def __init__(self) -> None:
        self.monitor = Monitor()
        self.monitor.add_worker("llama", 1, kv_total_blocks=100)
        self.monitor.set_thresholds("llama", active_decode_blocks_threshold=0.9)
        self.gate = AdmissionGate(1, 0)

    def busy(self, busy: bool = True) -> None:
        self.monitor.report(1, kv_used_blocks=95 if busy else 0)

    async def answer(self, request: Request) -> JSONResponse:
        model = (await request.json())["model"]
        self.monitor.select(model)  # raises Overloaded / Unavailable
        permit = await self.gate.admit()  # raises AtCapacity
        try:
            return JSONResponse(reply(request.url.path, model))
        finally:
            permit.release()


async def health(request: Request) -> JSONResponse:
    return JSONResponse({"ok": True})


def fastapi_app(backend: Backend) -> FastAPI:
    app = FastAPI()
    for path in API_PATHS:
        app.add_api_route(path, backend.answer, methods=["POST"])
    app.add_api_route("/health", health, methods=["GET"])
    return app


def starlette_app(backend: Backend) -> Starlette:
    routes = [Route(path, backend.answer, methods=["POST"]) for path in API_PATHS]
    return Starlette(routes=routes + [Route("/health", health, methods=["GET"])])


FRAMEWORKS: Dict[str, Callable[[Backend], Any]] = {"fastapi": fastapi_app, "starlette": starlette_app}
WAYS = ["outside", "add_middleware", "exception_handler"]


def wire(way: str, app: Any, backend: Backend) -> Any:
    """`app` with loadgate in front of it, `way`; each API answers in its own body style."""
    if way == "outside":
        return LoadgateMiddleware(ControlApp(backend.monitor, backend.gate, app=app), style=style_by_path)
    if way == "add_middleware":
        app.add_middleware(LoadgateMiddleware, style=style_by_path)
    else:
        app.add_exception_handler(LoadgateError, exception_handler(style_by_path))
    return app


class Recorder:
    """Outermost ASGI layer: the path and arrival time of every HTTP request,
    and a hook run after each one with its number (from 1)."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.seen: List[Tuple[str, float]] = []
        self.finished = 0
        self.after: Optional[Callable[[int], None]] = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            self.seen.append((scope["path"], time.monotonic()))
        try:
            await self.app(scope, receive, send)
        finally:
            if scope["type"] == "http":
                if self.after is not None:
                    self.after(len(self.seen))
                self.finished += 1

    def settle(self) -> None:
        """Wait until every request seen has run its hook: a client has its
        answer before the server's ``finally`` runs."""
        limit = time.monotonic() + 30
        while self.finished < len(self.seen):
            assert time.monotonic() < limit, "a request never finished"
            time.sleep(0.001)

    def times(self, path: str) -> List[float]:
        return [t for p, t in self.seen if p == path]


@contextlib.contextmanager
def served(app: Any) -> Iterator[Tuple[str, Recorder]]:
    """`app` behind a :class:`Recorder`, under uvicorn on a free loopback port."""
    recorder = Recorder(app)
    with serve(recorder) as url:
        yield url, recorder


def openai_client(url: str, max_retries: int) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="test-key", max_retries=max_retries, timeout=20)


def anthropic_client(url: str, max_retries: int) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=url, api_key="test-key", max_retries=max_retries, timeout=20)


MESSAGES: List[Any] = [{"role": "user", "content": "hello"}]


def ask_openai(client: openai.OpenAI) -> Any:
    return client.chat.completions.create(model="llama", messages=MESSAGES)


def ask_anthropic(client: anthropic.Anthropic) -> Any:
    return client.messages.create(model="llama", max_tokens=16, messages=MESSAGES)


def assert_rejection(r: httpx.Response, error: LoadgateError, style: str) -> None:
    """`r` answers `error` in `style`: its status, body and headers."""
    assert r.status_code == error.status_code, r.text
    assert r.headers["content-type"] == "application/json"
    assert r.json() == error.body(style)
    for name, value in error.headers().items():
        assert r.headers[name] == value


def assert_paced(times: List[float], count: int) -> None:
    """`count` requests, each retry sent at least Retry-After (1 s) after
    the previous request arrived (a lower bound only)."""
    assert len(times) == count
    for earlier, later in zip(times, times[1:]):
        assert later - earlier >= 0.99


OPENAI_BUSY = {"message": BUSY, "type": "overloaded_error", "param": None, "code": "all_workers_busy"}
ANTHROPIC_BUSY = {"type": "error", "error": {"type": "overloaded_error", "message": BUSY}}


# ----- raw HTTP: every way, both frameworks ------------------------------------


@pytest.mark.parametrize("framework", sorted(FRAMEWORKS))
@pytest.mark.parametrize("way", WAYS)
def test_every_way_answers_rejections_over_http(way: str, framework: str) -> None:
    backend = Backend()
    app = wire(way, FRAMEWORKS[framework](backend), backend)
    body = {"model": "llama"}
    with served(app) as (url, _), httpx.Client(base_url=url, timeout=10) as client:
        for path in API_PATHS:
            assert client.post(path, json=body).json() == reply(path, "llama")

        backend.busy()  # the only worker is busy: Overloaded from the route
        r = client.post("/v1/chat/completions", json=body)
        assert r.status_code == 529
        assert r.headers["retry-after"] == "1"
        assert r.headers["x-loadgate-reason"] == "all_workers_busy"
        assert r.headers["content-type"] == "application/json"
        assert r.json() == {"error": OPENAI_BUSY}
        r = client.post("/v1/messages", json=body)
        assert (r.status_code, r.json(), r.headers["x-loadgate-reason"]) == (529, ANTHROPIC_BUSY, "all_workers_busy")
        assert_rejection(client.post("/v1/completions", json=body), loadgate.Overloaded(), "openai")
        assert client.get("/health").json() == {"ok": True}

        for path in API_PATHS:  # an unknown model: 503
            r = client.post(path, json={"model": "unknown"})
            assert_rejection(r, loadgate.Unavailable(), style_by_path({"path": path}))
            assert (r.status_code, r.headers["x-loadgate-reason"]) == (503, "no_workers")

        backend.busy(False)
        held = backend.gate.try_admit()  # the gate's one slot taken: AtCapacity from the route
        assert held is not None
        try:
            for path in API_PATHS:
                r = client.post(path, json=body)
                assert_rejection(r, loadgate.AtCapacity(), style_by_path({"path": path}))
                assert (r.status_code, r.headers["x-loadgate-reason"]) == (529, "worker_at_capacity")
        finally:
            held.release()
        assert client.post("/v1/chat/completions", json=body).status_code == 200


@pytest.mark.parametrize("framework", sorted(FRAMEWORKS))
def test_ready_made_handler_answers_in_the_dynamo_style(framework: str) -> None:
    backend = Backend()
    backend.busy()
    app = FRAMEWORKS[framework](backend)
    app.add_exception_handler(LoadgateError, loadgate_exception_handler)
    with served(app) as (url, _), httpx.Client(base_url=url, timeout=10) as client:
        r = client.post("/v1/messages", json={"model": "llama"})
        assert r.status_code == 529
        assert r.json() == {"message": "Service temporarily overloaded", "type": "Overloaded", "code": 529}
        assert (r.headers["retry-after"], r.headers["x-loadgate-reason"]) == ("1", "all_workers_busy")
        assert r.headers["content-type"] == "application/json"


def test_handler_options() -> None:
    backend = Backend()
    backend.busy()
    app = fastapi_app(backend)
    app.add_exception_handler(LoadgateError, exception_handler("anthropic", retry_after=7))
    with served(app) as (url, _), httpx.Client(base_url=url, timeout=10) as client:
        r = client.post("/v1/chat/completions", json={"model": "llama"})
        assert (r.status_code, r.json(), r.headers["retry-after"]) == (529, ANTHROPIC_BUSY, "7")
    with pytest.raises(ValueError, match="style"):
        exception_handler("xml")


# ----- the official clients ----------------------------------------------------


@pytest.mark.parametrize("way", WAYS)
def test_openai_client_sees_529_and_retries_after_retry_after(way: str) -> None:
    backend = Backend()
    backend.busy()
    app = wire(way, fastapi_app(backend), backend)
    with served(app) as (url, recorder), openai_client(url, 1) as client:
        with pytest.raises(openai.APIStatusError) as caught:
            ask_openai(client)
        error = caught.value
        assert error.status_code == 529
        assert isinstance(error, openai.InternalServerError)
        assert error.body == OPENAI_BUSY
        assert (error.code, error.type) == ("all_workers_busy", "overloaded_error")
        assert error.response.headers["retry-after"] == "1"
        assert error.response.headers["x-loadgate-reason"] == "all_workers_busy"
        assert_paced(recorder.times("/v1/chat/completions"), 2)  # tried, then retried once

        with pytest.raises(openai.APIStatusError) as caught:
            client.with_options(max_retries=0).completions.create(model="llama", prompt="hello")
        assert (caught.value.status_code, caught.value.body) == (529, OPENAI_BUSY)
        assert len(recorder.times("/v1/completions")) == 1


@pytest.mark.parametrize("way", WAYS)
def test_anthropic_client_sees_its_overloaded_error(way: str) -> None:
    backend = Backend()
    backend.busy()
    app = wire(way, fastapi_app(backend), backend)
    with served(app) as (url, recorder), anthropic_client(url, 1) as client:
        with pytest.raises(anthropic.OverloadedError) as caught:
            ask_anthropic(client)
        error = caught.value  # (an InternalServerError too in recent releases)
        assert isinstance(error, anthropic.APIStatusError)
        assert error.status_code == 529
        assert error.body == ANTHROPIC_BUSY
        assert error.response.headers["x-loadgate-reason"] == "all_workers_busy"
        assert_paced(recorder.times("/v1/messages"), 2)


def test_clients_wait_retry_after_then_get_through() -> None:
    backend = Backend()
    app = wire("outside", fastapi_app(backend), backend)
    with served(app) as (url, recorder):
        backend.busy()
        recorder.after = lambda n: backend.busy(False)  # free once the first answer went out
        with openai_client(url, 2) as oa:
            completion = ask_openai(oa)
        assert completion.choices[0].message.content == "hi"
        assert_paced(recorder.times("/v1/chat/completions"), 2)
        recorder.settle()  # the last answer's hook must not see the next one

        held = backend.gate.try_admit()
        assert held is not None
        recorder.after = lambda n: held.release()
        with anthropic_client(url, 2) as an:
            message = ask_anthropic(an)
        assert message.content[0].text == "hi"
        assert_paced(recorder.times("/v1/messages"), 2)


def test_admission_middleware_added_to_a_fastapi_app() -> None:
    backend = Backend()
    gate = AdmissionGate(1, 0)
    app = fastapi_app(backend)
    app.add_middleware(AdmissionMiddleware, gate=gate, paths=["/v1/"], style=style_by_path)
    with served(app) as (url, recorder), httpx.Client(base_url=url, timeout=10) as http:
        held = gate.try_admit()
        assert held is not None
        try:
            for path in API_PATHS:
                assert_rejection(http.post(path, json={"model": "llama"}), loadgate.AtCapacity(), style_by_path({"path": path}))
            assert http.get("/health").status_code == 200  # not guarded
            with openai_client(url, 1) as oa, pytest.raises(openai.APIStatusError) as caught:
                ask_openai(oa)
            assert (caught.value.status_code, caught.value.code) == (529, "worker_at_capacity")
            assert_paced(recorder.times("/v1/chat/completions")[1:], 2)  # after the raw request
            with anthropic_client(url, 0) as an, pytest.raises(anthropic.OverloadedError) as caught_an:
                ask_anthropic(an)
            assert caught_an.value.body == loadgate.AtCapacity().body("anthropic")
        finally:
            held.release()
        with openai_client(url, 0) as oa:
            assert ask_openai(oa).choices[0].message.content == "hi"
    assert gate.running == 0


# ----- wrapping from outside: how it reaches the app ---------------------------


def test_outside_wrapping_registers_through_wrappers_and_keeps_the_apps_own_handler() -> None:
    app = FastAPI()
    LoadgateMiddleware(ControlApp(Monitor(), app=AdmissionMiddleware(app, AdmissionGate(1))), style="openai")
    assert LoadgateError in app.exception_handlers

    async def mine(request: Request, exc: Exception) -> Response:
        return JSONResponse({"mine": True}, status_code=529)

    backend = Backend()
    backend.busy()
    own = fastapi_app(backend)
    own.add_exception_handler(LoadgateError, mine)
    with served(LoadgateMiddleware(own)) as (url, _):
        assert own.exception_handlers[LoadgateError] is mine
        r = httpx.post(f"{url}/v1/completions", json={"model": "llama"})
        assert (r.status_code, r.json()) == (529, {"mine": True})


def test_outside_wrapping_answers_a_rejection_raised_by_the_apps_middleware() -> None:
    backend = Backend()
    backend.busy()
    app = fastapi_app(backend)

    @app.middleware("http")
    async def route_first(request: Request, call_next: Any) -> Any:
        if request.url.path.startswith("/v1/"):
            backend.monitor.select("llama")  # raises outside the routes: the app answers 500
        return await call_next(request)

    with served(LoadgateMiddleware(app, style=style_by_path)) as (url, recorder):
        r = httpx.post(f"{url}/v1/completions", json={"model": "llama"})
        assert_rejection(r, loadgate.Overloaded(), "openai")
        with anthropic_client(url, 0) as an, pytest.raises(anthropic.OverloadedError) as caught:
            ask_anthropic(an)
        assert caught.value.body == ANTHROPIC_BUSY
        assert httpx.get(f"{url}/health").status_code == 200


def test_outside_wrapping_an_app_that_already_served() -> None:
    backend = Backend()
    app = fastapi_app(backend)
    with served(app) as (url, _):
        assert httpx.get(f"{url}/health").status_code == 200
    assert app.middleware_stack is not None  # built: a handler added now would not count
    wrapped = LoadgateMiddleware(app, style=style_by_path)
    assert LoadgateError not in app.exception_handlers
    backend.busy()
    with served(wrapped) as (url, recorder):
        assert_rejection(httpx.post(f"{url}/v1/messages", json={"model": "llama"}), loadgate.Overloaded(), "anthropic")
        with openai_client(url, 1) as oa, pytest.raises(openai.APIStatusError) as caught:
            ask_openai(oa)
        assert (caught.value.status_code, caught.value.body) == (529, OPENAI_BUSY)
        assert_paced(recorder.times("/v1/chat/completions"), 2)


def test_other_500s_pass_through_unchanged() -> None:
    async def boom(request: Request) -> Response:
        raise RuntimeError("not a rejection")

    async def plain(request: Request) -> Response:
        return JSONResponse({"broken": True}, status_code=500)

    async def streamed(request: Request) -> Response:
        async def chunks() -> Any:
            for i in range(3):
                yield f"part {i}\n".encode()
                await asyncio.sleep(0)

        return StreamingResponse(chunks(), status_code=500, media_type="text/plain")

    app = Starlette(routes=[Route("/boom", boom), Route("/plain", plain), Route("/streamed", streamed)])
    with served(LoadgateMiddleware(app)) as (url, _), httpx.Client(base_url=url, timeout=10) as client:
        r = client.get("/plain")
        assert (r.status_code, r.json()) == (500, {"broken": True})
        r = client.get("/streamed")
        assert (r.status_code, r.text) == (500, "part 0\npart 1\npart 2\n")
        assert "x-loadgate-reason" not in r.headers

    # Another error: the app's own 500 goes out, then the error goes on to
    # the server. (Called directly: uvicorn closes the connection after an
    # error, which races with the client reading the answer.)
    async def call() -> List[Any]:
        sent: List[Any] = []

        async def receive() -> Dict[str, Any]:
            return {"type": "http.request", "body": b""}

        async def send(message: Any) -> None:
            sent.append(message)

        scope = {"type": "http", "http_version": "1.1", "method": "GET", "path": "/boom", "raw_path": b"/boom",
                 "root_path": "", "scheme": "http", "query_string": b"", "headers": [], "server": ("test", 80)}
        with pytest.raises(RuntimeError, match="not a rejection"):
            await LoadgateMiddleware(app)(scope, receive, send)
        return sent

    sent = asyncio.run(call())
    assert [m["type"] for m in sent] == ["http.response.start", "http.response.body"]
    assert (sent[0]["status"], sent[1]["body"]) == (500, b"Internal Server Error")


def test_a_500_sent_before_a_rejection_is_replaced() -> None:
    """Any framework that answers 500 and then re-raises, at the ASGI level."""

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 500, "headers": [(b"content-type", b"text/plain")]})
        await send({"type": "http.response.body", "body": b"Internal Server Error"})
        raise loadgate.QueueTimeout(retry_after=2.5)

    async def call() -> List[Any]:
        sent: List[Any] = []

        async def receive() -> Dict[str, Any]:
            return {"type": "http.request", "body": b""}

        async def send(message: Any) -> None:
            sent.append(message)

        await LoadgateMiddleware(app, style="openai")({"type": "http", "path": "/", "method": "GET"}, receive, send)
        return sent

    start, body = asyncio.run(call())
    assert start["status"] == 529
    assert dict(start["headers"])[b"retry-after"] == b"3"
    assert dict(start["headers"])[b"x-loadgate-reason"] == b"queue_timeout"
    assert json.loads(body["body"]) == loadgate.QueueTimeout().body("openai")


def test_style_by_path() -> None:
    cases = {
        "/v1/messages": "anthropic",
        "/v1/messages/count_tokens": "anthropic",
        "/v1/messagesx": "openai",
        "/v1/chat/completions": "openai",
        "/v1/completions": "openai",
        "/v1/responses": "openai",
        "/generate": "dynamo",
        "/health": "dynamo",
        "/v1": "dynamo",
    }
    assert {path: style_by_path({"type": "http", "path": path}) for path in cases} == cases


# ----- EnvAdmissionMiddleware: vLLM's --middleware -----------------------------


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in ENV_NAMES:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_env_admission_middleware_added_by_class_alone(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("DYN_BACKEND_ADMISSION_ENGINE_REQUEST_LIMIT", "1")
    clean_env.setenv("DYN_BACKEND_ADMISSION_REQUEST_QUEUE_LIMIT", "0")
    started = threading.Event()
    proceed = threading.Event()

    async def slow(request: Request) -> JSONResponse:
        started.set()
        while not proceed.is_set():
            await asyncio.sleep(0.005)
        return JSONResponse(reply(request.url.path, "llama"))

    app = FastAPI()
    for path in API_PATHS:
        app.add_api_route(path, slow, methods=["POST"])
    app.add_api_route("/health", health, methods=["GET"])
    app.add_middleware(EnvAdmissionMiddleware)  # what vLLM's --middleware does
    with served(app) as (url, _):
        first: Dict[str, httpx.Response] = {}

        def post() -> None:
            first["r"] = httpx.post(f"{url}/v1/chat/completions", json={"model": "llama"}, timeout=30)

        thread = threading.Thread(target=post)
        thread.start()
        try:
            assert started.wait(30)  # it holds the only slot
            with httpx.Client(base_url=url, timeout=10) as http:
                for path in API_PATHS:
                    r = http.post(path, json={"model": "llama"})
                    assert_rejection(r, loadgate.AtCapacity(), style_by_path({"path": path}))
                assert http.get("/health").status_code == 200  # only /v1/ is guarded
            with openai_client(url, 0) as oa, pytest.raises(openai.APIStatusError) as caught:
                ask_openai(oa)
            assert (caught.value.status_code, caught.value.code) == (529, "worker_at_capacity")
            with anthropic_client(url, 0) as an, pytest.raises(anthropic.OverloadedError):
                ask_anthropic(an)
        finally:
            proceed.set()
            thread.join(30)
        assert first["r"].status_code == 200
        with openai_client(url, 0) as oa:
            assert ask_openai(oa).choices[0].message.content == "hi"


def test_env_admission_middleware_names_a_missing_or_invalid_variable(clean_env: pytest.MonkeyPatch) -> None:
    app = FastAPI()
    app.add_middleware(EnvAdmissionMiddleware)
    missing = (
        "EnvAdmissionMiddleware: no engine request limit: set DYN_BACKEND_ADMISSION_ENGINE_REQUEST_LIMIT "
        "(or DYN_ENGINE_REQUEST_LIMIT)"
    )
    with pytest.raises(ValueError, match=missing.replace("(", r"\(").replace(")", r"\)")):
        app.build_middleware_stack()  # what the app does at its first event
    with pytest.raises(ValueError, match="DYN_BACKEND_ADMISSION_ENGINE_REQUEST_LIMIT"):
        EnvAdmissionMiddleware(app)
    clean_env.setenv("DYN_BACKEND_ADMISSION_ENGINE_REQUEST_LIMIT", "0")
    with pytest.raises(ValueError, match="EnvAdmissionMiddleware: .*DYN_BACKEND_ADMISSION_ENGINE_REQUEST_LIMIT"):
        EnvAdmissionMiddleware(app)
    clean_env.setenv("DYN_BACKEND_ADMISSION_ENGINE_REQUEST_LIMIT", "4")
    clean_env.setenv("DYN_BACKEND_ADMISSION_REQUEST_QUEUE_LIMIT", "many")
    with pytest.raises(ValueError, match="DYN_BACKEND_ADMISSION_REQUEST_QUEUE_LIMIT"):
        EnvAdmissionMiddleware(app)


def test_env_admission_middleware_defaults_and_subclasses(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("DYN_ENGINE_REQUEST_LIMIT", "3")  # the older names work too
    clean_env.setenv("DYN_DYNAMO_REQUEST_QUEUE_LIMIT", "2")
    clean_env.setenv("DYN_DYNAMO_REQUEST_QUEUE_TIMEOUT_MS", "1500")
    app = FastAPI()
    mw = EnvAdmissionMiddleware(app)
    assert (mw.gate.limit, mw.gate.queue_limit, mw.gate.queue_timeout) == (3, 2, 1.5)
    assert (mw.app, mw.paths, mw.style, mw.priority_header) == (app, ("/v1/",), style_by_path, "x-loadgate-priority")
    guarded = {path: mw._guarded({"type": "http", "path": path}) for path in ("/v1/chat/completions", "/v1/models", "/health", "/metrics")}
    assert guarded == {"/v1/chat/completions": True, "/v1/models": True, "/health": False, "/metrics": False}
    assert EnvAdmissionMiddleware(app).gate is not mw.gate  # a gate per instance

    class Everything(EnvAdmissionMiddleware):
        def __init__(self, app: Any) -> None:
            super().__init__(app, paths=None, style="openai", priorities={"batch": 0})

    every = Everything(app)
    assert (every.paths, every.style, every.priorities, every.gate.limit) == (None, "openai", {"batch": 0}, 3)
    assert every._guarded({"type": "http", "path": "/health"})
