//! One run: a fleet of emulated engines behind one frontend, an arm's
//! admission design in front of and inside them, one workload, on a
//! virtual clock.
//!
//! loadgate's own code does the deciding: the arms with a frontend run a
//! real [`Monitor`] fed by real [`Publisher`]s through a real
//! [`Subscriber`] (the messages cross a transport that holds them for the
//! transport delay), book requests with [`Monitor::book`], and the workers
//! run a real [`AdmissionGate`] in its callback form. Every one of them
//! reads the run's [`ManualClock`], which the event loop sets to each
//! event's time before handling it.
//!
//! Events are handled in time order (ties in the order they were made),
//! on one thread, so a run is a function of its inputs and seed.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use loadgate::cluster::{
    ClusterError, Handler, Publisher, PublisherConfig, Subjects, Subscriber, SubscriberConfig,
    Subscription, Transport,
};
use loadgate::{
    AdmissionGate, AdmitError, Booking, CallbackTicket, LoadReport, ManualClock, Monitor,
    MonitorConfig, OwnedPermit, Policy, RouteError, SharedClock, WorkerSpec,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;

use crate::arm::{Arm, ArmKind};
use crate::engine::{Engine, EngineConfig, EngineRequest, Token};
use crate::record::{End, Life, Measured, Recorder, Slo};
use crate::workload::{RequestSpec, Retry, WorkloadSpec};

const MODEL: &str = "model";

/// The fleet and how its signals travel.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Conditions {
    /// Workers behind the frontend.
    pub workers: u32,
    /// Data-parallel ranks per worker.
    pub dp_size: u32,
    /// Each rank's engine.
    pub engine: EngineConfig,
    /// How often a worker publishes its load, seconds.
    pub report_interval_s: f64,
    /// Publisher to subscriber, seconds.
    pub transport_delay_s: f64,
    /// Frontend to worker (and back), seconds.
    pub net_delay_s: f64,
    /// How often the frontend sweeps for stale ranks, seconds.
    pub sweep_interval_s: f64,
    /// The SLOs.
    pub slo: Slo,
    /// Requests first sent before this are not measured, seconds.
    pub warmup_s: f64,
    /// The run stops this long after the last arrival, seconds.
    pub drain_s: f64,
    /// Width of a time-series bin, seconds.
    pub bin_s: f64,
}

impl Default for Conditions {
    fn default() -> Self {
        Self {
            workers: 4,
            dp_size: 1,
            engine: EngineConfig::default(),
            report_interval_s: 0.1,
            transport_delay_s: 0.001,
            net_delay_s: 0.0005,
            sweep_interval_s: 0.1,
            slo: Slo {
                ttft_s: 2.0,
                tpot_s: 0.1,
            },
            warmup_s: 5.0,
            drain_s: 20.0,
            bin_s: 1.0,
        }
    }
}

fn ns(s: f64) -> u64 {
    (s * 1e9) as u64
}

/// A transport that holds each message until the event loop delivers it.
#[derive(Default)]
struct HeldBus {
    outbox: Mutex<Vec<(String, Vec<u8>)>>,
}

impl Transport for HeldBus {
    fn publish(&self, subject: &str, payload: Vec<u8>) -> Result<(), ClusterError> {
        self.outbox
            .lock()
            .expect("outbox")
            .push((subject.to_owned(), payload));
        Ok(())
    }

    fn subscribe(&self, _: &str, _: Handler) -> Result<Subscription, ClusterError> {
        Err(ClusterError::Transport(
            "the lab delivers messages itself".into(),
        ))
    }
}

