//! [`Booking`]: a routed request's KV blocks, counted in its rank's
//! `active_decode_blocks` until released, and its prompt tokens, counted in
//! the rank's `active_prefill_tokens` until its prefill is done.
//!
//! The router owns those fields (reports never carry them for a worker
//! whose router books; Dynamo 1.6.1's workers leave both nil, and its
//! frontend books them the same way). A booking adds to them and subtracts
//! from them with saturating `fetch_update`s, then registers the change
//! with the worker's combiner exactly like a report (see `rank.rs` for why
//! `Relaxed` is enough). A rank's `active_prefill_tokens` starts unreported
//! (the prefill checks skip it); the first prefill booking makes it
//! reported, from zero. A booking on a removed worker changes a rank nobody
//! reads.

use std::sync::Arc;

use super::outbox::OwnChange;
use super::rank::{add_saturating, sub_saturating, Worker};
use super::slo::Prediction;
use crate::error::ReportError;
use crate::load::UNREPORTED;
use crate::slo::StepLoad;
use crate::sync::{AtomicU64, Ordering};

/// A request's KV blocks (and prompt tokens) booked on a worker rank by the
/// router; the blocks count in that rank's `active_decode_blocks` until the
/// booking is released or dropped, the prompt tokens in its
/// `active_prefill_tokens` until [`prefill_done`](Booking::prefill_done),
/// release or drop.
#[derive(Debug)]
pub struct Booking {
    worker: Arc<Worker>,
    rank: usize,
    owner: Owner,
    blocks: u64,
    prefill: u64,
    /// Its id in the monitor's announced events, 0 when not announced
    /// (`outbox.rs`).
    announced: u64,
    /// With an SLO set for its model: the clock time it was made, of its
    /// last token (0: none yet), and the time to first token predicted
    /// then (negative: none trusted) (`slo.rs`).
    booked_at: u64,
    /// With an SLO: when the current window of streamed tokens began (0:
    /// no first token yet), the tokens in it, and the rank's load summed
    /// over them (`tokens`).
    window_at: u64,
    window_tokens: u64,
    window_load: StepLoad,
    /// With an SLO: when its first token came (0: not yet).
    first_at: u64,
    /// With an SLO: what was predicted at booking, if trusted.
    predicted: Option<Prediction>,
    /// Its prompt tokens as booked (`prefill` empties when it is done).
    prompt: u64,
    /// Its prefill is done: counted in its rank's `started` (`observe.rs`).
    started: bool,
    /// Answer tokens seen ([`first_token`](Booking::first_token) and
    /// [`tokens`](Booking::tokens)).
    generated: u64,
    /// The answer's reservation (`reserve.rs`): the most tokens it may
    /// reach (`u64::MAX`: unbounded, learned only; 0: none), and the
    /// blocks of `blocks` reserved for it now.
    output_cap: u64,
    reserved: u64,
}

/// Streamed tokens per observed step (`Booking::tokens`).
pub const STEP_WINDOW: u64 = 8;

/// Adds `n` booked prefill tokens; an unreported field starts from zero.
fn add_prefill(a: &AtomicU64, n: u64) {
    // Relaxed, as `add_saturating` (`rank.rs`). The sum stops below the
    // unreported marker.
    let _ = a.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| {
        Some(if v == UNREPORTED {
            n.min(UNREPORTED - 1)
        } else {
            v.saturating_add(n).min(UNREPORTED - 1)
        })
    });
}

/// Subtracts `n` booked prefill tokens, stopping at zero; an unreported
/// field stays so.
fn sub_prefill(a: &AtomicU64, n: u64) {
    // Relaxed, as `sub_saturating` (`rank.rs`).
    let _ = a.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| {
        (v != UNREPORTED).then(|| v.saturating_sub(n))
    });
}

impl Booking {
    /// Books `blocks` and `prefill` prompt tokens on rank index `rank` of
    /// `worker` and re-evaluates it. In leased mode (`share.rs`) this
    /// frontend's own booking must fit its share of the rank, or nothing is
    /// booked.
    pub(super) fn new(
        worker: Arc<Worker>,
        rank: usize,
        owner: Owner,
        blocks: u64,
        prefill: u64,
    ) -> Result<Self, ReportError> {
        Self::make(worker, rank, owner, (blocks, prefill), false)
    }

