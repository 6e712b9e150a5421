//! The frontend side: applying published load to a monitor.
//!
//! Every payload goes through the same checks, in order, each refusal
//! counted under its reason (`metrics_text`): the size bound
//! (`oversized`), decoding (`malformed`, `unsupported_version`, `invalid`),
//! the sender check (`spoofed`: a loadgate message must carry the worker id
//! of the subject it arrived on, so NATS per-subject publish permissions
//! bind a worker to its own reports), the declaration limits of the
//! monitor, and finally the monitor itself.
//!
//! **Two paths.** A message of a worker this subscriber already tracks is
//! applied on the receiving thread: one lookup under the `tracks` lock,
//! the sequence check, and a lock-free `Monitor::report`. A message that
//! has to register a worker (its first, or a restarted one) is the slow
//! path: registration clones the monitor's registry, so it costs time
//! proportional to the number of workers. When attached to a transport,
//! such messages go to a bounded queue served by the subscriber's own
//! thread (which also expires silent workers), so a flood of new worker
//! ids or model names never delays the reports of known workers; when the
//! queue is full the announcement is dropped and counted (`backlog`), and
//! the worker's next heartbeat announces it again. [`Subscriber::handle`]
//! runs both paths on the calling thread.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, SyncSender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use foldhash::fast::RandomState;

use super::{lock, ClusterError, Subjects, Subscription, Transport, DEFAULT_HEARTBEAT};
use crate::clock::{nanos, SharedClock};
use crate::cluster::bookings::RouterBookings;
use crate::cluster::transport::dynamo_sibling_subject;
use crate::cluster::wire::{
    decode_ref, DecodedRef, LoadMessage, LoadRef, ACTIVE_SEQUENCES_TOPIC, FORWARD_PASS_TOPIC,
};
use crate::error::{ReportError, WorkerError};
use crate::fork::ForkGuard;
use crate::load::{LoadReport, WorkerSpec};
use crate::metrics;
use crate::monitor::Monitor;

pub(super) mod outcome;

use outcome::{
    refusal_reasons, ANNOUNCED, APPLIED, EXPIRED, MALFORMED, OUT_OF_ORDER, REFUSAL_COUNT, REFUSED,
    STAT_NAMES,
};
pub use outcome::{Applied, HandleError, SubscriberStats};

/// Default [`SubscriberConfig::max_payload`].
pub const DEFAULT_MAX_PAYLOAD: usize = 16 * 1024;
/// Longest payload decoded on a Dynamo endpoint's `active_sequences_events`
/// subject (or `max_payload`, if larger): 1 MiB, NATS's default limit. A
/// router's booking carries a 9-byte hash per block of its prompt, so one
/// of a 30,000-token prompt is past 16 KiB; the hashes are counted as they
/// are read, never stored.
pub const MAX_SEQUENCE_PAYLOAD: usize = 1024 * 1024;
/// Default [`SubscriberConfig::registration_backlog`].
pub const DEFAULT_REGISTRATION_BACKLOG: usize = 1024;

/// Frontend settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubscriberConfig {
    /// A worker silent this long is removed (default: three heartbeats).
    pub expire_after: Duration,
    /// An extra subject carrying the reference system's `ActiveLoad`
    /// payloads, if any.
    pub active_load_subject: Option<String>,
    /// Longest payload decoded (default 16 KiB; loadgate's own messages
    /// take well under 1 KiB); longer ones are refused unread.
    pub max_payload: usize,
    /// Announcements waiting for registration when attached (default
    /// 1024); more are dropped and counted until the queue drains.
    pub registration_backlog: usize,
    /// Most reference router bookings held at once (default 65,536; see
    /// `bookings.rs`); more are refused and counted.
    pub router_bookings_max: usize,
    /// A reference router's booking held this long is dropped (default
    /// 10 minutes), so a router that died holds its load no longer.
    pub router_booking_ttl: Duration,
}

