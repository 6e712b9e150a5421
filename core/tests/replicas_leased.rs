//! Leased mode never over-admits (docs/replicas.md, "Leased mode"),
//! checked on a simulated fleet: R frontends in leased mode in front of two
//! workers, joining late, killed, cut off from the others for a while, and
//! restarted; their snapshots delayed at random; each frontend on a clock
//! of its own (a different origin), on virtual time.
//!
//! At every admission the blocks the live frontends hold on the worker
//! must fit its line. A killed frontend's bookings end with it (its
//! connections to the workers close). An outage drops every message to
//! and from a frontend; one that starts in its join window is reported by
//! its transport (a NATS client sees its connection go), a later one only
//! at random, and an outage may outlast the others' expiry of it. Single
//! snapshots are lost at random too, each loss reported by the receiver's
//! transport (a NATS client's slow-consumer event). No
//! request runs longer than `expire_after` less the lease, the condition
//! under which even a cut-off frontend's requests in flight cannot meet
//! the room the others take back from it.

mod support;

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use loadgate::cluster::replicas::{
    BookingSync, BookingSyncConfig, Heard, Lease, SyncError, SyncMessage, SyncMode, SYNC_VERSION,
};
use loadgate::cluster::Subjects;
use loadgate::{Booking, ManualClock, Monitor, ReportError};
use proptest::prelude::*;
use support::monitor_fixture::{decode, monitor_with, spec, M};
use support::rng::Rng;
use support::Outbox;

const MS: u64 = 1_000_000;
const TOTAL: u64 = 1000;
const LINE: u64 = TOTAL / 2;
const WORKERS: u64 = 2;
const DEBOUNCE_MS: u64 = 2;
const LEASE_MS: u64 = 100;
const EXPIRE_MS: u64 = 3 * LEASE_MS;
/// The longest a request runs: `expire_after` less the lease.
const LONGEST_MS: u64 = EXPIRE_MS - LEASE_MS;

#[derive(Debug, Clone)]
struct Fleet {
    replicas: usize,
    steps_ms: u64,
    /// Per frontend and millisecond, in thousandths.
    arrival: u32,
    release: u32,
    max_delay_ms: u64,
    /// Per message, in thousandths: lost on its way to one frontend, whose
    /// transport reports it (as a NATS client reports a slow consumer).
    loss: u32,
    /// Per frontend and millisecond, in millionths: a kill (the frontend
    /// restarts later), an outage of up to `outage_ms`.
    kill: u32,
    outage: u32,
    outage_ms: u64,
    seed: u64,
}

fn fleet() -> impl Strategy<Value = Fleet> {
    (
        2usize..=4,
        600u64..1500,
        (100u32..900, 0u32..200),
        (
            prop_oneof![0u64..6, 0u64..25],
            prop_oneof![Just(0u32), 0u32..50],
        ),
        (0u32..2000, 0u32..3000, 1u64..600),
        any::<u64>(),
    )
        .prop_map(
            |(
                replicas,
                steps_ms,
                (arrival, release),
                (max_delay_ms, loss),
                (kill, outage, outage_ms),
                seed,
            )| {
                Fleet {
                    replicas,
                    steps_ms,
                    arrival,
                    release,
                    max_delay_ms,
                    loss,
                    kill,
                    outage,
                    outage_ms,
                    seed,
                }
            },
        )
}

/// Frontend `i`'s settings: leased, with a lease of `LEASE_MS`.
fn leased(i: usize) -> BookingSyncConfig {
    let mut config = BookingSyncConfig::new(format!("f{i}"));
    config.mode = SyncMode::Leased;
    config.debounce = Duration::from_millis(DEBOUNCE_MS);
    config.lease = Duration::from_millis(LEASE_MS);
    config.heartbeat = Duration::from_millis(LEASE_MS);
    config.expire_after = Duration::from_millis(EXPIRE_MS);
    config
}

/// One run of a frontend process.
struct Frontend {
    clock: Arc<ManualClock>,
    /// Its clock's origin on the fleet's time line.
    offset: u64,
    monitor: Arc<Monitor>,
    sync: Arc<BookingSync>,
    out: Outbox,
    /// Each booking, with the millisecond it must end by.
    held: Vec<(Booking, u64)>,
    started: u64,
}

