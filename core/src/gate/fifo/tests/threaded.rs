//! Every operation raced on real threads.

use super::*;

/// Every operation raced on real threads, with invariants checked at every
/// step and at the end.
#[test]
fn threads_racing_every_operation_keep_the_counts_exact() {
    use std::sync::atomic::AtomicUsize;

    const LIMIT: u32 = 2;
    const QUEUE: u32 = 3;
    const THREADS: usize = 4;
    const OPS: usize = 250_000;
    // Rejected requests keep their cells until their thread polls: the
    // cells grow from 8 while the threads race.
    let g = TestGate::with_cells(LIMIT, QUEUE, 8);
    let holders = AtomicUsize::new(0);
    std::thread::scope(|s| {
        for t in 0..THREADS {
            let (g, holders) = (&g, &holders);
            s.spawn(move || {
                // xorshift: any spread of operations will do.
                let mut seed = 0x9e37_79b9_7f4a_7c15_u64 ^ (t as u64 + 1);
                let mut next = move |n: usize| {
                    seed ^= seed << 13;
                    seed ^= seed >> 7;
                    seed ^= seed << 17;
                    (seed % n as u64) as usize
                };
                let mut held = 0u32;
                let mut waiting: Vec<(u32, u32)> = Vec::new();
                let check = |g: &TestGate| {
                    let (running, queued) = g.counts();
                    assert!(running <= LIMIT, "{running} running");
                    assert!(queued <= QUEUE, "{queued} queued");
                };
                for _ in 0..OPS {
                    match next(11) {
                        0..=3 => match g.admit() {
                            Admit::Held => held += 1,
                            Admit::Queued(c, gen) => waiting.push((c, gen)),
                            Admit::Rejected => {}
                        },
                        4..=5 if held > 0 => {
                            held -= 1;
                            g.release();
                        }
                        6 if !waiting.is_empty() => {
                            let (c, gen) = waiting.swap_remove(next(waiting.len()));
                            g.cancel(c, gen);
                        }
                        7 => {
                            g.reject(AdmitError::QueueTimeout, |_| true, 2);
                        }
                        8 => {
                            g.displace();
                        }
                        _ => waiting.retain(|&(c, gen)| match g.poll(c, gen) {
                            None => true,
                            Some(Outcome::Granted) => {
                                held += 1;
                                false
                            }
                            Some(Outcome::Rejected(_)) => false,
                        }),
                    }
                    check(g);
                }
                // Wind down: leave the queue, give back every slot.
                for (c, gen) in waiting {
                    g.cancel(c, gen);
                }
                for _ in 0..held {
                    g.release();
                }
                holders.fetch_add(held as usize, Ordering::Relaxed);
            });
        }
    });
    assert_eq!(g.counts(), (0, 0), "slots or places lost");
    // Every cell came back, and every slot is free.
    let made: usize = (0..g.fifo.chunks_made().1)
        .map(|k| g.fifo.cells.waiters.range(k).len())
        .sum();
    assert_eq!(g.fifo.free_cells(), made, "waiter cells leaked");
    for _ in 0..LIMIT {
        assert_eq!(g.admit(), Admit::Held);
    }
}
