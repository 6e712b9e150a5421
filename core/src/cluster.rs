//! Load reports across machines (SPEC §7).
//!
//! Workers run a [`Publisher`]: `report` merges a rank's new load into a
//! pending state and returns at once; a background thread sends every changed
//! rank as a [`LoadMessage`] (coalescing reports that arrive while it sends)
//! and re-sends every rank about once a second as a heartbeat, so a frontend
//! that joins late learns each worker, its model, ranks and capacities.
//!
//! Frontends run a [`Subscriber`]: it decodes each payload, registers a worker
//! in its [`Monitor`] on the first message, applies reports, drops messages
//! whose sequence number is not newer than the last one applied, and removes
//! a worker silent for `expire_after` (three heartbeats by default). Because
//! every frontend applies the same messages to the same busy rule, all
//! frontends converge on the same busy set; thresholds stay local to each
//! frontend.
//!
//! Messages travel over a [`Transport`]: [`InProcessBus`] (the embedded
//! default) or, with the `nats` feature, [`nats::NatsTransport`] (NATS core
//! pub/sub). Subjects are `{prefix}.{namespace}.load.{worker_id}`.

use std::collections::HashMap;
use std::fmt;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::clock::{nanos, MonotonicClock, SharedClock};
use crate::error::{ReportError, WorkerError};
use crate::metrics;
use crate::monitor::{LoadReport, Monitor, WorkerSpec};
use crate::wire::{decode_ref, DecodedRef, LoadMessage, LoadRef, WireError, SCHEMA_VERSION};

/// Default subject prefix.
pub const DEFAULT_PREFIX: &str = "loadgate";
/// Default heartbeat period of a publisher.
pub const DEFAULT_HEARTBEAT: Duration = Duration::from_secs(1);

/// A cluster setup or transport failure.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClusterError {
    /// A subject prefix or namespace that is not a plain NATS token.
    InvalidSubject(String),
    /// A setting out of range.
    InvalidConfig(String),
    /// The transport failed (connect, subscribe or publish).
    Transport(String),
}

impl fmt::Display for ClusterError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ClusterError::InvalidSubject(s) => write!(f, "invalid subject token: {s}"),
            ClusterError::InvalidConfig(s) => write!(f, "invalid setting: {s}"),
            ClusterError::Transport(s) => write!(f, "transport error: {s}"),
        }
    }
}

impl std::error::Error for ClusterError {}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

// ---------------------------------------------------------------------------
// Subjects and transports.

/// The subjects one deployment uses: `{prefix}.{namespace}.load.{worker_id}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Subjects {
    base: String,
}

impl Subjects {
    /// Subjects under the default prefix `loadgate`.
    pub fn new(namespace: &str) -> Result<Self, ClusterError> {
        Self::with_prefix(DEFAULT_PREFIX, namespace)
    }

    /// Subjects under `prefix` (one or more dot-separated tokens).
    pub fn with_prefix(prefix: &str, namespace: &str) -> Result<Self, ClusterError> {
        for token in prefix.split('.').chain(std::iter::once(namespace)) {
            let bad = token.is_empty()
                || token
                    .chars()
                    .any(|c| c.is_whitespace() || matches!(c, '.' | '*' | '>'));
            if bad {
                return Err(ClusterError::InvalidSubject(format!(
                    "{token:?} in prefix {prefix:?} / namespace {namespace:?}: tokens must be non-empty \
                     without whitespace, '.', '*' or '>'"
                )));
            }
        }
        Ok(Self {
            base: format!("{prefix}.{namespace}.load"),
        })
    }

    /// The subject one worker publishes on.
    pub fn load(&self, worker_id: u64) -> String {
        format!("{}.{worker_id}", self.base)
    }

    /// The wildcard subject a frontend subscribes to.
    pub fn load_all(&self) -> String {
        format!("{}.*", self.base)
    }
}

/// Whether `subject` matches a NATS `pattern` (`*` one token, `>` the rest).
pub fn subject_matches(pattern: &str, subject: &str) -> bool {
    let mut subject_tokens = subject.split('.');
    for p in pattern.split('.') {
        match (p, subject_tokens.next()) {
            (">", Some(_)) => return true,
            (_, None) => return false,
            ("*", Some(_)) => {}
            (p, Some(s)) if p == s => {}
            _ => return false,
        }
    }
    subject_tokens.next().is_none()
}

