"""The lab's `engine` binary (benches/lab: the continuous-batching engine
emulator over real HTTP) under loadgate's Python frontend pieces.

* End to end: emulated engines on loopback, one of them with two
  data-parallel ranks; in front of them a frontend made of loadgate's
  parts only (a `Monitor` scraping each engine's vLLM-format `/metrics`,
  `select`, an httpx streaming proxy, `LoadgateMiddleware` and
  `ControlApp`) under uvicorn; an open-loop Poisson load at three times the
  fleet's capacity, measured first in a calibration phase. Every request is
  accounted for, every 529 carries `Retry-After`, and every admitted stream
  ends with `[DONE]` after all its tokens. Goodput and the admitted
  requests' time to first token are printed (`-s` shows them), not
  asserted: they are timings.
* Over NATS: the engine's `--nats` reports reach `Monitor.subscribe_nats`,
  in loadgate's messages and in Dynamo's envelope, and a client that goes
  away frees its place in the engine.

The binary is `target/release/engine` (under `CARGO_TARGET_DIR` when set);
when it is missing the tests build it with `cargo build --release -p
loadgate-lab --bin engine`. A binary already there is used as it is.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Awaitable, Callable, Dict, Iterator, List, MutableMapping, Optional, Sequence, TypeVar

import httpx
import pytest

from loadgate import Monitor
from loadgate.asgi import ControlApp, LoadgateMiddleware

from conftest import serve
from test_nats import running_nats_server

T = TypeVar("T")
Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]

ROOT = Path(__file__).resolve().parents[2]
MODEL = "lab/emulated-8b"

# The fleet: three engines, the last with two data-parallel ranks. Few
# seats per rank and the modelled step time (speedup 1, about 5.8 ms a
# step) keep the token rate within what one Python process proxies and
# reads on two cores; the engines' timing, not the frontend's, should be
# what runs out.
SEATS = 2
ENGINES: List[List[str]] = [
    ["--max-num-seqs", str(SEATS), "--speedup-ratio", "1"],
    ["--max-num-seqs", str(SEATS), "--speedup-ratio", "1"],
    ["--max-num-seqs", str(SEATS), "--speedup-ratio", "1", "--data-parallel-size", "2"],
]
RANKS = 4
PROMPT_WORDS = 64
OUTPUT_TOKENS = 48

# The step model of benches/lab/src/engine.rs (StepModel::default), in ms.
STEP_BASE_MS, PREFILL_TOKEN_MS, KV_TOKEN_MS = 5.74, 0.01518, 3.9e-5

OVERLOAD = 3.0  # offered load, in multiples of the measured capacity
LOAD_SECONDS = 5.0
CALIBRATION_SECONDS = 2.5
SCRAPE_INTERVAL = 0.02
WAITING_THRESHOLD = 0  # a rank is busy as soon as a request waits in it
# Bounds on waits for a state to arrive; they only turn a hang into a failure.
WAIT = 30.0


def engine_binary() -> Path:
    """The `engine` binary, built first when it is missing."""
    target = Path(os.environ.get("CARGO_TARGET_DIR") or "target")
    if not target.is_absolute():
        target = ROOT / target
    path = target / "release" / "engine"
    if path.exists():
        return path
    cargo = shutil.which("cargo")
    if cargo is None:
        message = f"{path} is missing and cargo is not installed to build it"
        if os.environ.get("LOADGATE_NO_SKIP") == "1":
            pytest.fail(message)
        pytest.skip(message)
    subprocess.run([cargo, "build", "--release", "-p", "loadgate-lab", "--bin", "engine"], cwd=ROOT, check=True)
    assert path.exists(), f"cargo built no {path}"
    return path


@pytest.fixture(scope="module")
def engine_bin() -> Path:
    return engine_binary()


@contextlib.contextmanager
def engines(binary: Path, specs: Sequence[List[str]], logs: Path) -> Iterator[List[str]]:
    """Starts one engine per flag list on a free loopback port; yields their
    base URLs and stops them after."""
    procs: List[subprocess.Popen[bytes]] = []
    try:
        for i, args in enumerate(specs):
            with open(logs / f"engine{i}.log", "wb") as log:
                procs.append(
                    subprocess.Popen(
                        [str(binary), "--model", MODEL, "--port", "0", *args],
                        stdout=subprocess.PIPE,
                        stderr=log,
                    )
                )
        urls = []
        for i, proc in enumerate(procs):
            assert proc.stdout is not None
            line = proc.stdout.readline().decode()
            if not line.startswith("engine listening on http://"):
                proc.wait(10)
                text = (logs / f"engine{i}.log").read_text(errors="replace")
                raise RuntimeError(f"engine {i} did not start ({line!r}):\n{text}")
            urls.append(line.split()[-1])
        yield urls
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            if proc.stdout is not None:
                proc.stdout.close()


def wait_for(read: Callable[[], T], ok: Callable[[T], bool], limit: float = WAIT) -> T:
    deadline = time.monotonic() + limit
    while True:
        value = read()
        if ok(value):
            return value
        assert time.monotonic() < deadline, f"still {value!r}"
        time.sleep(0.01)


def chat_body(max_tokens: int, words: int = PROMPT_WORDS) -> bytes:
    prompt = " ".join(["word"] * (words - 3))
    messages = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": f"summarise: {prompt}"},
    ]
    return json.dumps({"model": MODEL, "messages": messages, "max_tokens": max_tokens, "stream": True}).encode()


@dataclass
class Outcome:
    """One request as its client saw it; times are the loop's clock."""

    intended: float
    want: int = OUTPUT_TOKENS
    status: int = 0
    retry_after: Optional[str] = None
    tokens: int = 0
    done: bool = False
    first_token: Optional[float] = None
    end: float = 0.0
    error: Optional[str] = None

    @property
    def completed(self) -> bool:
        return self.status == 200 and self.done and self.tokens == self.want and self.error is None


