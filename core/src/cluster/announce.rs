//! A monitor's own bookings announced to the reference routers, so that a
//! Dynamo 1.6.1 frontend running `--router-replica-sync` beside a loadgate
//! frontend counts loadgate's requests in its busy decision (and, with the
//! subscriber reading the same subject, loadgate counts Dynamo's).
//!
//! Each own booking made while the announcer is attached is published on
//! the endpoint's `active_sequences_events` subject as a Dynamo router
//! publishes its own ([`Announcement`]): an `AddRequest` when it is made
//! (its blocks as that many block hashes, its prompt tokens as the prefill
//! hint), a `MarkPrefillCompleted` when its prefill is done, a `Free` when
//! it is released. The booking's path only pushes a small event into the
//! monitor's bounded lock-free queue (`monitor/outbox.rs`); the announcer's
//! thread drains it every `interval`, encodes and publishes.
//!
//! What the reference's format cannot carry, and so the routers do not
//! see: a booking's output blocks added after it was made
//! ([`Booking::add_output_blocks`](crate::Booking::add_output_blocks)), and
//! bookings made before the announcer started. A booking longer than the
//! reference's expiry (`DYN_ROUTER_ACTIVE_REQUEST_EXPIRY_SECS`, 300 s by
//! default) stops counting there, as its own do. Events lost (queue full, or
//! a publication that failed) are counted; a lost `Free` leaves the routers
//! counting the booking until that expiry, as a lost event of their own
//! does (their format has no repair).
//!
//! The announcer's router id is random, chosen once per monitor; the
//! monitor's subscriber skips events of that id, which it counts already.

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use super::publisher::{instance_id, unix_millis};
use super::transport::{dynamo_sibling_subject, Transport};
use super::wire::{Announcement, SequenceChange, ACTIVE_SEQUENCES_TOPIC};
use super::ClusterError;
use crate::fork::ForkGuard;
use crate::monitor::outbox::{OwnChange, OwnEvent};
use crate::Monitor;

/// Default [`BookingAnnouncer::attach`] interval between drains.
pub const DEFAULT_ANNOUNCE_INTERVAL: Duration = Duration::from_millis(1);

/// Publishes a monitor's own bookings as a reference router's
/// `active_sequences_events` (module docs). One per monitor at a time.
pub struct BookingAnnouncer {
    monitor: Arc<Monitor>,
    subject: String,
    router_id: u64,
    publisher_id: u64,
    sequence: AtomicU64,
    published: AtomicU64,
    failed: AtomicU64,
}

/// What an announcer has done so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AnnounceStats {
    /// Events published.
    pub published: u64,
    /// Events dropped because the monitor's queue was full (over the
    /// monitor's life) or their publication failed.
    pub lost: u64,
}

impl fmt::Debug for BookingAnnouncer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BookingAnnouncer")
            .field("subject", &self.subject)
            .field("router_id", &self.router_id)
            .finish_non_exhaustive()
    }
}

impl BookingAnnouncer {
    /// Starts announcing `monitor`'s new own bookings on the
    /// `active_sequences_events` subject of the Dynamo endpoint whose
    /// `kv_metrics` subject is `kv_metrics_subject`
    /// ([`dynamo_kv_metrics_subject`](super::dynamo_kv_metrics_subject)).
    /// Refused for a wildcard or a subject of another kind, and while
    /// another announcer of the monitor lives.
    pub fn new(monitor: Arc<Monitor>, kv_metrics_subject: &str) -> Result<Arc<Self>, ClusterError> {
        let subject = dynamo_sibling_subject(kv_metrics_subject, ACTIVE_SEQUENCES_TOPIC)
            .filter(|s| !s.split('.').any(|t| t == "*" || t == ">"))
            .ok_or_else(|| {
                ClusterError::InvalidSubject(format!(
                    "bookings are announced on one Dynamo endpoint's subject, not {kv_metrics_subject:?}"
                ))
            })?;
        let router_id = monitor.outbox.start(instance_id()).ok_or_else(|| {
            ClusterError::InvalidConfig(
                "this monitor's bookings are already announced by another announcer".into(),
            )
        })?;
        Ok(Arc::new(Self {
            monitor,
            subject,
            router_id,
            // Below 2^53, as the reference's.
            publisher_id: instance_id() >> 11,
            sequence: AtomicU64::new(0),
            published: AtomicU64::new(0),
            failed: AtomicU64::new(0),
        }))
    }

