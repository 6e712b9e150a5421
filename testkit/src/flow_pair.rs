//! The frontend queue and the reference queue driven side by side, one
//! operation at a time, for the differential test (`core/tests/flow_model.rs`)
//! and the fuzz target (`fuzz/fuzz_targets/flow_ops.rs`). Each step compares
//! the outcome, the requests shed or expired, the length, the tokens and
//! every tenant's counter; a bounded pair (a small tenant table, which the
//! reference does not model) checks the invariants instead.

use std::time::Duration;

use loadgate::flow::{
    FlowConfig, FlowQueue, FlowRequest, QueueKey, Reservation, MAX_BANDS, MAX_SHED,
};

use crate::reference_flow::{RefConfig, RefReservation, ReferenceFlow};

/// One operation on both queues.
#[derive(Debug, Clone)]
pub enum FlowOp {
    /// A request of tenant `t{tenant}`.
    Push {
        /// Its tenant's number.
        tenant: u16,
        /// Its priority.
        priority: u8,
        /// Its prompt tokens.
        prompt: u64,
        /// Its `max_tokens`.
        max_tokens: Option<u64>,
        /// Its own deadline, milliseconds.
        deadline_ms: Option<u64>,
    },
    /// The next request dispatched.
    Pop,
    /// A request of tenant `t{tenant}` dispatched without queueing.
    Direct {
        /// Its tenant's number.
        tenant: u16,
        /// Its prompt tokens.
        prompt: u64,
    },
    /// Output reported for a running request.
    Report {
        /// Which one (modulo how many run).
        pick: usize,
        /// How many more output tokens.
        tokens: u64,
    },
    /// A running request settled.
    Settle {
        /// Which one (modulo how many run).
        pick: usize,
        /// Its output tokens in all.
        tokens: u64,
    },
    /// A running request put back (a worker refused it before it
    /// started).
    Requeue {
        /// Which one (modulo how many run).
        pick: usize,
    },
    /// A waiting request cancelled.
    Cancel {
        /// Which one (modulo how many wait).
        pick: usize,
    },
    /// Time passes, and due requests expire.
    Advance {
        /// Milliseconds.
        ms: u64,
    },
}

/// Nanoseconds per millisecond.
const MS: u64 = 1_000_000;

/// See the module docs.
pub struct FlowPair {
    q: FlowQueue<u32>,
    r: Option<ReferenceFlow>,
    config: FlowConfig,
    now: u64,
    next_id: u32,
    keys: Vec<(u32, QueueKey)>,
    running: Vec<(Reservation, Option<RefReservation>)>,
    tenants: Vec<String>,
}

impl FlowPair {
    /// A pair on `config` (its deadline in whole milliseconds). With a
    /// tenant table smaller than `tenants` ids, only the queue runs and its
    /// invariants are checked.
    pub fn new(config: FlowConfig, tenants: u16) -> Self {
        let bounded = config.max_tenants < usize::from(tenants);
        let r = (!bounded).then(|| {
            ReferenceFlow::new(RefConfig {
                limit: config.queue_limit as usize,
                token_limit: config.queue_tokens.map(u128::from),
                deadline: u64::try_from(config.deadline.as_nanos()).unwrap_or(u64::MAX),
                wp: config.prompt_weight,
                wq: config.output_weight,
                estimate: config.output_estimate,
                max_shed: MAX_SHED,
                bands: MAX_BANDS,
                weights: config.tenant_weights.clone(),
            })
        });
        Self {
            q: FlowQueue::new(&config).expect("a valid config"),
            r,
            config,
            now: 0,
            next_id: 0,
            keys: Vec::new(),
            running: Vec::new(),
            tenants: (0..tenants).map(|t| format!("t{t}")).collect(),
        }
    }

    fn name(&self, tenant: u16) -> &str {
        &self.tenants[usize::from(tenant) % self.tenants.len()]
    }