/// A message handler: called with each payload on the subscribed subject.
pub type Handler = Arc<dyn Fn(&[u8]) + Send + Sync>;

/// Pub/sub as loadgate needs it: fire-and-forget publish, wildcard subscribe.
pub trait Transport: Send + Sync {
    /// Publishes `payload` on `subject` without waiting for delivery.
    fn publish(&self, subject: &str, payload: Vec<u8>) -> Result<(), ClusterError>;
    /// Calls `handler` for every message on `subject` (wildcards allowed)
    /// until the returned [`Subscription`] is dropped.
    fn subscribe(&self, subject: &str, handler: Handler) -> Result<Subscription, ClusterError>;
}

/// An active subscription; dropping it unsubscribes.
pub struct Subscription {
    on_drop: Option<Box<dyn FnOnce() + Send>>,
}

impl Subscription {
    /// A subscription that runs `cancel` when dropped.
    pub fn new(cancel: impl FnOnce() + Send + 'static) -> Self {
        Self {
            on_drop: Some(Box::new(cancel)),
        }
    }
}

impl fmt::Debug for Subscription {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Subscription")
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        if let Some(cancel) = self.on_drop.take() {
            cancel();
        }
    }
}

/// The embedded default transport: delivery inside one process, synchronous
/// on the publishing thread. Cloning shares the bus.
#[derive(Clone, Default)]
pub struct InProcessBus {
    inner: Arc<BusInner>,
}

#[derive(Default)]
struct BusInner {
    subscribers: Mutex<Vec<(u64, String, Handler)>>,
    next_id: AtomicU64,
}

impl InProcessBus {
    /// A new, empty bus.
    pub fn new() -> Self {
        Self::default()
    }
}

impl fmt::Debug for InProcessBus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("InProcessBus")
            .field("subscribers", &lock(&self.inner.subscribers).len())
            .finish()
    }
}

impl Transport for InProcessBus {
    fn publish(&self, subject: &str, payload: Vec<u8>) -> Result<(), ClusterError> {
        let handlers: Vec<Handler> = lock(&self.inner.subscribers)
            .iter()
            .filter(|(_, pattern, _)| subject_matches(pattern, subject))
            .map(|(_, _, h)| h.clone())
            .collect();
        for h in handlers {
            h(&payload);
        }
        Ok(())
    }

    fn subscribe(&self, subject: &str, handler: Handler) -> Result<Subscription, ClusterError> {
        let id = self.inner.next_id.fetch_add(1, Ordering::Relaxed);
        lock(&self.inner.subscribers).push((id, subject.to_owned(), handler));
        let weak = Arc::downgrade(&self.inner);
        Ok(Subscription::new(move || {
            if let Some(inner) = weak.upgrade() {
                lock(&inner.subscribers).retain(|(i, _, _)| *i != id);
            }
        }))
    }
}

// ---------------------------------------------------------------------------
// Worker side.

/// What a publishing worker declares about itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublisherConfig {
    /// The worker's id.
    pub worker_id: u64,
    /// The worker's model.
    pub model: String,
    /// First data-parallel rank.
    pub dp_start: u32,
    /// Number of ranks.
    pub dp_size: u32,
    /// KV cache capacity per rank, if known.
    pub kv_total_blocks: Option<u64>,
    /// Prefill batch capacity per rank, if known.
    pub max_num_batched_tokens: Option<u64>,
    /// Period of the full re-send.
    pub heartbeat: Duration,
}

impl PublisherConfig {
    /// A single-rank worker of `model` with the default heartbeat.
    pub fn new(worker_id: u64, model: impl Into<String>) -> Self {
        Self {
            worker_id,
            model: model.into(),
            dp_start: 0,
            dp_size: 1,
            kv_total_blocks: None,
            max_num_batched_tokens: None,
            heartbeat: DEFAULT_HEARTBEAT,
        }
    }
}

#[derive(Debug, Default, Clone, Copy)]
struct PendingRank {
    load: LoadReport,
    dirty: bool,
}

#[derive(Debug)]
struct PublisherState {
    ranks: Vec<PendingRank>,
    seq: u64,
    last_heartbeat: Option<u64>,
    stop: bool,
}

