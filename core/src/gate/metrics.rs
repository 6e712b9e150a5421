//! The gate's metrics in Prometheus text format: the reference's first
//! family (`rejection_request_total`, `engine_request`, `request_queue`),
//! loadgate's own detail, and the reference's newest `backend_admission_*`
//! family.

use std::fmt::{Display, Write as _};

use crate::error::Reason;
use crate::metrics;

use super::stats::GateStats;
use super::waits::Waits;

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
    let o = &mut out;
    let families: [(&str, &str, &str, u64); 5] = [
        (
            "rejection_request_total",
            "counter",
            "Requests rejected by the worker admission gate.",
            s.rejected_total(),
        ),
        (
            "engine_request",
            "gauge",
            "Requests holding an engine slot.",
            s.running.into(),
        ),
        (
            "request_queue",
            "gauge",
            "Requests waiting for a slot.",
            s.queued.into(),
        ),
        (
            "engine_request_limit",
            "gauge",
            "Engine slots (N).",
            s.limit.into(),
        ),
        (
            "request_queue_limit",
            "gauge",
            "Queue size (Q).",
            s.queue_limit.into(),
        ),
    ];
    for (name, kind, help, value) in families {
        single(o, p, name, kind, help, value);
    }
    let name = "request_admitted_total";
    metrics::header(o, p, name, "counter", "Requests admitted, by path.");
    metrics::sample(o, p, name, &[("path", &"direct")], s.admitted_direct);
    metrics::sample(o, p, name, &[("path", &"queued")], s.admitted_queued);
    let name = "request_rejection_by_reason_total";
    metrics::header(o, p, name, "counter", "Requests rejected, by reason.");
    for reason in GATE_REASONS {
        let value = s.rejected(reason);
        metrics::sample(o, p, name, &[("reason", &reason.as_str())], value);
    }
    let name = "request_cancelled_total";
    single(o, p, name, "counter", UNSERVED, s.cancelled);
    let help = "Requests rejected by the queue deadline.";
    single(
        o,
        p,
        "request_queue_expired_total",
        "counter",
        help,
        s.expired,
    );
    render_wait_histogram(waits, p, o);
    render_classes(s, p, o);
    render_backend_admission(s, p, o);
    out
}

/// The help text of both families that count cancellations.
const UNSERVED: &str = "Requests that left the queue unserved.";

/// A family of one unlabelled sample.
fn single(out: &mut String, p: &str, name: &str, kind: &str, help: &str, value: u64) {
    metrics::header(out, p, name, kind, help);
    metrics::sample(out, p, name, &[], value);
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
    let help = "Requests waiting, by priority class.";
    metrics::header(out, p, name, "gauge", help);
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
    let help = "Requests rejected, by priority class and reason.";
    metrics::header(out, p, name, "counter", help);
    for (k, c) in s.classes().iter().enumerate() {
        label(&mut class, k);
        for (reason, n) in GATE_REASONS.into_iter().zip([
            c.rejected_at_capacity,
            c.expired,
            c.rejected_closed,
            c.displaced,
        ]) {
            let labels: [(&str, &dyn Display); 2] =
                [("class", &class), ("reason", &reason.as_str())];
            metrics::sample(out, p, name, &labels, n);
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
        single(out, p, name, "gauge", help, value.into());
    }
    let name = "backend_admission_request_receive_total";
    single(
        out,
        p,
        name,
        "counter",
        "Admission attempts received.",
        s.received,
    );
    let name = "backend_admission_request_admit_total";
    metrics::header(out, p, name, "counter", "Requests admitted, by source.");
    metrics::sample(out, p, name, &[("source", &"direct")], s.admitted_direct);
    metrics::sample(out, p, name, &[("source", &"queue")], s.admitted_queued);
    let name = "backend_admission_rejection_total";
    let help = "Requests rejected (every reason).";
    single(out, p, name, "counter", help, s.rejected_total());
    let name = "backend_admission_cancellation_total";
    single(out, p, name, "counter", UNSERVED, s.cancelled);
}

fn render_wait_histogram(waits: &Waits, p: &str, out: &mut String) {
    let waits = waits.read();
    let name = "request_queue_wait_seconds";
    let help = "Time admitted requests spent queued.";
    metrics::header(out, p, name, "histogram", help);
    let (cumulative, total, sum) = (&waits.cumulative, waits.total, waits.sum_nanos);
    metrics::wait_histogram(out, p, name, &[], cumulative, total, sum);
}