impl Frontend {
    /// Starts frontend `i` at fleet time `now`, on a clock of its own.
    fn start(i: usize, now: u64, rng: &mut Rng, subjects: &Subjects) -> Self {
        let offset = rng.below(1 << 40);
        let clock = ManualClock::new();
        clock.set_nanos(offset + now);
        Self::on_clock(i, clock, offset, now, subjects)
    }

    fn on_clock(
        i: usize,
        clock: Arc<ManualClock>,
        offset: u64,
        now: u64,
        subjects: &Subjects,
    ) -> Self {
        let monitor = Arc::new(monitor_with(clock.clone()));
        for w in 1..=WORKERS {
            monitor.add_worker(M, w, spec(1, TOTAL)).unwrap();
        }
        monitor.set_thresholds(M, &decode(0.5)).unwrap();
        let sync = BookingSync::new(monitor.clone(), subjects, leased(i), clock.clone()).unwrap();
        Self {
            clock,
            offset,
            monitor,
            sync,
            out: Outbox::default(),
            held: Vec::new(),
            started: now,
        }
    }

    fn on(&self, worker: u64) -> u64 {
        self.held
            .iter()
            .filter(|b| b.0.worker_id() == worker)
            .map(|b| b.0.blocks())
            .sum()
    }
}

/// What a run saw.
#[derive(Debug, Default)]
struct Run {
    admitted: u64,
    refused: u64,
    /// The shares in use at the end, summed (parts per million).
    final_share: u64,
}

/// Runs the fleet, checking at every admission that the live frontends'
/// bookings fit the line.
fn simulate(f: &Fleet) -> Result<Run, TestCaseError> {
    let subjects = Subjects::new("sim").unwrap();
    let mut rng = Rng(f.seed);
    let mut run = Run::default();
    // Frontend 0 starts at once, the others within the first 300 ms.
    let starts: Vec<u64> = (0..f.replicas)
        .map(|i| if i == 0 { 0 } else { rng.below(300) })
        .collect();
    let mut fronts: Vec<Option<Frontend>> = (0..f.replicas).map(|_| None).collect();
    let mut down_until = vec![0u64; f.replicas];
    let mut rates = vec![f.arrival; f.replicas];
    // In flight: (arrival time, to, subject, payload).
    let mut wire: VecDeque<(u64, usize, String, Vec<u8>)> = VecDeque::new();
    // The last 300 ms are quiet: no kills or outages, so the shares settle.
    let quiet = f.steps_ms.saturating_sub(300);
    for ms in 0..f.steps_ms {
        let now = ms * MS;
        for (i, slot) in fronts.iter_mut().enumerate() {
            if slot.is_none() && ms >= starts[i] && down_until[i] <= ms {
                *slot = Some(Frontend::start(i, now, &mut rng, &subjects));
            }
            let Some(front) = slot else { continue };
            front.clock.set_nanos(front.offset + now);
            if ms < quiet && rng.chance(1_000_000, f.kill) {
                // Killed: its bookings end with it; it restarts later.
                *slot = None;
                down_until[i] = ms + 1 + rng.below(4 * LEASE_MS);
                continue;
            }
            if ms < quiet && down_until[i] <= ms && rng.chance(1_000_000, f.outage) {
                down_until[i] = ms + 1 + rng.below(f.outage_ms);
                let joining = now < front.started + (3 * LEASE_MS / 2 + DEBOUNCE_MS) * MS;
                if joining || rng.chance(2, 1) {
                    front.out.interrupt();
                }
            }
        }
        // Deliveries due; nothing reaches a frontend cut off or gone.
        let mut later = VecDeque::new();
        while let Some((at, to, subject, payload)) = wire.pop_front() {
            if at > now {
                later.push_back((at, to, subject, payload));
                continue;
            }
            if let (Some(front), true) = (&fronts[to], down_until[to] <= ms) {
                if ms < quiet && rng.chance(1000, f.loss) {
                    front.out.interrupt();
                } else {
                    let _ = front.sync.handle_on(&subject, &payload);
                }
            }
        }
        wire = later;
        // Each frontend's arrival rate changes every 50 ms, so that the
        // shares move.
        if ms % 50 == 0 {
            for r in &mut rates {
                *r = rng.below(u64::from(f.arrival) + 1) as u32;
            }
        }
        // Releases and arrivals.
        for i in 0..f.replicas {
            if fronts[i].is_none() {
                continue;
            }
            let front = fronts[i].as_mut().unwrap();
            front.held.retain(|b| b.1 > ms);
            if !front.held.is_empty() && rng.chance(1000, f.release) {
                let k = rng.below(front.held.len() as u64) as usize;
                front.held.swap_remove(k);
            }
            if !rng.chance(1000, rates[i]) {
                continue;
            }
            let worker = 1 + rng.below(WORKERS);
            let blocks = 1 + rng.below(20);
            match front.monitor.book(worker, 0, blocks) {
                Ok(b) => front.held.push((b, ms + 1 + rng.below(LONGEST_MS))),
                Err(ReportError::NoShare { .. }) => {
                    run.refused += 1;
                    continue;
                }
                Err(e) => panic!("{e}"),
            }
            run.admitted += 1;
            let truth: u64 = fronts.iter().flatten().map(|x| x.on(worker)).sum();
            prop_assert!(
                truth <= LINE,
                "{f:?}: at {ms} ms frontend {i} admitted {blocks} on worker {worker}: \
                 {truth} booked in all"
            );
        }
        // Ticks, each a debounce interval apart; a cut-off frontend's
        // snapshots are lost.
        if ms % DEBOUNCE_MS == 0 {
            for i in 0..f.replicas {
                let Some(front) = &fronts[i] else { continue };
                front.sync.tick(&front.out).unwrap();
                for (subject, payload) in front.out.take() {
                    if down_until[i] > ms {
                        continue;
                    }
                    // Every frontend gets it, the sender too (as NATS echoes).
                    for to in 0..f.replicas {
                        let at = now + rng.below(f.max_delay_ms + 1) * MS;
                        wire.push_back((at, to, subject.clone(), payload.clone()));
                    }
                }
            }
        }
    }
    run.final_share = fronts
        .iter()
        .flatten()
        .map(|x| u64::from(x.sync.stats().share))
        .sum();
    Ok(run)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn leased_sync_never_over_admits(f in fleet()) {
        simulate(&f)?;
    }
}