async def stream_once(
    client: httpx.AsyncClient, url: str, body: bytes, intended: float, want: int = OUTPUT_TOKENS
) -> Outcome:
    """Sends one streamed chat completion (of `want` output tokens) and
    reads it to its end."""
    loop = asyncio.get_running_loop()
    out = Outcome(intended, want)
    try:
        async with client.stream(
            "POST", url + "/v1/chat/completions", content=body, headers={"content-type": "application/json"}
        ) as resp:
            out.status = resp.status_code
            out.retry_after = resp.headers.get("retry-after")
            if resp.status_code != 200:
                await resp.aread()
            else:
                async for line in resp.aiter_lines():
                    if not line.startswith("data: "):
                        continue
                    data = line[len("data: ") :]
                    if data == "[DONE]":
                        out.done = True
                        continue
                    choices = json.loads(data)["choices"]
                    if choices and choices[0]["delta"].get("content"):
                        out.tokens += 1
                        if out.first_token is None:
                            out.first_token = loop.time()
    except Exception as exc:  # counted, and shown by the accounting check
        out.error = repr(exc)
    out.end = loop.time()
    return out


def client() -> httpx.AsyncClient:
    return httpx.AsyncClient(
        limits=httpx.Limits(max_connections=1024, max_keepalive_connections=256), timeout=httpx.Timeout(60.0)
    )


async def calibrate(urls: Sequence[str], ranks: Sequence[int]) -> float:
    """The fleet's capacity in requests per second: every engine driven
    directly, closed loop, with two requests per seat; completions counted
    over the window after the first second."""
    body = chat_body(OUTPUT_TOKENS)
    loop = asyncio.get_running_loop()
    start = loop.time()
    window = (start + 1.0, start + CALIBRATION_SECONDS)
    done: List[float] = []

    async def worker(c: httpx.AsyncClient, url: str) -> None:
        while loop.time() < window[1]:
            o = await stream_once(c, url, body, loop.time())
            assert o.completed, o
            done.append(o.end)

    async with client() as c:
        await asyncio.gather(*(worker(c, url) for url, n in zip(urls, ranks) for _ in range(2 * SEATS * n)))
    counted = sum(1 for t in done if window[0] <= t <= window[1])
    return counted / (window[1] - window[0])


