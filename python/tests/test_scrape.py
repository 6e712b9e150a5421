"""`Monitor.scrape` over real HTTP: `http.server` engines that serve vLLM's and
SGLang's own `/metrics` text, and a monitor that polls them."""

from __future__ import annotations

import contextlib
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Dict, Iterator, List, TypeVar

import pytest

from loadgate import Monitor, Scrape

LLAMA = "meta-llama/Llama-3.1-8B-Instruct"
T = TypeVar("T")


def vllm_text(usage: List[float], waiting: List[int], model: str = LLAMA) -> str:
    """vLLM v0.11's exposition for data-parallel engines 0..len(usage)."""
    out = [
        "# HELP vllm:num_requests_waiting Number of requests waiting to be processed.",
        "# TYPE vllm:num_requests_waiting gauge",
    ]
    out += [f'vllm:num_requests_waiting{{model_name="{model}",engine="{e}"}} {float(w)!r}' for e, w in enumerate(waiting)]
    out += [
        "# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.",
        "# TYPE vllm:kv_cache_usage_perc gauge",
    ]
    out += [f'vllm:kv_cache_usage_perc{{model_name="{model}",engine="{e}"}} {u!r}' for e, u in enumerate(usage)]
    out += [
        "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig",
        "# TYPE vllm:cache_config_info gauge",
    ]
    out += [
        f'vllm:cache_config_info{{block_size="16",cache_dtype="auto",engine="{e}",gpu_memory_utilization="0.9",'
        f'num_cpu_blocks="None",num_gpu_blocks="1000",num_gpu_blocks_override="None",sliding_window="None"}} 1.0'
        for e in range(len(usage))
    ]
    return "\n".join(out) + "\n"


def sglang_text(used: int, queue: int, model: str = "qwen") -> str:
    """SGLang v0.5's exposition for one rank."""
    labels = f'engine_type="unified",model_name="{model}",pp_rank="0",tp_rank="0"'
    return (
        "# HELP sglang:num_used_tokens The number of used tokens.\n# TYPE sglang:num_used_tokens gauge\n"
        f"sglang:num_used_tokens{{{labels}}} {float(used)!r}\n"
        "# HELP sglang:token_usage The token usage.\n# TYPE sglang:token_usage gauge\n"
        f"sglang:token_usage{{{labels}}} {used / 100000!r}\n"
        "# HELP sglang:max_total_num_tokens Maximum total number of tokens.\n# TYPE sglang:max_total_num_tokens gauge\n"
        f"sglang:max_total_num_tokens{{{labels}}} 100000.0\n"
        "# HELP sglang:num_queue_reqs The number of requests in the waiting queue.\n# TYPE sglang:num_queue_reqs gauge\n"
        f"sglang:num_queue_reqs{{{labels}}} {float(queue)!r}\n"
    )


class FakeEngine:
    """An engine that only exposes `/metrics` (keep-alive HTTP/1.1)."""

    def __init__(self, body: str) -> None:
        self.body = body
        self.mode = "serve"  # or "stall", "500"
        self.connections = 0
        stalled = self.stalled = threading.Event()
        engine = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def setup(self) -> None:
                super().setup()
                engine.connections += 1

            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                if engine.mode == "stall":
                    stalled.wait(30)
                    return
                status = 500 if engine.mode == "500" else 200
                data = engine.body.encode() if status == 200 else b""
                self.send_response(status)
                self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/metrics"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.stalled.set()
        self.server.shutdown()
        self.server.server_close()


@contextlib.contextmanager
def engine(body: str) -> Iterator[FakeEngine]:
    e = FakeEngine(body)
    try:
        yield e
    finally:
        e.stop()


def wait_for(read: Callable[[], T], ok: Callable[[T], bool], limit: float = 30) -> T:
    """Polls `read()` until `ok`; the limit is for hangs only."""
    deadline = time.monotonic() + limit
    while True:
        value = read()
        if ok(value):
            return value
        assert time.monotonic() < deadline, f"still {value!r}"
        time.sleep(0.01)


def test_vllm_load_flips_busy_state_over_one_connection() -> None:
    m = Monitor()
    with engine(vllm_text([0.1, 0.1], [0, 0])) as e, m.scrape(None, 7, e.url, interval=0.01) as s:
        assert isinstance(s, Scrape) and not s.closed
        wait_for(lambda: m.workers(LLAMA), lambda w: w == [7])  # model from model_name
        m.set_thresholds(LLAMA, active_decode_blocks_threshold=0.8)
        assert not m.is_busy(7)
        e.body = vllm_text([0.9, 0.95], [0, 0])
        wait_for(lambda: m.is_busy(7), bool)
        e.body = vllm_text([0.9, 0.2], [0, 0])
        wait_for(lambda: m.is_busy(7), lambda b: not b)
        stats: Dict[str, Any] = wait_for(s.stats, lambda st: st["scrapes"] >= 10)
        assert stats["errors"] == 0 and stats["connections"] == 1 and stats["registered"]
        assert e.connections == 1  # one connection, reused
        assert stats["last_latency"] > 0 and stats["last_error"] is None
    assert s.closed and m.workers(LLAMA) == []  # leaving the block removes the worker


def test_sglang_waiting_requests_trip_the_waiting_threshold() -> None:
    m = Monitor()
    with engine(sglang_text(500, 0)) as e:
        s = m.scrape("served", 3, e.url, engine="sglang", interval=0.01)
        wait_for(lambda: m.workers("served"), lambda w: w == [3])
        m.set_thresholds("served", waiting_requests_threshold=4)
        e.body = sglang_text(500, 5)
        wait_for(lambda: m.is_busy(3), bool)
        e.body = sglang_text(500, 4)
        wait_for(lambda: m.is_busy(3), lambda b: not b)
        assert 'dynamo_frontend_worker_waiting_requests{dp_rank="0",worker_id="3",worker_type="decode"} 4' in m.metrics_text()
        s.close()
        s.close()
        assert m.workers("served") == [] and s.stats()["scrapes"] == 0


