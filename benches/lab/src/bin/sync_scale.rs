//! `sync-scale`: booking sync at fleet scale, on a virtual clock.
//!
//! F frontends (16 by default), each a real `Monitor` with a real
//! `BookingSync`, in front of W workers of R data-parallel ranks (8), share
//! their bookings through an in-process wire that delays every message by
//! the transport's one-way delay (1 ms). Each frontend gets its share of an
//! open-loop Poisson arrival stream at `--load` times the fleet's capacity
//! (3 by default), routes each request to a free worker by its own view
//! (`Monitor::select`, then the worker's least-loaded rank) and books it
//! for an exponential lifetime. Everything runs on one thread; the CPU
//! time of every tick (encode) and every message applied (apply) is
//! measured as it runs.
//!
//! Per size it reports, per frontend and second of the measured window:
//! messages and bytes out and in, the rank changes sent and their size,
//! whole states sent, encode and apply CPU time, the apply rate; the
//! fleet's line breaches and largest excess over a rank's line; and the
//! time a frontend joining a still fleet takes to see every booking.
//!
//! `cargo run --release -p loadgate-lab --bin sync-scale -- [--workers 8,64,1024,8192]
//! [--ranks 8] [--frontends 16] [--load 3] [--seconds 3] [--delay-ms 1] [--mode shared|leased]
//! [--quick]`. Exit status 2: a bad command line.

use std::collections::VecDeque;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use loadgate::cluster::replicas::{
    BookingSync, BookingSyncConfig, SyncMessage, SyncMode, SyncStats,
};
use loadgate::cluster::{ClusterError, Handler, Subjects, Subscription, Transport};
use loadgate::{Booking, ManualClock, Monitor, MonitorConfig, Policy, ThresholdUpdate, WorkerSpec};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rand_distr::{Distribution, Exp, Poisson};

const MODEL: &str = "m";
const MS: u64 = 1_000_000;
/// Every rank's KV blocks; the decode threshold of one half puts its line
/// at 1000 blocks.
const KV_BLOCKS: u64 = 2000;
const LINE: u64 = KV_BLOCKS / 2;
/// A request's blocks: uniform in 20..=80 (50 on average, 20 to a line).
const BLOCKS: (u64, u64) = (20, 80);
/// A request's mean lifetime.
const LIFETIME_S: f64 = 2.0;
/// Warm-up before the measured window: the fleet fills.
const WARM_MS: u64 = 2000;

struct Settings {
    workers: Vec<u64>,
    ranks: u32,
    frontends: usize,
    load: f64,
    seconds: u64,
    delay_ms: u64,
    mode: SyncMode,
}

/// Keeps what a frontend publishes, for the wire to deliver.
#[derive(Default)]
struct Outbox(Mutex<Vec<Vec<u8>>>);

impl Transport for Outbox {
    fn publish(&self, _: &str, payload: Vec<u8>) -> Result<(), ClusterError> {
        self.0.lock().unwrap().push(payload);
        Ok(())
    }

    fn subscribe(&self, _: &str, _: Handler) -> Result<Subscription, ClusterError> {
        unreachable!("the driver delivers")
    }

    fn interruptions(&self) -> u64 {
        0
    }
}

/// Messages in flight: (due, to, the subject and payload).
type Wire = VecDeque<(u64, usize, Arc<(String, Vec<u8>)>)>;

struct Frontend {
    monitor: Arc<Monitor>,
    sync: Arc<BookingSync>,
    out: Outbox,
    subject: String,
    encode: Duration,
    apply: Duration,
    /// Rank entries sent in changes.
    changes: u64,
}

fn frontend(i: usize, s: &Settings, workers: u64, clock: &Arc<ManualClock>) -> Frontend {
    let config = MonitorConfig {
        limits: loadgate::Limits {
            max_workers: 16_384,
            max_workers_per_model: 16_384,
            max_ranks: 1 << 17,
            ..loadgate::Limits::default()
        },
        ..Default::default()
    };
    let monitor = Arc::new(Monitor::with_config(config, clock.clone()).unwrap());
    let spec = WorkerSpec {
        dp_size: s.ranks,
        kv_total_blocks: Some(KV_BLOCKS),
        ..Default::default()
    };
    for w in 1..=workers {
        monitor.add_worker(MODEL, w, spec).unwrap();
    }
    let half = ThresholdUpdate {
        active_decode_blocks_threshold: Some(0.5),
        ..Default::default()
    };
    monitor.set_thresholds(MODEL, &half).unwrap();
    let subjects = Subjects::new("scale").unwrap();
    let id = format!("f{i:02}");
    let mut config = BookingSyncConfig::new(&id);
    config.mode = s.mode;
    config.max_entries = 1 << 22;
    config.max_payload = 16 << 20;
    config.max_frontends = 64;
    let sync = BookingSync::new(monitor.clone(), &subjects, config, clock.clone()).unwrap();
    Frontend {
        monitor,
        sync,
        out: Outbox::default(),
        subject: subjects.bookings(&id),
        encode: Duration::ZERO,
        apply: Duration::ZERO,
        changes: 0,
    }
}