def decode_seconds() -> float:
    """One request's decode time by the step model, its seats all busy."""
    kv = SEATS * (PROMPT_WORDS + OUTPUT_TOKENS / 2)
    return OUTPUT_TOKENS * (STEP_BASE_MS + KV_TOKEN_MS * kv) / 1000.0


def modelled_capacity() -> float:
    """Capacity by the step model: every seat decoding, a step for the
    prompt and one per output token."""
    request_s = decode_seconds() + PREFILL_TOKEN_MS * PROMPT_WORDS / 1000.0
    return RANKS * SEATS / request_s


async def open_loop(url: str, rate: float, seconds: float, seed: int) -> List[Outcome]:
    """Poisson arrivals at `rate` for `seconds`, each sent at its intended
    time whatever became of the earlier ones."""
    rng = random.Random(seed)
    at: List[float] = []
    t = rng.expovariate(rate)
    while t < seconds:
        at.append(t)
        t += rng.expovariate(rate)
    body = chat_body(OUTPUT_TOKENS)
    loop = asyncio.get_running_loop()
    async with client() as c:
        start = loop.time() + 0.1
        tasks: List[asyncio.Task[Outcome]] = []
        for offset in at:
            intended = start + offset
            delay = intended - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(stream_once(c, url, body, intended)))
        return list(await asyncio.gather(*tasks))


async def unloaded(url: str, n: int = 5) -> List[Outcome]:
    """`n` requests one after another: the time to first token of an idle
    fleet."""
    body = chat_body(OUTPUT_TOKENS)
    loop = asyncio.get_running_loop()
    async with client() as c:
        return [await stream_once(c, url, body, loop.time()) for _ in range(n)]


class Upstream:
    """An ASGI app's way to the engines: the request's body, and a streamed
    POST to an engine through one httpx client, made on the server's loop
    and closed there (`close`, before the server stops)."""

    def __init__(self, urls: Dict[int, str]) -> None:
        self.urls = urls
        self.client: Optional[httpx.AsyncClient] = None
        self.loop: Optional[asyncio.AbstractEventLoop] = None

    @staticmethod
    async def body(receive: Callable[[], Awaitable[Message]]) -> bytes:
        chunks = []
        while True:
            message = await receive()
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                return b"".join(chunks)

    async def post(self, worker: int, path: str, body: bytes, send: Callable[[Message], Awaitable[None]]) -> httpx.Response:
        """Sends `body` to `worker` and starts the response with its status;
        the caller streams the body and closes the response."""
        if self.client is None:
            self.loop = asyncio.get_running_loop()
            self.client = httpx.AsyncClient(
                limits=httpx.Limits(max_connections=512, max_keepalive_connections=128), timeout=httpx.Timeout(60.0)
            )
        request = self.client.build_request(
            "POST", self.urls[worker] + path, content=body, headers={"content-type": "application/json"}
        )
        resp = await self.client.send(request, stream=True)
        headers = [(b"content-type", resp.headers.get("content-type", "application/json").encode())]
        await send({"type": "http.response.start", "status": resp.status_code, "headers": headers})
        return resp

    def close(self) -> None:
        if self.client is not None and self.loop is not None:
            asyncio.run_coroutine_threadsafe(self.client.aclose(), self.loop).result(10)