struct PublisherInner {
    config: PublisherConfig,
    subject: String,
    instance: u64,
    transport: Arc<dyn Transport>,
    clock: SharedClock,
    state: Mutex<PublisherState>,
    /// Held while building and sending one batch, so batches leave in
    /// sequence order even when `flush` is called from several threads.
    sending: Mutex<()>,
    wake: Condvar,
    sent: AtomicU64,
    failed: AtomicU64,
}

/// The worker side: coalesces load reports and publishes them.
pub struct Publisher {
    inner: Arc<PublisherInner>,
    thread: Option<JoinHandle<()>>,
}

impl fmt::Debug for Publisher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Publisher")
            .field("config", &self.inner.config)
            .finish_non_exhaustive()
    }
}

impl Publisher {
    /// A publisher driven by hand: call [`flush`](Self::flush) to send.
    pub fn new(
        config: PublisherConfig,
        transport: Arc<dyn Transport>,
        subjects: &Subjects,
        clock: SharedClock,
    ) -> Result<Self, ClusterError> {
        if config.model.is_empty() {
            return Err(ClusterError::InvalidConfig(
                "model must not be empty".into(),
            ));
        }
        if config.dp_start.checked_add(config.dp_size).is_none() {
            return Err(ClusterError::InvalidConfig(
                "dp_start + dp_size overflows u32".into(),
            ));
        }
        if config.heartbeat.is_zero() {
            return Err(ClusterError::InvalidConfig(
                "heartbeat must be longer than zero".into(),
            ));
        }
        let ranks = vec![PendingRank::default(); config.dp_size as usize];
        let inner = Arc::new(PublisherInner {
            subject: subjects.load(config.worker_id),
            instance: instance_id(),
            transport,
            clock,
            state: Mutex::new(PublisherState {
                ranks,
                seq: 0,
                last_heartbeat: None,
                stop: false,
            }),
            sending: Mutex::new(()),
            wake: Condvar::new(),
            sent: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            config,
        });
        Ok(Self {
            inner,
            thread: None,
        })
    }

    /// A publisher with its own sending thread on the monotonic clock: it
    /// sends changes as they come and heartbeats on time. The thread stops
    /// when the publisher is dropped.
    pub fn spawn(
        config: PublisherConfig,
        transport: Arc<dyn Transport>,
        subjects: &Subjects,
    ) -> Result<Self, ClusterError> {
        let mut publisher = Self::new(config, transport, subjects, MonotonicClock::shared())?;
        let inner = publisher.inner.clone();
        let thread = std::thread::Builder::new()
            .name("loadgate-publisher".into())
            .spawn(move || inner.run())
            .map_err(|e| {
                ClusterError::Transport(format!("cannot start the publisher thread: {e}"))
            })?;
        publisher.thread = Some(thread);
        Ok(publisher)
    }

    /// Merges a rank's new load (absent fields keep their value) and returns
    /// at once; the change is sent on the next flush.
    pub fn report(&self, dp_rank: u32, report: &LoadReport) -> Result<(), ReportError> {
        let c = &self.inner.config;
        let index = dp_rank
            .checked_sub(c.dp_start)
            .filter(|i| *i < c.dp_size)
            .ok_or(ReportError::UndeclaredRank {
                worker_id: c.worker_id,
                dp_rank,
                dp_start: c.dp_start,
                dp_size: c.dp_size,
            })?;
        if report.active_prefill_tokens == Some(u64::MAX) {
            return Err(ReportError::InvalidValue {
                field: "active_prefill_tokens",
                value: u64::MAX,
            });
        }
        let mut state = lock(&self.inner.state);
        let rank = &mut state.ranks[index as usize];
        merge(&mut rank.load, report);
        rank.dirty = true;
        drop(state);
        self.inner.wake.notify_one();
        Ok(())
    }

    /// Sends every changed rank, and every rank if a heartbeat is due.
    /// Returns the number of messages sent.
    pub fn flush(&self) -> usize {
        self.inner.flush()
    }

    /// Messages sent so far.
    pub fn messages_sent(&self) -> u64 {
        self.inner.sent.load(Ordering::Relaxed)
    }

    /// Messages the transport refused so far.
    pub fn messages_failed(&self) -> u64 {
        self.inner.failed.load(Ordering::Relaxed)
    }
}

