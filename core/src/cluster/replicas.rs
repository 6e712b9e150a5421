//! Booking sync between frontend replicas (docs/replicas.md).
//!
//! Each frontend's [`BookingSync`] publishes its own bookings, per worker
//! rank, and its frontend queues, on `{prefix}.{namespace}.bookings.{frontend_id}`,
//! and applies the others' to its monitor: a frontend's view of a rank is
//! the worker's own report, plus its own live bookings, plus what every
//! other frontend's messages say it books there.
//!
//! * **Traffic grows with changes.** A tick (every `debounce` interval)
//!   sends what changed since the last message: each rank and queue whose
//!   totals moved, with its new totals (`replicas/wire.rs` says why that
//!   unit). The whole state goes only on a join, to a frontend that asks
//!   for it, and every `snapshot_every`; with nothing changed, an empty
//!   message every `heartbeat` keeps the frontend alive.
//! * **Nothing counted twice.** Bookings and a worker's report never add:
//!   every frontend's bookings go into the router-owned fields
//!   (`active_decode_blocks`, `active_prefill_tokens`), the report into the
//!   worker-owned ones (`kv_used_blocks`, `waiting_requests`), and the busy
//!   rule compares each against its line on its own. A request is counted
//!   once in each: by the one frontend that booked it, and by the worker
//!   once it holds it. A message carries only its frontend's own
//!   bookings, which the bookings count apart (`Rank::own_blocks`), so
//!   neither what it learned from the others nor a report that overwrote
//!   a router field ever travels on.
//! * **Order, gaps and repair.** Messages are ordered by `seq` within one
//!   `instance` of a frontend; an older or repeated one is dropped. A jump
//!   counts the messages missed as gaps: the changes after it still apply
//!   (they are absolute), the frontend is marked behind, and this one asks
//!   for its whole state (naming it in `resync`, again every heartbeat
//!   until it comes), which replaces everything it had said.
//! * **Joining.** A frontend's first message is its whole state and says
//!   `hello`; every frontend that hears it sends its whole state at its
//!   next tick, so a new frontend knows the fleet's bookings within one
//!   debounce interval and a round trip.
//! * **Expiry.** A frontend silent for `expire_after` (three heartbeats by
//!   default) is forgotten: its bookings leave every rank.
//! * **Hostile input.** A payload is checked for size before it is read; a
//!   message whose frontend is not its subject's last token is refused
//!   (so per-subject NATS permissions bind a frontend to its own
//!   messages); at most `max_frontends` are tracked, with at most
//!   `max_entries` rank entries over all of them and [`MAX_QUEUES`] queues
//!   each; an entry for a worker or rank this monitor does not know is
//!   kept (within `max_entries`) and applied at the first heartbeat after
//!   the worker is known; an absurd count is cut to [`MAX_SHARED`]. Every
//!   refusal is counted and changes nothing.
//!
//! A tick reads every rank's two own-booking counters and compares them
//! with what it last sent; the attached sync ticks every `debounce`
//! interval on its own thread.
//!
//! In leased mode ([`SyncMode::Leased`]) every message also carries the
//! frontend's claim on every rank's line, and each tick moves this
//! frontend's share by the protocol in `replicas/lease.rs` and sets it in
//! the monitor, whose bookings then stay within it (`monitor/share.rs`).

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
use crate::monitor::replicas::RankTotals;
use crate::monitor::Monitor;

mod config;
mod lease;
mod outcome;
mod peers;
mod sent;
mod wire;

pub use config::{
    BookingSyncConfig, SyncMode, DEFAULT_DEBOUNCE, DEFAULT_LEASE, DEFAULT_MAX_ENTRIES,
    DEFAULT_MAX_FRONTENDS, DEFAULT_SNAPSHOT_EVERY, DEFAULT_SNAPSHOT_MAX_PAYLOAD, MAX_FRONTENDS,
    MAX_QUEUES, MAX_SHARED,
};
use lease::Leases;
pub use outcome::{SyncApplied, SyncError, SyncStats};
use peers::Peer;
use sent::Sent;
pub use wire::{Heard, Lease, QueueEntry, RankEntry, SyncMessage, MAX_RESYNC, SYNC_VERSION};

