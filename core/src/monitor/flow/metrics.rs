//! What a model's frontend queue counts, kept under its lock beside the
//! queue (`control.rs`), and its metrics at scrape time: requests and tokens
//! waiting, dispatches by path, refusals by reason and priority band, the
//! queue wait as a histogram, and the top tenants' service (only the top
//! [`TOP_TENANTS`], so that label cardinality stays bounded whatever ids
//! clients send).

use crate::flow::{FlowRejection, MAX_BANDS};
use crate::metrics::{self, WAIT_BUCKETS};

/// Tenants shown in the per-tenant families, by weighted service.
pub const TOP_TENANTS: usize = 10;

/// The refusals counted, in the order of their rows.
const REFUSALS: [FlowRejection; 5] = [
    FlowRejection::QueueFull,
    FlowRejection::QueueDeadline,
    FlowRejection::NoWorkers,
    FlowRejection::AllWorkersBusy,
    FlowRejection::InvalidTenant,
];

/// See the module docs.
#[derive(Debug, Default, Clone)]
pub(crate) struct FlowStats {
    /// Sent at once, and sent from the queue.
    dispatched: [u64; 2],
    /// Refusals, by [`REFUSALS`] row and priority band.
    refused: [[u64; MAX_BANDS]; REFUSALS.len()],
    /// Waits of the requests sent from the queue, by bucket (not
    /// cumulative; the last past every bound), and their sum.
    waits: [u64; WAIT_BUCKETS.len() + 1],
    wait_nanos: u64,
}

impl FlowStats {
    /// A request sent at once.
    pub(super) fn sent_at_once(&mut self) {
        self.dispatched[0] += 1;
    }

    /// A request sent after waiting `nanos`.
    pub(super) fn sent_from_queue(&mut self, nanos: u64) {
        self.dispatched[1] += 1;
        let secs = nanos as f64 / 1e9;
        let bucket = WAIT_BUCKETS.partition_point(|&b| b < secs);
        self.waits[bucket] += 1;
        self.wait_nanos = self.wait_nanos.saturating_add(nanos);
    }

    /// A request of priority band `band` refused for `why`.
    pub(super) fn refused(&mut self, why: FlowRejection, band: usize) {
        let row = REFUSALS.iter().position(|r| *r == why).unwrap_or(0);
        self.refused[row][band.min(MAX_BANDS - 1)] += 1;
    }
}

/// What one model's queue shows at scrape time, read under its lock at
/// once (`FlowControl::snapshot`).
pub(crate) struct Snapshot {
    pub(crate) requests: u32,
    pub(crate) tokens: u128,
    pub(crate) stats: FlowStats,
    /// The top tenants: id, weighted service, requests waiting.
    pub(crate) top: Vec<(String, f64, u32)>,
}

/// The flow-control families for `queues`, each model's name and queue
/// (nothing when no model has one).
pub(crate) fn render(queues: &[(&str, Snapshot)], p: &str, out: &mut String) {
    if queues.is_empty() {
        // A monitor without flow control shows none of its families.
        return;
    }
    let gauges = [
        (
            "frontend_queue_requests",
            "Requests waiting in the model's queue.",
        ),
        (
            "frontend_queue_tokens",
            "Estimated tokens waiting in the model's queue (prompt plus reserved output).",
        ),
    ];
    for (i, (name, help)) in gauges.into_iter().enumerate() {
        metrics::header(out, p, name, "gauge", help);
        for (model, q) in queues {
            let value = if i == 0 {
                u128::from(q.requests)
            } else {
                q.tokens
            };
            metrics::sample(out, p, name, &[("model", model)], value);
        }
    }
    let name = "frontend_queue_dispatched_total";
    let help = "Requests sent to a worker, at once or from the queue.";
    metrics::header(out, p, name, "counter", help);
    for (model, q) in queues {
        let d = q.stats.dispatched;
        for (path, n) in [("direct", d[0]), ("queued", d[1])] {
            metrics::sample(out, p, name, &[("model", model), ("path", &path)], n);
        }
    }
    let name = "frontend_queue_rejection_total";
    let help = "Requests refused by the model's queue, by reason and priority band.";
    metrics::header(out, p, name, "counter", help);
    for (model, q) in queues {
        for (why, bands) in REFUSALS.iter().zip(q.stats.refused) {
            for (band, n) in bands.iter().enumerate() {
                let labels: [(&str, &dyn std::fmt::Display); 3] = [
                    ("model", model),
                    ("reason", &why.as_str()),
                    ("priority", &band),
                ];
                metrics::sample(out, p, name, &labels, n);
            }
        }
    }
    let name = "frontend_queue_wait_seconds";
    let help = "Time requests sent from the model's queue spent waiting.";
    metrics::header(out, p, name, "histogram", help);
    for (model, q) in queues {
        let (waits, sum) = (q.stats.waits, q.stats.wait_nanos);
        let mut cumulative = [0u64; WAIT_BUCKETS.len()];
        let mut running = 0;
        for (c, n) in cumulative.iter_mut().zip(waits) {
            running += n;
            *c = running;
        }
        let total = waits.iter().sum();
        metrics::wait_histogram(out, p, name, &[("model", model)], &cumulative, total, sum);
    }
    let families = [
        (
            "frontend_queue_tenant_service",
            "Weighted tokens served to each of the top tenants (its virtual token counter).",
        ),
        (
            "frontend_queue_tenant_requests",
            "Requests of each of the top tenants waiting.",
        ),
    ];
    for (i, (name, help)) in families.into_iter().enumerate() {
        metrics::header(out, p, name, "gauge", help);
        for (model, q) in queues {
            for (tenant, service, waiting) in &q.top {
                let labels: [(&str, &dyn std::fmt::Display); 2] =
                    [("model", model), ("tenant", tenant)];
                if i == 0 {
                    metrics::sample(out, p, name, &labels, service);
                } else {
                    metrics::sample(out, p, name, &labels, waiting);
                }
            }
        }
    }
}