impl Default for SubscriberConfig {
    fn default() -> Self {
        Self {
            expire_after: 3 * DEFAULT_HEARTBEAT,
            active_load_subject: None,
            max_payload: DEFAULT_MAX_PAYLOAD,
            registration_backlog: DEFAULT_REGISTRATION_BACKLOG,
            router_bookings_max: 65_536,
            router_booking_ttl: Duration::from_secs(600),
        }
    }
}

#[derive(Debug)]
struct Track {
    instance: u64,
    seq: u64,
    /// Clock time at which the worker was last known to be alive: set when
    /// it is announced, and by the first sweep after each later message.
    last_heard: u64,
    /// A message arrived since the last sweep; keeps the clock off the
    /// per-message path.
    heard: bool,
    model: String,
    dp_start: u32,
    dp_size: u32,
}

impl Track {
    fn declares(&self, msg: &LoadRef<'_>) -> bool {
        self.instance == msg.instance
            && self.model == msg.model
            && self.dp_start == msg.dp_start
            && self.dp_size == msg.dp_size
    }
}

/// The frontend side: applies published load to a [`Monitor`].
pub struct Subscriber {
    monitor: Arc<Monitor>,
    clock: SharedClock,
    config: SubscriberConfig,
    tracks: Mutex<HashMap<u64, Track, RandomState>>,
    /// The last `(publisher_id, sequence)` applied per worker from reference
    /// envelopes; only for workers the monitor knows (pruned by `expire`).
    envelope_order: Mutex<EnvelopeOrder>,
    /// Held by registration and expiry (the slow paths), never by the
    /// path of known workers, so the two slow paths never interleave.
    registering: Mutex<()>,
    /// The reference routers' bookings (`active_sequences_events`).
    router_bookings: RouterBookings,
    counters: [AtomicU64; 6],
    refusals: [AtomicU64; REFUSAL_COUNT],
}

impl fmt::Debug for Subscriber {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Subscriber")
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

/// The worker id a loadgate subject names: its last token.
fn subject_worker_id(subject: &str) -> Option<u64> {
    subject.rsplit('.').next()?.parse().ok()
}

impl Subscriber {
    /// A subscriber feeding `monitor`, reading time from `clock`.
    pub fn new(
        monitor: Arc<Monitor>,
        config: SubscriberConfig,
        clock: SharedClock,
    ) -> Result<Arc<Self>, ClusterError> {
        if config.expire_after.is_zero() {
            return Err(ClusterError::InvalidConfig(
                "expire_after must be longer than zero".into(),
            ));
        }
        if config.max_payload == 0
            || config.registration_backlog == 0
            || config.router_bookings_max == 0
        {
            return Err(ClusterError::InvalidConfig(
                "max_payload, registration_backlog and router_bookings_max must be at least 1"
                    .into(),
            ));
        }
        let router_bookings =
            RouterBookings::new(config.router_bookings_max, nanos(config.router_booking_ttl));
        Ok(Arc::new(Self {
            monitor,
            clock,
            config,
            tracks: Mutex::new(HashMap::default()),
            envelope_order: Mutex::new(HashMap::default()),
            registering: Mutex::new(()),
            router_bookings,
            counters: Default::default(),
            refusals: Default::default(),
        }))
    }

    /// The monitor this subscriber feeds.
    pub fn monitor(&self) -> &Arc<Monitor> {
        &self.monitor
    }

    /// Decodes and applies one payload, registering its worker on this
    /// thread if needed. Errors are counted and change nothing. The sender
    /// is not checked: use [`handle_on`](Self::handle_on) for payloads that
    /// arrived on a loadgate subject.
    pub fn handle(&self, payload: &[u8]) -> Result<Applied, HandleError> {
        self.receive(None, payload, None, self.config.max_payload)
    }

    /// [`handle`](Self::handle) for a payload that arrived on `subject`
    /// (`{prefix}.{namespace}.load.{worker_id}`): a loadgate message whose
    /// worker id differs from the subject's is refused as
    /// [`HandleError::Spoofed`].
    pub fn handle_on(&self, subject: &str, payload: &[u8]) -> Result<Applied, HandleError> {
        self.receive(Some(subject), payload, None, self.config.max_payload)
    }

