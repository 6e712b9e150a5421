//! The monitor's pick that books a worker for a request (an arrival's, or
//! the dispatch loop's), and the maintenance's pass over the kicked
//! queues (`flow/mod.rs`, "Dispatching").

use arc_swap::ArcSwap;

use super::control::After;
use super::Flows;
use crate::clock::SharedClock;
use crate::error::ReportError;
use crate::monitor::booking::Booking;
use crate::monitor::config::Policy;
use crate::monitor::model::Model;
use crate::monitor::registry::Registry;
use crate::monitor::Owner;
use crate::sync::{lock, Ordering};

/// Workers tried for one request before it waits, when this frontend's
/// leased share has no room on the ones routing found free (`share.rs`).
const NO_SHARE_TRIES: u32 = 4;

/// Runs the dispatch loop of every queue that was kicked or whose earliest
/// deadline came, delivering the outcomes on this thread; the earliest
/// deadline left, in clock nanoseconds.
pub(in crate::monitor) fn run_queues(
    flows: &Flows,
    registry: &ArcSwap<Registry>,
    clock: &SharedClock,
) -> Option<u64> {
    let flows = flows.load_full();
    let mut next: Option<u64> = None;
    for flow in flows.values() {
        let m = &*flow.model;
        let kicked = flow.take_kick();
        let now = clock.now_nanos();
        let mut st = lock(&flow.state);
        let due = st.queue.next_deadline().is_some_and(|d| d <= now);
        if kicked || due {
            loop {
                let mut after: After = After::default();
                let more = flow.run(
                    &mut st,
                    clock,
                    now,
                    &mut |blocks, prefill| {
                        pick_and_book(registry, m, clock, flow.policy, blocks, prefill)
                    },
                    &mut after,
                );
                drop(st);
                after.deliver(flow);
                st = lock(&flow.state);
                if !more {
                    break;
                }
            }
        }
        if let Some(d) = st.queue.next_deadline() {
            next = Some(next.map_or(d, |n| n.min(d)));
        }
    }
    next
}

/// Picks a free worker of `m` by `policy` and books `blocks` and `prefill`
/// tokens on its least loaded rank: the worker and its booking (none for a
/// worker that declared no ranks: it is never busy, and has nothing to
/// book), or `None` when no worker is free. It returns once the worker's busy state counts
/// the booking, so the next pick of a loop sees it. A worker removed since the pick is picked
/// again; one where this frontend's leased share has no room for the
/// request (`share.rs`) is passed over, and after a few such the request is
/// left to wait (a release or a larger share kicks the queue).
pub(super) fn pick_and_book(
    registry: &ArcSwap<Registry>,
    m: &Model,
    clock: &SharedClock,
    policy: Policy,
    blocks: u64,
    prefill: u64,
) -> Option<(u64, Option<Booking>)> {
    let mut no_share = 0;
    loop {
        let slot = m.pick(policy, clock)?;
        // Relaxed: as in `Model::select`.
        let worker_id = m.ids[slot].load(Ordering::Relaxed);
        let reg = registry.load();
        let booked = match reg.workers.get(&worker_id) {
            Some(worker) if worker.ranks.is_empty() => return Some((worker_id, None)),
            Some(worker) => {
                let rank = worker.least_loaded_rank();
                Booking::new_published(worker.clone(), rank, Owner::Own, blocks, prefill)
            }
            None => Err(ReportError::UnknownWorker(worker_id)),
        };
        match booked {
            Ok(booking) => return Some((worker_id, Some(booking))),
            Err(ReportError::NoShare { .. }) if no_share < NO_SHARE_TRIES => no_share += 1,
            Err(ReportError::NoShare { .. }) => return None,
            Err(_) => {}
        }
    }
}