#[derive(Debug)]
enum Ev {
    Send(u32),
    AtWorker(u32, u32),
    StepEnd(u32, u32),
    Report(u32),
    Deliver(String, Vec<u8>),
    Sweep,
    Expire(u32),
    GiveUp(u32),
    /// A rejection reaches the client: request, attempt, `Retry-After`,
    /// where and why it was refused.
    Heard(u32, u32, Option<f64>, &'static str),
    /// A worker's refusal is back at the frontend, which routes again.
    Reroute(u32, u32),
}

struct Queued {
    at: u64,
    seq: u64,
    ev: Ev,
}

impl PartialEq for Queued {
    fn eq(&self, o: &Self) -> bool {
        (self.at, self.seq) == (o.at, o.seq)
    }
}
impl Eq for Queued {}
impl PartialOrd for Queued {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Queued {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        (self.at, self.seq).cmp(&(o.at, o.seq))
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    NotSent,
    /// On its way to a worker.
    Travelling,
    /// Waiting in a worker's gate.
    Queued,
    /// In an engine.
    Running,
    /// Waiting to retry.
    Backoff,
    Done,
}

struct Req {
    spec: RequestSpec,
    stage: Stage,
    attempt: u32,
    /// Frontend-to-worker trips of this attempt (each one a round trip when
    /// refused).
    hops: u32,
    attempt_send: u64,
    worker: u32,
    rank: u32,
    first_token: u64,
    last_token: u64,
    permit: Option<OwnedPermit>,
    ticket: Option<CallbackTicket>,
    booking: Option<Booking>,
}

struct Worker {
    ranks: Vec<Engine>,
    stepping: Vec<bool>,
    gate: Option<Arc<AdmissionGate>>,
    publisher: Option<Publisher>,
    expire_at: Option<u64>,
}

type Inbox = Arc<Mutex<Vec<(u32, u32, Result<OwnedPermit, AdmitError>)>>>;

/// Client-side adaptive throttling state (SRE book), one per run.
struct Throttle {
    k: f64,
    window_ns: u64,
    events: std::collections::VecDeque<(u64, bool)>,
    requests: f64,
    accepts: f64,
}

impl Throttle {
    fn reject_probability(&mut self, now: u64) -> f64 {
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

    fn record(&mut self, now: u64, accepted: bool) {
        self.events.push_back((now, accepted));
        self.requests += 1.0;
        if accepted {
            self.accepts += 1.0;
        }
    }
}

/// The outcome of one run.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RunResult {
    /// Every figure.
    pub measured: Measured,
    /// Events handled.
    pub events: u64,
}

/// Runs `arm` on `workload` under `conditions`; `capacity` is `C*` (for the
/// goodput fraction). Fails when the accounting does not balance.
pub fn run(
    arm: &Arm,
    workload: &WorkloadSpec,
    requests: &[RequestSpec],
    conditions: &Conditions,
    capacity: f64,
) -> Result<RunResult, String> {
    Sim::new(arm, workload, requests, conditions)?.run(capacity)
}

struct Sim<'a> {
    arm: &'a Arm,
    workload: &'a WorkloadSpec,
    c: &'a Conditions,
    clock: Arc<ManualClock>,
    now: u64,
    seq: u64,
    heap: BinaryHeap<Reverse<Queued>>,
    reqs: Vec<Req>,
    workers: Vec<Worker>,
    monitor: Option<Arc<Monitor>>,
    subscriber: Option<Arc<Subscriber>>,
    bus: Arc<HeldBus>,
    inbox: Inbox,
    rec: Recorder,
    rr: u32,
    rng: StdRng,
    bucket: (f64, u64),
    throttle: Option<Throttle>,
    tokens: Vec<Token>,
    events: u64,
    end: u64,
}

impl<'a> Sim<'a> {
    fn new(
        arm: &'a Arm,
        workload: &'a WorkloadSpec,
        requests: &[RequestSpec],
        c: &'a Conditions,
    ) -> Result<Self, String> {
        let mut engine = c.engine;
        if let Some(n) = arm.max_num_seqs {
            engine.max_num_seqs = n;
        }
        if let Some(why) = engine.invalid() {
            return Err(format!("engine: {why}"));
        }
        let clock = ManualClock::new();
        let shared: SharedClock = clock.clone();
        let bus = Arc::new(HeldBus::default());
        let subjects = Subjects::new("lab").map_err(|e| e.to_string())?;
        let (monitor, subscriber) = if arm.kind.uses_monitor() {
            let config = MonitorConfig {
                stale_after: Duration::from_secs(3),
                ..Default::default()
            };
            let monitor =
                Arc::new(Monitor::with_config(config, shared.clone()).map_err(|e| e.to_string())?);
            let sub_config = SubscriberConfig {
                expire_after: Duration::from_secs(3600),
                ..Default::default()
            };
            let sub = Subscriber::new(monitor.clone(), sub_config, shared.clone())
                .map_err(|e| e.to_string())?;
            (Some(monitor), Some(sub))
        } else {
            (None, None)
        };
        let mut workers = Vec::new();
        for w in 0..c.workers {
            let gate = match arm.gate {
                Some(g) => Some(Arc::new(
                    AdmissionGate::with_clock(g.config(), shared.clone())
                        .map_err(|e| format!("gate: {e}"))?,
                )),
                None => None,
            };
            let publisher = match &monitor {
                Some(m) => {
                    let spec = WorkerSpec {
                        dp_start: 0,
                        dp_size: c.dp_size,
                        kv_total_blocks: Some(u64::from(engine.num_gpu_blocks)),
                        max_num_batched_tokens: Some(u64::from(engine.max_num_batched_tokens)),
                    };
                    m.add_worker(MODEL, u64::from(w), spec)
                        .map_err(|e| e.to_string())?;
                    let mut pc = PublisherConfig::new(u64::from(w), MODEL);
                    pc.dp_size = c.dp_size;
                    pc.kv_total_blocks = spec.kv_total_blocks;
                    pc.max_num_batched_tokens = spec.max_num_batched_tokens;
                    Some(
                        Publisher::new(pc, bus.clone(), &subjects, shared.clone())
                            .map_err(|e| e.to_string())?,
                    )
                }
                None => None,
            };
            workers.push(Worker {
                ranks: (0..c.dp_size).map(|_| Engine::new(engine)).collect(),
                stepping: vec![false; c.dp_size as usize],
                gate,
                publisher,
                expire_at: None,
            });
        }
        if let Some(m) = &monitor {
            m.set_thresholds(MODEL, &arm.thresholds())
                .map_err(|e| e.to_string())?;
            if let Some((policy, after)) = arm.stale() {
                m.set_staleness(MODEL, policy, after)
                    .map_err(|e| e.to_string())?;
            }
        }
        let end = ns(workload.duration_s + c.drain_s);
        let rec = Recorder::new(
            c.slo,
            (ns(c.warmup_s), ns(workload.duration_s)),
            ns(c.bin_s),
            end,
            workload.tenants.len(),
        );
        let throttle = match workload.client.retry {
            Retry::Adaptive { k, window_s } => Some(Throttle {
                k,
                window_ns: ns(window_s),
                events: Default::default(),
                requests: 0.0,
                accepts: 0.0,
            }),
            _ => None,
        };
        let reqs = requests
            .iter()
            .map(|&spec| Req {
                spec,
                stage: Stage::NotSent,
                attempt: 0,
                hops: 0,
                attempt_send: 0,
                worker: 0,
                rank: 0,
                first_token: 0,
                last_token: 0,
                permit: None,
                ticket: None,
                booking: None,
            })
            .collect();
        Ok(Self {
            arm,
            workload,
            c,
            clock,
            now: 0,
            seq: 0,
            heap: BinaryHeap::new(),
            reqs,
            workers,
            monitor,
            subscriber,
            bus,
            inbox: Arc::new(Mutex::new(Vec::new())),
            rec,
            rr: 0,
            rng: StdRng::seed_from_u64(workload.seed ^ 0x5EED),
            bucket: (0.0, 0),
            throttle,
            tokens: Vec::new(),
            events: 0,
            end,
        })
    }

