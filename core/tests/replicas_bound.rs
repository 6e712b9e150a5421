//! The over-admission bound of shared booking sync (docs/replicas.md,
//! "The bound"), checked on a simulated fleet: R frontends in front of one
//! worker, each admitting a request only while its own view of the worker
//! is below the line, their messages (changes, heartbeats, whole states)
//! delayed, reordered, repeated and lost at random, on a virtual clock.
//!
//! At every admission by frontend `i` the fleet's true total may pass the
//! line by at most the request's own blocks plus what the other frontends
//! booked after the message of theirs that `i` last applied in step (with
//! every message before it applied, or a whole state). Without losses,
//! that message is at most `d = debounce + the longest delay` old, so the
//! excess is at most the request plus the others' bookings within the
//! last `d`: the bound the docs state. After the losses stop, every
//! frontend's view comes back to the truth exactly: no booking stays
//! counted, and none stays uncounted.

mod support;

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use loadgate::cluster::replicas::{BookingSync, BookingSyncConfig, SyncApplied};
use loadgate::cluster::Subjects;
use loadgate::{Booking, ManualClock, Monitor};
use proptest::prelude::*;
use support::monitor_fixture::{decode, monitor_with, spec, M};
use support::rng::Rng;
use support::Outbox;

const MS: u64 = 1_000_000;
/// The worker's KV blocks, and its line at a threshold of one half.
const TOTAL: u64 = 1000;
const LINE: u64 = TOTAL / 2;
const DEBOUNCE_MS: u64 = 2;

#[derive(Debug, Clone)]
struct Fleet {
    replicas: usize,
    steps_ms: u64,
    /// Per frontend and millisecond, in thousandths.
    arrival: u32,
    release: u32,
    max_delay_ms: u64,
    /// Per message, in thousandths.
    loss: u32,
    duplicate: u32,
    /// Messages between two frontends may overtake each other (NATS keeps
    /// one publisher's order; a reordered message is a lost one here).
    reorder: bool,
    seed: u64,
}

fn fleet() -> impl Strategy<Value = Fleet> {
    (
        2usize..=4,
        100u64..400,
        100u32..900,
        0u32..300,
        0u64..6,
        prop_oneof![Just(0u32), 0u32..400],
        prop_oneof![Just(0u32), 0u32..300],
        any::<bool>(),
        any::<u64>(),
    )
        .prop_map(
            |(
                replicas,
                steps_ms,
                arrival,
                release,
                max_delay_ms,
                loss,
                duplicate,
                reorder,
                seed,
            )| Fleet {
                replicas,
                steps_ms,
                arrival,
                release,
                max_delay_ms,
                loss,
                duplicate,
                reorder,
                seed,
            },
        )
}

struct Frontend {
    monitor: Arc<Monitor>,
    sync: Arc<BookingSync>,
    out: Outbox,
    held: Vec<Booking>,
    /// (time, blocks booked so far), one entry per booking.
    booked: Vec<(u64, u64)>,
}

impl Frontend {
    /// Blocks this frontend booked after time `after` (all of them for
    /// `None`), up to now.
    fn booked_after(&self, after: Option<u64>) -> u64 {
        let total = self.booked.last().map_or(0, |b| b.1);
        let before = after.map_or(0, |after| {
            self.booked
                .iter()
                .rev()
                .find(|b| b.0 <= after)
                .map_or(0, |b| b.1)
        });
        total - before
    }
}

