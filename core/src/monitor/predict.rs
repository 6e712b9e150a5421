//! SLO admission's predictions and verdict for one rank, from its fit's
//! published state and its load alone (`RankSlo`, `RankLoad`): what
//! `slo.rs` shows and the worker's publisher (`rank.rs`) decides with. It
//! knows no worker or registry, so both can use it without a circle.
//!
//! The formulas are `slo.rs`'s module docs; the rules of the verdict are
//! [`verdict`]'s and [`seats`]'.

use super::observe::{BusyTerm, ModelSlo, Observations, RankSlo, SloMode, NO_CLEAN_REPORT};
use crate::slo::{StepLoad, HYSTERESIS, KV_LINE};
use crate::sync::Ordering;
use crate::thresholds::{RankLoad, DEFAULT_BLOCK_TOKENS};

/// How many running relative errors of headroom a prediction keeps under
/// its target (`verdict`).
const MARGIN: f64 = 2.0;

/// A prediction for a new request on one rank.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Prediction {
    /// Time to its first token, seconds.
    pub ttft: f64,
    /// Time per output token once admitted, seconds.
    pub tpot: f64,
    /// Whether both are trusted (each from a fit with enough
    /// observations, within its error); an untrusted one is shown, never
    /// acted on.
    pub trusted: bool,
}

/// The two predictions of a rank, each `None` while no fit behind it is
/// trusted.
#[derive(Debug, Clone, Copy)]
struct Parts {
    ttft: (f64, bool),
    tpot: (f64, bool),
}

/// The load features of a step of `rank` under its load `l`: the prefill
/// booked, up to the batch budget a step takes.
pub(super) fn step_load(slo: &RankSlo, l: &RankLoad) -> StepLoad {
    let blocks = l.active_decode_blocks.max(l.kv_used_blocks);
    let prefill = l.active_prefill_tokens.unwrap_or(0);
    StepLoad {
        prefill_tokens: prefill.min(l.max_num_batched_tokens.max(1)) as f64,
        // Relaxed: a count read for a feature. Those the engine reports
        // waiting are booked but not in its steps.
        running: slo
            .bookings
            .load(Ordering::Relaxed)
            .saturating_sub(l.waiting_requests.unwrap_or(0)) as f64,
        kv_tokens: blocks.saturating_mul(DEFAULT_BLOCK_TOKENS) as f64,
    }
}

/// `c · [1, prefill, prefill², running, kv]` (`StepFit::coefficients`).
fn linear(c: &[f64; 5], x: &StepLoad) -> f64 {
    let p = x.prefill_tokens;
    c[0] + c[1] * p + c[2] * p * p + c[3] * x.running + c[4] * x.kv_tokens
}

/// The predictions for `prompt` tokens on `rank` under its load `l`
/// (module docs), from the step fit.
fn parts(slo: &RankSlo, l: &RankLoad, prompt: u64) -> Parts {
    let c = slo.coefficients();
    let now = step_load(slo, l);
    let batch = l.max_num_batched_tokens.max(1) as f64;
    let step = |prefill: f64, running: f64, kv: f64| {
        linear(
            &c,
            &StepLoad {
                prefill_tokens: prefill,
                running,
                kv_tokens: kv,
            },
        )
    };
    // Relaxed: a flag published beside the coefficients.
    let trusted = slo.trusted.load(Ordering::Relaxed);
    let total = l.active_prefill_tokens.unwrap_or(0) as f64 + prompt as f64;
    let full = (total / batch).floor();
    let ttft = full * step(batch, now.running, now.kv_tokens)
        + step(total - full * batch, now.running, now.kv_tokens);
    // Relaxed: a value the maintenance publishes.
    let mean_prefill = f64::from_bits(slo.mean_prefill.load(Ordering::Relaxed));
    let tpot = step(
        mean_prefill.min(batch),
        now.running + 1.0,
        now.kv_tokens + prompt as f64,
    );
    Parts {
        ttft: (ttft, trusted),
        tpot: (tpot, trusted),
    }
}

/// [`parts`] as one prediction.
pub(super) fn predict(slo: &RankSlo, l: &RankLoad, prompt: u64) -> Prediction {
    let p = parts(slo, l, prompt);
    Prediction {
        ttft: p.ttft.0,
        tpot: p.tpot.0,
        trusted: p.ttft.1 && p.tpot.1,
    }
}

/// A model's targets, seconds, its typical prompt, and the blocks a
/// typical request books (its prompt's and a new answer's reservation),
/// read once per publication.
#[derive(Debug, Clone, Copy)]
pub(super) struct Targets {
    pub(super) mode: SloMode,
    ttft: f64,
    pub(super) tpot: f64,
    prompt: u64,
    blocks: u64,
}

