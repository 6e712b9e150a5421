//! What scrapes count, and their families in a monitor's metrics text:
//! the monitor holds its scrapes here, weakly, through [`Source`], so that
//! it knows nothing of how a scrape runs.

use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use crate::metrics;

/// A running scrape, as the metrics see it.
pub(crate) trait Source: Send + Sync + std::fmt::Debug {
    /// The worker it scrapes.
    fn worker_id(&self) -> u64;
    /// Its statistics, and whether it was closed.
    fn snapshot(&self) -> (ScrapeStats, bool);
    /// Whether it runs in this process (a forked child's copy does not).
    fn same_process(&self) -> bool;
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Failed scrapes by cause, in [`ScrapeStats::errors_by_kind`] order.
pub const ERROR_KINDS: [&str; 8] = [
    "connect",
    "timeout",
    "http",
    "too_large",
    "malformed",
    "missing",
    "too_many_ranks",
    "refused",
];

/// What one worker's scrape has done so far.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ScrapeStats {
    /// Successful scrapes (applied to the monitor).
    pub scrapes: u64,
    /// Failed scrapes, every cause.
    pub errors: u64,
    /// Failed scrapes by cause, in [`ERROR_KINDS`] order.
    pub errors_by_kind: [u64; ERROR_KINDS.len()],
    /// HTTP connections opened (1 while the first one lasts).
    pub connections: u64,
    /// Whether the worker is registered in the monitor now.
    pub registered: bool,
    /// Duration of the last scrape, successful or not.
    pub last_latency: Duration,
    /// Total duration of all scrapes (divide by `scrapes + errors`).
    pub total_latency: Duration,
    /// Why the last failed scrape failed.
    pub last_error: Option<String>,
}

/// A monitor's scrapes, held weakly, so that its `metrics_text` renders
/// theirs: a scrape that is closed or dropped leaves the text. Locked only
/// when a scrape starts and when metrics are rendered.
#[derive(Debug, Default)]
pub(crate) struct Registered(Mutex<Vec<Weak<dyn Source>>>);

impl Registered {
    pub(super) fn add(&self, scrape: Arc<dyn Source>) {
        let mut all = lock(&self.0);
        all.retain(|s| s.upgrade().is_some_and(|s| s.same_process()));
        all.push(Arc::downgrade(&scrape));
    }

    /// Appends the running scrapes' families, under `prefix`:
    /// `frontend_scrapes_total{worker_id,outcome}` (`ok` or the failure's
    /// [`ERROR_KINDS`] name), `frontend_scrape_duration_seconds{worker_id}`
    /// (a summary: `_sum` and `_count`) and
    /// `frontend_scrape_registered{worker_id}`. Two scrapes reporting as one
    /// worker id are summed into one series. A forked child leaves out the
    /// parent's scrapes, which do not run there.
    pub(crate) fn render(&self, out: &mut String, prefix: &str) {
        let mut workers: Vec<(u64, ScrapeStats)> = Vec::new();
        let running = lock(&self.0)
            .iter()
            .filter_map(Weak::upgrade)
            .filter(|s| s.same_process())
            .collect::<Vec<_>>();
        for shared in running {
            let (stats, closed) = shared.snapshot();
            if !closed {
                workers.push((shared.worker_id(), stats));
            }
        }
        workers.sort_unstable_by_key(|(id, _)| *id);
        workers.dedup_by(|(id, later), (kept_id, kept)| {
            let same = id == kept_id;
            if same {
                kept.add(later);
            }
            same
        });
        let name = "frontend_scrapes_total";
        metrics::header(
            out,
            prefix,
            name,
            "counter",
            "Engine metrics scrapes, by outcome: ok or why it failed.",
        );
        for (id, s) in &workers {
            metrics::sample(
                out,
                prefix,
                name,
                &[("worker_id", id), ("outcome", &"ok")],
                s.scrapes,
            );
            for (kind, n) in ERROR_KINDS.iter().zip(s.errors_by_kind) {
                metrics::sample(
                    out,
                    prefix,
                    name,
                    &[("worker_id", id), ("outcome", kind)],
                    n,
                );
            }
        }
        let name = "frontend_scrape_duration_seconds";
        metrics::header(
            out,
            prefix,
            name,
            "summary",
            "Time each engine metrics scrape took, successful or not.",
        );
        for (id, s) in &workers {
            let labels: &[(&str, &dyn fmt::Display)] = &[("worker_id", id)];
            let sum = format!("{name}_sum");
            metrics::sample(out, prefix, &sum, labels, s.total_latency.as_secs_f64());
            let count = format!("{name}_count");
            metrics::sample(out, prefix, &count, labels, s.scrapes + s.errors);
        }
        let name = "frontend_scrape_registered";
        metrics::header(
            out,
            prefix,
            name,
            "gauge",
            "1 while a scraped worker is registered in the monitor.",
        );
        for (id, s) in &workers {
            metrics::sample(
                out,
                prefix,
                name,
                &[("worker_id", id)],
                u8::from(s.registered),
            );
        }
    }
}

impl ScrapeStats {
    /// Adds `other`'s counts to these (the last values stay).
    fn add(&mut self, other: &ScrapeStats) {
        self.scrapes += other.scrapes;
        self.errors += other.errors;
        for (a, b) in self.errors_by_kind.iter_mut().zip(other.errors_by_kind) {
            *a += b;
        }
        self.connections += other.connections;
        self.registered |= other.registered;
        self.total_latency = self.total_latency.saturating_add(other.total_latency);
    }
}