    fn at(&mut self, at: u64, ev: Ev) {
        self.seq += 1;
        self.heap.push(Reverse(Queued {
            at,
            seq: self.seq,
            ev,
        }));
    }

    fn run(mut self, capacity: f64) -> Result<RunResult, String> {
        for (i, r) in self.reqs.iter().enumerate() {
            self.rec
                .offered(r.spec.at_ns, r.spec.prompt, r.spec.output, r.spec.tenant);
            let _ = i;
        }
        for i in 0..self.reqs.len() {
            let at = self.reqs[i].spec.at_ns;
            self.at(at, Ev::Send(i as u32));
            self.at(
                at + ns(self.workload.client.timeout_s),
                Ev::GiveUp(i as u32),
            );
        }
        if self.monitor.is_some() {
            for w in 0..self.workers.len() {
                self.at(0, Ev::Report(w as u32));
            }
            if self.arm.staleness.is_some() {
                self.at(0, Ev::Sweep);
            }
        }
        while let Some(Reverse(q)) = self.heap.pop() {
            if q.at > self.end {
                break;
            }
            self.now = q.at;
            self.clock.set_nanos(q.at);
            self.events += 1;
            self.handle(q.ev);
        }
        let in_flight = self
            .reqs
            .iter()
            .filter(|r| r.stage != Stage::Done && self.rec.counts(r.spec.at_ns))
            .count() as u64;
        self.rec.in_flight(in_flight);
        let a = self.rec.accounting();
        if a.offered != a.completed + a.rejected + a.cancelled + a.in_flight {
            return Err(format!("accounting does not balance: {a:?}"));
        }
        let mut measured = self.rec.summary(capacity);
        for w in &self.workers {
            for e in &w.ranks {
                let t = e.totals();
                measured.preemptions += t.preemptions;
                measured.wasted_tokens += t.wasted_tokens;
                measured.computed_tokens += t.computed_tokens;
            }
        }
        Ok(RunResult {
            measured,
            events: self.events,
        })
    }

