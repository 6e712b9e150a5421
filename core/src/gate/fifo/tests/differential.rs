//! Random sequences against a plain reference.

use super::*;

/// Random sequences on one thread against a plain reference (a counter and
/// a `VecDeque`): every admission, grant (to the oldest, or to the newest
/// as adaptive LIFO does), cancel, rejection from the head and
/// displacement of the newest agrees, step by step.
#[test]
fn random_sequences_match_a_plain_reference() {
    use std::collections::VecDeque;

    for seed in 1..=300u64 {
        let mut rng = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15);
        let mut next = move |n: usize| {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            (rng % n as u64) as usize
        };
        let (limit, queue) = (1 + next(3) as u32, next(5) as u32);
        let g = TestGate::new(limit, queue);
        // The reference: slots held, and the waiters in order.
        let mut running = 0u32;
        let mut waiters: VecDeque<(u32, u32)> = VecDeque::new();
        for step in 0..2_000 {
            let ctx = format!("seed {seed} step {step}");
            match next(6) {
                0 => {
                    let expect = if waiters.is_empty() && running < limit {
                        running += 1;
                        "held"
                    } else if (waiters.len() as u32) < queue {
                        "queued"
                    } else {
                        "rejected"
                    };
                    match g.admit() {
                        Admit::Held => assert_eq!(expect, "held", "{ctx}"),
                        Admit::Queued(c, gen) => {
                            assert_eq!(expect, "queued", "{ctx}");
                            waiters.push_back((c, gen));
                        }
                        Admit::Rejected => assert_eq!(expect, "rejected", "{ctx}"),
                    }
                }
                1 if running > 0 => {
                    g.release();
                    match waiters.pop_front() {
                        Some((c, gen)) => {
                            assert_eq!(g.poll(c, gen), Some(Outcome::Granted), "{ctx}");
                        }
                        None => running -= 1,
                    }
                }
                2 if !waiters.is_empty() => {
                    let (c, gen) = waiters.remove(next(waiters.len())).unwrap();
                    assert!(g.cancel(c, gen), "{ctx}");
                }
                3 => {
                    let oldest = waiters.pop_front();
                    assert_eq!(g.reject_oldest(AdmitError::QueueTimeout), oldest.is_some());
                    if let Some((c, gen)) = oldest {
                        let rejected = Outcome::Rejected(AdmitError::QueueTimeout);
                        assert_eq!(g.poll(c, gen), Some(rejected), "{ctx}");
                    }
                }
                4 => {
                    let newest = waiters.pop_back();
                    assert_eq!(g.displace(), newest.is_some(), "{ctx}");
                    if let Some((c, gen)) = newest {
                        let displaced = Outcome::Rejected(AdmitError::Displaced);
                        assert_eq!(g.poll(c, gen), Some(displaced), "{ctx}");
                    }
                }
                5 if running > 0 => {
                    g.release_newest();
                    match waiters.pop_back() {
                        Some((c, gen)) => {
                            assert_eq!(g.poll(c, gen), Some(Outcome::Granted), "{ctx}");
                        }
                        None => running -= 1,
                    }
                }
                _ => {}
            }
            for &(c, gen) in &waiters {
                assert_eq!(g.fifo.status(c), (gen, Status::Queued), "{ctx}");
            }
            assert_eq!(g.counts(), (running, waiters.len() as u32), "{ctx}");
        }
    }
}