    fn receive(
        &self,
        subject: Option<&str>,
        payload: &[u8],
        queue: Option<&SyncSender<Job>>,
        limit: usize,
    ) -> Result<Applied, HandleError> {
        let result = self.try_receive(subject, payload, queue, limit);
        self.count(&result);
        result
    }

    fn try_receive(
        &self,
        subject: Option<&str>,
        payload: &[u8],
        queue: Option<&SyncSender<Job>>,
        limit: usize,
    ) -> Result<Applied, HandleError> {
        if payload.len() > limit {
            return Err(HandleError::Oversized {
                len: payload.len(),
                limit,
            });
        }
        let msg = match decode_ref(payload).map_err(HandleError::Wire)? {
            DecodedRef::ActiveLoad(a) => {
                return self
                    .monitor
                    .report(a.worker_id, a.dp_rank, &a.report())
                    .map(|()| Applied::Report)
                    .map_err(HandleError::Report)
            }
            DecodedRef::Envelope(e) => {
                let l = &e.load;
                let key = (l.worker_id, Topic::KvMetrics);
                return self.apply_envelope(
                    key,
                    e.publisher_id,
                    e.sequence,
                    l.dp_rank,
                    &l.report(),
                );
            }
            DecodedRef::ForwardPass(f) => {
                let key = (f.worker_id, Topic::ForwardPass);
                return self.apply_envelope(
                    key,
                    f.publisher_id,
                    f.sequence,
                    f.dp_rank,
                    &f.report(),
                );
            }
            DecodedRef::Sequence(event) => {
                let now = self.clock.now_nanos();
                return self.router_bookings.apply(&self.monitor, event, now);
            }
            DecodedRef::Load(msg) => msg,
        };
        if let Some(subject) = subject {
            if subject_worker_id(subject) != Some(msg.worker_id) {
                return Err(HandleError::Spoofed {
                    subject: subject.to_owned(),
                    worker_id: msg.worker_id,
                });
            }
        }
        if let Some(applied) = self.apply_known(&msg) {
            return applied;
        }
        // Checked before queueing, so the queue holds only bounded names.
        self.monitor
            .config()
            .limits
            .check_declaration(&msg.model, msg.dp_start, msg.dp_size)
            .map_err(HandleError::Worker)?;
        match queue {
            None => self.register(&msg),
            Some(queue) => match queue.try_send(Job::Register(msg.into_owned())) {
                Ok(()) => Ok(Applied::Queued),
                Err(_) => Err(HandleError::Backlog),
            },
        }
    }

    fn count(&self, result: &Result<Applied, HandleError>) {
        let i = match result {
            Ok(Applied::Report) => APPLIED,
            Ok(Applied::Announced) => ANNOUNCED,
            Ok(Applied::OutOfOrder) => OUT_OF_ORDER,
            Ok(Applied::Queued | Applied::Ignored) => return,
            Err(e) => {
                let kind = e.kind();
                // Every kind a message can be refused with is a reason
                // (add_worker never answers `unknown_worker`).
                if let Some(r) = refusal_reasons().position(|k| k == kind) {
                    self.refusals[r].fetch_add(1, Ordering::Relaxed);
                }
                match e {
                    HandleError::Oversized { .. } | HandleError::Wire(_) => MALFORMED,
                    _ => REFUSED,
                }
            }
        };
        self.counters[i].fetch_add(1, Ordering::Relaxed);
    }

