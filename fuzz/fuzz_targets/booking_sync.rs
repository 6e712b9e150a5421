//! Booking sync messages from other frontends, hostile or not, driven
//! through a frontend's `BookingSync` beside its own bookings
//! (docs/replicas.md), and the messages of a real peer ("a") lost,
//! repeated, reordered, cut off at its join or by its restart.
//!
//! Checks after every step:
//! * nothing panics or aborts, whatever a payload holds;
//! * every delivered payload is counted once: applied (in step or
//!   behind), out of order, refused, or this frontend's own;
//! * what this frontend sends (whole states and changes, applied in
//!   order) adds up to exactly its own live bookings, never what it
//!   learned from the others;
//! * once the network heals (everything delivered, in order), each rank
//!   holds exactly this frontend's and the peer's own bookings: a lost,
//!   repeated or reordered change leaves nothing counted and nothing
//!   uncounted;
//! * once every other frontend is forgotten, each rank holds exactly this
//!   frontend's own bookings again;
//! * in leased mode, whatever the others' lease sections say, every claim
//!   this frontend sends covers what it has booked on every rank.
#![no_main]

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use libfuzzer_sys::arbitrary::{self, Arbitrary, Unstructured};
use libfuzzer_sys::fuzz_target;
use loadgate::cluster::replicas::{
    BookingSync, BookingSyncConfig, Heard, Lease, QueueEntry, RankEntry, SyncApplied,
    SyncMessage, SyncMode, SYNC_VERSION,
};
use loadgate::cluster::{ClusterError, Handler, Subjects, Subscription, Transport};
use loadgate::{Booking, ManualClock, Monitor, MonitorConfig, WorkerSpec};

const FRONTENDS: [&str; 5] = ["me", "a", "b", "c", "d"];

/// What the frontend sent, and the interruptions its transport reports.
#[derive(Default)]
struct Outbox(Mutex<Vec<Vec<u8>>>, AtomicU64);

impl Transport for Outbox {
    fn publish(&self, _: &str, payload: Vec<u8>) -> Result<(), ClusterError> {
        self.0.lock().unwrap().push(payload);
        Ok(())
    }

    fn subscribe(&self, _: &str, _: Handler) -> Result<Subscription, ClusterError> {
        unreachable!()
    }

    fn interruptions(&self) -> u64 {
        self.1.load(Ordering::Relaxed)
    }
}

fn count(u: &mut Unstructured<'_>) -> arbitrary::Result<u64> {
    Ok(match u.arbitrary::<u8>()? {
        0..=199 => u64::from(u.int_in_range(0u8..=50)?),
        200..=239 => u.arbitrary()?,
        n => u64::MAX - u64::from(n % 4),
    })
}

#[derive(Debug)]
enum Op {
    /// A payload arriving on frontend `subject`'s subject.
    Deliver {
        subject: usize,
        payload: Vec<u8>,
    },
    Book {
        worker: u64,
        rank: u32,
        blocks: u64,
        prefill: u64,
    },
    Release(usize),
    Tick,
    /// This frontend's own last snapshot comes back through the transport.
    Echo,
    /// The transport reports it may have lost messages.
    Interrupt,
    Advance(u16),
    ReAdd(u64),
    /// The peer books, releases, ticks or restarts.
    PeerBook {
        worker: u64,
        rank: u32,
        blocks: u64,
    },
    PeerRelease(usize),
    PeerTick,
    PeerRestart,
    /// One of the peer's messages in flight arrives (and stays in flight
    /// for a repeat), or is lost.
    PeerDeliver {
        index: usize,
        again: bool,
    },
    PeerLose(usize),
}

