//! The workers of a run: the gate's admission (callback form) and its
//! outcomes, the engines' steps and tokens, and the load each worker
//! publishes.

use loadgate::{AdmitError, LoadReport};

use super::{ns, Ev, Sim, Stage};
use crate::engine::EngineRequest;
use crate::record::End;

impl Sim<'_> {
    // ----- the worker -------------------------------------------------------

    pub(super) fn at_worker(&mut self, id: u32, attempt: u32) {
        let r = &self.reqs[id as usize];
        if r.stage != Stage::Travelling || r.attempt != attempt {
            return;
        }
        let (w, priority) = (r.worker, r.spec.priority);
        match self.workers[w as usize].gate.clone() {
            Some(gate) => {
                self.reqs[id as usize].stage = Stage::Queued;
                let inbox = self.inbox.clone();
                let ticket = gate.admit_with_callback_at(
                    priority,
                    Box::new(move |outcome| {
                        inbox.lock().expect("inbox").push((id, attempt, outcome));
                    }),
                );
                self.reqs[id as usize].ticket = Some(ticket);
                self.drain_inbox();
                self.schedule_expiry(w);
            }
            None => self.enter_engine(id),
        }
    }

    /// Handles every gate outcome the last gate call produced (and those
    /// that handling them produced in turn).
    pub(super) fn drain_inbox(&mut self) {
        loop {
            let batch = std::mem::take(&mut *self.inbox.lock().expect("inbox"));
            if batch.is_empty() {
                return;
            }
            for (id, attempt, outcome) in batch {
                let r = &mut self.reqs[id as usize];
                let current = r.attempt == attempt && r.stage == Stage::Queued;
                match outcome {
                    Ok(permit) if current => {
                        r.permit = Some(permit);
                        r.ticket = None;
                        self.enter_engine(id);
                    }
                    // A stale grant: the permit is dropped here, handing on.
                    Ok(_) => {}
                    Err(e) if current => {
                        r.ticket = None;
                        let why = match e {
                            AdmitError::AtCapacity => "worker gate: at capacity",
                            AdmitError::QueueTimeout | AdmitError::TimedOut => {
                                "worker gate: queue deadline"
                            }
                            AdmitError::Displaced => "worker gate: displaced",
                            AdmitError::Closed => "worker gate: closed",
                        };
                        // A request the worker never started goes back to
                        // the frontend, which hands it to its monitor
                        // (`Monitor::redispatch`: a lease on this worker,
                        // then another worker or the queue, or a 529).
                        if r.dispatch.is_some() && e != AdmitError::Closed {
                            r.stage = Stage::Travelling;
                            r.refused_by = Some(why);
                            self.at(self.now + ns(self.c.net_delay_s), Ev::Reroute(id, attempt));
                            continue;
                        }
                        r.stage = Stage::Backoff;
                        let retry_after = self.arm.retry_after_s;
                        self.at(
                            self.now + ns(self.c.net_delay_s),
                            Ev::Heard(id, attempt, retry_after, why),
                        );
                    }
                    Err(_) => {}
                }
            }
        }
    }

    pub(super) fn schedule_expiry(&mut self, w: u32) {
        let worker = &mut self.workers[w as usize];
        let Some(g) = &worker.gate else { return };
        if let Some(at) = g.next_deadline() {
            if worker.expire_at.is_none_or(|t| at < t) {
                worker.expire_at = Some(at);
                self.at(at.max(self.now), Ev::Expire(w));
            }
        }
    }

    pub(super) fn enter_engine(&mut self, id: u32) {
        let now = self.now;
        let r = &mut self.reqs[id as usize];
        let (w, rank) = (r.worker, r.rank);
        let request = EngineRequest {
            id: u64::from(id),
            prompt: r.spec.prompt,
            output: r.spec.output,
        };
        r.stage = Stage::Running;
        self.rec.admitted(now, r.spec.priority, r.spec.at_ns);
        if !self.workers[w as usize].ranks[rank as usize].add(request) {
            // Longer than the engine can ever hold: refused (none of the
            // workload's requests are).
            self.finish(id, End::Rejected);
            return;
        }
        self.kick(w, rank);
    }

    pub(super) fn kick(&mut self, w: u32, rank: u32) {
        let worker = &mut self.workers[w as usize];
        if worker.stepping[rank as usize] {
            return;
        }
        if let Some(d) = worker.ranks[rank as usize].begin_step() {
            worker.stepping[rank as usize] = true;
            self.at(self.now + d, Ev::StepEnd(w, rank));
        }
    }

    pub(super) fn step_end(&mut self, w: u32, rank: u32) {
        let now = self.now;
        let mut tokens = std::mem::take(&mut self.tokens);
        tokens.clear();
        {
            let worker = &mut self.workers[w as usize];
            worker.stepping[rank as usize] = false;
            worker.ranks[rank as usize].end_step(&mut tokens);
        }
        let block = self.c.engine.block_size;
        for t in &tokens {
            let id = t.id as u32;
            let r = &mut self.reqs[id as usize];
            if r.stage != Stage::Running {
                continue;
            }
            if let Some(d) = &mut r.dispatch {
                if t.generated == 1 {
                    d.prefill_done();
                }
                d.report_output(1);
                if (r.spec.prompt + t.generated) % block == 0 {
                    d.add_output_blocks(1);
                }
            }
            if t.generated == 1 && self.arm.slo {
                self.slo_first_token(id);
            }
            let r = &mut self.reqs[id as usize];
            if t.generated == 1 {
                r.first_token = now;
                if let Some(p) = &r.permit {
                    p.first_response();
                }
                if let Some(th) = &mut self.throttle {
                    th.record(now, true);
                }
            } else {
                let gap = now - r.last_token;
                self.rec.token_gap(r.spec.at_ns, gap);
            }
            r.last_token = now;
            if t.finished {
                self.finish(id, End::Completed);
            }
        }
        self.tokens = tokens;
        self.kick(w, rank);
    }

    pub(super) fn report(&mut self, w: u32) {
        let worker = &self.workers[w as usize];
        if let Some(p) = &worker.publisher {
            for (rank, e) in worker.ranks.iter().enumerate() {
                let s = e.signals();
                let report = LoadReport {
                    kv_used_blocks: Some(s.kv_used_blocks),
                    active_prefill_tokens: Some(s.active_prefill_tokens),
                    waiting_requests: Some(s.num_requests_waiting),
                    ..Default::default()
                };
                let _ = p.report(rank as u32, &report);
            }
            p.flush();
        }
        self.send_bus();
        self.at(self.now + ns(self.c.report_interval_s), Ev::Report(w));
    }
}
