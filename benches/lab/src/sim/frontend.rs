//! The client and the frontend of a run: sends and retries, the arm's
//! routing decision, rejections heard, clients giving up, and how a request
//! ends.

use super::{ns, Ev, Sim, Stage, QUEUE_DEADLINE};
use crate::arm::ArmKind;
use crate::engine::Engine;
use crate::record::{End, Life};
use crate::workload::Retry;

/// Client-side adaptive throttling state (SRE book), one per run.
pub(super) struct Throttle {
    k: f64,
    window_ns: u64,
    events: std::collections::VecDeque<(u64, bool)>,
    requests: f64,
    accepts: f64,
}

impl Throttle {
    /// No history yet; rejects with `k` over a window of `window_ns`.
    pub(super) fn new(k: f64, window_ns: u64) -> Self {
        Self {
            k,
            window_ns,
            events: Default::default(),
            requests: 0.0,
            accepts: 0.0,
        }
    }

    pub(super) fn reject_probability(&mut self, now: u64) -> f64 {
        while let Some(&(t, accepted)) = self.events.front() {
            if t + self.window_ns > now {
                break;
            }
            self.events.pop_front();
            self.requests -= 1.0;
            if accepted {
                self.accepts -= 1.0;
            }
        }
        ((self.requests - self.k * self.accepts) / (self.requests + 1.0)).max(0.0)
    }

    pub(super) fn record(&mut self, now: u64, accepted: bool) {
        self.events.push_back((now, accepted));
        self.requests += 1.0;
        if accepted {
            self.accepts += 1.0;
        }
    }
}

