//! One run: a fleet of emulated engines behind one frontend (or several
//! replicas), an arm's admission design in front of and inside them, one
//! workload, on a virtual clock.
//!
//! loadgate's own code does the deciding: the arms with a frontend run a
//! real [`Monitor`](loadgate::Monitor) fed by real [`Publisher`]s through a
//! real [`Subscriber`](loadgate::cluster::Subscriber) (the messages cross a
//! transport that holds them for the transport delay), book requests with
//! [`Monitor::book`](loadgate::Monitor::book), and the workers
//! run a real [`AdmissionGate`] in its callback form. Every one of them
//! reads the run's [`ManualClock`], which the event loop sets to each
//! event's time before handling it.
//!
//! Events are handled in time order (ties in the order they were made),
//! on one thread, so a run is a function of its inputs and seed.
//!
//! * this file: the run's state, its events and the event loop;
//! * `frontend.rs`: the clients (sends, retries, giving up) and the arm's
//!   frontend (routing, rejections);
//! * `flow.rs`: the frontend decision of every arm with a monitor,
//!   `Monitor::dispatch` and, after a worker's refusal,
//!   `Monitor::redispatch`, driven through their futures (the frontend
//!   queue of arms (g) and (h) waits in them);
//! * `fronts.rs`: one frontend or several replicas, and their booking
//!   sync;
//! * `worker.rs`: the workers (the gate's outcomes, the engines' steps, the
//!   load they publish).

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::sync::{Arc, Mutex};

use loadgate::cluster::{
    ClusterError, Handler, Publisher, PublisherConfig, Subjects, Subscription, Transport,
};
use loadgate::monitor::{Dispatch, Dispatching};
use loadgate::{
    AdmissionGate, AdmitError, CallbackTicket, ManualClock, OwnedPermit, SharedClock, WorkerSpec,
};
use serde::Serialize;

mod flow;
mod frontend;
mod fronts;
mod slo;
mod worker;

use frontend::Throttle;

use crate::arm::Arm;
use crate::engine::{Engine, EngineConfig, Token};
use crate::record::{Measured, Recorder, Slo};
use crate::workload::{RequestSpec, Retry, WorkloadSpec};

const MODEL: &str = "model";

/// Why a request the frontend queue refused at its deadline heard 529 (one
/// refused at once, as predicted late, is told apart where it is heard).
const QUEUE_DEADLINE: &str = "frontend queue: deadline";

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
    /// Frontend replicas behind the load balancer, each request to the
    /// next in turn.
    pub frontends: u32,
    /// The replicas share their bookings (`BookingSync`) with this
    /// debounce, seconds; `None`: they do not.
    pub sync_debounce_s: Option<f64>,
    /// With sync: leased mode (each replica books within its share of the
    /// line) rather than shared.
    pub sync_leased: bool,
    /// Every other worker's engine runs at this speed-up instead (a fleet
    /// of two GPU kinds); `None`: every worker alike.
    pub odd_worker_speedup: Option<f64>,
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
            frontends: 1,
            sync_debounce_s: None,
            sync_leased: false,
            odd_worker_speedup: None,
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
    /// A worker's refusal is back at the frontend, which hands it to its
    /// monitor (`Monitor::redispatch`).
    Reroute(u32, u32),
    /// The frontend queue's next deadline.
    FlowExpire,
    /// The replicas' booking syncs tick.
    SyncTick,
    /// Arm (i): each rank's line is sampled (once a second).
    SloSample,
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
    /// In the frontend queue.
    Waiting,
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
    /// The replica it goes through.
    frontend: u32,
    worker: u32,
    rank: u32,
    first_token: u64,
    last_token: u64,
    permit: Option<OwnedPermit>,
    ticket: Option<CallbackTicket>,
    /// Monitor arms: the dispatch it was sent with.
    dispatch: Option<Dispatch>,
    /// Monitor arms: the attempt waiting for the monitor's answer (in the
    /// frontend queue), and its future.
    waiting: Option<(u32, Dispatching)>,
    /// Why the worker it was sent to refused it, while the monitor decides
    /// again (`Monitor::redispatch`).
    refused_by: Option<&'static str>,
    /// What its booking or dispatch admitted: (worker, rank, blocks).
    admitted: Option<(u32, u32, u64)>,
    /// Arm (i): the time per output token predicted when it was booked,
    /// seconds, once its first token came.
    predicted_tpot: Option<f64>,
}