impl Drop for Publisher {
    fn drop(&mut self) {
        lock(&self.inner.state).stop = true;
        self.inner.wake.notify_all();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn merge(into: &mut LoadReport, new: &LoadReport) {
    let set = |slot: &mut Option<u64>, v: Option<u64>| {
        if v.is_some() {
            *slot = v;
        }
    };
    set(&mut into.active_decode_blocks, new.active_decode_blocks);
    set(&mut into.kv_used_blocks, new.kv_used_blocks);
    set(&mut into.kv_total_blocks, new.kv_total_blocks);
    set(&mut into.active_prefill_tokens, new.active_prefill_tokens);
    set(&mut into.max_num_batched_tokens, new.max_num_batched_tokens);
}

/// A process-unique, run-unique publisher instance id.
fn instance_id() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
    h.write_u32(std::process::id());
    h.finish()
}

impl PublisherInner {
    fn heartbeat_due(&self, state: &PublisherState, now: u64) -> bool {
        state
            .last_heartbeat
            .is_none_or(|t| now.saturating_sub(t) >= nanos(self.config.heartbeat))
    }

    fn flush(&self) -> usize {
        let _sending = lock(&self.sending);
        let now = self.clock.now_nanos();
        let messages: Vec<LoadMessage> = {
            let mut state = lock(&self.state);
            let heartbeat = self.heartbeat_due(&state, now);
            if heartbeat {
                state.last_heartbeat = Some(now);
            }
            let c = &self.config;
            let mut out = Vec::new();
            for i in 0..state.ranks.len() {
                if !(heartbeat || state.ranks[i].dirty) {
                    continue;
                }
                state.ranks[i].dirty = false;
                state.seq += 1;
                let load = state.ranks[i].load;
                out.push(LoadMessage {
                    v: SCHEMA_VERSION,
                    instance: self.instance,
                    seq: state.seq,
                    worker_id: c.worker_id,
                    model: c.model.clone(),
                    dp_start: c.dp_start,
                    dp_size: c.dp_size,
                    dp_rank: c.dp_start + i as u32,
                    kv_total_blocks: load.kv_total_blocks.or(c.kv_total_blocks),
                    max_num_batched_tokens: load
                        .max_num_batched_tokens
                        .or(c.max_num_batched_tokens),
                    active_decode_blocks: load.active_decode_blocks,
                    kv_used_blocks: load.kv_used_blocks,
                    active_prefill_tokens: load.active_prefill_tokens,
                });
            }
            out
        };
        for m in &messages {
            match self.transport.publish(&self.subject, m.to_msgpack()) {
                Ok(()) => self.sent.fetch_add(1, Ordering::Relaxed),
                Err(_) => self.failed.fetch_add(1, Ordering::Relaxed),
            };
        }
        messages.len()
    }

    fn run(&self) {
        loop {
            {
                let mut state = lock(&self.state);
                loop {
                    if state.stop {
                        return;
                    }
                    let now = self.clock.now_nanos();
                    if state.ranks.iter().any(|r| r.dirty) || self.heartbeat_due(&state, now) {
                        break;
                    }
                    let wait = state.last_heartbeat.map_or(0, |t| {
                        nanos(self.config.heartbeat).saturating_sub(now.saturating_sub(t))
                    });
                    state = self
                        .wake
                        .wait_timeout(state, Duration::from_nanos(wait.max(1_000_000)))
                        .unwrap_or_else(|e| e.into_inner())
                        .0;
                }
            }
            self.flush();
        }
    }
}

// ---------------------------------------------------------------------------
// Frontend side.

/// Frontend settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubscriberConfig {
    /// A worker silent this long is removed (default: three heartbeats).
    pub expire_after: Duration,
    /// An extra subject carrying the reference system's `ActiveLoad`
    /// payloads, if any.
    pub active_load_subject: Option<String>,
}

impl Default for SubscriberConfig {
    fn default() -> Self {
        Self {
            expire_after: 3 * DEFAULT_HEARTBEAT,
            active_load_subject: None,
        }
    }
}

/// What happened to one payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Applied {
    /// A report for a known worker was applied.
    Report,
    /// The first message of a worker (or of a restarted one) registered it
    /// and was applied.
    Announced,
    /// Not newer than the last message applied for the worker: dropped.
    OutOfOrder,
}

/// Why a payload was not applied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HandleError {
    /// The payload did not decode.
    Wire(WireError),
    /// The monitor refused the report.
    Report(ReportError),
    /// The monitor refused to register the worker.
    Worker(WorkerError),
}