    /// [`new`](Self::new), returning only once the worker's busy state
    /// counts the booking (another thread may be publishing it): what a
    /// dispatch loop needs before it picks a worker for the next request.
    pub(super) fn new_published(
        worker: Arc<Worker>,
        rank: usize,
        owner: Owner,
        blocks: u64,
        prefill: u64,
    ) -> Result<Self, ReportError> {
        Self::make(worker, rank, owner, (blocks, prefill), true)
    }

    fn make(
        worker: Arc<Worker>,
        rank: usize,
        owner: Owner,
        (blocks, prefill): (u64, u64),
        wait: bool,
    ) -> Result<Self, ReportError> {
        // Out of leased mode, an own booking is counted as it always was
        // (one relaxed add in `shift`): the reservation's checked add is
        // leased mode's alone.
        // With an SLO, when it was made and what was predicted for it,
        // before it counts on the rank.
        // With an SLO, the answer's expected length is reserved from the
        // start (`reserve.rs`).
        let (booked_at, predicted, output_cap) = if worker.slo_on() {
            let now = worker.model.slo.observations.now().max(1);
            (now, worker.predicted(rank, prefill), u64::MAX)
        } else {
            (0, None, 0)
        };
        let reserved = worker.model.slo.reservation(output_cap, 0);
        let (prompt, blocks_asked) = (prefill, blocks);
        let blocks = blocks.saturating_add(reserved);
        let moved = if owner == Owner::Own && worker.model.share.is_leased() {
            let r = &worker.ranks[rank];
            let line = || r.line(&worker.model.thresholds.load());
            worker
                .model
                .share
                .reserve(&r.own_blocks, blocks, line)
                .map_err(|cap| ReportError::NoShare {
                    worker_id: worker.id,
                    dp_rank: worker.dp_start + rank as u32,
                    blocks: blocks_asked,
                    cap,
                })?;
            Owner::Reserved
        } else {
            owner
        };
        // Relaxed: a count read as a feature of the rank's load; counted
        // before the shift publishes the load it is a feature of.
        worker.ranks[rank]
            .slo
            .bookings
            .fetch_add(1, Ordering::Relaxed);
        shift(&worker, rank, moved, (0, 0), (blocks, prefill));
        if wait {
            worker.reevaluate_and_wait();
        }
        let announced = match owner {
            Owner::Shared => 0,
            _ => worker.model.outbox.booked(
                worker.id,
                worker.dp_start + rank as u32,
                blocks_asked,
                prefill,
            ),
        };
        Ok(Self {
            worker,
            rank,
            owner,
            blocks,
            prefill,
            announced,
            booked_at,
            window_at: 0,
            window_tokens: 0,
            window_load: StepLoad::default(),
            first_at: 0,
            predicted,
            prompt,
            started: false,
            generated: 0,
            output_cap,
            reserved,
        })
    }

    /// The request's prefill is done (its first token came): its prompt
    /// tokens stop counting in `active_prefill_tokens`; the blocks stay
    /// booked. Calling it again does nothing.
    pub fn prefill_done(&mut self) {
        let (blocks, prefill) = (self.blocks, std::mem::take(&mut self.prefill));
        if !std::mem::replace(&mut self.started, true) {
            // Relaxed: a count the publisher reads as seats the engine has
            // shown (`predict.rs`, `seats`); the shift publishes it.
            let slo = &self.worker.ranks[self.rank].slo;
            slo.started.fetch_add(1, Ordering::Relaxed);
        }
        shift(
            &self.worker,
            self.rank,
            self.owner,
            (blocks, prefill),
            (blocks, 0),
        );
        if prefill > 0 {
            self.announce(OwnChange::PrefillDone);
        }
    }

    /// The request's first token came: its prefill is done (as
    /// [`prefill_done`](Self::prefill_done)), the answer has one token
    /// (its reservation settles, `reserve.rs`) and, with an SLO set for its
    /// model ([`Monitor::set_slo`](super::Monitor::set_slo)), the time since
    /// it was booked is observed as its time to first token. Calling it
    /// again only marks the prefill done.
    pub fn first_token(&mut self) {
        self.prefill_done();
        if self.generated != 0 {
            return;
        }
        self.generated = 1;
        if self.booked_at != 0 {
            let now = self.worker.model.slo.observations.now().max(1);
            let observed = now.saturating_sub(self.booked_at) as f64 * 1e-9;
            self.worker
                .observe_first_token(self.rank, observed, self.predicted.map(|p| p.ttft));
            self.window_at = now;
            self.first_at = now;
        }
        self.settle();
    }