/// What one size measured, per frontend and second.
#[derive(Default)]
struct Figures {
    sent: f64,
    bytes_out: f64,
    received: f64,
    bytes_in: f64,
    changes: f64,
    bytes_per_change: f64,
    snapshots: f64,
    whole_state_bytes: f64,
    encode_ms: f64,
    apply_ms: f64,
    apply_rate: f64,
    admitted: f64,
    breaches: u64,
    most_excess: u64,
    /// Admissions past the bound of docs/replicas.md: the request's own
    /// blocks plus what the other frontends booked on the rank within `d`.
    past_bound: u64,
    admissions: u64,
    join_ms: u64,
    join_bytes: u64,
}

/// Runs one fleet of `workers` workers.
fn run(s: &Settings, workers: u64, seed: u64) -> Figures {
    let clock = ManualClock::new();
    let mut fronts: Vec<Frontend> = (0..s.frontends)
        .map(|i| frontend(i, s, workers, &clock))
        .collect();
    let ranks = s.ranks as u64;
    let capacity = (workers * ranks) as f64 * (LINE as f64 / 50.0) / LIFETIME_S;
    let per_ms = s.load * capacity / s.frontends as f64 / 1000.0;
    let arrivals = Poisson::new(per_ms).unwrap();
    let lifetime = Exp::new(1.0 / LIFETIME_S).unwrap();
    let mut rng = StdRng::seed_from_u64(seed);
    let end_ms = WARM_MS + s.seconds * 1000;
    // truth[(w - 1) * ranks + r]: every frontend's bookings on the rank.
    let mut truth = vec![0u64; (workers * ranks) as usize];
    // Per rank, the bookings of the last `d`: (ms, frontend, blocks).
    let d_ms = 2 + s.delay_ms + 1;
    let mut recent: Vec<Vec<(u64, usize, u64)>> = vec![Vec::new(); (workers * ranks) as usize];
    // The bookings ending in each millisecond.
    let horizon = end_ms as usize + 1;
    let mut ending: Vec<Vec<Booking>> = (0..horizon).map(|_| Vec::new()).collect();
    let mut wire: Wire = VecDeque::new();
    let mut f = Figures::default();
    let mut at_warm: Vec<SyncStats> = Vec::new();
    for ms in 0..end_ms {
        let now = ms * MS;
        clock.set_nanos(now);
        if ms == WARM_MS {
            at_warm = fronts.iter().map(|x| x.sync.stats()).collect();
            for x in &mut fronts {
                (x.encode, x.apply, x.changes) = (Duration::ZERO, Duration::ZERO, 0);
            }
        }
        deliver(&mut wire, &mut fronts, now);
        for b in std::mem::take(&mut ending[ms as usize]) {
            let k = ((b.worker_id() - 1) * ranks + u64::from(b.dp_rank())) as usize;
            truth[k] -= b.blocks();
        }
        for (i, x) in fronts.iter().enumerate() {
            for _ in 0..arrivals.sample(&mut rng) as u64 {
                let Ok(w) = x.monitor.select(MODEL, Policy::RoundRobin) else {
                    continue;
                };
                let rank = (0..s.ranks)
                    .min_by_key(|&r| x.monitor.rank_load(w, r).unwrap().active_decode_blocks)
                    .unwrap();
                let blocks = rng.gen_range(BLOCKS.0..=BLOCKS.1);
                let Ok(b) = x.monitor.book(w, rank, blocks) else {
                    continue;
                };
                let k = ((w - 1) * ranks + u64::from(rank)) as usize;
                truth[k] += blocks;
                recent[k].retain(|r| r.0 + d_ms > ms);
                let unseen: u64 = recent[k].iter().filter(|r| r.1 != i).map(|r| r.2).sum();
                recent[k].push((ms, i, blocks));
                if ms >= WARM_MS {
                    f.admissions += 1;
                    if truth[k] > LINE {
                        f.breaches += 1;
                        f.most_excess = f.most_excess.max(truth[k] - LINE);
                    }
                    if truth[k] > LINE + blocks + unseen {
                        f.past_bound += 1;
                    }
                }
                let life = (lifetime.sample(&mut rng) * 1000.0).ceil() as u64;
                let end = (ms + life.max(1)).min(end_ms) as usize;
                ending[end].push(b);
            }
        }
        tick(&mut fronts, &mut wire, ms, s.delay_ms);
    }
    let window = s.seconds as f64;
    let n = s.frontends as f64;
    for (x, w) in fronts.iter().zip(&at_warm) {
        let st = x.sync.stats();
        f.sent += (st.sent - w.sent) as f64;
        f.bytes_out += (st.bytes_sent - w.bytes_sent) as f64;
        f.received += (st.received - w.received) as f64;
        f.bytes_in += (st.bytes_received - w.bytes_received) as f64;
        f.snapshots += (st.snapshots_sent - w.snapshots_sent) as f64;
        f.changes += x.changes as f64;
        f.encode_ms += x.encode.as_secs_f64() * 1000.0;
        f.apply_ms += x.apply.as_secs_f64() * 1000.0;
    }
    let applied_entries: f64 = fronts.iter().map(|x| x.changes as f64).sum::<f64>() * (n - 1.0);
    let apply_s: f64 = fronts.iter().map(|x| x.apply.as_secs_f64()).sum();
    f.apply_rate = applied_entries / apply_s.max(1e-9);
    f.admitted = f.admissions as f64 / window / n;
    // The bytes a change message spends per rank entry, all overhead in.
    f.bytes_per_change = f.bytes_out / f.changes.max(1.0);
    for v in [
        &mut f.sent,
        &mut f.bytes_out,
        &mut f.received,
        &mut f.bytes_in,
        &mut f.snapshots,
        &mut f.changes,
        &mut f.encode_ms,
        &mut f.apply_ms,
    ] {
        *v /= window * n;
    }
    // A frontend joins a fleet that stands still (nothing booked or
    // released meanwhile): how long until it sees every booking.
    let joiner = frontend(s.frontends, s, workers, &clock);
    fronts.push(joiner);
    let last = fronts.len() - 1;
    let before = fronts[last].sync.stats().bytes_received;
    let start = end_ms;
    for ms in start.. {
        clock.set_nanos(ms * MS);
        deliver(&mut wire, &mut fronts, ms * MS);
        let j = &fronts[last].monitor;
        let seen = (1..=workers).all(|w| {
            (0..s.ranks).all(|r| {
                let k = ((w - 1) * ranks + u64::from(r)) as usize;
                j.rank_load(w, r).unwrap().active_decode_blocks == truth[k]
            })
        });
        if seen && ms > start {
            f.join_ms = ms - start;
            break;
        }
        tick(&mut fronts, &mut wire, ms, s.delay_ms);
        assert!(ms - start < 60_000, "the joiner never saw the fleet");
    }
    f.join_bytes = fronts[last].sync.stats().bytes_received - before;
    // The others' answers to the joiner's hello are their whole states.
    f.whole_state_bytes = f.join_bytes as f64 / n;
    drop(ending);
    f
}

