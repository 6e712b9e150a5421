//! The monitor's metrics: refusal and rejection counters, and their
//! rendering in the Prometheus text format at scrape time (the cold path).
//!
//! Every counter read here is a `Relaxed` load: a counter orders nothing,
//! and a scrape racing an update shows the value just before or after it.

use std::sync::Arc;

use super::model::{EndpointCounter, Model, REJECTED_REASONS};
use super::rank::Worker;
use super::Monitor;
use crate::error::{Reason, ReportError, WorkerError};
use crate::metrics;
use crate::sync::{lock, Ordering};

impl Monitor {
    /// Load reports refused so far, by reason (`unknown_worker`,
    /// `undeclared_rank`, `invalid_value`).
    pub fn refused_reports(&self) -> [(&'static str, u64); 3] {
        std::array::from_fn(|i| {
            (
                ReportError::KINDS[i],
                self.refused[i].load(Ordering::Relaxed),
            )
        })
    }

    /// Registrations [`add_worker`](Self::add_worker) refused so far, by
    /// reason ([`WorkerError::ADD_KINDS`], zeros included).
    pub fn refused_registrations(&self) -> [(&'static str, u64); WorkerError::ADD_KINDS.len()] {
        std::array::from_fn(|i| {
            (
                WorkerError::ADD_KINDS[i],
                self.refused_workers[i].load(Ordering::Relaxed),
            )
        })
    }

    /// Rejections counted for `model`: `(reason, count)` for
    /// `all_workers_busy`, `worker_overloaded` and `no_workers`.
    pub fn rejections(&self, model: &str) -> Vec<(Reason, u64)> {
        let reg = self.registry.load();
        let Some(m) = reg.models.get(model) else {
            return Vec::new();
        };
        REJECTED_REASONS
            .iter()
            .zip(&m.rejected)
            .map(|(r, c)| (*r, c.load(Ordering::Relaxed)))
            .collect()
    }

    /// The frontend metrics in Prometheus text format.
    pub fn metrics_text(&self) -> String {
        let p = self.config.metrics_prefix.as_str();
        let reg = self.registry.load_full();
        let mut models: Vec<&Arc<Model>> = reg.models.values().collect();
        models.sort_unstable_by(|a, b| a.name.cmp(&b.name));
        let mut workers: Vec<&Arc<Worker>> = reg.workers.values().collect();
        workers.sort_unstable_by_key(|w| w.id);
        let mut out = String::new();

        metrics::header(
            &mut out,
            p,
            "frontend_model_rejection_total",
            "counter",
            "Requests rejected because the model's eligible workers were busy.",
        );
        for m in &models {
            let endpoints = m.endpoints.load();
            let mut endpoints: Vec<&Arc<EndpointCounter>> = endpoints.iter().collect();
            endpoints.sort_unstable_by(|a, b| a.endpoint.cmp(&b.endpoint));
            for c in endpoints {
                metrics::sample(
                    &mut out,
                    p,
                    "frontend_model_rejection_total",
                    &[("model", &m.name), ("endpoint", &c.endpoint)],
                    c.count.load(Ordering::Relaxed),
                );
            }
        }
        metrics::header(
            &mut out,
            p,
            "frontend_model_rejection_by_reason_total",
            "counter",
            "Routing rejections by reason.",
        );
        for m in &models {
            for (r, c) in REJECTED_REASONS.iter().zip(&m.rejected) {
                metrics::sample(
                    &mut out,
                    p,
                    "frontend_model_rejection_by_reason_total",
                    &[("model", &m.name), ("reason", &r.as_str())],
                    c.load(Ordering::Relaxed),
                );
            }
        }
        // Dynamo 1.6.1's family for the same refusals, summed over models,
        // in its classes and reasons (zeros included, so a scrape sees
        // every series from the start).
        metrics::header(
            &mut out,
            p,
            "frontend_failures_total",
            "counter",
            "Total number of terminal semantic request failures",
        );
        let mut failures = [0u64; REJECTED_REASONS.len()];
        for m in &models {
            for (total, c) in failures.iter_mut().zip(&m.rejected) {
                *total += c.load(Ordering::Relaxed);
            }
        }
        let mut series: Vec<_> = REJECTED_REASONS
            .iter()
            .zip(failures)
            .map(|(r, n)| (failure_class(*r), n))
            .collect();
        series.sort_unstable();
        for ((class, reason), n) in series {
            metrics::sample(
                &mut out,
                p,
                "frontend_failures_total",
                &[("class", &class), ("reason", &reason)],
                n,
            );
        }
        for (name, help, field) in [
            (
                "frontend_worker_active_decode_blocks",
                "Latest active decode blocks per worker rank.",
                0,
            ),
            (
                "frontend_worker_active_prefill_tokens",
                "Latest active prefill tokens per worker rank.",
                1,
            ),
            (
                "frontend_worker_waiting_requests",
                "Latest waiting requests per worker rank.",
                2,
            ),
        ] {
            metrics::header(&mut out, p, name, "gauge", help);
            for w in &workers {
                for (i, rank) in w.ranks.iter().enumerate() {
                    let l = rank.load();
                    let value = match field {
                        0 => Some(l.active_decode_blocks),
                        1 => l.active_prefill_tokens,
                        _ => l.waiting_requests,
                    };
                    if let Some(v) = value {
                        let dp_rank = w.dp_start + i as u32;
                        metrics::sample(
                            &mut out,
                            p,
                            name,
                            // Dynamo 1.6.1's labels, in its (sorted) order.
                            &[
                                ("dp_rank", &dp_rank),
                                ("worker_id", &w.id),
                                ("worker_type", &"decode"),
                            ],
                            v,
                        );
                    }
                }
            }
        }
        super::slo::render(&workers, self.observations_lost(), p, &mut out);
        for (name, help, kind) in [
            (
                "frontend_model_workers",
                "Registered workers per model.",
                "gauge",
            ),
            (
                "frontend_model_busy_workers",
                "Busy workers per model.",
                "gauge",
            ),
            (
                "frontend_model_threshold_version",
                "Version of the model's busy thresholds.",
                "gauge",
            ),
        ] {
            metrics::header(&mut out, p, name, kind, help);
            for m in &models {
                let v = match name {
                    "frontend_model_workers" => m.workers.load(Ordering::Relaxed) as u64,
                    "frontend_model_busy_workers" => m.busy_workers.load(Ordering::Relaxed) as u64,
                    _ => lock(&m.cold).thresholds.version,
                };
                metrics::sample(&mut out, p, name, &[("model", &m.name)], v);
            }
        }
        metrics::header(
            &mut out,
            p,
            "frontend_load_reports_refused_total",
            "counter",
            "Load reports refused, by reason.",
        );
        for (kind, count) in self.refused_reports() {
            metrics::sample(
                &mut out,
                p,
                "frontend_load_reports_refused_total",
                &[("reason", &kind)],
                count,
            );
        }
        let name = "frontend_worker_registrations_refused_total";
        metrics::header(
            &mut out,
            p,
            name,
            "counter",
            "Worker registrations refused, by reason.",
        );
        for (kind, count) in self.refused_registrations() {
            metrics::sample(&mut out, p, name, &[("reason", &kind)], count);
        }
        let flows = self.flows.load_full();
        let mut queues: Vec<_> = flows.iter().map(|(n, f)| (&**n, f.snapshot())).collect();
        queues.sort_unstable_by(|a, b| a.0.cmp(b.0));
        super::flow::render_metrics(&queues, p, &mut out);
        #[cfg(feature = "scrape")]
        self.scrapes.render(&mut out, p);
        self.more_families.render(&mut out, p);
        out
    }
}

/// The class and reason Dynamo 1.6.1 counts a frontend refusal under in
/// `dynamo_frontend_failures_total`.
fn failure_class(reason: Reason) -> (&'static str, &'static str) {
    match reason {
        Reason::NoWorkers | Reason::Closed => ("Unavailable", "backend.unavailable"),
        Reason::AllWorkersBusy => ("CapacityExhausted", "capacity.pool_exhausted"),
        _ => ("CapacityExhausted", "capacity.worker_overloaded"),
    }
}
