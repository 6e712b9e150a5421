//! Engine scraping over real HTTP (docs/scrape.md): loopback servers that
//! serve `/metrics` text in vLLM's and SGLang's own format, and a monitor
//! that scrapes them. Waits are for conditions, with a limit for hangs only.
#![cfg(feature = "scrape")]

mod support;

use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use loadgate::scrape::{Engine, Scrape, ScrapeConfig, ERROR_KINDS};
use loadgate::{ManualClock, Monitor, MonitorConfig, Staleness, ThresholdUpdate};
use support::wait_for;

const LLAMA: &str = "meta-llama/Llama-3.1-8B-Instruct";

/// What the fake engine does with the next request.
#[derive(Debug, Clone)]
enum Mode {
    Serve(String),
    /// Reads the request and never answers.
    Stall,
    /// Closes every connection at once (the engine died).
    Dead,
    Status(u16),
}

/// A fake engine: answers `GET /metrics` over keep-alive HTTP/1.1.
struct Engine_ {
    url: String,
    mode: Arc<Mutex<Mode>>,
    connections: Arc<AtomicU64>,
    requests: Arc<AtomicU64>,
}

impl Engine_ {
    fn start(body: String) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}/metrics", listener.local_addr().unwrap());
        let mode = Arc::new(Mutex::new(Mode::Serve(body)));
        let connections = Arc::new(AtomicU64::new(0));
        let requests = Arc::new(AtomicU64::new(0));
        let (m, c, r) = (mode.clone(), connections.clone(), requests.clone());
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { return };
                c.fetch_add(1, Ordering::Relaxed);
                let (m, r) = (m.clone(), r.clone());
                std::thread::spawn(move || serve(stream, &m, &r));
            }
        });
        Self {
            url,
            mode,
            connections,
            requests,
        }
    }

    fn set(&self, mode: Mode) {
        *self.mode.lock().unwrap() = mode;
    }
}

fn serve(stream: TcpStream, mode: &Mutex<Mode>, requests: &AtomicU64) {
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut out = stream;
    loop {
        let mut line = String::new();
        // The request line, then headers up to the blank line.
        if reader.read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
        loop {
            let mut h = String::new();
            if reader.read_line(&mut h).unwrap_or(0) == 0 {
                return;
            }
            if h == "\r\n" {
                break;
            }
        }
        requests.fetch_add(1, Ordering::Relaxed);
        let mode = mode.lock().unwrap().clone();
        let (status, body) = match mode {
            Mode::Serve(body) => (200, body),
            Mode::Status(s) => (s, String::new()),
            Mode::Dead => return,
            Mode::Stall => {
                std::thread::sleep(Duration::from_secs(3600));
                return;
            }
        };
        let head = format!(
            "HTTP/1.1 {status} X\r\ncontent-type: text/plain; version=0.0.4; charset=utf-8\r\ncontent-length: {}\r\n\r\n",
            body.len()
        );
        if out.write_all(head.as_bytes()).is_err() || out.write_all(body.as_bytes()).is_err() {
            return;
        }
    }
}