impl ModelSlo {
    /// The targets, if an SLO is set. Relaxed: settings.
    #[inline]
    pub(super) fn targets(&self) -> Option<Targets> {
        let mode = self.mode()?;
        let prompt = self.typical_prompt.load(Ordering::Relaxed);
        Some(Targets {
            mode,
            ttft: self.ttft.load(Ordering::Relaxed) as f64 * 1e-9,
            tpot: self.tpot.load(Ordering::Relaxed) as f64 * 1e-9,
            prompt,
            blocks: prompt.div_ceil(DEFAULT_BLOCK_TOKENS) + self.reservation(u64::MAX, 0),
        })
    }

    /// Counts a request picked while advisory: to a worker the SLO would
    /// refuse (`refused`), or not.
    #[inline]
    pub(super) fn count_would(&self, refused: bool) {
        let c = if refused {
            &self.would_refuse
        } else {
            &self.would_admit
        };
        // Relaxed: a counter.
        c.fetch_add(1, Ordering::Relaxed);
    }
}

/// The SLO's verdict on `rank` under its load `l` (module docs,
/// "Deciding"); keeps the rank's last verdict for the hysteresis. Called
/// by the worker's publisher only, with the monitor's `clock`, which it
/// reads once per report.
pub(super) fn verdict(slo: &RankSlo, l: &RankLoad, t: &Targets, clock: &Observations) -> bool {
    // The KV booked over the line, and the same with its band narrowed to
    // one typical request (`kv_band`) for the verdict.
    let (kv, kv_held) = if l.kv_total_blocks > 0 {
        let used = l.active_decode_blocks.max(l.kv_used_blocks) as f64;
        let line = l.kv_total_blocks as f64 * KV_LINE;
        let kv = used / line;
        (kv, 1.0 - (1.0 - kv) * HYSTERESIS / kv_band(t.blocks, line))
    } else {
        (0.0, 0.0)
    };
    let p = parts(slo, l, t.prompt);
    // The predictions against their targets, less the headroom the step
    // fit's running error asks for (and the time per output token less
    // the margin the rank's answers asked for), once the fit has its
    // first steps, trusted or not (a fit that fits badly holds the rank
    // back with up to three times the headroom rather than not at all),
    // and full past the reach of a trusted fit (`beyond_reach`); before,
    // at most one step's budget of prompts booked ahead. Relaxed: values
    // the maintenance publishes.
    let time = if slo.fitted.load(Ordering::Relaxed) {
        let error = f64::from_bits(slo.step_error.load(Ordering::Relaxed)).clamp(0.0, 1.0);
        let headroom = 1.0 + MARGIN * error;
        let tpot_margin = f64::from_bits(slo.tpot_margin.load(Ordering::Relaxed));
        let time = (p.ttft.0 / t.ttft).max(p.tpot.0 * tpot_margin / t.tpot) * headroom;
        if beyond_reach(slo, l, t) {
            time.max(1.0 + HYSTERESIS)
        } else {
            time
        }
    } else {
        l.active_prefill_tokens.unwrap_or(0) as f64 / l.max_num_batched_tokens.max(1) as f64
    };
    let (seats, seats_term) = seats(slo, l, t, clock);
    let others = time.max(seats);
    // Relaxed: a hint routing compares (`RankSlo::pressure`).
    slo.pressure
        .store(kv.max(others).to_bits(), Ordering::Relaxed);
    let load = kv_held.max(others);
    // Relaxed: the publisher's own state (only one publishes at a time).
    let was = slo.busy.load(Ordering::Relaxed);
    let busy = if was {
        load > 1.0 - HYSTERESIS
    } else {
        load > 1.0
    };
    if busy != was {
        slo.busy.store(busy, Ordering::Relaxed);
        slo.flips.fetch_add(1, Ordering::Relaxed);
        if busy {
            let booked = slo.bookings.load(Ordering::Relaxed);
            slo.line.store(booked, Ordering::Relaxed);
            let term = [(kv_held, BusyTerm::Kv), (time, BusyTerm::Time)]
                .into_iter()
                .fold((seats, seats_term), |a, b| if b.0 > a.0 { b } else { a })
                .1;
            slo.turned_busy[term as usize].fetch_add(1, Ordering::Relaxed);
        }
    }
    busy
}

