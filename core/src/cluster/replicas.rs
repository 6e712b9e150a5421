//! Booking sync between frontend replicas (docs/replicas.md).
//!
//! Each frontend's [`BookingSync`] publishes a [`Snapshot`] of its own
//! bookings, per worker rank, and of its frontend queues, on
//! `{prefix}.{namespace}.bookings.{frontend_id}`: at most one per
//! `debounce` interval, when they changed, and every `heartbeat` when they
//! did not. It applies the others' snapshots to its monitor: a frontend's
//! view of a rank is the worker's own report, plus its own live bookings,
//! plus every other frontend's latest snapshot.
//!
//! * **Nothing counted twice.** Bookings and a worker's report never add:
//!   every frontend's bookings go into the router-owned fields
//!   (`active_decode_blocks`, `active_prefill_tokens`), the report into the
//!   worker-owned ones (`kv_used_blocks`, `waiting_requests`), and the busy
//!   rule compares each against its line on its own. A request is counted
//!   once in each: by the one frontend that booked it, and by the worker
//!   once it holds it. A snapshot carries only its frontend's own
//!   bookings, which the bookings count apart (`Rank::own_blocks`), so
//!   neither what it learned from the others nor a report that overwrote
//!   a router field ever travels on.
//! * **Order and gaps.** Snapshots are ordered by `seq` within one
//!   `instance` of a frontend; an older one is dropped, and a jump counts
//!   the snapshots missed as gaps. Each snapshot is a full state, so the
//!   next one repairs a gap.
//! * **Joining.** A frontend's first snapshot says `hello`; every frontend
//!   that hears it sends its own at its next tick, so a new frontend knows
//!   the fleet's bookings within one debounce interval and a round trip.
//! * **Expiry.** A frontend silent for `expire_after` (three heartbeats by
//!   default) is forgotten: its bookings leave every rank.
//! * **Hostile input.** A payload is checked for size before it is read; a
//!   snapshot whose frontend is not its subject's last token is refused
//!   (so per-subject NATS permissions bind a frontend to its own
//!   snapshots); at most `max_frontends` are tracked, with at most
//!   `max_entries` rank entries over all of them; entries for workers
//!   or ranks this monitor does not know are skipped (the next heartbeat
//!   applies them once the worker is known); an absurd count is cut to
//!   [`MAX_SHARED`]. Every refusal is counted.
//!
//! A tick reads every rank's two own-booking counters; the attached sync
//! ticks every `debounce` interval on its own thread.
//!
//! In leased mode ([`SyncMode::Leased`]) each snapshot also carries the
//! frontend's claim on every rank's line, and each tick moves this
//! frontend's share by the protocol in `replicas/lease.rs` and sets it in
//! the monitor, whose bookings then stay within it (`monitor/share.rs`).

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use foldhash::fast::RandomState;

use super::publisher::instance_id;
use super::wire::WireError;
use super::{lock, ClusterError, Subjects, Subscription, Transport};
use crate::clock::{nanos, SharedClock};
use crate::fork::ForkGuard;
use crate::metrics::{self, Families};
use crate::monitor::replicas::{RankTotals, Shared};
use crate::monitor::Monitor;

mod config;
mod lease;
mod wire;

pub use config::{
    BookingSyncConfig, SyncMode, DEFAULT_DEBOUNCE, DEFAULT_LEASE, DEFAULT_MAX_ENTRIES,
    DEFAULT_MAX_FRONTENDS, DEFAULT_SNAPSHOT_MAX_PAYLOAD, MAX_FRONTENDS, MAX_SHARED,
};
use lease::Leases;
pub use wire::{Heard, Lease, QueueEntry, RankEntry, Snapshot, SNAPSHOT_VERSION};

/// What a received snapshot did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SyncApplied {
    /// Applied.
    Applied,
    /// This frontend's own snapshot, come back: ignored.
    Own,
    /// Not newer than the last applied from its frontend: dropped.
    OutOfOrder,
}

/// Why a received snapshot was refused; nothing changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SyncError {
    /// Longer than `max_payload`.
    Oversized {
        /// Its length.
        len: usize,
        /// The bound.
        limit: usize,
    },
    /// Not a snapshot.
    Wire(WireError),
    /// Its frontend is not its subject's.
    Spoofed {
        /// The subject it came on.
        subject: String,
        /// The frontend it names.
        frontend: String,
    },
    /// A new frontend beyond `max_frontends`.
    TooManyFrontends {
        /// The bound.
        limit: usize,
    },
    /// More rank entries, over every other frontend, than `max_entries`.
    TooManyEntries {
        /// The bound.
        limit: usize,
    },
}