/// vLLM v0.11's exposition for data-parallel engines `0..usage.len()`, as
/// prometheus_client writes it (floats as `repr`, labels in declared order,
/// the info gauge's labels sorted).
fn vllm(model: &str, usage: &[f64], waiting: &[u64]) -> String {
    let mut s = String::new();
    s += "# HELP vllm:num_requests_running Number of requests in model execution batches.\n";
    s += "# TYPE vllm:num_requests_running gauge\n";
    for e in 0..usage.len() {
        s += &format!("vllm:num_requests_running{{model_name=\"{model}\",engine=\"{e}\"}} 2.0\n");
    }
    s += "# HELP vllm:num_requests_waiting Number of requests waiting to be processed.\n";
    s += "# TYPE vllm:num_requests_waiting gauge\n";
    for (e, w) in waiting.iter().enumerate() {
        s += &format!(
            "vllm:num_requests_waiting{{model_name=\"{model}\",engine=\"{e}\"}} {:?}\n",
            *w as f64
        );
    }
    s += "# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.\n";
    s += "# TYPE vllm:kv_cache_usage_perc gauge\n";
    for (e, u) in usage.iter().enumerate() {
        s += &format!("vllm:kv_cache_usage_perc{{model_name=\"{model}\",engine=\"{e}\"}} {u:?}\n");
    }
    s += "# HELP vllm:prompt_tokens_total Number of prefill tokens processed.\n";
    s += "# TYPE vllm:prompt_tokens_total counter\n";
    s += &format!("vllm:prompt_tokens_total{{model_name=\"{model}\",engine=\"0\"}} 123456.0\n");
    s += "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n";
    s += "# TYPE vllm:cache_config_info gauge\n";
    for e in 0..usage.len() {
        s += &format!(
            "vllm:cache_config_info{{block_size=\"16\",cache_dtype=\"auto\",calculate_kv_scales=\"False\",cpu_offload_gb=\"0\",enable_prefix_caching=\"True\",engine=\"{e}\",gpu_memory_utilization=\"0.9\",is_attention_free=\"False\",num_cpu_blocks=\"None\",num_gpu_blocks=\"1000\",num_gpu_blocks_override=\"None\",prefix_caching_hash_algo=\"sha256\",sliding_window=\"None\",swap_space=\"4\",swap_space_bytes=\"4294967296\"}} 1.0\n"
        );
    }
    s += "# HELP vllm:e2e_request_latency_seconds Histogram of e2e request latency in seconds.\n";
    s += "# TYPE vllm:e2e_request_latency_seconds histogram\n";
    s += &format!("vllm:e2e_request_latency_seconds_bucket{{engine=\"0\",le=\"0.3\",model_name=\"{model}\"}} 0.0\n");
    s += &format!("vllm:e2e_request_latency_seconds_bucket{{engine=\"0\",le=\"+Inf\",model_name=\"{model}\"}} 12.0\n");
    s += &format!("vllm:e2e_request_latency_seconds_sum{{engine=\"0\",model_name=\"{model}\"}} 30.517578125\n");
    s
}

/// SGLang v0.5's exposition for one data-parallel rank (tp_rank 0).
fn sglang(model: &str, used: u64, usage: f64, queue: u64) -> String {
    let labels =
        format!("engine_type=\"unified\",model_name=\"{model}\",pp_rank=\"0\",tp_rank=\"0\"");
    format!(
        "# HELP sglang:num_running_reqs The number of running requests.\n\
         # TYPE sglang:num_running_reqs gauge\n\
         sglang:num_running_reqs{{{labels}}} 1.0\n\
         # HELP sglang:num_used_tokens The number of used tokens.\n\
         # TYPE sglang:num_used_tokens gauge\n\
         sglang:num_used_tokens{{{labels}}} {:?}\n\
         # HELP sglang:token_usage The token usage.\n\
         # TYPE sglang:token_usage gauge\n\
         sglang:token_usage{{{labels}}} {usage:?}\n\
         # HELP sglang:max_total_num_tokens Maximum total number of tokens in the KV cache pool.\n\
         # TYPE sglang:max_total_num_tokens gauge\n\
         sglang:max_total_num_tokens{{{labels}}} 100000.0\n\
         # HELP sglang:num_queue_reqs The number of requests in the waiting queue.\n\
         # TYPE sglang:num_queue_reqs gauge\n\
         sglang:num_queue_reqs{{{labels}}} {:?}\n\
         # HELP sglang:gen_throughput The generation throughput (token/s).\n\
         # TYPE sglang:gen_throughput gauge\n\
         sglang:gen_throughput{{{labels}}} 1502.3351440429688\n",
        used as f64, queue as f64
    )
}

fn fast(engine: Engine) -> ScrapeConfig {
    ScrapeConfig {
        interval: Duration::from_millis(10),
        ..ScrapeConfig::new(engine)
    }
}

fn monitor() -> (Arc<Monitor>, Arc<ManualClock>) {
    let clock = ManualClock::new();
    let m = Monitor::with_config(MonitorConfig::default(), clock.clone()).unwrap();
    (Arc::new(m), clock)
}

fn kind(stats: &loadgate::scrape::ScrapeStats, name: &str) -> u64 {
    stats.errors_by_kind[ERROR_KINDS.iter().position(|k| *k == name).unwrap()]
}