def test_dying_and_stalling_endpoints_keep_the_last_values() -> None:
    m = Monitor()
    with engine(vllm_text([0.5], [9], model="m")) as e:
        with m.scrape(None, 1, e.url, interval=0.01, timeout=0.05) as s:
            wait_for(lambda: m.workers("m"), lambda w: w == [1])
            e.mode = "stall"
            wait_for(s.stats, lambda st: st["errors_by_kind"]["timeout"] >= 2)
            e.mode = "500"
            e.stalled.set()
            wait_for(s.stats, lambda st: st["errors_by_kind"]["http"] >= 1)
            e.stop()  # the engine dies
            wait_for(s.stats, lambda st: st["errors_by_kind"]["connect"] >= 2)
            assert m.workers("m") == [1]  # kept: staleness decides, not the scrape
            m.set_thresholds("m", waiting_requests_threshold=8)
            assert m.is_busy(1)  # the last values (9 waiting) still count


def test_scrape_outcomes_are_in_the_monitors_metrics() -> None:
    from prometheus_client.parser import text_string_to_metric_families

    m = Monitor()
    with engine(vllm_text([0.5], [0], model="m")) as e, m.scrape(None, 1, e.url, interval=0.01) as s:
        wait_for(s.stats, lambda st: st["scrapes"] >= 2)
        e.mode = "500"
        stats = wait_for(s.stats, lambda st: st["errors_by_kind"]["http"] >= 1)
        families = {f.name: f for f in text_string_to_metric_families(m.metrics_text())}
        samples = {
            (x.name, x.labels.get("outcome")): x.value
            for x in families["dynamo_frontend_scrapes"].samples
            if x.labels["worker_id"] == "1"
        }
        assert samples[("dynamo_frontend_scrapes_total", "ok")] >= stats["scrapes"]
        assert samples[("dynamo_frontend_scrapes_total", "http")] >= 1
        assert samples[("dynamo_frontend_scrapes_total", "timeout")] == 0
        duration = families["dynamo_frontend_scrape_duration_seconds"]
        assert duration.type == "summary"
        count = [x.value for x in duration.samples if x.name.endswith("_count")]
        assert count and count[0] >= stats["scrapes"] + stats["errors"]
        assert families["dynamo_frontend_scrape_registered"].samples[0].value == 1
    assert "frontend_scrape_registered{" not in m.metrics_text()  # closed: gone


def test_declared_seats_hold_a_scraped_worker_under_an_slo() -> None:
    m = Monitor()
    with engine(vllm_text([0.1], [0])) as e, m.scrape(None, 7, e.url, interval=0.01, max_num_seqs=4):
        wait_for(lambda: m.workers(LLAMA), lambda w: w == [7])
        m.set_slo(LLAMA, ttft=2.0, tpot=0.1)
        # vLLM's metrics carry no seat count; the 4 declared, which no
        # probe passes: the fifth booking turns the worker busy, though
        # every scrape shows none waiting.
        held = []
        while not m.is_busy(7):
            assert len(held) < 100, "never busy"
            held.append(m.book(7, 0, 4))
        assert len(held) == 5


def test_many_workers_at_once() -> None:
    m = Monitor()
    with contextlib.ExitStack() as stack:
        engines = [stack.enter_context(engine(vllm_text([0.1], [i], model="many"))) for i in range(16)]
        scrapes = [stack.enter_context(m.scrape("many", i, e.url, interval=0.01)) for i, e in enumerate(engines)]
        wait_for(lambda: len(m.workers("many")), lambda n: n == 16)
        m.set_thresholds("many", waiting_requests_threshold=11)
        wait_for(lambda: m.busy_workers("many"), lambda busy: busy == [12, 13, 14, 15])
        assert all(s.stats()["errors"] == 0 for s in scrapes)
    assert m.workers("many") == []


@pytest.mark.parametrize(
    "args,kwargs,exc,match",
    [
        (("m", 1, "https://x/metrics"), {}, ValueError, "scheme"),
        (("m", 1, "x:1"), {}, ValueError, "URL"),
        (("m", 1, "http://127.0.0.1:1/"), {"engine": "tgi"}, ValueError, "engine"),
        (("m", 1, "http://127.0.0.1:1/"), {"interval": 0}, ValueError, "interval"),
        (("m", 1, "http://127.0.0.1:1/"), {"timeout": -1}, ValueError, "timeout"),
        (("m", -1, "http://127.0.0.1:1/"), {}, ValueError, "worker_id"),
        (("", 1, "http://127.0.0.1:1/"), {}, ValueError, "model"),
        ((1, 1, "http://127.0.0.1:1/"), {}, TypeError, "model"),
        (("m", 1, b"http://127.0.0.1:1/"), {}, TypeError, "url"),
        (("m", 1, "http://127.0.0.1:1/"), {"max_num_seqs": -1}, ValueError, "max_num_seqs"),
        (("m", 1, "http://127.0.0.1:1/"), {"max_num_seqs": "8"}, TypeError, "max_num_seqs"),
    ],
)
def test_scrape_bad_input(args: Any, kwargs: Dict[str, Any], exc: type, match: str) -> None:
    with pytest.raises(exc, match=match):
        Monitor().scrape(*args, **kwargs)