impl fmt::Display for HandleError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HandleError::Wire(e) => e.fmt(f),
            HandleError::Report(e) => e.fmt(f),
            HandleError::Worker(e) => e.fmt(f),
        }
    }
}

impl std::error::Error for HandleError {}

/// Worker ids are trusted keys: a multiply hash is enough.
#[derive(Default)]
struct IdHasher(u64);

impl Hasher for IdHasher {
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(b)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0 ^ n).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
    fn finish(&self) -> u64 {
        self.0
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

/// Counters of a subscriber.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SubscriberStats {
    /// Reports applied to known workers.
    pub applied: u64,
    /// Workers registered from their first message.
    pub announced: u64,
    /// Messages dropped as out of order.
    pub out_of_order: u64,
    /// Payloads that did not decode (malformed, unknown version, invalid).
    pub malformed: u64,
    /// Reports or registrations the monitor refused.
    pub refused: u64,
    /// Workers removed after going silent.
    pub expired: u64,
}

const STAT_NAMES: [&str; 6] = [
    "applied",
    "announced",
    "out_of_order",
    "malformed",
    "refused",
    "expired",
];

/// The frontend side: applies published load to a [`Monitor`].
pub struct Subscriber {
    monitor: Arc<Monitor>,
    clock: SharedClock,
    config: SubscriberConfig,
    tracks: Mutex<HashMap<u64, Track, BuildHasherDefault<IdHasher>>>,
    counters: [AtomicU64; 6],
}