struct Worker {
    ranks: Vec<Engine>,
    stepping: Vec<bool>,
    gate: Option<Arc<AdmissionGate>>,
    publisher: Option<Publisher>,
    expire_at: Option<u64>,
}

type Inbox = Arc<Mutex<Vec<(u32, u32, Result<OwnedPermit, AdmitError>)>>>;

/// The outcome of one run.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RunResult {
    /// Every figure.
    pub measured: Measured,
    /// Events handled.
    pub events: u64,
    /// Booking sync messages the replicas sent, in all (0 without sync).
    pub sync_messages: u64,
    /// Their bytes, in all.
    pub sync_bytes: u64,
    /// The largest, bytes.
    pub sync_max: usize,
    /// Admissions after which the blocks the replicas had admitted to a
    /// rank, and not yet let go, passed its line.
    pub line_breaches: u64,
    /// The most those blocks passed a rank's line by.
    pub peak_over_line: u64,
    /// Leased sync: times a replica's lease ran out while it held a share.
    pub fenced: u64,
    /// Rejections the clients heard from the frontend or a worker (not
    /// their own throttling), over the whole run.
    pub refusals_heard: u64,
    /// Rejections the monitors counted (`Monitor::rejections`), over every
    /// replica: for an arm with a monitor, the same number, since every
    /// refusal is the monitor's answer.
    pub monitor_refusals: u64,
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
    /// The frontend replicas (none for the arms without a monitor).
    fronts: Vec<fronts::Front>,
    /// Booking sync messages sent: count, bytes, the largest.
    sync_messages: (u64, u64, usize),
    /// Blocks admitted to each (worker, rank) and not let go yet, by every
    /// replica; the admissions that left one past its line, and the most.
    inflight: HashMap<(u32, u32), u64>,
    line_breaches: u64,
    peak_over_line: u64,
    /// Arm (i): |predicted − observed| time to first token and per output
    /// token, ms, and the admitted requests measured.
    slo_errors: [Vec<f64>; 2],
    slo_admitted: u64,
    /// Arm (i): each rank's line once a second (time, ns; one per rank).
    slo_lines: Vec<(u64, Vec<f64>)>,
    bus: Arc<HeldBus>,
    inbox: Inbox,
    woken: flow::Woken,
    flow_expire_at: Option<u64>,
    rec: Recorder,
    rr: u32,
    bucket: (f64, u64),
    throttle: Option<Throttle>,
    tokens: Vec<Token>,
    events: u64,
    refusals_heard: u64,
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
        // The monitors' random and power-of-two picks repeat with the run.
        loadgate::monitor::seed_picks(workload.seed ^ 0x5EED);
        let bus = Arc::new(HeldBus::default());
        let subjects = Subjects::new("lab").map_err(|e| e.to_string())?;
        let fronts = if arm.kind.uses_monitor() {
            (0..c.frontends.max(1))
                .map(|i| fronts::Front::new(i, &shared, &subjects, c, arm))
                .collect::<Result<Vec<_>, _>>()?
        } else {
            Vec::new()
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
            let publisher = match fronts.is_empty() {
                false => {
                    let spec = WorkerSpec {
                        dp_start: 0,
                        dp_size: c.dp_size,
                        kv_total_blocks: Some(u64::from(engine.num_gpu_blocks)),
                        max_num_batched_tokens: Some(u64::from(engine.max_num_batched_tokens)),
                        max_num_seqs: Some(u64::from(engine.max_num_seqs)),
                    };
                    for f in &fronts {
                        f.monitor
                            .add_worker(MODEL, u64::from(w), spec)
                            .map_err(|e| e.to_string())?;
                    }
                    let mut pc = PublisherConfig::new(u64::from(w), MODEL);
                    pc.dp_size = c.dp_size;
                    pc.kv_total_blocks = spec.kv_total_blocks;
                    pc.max_num_batched_tokens = spec.max_num_batched_tokens;
                    pc.max_num_seqs = spec.max_num_seqs;
                    Some(
                        Publisher::new(pc, bus.clone(), &subjects, shared.clone())
                            .map_err(|e| e.to_string())?,
                    )
                }
                true => None,
            };
            let mut own = engine;
            if let Some(x) = c.odd_worker_speedup.filter(|_| w % 2 == 1) {
                own.speedup_ratio *= x;
            }
            workers.push(Worker {
                ranks: (0..c.dp_size).map(|_| Engine::new(own)).collect(),
                stepping: vec![false; c.dp_size as usize],
                gate,
                publisher,
                expire_at: None,
            });
        }
        for f in &fronts {
            let m = &f.monitor;
            m.set_thresholds(MODEL, &arm.thresholds())
                .map_err(|e| e.to_string())?;
            if let Some((policy, after)) = arm.stale() {
                m.set_staleness(MODEL, policy, after)
                    .map_err(|e| e.to_string())?;
            }
            if let Some(flow) = arm.flow {
                m.set_flow_control(MODEL, Some(&flow.config(arm.routing())))
                    .map_err(|e| e.to_string())?;
            }
            if arm.slo {
                let slo = loadgate::slo::Slo::from_secs(c.slo.ttft_s, c.slo.tpot_s)
                    .map_err(|e| e.to_string())?;
                m.set_slo(MODEL, Some(slo), loadgate::SloMode::Enforce)
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
            Retry::Adaptive { k, window_s } => Some(Throttle::new(k, ns(window_s))),
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
                frontend: 0,
                worker: 0,
                rank: 0,
                first_token: 0,
                last_token: 0,
                permit: None,
                ticket: None,
                dispatch: None,
                waiting: None,
                refused_by: None,
                admitted: None,
                predicted_tpot: None,
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
            fronts,
            sync_messages: (0, 0, 0),
            inflight: HashMap::new(),
            line_breaches: 0,
            slo_errors: [Vec::new(), Vec::new()],
            slo_admitted: 0,
            slo_lines: Vec::new(),
            peak_over_line: 0,
            bus,
            inbox: Arc::new(Mutex::new(Vec::new())),
            woken: Arc::default(),
            flow_expire_at: None,
            rec,
            rr: 0,
            bucket: (0.0, 0),
            throttle,
            tokens: Vec::new(),
            events: 0,
            refusals_heard: 0,
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
        let n = self.fronts.len().max(1) as u32;
        for (i, r) in self.reqs.iter_mut().enumerate() {
            r.frontend = i as u32 % n;
        }
        if !self.fronts.is_empty() {
            for w in 0..self.workers.len() {
                self.at(0, Ev::Report(w as u32));
            }
            if self.arm.staleness.is_some() {
                self.at(0, Ev::Sweep);
            }
            if self.c.sync_debounce_s.is_some() {
                self.at(0, Ev::SyncTick);
            }
            if self.arm.slo {
                self.at(0, Ev::SloSample);
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
            // The maintenance of a queue (its dispatches and deadlines) or
            // of an SLO (its fit) follows each event.
            if self.arm.flow.is_some() || self.arm.slo {
                self.flow_after();
            }
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
        let fenced = self
            .fronts
            .iter()
            .filter_map(|f| f.sync.as_ref())
            .map(|s| s.stats().fenced)
            .sum();
        let mut measured = self.rec.summary(capacity);
        for w in &self.workers {
            for e in &w.ranks {
                let t = e.totals();
                measured.preemptions += t.preemptions;
                measured.wasted_tokens += t.wasted_tokens;
                measured.computed_tokens += t.computed_tokens;
            }
        }
        if self.arm.slo {
            measured.slo = Some(self.slo_figures());
        }
        let monitor_refusals = self
            .fronts
            .iter()
            .flat_map(|f| f.monitor.rejections(MODEL))
            .map(|(_, n)| n)
            .sum();
        Ok(RunResult {
            measured,
            refusals_heard: self.refusals_heard,
            monitor_refusals,
            events: self.events,
            sync_messages: self.sync_messages.0,
            sync_bytes: self.sync_messages.1,
            sync_max: self.sync_messages.2,
            line_breaches: self.line_breaches,
            peak_over_line: self.peak_over_line,
            fenced,
        })
    }

    fn handle(&mut self, ev: Ev) {
        match ev {
            Ev::Send(id) => self.send(id),
            Ev::AtWorker(id, attempt) => self.at_worker(id, attempt),
            Ev::StepEnd(w, r) => self.step_end(w, r),
            Ev::Report(w) => self.report(w),
            Ev::Deliver(subject, payload) => self.deliver(&subject, &payload),
            Ev::Sweep => {
                for f in &self.fronts {
                    f.monitor.sweep();
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
            Ev::Reroute(id, attempt) => self.redispatch(id, attempt),
            Ev::Heard(id, attempt, retry_after, why) => self.heard(id, attempt, retry_after, why),
            Ev::FlowExpire => self.flow_expire(),
            Ev::SyncTick => self.sync_tick(),
            Ev::SloSample => self.slo_sample(),
        }
    }
}
