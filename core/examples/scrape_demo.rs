//! A frontend shedding load in front of simulated engines that only expose
//! Prometheus `/metrics` (docs/scrape.md).
//!
//! Three simulated vLLM engines (4 slots each, an unbounded waiting queue,
//! 200 ms per request) each serve `/metrics` in vLLM's own format on a
//! loopback port, and nothing else: the frontend learns their load only by
//! scraping them every 50 ms. Requests reach an engine by a direct call
//! (the demo's stand-in for the network). The frontend marks a worker busy
//! when its waiting queue holds more than 2 requests, and answers 529 when
//! every worker is busy. Together the engines serve 60 requests/s; the
//! offered load goes 10/s → 150/s → 10/s;
//! the table shows requests routed and shed per second, busy workers and
//! each engine's running/waiting requests.
//!
//! Run: `cargo run --release -p loadgate --features scrape --example scrape_demo`
//! (`-- --quick` for a short run). Exits 1 if the overload was not shed. The
//! other checks depend on the machine keeping up in real time (a scrape
//! every 50 ms, engines served on time): they are printed, and fail the run
//! only with `--strict`, since a loaded machine can miss them without
//! anything being wrong.

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use loadgate::scrape::{Engine, Scrape, ScrapeConfig};
use loadgate::{Monitor, Policy, RouteError, ThresholdUpdate};

const MODEL: &str = "demo-llama";
const SLOTS: usize = 4;
const SERVICE: Duration = Duration::from_millis(200);
const KV_BLOCKS: u64 = 1024;

#[derive(Default)]
struct State {
    running: Vec<Instant>,
    waiting: VecDeque<Instant>,
    max_waiting: usize,
}

/// A simulated engine: a scheduler thread and a `/metrics` server.
struct SimEngine {
    state: Arc<Mutex<State>>,
    url: String,
}

impl SimEngine {
    fn start() -> Self {
        let state = Arc::new(Mutex::new(State::default()));
        let s = state.clone();
        std::thread::spawn(move || loop {
            std::thread::sleep(Duration::from_millis(5));
            let mut st = s.lock().unwrap();
            let now = Instant::now();
            st.running.retain(|end| *end > now);
            while st.running.len() < SLOTS && st.waiting.pop_front().is_some() {
                st.running.push(now + SERVICE);
            }
        });
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}/metrics", listener.local_addr().unwrap());
        let s = state.clone();
        std::thread::spawn(move || {
            for conn in listener.incoming().flatten() {
                let s = s.clone();
                std::thread::spawn(move || serve_metrics(conn, &s));
            }
        });
        Self { state, url }
    }

    fn submit(&self) {
        let mut st = self.state.lock().unwrap();
        st.waiting.push_back(Instant::now());
        st.max_waiting = st.max_waiting.max(st.waiting.len());
    }

    fn load(&self) -> (usize, usize) {
        let st = self.state.lock().unwrap();
        (st.running.len(), st.waiting.len())
    }
}

