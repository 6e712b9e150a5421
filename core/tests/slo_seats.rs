//! SLO admission's seats (`Monitor::set_slo`, docs/behaviour.md): the
//! requests a rank's engine runs at once, learned from its reports of
//! waiting and bounded by its declared `max_num_seqs`; the probe past them
//! between reports; and the hold a report of waiting puts on the rank. On
//! a manual clock.

mod support;

use std::time::Duration;

use loadgate::{Booking, LoadReport, Monitor, SloMode};
use support::slo_engine::{monitor, monitor_of, slo, turned_busy};

/// Worker 1's engine reports `waiting` requests waiting for a seat.
fn report_waiting(m: &Monitor, waiting: u64) {
    let r = LoadReport {
        waiting_requests: Some(waiting),
        ..Default::default()
    };
    m.report(1, 0, &r).unwrap();
}

/// Books worker 1 until it is busy: how many it holds then.
fn book_until_busy(m: &Monitor, held: &mut Vec<Booking>) -> usize {
    while !m.is_busy(1).unwrap() {
        held.push(m.book(1, 0, 4).unwrap());
        assert!(held.len() < 100, "never busy");
    }
    held.len()
}

/// A monitor with an enforced SLO and 22 bookings of 4 blocks on worker 1.
fn twenty_two_booked() -> (Monitor, Vec<Booking>) {
    let (m, _) = monitor(1_000_000);
    m.set_slo("m", slo(2.0, 0.1), SloMode::Enforce).unwrap();
    let held = (0..22).map(|_| m.book(1, 0, 4).unwrap()).collect();
    (m, held)
}

#[test]
fn the_seats_are_learned_at_reports_and_bookings_pass_them_by_one_probe() {
    let (m, mut held) = twenty_two_booked();
    let report = |waiting| report_waiting(&m, waiting);
    // Two of the 22 wait: the engine has 20 seats, and the rank takes
    // nothing while any waits.
    report(2);
    assert!(m.is_busy(1).unwrap());
    held.truncate(19);
    report(0);
    assert!(!m.is_busy(1).unwrap());
    // Between reports the bookings pass the 20 seats by one probe (a
    // 64th of them, at least one).
    assert_eq!(book_until_busy(&m, &mut held), 22);
    assert_eq!(
        (turned_busy(&m, "waiting"), turned_busy(&m, "seats")),
        (1, 1)
    );
    // A report of none waiting may predate the last bookings: the seats
    // grow to the lesser of the bookings at two such reports running.
    report(0);
    assert!(m.is_busy(1).unwrap(), "grew from one report");
    report(0);
    held.pop();
    assert!(!m.is_busy(1).unwrap());
    assert_eq!(book_until_busy(&m, &mut held), 24);
}

#[test]
fn two_reports_running_of_waiting_set_the_seats_to_those_seated_fewer_too() {
    let (m, _) = monitor(1_000_000);
    m.set_slo("m", slo(2.0, 0.1), SloMode::Enforce).unwrap();
    let settle = |held: &mut Vec<Booking>, to: usize| {
        held.truncate(to);
        report_waiting(&m, 0);
        assert!(!m.is_busy(1).unwrap(), "busy at {to}");
    };
    // A report late by the bookings made since: 55 seen seated.
    let mut held: Vec<Booking> = (0..60).map(|_| m.book(1, 0, 4).unwrap()).collect();
    report_waiting(&m, 5);
    // One report of fewer seated after a clean one leaves the seats: 55
    // and one probe.
    settle(&mut held, 54);
    report_waiting(&m, 3);
    settle(&mut held, 50);
    assert_eq!(book_until_busy(&m, &mut held), 57);
    // The second of two running sets them, fewer too: 52.
    report_waiting(&m, 5);
    report_waiting(&m, 5);
    settle(&mut held, 51);
    assert_eq!(book_until_busy(&m, &mut held), 54);
}

#[test]
fn the_engines_own_seats_bound_those_learned_and_stand_for_them_until_then() {
    let (m, _) = monitor_of(1_000_000, Some(20));
    m.set_slo("m", slo(2.0, 0.1), SloMode::Enforce).unwrap();
    // No report yet: the engine's 20 seats, which no probe passes.
    let mut held = Vec::new();
    assert_eq!(book_until_busy(&m, &mut held), 21);
    assert_eq!(turned_busy(&m, "seats"), 1);
    // A report late by the bookings made since shows 28 seated; the
    // engine runs 20 at most, so 20 are learned, not 28.
    held.extend((0..8).map(|_| m.book(1, 0, 4).unwrap()));
    report_waiting(&m, 2);
    held.truncate(19);
    report_waiting(&m, 0);
    assert!(!m.is_busy(1).unwrap());
    assert_eq!(book_until_busy(&m, &mut held), 21);
    // A report may carry the engine's seats: fewer bound them at once.
    held.truncate(9);
    let fewer = LoadReport {
        max_num_seqs: Some(10),
        ..Default::default()
    };
    m.report(1, 0, &fewer).unwrap();
    assert!(!m.is_busy(1).unwrap());
    assert_eq!(book_until_busy(&m, &mut held), 11);
}

