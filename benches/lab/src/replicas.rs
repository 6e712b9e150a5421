//! Many frontends, one fleet: designs built from the tuned arms, behind
//! one frontend and behind four replicas that share their bookings or do
//! not, on a fleet of eight workers at 1.5 and 3 times its capacity
//! (docs/replicas.md).
//!
//! The fleet's capacity is taken as twice `C*`, the four-worker fleet's:
//! each worker is an engine of its own, and the load balancer spreads
//! requests evenly. Over-admission is what the replicas admitted (requests
//! that entered an engine) beyond what one frontend admitted of the very
//! same requests; a line breach is an admission after which the blocks
//! the replicas had admitted to a rank, and not let go, passed its line.

use serde::Serialize;

use crate::arm::Arm;
use crate::matrix::Options;
use crate::record::Measured;
use crate::sim::{run, Conditions};
use crate::workload::WorkloadSpec;

/// Workers in the replicas runs.
pub const WORKERS: u32 = 8;
/// Replicas in the many-frontend runs.
pub const REPLICAS: u32 = 4;
/// The sync's debounce, seconds (the default).
pub const DEBOUNCE_S: f64 = 0.002;

/// How the replicas share the fleet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Sharing {
    /// No booking sync.
    None,
    /// Shared booking sync.
    Shared,
    /// Leased booking sync.
    Leased,
}

/// One run: a load, a number of frontends, with or without sync.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ReplicaRow {
    /// The design.
    pub design: &'static str,
    /// Offered load, in units of the eight-worker fleet's capacity.
    pub load: f64,
    /// Frontend replicas.
    pub frontends: u32,
    /// How they share their bookings.
    pub sync: Sharing,
    /// Every figure.
    pub measured: Measured,
    /// Admissions beyond the one-frontend run's of the same design and
    /// load (negative: fewer).
    pub over_admitted: i64,
    /// Booking sync messages sent, in all.
    pub sync_messages: u64,
    /// Messages a replica may send at most (one per debounce interval
    /// over the run), in all.
    pub sync_budget: u64,
    /// The messages' bytes, in all.
    pub sync_bytes: u64,
    /// The largest message, bytes.
    pub sync_max: usize,
    /// Admissions that left a rank past its line.
    pub line_breaches: u64,
    /// The most a rank's admitted blocks passed its line by.
    pub peak_over_line: u64,
    /// Leased sync: times a replica's lease ran out while it held a share.
    pub fenced: u64,
}

/// The modes run at each load: one frontend, four without sync, four
/// with shared sync, two and four with leased sync (how its cost grows
/// with the split).
pub const MODES: [(u32, Sharing); 5] = [
    (1, Sharing::None),
    (REPLICAS, Sharing::None),
    (REPLICAS, Sharing::Shared),
    (2, Sharing::Leased),
    (REPLICAS, Sharing::Leased),
];

/// Runs each design (a name and an arm) in every mode at 1.5 and 3 times
/// the fleet's capacity; `capacity` is the four-worker fleet's `C*`.
pub fn run_replicas(
    designs: &[(&'static str, Arm)],
    capacity: f64,
    base: &Conditions,
    options: Options,
) -> Result<Vec<ReplicaRow>, String> {
    let fleet = capacity * f64::from(WORKERS) / f64::from(base.workers);
    let duration_s = if options.quick { 20.0 } else { 60.0 };
    let mut jobs = Vec::new();
    for (design, e) in designs {
        for load in [1.5, 3.0] {
            for (frontends, sync) in MODES {
                jobs.push((*design, e, load, frontends, sync));
            }
        }
    }
    let results = crate::matrix::parallel(
        options.threads,
        jobs,
        |&(design, e, load, frontends, sync)| {
            let w = WorkloadSpec::steady(load * fleet, duration_s, options.seed ^ 0x2E91);
            let reqs = w.generate();
            let c = Conditions {
                workers: WORKERS,
                frontends,
                sync_debounce_s: (sync != Sharing::None).then_some(DEBOUNCE_S),
                sync_leased: sync == Sharing::Leased,
                ..*base
            };
            run(e, &w, &reqs, &c, fleet).map(|r| ReplicaRow {
                design,
                load,
                frontends,
                sync,
                measured: r.measured,
                over_admitted: 0,
                sync_messages: r.sync_messages,
                sync_budget: if sync != Sharing::None {
                    u64::from(frontends) * ((duration_s + c.drain_s) / DEBOUNCE_S).ceil() as u64
                } else {
                    0
                },
                sync_bytes: r.sync_bytes,
                sync_max: r.sync_max,
                line_breaches: r.line_breaches,
                peak_over_line: r.peak_over_line,
                fenced: r.fenced,
            })
        },
    );
    let mut rows = results.into_iter().collect::<Result<Vec<_>, _>>()?;
    let one: Vec<(&str, f64, u64)> = rows
        .iter()
        .filter(|r| r.frontends == 1)
        .map(|r| (r.design, r.load, r.measured.admissions))
        .collect();
    for r in &mut rows {
        if let Some(&(_, _, base)) = one.iter().find(|o| (o.0, o.1) == (r.design, r.load)) {
            r.over_admitted = r.measured.admissions as i64 - base as i64;
        }
    }
    Ok(rows)
}