    /// Applies `op` to both; the first difference or broken invariant.
    pub fn step(&mut self, op: &FlowOp) -> Result<(), String> {
        match *op {
            FlowOp::Push {
                tenant,
                priority,
                prompt,
                max_tokens,
                deadline_ms,
            } => self.push(tenant, priority, prompt, max_tokens, deadline_ms)?,
            FlowOp::Pop => {
                let got = self.q.pop(self.now);
                let want = self.r.as_mut().map(|r| r.pop());
                if let Some(want) = &want {
                    let (g, w) = (got.as_ref().map(|g| g.0), want.as_ref().map(|w| w.0));
                    if g != w {
                        return Err(format!("pop: {g:?} vs {w:?}"));
                    }
                }
                if let Some((id, g)) = got {
                    self.keys.retain(|(i, _)| *i != id);
                    self.running.push((g, want.flatten().map(|w| w.1)));
                }
            }
            FlowOp::Direct { tenant, prompt } => {
                let name = self.name(tenant).to_owned();
                let req = FlowRequest {
                    prompt_tokens: prompt,
                    ..FlowRequest::new(&name)
                };
                if let Ok(g) = self.q.admit_direct(&req, self.now) {
                    let now = self.now;
                    let w = self
                        .r
                        .as_mut()
                        .map(|r| r.admit_direct(&name, 0, prompt, None, now));
                    self.running.push((g, w));
                } else if self.r.is_some() {
                    return Err("a direct dispatch refused with an unbounded table".into());
                }
            }
            FlowOp::Report { pick, tokens } if !self.running.is_empty() => {
                let i = pick % self.running.len();
                let (g, w) = &mut self.running[i];
                self.q.report_output(g, tokens);
                if let (Some(r), Some(w)) = (self.r.as_mut(), w) {
                    r.report_output(w, tokens);
                }
            }
            FlowOp::Settle { pick, tokens } if !self.running.is_empty() => {
                let (g, w) = self.running.swap_remove(pick % self.running.len());
                self.q.settle(g, tokens);
                if let (Some(r), Some(w)) = (self.r.as_mut(), w) {
                    r.settle(w, tokens);
                }
            }
            FlowOp::Requeue { pick } if !self.running.is_empty() => {
                let (g, w) = self.running.swap_remove(pick % self.running.len());
                let id = self.next_id;
                self.next_id += 1;
                let mut shed = Vec::new();
                let got = self.q.requeue(g, id, self.now, |v| shed.push(v));
                shed.sort_unstable();
                if let (Some(r), Some(w)) = (self.r.as_mut(), w) {
                    match (&got, r.requeue(id, w, self.now)) {
                        (Ok(_), Some(mut want)) => {
                            want.sort_unstable();
                            if shed != want {
                                return Err(format!("requeue shed: {shed:?} vs {want:?}"));
                            }
                        }
                        (Err(_), None) => {}
                        (got, want) => {
                            return Err(format!("requeue: {:?} vs {want:?}", got.as_ref().err()));
                        }
                    }
                }
                self.keys.retain(|(i, _)| !shed.contains(i));
                if let Ok(key) = got {
                    self.keys.push((id, key));
                }
            }
            FlowOp::Cancel { pick } if !self.keys.is_empty() => {
                let (id, key) = self.keys.swap_remove(pick % self.keys.len());
                if self.q.cancel(key) != Some(id) {
                    return Err(format!("cancel of {id} found nothing"));
                }
                if let Some(r) = self.r.as_mut() {
                    if !r.cancel(id) {
                        return Err(format!("the reference had no {id}"));
                    }
                }
            }
            FlowOp::Advance { ms } => {
                self.now = self.now.saturating_add(ms.saturating_mul(MS));
                let mut got = Vec::new();
                self.q.expire(self.now, |v| got.push(v));
                got.sort_unstable();
                if let Some(r) = self.r.as_mut() {
                    let mut want = r.expire(self.now);
                    want.sort_unstable();
                    if got != want {
                        return Err(format!("expired: {got:?} vs {want:?}"));
                    }
                }
                self.keys.retain(|(i, _)| !got.contains(i));
            }
            _ => {}
        }
        self.check()
    }

    fn push(
        &mut self,
        tenant: u16,
        priority: u8,
        prompt: u64,
        max_tokens: Option<u64>,
        deadline_ms: Option<u64>,
    ) -> Result<(), String> {
        let id = self.next_id;
        self.next_id += 1;
        let name = self.name(tenant).to_owned();
        let req = FlowRequest {
            tenant: &name,
            priority,
            prompt_tokens: prompt,
            max_tokens,
            deadline: deadline_ms.map(Duration::from_millis),
        };
        let mut shed = Vec::new();
        let got = self.q.push(&req, id, self.now, |v| shed.push(v));
        shed.sort_unstable();
        if let Some(r) = self.r.as_mut() {
            let deadline = deadline_ms.map(|d| {
                let d = Duration::from_millis(d).min(loadgate::flow::MAX_FLOW_DEADLINE);
                u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
            });
            let want = r.push(id, &name, priority, prompt, max_tokens, deadline, self.now);
            match (&got, want) {
                (Ok(_), Some(mut want_shed)) => {
                    want_shed.sort_unstable();
                    if shed != want_shed {
                        return Err(format!("shed: {shed:?} vs {want_shed:?}"));
                    }
                }
                (Err(_), None) => {}
                (got, want) => {
                    return Err(format!("push: {:?} vs {want:?}", got.as_ref().err()));
                }
            }
        }
        self.keys.retain(|(i, _)| !shed.contains(i));
        if let Ok(key) = got {
            self.keys.push((id, key));
        }
        Ok(())
    }

    /// The queue's invariants, and agreement with the reference.
    fn check(&self) -> Result<(), String> {
        let q = &self.q;
        if q.len() > self.config.queue_limit || q.len() as usize != self.keys.len() {
            return Err(format!("{} waiting, {} keys", q.len(), self.keys.len()));
        }
        if self
            .config
            .queue_tokens
            .is_some_and(|t| q.tokens() > u128::from(t))
        {
            return Err(format!("{} tokens waiting", q.tokens()));
        }
        if q.tenants() > self.config.max_tenants {
            return Err(format!("{} tenants remembered", q.tenants()));
        }
        for name in &self.tenants {
            let got = q.counter(name);
            if got.is_some_and(|c| !(c.is_finite() && c >= 0.0)) {
                return Err(format!("counter of {name}: {got:?}"));
            }
            if let Some(r) = &self.r {
                if got != r.counter(name) {
                    return Err(format!(
                        "counter of {name}: {got:?} vs {:?}",
                        r.counter(name)
                    ));
                }
            }
        }
        if let Some(r) = &self.r {
            if (q.len() as usize, q.tokens()) != (r.len(), r.tokens()) {
                return Err(format!(
                    "len/tokens: {}/{} vs {}/{}",
                    q.len(),
                    q.tokens(),
                    r.len(),
                    r.tokens()
                ));
            }
        }
        Ok(())
    }
}