/// Every frontend whose turn it is ticks (every 2 ms, staggered); what it
/// sends goes on the wire to every frontend, itself included (as NATS
/// delivers a publisher's own messages: leased mode renews on them),
/// `delay_ms` later.
fn tick(fronts: &mut [Frontend], wire: &mut Wire, ms: u64, delay_ms: u64) {
    let n = fronts.len();
    for (i, x) in fronts.iter_mut().enumerate() {
        if (ms + i as u64) % 2 != 0 {
            continue;
        }
        let t = Instant::now();
        x.sync.tick(&x.out).unwrap();
        x.encode += t.elapsed();
        for payload in std::mem::take(&mut *x.out.0.lock().unwrap()) {
            let m = SyncMessage::decode(&payload).unwrap();
            if !m.full {
                x.changes += m.ranks.len() as u64;
            }
            let shared = Arc::new((x.subject.clone(), payload));
            for to in 0..n {
                wire.push_back(((ms + delay_ms) * MS, to, shared.clone()));
            }
        }
    }
}

/// Delivers every message due by `now`, in order.
fn deliver(wire: &mut Wire, fronts: &mut [Frontend], now: u64) {
    while wire.front().is_some_and(|m| m.0 <= now) {
        let (_, to, m) = wire.pop_front().unwrap();
        let Some(x) = fronts.get_mut(to) else {
            continue;
        };
        let t = Instant::now();
        let _ = x.sync.handle_on(&m.0, &m.1);
        x.apply += t.elapsed();
    }
}