#[derive(Default)]
struct State {
    peers: std::collections::HashMap<String, Peer, RandomState>,
    seq: u64,
    last: Option<Sent>,
    /// A frontend said hello or asked: send the whole state at the next
    /// tick.
    whole_due: bool,
    /// Leased mode: a frontend's raise waits for this one's answer: send
    /// at the next tick.
    reply_due: bool,
    /// When the entries not applied were last tried again.
    retried_at: u64,
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
const SNAPSHOTS_SENT: usize = 7;
const BYTES_SENT: usize = 8;
const BYTES_RECEIVED: usize = 9;
const RESYNCS: usize = 10;

/// One frontend's side of booking sync (module docs).
pub struct BookingSync {
    monitor: Arc<Monitor>,
    clock: SharedClock,
    config: BookingSyncConfig,
    instance: u64,
    subject: String,
    state: Mutex<State>,
    counters: [AtomicU64; 11],
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
        monitor.track_own_changes();
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
            snapshots_sent: c(SNAPSHOTS_SENT),
            bytes_sent: c(BYTES_SENT),
            received: c(RECEIVED),
            bytes_received: c(BYTES_RECEIVED),
            gaps: c(GAPS),
            out_of_order: c(OUT_OF_ORDER),
            resyncs: c(RESYNCS),
            refused: c(REFUSED),
            expired: c(EXPIRED),
            frontends: st.peers.len(),
            behind: st.peers.values().filter(|p| p.behind).count(),
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

    /// Forgets the frontends silent for `expire_after`, then sends on
    /// `transport` this frontend's whole state when it is due (its first
    /// message, a frontend said hello or asked for it, `snapshot_every`),
    /// else what changed since its last message, if anything did, it asks
    /// a frontend for its whole state, or the heartbeat is due. Whether it
    /// sent one.
    pub fn tick(&self, transport: &dyn Transport) -> Result<bool, ClusterError> {
        let now = self.clock.now_nanos();
        let mut guard = lock(&self.state);
        let st = &mut *guard;
        self.expire(st, now);
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
        if now.saturating_sub(st.retried_at) >= heartbeat {
            st.retried_at = now;
            for peer in st.peers.values_mut() {
                peers::retry(&self.monitor, &mut peer.shared);
            }
        }
        let queues = self.queues();
        let again = nanos(self.config.heartbeat);
        let resync: Vec<String> = st
            .peers
            .iter_mut()
            .filter(|(_, p)| p.ask_due(now, again))
            .take(MAX_RESYNC)
            .map(|(id, p)| {
                p.asked = Some(now);
                id.clone()
            })
            .collect();
        let hello = st.last.is_none();
        let whole = st.last.as_ref().is_none_or(|last| {
            st.whole_due || now.saturating_sub(last.whole_at) >= nanos(self.config.snapshot_every)
        });
        let heartbeat_due = st
            .last
            .as_ref()
            .is_some_and(|last| now.saturating_sub(last.at) >= heartbeat);
        let (ranks, queues) = match &mut st.last {
            Some(last) if !whole => {
                let ranks = last.changes(&self.monitor, &mut st.totals);
                let changed = wire::changes(
                    &last.queues,
                    &queues,
                    |q| q.model.clone(),
                    |q| QueueEntry {
                        model: q.model.clone(),
                        requests: 0,
                        tokens: 0,
                    },
                );
                last.queues = queues;
                (ranks, changed)
            }
            _ => {
                let (ranks, sent) = Sent::whole(&self.monitor, queues.clone(), now, &mut st.totals);
                st.last = Some(sent);
                (ranks, queues)
            }
        };
        let due = whole
            || st.reply_due
            || lease_due
            || heartbeat_due
            || !ranks.is_empty()
            || !queues.is_empty()
            || !resync.is_empty();
        if !due {
            return Ok(false);
        }
        st.seq += 1;
        let lease = st.leases.as_mut().map(|l| l.section(now));
        let asked = resync.len() as u64;
        let message = SyncMessage {
            v: SYNC_VERSION,
            frontend: self.config.frontend_id.clone(),
            instance: self.instance,
            seq: st.seq,
            hello,
            full: whole,
            ranks,
            queues,
            resync,
            lease,
        };
        let payload = message.to_msgpack();
        let size = payload.len();
        (st.reply_due, st.whole_due) = (false, false);
        if let Some(last) = &mut st.last {
            last.at = now;
        }
        drop(guard);
        transport.publish(&self.subject, payload)?;
        self.counters[SENT].fetch_add(1, Ordering::Relaxed);
        self.counters[SNAPSHOTS_SENT].fetch_add(u64::from(whole), Ordering::Relaxed);
        self.counters[BYTES_SENT].fetch_add(size as u64, Ordering::Relaxed);
        self.counters[RESYNCS].fetch_add(asked, Ordering::Relaxed);
        self.counters[LAST_SIZE].store(size as u64, Ordering::Relaxed);
        Ok(true)
    }

