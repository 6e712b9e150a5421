//! Engine scraping (feature `scrape`, docs/scrape.md): a frontend polls a
//! stock vLLM or SGLang worker's Prometheus `/metrics` and turns its KV
//! cache usage, capacity and waiting requests into load reports, with no
//! change to the engine.
//!
//! [`Scrape::start`] spawns one task per worker on the process's shared I/O
//! runtime (the one the NATS transport uses). Each tick (every
//! [`ScrapeConfig::interval`]) the task sends `GET` over the worker's one
//! HTTP/1.1 connection, kept open and reused (reopened only after it fails),
//! reads at most [`ScrapeConfig::max_body_bytes`], all under
//! [`ScrapeConfig::timeout`], maps the engine's metrics
//! ([`engines`](self::Engine)) and reports each rank into the [`Monitor`].
//! Reports are the monitor's ordinary lock-free `report` calls, made on the
//! runtime thread: routing never waits for a scrape.
//!
//! * The worker is registered on its first successful scrape (model from
//!   the caller or else the engine's `model_name` label; ranks from the
//!   engine's rank labels) and removed when the scrape is closed or dropped.
//!   If the engine's ranks or model change, the worker is registered anew.
//! * A scrape that fails (connection refused, timeout, a status other than
//!   200, a body over the limit, a missing or malformed metric, a refusal by
//!   the monitor) is counted in [`ScrapeStats`] and changes nothing: the
//!   worker keeps its last values and turns stale under its model's
//!   staleness policy ([`Monitor::set_staleness`]).
//! * What a hostile endpoint can make a frontend hold is bounded: the body
//!   by `max_body_bytes` (4 MiB by default), the ranks by the monitor's
//!   `Limits::max_ranks_per_worker`.

mod engines;
mod http;
pub(crate) mod stats;
mod text;

use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard, TryLockError};
use std::time::{Duration, Instant};

pub use engines::Engine;
pub use stats::{ScrapeStats, ERROR_KINDS};

use self::engines::{Gaps, MapError};
use self::http::{Connection, FetchError, Target};
use crate::fork::ForkGuard;
use crate::load::{LoadReport, WorkerSpec};
use crate::monitor::Monitor;
use crate::runtime::runtime;

/// How one worker is scraped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScrapeConfig {
    /// Which engine's metrics to read.
    pub engine: Engine,
    /// Time between the starts of two scrapes (default 0.5 s; at least
    /// 1 ms). A scrape that overruns delays the next one; none overlap.
    pub interval: Duration,
    /// Longest one scrape may take, connecting included (default 2 s; more
    /// than zero). A stalled endpoint fails the scrape and its connection is
    /// closed.
    pub timeout: Duration,
    /// Largest body read (default 4 MiB; at least 1 KiB). A larger one
    /// fails the scrape.
    pub max_body_bytes: usize,
    /// Requests each of the engine's ranks runs at once at most (vLLM's
    /// `--max-num-seqs`, SGLang's `--max-running-requests`), which neither
    /// engine's metrics carry: declared for the worker the scrape
    /// registers ([`WorkerSpec::max_num_seqs`]), so an SLO never takes a
    /// rank to hold more. `None` (the default) or 0: not known.
    pub max_num_seqs: Option<u64>,
}

impl ScrapeConfig {
    /// The defaults for `engine`.
    pub fn new(engine: Engine) -> Self {
        Self {
            engine,
            interval: Duration::from_millis(500),
            timeout: Duration::from_secs(2),
            max_body_bytes: 4 << 20,
            max_num_seqs: None,
        }
    }

    fn validate(&self) -> Result<(), ScrapeError> {
        if self.interval < Duration::from_millis(1) {
            return Err(ScrapeError::Config("interval must be at least 1 ms"));
        }
        if self.timeout.is_zero() {
            return Err(ScrapeError::Config("timeout must be longer than zero"));
        }
        if self.max_body_bytes < 1024 {
            return Err(ScrapeError::Config("max_body_bytes must be at least 1024"));
        }
        Ok(())
    }
}

/// Why a scrape could not start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ScrapeError {
    /// The URL is not `http://host[:port][/path]`.
    Url(String),
    /// A setting is out of range.
    Config(&'static str),
}

impl fmt::Display for ScrapeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ScrapeError::Url(why) => write!(f, "invalid scrape URL: {why}"),
            ScrapeError::Config(why) => write!(f, "invalid scrape setting: {why}"),
        }
    }
}

impl std::error::Error for ScrapeError {}

/// Why one scrape failed.
#[derive(Debug)]
enum Failure {
    Fetch(FetchError),
    Timeout,
    Map(MapError),
    Refused(String),
}