/// Runs the fleet, checking the bound at every admission.
fn simulate(f: &Fleet) -> Result<(), TestCaseError> {
    let clock = ManualClock::new();
    let subjects = Subjects::new("sim").unwrap();
    let mut rng = Rng(f.seed);
    let mut fronts: Vec<Frontend> = (0..f.replicas)
        .map(|i| {
            let monitor = Arc::new(monitor_with(clock.clone()));
            monitor.add_worker(M, 1, spec(1, TOTAL)).unwrap();
            monitor.set_thresholds(M, &decode(0.5)).unwrap();
            let mut config = BookingSyncConfig::new(format!("f{i}"));
            config.debounce = Duration::from_millis(DEBOUNCE_MS);
            config.heartbeat = Duration::from_millis(50);
            config.expire_after = Duration::from_secs(3600);
            let sync = BookingSync::new(monitor.clone(), &subjects, config, clock.clone()).unwrap();
            Frontend {
                monitor,
                sync,
                out: Outbox::default(),
                held: Vec::new(),
                booked: Vec::new(),
            }
        })
        .collect();
    // In flight: (arrival time, to, sent at, subject, payload).
    let mut wire: VecDeque<(u64, usize, u64, String, Vec<u8>)> = VecDeque::new();
    // seen[i][j]: when the message of j that i last applied in step was
    // built (`None`: none yet).
    let mut seen = vec![vec![None; f.replicas]; f.replicas];
    let d = (DEBOUNCE_MS + f.max_delay_ms + 1) * MS;
    // Then a quiet second with nothing lost, booked or released.
    let quiet = f.steps_ms + 1000;
    // The latest arrival scheduled from one frontend to another.
    let mut fifo = vec![vec![0u64; f.replicas]; f.replicas];
    for ms in 0..quiet {
        let now = ms * MS;
        let settling = ms >= f.steps_ms;
        clock.set_nanos(now);
        // Deliveries due.
        let mut later = VecDeque::new();
        while let Some((at, to, sent_at, subject, payload)) = wire.pop_front() {
            if at > now {
                later.push_back((at, to, sent_at, subject, payload));
                continue;
            }
            let from: usize = subject.rsplit('.').next().unwrap()[1..].parse().unwrap();
            if fronts[to].sync.handle_on(&subject, &payload) == Ok(SyncApplied::Applied) {
                seen[to][from] = Some(sent_at);
            }
        }
        wire = later;
        // Releases and arrivals.
        for i in (0..f.replicas).filter(|_| !settling) {
            if !fronts[i].held.is_empty() && rng.chance(1000, f.release) {
                let k = rng.below(fronts[i].held.len() as u64) as usize;
                fronts[i].held.swap_remove(k);
            }
            if !rng.chance(1000, f.arrival) {
                continue;
            }
            let blocks = 1 + rng.below(40);
            if fronts[i].monitor.is_busy(1).unwrap() {
                continue;
            }
            let b = fronts[i].monitor.book(1, 0, blocks).unwrap();
            fronts[i].held.push(b);
            let so_far = fronts[i].booked.last().map_or(0, |b| b.1) + blocks;
            fronts[i].booked.push((now, so_far));
            let truth: u64 = fronts
                .iter()
                .map(|x| x.held.iter().map(Booking::blocks).sum::<u64>())
                .sum();
            let unseen: u64 = (0..f.replicas)
                .filter(|&j| j != i)
                .map(|j| fronts[j].booked_after(seen[i][j]))
                .sum();
            prop_assert!(
                truth <= LINE + blocks + unseen,
                "{f:?}: at {ms} ms frontend {i} admitted {blocks}: {truth} booked in all, \
                 {unseen} unseen"
            );
            if f.loss == 0 && !f.reorder {
                let within: u64 = (0..f.replicas)
                    .filter(|&j| j != i)
                    .map(|j| fronts[j].booked_after(now.checked_sub(d)))
                    .sum();
                prop_assert!(
                    truth <= LINE + blocks + within,
                    "{f:?}: at {ms} ms frontend {i}: {truth} booked, {within} within d"
                );
            }
        }
        // Ticks, each a debounce interval apart.
        if ms % DEBOUNCE_MS == 0 {
            for (i, front) in fronts.iter().enumerate() {
                front.sync.tick(&front.out).unwrap();
                for (subject, payload) in front.out.take() {
                    for to in (0..f.replicas).filter(|&to| to != i) {
                        if !settling && rng.chance(1000, f.loss) {
                            continue;
                        }
                        let copies = if rng.chance(1000, f.duplicate) { 2 } else { 1 };
                        for _ in 0..copies {
                            let mut at = now + rng.below(f.max_delay_ms + 1) * MS;
                            if !f.reorder || settling {
                                at = at.max(fifo[i][to]);
                                fifo[i][to] = at;
                            }
                            wire.push_back((at, to, now, subject.clone(), payload.clone()));
                        }
                    }
                }
            }
        }
    }
    let truth: u64 = fronts
        .iter()
        .map(|x| x.held.iter().map(Booking::blocks).sum::<u64>())
        .sum();
    for (i, front) in fronts.iter().enumerate() {
        let view = front.monitor.rank_load(1, 0).unwrap().active_decode_blocks;
        prop_assert_eq!(
            view,
            truth,
            "{:?}: frontend {}'s view after the quiet second",
            f,
            i
        );
        prop_assert_eq!(front.sync.stats().behind, 0);
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    #[test]
    fn shared_sync_over_admits_at_most_the_unseen_bookings(f in fleet()) {
        simulate(&f)?;
    }
}

/// Without sync the same fleet over-admits by whole frontends' worth: the
/// bound above is what the sync buys.
#[test]
fn without_sync_each_frontend_fills_the_line_alone() {
    let clock = ManualClock::new();
    let monitors: Vec<Monitor> = (0..3)
        .map(|_| {
            let m = monitor_with(clock.clone());
            m.add_worker(M, 1, spec(1, TOTAL)).unwrap();
            m.set_thresholds(M, &decode(0.5)).unwrap();
            m
        })
        .collect();
    let mut held = Vec::new();
    for m in &monitors {
        while !m.is_busy(1).unwrap() {
            held.push(m.book(1, 0, 10).unwrap());
        }
    }
    let truth: u64 = held.iter().map(Booking::blocks).sum();
    assert!(truth >= 3 * LINE, "{truth}");
}