impl fmt::Display for SyncError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Oversized { len, limit } => {
                write!(f, "booking snapshot of {len} bytes: at most {limit}")
            }
            Self::Wire(e) => write!(f, "booking snapshot: {e}"),
            Self::Spoofed { subject, frontend } => write!(
                f,
                "booking snapshot of frontend {frontend:?} on subject {subject:?}"
            ),
            Self::TooManyFrontends { limit } => {
                write!(f, "booking snapshot of a new frontend beyond {limit}")
            }
            Self::TooManyEntries { limit } => write!(
                f,
                "booking snapshot beyond {limit} rank entries over every frontend"
            ),
        }
    }
}

impl std::error::Error for SyncError {}

/// What a sync has done so far.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SyncStats {
    /// Snapshots sent.
    pub sent: u64,
    /// Others' snapshots applied.
    pub received: u64,
    /// Others' snapshots missed, by their sequence numbers.
    pub gaps: u64,
    /// Others' snapshots dropped as not newer.
    pub out_of_order: u64,
    /// Payloads refused (oversized, malformed, spoofed, too many
    /// frontends).
    pub refused: u64,
    /// Frontends forgotten after their silence.
    pub expired: u64,
    /// Other frontends tracked now.
    pub frontends: usize,
    /// Bytes of the last snapshot sent.
    pub last_size: usize,
    /// Leased mode: the share of every rank's line this frontend uses now,
    /// in parts per million.
    pub share: u32,
    /// Leased mode: the share it claims (above `share` while a raise is
    /// being confirmed).
    pub claim: u32,
    /// Leased mode: times its lease ran out while it held a share.
    pub fenced: u64,
}

/// Another frontend, as its latest snapshot left it.
struct Peer {
    instance: u64,
    seq: u64,
    last_heard: u64,
    /// What its bookings added to each rank.
    shared: HashMap<(u64, u32), Shared, RandomState>,
    queues: Vec<QueueEntry>,
}

#[derive(Default)]
struct State {
    peers: HashMap<String, Peer, RandomState>,
    seq: u64,
    /// What the last snapshot sent carried, and when it was sent.
    last: Option<(Vec<RankEntry>, Vec<QueueEntry>, u64)>,
    /// A frontend said hello: send at the next tick.
    reply_due: bool,
    /// Rank entries kept over every other frontend.
    entries: usize,
    /// Leased mode's protocol.
    leases: Option<Leases>,
    /// Bookings refused for want of share, as of the last tick.
    refused_seen: u64,
    /// The transport's interruptions, as of the last tick.
    interruptions_seen: u64,
    /// A buffer reused by every tick.
    totals: Vec<RankTotals>,
}

const SENT: usize = 0;
const RECEIVED: usize = 1;
const GAPS: usize = 2;
const OUT_OF_ORDER: usize = 3;
const REFUSED: usize = 4;
const EXPIRED: usize = 5;
const LAST_SIZE: usize = 6;

/// One frontend's side of booking sync (module docs).
pub struct BookingSync {
    monitor: Arc<Monitor>,
    clock: SharedClock,
    config: BookingSyncConfig,
    instance: u64,
    subject: String,
    state: Mutex<State>,
    counters: [AtomicU64; 7],
}

impl fmt::Debug for BookingSync {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BookingSync")
            .field("frontend_id", &self.config.frontend_id)
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

impl BookingSync {
    /// The sync of frontend `config.frontend_id`, feeding `monitor` and
    /// publishing under `subjects`, reading time from `clock`.
    pub fn new(
        monitor: Arc<Monitor>,
        subjects: &Subjects,
        config: BookingSyncConfig,
        clock: SharedClock,
    ) -> Result<Arc<Self>, ClusterError> {
        config.validate()?;
        let instance = instance_id();
        let mut state = State::default();
        if config.mode == SyncMode::Leased {
            // No share until the join window has passed.
            monitor.apply_share(0, u64::MAX);
            let lease = nanos(config.lease);
            state.leases = Some(Leases::new(&config.frontend_id, instance, lease));
        }
        let sync = Arc::new(Self {
            monitor,
            clock,
            subject: subjects.bookings(&config.frontend_id),
            config,
            instance,
            state: Mutex::new(state),
            counters: Default::default(),
        });
        // The fleet's queues join the monitor's metrics (`render` below).
        let part: Arc<dyn Families> = sync.clone();
        sync.monitor.more_families.add(Arc::downgrade(&part));
        Ok(sync)
    }