/// A fleet left alone shares out most of the line, and admits.
#[test]
fn a_quiet_fleet_shares_out_the_line() {
    let f = Fleet {
        replicas: 3,
        steps_ms: 1500,
        arrival: 600,
        release: 100,
        max_delay_ms: 3,
        loss: 0,
        kill: 0,
        outage: 0,
        outage_ms: 1,
        seed: 7,
    };
    let run = simulate(&f).unwrap();
    assert!(run.admitted > 400, "{run:?}");
    assert!(run.refused > 0, "{run:?}");
    assert!(run.final_share > 900_000, "{run:?}");
    assert!(run.final_share <= 1_000_000, "{run:?}");
}

/// Frontends on one clock, each ticked and heard by all (itself too)
/// every debounce interval for `ms` milliseconds.
fn run_for(clock: &ManualClock, fronts: &[&Frontend], ms: u64) {
    for _ in 0..ms / DEBOUNCE_MS {
        clock.advance(Duration::from_millis(DEBOUNCE_MS));
        let sent: Vec<_> = fronts
            .iter()
            .flat_map(|f| {
                f.sync.tick(&f.out).unwrap();
                f.out.take()
            })
            .collect();
        for f in fronts {
            for (subject, payload) in &sent {
                f.sync.handle_on(subject, payload).unwrap();
            }
        }
    }
}

/// Frontend `i` on a clock shared with the test.
fn on_clock(i: usize, clock: &Arc<ManualClock>) -> Frontend {
    Frontend::on_clock(i, clock.clone(), 0, 0, &Subjects::new("sim").unwrap())
}

