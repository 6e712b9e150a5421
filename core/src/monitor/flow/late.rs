//! An SLO's say over the queue (`Monitor::set_slo`): a request that finds
//! no worker free waits only while its wait is predicted to leave its time
//! to first token within the target. Otherwise it is refused at once, so a
//! hopeless request hears so in microseconds instead of at its deadline.
//!
//! * **The budget.** The TTFT target less the time from dispatch to first
//!   token the model's requests showed lately: the running mean plus
//!   two running mean absolute deviations (`ModelSlo::queue_budget`). Before the
//!   first is seen, half the target. A queued request's deadline is cut to
//!   the budget: past it, dispatching it would only make it late.
//! * **The prediction.** The requests waiting ahead of it (its band and
//!   the more important ones) and itself, over the queue's drain less the
//!   rate at which more important requests are taken in, since those
//!   overtake it as they come. The drain is the lesser of two: every
//!   dispatch the queue made, queued or direct, and the rate the model's
//!   bookings end (`freed.rs`). A waiting request is sent as room frees,
//!   so the dispatches made while ranks were free (the fleet filling, the
//!   room a report frees at once) overstate its drain; and a rank held
//!   until its predicted times fall reopens later than its bookings end,
//!   so the releases alone can overstate it too. Each is counted over the
//!   budget before now, so a drain in bursts is seen whole, and the
//!   difference is taken two standard deviations low; the wait is never
//!   shorter than what remains of the dispatches' longest pause over the
//!   last four budgets, since a drain in bursts (every rank holding long
//!   answers) sends the next only after one (`FlowQueue::predicted_wait`).
//!   Before two dispatches nothing is predicted, and the request waits up
//!   to its cut deadline; before two bookings have ended, a request waits
//!   only if none is ahead of it (the drain a waiting request will see is
//!   not known yet).
//! * **The decision.** Enforced: a request whose wait, times [`HEADROOM`],
//!   passes the cut deadline is refused with
//!   [`FlowRejection::QueueDeadline`] (the reason a request
//!   that waited it out gets) and counted
//!   (`frontend_slo_refused_late_total`); the client's `Retry-After` is the
//!   queue's predicted drain ([`Monitor::flow_retry_after`]). Advisory: the
//!   request waits as without an SLO, and the SLO counts whether it would
//!   have let it wait (`would_queue`) or refused it (`would_refuse`).
//!
//! [`Monitor::flow_retry_after`]: crate::Monitor::flow_retry_after

use std::time::Duration;

use crate::flow::{FlowQueue, FlowRejection, FlowRequest};
use crate::monitor::observe::{ModelSlo, SloMode};
use crate::sync::Ordering;

/// How many times its predicted wait a request's deadline must hold: the
/// rates behind a prediction are counts over a budget's length, and the
/// future arrivals that overtake a wait are no more certain.
const HEADROOM: u32 = 2;

/// What the SLO makes of a request about to wait in `queue`: the deadline
/// it waits with (its own, cut to the budget), or its refusal. `None`:
/// no enforced SLO, the request waits as asked.
pub(super) fn decide(
    slo: &ModelSlo,
    queue: &FlowQueue<u32>,
    request: &FlowRequest<'_>,
    now: u64,
) -> Option<Result<Duration, FlowRejection>> {
    let mode = slo.mode()?;
    let deadline = queue.deadline_of(request).min(slo.queue_budget());
    let late = match slo.freed() {
        None if queue.ahead_of(request.priority) > 0 => true,
        freed => queue
            .predicted_wait(request.priority, now, deadline, freed)
            .is_some_and(|w| w.saturating_mul(HEADROOM) > deadline),
    };
    let count = |c: &crate::sync::AtomicU64| {
        // Relaxed: a counter.
        c.fetch_add(1, Ordering::Relaxed);
    };
    match mode {
        SloMode::Enforce if late => {
            count(&slo.refused_late);
            Some(Err(FlowRejection::QueueDeadline))
        }
        SloMode::Enforce => Some(Ok(deadline)),
        SloMode::Advisory => {
            count(if late {
                &slo.would_refuse
            } else {
                &slo.would_queue
            });
            None
        }
    }
}