impl fmt::Debug for Subscriber {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Subscriber")
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
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
        Ok(Arc::new(Self {
            monitor,
            clock,
            config,
            tracks: Mutex::new(HashMap::default()),
            counters: Default::default(),
        }))
    }

    /// The monitor this subscriber feeds.
    pub fn monitor(&self) -> &Arc<Monitor> {
        &self.monitor
    }

    fn count(&self, i: usize) {
        self.counters[i].fetch_add(1, Ordering::Relaxed);
    }

    /// Decodes and applies one payload. Errors are counted and change nothing.
    pub fn handle(&self, payload: &[u8]) -> Result<Applied, HandleError> {
        let result = match decode_ref(payload) {
            Err(e) => {
                self.count(3);
                return Err(HandleError::Wire(e));
            }
            Ok(DecodedRef::ActiveLoad(a)) => self
                .monitor
                .report(a.worker_id, a.dp_rank, &a.report())
                .map(|()| Applied::Report)
                .map_err(HandleError::Report),
            Ok(DecodedRef::Load(msg)) => self.apply(&msg),
        };
        match &result {
            Ok(Applied::Report) => self.count(0),
            Ok(Applied::Announced) => self.count(1),
            Ok(Applied::OutOfOrder) => self.count(2),
            Err(_) => self.count(4),
        }
        result
    }

    fn apply(&self, msg: &LoadRef<'_>) -> Result<Applied, HandleError> {
        // Held while applying, so two messages of one worker never apply out
        // of the order their sequence check passed in.
        let mut tracks = lock(&self.tracks);
        let same_declaration = |t: &Track| {
            t.instance == msg.instance
                && t.model == msg.model
                && t.dp_start == msg.dp_start
                && t.dp_size == msg.dp_size
        };
        let outcome = match tracks.get_mut(&msg.worker_id) {
            Some(t) if same_declaration(t) => {
                if msg.seq <= t.seq {
                    return Ok(Applied::OutOfOrder);
                }
                t.seq = msg.seq;
                t.heard = true;
                Applied::Report
            }
            known => {
                let declared_here = known.is_some();
                if declared_here {
                    let _ = self.monitor.remove_worker(msg.worker_id);
                }
                let spec = WorkerSpec {
                    dp_start: msg.dp_start,
                    dp_size: msg.dp_size,
                    kv_total_blocks: msg.report.kv_total_blocks,
                    max_num_batched_tokens: msg.report.max_num_batched_tokens,
                };
                match self.monitor.add_worker(&msg.model, msg.worker_id, spec) {
                    // Registered locally by the embedding application: adopt it.
                    Ok(()) | Err(WorkerError::Duplicate(_)) => {}
                    Err(e) => {
                        tracks.remove(&msg.worker_id);
                        return Err(HandleError::Worker(e));
                    }
                }
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
                Applied::Announced
            }
        };
        self.monitor
            .report(msg.worker_id, msg.dp_rank, &msg.report)
            .map_err(HandleError::Report)?;
        Ok(outcome)
    }

    /// Removes workers silent for `expire_after`; returns their ids.
    ///
    /// Messages only mark a worker as heard (no clock read per message);
    /// this sweep turns the mark into a time. So a worker is removed between
    /// `expire_after` and `expire_after` plus one sweep period after its last
    /// message ([`attach`](Self::attach) sweeps every quarter of
    /// `expire_after`, at most every 250 ms).
    pub fn expire(&self) -> Vec<u64> {
        let now = self.clock.now_nanos();
        let limit = nanos(self.config.expire_after);
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
            let _ = self.monitor.remove_worker(*id);
            self.count(5);
        }
        silent
    }

    /// Counters so far.
    pub fn stats(&self) -> SubscriberStats {
        let c = |i: usize| self.counters[i].load(Ordering::Relaxed);
        SubscriberStats {
            applied: c(0),
            announced: c(1),
            out_of_order: c(2),
            malformed: c(3),
            refused: c(4),
            expired: c(5),
        }
    }

    /// The counters in Prometheus text format, under the monitor's prefix.
    pub fn metrics_text(&self) -> String {
        let p = self.monitor.config().metrics_prefix.as_str();
        let name = "frontend_load_messages_total";
        let mut out = String::new();
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
        out
    }

    /// Subscribes to every worker's load on `transport` and starts a thread
    /// that expires silent workers. Both stop when the returned handle is
    /// dropped.
    pub fn attach(
        self: &Arc<Self>,
        transport: &dyn Transport,
        subjects: &Subjects,
    ) -> Result<Attached, ClusterError> {
        let mut subscriptions = Vec::new();
        let me = self.clone();
        subscriptions.push(transport.subscribe(
            &subjects.load_all(),
            Arc::new(move |p: &[u8]| {
                let _ = me.handle(p);
            }),
        )?);
        if let Some(subject) = &self.config.active_load_subject {
            let me = self.clone();
            subscriptions.push(transport.subscribe(
                subject,
                Arc::new(move |p: &[u8]| {
                    let _ = me.handle(p);
                }),
            )?);
        }
        let stop = Arc::new((Mutex::new(false), Condvar::new()));
        let tick = (self.config.expire_after / 4).min(Duration::from_millis(250));
        let (me, stop2) = (Arc::downgrade(self), stop.clone());
        let thread = std::thread::Builder::new()
            .name("loadgate-expiry".into())
            .spawn(move || {
                let (flag, cv) = &*stop2;
                let mut stopped = lock(flag);
                while !*stopped {
                    stopped = cv
                        .wait_timeout(stopped, tick)
                        .unwrap_or_else(|e| e.into_inner())
                        .0;
                    match me.upgrade() {
                        Some(s) if !*stopped => {
                            s.expire();
                        }
                        _ => return,
                    }
                }
            })
            .map_err(|e| ClusterError::Transport(format!("cannot start the expiry thread: {e}")))?;
        Ok(Attached {
            _subscriptions: subscriptions,
            stop,
            thread: Some(thread),
        })
    }
}

/// A subscriber attached to a transport; dropping it detaches.
pub struct Attached {
    _subscriptions: Vec<Subscription>,
    stop: Arc<(Mutex<bool>, Condvar)>,
    thread: Option<JoinHandle<()>>,
}

impl fmt::Debug for Attached {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Attached")
    }
}

impl Drop for Attached {
    fn drop(&mut self) {
        *lock(&self.stop.0) = true;
        self.stop.1.notify_all();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

// ---------------------------------------------------------------------------
// NATS.

/// NATS core pub/sub transport (feature `nats`).
#[cfg(feature = "nats")]
pub mod nats {
    use std::future::Future;
    use std::sync::OnceLock;
    use std::time::Duration;

    use futures_util::StreamExt;
    use tokio::runtime::Runtime;
    use tokio::sync::mpsc;

    use super::{ClusterError, Handler, Subscription, Transport};

    /// The process's NATS runtime: one worker thread, started on first use
    /// (so processes that fork workers before connecting stay single-threaded).
    fn runtime() -> &'static Runtime {
        static RUNTIME: OnceLock<Runtime> = OnceLock::new();
        RUNTIME.get_or_init(|| {
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .thread_name("loadgate-nats")
                .enable_all()
                .build()
                .expect("cannot start the loadgate NATS runtime")
        })
    }

    /// Runs `f` to completion on the NATS runtime, from any thread
    /// (including threads that are themselves inside a tokio runtime).
    fn block_on<F>(f: F) -> F::Output
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        if tokio::runtime::Handle::try_current().is_ok() {
            std::thread::spawn(move || runtime().block_on(f))
                .join()
                .expect("NATS call panicked")
        } else {
            runtime().block_on(f)
        }
    }