#[test]
fn vllm_load_flips_the_busy_state_over_one_reused_connection() {
    let (m, _) = monitor();
    let engine = Engine_::start(vllm(LLAMA, &[0.1, 0.1], &[0, 0]));
    let s = Scrape::start(m.clone(), None, 7, &engine.url, fast(Engine::Vllm)).unwrap();
    wait_for("registration", || m.workers(LLAMA) == vec![7]);
    let l = m.rank_load(7, 1).unwrap();
    assert_eq!(
        (l.kv_used_blocks, l.kv_total_blocks, l.waiting_requests),
        (100, 1000, Some(0)),
        "0.1 of 1000 blocks; the model from the model_name label"
    );
    m.set_thresholds(
        LLAMA,
        &ThresholdUpdate {
            active_decode_blocks_threshold: Some(0.8),
            ..Default::default()
        },
    )
    .unwrap();
    assert!(!m.is_busy(7).unwrap());
    engine.set(Mode::Serve(vllm(LLAMA, &[0.9, 0.95], &[0, 0])));
    wait_for("busy by KV usage", || m.is_busy(7).unwrap());
    engine.set(Mode::Serve(vllm(LLAMA, &[0.9, 0.2], &[0, 0])));
    wait_for("free again: one rank below the line", || {
        !m.is_busy(7).unwrap()
    });
    let before = engine.requests.load(Ordering::Relaxed);
    wait_for("more scrapes", || {
        engine.requests.load(Ordering::Relaxed) > before + 20
    });
    assert_eq!(
        engine.connections.load(Ordering::Relaxed),
        1,
        "one connection, reused"
    );
    let stats = s.stats();
    assert_eq!((stats.errors, stats.connections), (0, 1));
    assert!(stats.registered && stats.scrapes > 20);
    drop(s);
    assert!(m.workers(LLAMA).is_empty(), "closing removes the worker");
}

#[test]
fn waiting_requests_from_the_engine_trip_the_waiting_threshold() {
    let (m, _) = monitor();
    let engine = Engine_::start(sglang("qwen", 500, 0.005, 0));
    let mut s = Scrape::start(
        m.clone(),
        Some("served-qwen"),
        3,
        &engine.url,
        fast(Engine::Sglang),
    )
    .unwrap();
    wait_for("registration", || m.workers("served-qwen") == vec![3]);
    assert!(
        m.workers("qwen").is_empty(),
        "a given model wins over model_name"
    );
    let l = m.rank_load(3, 0).unwrap();
    assert_eq!(
        (l.kv_used_blocks, l.kv_total_blocks, l.waiting_requests),
        (500, 100_000, Some(0))
    );
    m.set_thresholds(
        "served-qwen",
        &ThresholdUpdate {
            waiting_requests_threshold: Some(4),
            ..Default::default()
        },
    )
    .unwrap();
    engine.set(Mode::Serve(sglang("qwen", 500, 0.005, 5)));
    wait_for("busy: 5 waiting > 4", || m.is_busy(3).unwrap());
    engine.set(Mode::Serve(sglang("qwen", 500, 0.005, 4)));
    wait_for("free: 4 is not above 4", || !m.is_busy(3).unwrap());
    assert!(m
        .metrics_text()
        .contains("dynamo_frontend_worker_waiting_requests{dp_rank=\"0\",worker_id=\"3\",worker_type=\"decode\"} 4"));
    s.close();
    s.close();
    assert!(m.workers("served-qwen").is_empty());
}

#[test]
fn a_dead_endpoint_keeps_its_last_values_and_turns_stale() {
    let (m, clock) = monitor();
    let engine = Engine_::start(vllm("m", &[0.95], &[0]));
    let s = Scrape::start(m.clone(), None, 1, &engine.url, fast(Engine::Vllm)).unwrap();
    wait_for("registration", || m.workers("m") == vec![1]);
    m.set_thresholds(
        "m",
        &ThresholdUpdate {
            active_decode_blocks_threshold: Some(0.5),
            ..Default::default()
        },
    )
    .unwrap();
    m.set_staleness("m", Staleness::Free, Duration::from_secs(3))
        .unwrap();
    assert!(m.is_busy(1).unwrap());
    engine.set(Mode::Dead);
    wait_for("connection errors", || kind(&s.stats(), "connect") >= 3);
    assert_eq!(m.rank_load(1, 0).unwrap().kv_used_blocks, 950, "kept");
    assert!(m.is_busy(1).unwrap(), "kept until stale");
    m.sweep();
    clock.advance(Duration::from_secs(4));
    m.sweep();
    assert!(
        !m.is_busy(1).unwrap(),
        "stale under the model's policy: free"
    );
    engine.set(Mode::Serve(vllm("m", &[0.95], &[0])));
    wait_for("fresh again", || m.is_busy(1).unwrap());
    assert!(
        s.stats().connections >= 2,
        "a failed connection is reopened"
    );
}