impl Sim<'_> {
    // ----- the client and the frontend ------------------------------------

    pub(super) fn send(&mut self, id: u32) {
        let now = self.now;
        let r = &mut self.reqs[id as usize];
        if r.stage == Stage::Done {
            return;
        }
        r.attempt += 1;
        r.attempt_send = now;
        r.hops = 0;
        let attempt = r.attempt;
        self.rec.attempt(r.spec.at_ns);
        if let Some(t) = &mut self.throttle {
            let p = t.reject_probability(now);
            // The request's own draw decides, so that arms see the same
            // client.
            let draw = (r.spec.jitter * 7919.0 * f64::from(attempt)).fract();
            if draw < p {
                t.record(now, false);
                r.stage = Stage::Backoff;
                self.at(
                    now,
                    Ev::Heard(id, attempt, None, "client: throttled locally"),
                );
                return;
            }
        }
        self.dispatch(id, attempt);
    }

    /// The frontend routes an attempt: to a worker, or back to the client
    /// with a rejection. An arm with a monitor asks it (`flow.rs`).
    pub(super) fn dispatch(&mut self, id: u32, attempt: u32) {
        if self.arm.kind.uses_monitor() {
            return self.dispatch_monitor(id, attempt);
        }
        let now = self.now;
        match self.route() {
            Ok((worker, rank)) => {
                let r = &mut self.reqs[id as usize];
                r.worker = worker;
                r.rank = rank;
                r.hops += 1;
                r.stage = Stage::Travelling;
                self.at(now + ns(self.c.net_delay_s), Ev::AtWorker(id, attempt));
            }
            Err((retry_after, why)) => {
                self.reqs[id as usize].stage = Stage::Backoff;
                self.at(now, Ev::Heard(id, attempt, retry_after, why));
            }
        }
    }

    /// The frontend decision of an arm without a monitor (not loadgate's):
    /// a worker and rank, or a rejection with the `Retry-After` it carries.
    fn route(&mut self) -> Result<(u32, u32), (Option<f64>, &'static str)> {
        let n = self.workers.len() as u32;
        match self.arm.kind {
            ArmKind::TokenBucket => {
                let rate = self.arm.bucket_rate.unwrap_or(f64::INFINITY);
                // A token bucket of one tenth of a second of capacity.
                let depth = (rate * 0.1).max(1.0);
                let (tokens, last) = self.bucket;
                let tokens = (tokens + rate * (self.now - last) as f64 / 1e9).min(depth);
                if tokens < 1.0 {
                    self.bucket = (tokens, self.now);
                    return Err((Some(1.0), "frontend: over capacity"));
                }
                self.bucket = (tokens - 1.0, self.now);
                let w = (0..n)
                    .min_by_key(|&w| {
                        let worker = &self.workers[w as usize];
                        worker.ranks.iter().map(Engine::len).sum::<u64>()
                    })
                    .unwrap_or(0);
                Ok((w, self.shortest_rank(w)))
            }
            _ => {
                let w = self.rr % n;
                self.rr = self.rr.wrapping_add(1);
                Ok((w, self.shortest_rank(w)))
            }
        }
    }

    pub(super) fn shortest_rank(&self, w: u32) -> u32 {
        let ranks = &self.workers[w as usize].ranks;
        (0..ranks.len() as u32)
            .min_by_key(|&r| ranks[r as usize].len())
            .unwrap_or(0)
    }

    /// The client hears a rejection of `attempt`.
    pub(super) fn heard(
        &mut self,
        id: u32,
        attempt: u32,
        retry_after: Option<f64>,
        why: &'static str,
    ) {
        let now = self.now;
        let client = self.workload.client;
        let r = &mut self.reqs[id as usize];
        if r.stage == Stage::Done || r.attempt != attempt {
            return;
        }
        if !why.starts_with("client:") {
            self.refusals_heard += 1;
        }
        self.let_go(id);
        let r = &mut self.reqs[id as usize];
        let first = r.spec.at_ns;
        let waited = now - r.attempt_send;
        let network = u64::from(r.hops) * 2 * ns(self.c.net_delay_s);
        let priority = r.spec.priority;
        let jitter = r.spec.jitter;
        // A queue's deadline refusal heard with no time beyond the network:
        // the request was refused as predicted late, never waited.
        let why = if why == QUEUE_DEADLINE && waited <= network {
            "frontend queue: predicted late"
        } else {
            why
        };
        self.rec.rejection(
            first,
            now,
            waited,
            waited.saturating_sub(network),
            priority,
            why,
        );
        if let Some(t) = &mut self.throttle {
            t.record(now, false);
        }
        let retries = attempt - 1;
        let delay = match client.retry {
            Retry::Never => None,
            _ if retries >= client.max_retries => None,
            Retry::Immediate => Some(0.0),
            Retry::AfterRetryAfter | Retry::Adaptive { .. } => {
                Some(retry_after.unwrap_or_else(|| {
                    0.5 * f64::from(1u32 << retries.min(8)) * (0.75 + 0.5 * jitter)
                }))
            }
        };
        match delay {
            Some(d) => {
                self.reqs[id as usize].stage = Stage::Backoff;
                self.at(now + ns(d), Ev::Send(id));
            }
            None => self.finish(id, End::Rejected),
        }
    }

    pub(super) fn give_up(&mut self, id: u32) {
        let r = &mut self.reqs[id as usize];
        if r.stage == Stage::Done || r.first_token != 0 || r.stage == Stage::NotSent {
            return;
        }
        let (w, rank) = (r.worker as usize, r.rank as usize);
        match r.stage {
            Stage::Waiting => r.waiting = None,
            Stage::Queued => {
                if let Some(t) = r.ticket.take() {
                    t.cancel();
                }
            }
            Stage::Running => {
                self.workers[w].ranks[rank].abort(u64::from(id));
            }
            _ => {}
        }
        self.finish(id, End::Cancelled);
    }

    /// Ends a request: drops its permit (which may hand the slot on) and
    /// booking, and records how it ended.
    pub(super) fn finish(&mut self, id: u32, end: End) {
        let now = self.now;
        let r = &mut self.reqs[id as usize];
        r.stage = Stage::Done;
        r.ticket = None;
        // A completed request's dispatch learns its answer's length.
        if let (End::Completed, Some(d)) = (end, r.dispatch.take()) {
            d.complete(u64::from(r.spec.output));
            if self.arm.slo {
                self.slo_completed(id);
            }
        }
        self.let_go(id);
        let r = &mut self.reqs[id as usize];
        let permit = r.permit.take();
        let life = Life {
            first_send_ns: r.spec.at_ns,
            attempt_send_ns: r.attempt_send,
            first_token_ns: r.first_token,
            last_token_ns: r.last_token,
            output: r.spec.output,
            prompt: r.spec.prompt,
            tenant: r.spec.tenant,
        };
        let worker = r.worker;
        self.rec.end(end, &life, now);
        if permit.is_some() {
            drop(permit);
            self.drain_inbox();
            self.schedule_expiry(worker);
        }
    }
}