class Proxy(Upstream):
    """The frontend's own route: picks a worker with the monitor (a
    rejection raises, and `LoadgateMiddleware` answers it) and streams the
    engine's answer back through httpx, chunk by chunk."""

    def __init__(self, monitor: Monitor, urls: Dict[int, str]) -> None:
        super().__init__(urls)
        self.monitor = monitor
        self.picked: Dict[int, int] = {w: 0 for w in urls}

    async def __call__(self, scope: Scope, receive: Callable[[], Awaitable[Message]], send: Callable[[Message], Awaitable[None]]) -> None:
        assert scope["type"] == "http"
        body = await self.body(receive)
        worker = self.monitor.select(json.loads(body)["model"])  # raises Overloaded, Unavailable
        self.picked[worker] += 1
        resp = await self.post(worker, scope["path"], body, send)
        try:
            async for chunk in resp.aiter_raw():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b""})
        finally:
            await resp.aclose()


def percentile(values: Sequence[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))]


def worker_id(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


@pytest.mark.timeout(900)  # building the binary first, when it is missing, takes minutes
def test_open_loop_overload_through_a_python_frontend(engine_bin: Path, tmp_path: Path) -> None:
    with engines(engine_bin, ENGINES, tmp_path) as urls:
        ranks = [2 if "--data-parallel-size" in spec else 1 for spec in ENGINES]
        capacity = asyncio.run(calibrate(urls, ranks))
        assert capacity > 0

        monitor = Monitor()
        scrapes = [monitor.scrape(None, worker_id(u), u + "/metrics", interval=SCRAPE_INTERVAL) for u in urls]
        try:
            # The model and the ranks come from the engines' own metrics.
            wait_for(lambda: sorted(monitor.workers(MODEL)), lambda w: w == sorted(map(worker_id, urls)))
            monitor.set_thresholds(MODEL, waiting_requests_threshold=WAITING_THRESHOLD)
            proxy = Proxy(monitor, {worker_id(u): u for u in urls})
            app = LoadgateMiddleware(ControlApp(monitor, app=proxy), style="openai")
            with serve(app) as front:
                try:
                    idle = asyncio.run(unloaded(front))
                    rate = OVERLOAD * capacity
                    outcomes = asyncio.run(open_loop(front, rate, LOAD_SECONDS, seed=7))
                    frontend_metrics = httpx.get(front + "/metrics").text
                finally:
                    proxy.close()
            stats = [s.stats() for s in scrapes]
        finally:
            for s in scrapes:
                s.close()
        engine_metrics = [httpx.get(u + "/metrics").text for u in urls]

    assert all(o.completed for o in idle), [o for o in idle if not o.completed]

    completed = [o for o in outcomes if o.completed]
    rejected = [o for o in outcomes if o.status == 529 and o.error is None]
    errors = [o for o in outcomes if not o.completed and not (o.status == 529 and o.error is None)]
    # Accounting: every request offered was served in full or rejected.
    assert len(outcomes) == len(completed) + len(rejected) + len(errors)
    assert errors == [], errors[:5]
    # Every rejection says when to come back.
    assert all(o.retry_after is not None and float(o.retry_after) >= 0 for o in rejected)
    # No admitted stream was cut: each 200 ended with [DONE] after all its tokens.
    admitted = [o for o in outcomes if o.status == 200]
    assert all(o.done and o.tokens == OUTPUT_TOKENS for o in admitted)
    # Three times the capacity is more than the fleet serves: some is shed,
    # and the rest is served.
    assert rejected and completed
    assert all(st["errors"] == 0 for st in stats), stats
    assert "dynamo_frontend_scrapes_total" in frontend_metrics
    assert all("vllm:request_success_total" in text for text in engine_metrics)

    ttft = [o.first_token - o.intended for o in completed if o.first_token is not None]
    idle_ttft = [o.first_token - o.intended for o in idle if o.first_token is not None]
    # The time-to-first-token objective: waiting no longer than the
    # request then takes to decode.
    slo = decode_seconds()
    good = [t for t in ttft if t <= slo]
    # As vLLM's `bench serve`: from the first request sent to the last answer.
    span = max(o.end for o in outcomes) - min(o.intended for o in outcomes)
    print(
        f"\nlab engines: {len(urls)} engines, {RANKS} ranks of {SEATS} seats, {PROMPT_WORDS}-word prompts, "
        f"{OUTPUT_TOKENS} output tokens; capacity {capacity:.1f} req/s measured "
        f"({modelled_capacity():.1f} by the step model)"
    )
    print(
        f"offered {len(outcomes)} requests at {rate:.1f} req/s for {LOAD_SECONDS:.0f} s: "
        f"{len(completed)} completed, {len(rejected)} rejected with 529, {len(errors)} errors; "
        f"routed per worker {sorted(proxy.picked.values())}"
    )
    print(
        f"goodput {len(good) / span:.1f} req/s (TTFT <= {slo * 1000:.0f} ms, one request's decode time), "
        f"throughput {len(completed) / span:.1f} req/s, "
        f"{len(completed) * OUTPUT_TOKENS / span:.0f} output tok/s over {span:.2f} s"
    )
    print(
        f"admitted TTFT p50 {percentile(ttft, 50) * 1000:.1f} ms, p99 {percentile(ttft, 99) * 1000:.1f} ms "
        f"(unloaded p50 {percentile(idle_ttft, 50) * 1000:.1f} ms)"
    )


@pytest.mark.timeout(900)
@pytest.mark.parametrize("wire", ["loadgate", "dynamo"])
def test_engine_load_reaches_a_subscribed_monitor_over_nats(engine_bin: Path, tmp_path: Path, wire: str) -> None:
    with running_nats_server([], tmp_path / "nats.log") as port:
        nats = f"nats://127.0.0.1:{port}"
        args = ["--max-num-seqs", "1", "--data-parallel-size", "2", "--num-gpu-blocks-override", "4000"]
        args += ["--nats", nats, "--namespace", "lab"]
        if wire == "dynamo":
            args += ["--worker-id", "42", "--dynamo-endpoint", "backend.generate"]
        monitor = Monitor()
        with monitor.subscribe_nats(
            nats, "lab", dynamo=("backend", "generate") if wire == "dynamo" else None
        ), engines(engine_bin, [args], tmp_path) as (url,):
            worker = 42 if wire == "dynamo" else worker_id(url)
            if wire == "dynamo":
                # The envelope declares nothing: the frontend declares the worker.
                monitor.add_worker(MODEL, worker, dp_size=2, kv_total_blocks=4000)
            wait_for(lambda: monitor.workers(MODEL), lambda w: w == [worker])
            if wire == "dynamo":
                # Dynamo's load event carries no waiting count; the prompts
                # of waiting requests are prefill tokens still to run.
                monitor.set_thresholds(MODEL, active_prefill_tokens_threshold=0)
            else:
                monitor.set_thresholds(MODEL, waiting_requests_threshold=0)
            assert not monitor.is_busy(worker)

            async def hold() -> None:
                # Four long streams on two ranks of one seat: one waits on each.
                body = chat_body(50_000, words=8)
                async with client() as c:
                    streams = [
                        c.stream("POST", url + "/v1/chat/completions", content=body) for _ in range(4)
                    ]
                    async with contextlib.AsyncExitStack() as stack:
                        for s in streams:
                            resp = await stack.enter_async_context(s)
                            assert resp.status_code == 200
                        await asyncio.get_running_loop().run_in_executor(
                            None, lambda: wait_for(lambda: monitor.is_busy(worker), bool)
                        )
                    # Leaving closed the streams: the engine aborts them.

            asyncio.run(hold())
            wait_for(lambda: monitor.is_busy(worker), lambda busy: not busy)
            text = httpx.get(url + "/metrics").text
            assert 'vllm:num_requests_running{engine="0"' in text