    /// A connection to a NATS server. Publishing is non-blocking and keeps
    /// order; the connection reconnects by itself after the server restarts
    /// and restores its subscriptions.
    #[derive(Debug, Clone)]
    pub struct NatsTransport {
        client: async_nats::Client,
        outbox: mpsc::UnboundedSender<(String, bytes::Bytes)>,
    }

    impl NatsTransport {
        /// Connects to `url` (e.g. `nats://127.0.0.1:4222`; scheme and port
        /// default to `nats://` and 4222). A malformed URL is
        /// [`ClusterError::InvalidConfig`]; a server that cannot be reached
        /// within two seconds is [`ClusterError::Transport`].
        pub fn connect(url: &str) -> Result<Self, ClusterError> {
            let invalid = |why: &dyn std::fmt::Display| {
                ClusterError::InvalidConfig(format!("{url:?} is not a NATS server URL ({why})"))
            };
            let url: async_nats::ServerAddr = url.parse().map_err(|e| invalid(&e))?;
            if url.host().is_empty() {
                return Err(invalid(&"no host"));
            }
            let client = block_on(async move {
                async_nats::ConnectOptions::new()
                    .name("loadgate")
                    .connection_timeout(Duration::from_secs(2))
                    .max_reconnects(None)
                    .reconnect_delay_callback(|attempts| {
                        Duration::from_millis((50 * attempts as u64).clamp(50, 1000))
                    })
                    .connect(url)
                    .await
            })
            .map_err(|e| ClusterError::Transport(format!("cannot connect to NATS: {e}")))?;
            let (outbox, mut rx) = mpsc::unbounded_channel::<(String, bytes::Bytes)>();
            let publisher = client.clone();
            runtime().spawn(async move {
                while let Some((subject, payload)) = rx.recv().await {
                    // A failed publish (server away) is dropped: heartbeats
                    // re-send the state once the connection is back.
                    let _ = publisher.publish(subject, payload).await;
                }
            });
            Ok(Self { client, outbox })
        }

        /// Waits until everything published so far reached the server.
        pub fn flush(&self) -> Result<(), ClusterError> {
            let client = self.client.clone();
            block_on(async move { client.flush().await })
                .map_err(|e| ClusterError::Transport(format!("flush failed: {e}")))
        }
    }

    impl Transport for NatsTransport {
        fn publish(&self, subject: &str, payload: Vec<u8>) -> Result<(), ClusterError> {
            self.outbox
                .send((subject.to_owned(), payload.into()))
                .map_err(|_| ClusterError::Transport("the NATS runtime has stopped".into()))
        }

        fn subscribe(&self, subject: &str, handler: Handler) -> Result<Subscription, ClusterError> {
            let client = self.client.clone();
            let subject = subject.to_owned();
            let mut stream = block_on(async move { client.subscribe(subject).await })
                .map_err(|e| ClusterError::Transport(format!("cannot subscribe: {e}")))?;
            let task = runtime().spawn(async move {
                while let Some(msg) = stream.next().await {
                    handler(&msg.payload);
                }
            });
            Ok(Subscription::new(move || task.abort()))
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn subjects_and_wildcards() {
        let s = Subjects::new("prod").unwrap();
        assert_eq!(s.load(7), "loadgate.prod.load.7");
        assert!(subject_matches(&s.load_all(), &s.load(7)));
        assert!(!subject_matches(&s.load_all(), "loadgate.dev.load.7"));
        assert!(subject_matches("a.>", "a.b.c"));
        assert!(!subject_matches("a.>", "a"));
        assert!(!subject_matches("a.*", "a.b.c"));
        assert!(subject_matches("a.b", "a.b"));
        for bad in ["", "a.b", "a b", "*", ">"] {
            assert!(Subjects::new(bad).is_err(), "{bad:?}");
        }
        assert!(Subjects::with_prefix("corp.loadgate", "ns").is_ok());
        assert!(Subjects::with_prefix("corp..x", "ns").is_err());
    }
}