fn parse() -> Result<Settings, String> {
    let mut s = Settings {
        workers: vec![8, 64, 1024, 8192],
        ranks: 8,
        frontends: 16,
        load: 3.0,
        seconds: 3,
        delay_ms: 1,
        mode: SyncMode::Shared,
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut value = |name: &str| args.next().ok_or_else(|| format!("{name} needs a value"));
        let num = |v: String, name: &str| {
            v.parse::<u64>()
                .map_err(|_| format!("{name}: {v:?} is not a number"))
        };
        match a.as_str() {
            "--workers" => {
                s.workers = value("--workers")?
                    .split(',')
                    .map(|w| w.parse::<u64>().map_err(|_| format!("--workers: {w:?}")))
                    .collect::<Result<_, _>>()?
            }
            "--ranks" => s.ranks = num(value("--ranks")?, "--ranks")? as u32,
            "--frontends" => s.frontends = num(value("--frontends")?, "--frontends")? as usize,
            "--seconds" => s.seconds = num(value("--seconds")?, "--seconds")?,
            "--delay-ms" => s.delay_ms = num(value("--delay-ms")?, "--delay-ms")?,
            "--load" => {
                let v = value("--load")?;
                s.load = v.parse().map_err(|_| format!("--load: {v:?}"))?;
            }
            "--mode" => {
                s.mode = match value("--mode")?.as_str() {
                    "shared" => SyncMode::Shared,
                    "leased" => SyncMode::Leased,
                    other => return Err(format!("--mode: {other:?} is not shared or leased")),
                }
            }
            "--quick" => (s.workers, s.seconds) = (vec![8, 64, 1024], 1),
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    if s.frontends < 2 || s.ranks == 0 || s.seconds == 0 || s.workers.contains(&0) {
        return Err(
            "--frontends must be at least 2; --ranks, --seconds and --workers at least 1".into(),
        );
    }
    Ok(s)
}

fn main() -> ExitCode {
    let s = match parse() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("sync-scale: {e}");
            return ExitCode::from(2);
        }
    };
    let mut failed = false;
    println!(
        "{} frontends, {} ranks per worker, {:.1} x capacity, {} s measured after {} s, {} ms one-way delay, {:?} mode",
        s.frontends,
        s.ranks,
        s.load,
        s.seconds,
        WARM_MS / 1000,
        s.delay_ms,
        s.mode
    );
    println!(
        "| workers | ranks | admitted/s | msgs out/s | KB out/s | msgs in/s | KB in/s | changes/s | B/change | whole states/s | whole state KB | whole state per msg, KB/s | encode ms/s | apply ms/s | apply M changes/s | past the line | most excess | past the bound | join ms |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    for &w in &s.workers {
        let t = Instant::now();
        let f = run(&s, w, 7);
        println!(
            "| {w} | {} | {:.0} | {:.0} | {:.1} | {:.0} | {:.1} | {:.0} | {:.1} | {:.2} | {:.1} | {:.0} | {:.2} | {:.2} | {:.2} | {} of {} | {} | {} | {} |",
            w * u64::from(s.ranks),
            f.admitted,
            f.sent,
            f.bytes_out / 1000.0,
            f.received,
            f.bytes_in / 1000.0,
            f.changes,
            f.bytes_per_change,
            f.snapshots,
            f.whole_state_bytes / 1000.0,
            f.sent * f.whole_state_bytes / 1000.0,
            f.encode_ms,
            f.apply_ms,
            f.apply_rate / 1e6,
            f.breaches,
            f.admissions,
            f.most_excess,
            f.past_bound,
            f.join_ms,
        );
        eprintln!("  ({w} workers: {:.1} s)", t.elapsed().as_secs_f64());
        // The checks: shared mode keeps the bound of docs/replicas.md, and
        // leased mode never books past a line.
        let broken = match s.mode {
            SyncMode::Shared => f.past_bound,
            SyncMode::Leased => f.breaches,
        };
        if broken > 0 || f.admissions == 0 {
            eprintln!(
                "sync-scale: {w} workers: {broken} admissions broke the bound, of {}",
                f.admissions
            );
            failed = true;
        }
        // Nothing is lost here: whole states go only on the join (after
        // the window) and every `snapshot_every` (10 s).
        if f.snapshots > 1.0 {
            eprintln!(
                "sync-scale: {w} workers: {:.1} whole states a second",
                f.snapshots
            );
            failed = true;
        }
    }
    if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}