impl Failure {
    fn kind(&self) -> &'static str {
        match self {
            Failure::Fetch(e) => e.kind(),
            Failure::Timeout => "timeout",
            Failure::Map(e) => e.kind(),
            Failure::Refused(_) => "refused",
        }
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Failure::Fetch(e) => write!(f, "{e}"),
            Failure::Timeout => f.write_str("no complete answer within the timeout"),
            Failure::Map(e) => write!(f, "{e}"),
            Failure::Refused(why) => write!(f, "refused by the monitor: {why}"),
        }
    }
}

/// The registration a scrape made: its model and ranks.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Registration {
    model: String,
    dp_start: u32,
    dp_size: u32,
}

#[derive(Debug, Default)]
struct State {
    closed: bool,
    registered: Option<Registration>,
    /// Each rank's inter-token latency totals at the last scrape.
    gaps: BTreeMap<u32, Gaps>,
}

#[derive(Debug)]
struct Shared {
    monitor: Arc<Monitor>,
    worker_id: u64,
    model: Option<String>,
    engine: Engine,
    max_num_seqs: Option<u64>,
    stats: Mutex<ScrapeStats>,
    state: Mutex<State>,
    /// The process that started the scrape: in a forked child its task
    /// never runs (it was on the parent's runtime threads).
    made_in: ForkGuard,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl stats::Source for Shared {
    fn worker_id(&self) -> u64 {
        self.worker_id
    }

    fn snapshot(&self) -> (ScrapeStats, bool) {
        self.stats_now()
    }

    fn same_process(&self) -> bool {
        self.made_in.same_process()
    }
}

impl Shared {
    /// Locks `m`, one of this scrape's mutexes. In a forked child, a mutex
    /// that the parent's I/O thread held at the fork stays held for ever
    /// (that thread is not here), so there it is only tried: `None` if
    /// held.
    fn lock_here<'a, T>(&self, m: &'a Mutex<T>) -> Option<MutexGuard<'a, T>> {
        if self.made_in.same_process() {
            return Some(lock(m));
        }
        match m.try_lock() {
            Ok(guard) => Some(guard),
            Err(TryLockError::Poisoned(e)) => Some(e.into_inner()),
            Err(TryLockError::WouldBlock) => None,
        }
    }

    /// This scrape's statistics, with whether its worker is registered now,
    /// and whether the scrape was closed. (In a forked child, what the
    /// parent's scrape had at the fork, or nothing if a lock was held.)
    fn stats_now(&self) -> (ScrapeStats, bool) {
        let (registered, closed) = self
            .lock_here(&self.state)
            .map_or((false, false), |st| (st.registered.is_some(), st.closed));
        let mut stats = self
            .lock_here(&self.stats)
            .map(|s| s.clone())
            .unwrap_or_default();
        stats.registered = registered;
        (stats, closed)
    }

    /// Applies one scraped body; registers the worker first if needed.
    fn apply(&self, body: &[u8]) -> Result<(), Failure> {
        let text = std::str::from_utf8(body)
            .map_err(|_| Failure::Map(MapError::Malformed("the body is not UTF-8".into())))?;
        let max_ranks = self.monitor.config().limits.max_ranks_per_worker;
        let load = engines::map(self.engine, text, max_ranks).map_err(Failure::Map)?;
        let model = self.model.clone().or(load.model).ok_or_else(|| {
            Failure::Map(MapError::Missing(
                "the model_name label (and no model was given)".into(),
            ))
        })?;
        let (Some(first), Some(last)) = (load.ranks.keys().next(), load.ranks.keys().last()) else {
            return Err(Failure::Map(MapError::Missing("every rank".into())));
        };
        let want = Registration {
            model,
            dp_start: *first,
            // At most u32::MAX - first + 1 ranks; add_worker bounds the span
            // by Limits::max_ranks_per_worker.
            dp_size: last - first + 1,
        };
        // Held while reporting, so `close` removes the worker either before
        // this registers it or after its last report.
        let mut state = lock(&self.state);
        if state.closed {
            return Ok(());
        }
        if state.registered.as_ref() != Some(&want) {
            if state.registered.take().is_some() {
                let _ = self.monitor.remove_worker(self.worker_id);
            }
            let spec = WorkerSpec {
                dp_start: want.dp_start,
                dp_size: want.dp_size,
                max_num_seqs: self.max_num_seqs,
                ..Default::default()
            };
            self.monitor
                .add_worker(&want.model, self.worker_id, spec)
                .map_err(|e| Failure::Refused(e.to_string()))?;
            state.registered = Some(want);
            state.gaps.clear();
        }
        for (rank, r) in &load.ranks {
            let report = LoadReport {
                kv_used_blocks: r.kv_used_blocks,
                kv_total_blocks: r.kv_total_blocks,
                waiting_requests: Some(r.waiting_requests),
                ..Default::default()
            };
            if let Err(e) = self.monitor.report(self.worker_id, *rank, &report) {
                // Removed by someone else: register again next time.
                state.registered = None;
                return Err(Failure::Refused(e.to_string()));
            }
            // The engine's own token gaps since the last scrape, for an
            // SLO's step fit.
            if let Some(now) = r.gaps {
                let mean = state
                    .gaps
                    .insert(*rank, now)
                    .and_then(|b| now.mean_since(&b));
                if let Some(mean) = mean {
                    self.monitor.observe_engine_gap(self.worker_id, *rank, mean);
                }
            }
        }
        Ok(())
    }

    fn record(&self, latency: Duration, outcome: Result<(), Failure>) {
        let mut s = lock(&self.stats);
        s.last_latency = latency;
        s.total_latency = s.total_latency.saturating_add(latency);
        match outcome {
            Ok(()) => s.scrapes += 1,
            Err(e) => {
                s.errors += 1;
                if let Some(i) = ERROR_KINDS.iter().position(|k| *k == e.kind()) {
                    s.errors_by_kind[i] += 1;
                }
                s.last_error = Some(e.to_string());
            }
        }
    }
}