    fn handle(&mut self, ev: Ev) {
        match ev {
            Ev::Send(id) => self.send(id),
            Ev::AtWorker(id, attempt) => self.at_worker(id, attempt),
            Ev::StepEnd(w, r) => self.step_end(w, r),
            Ev::Report(w) => self.report(w),
            Ev::Deliver(subject, payload) => {
                if let Some(s) = &self.subscriber {
                    // A refusal is counted by the subscriber; the lab's own
                    // messages are never refused.
                    let _ = s.handle_on(&subject, &payload);
                }
            }
            Ev::Sweep => {
                if let Some(m) = &self.monitor {
                    m.sweep();
                }
                self.at(self.now + ns(self.c.sweep_interval_s), Ev::Sweep);
            }
            Ev::Expire(w) => {
                let worker = &mut self.workers[w as usize];
                worker.expire_at = None;
                if let Some(g) = &worker.gate {
                    g.expire();
                }
                self.drain_inbox();
                self.schedule_expiry(w);
            }
            Ev::GiveUp(id) => self.give_up(id),
            Ev::Reroute(id, attempt) => {
                let r = &self.reqs[id as usize];
                if r.stage == Stage::Travelling && r.attempt == attempt {
                    self.dispatch(id, attempt);
                }
            }
            Ev::Heard(id, attempt, retry_after, why) => self.heard(id, attempt, retry_after, why),
        }
    }

    // ----- the client and the frontend ------------------------------------