#[test]
fn a_new_frontend_books_nothing_until_its_join_window_has_passed() {
    let clock = ManualClock::new();
    let a = on_clock(0, &clock);
    run_for(&clock, &[&a], 100);
    let e = a.monitor.book(1, 0, 1).unwrap_err();
    assert!(matches!(e, ReportError::NoShare { cap: 0, .. }), "{e}");
    // Alone, after one and a half leases of its own snapshots coming back,
    // it claims the whole line and books up to it.
    run_for(&clock, &[&a], 3 * LEASE_MS);
    assert_eq!(a.sync.stats().share, 1_000_000);
    let held: Vec<Booking> = (0..LINE / 10)
        .map(|_| a.monitor.book(1, 0, 10).unwrap())
        .collect();
    let e = a.monitor.book(1, 0, 1).unwrap_err();
    assert!(
        matches!(
            e,
            ReportError::NoShare {
                blocks: 1,
                cap: LINE,
                ..
            }
        ),
        "{e}"
    );
    assert!(a.monitor.is_busy(1).unwrap());
    drop(held);
    assert!(!a.monitor.is_busy(1).unwrap());
}

#[test]
fn a_second_frontend_gets_its_part_once_the_first_makes_room() {
    let clock = ManualClock::new();
    let (a, b) = (on_clock(0, &clock), on_clock(1, &clock));
    run_for(&clock, &[&a], 3 * LEASE_MS);
    // A holds most of the line on worker 1 when B arrives.
    let held: Vec<Booking> = (0..40).map(|_| a.monitor.book(1, 0, 10).unwrap()).collect();
    run_for(&clock, &[&a, &b], 3 * LEASE_MS);
    let (sa, sb) = (a.sync.stats(), b.sync.stats());
    // A's claim still covers what it holds; B waits for it.
    assert!(u64::from(sa.claim) * LINE >= 400 * 1_000_000, "{sa:?}");
    assert!(sa.claim + sb.claim <= 1_000_000, "{sa:?} {sb:?}");
    drop(held);
    run_for(&clock, &[&a, &b], 3 * LEASE_MS);
    let (sa, sb) = (a.sync.stats(), b.sync.stats());
    assert!(sb.share >= 400_000, "{sa:?} {sb:?}");
    assert!(sa.claim + sb.claim <= 1_000_000, "{sa:?} {sb:?}");
}

#[test]
fn a_frontend_that_hears_nothing_back_stops_booking_within_its_lease() {
    let clock = ManualClock::new();
    let (a, b) = (on_clock(0, &clock), on_clock(1, &clock));
    run_for(&clock, &[&a, &b], 4 * LEASE_MS);
    let share = a.sync.stats().share;
    assert!(share > 0);
    a.monitor.book(1, 0, 1).unwrap();
    // A keeps sending, but nothing reaches anyone (its own snapshots do
    // not come back, B's echoes stop).
    for _ in 0..LEASE_MS / DEBOUNCE_MS {
        clock.advance(Duration::from_millis(DEBOUNCE_MS));
        a.sync.tick(&a.out).unwrap();
        a.out.take();
    }
    let e = a.monitor.book(1, 0, 1).unwrap_err();
    assert!(matches!(e, ReportError::NoShare { cap: 0, .. }), "{e}");
    let st = a.sync.stats();
    assert_eq!((st.share, st.fenced), (0, 1), "{st:?}");
    // Heard again, it joins again and gets a share back.
    run_for(&clock, &[&a, &b], 4 * LEASE_MS);
    assert!(a.sync.stats().share > 0);
}

#[test]
fn hostile_lease_sections_are_refused_and_change_nothing() {
    let clock = ManualClock::new();
    let a = on_clock(0, &clock);
    run_for(&clock, &[&a], 3 * LEASE_MS);
    let lease = |claim: u32, used: u32, heard: usize| Lease {
        stamp: 1,
        claim,
        used,
        raising: false,
        want: 0,
        heard: (0..heard)
            .map(|i| Heard {
                frontend: format!("x{i}"),
                instance: 1,
                stamp: 1,
            })
            .collect(),
    };
    for (i, bad) in [lease(1_000_001, 0, 0), lease(10, 20, 0), lease(0, 0, 65)]
        .into_iter()
        .enumerate()
    {
        let s = SyncMessage {
            v: SYNC_VERSION,
            frontend: "evil".into(),
            instance: 1,
            seq: i as u64 + 1,
            hello: false,
            full: true,
            ranks: Vec::new(),
            queues: Vec::new(),
            resync: Vec::new(),
            lease: Some(bad),
        };
        let e = a
            .sync
            .handle_on("loadgate.sim.bookings.evil", &s.to_msgpack())
            .unwrap_err();
        assert!(matches!(e, SyncError::Wire(_)), "{e}");
    }
    let st = a.sync.stats();
    assert_eq!((st.refused, st.frontends, st.share), (3, 0, 1_000_000));
}