    /// Applies a reference event-plane envelope to a worker the application
    /// declared (these carry no declaration). Envelopes are ordered per
    /// worker and topic by `sequence` within one `publisher_id` (each topic
    /// has its own publisher); a new `publisher_id` is a restarted worker
    /// and starts a new order.
    fn apply_envelope(
        &self,
        key: (u64, Topic),
        publisher_id: u64,
        sequence: u64,
        dp_rank: u32,
        report: &LoadReport,
    ) -> Result<Applied, HandleError> {
        let mut order = lock(&self.envelope_order);
        if let Some(&(publisher, last)) = order.get(&key) {
            if publisher == publisher_id && sequence <= last {
                return Ok(Applied::OutOfOrder);
            }
        }
        let result = self.monitor.report(key.0, dp_rank, report);
        if let Err(ReportError::UnknownWorker(_)) = result {
            order.remove(&key);
        } else {
            order.insert(key, (publisher_id, sequence));
        }
        result
            .map(|()| Applied::Report)
            .map_err(HandleError::Report)
    }

    /// The fast path: applies `msg` if its worker is tracked with the same
    /// declaration; `None` if it has to be registered.
    fn apply_known(&self, msg: &LoadRef<'_>) -> Option<Result<Applied, HandleError>> {
        // Held while applying, so two messages of one worker never apply out
        // of the order their sequence check passed in.
        let mut tracks = lock(&self.tracks);
        let t = tracks.get_mut(&msg.worker_id).filter(|t| t.declares(msg))?;
        if msg.seq <= t.seq {
            return Some(Ok(Applied::OutOfOrder));
        }
        t.seq = msg.seq;
        t.heard = true;
        let result = self
            .monitor
            .report(msg.worker_id, msg.dp_rank, &msg.report)
            .map(|()| Applied::Report)
            .map_err(HandleError::Report);
        if let Err(HandleError::Report(ReportError::UnknownWorker(_))) = result {
            // Removed from the monitor by the application: forget it, so
            // its next message registers it again.
            tracks.remove(&msg.worker_id);
        }
        Some(result)
    }

    /// The slow path: registers `msg`'s worker (replacing an older
    /// declaration of it) and applies the message. Serialized with other
    /// registrations and with expiry; the `tracks` lock is taken only to
    /// read and write the track, never while the monitor registers.
    fn register(&self, msg: &LoadRef<'_>) -> Result<Applied, HandleError> {
        let _registering = lock(&self.registering);
        // An earlier queued message may have registered it meanwhile.
        if let Some(applied) = self.apply_known(msg) {
            return applied;
        }
        let replaced = lock(&self.tracks).remove(&msg.worker_id).is_some();
        if replaced {
            let _ = self.monitor.remove_worker(msg.worker_id);
        }
        let spec = WorkerSpec {
            dp_start: msg.dp_start,
            dp_size: msg.dp_size,
            kv_total_blocks: msg.report.kv_total_blocks,
            max_num_batched_tokens: msg.report.max_num_batched_tokens,
            max_num_seqs: msg.report.max_num_seqs,
        };
        match self.monitor.add_worker(&msg.model, msg.worker_id, spec) {
            // Registered locally by the embedding application: adopt it.
            Ok(()) | Err(WorkerError::Duplicate(_)) => {}
            Err(e) => return Err(HandleError::Worker(e)),
        }
        let mut tracks = lock(&self.tracks);
        tracks.insert(
            msg.worker_id,
            Track {
                instance: msg.instance,
                seq: msg.seq,
                last_heard: self.clock.now_nanos(),
                heard: false,
                model: msg.model.clone().into_owned(),
                dp_start: msg.dp_start,
                dp_size: msg.dp_size,
            },
        );
        self.monitor
            .report(msg.worker_id, msg.dp_rank, &msg.report)
            .map_err(HandleError::Report)?;
        Ok(Applied::Announced)
    }