    /// This frontend's id.
    pub fn frontend_id(&self) -> &str {
        &self.config.frontend_id
    }

    /// What it has done so far.
    pub fn stats(&self) -> SyncStats {
        let c = |i: usize| self.counters[i].load(Ordering::Relaxed);
        let st = lock(&self.state);
        let ((share, claim), fenced) = st
            .leases
            .as_ref()
            .map_or(((0, 0), 0), |l| (l.shares(), l.fenced));
        SyncStats {
            sent: c(SENT),
            received: c(RECEIVED),
            gaps: c(GAPS),
            out_of_order: c(OUT_OF_ORDER),
            refused: c(REFUSED),
            expired: c(EXPIRED),
            frontends: st.peers.len(),
            last_size: c(LAST_SIZE) as usize,
            share,
            claim,
            fenced,
        }
    }

    /// The other frontends' queues: (frontend, model, requests, tokens).
    pub fn remote_queues(&self) -> Vec<(String, QueueEntry)> {
        let st = lock(&self.state);
        let mut out: Vec<_> = st
            .peers
            .iter()
            .flat_map(|(id, p)| p.queues.iter().map(|q| (id.clone(), q.clone())))
            .collect();
        out.sort_by(|a, b| (&a.0, &a.1.model).cmp(&(&b.0, &b.1.model)));
        out
    }

    /// Forgets the frontends silent for `expire_after`, then sends this
    /// frontend's snapshot on `transport` if it changed, a frontend said
    /// hello, or the heartbeat is due. Whether it sent one.
    pub fn tick(&self, transport: &dyn Transport) -> Result<bool, ClusterError> {
        let now = self.clock.now_nanos();
        let mut st = lock(&self.state);
        self.expire(&mut st, now);
        let (mut heartbeat, mut lease_due) = (nanos(self.config.heartbeat), false);
        let refused = self.monitor.share.refused();
        let refused_since = std::mem::replace(&mut st.refused_seen, refused) != refused;
        let interruptions = transport.interruptions();
        let interrupted = std::mem::replace(&mut st.interruptions_seen, interruptions)
            != interruptions
            || interruptions == u64::MAX;
        if let Some(leases) = &mut st.leases {
            let before = leases.shares();
            let usage = self.monitor.share_usage();
            let d = leases.step(now, usage, refused_since, interrupted);
            leases.settle(self.monitor.apply_share(d.used, d.deadline));
            heartbeat = heartbeat.min(leases.renew());
            lease_due = leases.due() || leases.shares() != before;
        }
        let (ranks, queues) = self.own(&mut st);
        let due = match &st.last {
            None => true,
            Some((r, q, at)) => {
                st.reply_due
                    || lease_due
                    || *r != ranks
                    || *q != queues
                    || now.saturating_sub(*at) >= heartbeat
            }
        };
        if !due {
            return Ok(false);
        }
        st.seq += 1;
        let lease = st.leases.as_mut().map(|l| l.section(now));
        let snapshot = Snapshot {
            v: SNAPSHOT_VERSION,
            frontend: self.config.frontend_id.clone(),
            instance: self.instance,
            seq: st.seq,
            hello: st.last.is_none(),
            ranks,
            queues,
            lease,
        };
        let payload = snapshot.to_msgpack();
        let size = payload.len();
        st.reply_due = false;
        st.last = Some((snapshot.ranks, snapshot.queues, now));
        drop(st);
        transport.publish(&self.subject, payload)?;
        self.counters[SENT].fetch_add(1, Ordering::Relaxed);
        self.counters[LAST_SIZE].store(size as u64, Ordering::Relaxed);
        Ok(true)
    }

    /// This frontend's own bookings and queues, sorted.
    fn own(&self, st: &mut State) -> (Vec<RankEntry>, Vec<QueueEntry>) {
        st.totals.clear();
        self.monitor.own_bookings(&mut st.totals);
        let mut ranks: Vec<RankEntry> = st
            .totals
            .iter()
            .map(|t| RankEntry {
                worker_id: t.worker_id,
                dp_rank: t.dp_rank,
                blocks: t.blocks,
                prefill: t.prefill,
            })
            .collect();
        ranks.sort_unstable_by_key(|e| (e.worker_id, e.dp_rank));
        let mut queues: Vec<QueueEntry> = self
            .monitor
            .queue_totals()
            .into_iter()
            .map(|q| QueueEntry {
                model: q.model,
                requests: q.requests,
                tokens: q.tokens,
            })
            .collect();
        queues.sort_by(|a, b| a.model.cmp(&b.model));
        (ranks, queues)
    }