#[test]
fn leased_settings_are_checked() {
    let clock = ManualClock::new();
    let monitor = Arc::new(monitor_with(clock.clone()));
    let subjects = Subjects::new("sim").unwrap();
    let mut short = leased(0);
    short.lease = Duration::from_millis(4);
    let mut long = leased(0);
    long.lease = Duration::from_millis(2 * EXPIRE_MS);
    for config in [short, long] {
        let e = BookingSync::new(monitor.clone(), &subjects, config, clock.clone()).unwrap_err();
        assert!(e.to_string().contains("lease"), "{e}");
    }
}

/// Concurrent bookings of one frontend never pass its share: each
/// reserves its blocks against it in one step.
#[test]
fn concurrent_bookings_never_pass_the_share() {
    let clock = ManualClock::new();
    let a = on_clock(0, &clock);
    run_for(&clock, &[&a], 3 * LEASE_MS);
    assert_eq!(a.sync.stats().share, 1_000_000);
    for _ in 0..20 {
        let held: Vec<Vec<Booking>> = std::thread::scope(|s| {
            let threads: Vec<_> = (0..4)
                .map(|_| {
                    s.spawn(|| {
                        (0..100)
                            .filter_map(|_| a.monitor.book(1, 0, 7).ok())
                            .collect::<Vec<_>>()
                    })
                })
                .collect();
            threads.into_iter().map(|t| t.join().unwrap()).collect()
        });
        let booked: u64 = held.iter().flatten().map(Booking::blocks).sum();
        // Never past the line; a booking may fail while another's
        // reservation is being taken back, so it need not fill exactly.
        assert!(booked <= LINE, "{booked}");
        assert!(booked > LINE / 2, "{booked}");
    }
}

/// A frontend whose transport may have lost messages stops booking and
/// joins again, but its claim keeps covering what it has booked, so the
/// others never take that room meanwhile.
#[test]
fn an_interrupted_frontend_keeps_claiming_what_it_holds() {
    let clock = ManualClock::new();
    let a = on_clock(0, &clock);
    run_for(&clock, &[&a], 3 * LEASE_MS);
    let held = a.monitor.book(1, 0, 100).unwrap();
    a.out.interrupt();
    run_for(&clock, &[&a], 2 * DEBOUNCE_MS);
    let st = a.sync.stats();
    assert_eq!((st.share, st.fenced), (0, 1), "{st:?}");
    // 100 of the line's 500 blocks.
    assert!(st.claim >= 200_000, "{st:?}");
    assert!(a.monitor.book(1, 0, 1).is_err());
    drop(held);
    run_for(&clock, &[&a], 3 * LEASE_MS);
    assert_eq!(a.sync.stats().share, 1_000_000);
}

#[test]
fn a_leased_sync_that_is_gone_leaves_its_monitor_out_of_leased_mode() {
    // A sync that never ran (as one whose connection failed) must not leave
    // the zero share of a joining frontend behind: every booking would be
    // refused for ever.
    let clock = ManualClock::new();
    let m = Arc::new(monitor_with(clock.clone()));
    m.add_worker(M, 1, spec(1, 100)).unwrap();
    m.set_thresholds(M, &decode(0.5)).unwrap();
    let mut config = BookingSyncConfig::new("a");
    config.mode = SyncMode::Leased;
    let subjects = Subjects::new("ns").unwrap();
    let sync = BookingSync::new(m.clone(), &subjects, config, clock).unwrap();
    assert!(matches!(m.book(1, 0, 1), Err(ReportError::NoShare { .. })));
    assert!(m.is_busy(1).unwrap(), "a full share counts as busy");
    drop(sync);
    let b = m
        .book(1, 0, 1)
        .expect("out of leased mode, booking is uncapped");
    drop(b);
    assert!(!m.is_busy(1).unwrap());
}