    /// Removes workers silent for `expire_after`; returns their ids.
    ///
    /// Messages only mark a worker as heard (no clock read per message);
    /// this sweep turns the mark into a time. So a worker is removed between
    /// `expire_after` and `expire_after` plus one sweep period after its last
    /// message ([`attach`](Self::attach) sweeps every quarter of
    /// `expire_after`, at most every 250 ms). The monitor's removals run
    /// outside the `tracks` lock, so known workers' reports go on meanwhile.
    pub fn expire(&self) -> Vec<u64> {
        let _registering = lock(&self.registering);
        let now = self.clock.now_nanos();
        let limit = nanos(self.config.expire_after);
        let silent: Vec<u64> = {
            let mut tracks = lock(&self.tracks);
            for t in tracks.values_mut().filter(|t| t.heard) {
                t.heard = false;
                t.last_heard = now;
            }
            let silent: Vec<u64> = tracks
                .iter()
                .filter(|(_, t)| now.saturating_sub(t.last_heard) >= limit)
                .map(|(id, _)| *id)
                .collect();
            for id in &silent {
                tracks.remove(id);
            }
            silent
        };
        for id in &silent {
            let _ = self.monitor.remove_worker(*id);
            self.counters[EXPIRED].fetch_add(1, Ordering::Relaxed);
        }
        lock(&self.envelope_order).retain(|(id, _), _| self.monitor.is_busy(*id).is_ok());
        self.router_bookings.expire(now);
        silent
    }

    /// Reference router bookings held now (see [`SubscriberConfig`]).
    pub fn router_bookings(&self) -> usize {
        self.router_bookings.len()
    }

    /// Counters so far.
    pub fn stats(&self) -> SubscriberStats {
        let c = |i: usize| self.counters[i].load(Ordering::Relaxed);
        SubscriberStats {
            applied: c(APPLIED),
            announced: c(ANNOUNCED),
            out_of_order: c(OUT_OF_ORDER),
            malformed: c(MALFORMED),
            refused: c(REFUSED),
            expired: c(EXPIRED),
        }
    }

    /// Refusals so far, by reason (every reason a message can be refused
    /// for, zeros included).
    pub fn refusals(&self) -> Vec<(&'static str, u64)> {
        refusal_reasons()
            .zip(&self.refusals)
            .map(|(reason, n)| (reason, n.load(Ordering::Relaxed)))
            .collect()
    }

    /// The counters in Prometheus text format, under the monitor's prefix:
    /// `frontend_load_messages_total{outcome}` and
    /// `frontend_load_messages_refused_total{reason}`.
    pub fn metrics_text(&self) -> String {
        let p = self.monitor.config().metrics_prefix.as_str();
        let mut out = String::new();
        let name = "frontend_load_messages_total";
        metrics::header(
            &mut out,
            p,
            name,
            "counter",
            "Load messages received, by outcome.",
        );
        for (i, outcome) in STAT_NAMES.iter().enumerate() {
            metrics::sample(
                &mut out,
                p,
                name,
                &[("outcome", outcome)],
                self.counters[i].load(Ordering::Relaxed),
            );
        }
        let name = "frontend_load_messages_refused_total";
        metrics::header(
            &mut out,
            p,
            name,
            "counter",
            "Load messages not applied, by reason.",
        );
        for (reason, n) in self.refusals() {
            metrics::sample(&mut out, p, name, &[("reason", &reason)], n);
        }
        let name = "frontend_router_bookings";
        let help = "Reference routers' bookings held (their active_sequences_events).";
        metrics::header(&mut out, p, name, "gauge", help);
        metrics::sample(&mut out, p, name, &[], self.router_bookings());
        out
    }