impl<'a> Arbitrary<'a> for Op {
    fn arbitrary(u: &mut Unstructured<'a>) -> arbitrary::Result<Self> {
        Ok(match u.int_in_range(0u8..=17)? {
            0..=3 => {
                let subject = u.int_in_range(0..=FRONTENDS.len() - 1)?;
                let payload = if u.ratio(1u8, 8)? {
                    u.arbitrary::<Vec<u8>>()?
                } else {
                    let frontend = if u.ratio(7u8, 8)? {
                        FRONTENDS[subject].to_owned()
                    } else {
                        FRONTENDS[u.int_in_range(0..=FRONTENDS.len() - 1)?].to_owned()
                    };
                    let n = u.int_in_range(0u8..=6)?;
                    let mut ranks = Vec::new();
                    for _ in 0..n {
                        ranks.push(RankEntry {
                            worker_id: [1, 2, 9][usize::from(u.int_in_range(0u8..=2)?)],
                            dp_rank: [0, 1, 7][usize::from(u.int_in_range(0u8..=2)?)],
                            blocks: count(u)?,
                            prefill: count(u)?,
                        });
                    }
                    let mut resync = Vec::new();
                    for _ in 0..u.int_in_range(0u8..=2)? {
                        resync.push(FRONTENDS[u.int_in_range(0..=FRONTENDS.len() - 1)?].into());
                    }
                    let message = SyncMessage {
                        v: if u.ratio(15u8, 16)? {
                            SYNC_VERSION
                        } else {
                            u.arbitrary()?
                        },
                        frontend,
                        instance: u64::from(u.int_in_range(0u8..=2)?),
                        seq: u64::from(u.int_in_range(0u8..=8)?),
                        hello: u.arbitrary()?,
                        full: u.arbitrary()?,
                        ranks,
                        queues: vec![QueueEntry {
                            model: ["m", "n"][usize::from(u.int_in_range(0u8..=1)?)].into(),
                            requests: u.arbitrary()?,
                            tokens: u.arbitrary()?,
                        }],
                        resync,
                        lease: if u.arbitrary()? {
                            Some(lease(u)?)
                        } else {
                            None
                        },
                    };
                    message.to_msgpack()
                };
                Op::Deliver { subject, payload }
            }
            4..=5 => Op::Book {
                worker: u64::from(u.int_in_range(1u8..=2)?),
                rank: u.int_in_range(0..=1)?,
                blocks: u64::from(u.int_in_range(0u16..=500)?),
                prefill: u64::from(u.int_in_range(0u16..=500)?),
            },
            6 => Op::Release(u.arbitrary()?),
            7 => Op::Tick,
            8 => Op::Advance(u.arbitrary()?),
            9 => Op::Echo,
            10 => Op::Interrupt,
            11 => Op::ReAdd(u64::from(u.int_in_range(1u8..=2)?)),
            12 => Op::PeerBook {
                worker: u64::from(u.int_in_range(1u8..=2)?),
                rank: u.int_in_range(0..=1)?,
                blocks: u64::from(u.int_in_range(1u16..=300)?),
            },
            13 => Op::PeerRelease(u.arbitrary()?),
            14 => Op::PeerTick,
            15 => Op::PeerDeliver {
                index: u.arbitrary()?,
                again: u.ratio(1u8, 4)?,
            },
            16 => Op::PeerLose(u.arbitrary()?),
            _ => Op::PeerRestart,
        })
    }
}

/// A share: mostly in range, sometimes not.
fn ppm(u: &mut Unstructured<'_>) -> arbitrary::Result<u32> {
    Ok(if u.ratio(7u8, 8)? {
        u.int_in_range(0..=1_000_000)?
    } else {
        u.arbitrary()?
    })
}

fn lease(u: &mut Unstructured<'_>) -> arbitrary::Result<Lease> {
    let n = u.int_in_range(0u8..=4)?;
    let mut heard = Vec::new();
    for _ in 0..n {
        heard.push(Heard {
            frontend: FRONTENDS[u.int_in_range(0..=FRONTENDS.len() - 1)?].to_owned(),
            instance: u64::from(u.int_in_range(0u8..=2)?),
            stamp: u.arbitrary()?,
        });
    }
    Ok(Lease {
        stamp: u.arbitrary()?,
        claim: ppm(u)?,
        used: ppm(u)?,
        raising: u.arbitrary()?,
        want: ppm(u)?,
        heard,
    })
}

fn spec() -> WorkerSpec {
    WorkerSpec {
        dp_size: 2,
        kv_total_blocks: Some(1000),
        ..Default::default()
    }
}

/// This frontend's own live bookings per rank.
fn own(held: &[(u64, u32, Booking)]) -> BTreeMap<(u64, u32), (u64, u64)> {
    let mut out = BTreeMap::new();
    for (w, r, b) in held {
        let e = out.entry((*w, *r)).or_insert((0, 0));
        e.0 += b.blocks();
        e.1 += b.prefill_tokens();
    }
    out.retain(|_, v| *v != (0, 0));
    out
}

/// What a receiver holds after applying `sent` in order to `state`.
fn follow(state: &mut BTreeMap<(u64, u32), (u64, u64)>, sent: &SyncMessage) {
    if sent.full {
        state.clear();
    }
    for e in &sent.ranks {
        state.insert(e.key(), (e.blocks, e.prefill));
    }
    state.retain(|_, v| *v != (0, 0));
}