    /// `n` more tokens of the answer came, after the first: the
    /// reservation settles (`reserve.rs`) and, with an SLO set for its
    /// model, once [`STEP_WINDOW`] tokens came since the last observation,
    /// the time they took, over their number, is observed as one engine
    /// step of its rank under the rank's load averaged over them (a window
    /// smooths out which steps happened to carry a prefill). Before
    /// [`first_token`](Self::first_token), or for `n` of 0, it does nothing.
    pub fn tokens(&mut self, n: u64) {
        if n == 0 || self.generated == 0 {
            return;
        }
        self.generated = self.generated.saturating_add(n);
        if self.window_at != 0 {
            let load = self.worker.step_load(self.rank);
            let w = &mut self.window_load;
            let k = n as f64;
            w.prefill_tokens += load.prefill_tokens * k;
            w.running += load.running * k;
            w.kv_tokens += load.kv_tokens * k;
            self.window_tokens = self.window_tokens.saturating_add(n);
            if self.window_tokens >= STEP_WINDOW {
                let now = self.worker.model.slo.observations.now();
                // Tokens that all came at once (one chunk) are no step.
                if now > self.window_at {
                    let k = self.window_tokens as f64;
                    let gap = (now - self.window_at) as f64 * 1e-9 / k;
                    let w = std::mem::take(&mut self.window_load);
                    let load = StepLoad {
                        prefill_tokens: w.prefill_tokens / k,
                        running: w.running / k,
                        kv_tokens: w.kv_tokens / k,
                    };
                    self.worker
                        .observe_step(self.rank, gap, load, self.window_tokens);
                    (self.window_at, self.window_tokens) = (now, 0);
                }
            }
        }
        self.settle();
    }

    /// Reserves KV for the answer to come, up to `max_tokens` tokens (the
    /// request's limit; `None`: as long as the model's answers go),
    /// settling as it streams (`reserve.rs`). With an SLO set for its
    /// model every booking already reserves, unbounded; this bounds it.
    pub fn expect_output(&mut self, max_tokens: Option<u64>) {
        self.output_cap = max_tokens.unwrap_or(u64::MAX).max(1);
        self.settle();
    }

    /// The answer ended with `output_tokens` tokens (`None`: as many as
    /// [`first_token`](Self::first_token) and [`tokens`](Self::tokens)
    /// counted): with an SLO set for its model, its length is learned for
    /// the reservations of the answers to come and, booked with a trusted
    /// prediction, its time per output token (up to its last observed
    /// window, [`tokens`](Self::tokens)) is weighed against the TPOT
    /// target: the rank's TPOT margin (`predict.rs`, `answered`). Releases
    /// the booking.
    pub fn finish(self, output_tokens: Option<u64>) {
        if self.worker.slo_on() {
            let output = output_tokens.unwrap_or(self.generated);
            // The gaps up to the last window observed (`tokens`).
            let gaps = self
                .generated
                .saturating_sub(self.window_tokens)
                .saturating_sub(1);
            let tpot = match (self.predicted, gaps) {
                (Some(_), 1..) if self.first_at != 0 && self.window_at > self.first_at => {
                    (self.window_at - self.first_at) as f64 * 1e-9 / gaps as f64
                }
                _ => 0.0,
            };
            self.worker
                .observe_answer(self.rank, self.prompt, output, tpot);
        }
    }

    /// What the SLO's fit predicted for this request when it was booked
    /// (time to first token from then, time per output token), if its
    /// model has an SLO and the rank's fit was trusted.
    pub fn prediction(&self) -> Option<Prediction> {
        self.predicted
    }

    /// Answer tokens counted so far.
    pub fn output_tokens(&self) -> u64 {
        self.generated
    }

    /// Blocks reserved now for the answer (part of [`blocks`](Self::blocks)).
    pub fn reserved_blocks(&self) -> u64 {
        self.reserved
    }

    /// Moves the reservation to what the answer needs now.
    fn settle(&mut self) {
        let slo = &self.worker.model.slo;
        let want = slo.reservation(self.output_cap, self.generated);
        if want == self.reserved {
            return;
        }
        let (from, prefill) = (self.blocks, self.prefill);
        self.blocks = self.blocks - self.reserved + want;
        self.reserved = want;
        let to = (self.blocks, prefill);
        shift(&self.worker, self.rank, self.owner, (from, prefill), to);
    }