#[test]
fn a_stalled_endpoint_times_out_and_keeps_its_last_values() {
    let (m, _) = monitor();
    let engine = Engine_::start(vllm("m", &[0.5], &[9]));
    let config = ScrapeConfig {
        timeout: Duration::from_millis(50),
        ..fast(Engine::Vllm)
    };
    let s = Scrape::start(m.clone(), None, 1, &engine.url, config).unwrap();
    wait_for("registration", || m.workers("m") == vec![1]);
    engine.set(Mode::Stall);
    wait_for("timeouts", || kind(&s.stats(), "timeout") >= 2);
    assert_eq!(m.rank_load(1, 0).unwrap().waiting_requests, Some(9));
    assert!(s.stats().last_error.unwrap().contains("timeout"));
    engine.set(Mode::Status(503));
    wait_for("http errors", || kind(&s.stats(), "http") >= 1);
}

#[test]
fn bad_bodies_are_counted_and_change_nothing() {
    let (m, _) = monitor();
    let engine = Engine_::start("# nothing here\n".into());
    let config = ScrapeConfig {
        max_body_bytes: 4096,
        ..fast(Engine::Vllm)
    };
    let s = Scrape::start(m.clone(), None, 1, &engine.url, config).unwrap();
    wait_for("missing", || kind(&s.stats(), "missing") >= 1);
    assert!(m.workers("m").is_empty() && !s.stats().registered);
    engine.set(Mode::Serve(vllm("m", &[0.5], &[1])));
    wait_for("registration", || m.workers("m") == vec![1]);
    engine.set(Mode::Serve(
        "vllm:num_requests_waiting{engine=\"0\"} -3\n".into(),
    ));
    wait_for("malformed", || kind(&s.stats(), "malformed") >= 1);
    engine.set(Mode::Serve("x".repeat(5000)));
    wait_for("too large", || kind(&s.stats(), "too_large") >= 1);
    let ranks = m.config().limits.max_ranks_per_worker as usize + 1;
    engine.set(Mode::Serve(vllm("m", &vec![0.5; ranks], &vec![1; ranks])));
    let config = ScrapeConfig {
        max_body_bytes: 64 << 20,
        ..fast(Engine::Vllm)
    };
    let big = Scrape::start(m.clone(), None, 2, &engine.url, config).unwrap();
    wait_for("too many ranks", || {
        kind(&big.stats(), "too_many_ranks") >= 1
    });
    assert_eq!(m.rank_load(1, 0).unwrap().waiting_requests, Some(1), "kept");
    assert_eq!(m.workers("m"), vec![1]);
}

#[test]
fn many_workers_scrape_at_once() {
    let (m, _) = monitor();
    let engines: Vec<Engine_> = (0..40)
        .map(|i| Engine_::start(vllm("many", &[0.1], &[i])))
        .collect();
    let scrapes: Vec<Scrape> = engines
        .iter()
        .enumerate()
        .map(|(i, e)| Scrape::start(m.clone(), None, i as u64, &e.url, fast(Engine::Vllm)).unwrap())
        .collect();
    wait_for("every worker", || m.workers("many").len() == 40);
    m.set_thresholds(
        "many",
        &ThresholdUpdate {
            waiting_requests_threshold: Some(29),
            ..Default::default()
        },
    )
    .unwrap();
    wait_for("every rank reported", || {
        (0..40).all(|i| m.rank_load(i, 0).unwrap().waiting_requests == Some(i))
    });
    assert_eq!(m.busy_workers("many"), (30..40).collect::<Vec<u64>>());
    for (s, e) in scrapes.iter().zip(&engines) {
        assert_eq!(s.stats().errors, 0);
        assert_eq!(e.connections.load(Ordering::Relaxed), 1);
    }
    drop(scrapes);
    assert!(m.workers("many").is_empty());
}