fn config(id: &str, leased: bool) -> BookingSyncConfig {
    let mut config = BookingSyncConfig::new(id);
    config.max_frontends = 2;
    config.max_payload = 1024;
    config.heartbeat = Duration::from_millis(100);
    config.snapshot_every = Duration::from_millis(400);
    config.expire_after = Duration::from_millis(300);
    if leased {
        config.mode = SyncMode::Leased;
        config.lease = Duration::from_millis(100);
    }
    config
}

fn new_monitor(clock: &Arc<ManualClock>) -> Arc<Monitor> {
    let monitor = Arc::new(Monitor::with_config(MonitorConfig::default(), clock.clone()).unwrap());
    for w in [1, 2] {
        monitor.add_worker("m", w, spec()).unwrap();
    }
    monitor
}

/// The real peer: its monitor, sync, bookings and messages in flight.
struct Peer {
    monitor: Arc<Monitor>,
    sync: Arc<BookingSync>,
    out: Outbox,
    held: Vec<(u64, u32, Booking)>,
    /// Each message sent and not yet delivered or lost, with what its
    /// receiver should then hold of the peer's bookings.
    in_flight: Vec<(Vec<u8>, BTreeMap<(u64, u32), (u64, u64)>)>,
    followed: BTreeMap<(u64, u32), (u64, u64)>,
}