    /// Subscribes to every worker's load on `transport` and starts the
    /// subscriber's thread, which registers new workers from a bounded
    /// queue and expires silent ones. Both stop when the returned handle
    /// is dropped.
    pub fn attach(
        self: &Arc<Self>,
        transport: &dyn Transport,
        subjects: &Subjects,
    ) -> Result<Attached, ClusterError> {
        let (queue, jobs) = mpsc::sync_channel(self.config.registration_backlog);
        let mut subscriptions = Vec::new();
        let (me, q) = (self.clone(), queue.clone());
        subscriptions.push(transport.subscribe(
            &subjects.load_all(),
            Arc::new(move |subject: &str, p: &[u8]| {
                let _ = me.receive(Some(subject), p, Some(&q), me.config.max_payload);
            }),
        )?);
        if let Some(subject) = &self.config.active_load_subject {
            // A Dynamo endpoint's kv_metrics subject brings its
            // forward-pass-metrics (liveness and queue depth) and its
            // routers' active_sequences_events (their bookings) with it.
            let siblings: Vec<String> = [FORWARD_PASS_TOPIC, ACTIVE_SEQUENCES_TOPIC]
                .iter()
                .filter_map(|topic| dynamo_sibling_subject(subject, topic))
                .collect();
            for subject in std::iter::once(subject).chain(&siblings) {
                let (me, q) = (self.clone(), queue.clone());
                // A router's booking carries a hash per block of its prompt:
                // up to NATS's own limit.
                let limit = if subject.ends_with(ACTIVE_SEQUENCES_TOPIC) {
                    self.config.max_payload.max(MAX_SEQUENCE_PAYLOAD)
                } else {
                    self.config.max_payload
                };
                subscriptions.push(transport.subscribe(
                    subject,
                    Arc::new(move |_: &str, p: &[u8]| {
                        let _ = me.receive(None, p, Some(&q), limit);
                    }),
                )?);
            }
        }
        let tick = (self.config.expire_after / 4).min(Duration::from_millis(250));
        let me = self.clone();
        let thread = std::thread::Builder::new()
            .name("loadgate-registrar".into())
            .spawn(move || me.serve(&jobs, tick))
            .map_err(|e| {
                ClusterError::Transport(format!("cannot start the registration thread: {e}"))
            })?;
        Ok(Attached {
            subscriptions,
            queue,
            thread: Some(thread),
            made_in: ForkGuard::new(),
        })
    }

    /// The attached subscriber's thread: registrations as they come, and
    /// an expiry sweep every `tick`.
    fn serve(&self, jobs: &Receiver<Job>, tick: Duration) {
        let mut next_sweep = Instant::now() + tick;
        loop {
            match jobs.recv_timeout(next_sweep.saturating_duration_since(Instant::now())) {
                Ok(Job::Register(msg)) => {
                    let result = self.register(&msg.as_ref());
                    self.count(&result);
                }
                Ok(Job::Barrier(done)) => {
                    let _ = done.send(());
                }
                Ok(Job::Stop) | Err(RecvTimeoutError::Disconnected) => return,
                Err(RecvTimeoutError::Timeout) => {}
            }
            if Instant::now() >= next_sweep {
                self.expire();
                next_sweep = Instant::now() + tick;
            }
        }
    }
}

/// Per worker and topic, the reference publisher last heard and its last
/// sequence number.
type EnvelopeOrder = HashMap<(u64, Topic), (u64, u64), RandomState>;

/// The reference topics an envelope's order is kept per.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Topic {
    KvMetrics,
    ForwardPass,
}

/// Work for an attached subscriber's thread.
enum Job {
    Register(LoadMessage),
    Barrier(SyncSender<()>),
    Stop,
}

/// A subscriber attached to a transport; dropping it detaches.
pub struct Attached {
    subscriptions: Vec<Subscription>,
    queue: SyncSender<Job>,
    thread: Option<JoinHandle<()>>,
    /// The process that attached: a forked child has no registration
    /// thread to send to or wait for.
    made_in: ForkGuard,
}

impl Attached {
    /// Waits until every announcement queued so far has been registered
    /// (or refused). Messages delivered later may still be queued.
    pub fn settle(&self) {
        if !self.made_in.same_process() {
            return; // a forked child: nothing registers here
        }
        let (done, wait) = mpsc::sync_channel(1);
        if self.queue.send(Job::Barrier(done)).is_ok() {
            let _ = wait.recv();
        }
    }
}

impl fmt::Debug for Attached {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Attached")
    }
}

impl Drop for Attached {
    fn drop(&mut self) {
        self.subscriptions.clear();
        if !self.made_in.same_process() {
            // A forked child: the registration thread is not here; a full
            // queue would block the send and the join would never return.
            if let Some(t) = self.thread.take() {
                std::mem::forget(t);
            }
            return;
        }
        let _ = self.queue.send(Job::Stop);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests;