    /// Announces a change to the booking, if the booking was announced.
    fn announce(&self, change: OwnChange) {
        if self.announced != 0 {
            let w = &self.worker;
            let rank = w.dp_start + self.rank as u32;
            w.model.outbox.changed(self.announced, w.id, rank, change);
        }
    }

    /// Prompt tokens still booked (0 once the prefill is done).
    pub fn prefill_tokens(&self) -> u64 {
        self.prefill
    }

    /// Adds `n` generated output blocks to the booking (not announced to
    /// the reference routers: their events have no such change;
    /// `crate::cluster::BookingAnnouncer`). A booking with a reservation
    /// (`reserve.rs`) ignores it: its answer's blocks are the
    /// reservation's, settled by [`tokens`](Self::tokens).
    pub fn add_output_blocks(&mut self, n: u64) {
        if n == 0 || self.blocks == u64::MAX || self.output_cap != 0 {
            return;
        }
        let n = n.min(u64::MAX - self.blocks);
        let (from, prefill) = (self.blocks, self.prefill);
        self.blocks += n;
        let to = (self.blocks, prefill);
        shift(&self.worker, self.rank, self.owner, (from, prefill), to);
    }

    /// Blocks currently booked.
    pub fn blocks(&self) -> u64 {
        self.blocks
    }

    /// The worker this booking is on.
    pub fn worker_id(&self) -> u64 {
        self.worker.id
    }

    /// The data-parallel rank this booking is on.
    pub fn dp_rank(&self) -> u32 {
        self.worker.dp_start + self.rank as u32
    }

    /// Frees the booked blocks and prompt tokens (same as dropping the
    /// booking).
    pub fn release(self) {}
}

/// Whose bookings a [`shift`] moves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Owner {
    /// This monitor's own (counted in the rank's `own_*` too).
    Own,
    /// Another router's: another frontend's from booking sync, or a
    /// reference router's (`cluster/bookings.rs`).
    Shared,
    /// This monitor's own, whose blocks its share already reserved in
    /// `own_blocks` (`share.rs`): a new booking's first shift.
    Reserved,
}

/// Moves rank index `rank` of `worker` from `from` to `to` booked (blocks,
/// prefill tokens) and re-evaluates it (a publication that leaves the
/// worker free kicks the model's queue). Every booking change goes through
/// here, and so do the other frontends' bookings (`replicas.rs`).
pub(super) fn shift(worker: &Worker, rank: usize, owner: Owner, from: (u64, u64), to: (u64, u64)) {
    let r = &worker.ranks[rank];
    if owner == Owner::Own {
        // Relaxed: counters the sync reads now and then, ordered by nothing
        // but a new booking's reservation (`share.rs`), which is not here.
        move_counter(&r.own_blocks, from.0, to.0);
    }
    if owner != Owner::Shared {
        move_counter(&r.own_prefill, from.1, to.1);
        if from != to || owner == Owner::Reserved {
            worker.mark_own_changed();
        }
    }
    move_counter(&r.active_decode_blocks, from.0, to.0);
    if to.1 > from.1 {
        add_prefill(&r.active_prefill_tokens, to.1 - from.1);
    } else if to.1 < from.1 {
        sub_prefill(&r.active_prefill_tokens, from.1 - to.1);
    }
    if from != to {
        worker.reevaluate();
    }
}

/// Moves a counter from `from` to `to`, saturating.
fn move_counter(a: &AtomicU64, from: u64, to: u64) {
    if to > from {
        add_saturating(a, to - from);
    } else if to < from {
        sub_saturating(a, from - to);
    }
}

impl Drop for Booking {
    fn drop(&mut self) {
        let (from, to) = ((self.blocks, self.prefill), (0, 0));
        // Relaxed: as in `make`; a count the maintenance samples.
        let slo = &self.worker.ranks[self.rank].slo;
        slo.bookings.fetch_sub(1, Ordering::Relaxed);
        slo.released.fetch_add(1, Ordering::Relaxed);
        if self.started {
            slo.started.fetch_sub(1, Ordering::Relaxed);
        }
        shift(&self.worker, self.rank, self.owner, from, to);
        self.announce(OwnChange::Released);
    }
}