    fn send(&mut self, id: u32) {
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
    /// with a rejection.
    fn dispatch(&mut self, id: u32, attempt: u32) {
        let now = self.now;
        match self.route(id) {
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

    /// The arm's frontend decision: a worker and rank, or a rejection with
    /// the `Retry-After` it carries.
    fn route(&mut self, id: u32) -> Result<(u32, u32), (Option<f64>, &'static str)> {
        let n = self.workers.len() as u32;
        match self.arm.kind {
            ArmKind::NoControl | ArmKind::EngineLimit => {
                let w = self.rr % n;
                self.rr = self.rr.wrapping_add(1);
                Ok((w, self.shortest_rank(w)))
            }
            ArmKind::Oracle => {
                let rate = self.arm.oracle_rate.unwrap_or(f64::INFINITY);
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
            ArmKind::Seed | ArmKind::Saturation | ArmKind::Loadgate => {
                let picked = match self.arm.routing() {
                    Policy::PowerOfTwo => self.power_of_two(),
                    policy => self
                        .monitor
                        .as_ref()
                        .expect("a monitor")
                        .select(MODEL, policy),
                };
                let monitor = self.monitor.as_ref().expect("a monitor arm");
                match picked {
                    Ok(w) => {
                        let rank = (0..self.c.dp_size)
                            .min_by_key(|&r| {
                                monitor
                                    .rank_load(w, r)
                                    .map_or(0, |l| l.active_decode_blocks.max(l.kv_used_blocks))
                            })
                            .unwrap_or(0);
                        if self.arm.book {
                            let spec = self.reqs[id as usize].spec;
                            let blocks = u64::from(spec.prompt.div_ceil(self.c.engine.block_size));
                            self.reqs[id as usize].booking = monitor.book(w, rank, blocks).ok();
                        }
                        Ok((w as u32, rank))
                    }
                    Err(RouteError::Unavailable) => {
                        Err((self.arm.retry_after_s, "frontend: no workers"))
                    }
                    Err(_) => Err((self.arm.retry_after_s, "frontend: all workers busy")),
                }
            }
        }
    }

    /// Power-of-two choices with the run's own generator. loadgate's
    /// `Policy::PowerOfTwo` draws from a per-thread generator seeded at
    /// random, which would make runs differ; here the lab draws the two
    /// eligible candidates from the run's seed and `select_min_cost` picks
    /// between them by the score loadgate's own pick compares (per rank, the
    /// larger of booked and used KV blocks, plus prefill tokens / 16).
    fn power_of_two(&mut self) -> Result<u64, RouteError> {
        let monitor = self.monitor.as_ref().expect("a monitor arm");
        let eligible: Vec<u64> = (0..u64::from(self.c.workers))
            .filter(|&w| {
                !monitor.is_busy(w).unwrap_or(true) && !monitor.is_leased(w).unwrap_or(true)
            })
            .collect();
        if eligible.is_empty() {
            // The monitor answers (and counts) the rejection itself.
            return monitor.select(MODEL, Policy::RoundRobin);
        }
        let a = eligible[self.rng.gen_range(0..eligible.len())];
        let b = eligible[self.rng.gen_range(0..eligible.len())];
        let score = |w: u64| {
            (0..self.c.dp_size)
                .filter_map(|r| monitor.rank_load(w, r).ok())
                .map(|l| {
                    l.active_decode_blocks.max(l.kv_used_blocks)
                        + l.active_prefill_tokens.unwrap_or(0) / 16
                })
                .sum::<u64>() as f64
        };
        monitor.select_min_cost(MODEL, [(a, score(a)), (b, score(b))])
    }

    fn shortest_rank(&self, w: u32) -> u32 {
        let ranks = &self.workers[w as usize].ranks;
        (0..ranks.len() as u32)
            .min_by_key(|&r| ranks[r as usize].len())
            .unwrap_or(0)
    }

    /// The client hears a rejection of `attempt`.
    fn heard(&mut self, id: u32, attempt: u32, retry_after: Option<f64>, why: &'static str) {
        let now = self.now;
        let client = self.workload.client;
        let r = &mut self.reqs[id as usize];
        if r.stage == Stage::Done || r.attempt != attempt {
            return;
        }
        r.booking = None;
        let first = r.spec.at_ns;
        let waited = now - r.attempt_send;
        let network = u64::from(r.hops) * 2 * ns(self.c.net_delay_s);
        let priority = r.spec.priority;
        let jitter = r.spec.jitter;
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

    fn give_up(&mut self, id: u32) {
        let r = &mut self.reqs[id as usize];
        if r.stage == Stage::Done || r.first_token != 0 || r.stage == Stage::NotSent {
            return;
        }
        let (w, rank) = (r.worker as usize, r.rank as usize);
        match r.stage {
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
    fn finish(&mut self, id: u32, end: End) {
        let now = self.now;
        let r = &mut self.reqs[id as usize];
        r.stage = Stage::Done;
        r.ticket = None;
        r.booking = None;
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

    // ----- the worker -------------------------------------------------------

    fn at_worker(&mut self, id: u32, attempt: u32) {
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
    fn drain_inbox(&mut self) {
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
                        let worker = u64::from(r.worker);
                        if let Some(m) = &self.monitor {
                            if e == AdmitError::AtCapacity {
                                let _ = m.mark_overloaded(worker);
                            }
                        }
                        if e == AdmitError::AtCapacity && r.hops <= self.arm.reroute {
                            // Back to the frontend, which tries another
                            // worker (the refusing one is under its lease).
                            r.stage = Stage::Travelling;
                            r.booking = None;
                            self.at(self.now + ns(self.c.net_delay_s), Ev::Reroute(id, attempt));
                            continue;
                        }
                        r.stage = Stage::Backoff;
                        let retry_after = self.arm.retry_after_s;
                        let why = match e {
                            AdmitError::AtCapacity => "worker gate: at capacity",
                            AdmitError::QueueTimeout | AdmitError::TimedOut => {
                                "worker gate: queue deadline"
                            }
                            AdmitError::Displaced => "worker gate: displaced",
                            AdmitError::Closed => "worker gate: closed",
                        };
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

    fn schedule_expiry(&mut self, w: u32) {
        let worker = &mut self.workers[w as usize];
        let Some(g) = &worker.gate else { return };
        if let Some(at) = g.next_deadline() {
            if worker.expire_at.is_none_or(|t| at < t) {
                worker.expire_at = Some(at);
                self.at(at.max(self.now), Ev::Expire(w));
            }
        }
    }

    fn enter_engine(&mut self, id: u32) {
        let now = self.now;
        let r = &mut self.reqs[id as usize];
        let (w, rank) = (r.worker, r.rank);
        let request = EngineRequest {
            id: u64::from(id),
            prompt: r.spec.prompt,
            output: r.spec.output,
        };
        r.stage = Stage::Running;
        self.rec.admitted(now, r.spec.priority);
        if !self.workers[w as usize].ranks[rank as usize].add(request) {
            // Longer than the engine can ever hold: refused (none of the
            // workload's requests are).
            self.finish(id, End::Rejected);
            return;
        }
        self.kick(w, rank);
    }

    fn kick(&mut self, w: u32, rank: u32) {
        let worker = &mut self.workers[w as usize];
        if worker.stepping[rank as usize] {
            return;
        }
        if let Some(d) = worker.ranks[rank as usize].begin_step() {
            worker.stepping[rank as usize] = true;
            self.at(self.now + d, Ev::StepEnd(w, rank));
        }
    }

    fn step_end(&mut self, w: u32, rank: u32) {
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
            if let Some(b) = &mut r.booking {
                if (r.spec.prompt + t.generated) % block == 0 {
                    b.add_output_blocks(1);
                }
            }
            if t.finished {
                self.finish(id, End::Completed);
            }
        }
        self.tokens = tokens;
        self.kick(w, rank);
    }

    fn report(&mut self, w: u32) {
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
        let sent = std::mem::take(&mut *self.bus.outbox.lock().expect("outbox"));
        let at = self.now + ns(self.c.transport_delay_s);
        for (subject, payload) in sent {
            self.at(at, Ev::Deliver(subject, payload));
        }
        self.at(self.now + ns(self.c.report_interval_s), Ev::Report(w));
    }
}