    /// This frontend's queues that hold something, sorted by model. An empty
    /// queue is the same as none: a change to empty removes it at the
    /// receiver, so a whole state leaves it out too.
    fn queues(&self) -> Vec<QueueEntry> {
        let mut queues: Vec<QueueEntry> = self
            .monitor
            .queue_totals()
            .into_iter()
            .filter(|q| (q.requests, q.tokens) != (0, 0))
            .map(|q| QueueEntry {
                model: q.model,
                requests: q.requests,
                tokens: q.tokens,
            })
            .collect();
        queues.sort_by(|a, b| a.model.cmp(&b.model));
        queues
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
                peers::unshare(&self.monitor, peer.shared);
                self.counters[EXPIRED].fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Applies a message that arrived on `subject`
    /// (`{prefix}.{namespace}.bookings.{frontend_id}`). Errors are counted
    /// and change nothing.
    pub fn handle_on(&self, subject: &str, payload: &[u8]) -> Result<SyncApplied, SyncError> {
        let result = self.receive(subject, payload);
        let i = match &result {
            Ok(SyncApplied::Applied | SyncApplied::Behind) => {
                let len = payload.len() as u64;
                self.counters[BYTES_RECEIVED].fetch_add(len, Ordering::Relaxed);
                RECEIVED
            }
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
        let message = SyncMessage::decode(payload).map_err(SyncError::Wire)?;
        if subject.rsplit('.').next() != Some(message.frontend.as_str()) {
            return Err(SyncError::Spoofed {
                subject: subject.to_owned(),
                frontend: message.frontend,
            });
        }
        if message.frontend == self.config.frontend_id {
            if let (Some(leases), Some(lease), true) = (
                &mut lock(&self.state).leases,
                &message.lease,
                message.instance == self.instance,
            ) {
                leases.came_back(message.seq, lease.stamp);
            }
            return Ok(SyncApplied::Own);
        }
        if let Some(lease) = &message.lease {
            Leases::check(lease, self.config.max_frontends)
                .map_err(|e| SyncError::Wire(WireError::Invalid(e)))?;
        }
        let now = self.clock.now_nanos();
        let mut guard = lock(&self.state);
        let st = &mut *guard;
        // Every check before anything changes.
        let known = st.peers.get(&message.frontend);
        let same = known.filter(|p| p.instance == message.instance);
        match (known, same) {
            (_, Some(p)) if message.seq <= p.seq => return Ok(SyncApplied::OutOfOrder),
            (None, _) if st.peers.len() >= self.config.max_frontends => {
                return Err(SyncError::TooManyFrontends {
                    limit: self.config.max_frontends,
                });
            }
            _ => {}
        }
        // A whole state, or the first message of an instance, replaces
        // everything its frontend said before; a change adds to it.
        let (replace, is_same) = (message.full || same.is_none(), same.is_some());
        let held = known.map_or(0, |p| p.shared.len());
        let (entries, queues) = match same {
            Some(p) if !replace => (
                st.entries + peers::added(&p.shared, &message.ranks),
                p.queues.len() + peers::queues_added(&p.queues, &message.queues),
            ),
            _ => (
                st.entries - held + message.ranks.len(),
                message.queues.len(),
            ),
        };
        if entries > self.config.max_entries {
            return Err(SyncError::TooManyEntries {
                limit: self.config.max_entries,
            });
        }
        if queues > MAX_QUEUES {
            return Err(SyncError::TooManyQueues { limit: MAX_QUEUES });
        }
        let mut peer = match st.peers.remove(&message.frontend) {
            Some(p) if p.instance == message.instance => p,
            // A restarted frontend: a new order, its old bookings replaced.
            Some(p) => Peer {
                shared: p.shared,
                ..Peer::new(message.instance)
            },
            None => Peer::new(message.instance),
        };
        let missed = message.seq.saturating_sub(peer.seq + 1);
        if is_same {
            self.counters[GAPS].fetch_add(missed, Ordering::Relaxed);
        }
        st.entries -= held;
        if replace {
            let old = std::mem::take(&mut peer.shared);
            peer.shared = peers::replace(&self.monitor, old, &message.ranks);
            peer.queues = peers::sorted_queues(message.queues);
            // A first message that is not whole: the rest is awaited.
            peer.behind = !message.full;
            peer.asked = None;
        } else {
            peers::apply(&self.monitor, &mut peer.shared, &message.ranks);
            peers::merge_queues(&mut peer.queues, message.queues);
            peer.behind |= missed > 0;
        }
        st.entries += peer.shared.len();
        peer.seq = message.seq;
        peer.last_heard = now;
        st.whole_due |= message.hello || message.resync.contains(&self.config.frontend_id);
        if let Some(leases) = &mut st.leases {
            let f = &message.frontend;
            st.reply_due |= leases.heard(f, message.instance, message.lease.as_ref());
        }
        let applied = if peer.behind {
            SyncApplied::Behind
        } else {
            SyncApplied::Applied
        };
        st.peers.insert(message.frontend, peer);
        Ok(applied)
    }

    /// Subscribes to every frontend's messages on `transport` and ticks
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
/// the others' as their messages tell (nothing when no frontend
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
                "Requests waiting in the model's queues of every frontend sharing bookings with this one (theirs as their messages tell).",
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