impl RankSlo {
    /// An answer booked on the rank with a trusted prediction streamed at
    /// `tpot` seconds per output token against a `target`. A miss raises
    /// the rank's TPOT margin by [`TPOT_MARGIN_STEP`] (up to
    /// [`TPOT_MARGIN_MAX`]); each of the hits a miss may come among (199
    /// for [`TPOT_MISSES`] of one in 200) lowers it by that share of a
    /// miss (down to 1), so it holds still where that share of the
    /// answers miss. The step fit predicts a step's mean; an answer's time
    /// per token is the mean of its own steps, which vary with the
    /// prompts they happened to carry (a short answer's most), and the
    /// margin is what keeps its tail under the target where the fit's
    /// error alone does not. The maintenance's.
    pub(super) fn answered(&self, tpot: f64, target: f64) {
        // Relaxed: only the maintenance writes it.
        let old = f64::from_bits(self.tpot_margin.load(Ordering::Relaxed));
        let new = if tpot > target {
            (old * (1.0 + TPOT_MARGIN_STEP)).min(TPOT_MARGIN_MAX)
        } else {
            let hits_per_miss = (1.0 - TPOT_MISSES) / TPOT_MISSES;
            (old * (1.0 + TPOT_MARGIN_STEP).powf(-1.0 / hits_per_miss)).max(1.0)
        };
        self.tpot_margin.store(new.to_bits(), Ordering::Relaxed);
    }
}

/// The share of the answers a rank's TPOT margin lets miss the target
/// (`RankSlo::answered`): half the 1 % an SLO of 99 % attainment allows.
pub const TPOT_MISSES: f64 = 0.005;

/// How much one answer that missed its TPOT target raises the rank's
/// margin, relative (`RankSlo::answered`).
pub const TPOT_MARGIN_STEP: f64 = 0.05;

/// The most a rank's TPOT margin reaches.
pub const TPOT_MARGIN_MAX: f64 = 2.0;

/// The share of a rank's KV line under which its KV lets a busy rank go:
/// room for one typical request of `blocks` (at least a block, at most
/// [`HYSTERESIS`]). A rank full by its KV takes the next request once one
/// fits, as the engine would; the band of the predictions, a tenth, would
/// leave a tenth of the cache idle each time it filled.
fn kv_band(blocks: u64, line: f64) -> f64 {
    (blocks.max(1) as f64 / line).min(HYSTERESIS)
}

/// Whether a typical request would take rank `slo` under load `l` past
/// the reach of its trusted fit (`StepFit::reach`) by more than a
/// [`FIT_REACH`]th of it and one typical request (a sequence; its
/// prompt's and answer's blocks): past it the fit extrapolates, and a
/// rank that fills faster than its steps are observed (a window of
/// tokens, about a second) could outrun a fit that has not seen the step
/// time rise (lab, slower engine: a fit whose context coefficient had
/// fallen to nothing predicted 88 ms a token at 111 sequences where the
/// engine took 130 and more). Until the fit is trusted it is not known
/// to fit even what it saw, and its error's headroom holds the rank.
fn beyond_reach(slo: &RankSlo, l: &RankLoad, t: &Targets) -> bool {
    // Relaxed: values the maintenance publishes.
    if !slo.trusted.load(Ordering::Relaxed) {
        return false;
    }
    let now = step_load(slo, l);
    let reach = |i: usize| f64::from_bits(slo.reach[i].load(Ordering::Relaxed));
    let grown = |r: f64| r * (1.0 + 1.0 / FIT_REACH);
    now.running + 1.0 > grown(reach(0)) + 1.0
        || now.kv_tokens + t.prompt as f64
            > grown(reach(1)) + t.blocks as f64 * DEFAULT_BLOCK_TOKENS as f64
}

/// How far past the load its trusted fit has seen a rank is booked: a
/// `FIT_REACH`th of it, and one typical request (`beyond_reach`).
pub const FIT_REACH: f64 = 8.0;

