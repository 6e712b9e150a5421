//! The worker side: coalescing load reports and publishing them.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use super::{dynamo_kv_metrics_subject, lock, ClusterError, Subjects, Transport};
use crate::clock::{nanos, MonotonicClock, SharedClock};
use crate::cluster::wire::{ActiveLoad, Envelope, LoadMessage, SCHEMA_VERSION};
use crate::error::ReportError;
use crate::fork::ForkGuard;
use crate::limits::Limits;
use crate::load::{rank_index, LoadReport};

/// Default heartbeat period of a publisher.
pub const DEFAULT_HEARTBEAT: Duration = Duration::from_secs(1);

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
    /// Requests each rank's engine runs at once at most (its
    /// `max_num_seqs`), if known.
    pub max_num_seqs: Option<u64>,
    /// Period of the full re-send.
    pub heartbeat: Duration,
    /// Bounds on the declaration (model name length, ranks); by default
    /// those of a default [`Monitor`](crate::Monitor), so a publisher
    /// never declares what default frontends refuse.
    pub limits: Limits,
    /// What to publish and where: loadgate's own messages (the default) or
    /// the reference's event-plane envelope.
    pub format: WireFormat,
}

/// The message format and subject a publisher uses.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum WireFormat {
    /// loadgate's [`LoadMessage`] (declaration included) on
    /// `{prefix}.{namespace}.load.{worker_id}`.
    #[default]
    Loadgate,
    /// The reference's event-plane envelope around its `ActiveLoad` on
    /// `namespace.{namespace}.component.{component}.endpoint.{endpoint}.kv_metrics`
    /// (see [`dynamo_kv_metrics_subject`]), so a reference frontend reads
    /// this worker. The envelope carries no declaration: frontends declare
    /// the worker themselves.
    Dynamo {
        /// The reference namespace.
        namespace: String,
        /// The worker's component.
        component: String,
        /// The worker's endpoint.
        endpoint: String,
    },
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
            max_num_seqs: None,
            heartbeat: DEFAULT_HEARTBEAT,
            limits: Limits::default(),
            format: WireFormat::Loadgate,
        }
    }

    /// Checks the settings (a non-empty model name within
    /// `limits.max_name_len`, ranks that fit in `u32` and within
    /// `limits.max_ranks_per_worker`, a non-zero heartbeat) without
    /// connecting anything.
    pub fn validate(&self) -> Result<(), ClusterError> {
        self.limits
            .check_declaration(&self.model, self.dp_start, self.dp_size)
            .map_err(|e| ClusterError::InvalidConfig(e.to_string()))?;
        if self.heartbeat.is_zero() {
            return Err(ClusterError::InvalidConfig(
                "heartbeat must be longer than zero".into(),
            ));
        }
        if let WireFormat::Dynamo {
            namespace,
            component,
            endpoint,
        } = &self.format
        {
            if [namespace, component, endpoint].iter().any(|s| *s == "*") {
                return Err(ClusterError::InvalidSubject(
                    "a publisher's namespace, component and endpoint cannot be wildcards".into(),
                ));
            }
            dynamo_kv_metrics_subject(namespace, component, endpoint)?;
        }
        Ok(())
    }

    /// The subject this publisher sends on.
    fn subject(&self, subjects: &Subjects) -> Result<String, ClusterError> {
        match &self.format {
            WireFormat::Loadgate => Ok(subjects.load(self.worker_id)),
            WireFormat::Dynamo {
                namespace,
                component,
                endpoint,
            } => dynamo_kv_metrics_subject(namespace, component, endpoint),
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
    /// The process that started it: a forked child has neither its sending
    /// thread nor its transport's connection.
    made_in: ForkGuard,
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
        config.validate()?;
        let ranks = vec![PendingRank::default(); config.dp_size as usize];
        let inner = Arc::new(PublisherInner {
            subject: config.subject(subjects)?,
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
            made_in: ForkGuard::new(),
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
    /// In a forked child of the process that made the publisher it refuses
    /// with [`ReportError::OtherProcess`]: nothing could send the report.
    pub fn report(&self, dp_rank: u32, report: &LoadReport) -> Result<(), ReportError> {
        if !self.made_in.same_process() {
            return Err(ReportError::OtherProcess);
        }
        let c = &self.inner.config;
        let index = rank_index(c.worker_id, c.dp_start, c.dp_size, dp_rank)?;
        report.check()?;
        let mut state = lock(&self.inner.state);
        let rank = &mut state.ranks[index as usize];
        merge(&mut rank.load, report);
        rank.dirty = true;
        drop(state);
        self.inner.wake.notify_one();
        Ok(())
    }

    /// Sends every changed rank, and every rank if a heartbeat is due.
    /// Returns the number of messages sent (none in a forked child of the
    /// process that made the publisher).
    pub fn flush(&self) -> usize {
        if !self.made_in.same_process() {
            return 0;
        }
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
        if !self.made_in.same_process() {
            // A forked child: the sending thread is not here, and its lock
            // may have been copied held. Let both go without waiting.
            if let Some(t) = self.thread.take() {
                std::mem::forget(t);
            }
            return;
        }
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
    set(&mut into.waiting_requests, new.waiting_requests);
    set(&mut into.max_num_seqs, new.max_num_seqs);
}

/// Wall-clock time in unix milliseconds, for the reference envelope's
/// `published_at` (informational: readers order by `sequence`).
pub(super) fn unix_millis() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// A process-unique, run-unique publisher instance id.
pub(super) fn instance_id() -> u64 {
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
                    waiting_requests: load.waiting_requests,
                    max_num_seqs: load.max_num_seqs.or(c.max_num_seqs),
                });
            }
            out
        };
        for m in &messages {
            let payload = match self.config.format {
                WireFormat::Loadgate => m.to_msgpack(),
                WireFormat::Dynamo { .. } => Envelope {
                    publisher_id: m.instance,
                    // The reference counts from 0; `seq` counts from 1.
                    sequence: m.seq - 1,
                    load: ActiveLoad {
                        worker_id: m.worker_id,
                        dp_rank: m.dp_rank,
                        active_decode_blocks: m.active_decode_blocks,
                        active_prefill_tokens: m.active_prefill_tokens,
                        kv_used_blocks: m.kv_used_blocks,
                    },
                }
                .to_msgpack(unix_millis()),
            };
            match self.transport.publish(&self.subject, payload) {
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