#[test]
fn bad_settings_and_urls_are_refused() {
    let (m, _) = monitor();
    let start = |url: &str, config: ScrapeConfig| Scrape::start(m.clone(), None, 1, url, config);
    assert!(start("https://x/metrics", fast(Engine::Vllm)).is_err());
    assert!(start("x:1/metrics", fast(Engine::Vllm)).is_err());
    let zero = ScrapeConfig {
        timeout: Duration::ZERO,
        ..fast(Engine::Vllm)
    };
    assert!(start("http://127.0.0.1:1/metrics", zero).is_err());
    let tiny = ScrapeConfig {
        max_body_bytes: 10,
        ..fast(Engine::Vllm)
    };
    assert!(start("http://127.0.0.1:1/metrics", tiny).is_err());
    assert!(Scrape::start(
        m.clone(),
        Some(""),
        1,
        "http://127.0.0.1:1/",
        fast(Engine::Vllm)
    )
    .is_err());
    assert_eq!(Engine::from_name("sglang"), Some(Engine::Sglang));
    assert_eq!(Engine::from_name("tgi"), None);
}

/// The value of the sample line that starts with `series` (name and
/// labels, exactly as rendered), if there is one.
fn sample_value(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .map(|v| v.parse().unwrap())
}

#[test]
fn scrape_outcomes_and_latency_are_in_the_monitors_metrics() {
    let (m, _clock) = monitor();
    let good = Engine_::start(vllm("m", &[0.2], &[0]));
    let bad = Engine_::start(String::new());
    bad.set(Mode::Status(503));
    let s1 = Scrape::start(m.clone(), None, 1, &good.url, fast(Engine::Vllm)).unwrap();
    let s2 = Scrape::start(m.clone(), Some("m"), 2, &bad.url, fast(Engine::Vllm)).unwrap();
    wait_for("scrapes and errors", || {
        s1.stats().scrapes >= 2 && kind(&s2.stats(), "http") >= 2
    });
    let (st1, st2) = (s1.stats(), s2.stats());
    let text = m.metrics_text();
    for family in [
        "frontend_scrapes_total counter",
        "frontend_scrape_duration_seconds summary",
        "frontend_scrape_registered gauge",
    ] {
        let typed = format!("# TYPE dynamo_{family}");
        assert_eq!(text.matches(&typed).count(), 1, "{typed} once in:\n{text}");
    }
    let value = |series: &str| {
        sample_value(&text, &format!("dynamo_{series}"))
            .unwrap_or_else(|| panic!("no {series} in:\n{text}"))
    };
    // Read after the stats: at least what they said.
    assert!(value(r#"frontend_scrapes_total{worker_id="1",outcome="ok"}"#) >= st1.scrapes as f64);
    assert_eq!(
        value(r#"frontend_scrapes_total{worker_id="1",outcome="http"}"#),
        0.0
    );
    assert_eq!(
        value(r#"frontend_scrapes_total{worker_id="2",outcome="ok"}"#),
        0.0
    );
    assert!(value(r#"frontend_scrapes_total{worker_id="2",outcome="http"}"#) >= 2.0);
    assert!(
        value(r#"frontend_scrape_duration_seconds_count{worker_id="2"}"#)
            >= (st2.scrapes + st2.errors) as f64
    );
    assert!(value(r#"frontend_scrape_duration_seconds_sum{worker_id="1"}"#) > 0.0);
    assert_eq!(value(r#"frontend_scrape_registered{worker_id="1"}"#), 1.0);
    assert_eq!(value(r#"frontend_scrape_registered{worker_id="2"}"#), 0.0);
    // A closed or dropped scrape leaves the text.
    drop(s2);
    let text = m.metrics_text();
    assert!(!text.contains(r#"worker_id="2""#), "{text}");
    assert!(text.contains(r#"frontend_scrape_registered{worker_id="1"} 1"#));
}

/// vLLM's body with its inter-token latency histogram at `gaps` gaps
/// totalling `seconds` on engine 0.
fn vllm_with_gaps(seconds: f64, gaps: u64) -> String {
    let mut s = vllm(LLAMA, &[0.1], &[0]);
    s += "# HELP vllm:inter_token_latency_seconds Histogram of inter-token latency in seconds.\n";
    s += "# TYPE vllm:inter_token_latency_seconds histogram\n";
    s += &format!("vllm:inter_token_latency_seconds_bucket{{engine=\"0\",le=\"+Inf\",model_name=\"{LLAMA}\"}} {:?}\n", gaps as f64);
    s += &format!(
        "vllm:inter_token_latency_seconds_count{{engine=\"0\",model_name=\"{LLAMA}\"}} {:?}\n",
        gaps as f64
    );
    s += &format!(
        "vllm:inter_token_latency_seconds_sum{{engine=\"0\",model_name=\"{LLAMA}\"}} {seconds:?}\n"
    );
    s
}

#[test]
fn the_engines_token_gaps_teach_an_slos_step_fit() {
    let (m, _) = monitor();
    let engine = Engine_::start(vllm_with_gaps(0.0, 0));
    let _s = Scrape::start(m.clone(), None, 7, &engine.url, fast(Engine::Vllm)).unwrap();
    wait_for("registration", || m.workers(LLAMA) == vec![7]);
    let slo = loadgate::slo::Slo::from_secs(2.0, 0.1).unwrap();
    m.set_slo(LLAMA, Some(slo), loadgate::SloMode::Enforce)
        .unwrap();
    // The engine's steps take 20 ms; between two scrapes it makes 50
    // gaps. Once and again it restarts (its totals run backwards) and
    // once its histogram lies (time runs backwards): neither is observed.
    let (mut seconds, mut gaps) = (0.0, 0u64);
    for i in 0..120 {
        match i {
            60 => (seconds, gaps) = (0.0, 0),
            90 => {
                seconds -= 5.0;
                gaps += 50;
            }
            _ => {
                seconds += 50.0 * 0.02;
                gaps += 50;
            }
        }
        let before = engine.requests.load(Ordering::Relaxed);
        engine.set(Mode::Serve(vllm_with_gaps(seconds, gaps)));
        wait_for("a scrape", || {
            engine.requests.load(Ordering::Relaxed) > before + 1
        });
        // The fit runs in the maintenance (on the test's manual clock).
        m.maintain();
    }
    assert!(m.predict(7, 0, 1).unwrap().trusted, "a trusted fit");
    let p = m.predict(7, 0, 1).unwrap();
    assert!((p.tpot - 0.02).abs() < 0.002, "{p:?}");
}

#[test]
fn the_engines_declared_seats_hold_a_scraped_worker_under_an_slo() {
    let (m, _) = monitor();
    let engine = Engine_::start(vllm(LLAMA, &[0.1], &[0]));
    // vLLM's metrics carry no seat count: the scrape declares 4 for
    // worker 7; worker 8 scrapes the same engine and declares none.
    let seats = ScrapeConfig {
        max_num_seqs: Some(4),
        ..fast(Engine::Vllm)
    };
    let _seated = Scrape::start(m.clone(), None, 7, &engine.url, seats).unwrap();
    let _unknown = Scrape::start(m.clone(), None, 8, &engine.url, fast(Engine::Vllm)).unwrap();
    wait_for("registration", || m.workers(LLAMA).len() == 2);
    let slo = loadgate::slo::Slo::from_secs(2.0, 0.1).unwrap();
    m.set_slo(LLAMA, Some(slo), loadgate::SloMode::Enforce)
        .unwrap();
    // The engine's 4 seats, which no probe passes: the fifth booking
    // turns worker 7 busy, whatever its reports of none waiting say.
    let mut held = Vec::new();
    while !m.is_busy(7).unwrap() {
        assert!(held.len() < 100, "never busy");
        held.push(m.book(7, 0, 4).unwrap());
    }
    assert_eq!(held.len(), 5);
    // Without declared seats nothing bounds them: 50 fit.
    let others: Vec<_> = (0..50).map(|_| m.book(8, 0, 4).unwrap()).collect();
    assert!(!m.is_busy(8).unwrap());
    drop((held, others));
}