    /// The router id its events carry.
    pub fn router_id(&self) -> u64 {
        self.router_id
    }

    /// The subject it publishes on.
    pub fn subject(&self) -> &str {
        &self.subject
    }

    /// Publishes every event queued so far on `transport`; returns how many.
    pub fn flush(&self, transport: &dyn Transport) -> usize {
        let mut n = 0;
        while let Some(event) = self.monitor.outbox.pop() {
            let payload = self.encode(&event);
            if transport.publish(&self.subject, payload).is_ok() {
                self.published.fetch_add(1, Ordering::Relaxed);
            } else {
                self.failed.fetch_add(1, Ordering::Relaxed);
            }
            n += 1;
        }
        n
    }

    /// One event as the reference writes it.
    fn encode(&self, event: &OwnEvent) -> Vec<u8> {
        let request_id = request_id(self.router_id, event.id);
        Announcement {
            publisher_id: self.publisher_id,
            sequence: self.sequence.fetch_add(1, Ordering::Relaxed),
            published_at: unix_millis(),
            router_id: self.router_id,
            request_id: &request_id,
            worker_id: event.worker_id,
            dp_rank: event.dp_rank,
            change: match event.change {
                OwnChange::Booked {
                    blocks,
                    prefill_tokens,
                } => SequenceChange::Add {
                    blocks,
                    prefill_tokens,
                },
                OwnChange::PrefillDone => SequenceChange::PrefillDone,
                OwnChange::Released => SequenceChange::Free,
            },
            first_hash: first_hash(self.router_id, event.id),
        }
        .to_msgpack()
    }

    /// Counters so far.
    pub fn stats(&self) -> AnnounceStats {
        AnnounceStats {
            published: self.published.load(Ordering::Relaxed),
            lost: self.monitor.outbox.lost() + self.failed.load(Ordering::Relaxed),
        }
    }

    /// Publishes on `transport` from a thread of its own, every `interval`
    /// (default [`DEFAULT_ANNOUNCE_INTERVAL`]), until the handle is dropped.
    pub fn attach(
        self: &Arc<Self>,
        transport: Arc<dyn Transport>,
        interval: Duration,
    ) -> Result<AnnounceAttached, ClusterError> {
        let stop = Arc::new(AtomicBool::new(false));
        let (me, stopped) = (self.clone(), stop.clone());
        let thread = std::thread::Builder::new()
            .name("loadgate-announce".into())
            .spawn(move || {
                while !stopped.load(Ordering::Relaxed) {
                    me.flush(&*transport);
                    std::thread::park_timeout(interval);
                }
                me.flush(&*transport);
            })
            .map_err(|e| {
                ClusterError::Transport(format!("cannot start the announcing thread: {e}"))
            })?;
        Ok(AnnounceAttached {
            stop,
            thread: Some(thread),
            made_in: ForkGuard::new(),
        })
    }
}

impl Drop for BookingAnnouncer {
    fn drop(&mut self) {
        self.monitor.outbox.stop();
    }
}

/// The request id of own booking `id`: UUID-shaped (the reference's are
/// UUIDs), unique per router id and booking.
fn request_id(router_id: u64, id: u64) -> String {
    format!(
        "{:08x}-{:04x}-{:04x}-{:04x}-{:012x}",
        router_id >> 32,
        (router_id >> 16) & 0xffff,
        router_id & 0xffff,
        (id >> 48) & 0xffff,
        id & 0xffff_ffff_ffff
    )
}

/// The first block hash of own booking `id`: distinct per booking, so that
/// the reference never counts two bookings' blocks as one shared prefix.
fn first_hash(router_id: u64, id: u64) -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = foldhash::fast::FixedState::with_seed(router_id).build_hasher();
    h.write_u64(id);
    h.finish()
}

/// An attached announcer's thread; dropping it publishes what is queued,
/// then stops the thread.
pub struct AnnounceAttached {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    made_in: ForkGuard,
}

impl fmt::Debug for AnnounceAttached {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("AnnounceAttached")
    }
}

impl Drop for AnnounceAttached {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        let Some(thread) = self.thread.take() else {
            return;
        };
        if !self.made_in.same_process() {
            // A forked child: the thread is not here.
            std::mem::forget(thread);
            return;
        }
        thread.thread().unpark();
        let _ = thread.join();
    }
}