/// Answers every `GET` on the connection with vLLM-format metrics.
fn serve_metrics(conn: TcpStream, state: &Mutex<State>) {
    let mut reader = BufReader::new(conn.try_clone().unwrap());
    let mut out = conn;
    loop {
        let mut line = String::new();
        while line != "\r\n" {
            line.clear();
            if reader.read_line(&mut line).unwrap_or(0) == 0 {
                return;
            }
        }
        let (running, waiting) = {
            let st = state.lock().unwrap();
            (st.running.len(), st.waiting.len())
        };
        let usage = running as f64 / SLOTS as f64;
        let body = format!(
            "# HELP vllm:num_requests_running Number of requests in model execution batches.\n\
             # TYPE vllm:num_requests_running gauge\n\
             vllm:num_requests_running{{model_name=\"{MODEL}\",engine=\"0\"}} {:?}\n\
             # HELP vllm:num_requests_waiting Number of requests waiting to be processed.\n\
             # TYPE vllm:num_requests_waiting gauge\n\
             vllm:num_requests_waiting{{model_name=\"{MODEL}\",engine=\"0\"}} {:?}\n\
             # HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.\n\
             # TYPE vllm:kv_cache_usage_perc gauge\n\
             vllm:kv_cache_usage_perc{{model_name=\"{MODEL}\",engine=\"0\"}} {usage:?}\n\
             # HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n\
             # TYPE vllm:cache_config_info gauge\n\
             vllm:cache_config_info{{block_size=\"16\",cache_dtype=\"auto\",engine=\"0\",num_gpu_blocks=\"{KV_BLOCKS}\"}} 1.0\n",
            running as f64, waiting as f64
        );
        let head = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: text/plain; version=0.0.4; charset=utf-8\r\ncontent-length: {}\r\n\r\n",
            body.len()
        );
        if out.write_all(head.as_bytes()).is_err() || out.write_all(body.as_bytes()).is_err() {
            return;
        }
    }
}

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let strict = std::env::args().any(|a| a == "--strict");
    let secs = if quick { 2 } else { 4 };
    let phases = [
        ("light", 10u32, secs),
        ("overload", 150, secs),
        ("light again", 10, secs),
    ];

    let monitor = Arc::new(Monitor::new());
    let engines: Vec<SimEngine> = (0..3).map(|_| SimEngine::start()).collect();
    let config = ScrapeConfig {
        interval: Duration::from_millis(50),
        ..ScrapeConfig::new(Engine::Vllm)
    };
    let scrapes: Vec<Scrape> = engines
        .iter()
        .enumerate()
        .map(|(i, e)| {
            Scrape::start(monitor.clone(), None, i as u64, &e.url, config.clone()).unwrap()
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(30);
    while monitor.workers(MODEL).len() < engines.len() {
        assert!(Instant::now() < deadline, "the engines were never scraped");
        std::thread::sleep(Duration::from_millis(10));
    }
    monitor
        .set_thresholds(
            MODEL,
            &ThresholdUpdate {
                waiting_requests_threshold: Some(2),
                ..Default::default()
            },
        )
        .unwrap();
    println!(
        "frontend: {} workers of {MODEL:?} learned by scraping; busy when waiting > 2",
        engines.len()
    );
    println!(
        "{:<12} {:>4} {:>7} {:>7} {:>5}  engines (running/waiting)",
        "phase", "s", "routed", "shed", "busy"
    );

    let mut shed_by_phase = Vec::new();
    for (phase, rate, seconds) in phases {
        let mut phase_shed = 0u64;
        for second in 0..seconds {
            let (mut routed, mut shed) = (0u64, 0u64);
            let start = Instant::now();
            for i in 0..rate {
                let due = start + Duration::from_secs(1) * i / rate;
                if let Some(wait) = due.checked_duration_since(Instant::now()) {
                    std::thread::sleep(wait);
                }
                match monitor.select(MODEL, Policy::RoundRobin) {
                    Ok(id) => {
                        engines[id as usize].submit();
                        routed += 1;
                    }
                    Err(RouteError::Overloaded) => shed += 1,
                    Err(e) => panic!("unexpected {e}"),
                }
            }
            if let Some(rest) =
                (start + Duration::from_secs(1)).checked_duration_since(Instant::now())
            {
                std::thread::sleep(rest);
            }
            let loads: Vec<String> = engines
                .iter()
                .map(|e| {
                    let (r, w) = e.load();
                    format!("{r}/{w}")
                })
                .collect();
            println!(
                "{phase:<12} {:>4} {routed:>7} {shed:>7} {:>5}  {}",
                second + 1,
                monitor.busy_workers(MODEL).len(),
                loads.join("  ")
            );
            phase_shed += shed;
        }
        shed_by_phase.push((phase, phase_shed));
    }

    let errors: u64 = scrapes.iter().map(|s| s.stats().errors).sum();
    let connections: u64 = scrapes.iter().map(|s| s.stats().connections).sum();
    let scraped: u64 = scrapes.iter().map(|s| s.stats().scrapes).sum();
    println!("scrapes: {scraped} ok, {errors} failed, over {connections} connections");

    let max_waiting = engines
        .iter()
        .map(|e| e.state.lock().unwrap().max_waiting)
        .max()
        .unwrap_or(0);
    println!("longest waiting queue seen: {max_waiting}");
    // (what, passed, whether it depends on real-time timing)
    let checks = [
        (
            "the overload was shed (529s)",
            shed_by_phase[1].1 > 0,
            false,
        ),
        (
            "the first light phase shed nothing",
            shed_by_phase[0].1 == 0,
            true,
        ),
        (
            "one connection per engine",
            connections == engines.len() as u64,
            true,
        ),
        ("no scrape failed", errors == 0, true),
        // A worker is seen busy at most one scrape interval late; meanwhile
        // at most the whole offered load (150/s for 50 ms) may reach it.
        (
            "queues stayed bounded by the threshold plus one scrape interval",
            max_waiting <= 2 + 8 + 2,
            true,
        ),
    ];
    let mut ok = true;
    println!("checks:");
    for (what, passed, timing) in checks {
        let mark = match (passed, timing && !strict) {
            (true, _) => "ok",
            (false, false) => "FAILED",
            (false, true) => "missed (timing; the machine fell behind real time)",
        };
        println!("  [{mark}] {what}");
        ok &= passed || (timing && !strict);
    }
    drop(scrapes);
    assert!(monitor.workers(MODEL).is_empty());
    std::process::exit(if ok { 0 } else { 1 });
}