/// The rank's requests against its seats (module docs, "Deciding"). A
/// request the engine reports waiting waits for a seat, for as long as
/// the running ones take to finish, which no step time shows, so the
/// rank takes no more until as many of its bookings as the report showed
/// waiting have ended (each end seats a waiting one) or a report shows
/// none waiting: it holds the rank to the bookings the report showed
/// seated, not to the next report, which may come seconds later (a
/// report of as many waiting as the rank has bookings, or more, holds it
/// until then: the ends that seat those are not its to count). The seats are
/// learned when a report comes, against the bookings then: at a report of
/// some waiting, at least the bookings less those waiting; at the second
/// of two running, exactly that, fewer too (the engine seated no more
/// twice over: seats learned from a late report may count bookings made
/// after it, and a wait for the step's budget or for blocks holds as one
/// for seats does); while two reports running show none waiting, at least
/// the lesser of the bookings at the two (an engine reports what its last
/// step's scheduling left, so the bookings since are not in a report
/// yet). Between reports, while the latest showed none waiting, learned
/// seats are at least the bookings whose prefill is done (`started`): the
/// engine ran those at once, which a first token shows the moment it
/// comes, where a report a second or two late would show it only after
/// the rank had drained back to the seats it taught. The seats never pass
/// the engine's own (its `max_num_seqs`, when
/// declared or reported), which are the seats until some are learned: a
/// late report, counting bookings made after it as seated, cannot teach
/// more than the engine runs. Until the next report a rank is booked at
/// most a probe past them ([`seat_probe`]), and never past the engine's
/// own: one the next reports confirm or refuse, so a request booked past
/// the engine's seats, where they are not known, waits for no more than a
/// probe's seats to free. A rank the waiting or the probe made busy stays
/// so until its bookings are under its seats. Called by the worker's
/// publisher only.
fn seats(slo: &RankSlo, l: &RankLoad, t: &Targets, clock: &Observations) -> (f64, BusyTerm) {
    // Relaxed: a count, and the publisher's own state (`reported` and
    // `engine_seats` are set by a report, released to the publisher by the
    // combiner).
    let booked = slo.bookings.load(Ordering::Relaxed);
    let waiting = l.waiting_requests.unwrap_or(0);
    let engine = slo.engine_seats.load(Ordering::Relaxed);
    let bounded = |seats: u64| match engine {
        0 => seats,
        _ => seats.min(engine),
    };
    // A plain load first: most publications follow a booking, not a report.
    if slo.reported.load(Ordering::Relaxed) && slo.reported.swap(false, Ordering::Relaxed) {
        let known = slo.seats.load(Ordering::Relaxed);
        let clean = if waiting > 0 { NO_CLEAN_REPORT } else { booked };
        let before = slo.clean_bookings.swap(clean, Ordering::Relaxed);
        let seated = if waiting > 0 {
            booked.saturating_sub(waiting)
        } else {
            NO_CLEAN_REPORT
        };
        let seated_before = slo.seated.swap(seated, Ordering::Relaxed);
        let some_seated = |s: u64| s != 0 && s != NO_CLEAN_REPORT;
        let learned = bounded(if some_seated(seated) && some_seated(seated_before) {
            seated
        } else if waiting > 0 {
            known.max(seated.max(1))
        } else if known != 0 && before != NO_CLEAN_REPORT {
            known.max(booked.min(before))
        } else {
            known
        });
        if learned != known {
            slo.seats.store(learned, Ordering::Relaxed);
        }
        let now = clock.now();
        let since = now.saturating_sub(slo.reported_at.swap(now, Ordering::Relaxed));
        // A probe past the engine's seats is what waits for a seat (which
        // the TTFT target bounds); within them, where they are known, it
        // waits for none.
        let past_the_engine = (engine == 0).then_some(t.ttft);
        let probe = seat_probe(probe_base(learned, engine), since, past_the_engine);
        slo.probe.store(probe, Ordering::Relaxed);
    }
    // The bookings whose prefill is done ran at once on the engine, so it
    // has at least that many seats, however late its reports (unless the
    // latest shows some waiting: a request the engine preempted waits
    // again, its prefill done). Only once some seats are learned: before,
    // the engine's own stand for them.
    if waiting == 0 {
        let known = slo.seats.load(Ordering::Relaxed);
        let started = bounded(slo.started.load(Ordering::Relaxed));
        if known != 0 && started > known {
            slo.seats.store(started, Ordering::Relaxed);
        }
    }
    let seats = match slo.seats.load(Ordering::Relaxed) {
        0 => engine,
        learned => bounded(learned),
    };
    // None seated: the waiting are not the rank's bookings to count out.
    let seated = slo.seated.load(Ordering::Relaxed);
    if seated == 0 || booked > seated {
        return (1.0 + HYSTERESIS, BusyTerm::Waiting);
    }
    let load = if seats == 0 {
        0.0
    } else if booked > bounded(seats + slo.probe.load(Ordering::Relaxed)) {
        1.0 + HYSTERESIS
    } else if booked >= seats {
        // Holds a busy rank, turns none busy.
        1.0
    } else {
        (1.0 - HYSTERESIS) * booked as f64 / seats as f64
    };
    (load, BusyTerm::Seats)
}