/// One worker's running scrape. Dropping it stops the scrape and removes
/// the worker, as [`close`](Self::close) does.
#[derive(Debug)]
pub struct Scrape {
    shared: Arc<Shared>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl Scrape {
    /// Starts scraping `url` (`http://host[:port][/path]`; the path
    /// defaults to `/metrics`) as worker `worker_id` of `monitor`. `model`
    /// names the worker's model; `None` takes the engine's `model_name`
    /// label. Returns at once; the worker is registered on the first
    /// successful scrape.
    pub fn start(
        monitor: Arc<Monitor>,
        model: Option<&str>,
        worker_id: u64,
        url: &str,
        config: ScrapeConfig,
    ) -> Result<Scrape, ScrapeError> {
        config.validate()?;
        if model == Some("") {
            return Err(ScrapeError::Config("model must not be empty"));
        }
        let target = Target::parse(url)?;
        let shared = Arc::new(Shared {
            monitor,
            worker_id,
            model: model.map(str::to_owned),
            engine: config.engine,
            max_num_seqs: config.max_num_seqs,
            stats: Mutex::new(ScrapeStats::default()),
            state: Mutex::new(State::default()),
            made_in: ForkGuard::new(),
        });
        shared.monitor.scrapes.add(shared.clone());
        let task = runtime().spawn(run(shared.clone(), target, config));
        Ok(Scrape {
            shared,
            task: Some(task),
        })
    }

    /// The worker this scrape reports as.
    pub fn worker_id(&self) -> u64 {
        self.shared.worker_id
    }

    /// What the scrape has done so far. In a forked child, a scrape the
    /// parent started shows what it had done at the fork (all zero if the
    /// fork caught it updating them).
    pub fn stats(&self) -> ScrapeStats {
        self.shared.stats_now().0
    }

    /// Stops scraping and removes the worker from the monitor (if this
    /// scrape registered it). No report of this scrape lands after it
    /// returns. Calling it again does nothing.
    pub fn close(&mut self) {
        if let Some(task) = self.task.take() {
            if self.shared.made_in.same_process() {
                task.abort();
            } else {
                // A forked child: the task lives on the parent's runtime,
                // whose threads are not here; aborting would touch its
                // scheduler, whose locks the fork may have copied held.
                // The task never runs here, so it is simply let go.
                std::mem::forget(task);
            }
        }
        // In a forked child: nothing else touches the state here, unless
        // the fork caught the parent's task holding it; then the worker
        // stays in the child's copy of the monitor and turns stale there.
        let Some(mut state) = self.shared.lock_here(&self.shared.state) else {
            return;
        };
        state.closed = true;
        if state.registered.take().is_some() {
            let _ = self.shared.monitor.remove_worker(self.shared.worker_id);
        }
    }
}

impl Drop for Scrape {
    fn drop(&mut self) {
        self.close();
    }
}

async fn run(shared: Arc<Shared>, target: Target, config: ScrapeConfig) {
    let mut conn = Connection::default();
    let mut tick = tokio::time::interval(config.interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let start = Instant::now();
        let fetched =
            tokio::time::timeout(config.timeout, conn.get(&target, config.max_body_bytes)).await;
        let outcome = match fetched {
            Err(_) => {
                conn.close();
                Err(Failure::Timeout)
            }
            Ok(Err(e)) => {
                conn.close();
                Err(Failure::Fetch(e))
            }
            Ok(Ok(body)) => shared.apply(&body),
        };
        lock(&shared.stats).connections = conn.opened();
        shared.record(start.elapsed(), outcome);
    }
}
