//! The gate's metrics in Prometheus text format: the reference's first
//! family (`rejection_request_total`, `engine_request`, `request_queue`),
//! loadgate's own detail, and the reference's newest `backend_admission_*`
//! family.

use std::fmt::Write as _;

use crate::error::Reason;
use crate::metrics;

use super::stats::GateStats;
use super::waits::{Waits, BUCKETS};

/// The reasons a gate rejects for.
const GATE_REASONS: [Reason; 4] = [
    Reason::WorkerAtCapacity,
    Reason::QueueTimeout,
    Reason::Closed,
    Reason::Displaced,
];

/// The gate's metrics (`AdmissionGate::metrics_text`) from its statistics
/// `s` and queue-wait histogram `waits`, each name prefixed with `p`.
pub(super) fn render(s: &GateStats, waits: &Waits, p: &str) -> String {
    let mut out = String::with_capacity(2048);
    metrics::header(
        &mut out,
        p,
        "rejection_request_total",
        "counter",
        "Requests rejected by the worker admission gate.",
    );
    metrics::sample(
        &mut out,
        p,
        "rejection_request_total",
        &[],
        s.rejected_total(),
    );
    metrics::header(
        &mut out,
        p,
        "engine_request",
        "gauge",
        "Requests holding an engine slot.",
    );
    metrics::sample(&mut out, p, "engine_request", &[], s.running);
    metrics::header(
        &mut out,
        p,
        "request_queue",
        "gauge",
        "Requests waiting for a slot.",
    );
    metrics::sample(&mut out, p, "request_queue", &[], s.queued);
    metrics::header(
        &mut out,
        p,
        "engine_request_limit",
        "gauge",
        "Engine slots (N).",
    );
    metrics::sample(&mut out, p, "engine_request_limit", &[], s.limit);
    metrics::header(
        &mut out,
        p,
        "request_queue_limit",
        "gauge",
        "Queue size (Q).",
    );
    metrics::sample(&mut out, p, "request_queue_limit", &[], s.queue_limit);
    let name = "request_admitted_total";
    metrics::header(&mut out, p, name, "counter", "Requests admitted, by path.");
    metrics::sample(&mut out, p, name, &[("path", &"direct")], s.admitted_direct);
    metrics::sample(&mut out, p, name, &[("path", &"queued")], s.admitted_queued);
    let name = "request_rejection_by_reason_total";
    metrics::header(
        &mut out,
        p,
        name,
        "counter",
        "Requests rejected, by reason.",
    );
    for reason in GATE_REASONS {
        metrics::sample(
            &mut out,
            p,
            name,
            &[("reason", &reason.as_str())],
            s.rejected(reason),
        );
    }
    let name = "request_cancelled_total";
    metrics::header(
        &mut out,
        p,
        name,
        "counter",
        "Requests that left the queue unserved.",
    );
    metrics::sample(&mut out, p, name, &[], s.cancelled);
    let name = "request_queue_expired_total";
    metrics::header(
        &mut out,
        p,
        name,
        "counter",
        "Requests rejected by the queue deadline.",
    );
    metrics::sample(&mut out, p, name, &[], s.expired);
    render_wait_histogram(waits, p, &mut out);
    render_classes(s, p, &mut out);
    render_backend_admission(s, p, &mut out);
    out
}

/// Per priority class (label `class`, 0 the most important): queued
/// requests, queue limit and rejections by reason. A gate without classes
/// shows its one class 0.
fn render_classes(s: &GateStats, p: &str, out: &mut String) {
    let mut class = String::new();
    let label = |class: &mut String, k: usize| {
        class.clear();
        let _ = write!(class, "{k}");
    };
    let name = "request_queue_by_class";
    metrics::header(
        out,
        p,
        name,
        "gauge",
        "Requests waiting, by priority class.",
    );
    for (k, c) in s.classes().iter().enumerate() {
        label(&mut class, k);
        metrics::sample(out, p, name, &[("class", &class)], c.queued);
    }
    let name = "request_queue_limit_by_class";
    metrics::header(out, p, name, "gauge", "Queue size, by priority class.");
    for (k, c) in s.classes().iter().enumerate() {
        label(&mut class, k);
        metrics::sample(out, p, name, &[("class", &class)], c.queue_limit);
    }
    let name = "request_rejection_by_class_total";
    metrics::header(
        out,
        p,
        name,
        "counter",
        "Requests rejected, by priority class and reason.",
    );
    for (k, c) in s.classes().iter().enumerate() {
        label(&mut class, k);
        for (reason, n) in GATE_REASONS.into_iter().zip([
            c.rejected_at_capacity,
            c.expired,
            c.rejected_closed,
            c.displaced,
        ]) {
            metrics::sample(
                out,
                p,
                name,
                &[("class", &class), ("reason", &reason.as_str())],
                n,
            );
        }
    }
}

/// The reference's newest family, `{prefix}_backend_admission_*`. Every
/// counter is a sum of monotonic counters, never derived from a gauge.
fn render_backend_admission(s: &GateStats, p: &str, out: &mut String) {
    let gauges: [(&str, &str, u32); 3] = [
        (
            "backend_admission_engine_request_count",
            "Admitted requests holding an engine slot.",
            s.running,
        ),
        (
            "backend_admission_engine_wait_count",
            "Admitted requests without their first response (0 without a wait limit).",
            s.waiting,
        ),
        (
            "backend_admission_request_queue_count",
            "Requests waiting in the admission queue.",
            s.queued,
        ),
    ];
    for (name, help, value) in gauges {
        metrics::header(out, p, name, "gauge", help);
        metrics::sample(out, p, name, &[], value);
    }
    let name = "backend_admission_request_receive_total";
    metrics::header(out, p, name, "counter", "Admission attempts received.");
    metrics::sample(out, p, name, &[], s.received);
    let name = "backend_admission_request_admit_total";
    metrics::header(out, p, name, "counter", "Requests admitted, by source.");
    metrics::sample(out, p, name, &[("source", &"direct")], s.admitted_direct);
    metrics::sample(out, p, name, &[("source", &"queue")], s.admitted_queued);
    let name = "backend_admission_rejection_total";
    metrics::header(out, p, name, "counter", "Requests rejected (every reason).");
    metrics::sample(out, p, name, &[], s.rejected_total());
    let name = "backend_admission_cancellation_total";
    metrics::header(
        out,
        p,
        name,
        "counter",
        "Requests that left the queue unserved.",
    );
    metrics::sample(out, p, name, &[], s.cancelled);
}

fn render_wait_histogram(waits: &Waits, p: &str, out: &mut String) {
    let waits = waits.read();
    let (counts, total, sum_nanos) = (waits.cumulative, waits.total, waits.sum_nanos);
    let name = "request_queue_wait_seconds";
    metrics::header(
        out,
        p,
        name,
        "histogram",
        "Time admitted requests spent queued.",
    );
    let bucket = format!("{name}_bucket");
    let mut le = String::new();
    for (bound, count) in BUCKETS.iter().zip(counts) {
        le.clear();
        let _ = write!(le, "{bound}");
        metrics::sample(out, p, &bucket, &[("le", &le)], count);
    }
    metrics::sample(out, p, &bucket, &[("le", &"+Inf")], total);
    metrics::sample(out, p, &format!("{name}_sum"), &[], sum_nanos as f64 / 1e9);
    metrics::sample(out, p, &format!("{name}_count"), &[], total);
}