/// The seats a rank's probe is a share of: those `learned` (0: none yet),
/// or the `engine`'s (0: not known) until some are; where both are
/// known, their geometric mean. Seats learned below the engine's came
/// from a wait that was not for a seat (the step's budget, blocks, a late
/// report): the further below they fell, the larger the probe relative
/// to them, halfway on a log scale between growing as a share of what
/// was learned (the safe pace where the ceiling is not known) and as a
/// share of the ceiling itself (a pace that, in the lab, made the queue's
/// waits overrun as the probes outran the drain).
fn probe_base(learned: u64, engine: u64) -> u64 {
    match (learned, engine) {
        (0, e) => e,
        (l, 0) => l,
        (l, e) => ((l as f64) * (e as f64)).sqrt() as u64,
    }
}

/// How far past its learned seats a rank is booked until the next
/// report, when this one came `since` nanoseconds after the last
/// (`seats`): a [`SEAT_PROBE`]th of `seats` ([`probe_base`]; at least
/// one) for each [`SEAT_PROBE_PERIOD`] between the two, from one up to
/// [`SEAT_PROBE_PERIODS`], so the seats grow as fast per second however
/// far apart the reports come; but one only when the probe may pass the
/// engine's seats (they are not known: `ttft` is the target, seconds) and
/// two such intervals exceed the `ttft` target. A probe past the engine's
/// seats is shown by the report after next at the latest (the next may
/// have left the engine before the probe came), and the requests it made
/// wait until then would miss their first token. Within the engine's
/// seats nothing waits for one: learned seats below them (a wait for the
/// step's budget or for blocks during a burst) grow back as fast however
/// far apart the reports come.
fn seat_probe(seats: u64, since: u64, ttft: Option<f64>) -> u64 {
    let since = since as f64 * 1e-9;
    let periods = if ttft.is_none_or(|ttft| 2.0 * since <= ttft) {
        (since / SEAT_PROBE_PERIOD).clamp(1.0, SEAT_PROBE_PERIODS)
    } else {
        1.0
    };
    ((seats as f64 * periods / SEAT_PROBE as f64) as u64).max(1)
}

/// The probe past a rank's learned seats per [`SEAT_PROBE_PERIOD`] between
/// two reports: a `SEAT_PROBE`th of them (of their geometric mean with
/// the engine's, where those are known), at least one (`seat_probe`).
pub const SEAT_PROBE: u64 = 64;

/// The interval between two reports each [`SEAT_PROBE`]th of a probe
/// stands for, seconds: a rank reporting this often or more probes a
/// 64th a report, one reporting less often as much per second.
pub const SEAT_PROBE_PERIOD: f64 = 0.1;

/// The most [`SEAT_PROBE_PERIOD`]s a probe stands for: an eighth of the
/// seats, however far apart the reports.
pub const SEAT_PROBE_PERIODS: f64 = 8.0;

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    fn margin(slo: &RankSlo) -> f64 {
        f64::from_bits(slo.tpot_margin.load(Ordering::Relaxed))
    }

    #[test]
    fn the_tpot_margin_stays_between_one_and_its_cap() {
        let slo = RankSlo::new(0);
        slo.answered(0.05, 0.1);
        assert_eq!(margin(&slo), 1.0);
        for _ in 0..100 {
            slo.answered(0.2, 0.1);
        }
        assert_eq!(margin(&slo), TPOT_MARGIN_MAX);
        for _ in 0..100_000 {
            slo.answered(0.05, 0.1);
        }
        assert_eq!(margin(&slo), 1.0);
    }

    #[test]
    fn the_tpot_margin_holds_where_its_share_of_answers_miss() {
        let slo = RankSlo::new(0);
        slo.answered(0.2, 0.1);
        let one = margin(&slo);
        // A miss in every 1 / TPOT_MISSES answers leaves it where it was.
        let every = (1.0 / TPOT_MISSES).round() as usize;
        for _ in 0..10 {
            slo.answered(0.2, 0.1);
            for _ in 1..every {
                slo.answered(0.05, 0.1);
            }
        }
        assert!((margin(&slo) / one - 1.0).abs() < 1e-3, "{}", margin(&slo));
        // One in half as many raises it.
        for _ in 0..10 {
            slo.answered(0.2, 0.1);
            for _ in 1..every / 2 {
                slo.answered(0.05, 0.1);
            }
        }
        assert!(margin(&slo) > one * 1.2, "{}", margin(&slo));
        // A miss is an answer slower than the target, not one at it.
        let at = margin(&slo);
        slo.answered(0.1, 0.1);
        assert!(margin(&slo) < at);
    }
}