    fn expire(&self, st: &mut State, now: u64) {
        let after = nanos(self.config.expire_after);
        let silent: Vec<String> = st
            .peers
            .iter()
            .filter(|(_, p)| now.saturating_sub(p.last_heard) >= after)
            .map(|(id, _)| id.clone())
            .collect();
        for id in silent {
            if let Some(leases) = &mut st.leases {
                leases.forget(&id);
            }
            if let Some(peer) = st.peers.remove(&id) {
                st.entries -= peer.shared.len();
                self.unshare(peer.shared);
                self.counters[EXPIRED].fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Takes what `shared` added out of every rank.
    fn unshare(&self, shared: HashMap<(u64, u32), Shared, RandomState>) {
        for ((worker, rank), s) in shared {
            let _ = self.monitor.shift_shared(worker, rank, &s, (0, 0));
        }
    }

    /// Applies a snapshot that arrived on `subject`
    /// (`{prefix}.{namespace}.bookings.{frontend_id}`). Errors are counted
    /// and change nothing.
    pub fn handle_on(&self, subject: &str, payload: &[u8]) -> Result<SyncApplied, SyncError> {
        let result = self.receive(subject, payload);
        let i = match &result {
            Ok(SyncApplied::Applied) => RECEIVED,
            Ok(SyncApplied::OutOfOrder) => OUT_OF_ORDER,
            Ok(SyncApplied::Own) => return result,
            Err(_) => REFUSED,
        };
        self.counters[i].fetch_add(1, Ordering::Relaxed);
        result
    }

    fn receive(&self, subject: &str, payload: &[u8]) -> Result<SyncApplied, SyncError> {
        if payload.len() > self.config.max_payload {
            return Err(SyncError::Oversized {
                len: payload.len(),
                limit: self.config.max_payload,
            });
        }
        let snapshot = Snapshot::decode(payload).map_err(SyncError::Wire)?;
        if subject.rsplit('.').next() != Some(snapshot.frontend.as_str()) {
            return Err(SyncError::Spoofed {
                subject: subject.to_owned(),
                frontend: snapshot.frontend,
            });
        }
        if snapshot.frontend == self.config.frontend_id {
            if let (Some(leases), Some(lease), true) = (
                &mut lock(&self.state).leases,
                &snapshot.lease,
                snapshot.instance == self.instance,
            ) {
                leases.came_back(snapshot.seq, lease.stamp);
            }
            return Ok(SyncApplied::Own);
        }
        if let Some(lease) = &snapshot.lease {
            Leases::check(lease, self.config.max_frontends)
                .map_err(|e| SyncError::Wire(WireError::Invalid(e)))?;
        }
        let now = self.clock.now_nanos();
        let mut st = lock(&self.state);
        let held = st
            .peers
            .get(&snapshot.frontend)
            .map_or(0, |p| p.shared.len());
        let others = st.entries - held;
        if others + snapshot.ranks.len() > self.config.max_entries {
            return Err(SyncError::TooManyEntries {
                limit: self.config.max_entries,
            });
        }
        let old = match st.peers.remove(&snapshot.frontend) {
            Some(peer) if peer.instance == snapshot.instance => {
                if snapshot.seq <= peer.seq {
                    st.peers.insert(snapshot.frontend, peer);
                    return Ok(SyncApplied::OutOfOrder);
                }
                let missed = snapshot.seq - peer.seq - 1;
                self.counters[GAPS].fetch_add(missed, Ordering::Relaxed);
                peer.shared
            }
            // A restarted frontend: a new order, its old bookings replaced.
            Some(peer) => peer.shared,
            None if st.peers.len() >= self.config.max_frontends => {
                return Err(SyncError::TooManyFrontends {
                    limit: self.config.max_frontends,
                });
            }
            None => HashMap::default(),
        };
        st.reply_due |= snapshot.hello;
        if let Some(leases) = &mut st.leases {
            let f = &snapshot.frontend;
            st.reply_due |= leases.heard(f, snapshot.instance, snapshot.lease.as_ref());
        }
        let shared = self.reshare(old, &snapshot.ranks);
        st.entries = others + shared.len();
        st.peers.insert(
            snapshot.frontend,
            Peer {
                instance: snapshot.instance,
                seq: snapshot.seq,
                last_heard: now,
                shared,
                queues: snapshot.queues,
            },
        );
        Ok(SyncApplied::Applied)
    }

    /// Moves every rank from what `old` added to what `ranks` book; the
    /// ranks this monitor does not know are skipped.
    fn reshare(
        &self,
        mut old: HashMap<(u64, u32), Shared, RandomState>,
        ranks: &[RankEntry],
    ) -> HashMap<(u64, u32), Shared, RandomState> {
        let mut shared = HashMap::with_capacity_and_hasher(ranks.len(), RandomState::default());
        for e in ranks {
            let key = (e.worker_id, e.dp_rank);
            if shared.contains_key(&key) {
                continue; // one entry per rank; a repeat is ignored
            }
            let from = old.remove(&key).unwrap_or_default();
            let to = (e.blocks.min(MAX_SHARED), e.prefill.min(MAX_SHARED));
            if let Some(now) = self.monitor.shift_shared(e.worker_id, e.dp_rank, &from, to) {
                shared.insert(key, now);
            }
        }
        self.unshare(old);
        shared
    }

    /// Subscribes to every frontend's snapshots on `transport` and ticks
    /// every `debounce` interval on a thread of its own, until the
    /// returned handle is dropped.
    pub fn attach(
        self: &Arc<Self>,
        transport: Arc<dyn Transport>,
        subjects: &Subjects,
    ) -> Result<SyncAttached, ClusterError> {
        let me = self.clone();
        let subscription = transport.subscribe(
            &subjects.bookings_all(),
            Arc::new(move |subject: &str, p: &[u8]| {
                let _ = me.handle_on(subject, p);
            }),
        )?;
        let stop = Arc::new(AtomicBool::new(false));
        let (me, stopped) = (self.clone(), stop.clone());
        let thread = std::thread::Builder::new()
            .name("loadgate-booking-sync".into())
            .spawn(move || {
                while !stopped.load(Ordering::Relaxed) {
                    // A failed send is tried again at the next tick.
                    let _ = me.tick(&*transport);
                    std::thread::park_timeout(me.config.debounce);
                }
            })
            .map_err(|e| ClusterError::Transport(format!("cannot start the sync thread: {e}")))?;
        Ok(SyncAttached {
            _subscription: subscription,
            stop,
            thread: Some(thread),
            made_in: ForkGuard::new(),
        })
    }
}

/// A sync attached to a transport; dropping it stops sending and
/// receiving (the others forget this frontend after `expire_after`).
pub struct SyncAttached {
    _subscription: Subscription,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    /// The process that attached: a forked child has no sync thread.
    made_in: ForkGuard,
}

impl fmt::Debug for SyncAttached {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SyncAttached")
    }
}

/// The fleet's queues in the monitor's metrics text: per model, the
/// requests and estimated tokens waiting in this frontend's queue now and in
/// the others' as their latest snapshots tell (nothing when no frontend
/// has a queue).
impl Families for BookingSync {
    fn render(&self, out: &mut String, prefix: &str) {
        let mut fleet: std::collections::BTreeMap<String, (u64, u64)> = Default::default();
        for q in self.monitor.queue_totals() {
            let e = fleet.entry(q.model).or_default();
            e.0 += u64::from(q.requests);
            e.1 = e.1.saturating_add(q.tokens);
        }
        for (_, q) in self.remote_queues() {
            let e = fleet.entry(q.model).or_default();
            e.0 += u64::from(q.requests);
            e.1 = e.1.saturating_add(q.tokens);
        }
        if fleet.is_empty() {
            return;
        }
        for (i, (name, help)) in [
            (
                "frontend_fleet_queue_requests",
                "Requests waiting in the model's queues of every frontend sharing bookings with this one (theirs as of their latest snapshots).",
            ),
            (
                "frontend_fleet_queue_tokens",
                "Estimated tokens waiting in the model's queues of every frontend sharing bookings with this one.",
            ),
        ]
        .into_iter()
        .enumerate()
        {
            metrics::header(out, prefix, name, "gauge", help);
            for (model, (requests, tokens)) in &fleet {
                let value = if i == 0 { *requests } else { *tokens };
                metrics::sample(out, prefix, name, &[("model", model)], value);
            }
        }
    }
}

/// A leased sync that is gone leaves its monitor out of leased mode: with
/// nothing left to renew the share, a zero share would refuse every
/// booking for ever (as after a sync that failed to connect).
impl Drop for BookingSync {
    fn drop(&mut self) {
        if self.config.mode == SyncMode::Leased {
            self.monitor.leave_share();
        }
    }
}

impl Drop for SyncAttached {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        let Some(t) = self.thread.take() else { return };
        if !self.made_in.same_process() {
            // A forked child: the thread is not here to join.
            std::mem::forget(t);
            return;
        }
        t.thread().unpark();
        let _ = t.join();
    }
}