#[test]
fn learned_seats_below_the_engines_grow_by_a_whole_probe_however_far_apart_the_reports() {
    let (m, clock) = monitor_of(1_000_000, Some(64));
    m.set_slo("m", slo(2.0, 0.1), SloMode::Enforce).unwrap();
    // A burst of prompts waits for the step's budget: 2 of 34 waiting
    // teach 32 seats.
    let mut held: Vec<Booking> = (0..34).map(|_| m.book(1, 0, 4).unwrap()).collect();
    report_waiting(&m, 2);
    held.truncate(31);
    // Reports 3 s apart, two intervals past the 2 s TTFT. Within the
    // engine's 64 seats a probe waits for no seat, so it is the whole
    // eighth, not one; and of 45 seats (the geometric mean of the 32
    // learned and the engine's 64), not of the 32: 5, not 4.
    clock.advance(Duration::from_secs(3));
    report_waiting(&m, 0);
    assert!(!m.is_busy(1).unwrap());
    assert_eq!(book_until_busy(&m, &mut held), 38);
    // Near the engine's seats the probe stops at them: 62 learned, a
    // probe of 7, and busy past 64.
    held.extend((37..64).map(|_| m.book(1, 0, 4).unwrap()));
    report_waiting(&m, 2);
    held.truncate(61);
    clock.advance(Duration::from_secs(3));
    report_waiting(&m, 0);
    assert!(!m.is_busy(1).unwrap());
    assert_eq!(book_until_busy(&m, &mut held), 65);
}

#[test]
fn the_probe_past_the_seats_grows_with_the_time_between_reports_while_two_fit_the_ttft() {
    let (m, clock) = monitor(1_000_000);
    m.set_slo("m", slo(2.0, 0.1), SloMode::Enforce).unwrap();
    let mut held: Vec<Booking> = (0..130).map(|_| m.book(1, 0, 4).unwrap()).collect();
    // 128 seats: a 64th of them is 2.
    report_waiting(&m, 2);
    held.truncate(127);
    // A 64th per tenth of a second between the reports, at least one and
    // at most eight; but one when two such intervals exceed the 2 s TTFT.
    for (apart_ms, probe) in [(50, 2), (500, 10), (1000, 16), (3000, 2), (1001, 2)] {
        clock.advance(Duration::from_millis(apart_ms));
        report_waiting(&m, 0);
        assert!(!m.is_busy(1).unwrap(), "{apart_ms} ms: busy at 127");
        while !m.is_busy(1).unwrap() {
            held.push(m.book(1, 0, 4).unwrap());
            assert!(held.len() < 200, "{apart_ms} ms: never busy");
        }
        assert_eq!(held.len(), 128 + probe + 1, "{apart_ms} ms apart");
        held.truncate(127);
    }
}

#[test]
fn a_report_of_waiting_holds_the_rank_until_as_many_bookings_end() {
    let (m, mut held) = twenty_two_booked();
    let report = |waiting| report_waiting(&m, waiting);
    report(2);
    assert!(m.is_busy(1).unwrap());
    assert_eq!(turned_busy(&m, "waiting"), 1);
    // Reports may be seconds apart: no other comes. One end seats one of
    // the two waiting, the second the other, and the engine's 20 seats
    // are full; the third frees one, and the rank takes a request.
    for (left, busy) in [(21, true), (20, true), (19, false)] {
        held.pop();
        m.maintain();
        assert_eq!(m.is_busy(1).unwrap(), busy, "{left} booked");
    }
    // More waiting than the rank's bookings: those seated by the ends of
    // requests not its own, which it cannot count, so until a report says.
    report(30);
    held.clear();
    m.maintain();
    assert!(m.is_busy(1).unwrap(), "held with none booked");
    report(0);
    assert!(!m.is_busy(1).unwrap());
}

#[test]
fn bookings_whose_prefill_is_done_raise_the_seats_without_waiting_for_a_report() {
    let (m, mut held) = twenty_two_booked();
    // 20 seats learned; the rank drained to 19 and a clean report freed it.
    report_waiting(&m, 2);
    held.truncate(19);
    report_waiting(&m, 0);
    assert_eq!(book_until_busy(&m, &mut held), 22);
    // The probe's bookings are seated: the engine runs all 22, and their
    // first tokens say so before any report does. One ends: 21 booked
    // under 22 seats, and the rank is free again (the 20 learned from the
    // report would hold it until two more ended).
    for b in &mut held {
        b.first_token();
    }
    held.pop();
    m.maintain();
    assert!(
        !m.is_busy(1).unwrap(),
        "held to the seats the report taught"
    );
    // 22 seats and one probe past them.
    assert_eq!(book_until_busy(&m, &mut held), 24);
    // While the latest report shows some waiting, first tokens raise
    // nothing: a request the engine preempted waits again, its prefill
    // done. Two of 24 waiting: 22 seats, though all 24 had a first token.
    report_waiting(&m, 2);
    for b in &mut held {
        b.first_token();
    }
    held.truncate(22);
    m.maintain();
    assert!(
        m.is_busy(1).unwrap(),
        "raised past the 22 the report showed"
    );
    held.pop();
    m.maintain();
    assert!(!m.is_busy(1).unwrap());
}

#[test]
fn first_tokens_raise_the_seats_no_further_than_the_engines_own() {
    let (m, _) = monitor_of(1_000_000, Some(20));
    m.set_slo("m", slo(2.0, 0.1), SloMode::Enforce).unwrap();
    let mut held: Vec<Booking> = (0..24).map(|_| m.book(1, 0, 4).unwrap()).collect();
    report_waiting(&m, 6);
    held.truncate(17);
    report_waiting(&m, 0);
    // 18 learned; then 22 booked, all seated by their first tokens.
    held.extend((0..5).map(|_| m.book(1, 0, 4).unwrap()));
    for b in &mut held {
        b.first_token();
    }
    held.truncate(19);
    m.maintain();
    assert!(!m.is_busy(1).unwrap());
    // The engine's 20 seats, not the 22 started, and no probe past them.
    assert_eq!(book_until_busy(&m, &mut held), 21);
}