fuzz_target!(|input: (bool, Vec<Op>)| {
    let (leased, ops) = input;
    let clock = ManualClock::new();
    let monitor = new_monitor(&clock);
    let subjects = Subjects::new("fz").unwrap();
    let sync = BookingSync::new(monitor.clone(), &subjects, config("me", leased), clock.clone())
        .unwrap();
    let out = Outbox::default();
    let peer_monitor = new_monitor(&clock);
    let mut peer = Peer {
        sync: BookingSync::new(
            peer_monitor.clone(),
            &subjects,
            config("a", leased),
            clock.clone(),
        )
        .unwrap(),
        monitor: peer_monitor,
        out: Outbox::default(),
        held: Vec::new(),
        in_flight: Vec::new(),
        followed: BTreeMap::new(),
    };
    let mut readded = false;
    let mut followed = BTreeMap::new();
    let mut held: Vec<(u64, u32, Booking)> = Vec::new();
    let mut delivered = 0u64;
    let mut own_echoes = 0u64;
    let mut last_sent: Option<Vec<u8>> = None;
    for op in ops.into_iter().take(256) {
        match op {
            Op::Deliver { subject, payload } => {
                let s = subjects.bookings(FRONTENDS[subject]);
                delivered += 1;
                if sync.handle_on(&s, &payload) == Ok(SyncApplied::Own) {
                    own_echoes += 1;
                }
            }
            Op::Book {
                worker,
                rank,
                blocks,
                prefill,
            } => {
                if let Ok(b) = monitor.book_with_prefill(worker, rank, blocks, prefill) {
                    held.push((worker, rank, b));
                }
            }
            Op::Release(i) => {
                if !held.is_empty() {
                    held.swap_remove(i % held.len());
                }
            }
            Op::Tick => {
                sync.tick(&out).unwrap();
            }
            Op::Echo => {
                if let Some(last) = &last_sent {
                    delivered += 1;
                    if sync.handle_on(&subjects.bookings("me"), last) == Ok(SyncApplied::Own) {
                        own_echoes += 1;
                    }
                }
            }
            Op::Interrupt => {
                out.1.fetch_add(1, Ordering::Relaxed);
            }
            Op::Advance(ms) => clock.advance(Duration::from_millis(u64::from(ms))),
            Op::ReAdd(w) => {
                held.retain(|(x, _, _)| *x != w);
                readded = true;
                monitor.remove_worker(w).unwrap();
                monitor.add_worker("m", w, spec()).unwrap();
            }
            Op::PeerBook {
                worker,
                rank,
                blocks,
            } => {
                if let Ok(b) = peer.monitor.book(worker, rank, blocks) {
                    peer.held.push((worker, rank, b));
                }
            }
            Op::PeerRelease(i) => {
                if !peer.held.is_empty() {
                    let n = peer.held.len();
                    peer.held.swap_remove(i % n);
                }
            }
            Op::PeerTick => {
                peer.sync.tick(&peer.out).unwrap();
                for payload in std::mem::take(&mut *peer.out.0.lock().unwrap()) {
                    follow(&mut peer.followed, &SyncMessage::decode(&payload).unwrap());
                    peer.in_flight.push((payload, peer.followed.clone()));
                }
            }
            Op::PeerRestart => {
                let restarted = BookingSync::new(
                    peer.monitor.clone(),
                    &subjects,
                    config("a", leased),
                    clock.clone(),
                );
                peer.sync = restarted.unwrap();
            }
            Op::PeerDeliver { index, again } => {
                if !peer.in_flight.is_empty() {
                    let i = index % peer.in_flight.len();
                    let (payload, then) = if again {
                        peer.in_flight[i].clone()
                    } else {
                        peer.in_flight.remove(i)
                    };
                    delivered += 1;
                    let applied = sync.handle_on(&subjects.bookings("a"), &payload);
                    // In step with the peer (and hearing no one else): this
                    // frontend holds exactly the peer's bookings as sent.
                    if applied == Ok(SyncApplied::Applied)
                        && sync.stats().frontends == 1
                        && !readded
                    {
                        let mine = own(&held);
                        for w in [1, 2] {
                            for r in 0..2 {
                                let blocks = monitor.rank_load(w, r).unwrap().active_decode_blocks;
                                let expected = mine.get(&(w, r)).map_or(0, |v| v.0)
                                    + then.get(&(w, r)).map_or(0, |v| v.0);
                                assert_eq!(blocks, expected, "rank {w}/{r} in step with the peer");
                            }
                        }
                    }
                }
            }
            Op::PeerLose(i) => {
                if !peer.in_flight.is_empty() {
                    let n = peer.in_flight.len();
                    peer.in_flight.remove(i % n);
                }
            }
        }
        let st = sync.stats();
        assert_eq!(
            st.received + st.out_of_order + st.refused + own_echoes,
            delivered
        );
        for payload in std::mem::take(&mut *out.0.lock().unwrap()) {
            let sent = SyncMessage::decode(&payload).unwrap();
            last_sent = Some(payload.clone());
            // The peer hears everything this frontend says (its asks too).
            let _ = peer.sync.handle_on(&subjects.bookings("me"), &payload);
            follow(&mut followed, &sent);
            assert_eq!(
                followed,
                own(&held),
                "what it sent adds up to exactly its own bookings"
            );
            if let Some(lease) = &sent.lease {
                // Every rank's line is its 1000 KV blocks (no threshold).
                let most = followed.values().map(|v| v.0).max().unwrap_or(0);
                assert!(
                    u64::from(lease.claim) * 1000 >= most * 1_000_000,
                    "claim {} does not cover {most} of 1000 blocks",
                    lease.claim
                );
                assert!(lease.used <= lease.claim);
            }
        }
    }
    // The network heals: what is in flight is lost, and from now on
    // everything arrives, in order. Within the peer's repair (and the
    // others' expiry) each rank holds exactly both frontends' bookings.
    peer.in_flight.clear();
    for _ in 0..30 {
        clock.advance(Duration::from_millis(50));
        peer.sync.tick(&peer.out).unwrap();
        for payload in std::mem::take(&mut *peer.out.0.lock().unwrap()) {
            let _ = sync.handle_on(&subjects.bookings("a"), &payload);
        }
        sync.tick(&out).unwrap();
        for payload in std::mem::take(&mut *out.0.lock().unwrap()) {
            let _ = peer.sync.handle_on(&subjects.bookings("me"), &payload);
        }
    }
    let (mine, theirs) = (own(&held), own(&peer.held));
    let stats = sync.stats();
    assert_eq!((stats.frontends, stats.behind), (1, 0), "{stats:?}");
    for w in [1, 2] {
        for r in 0..2 {
            let load = monitor.rank_load(w, r).unwrap();
            let (blocks, prefill) = mine.get(&(w, r)).copied().unwrap_or((0, 0));
            let (peer_blocks, _) = theirs.get(&(w, r)).copied().unwrap_or((0, 0));
            assert_eq!(
                load.active_decode_blocks,
                blocks + peer_blocks,
                "rank {w}/{r} after healing"
            );
            assert_eq!(load.active_prefill_tokens.unwrap_or(0), prefill);
        }
    }
    // Forget every other frontend: each rank holds exactly its own again.
    clock.advance(Duration::from_secs(1));
    sync.tick(&out).unwrap();
    assert_eq!(sync.stats().frontends, 0);
    let mine = own(&held);
    for w in [1, 2] {
        for r in 0..2 {
            let load = monitor.rank_load(w, r).unwrap();
            let (blocks, prefill) = mine.get(&(w, r)).copied().unwrap_or((0, 0));
            assert_eq!(load.active_decode_blocks, blocks, "rank {w}/{r}");
            assert_eq!(
                load.active_prefill_tokens.unwrap_or(0),
                prefill,
                "rank {w}/{r}"
            );
        }
    }
});
