//! The frontend queue against docs/flow-control.md: its order (bands, VTC,
//! FIFO), the rejoin rule, fair shedding, the token bound, deadlines,
//! cancels, settling, and its bounds under hostile input. Time is plain
//! nanoseconds passed in.

use std::time::Duration;

use loadgate::flow::{
    FlowConfig, FlowConfigError, FlowQueue, FlowRejection, FlowRequest, MAX_BANDS,
};

const MS: u64 = 1_000_000;

fn queue(limit: u32) -> FlowQueue<u32> {
    FlowQueue::new(&FlowConfig::new(limit)).unwrap()
}

fn req(tenant: &str, prompt: u64, max_tokens: u64) -> FlowRequest<'_> {
    FlowRequest {
        prompt_tokens: prompt,
        max_tokens: Some(max_tokens),
        ..FlowRequest::new(tenant)
    }
}

/// Pushes and expects it queued with nothing shed.
fn push(q: &mut FlowQueue<u32>, r: &FlowRequest<'_>, id: u32) {
    q.push(r, id, 0, |v| panic!("{v} shed"))
        .unwrap_or_else(|(e, v)| panic!("{v} refused: {e}"));
}

/// Pops everything, settling each at once with no output: the ids in
/// dispatch order.
fn drain(q: &mut FlowQueue<u32>) -> Vec<u32> {
    std::iter::from_fn(|| {
        q.pop(0).map(|(id, r)| {
            q.settle(r, 0);
            id
        })
    })
    .collect()
}

#[test]
fn fifo_within_a_tenant() {
    let mut q = queue(8);
    for id in 0..5 {
        push(&mut q, &req("a", 10, 10), id);
    }
    assert_eq!(drain(&mut q), [0, 1, 2, 3, 4]);
}

#[test]
fn a_more_important_band_always_goes_first() {
    let mut q = queue(8);
    push(
        &mut q,
        &FlowRequest {
            priority: 3,
            ..req("a", 1, 1)
        },
        0,
    );
    push(
        &mut q,
        &FlowRequest {
            priority: 200,
            ..req("b", 1, 1)
        },
        1,
    );
    push(
        &mut q,
        &FlowRequest {
            priority: 0,
            ..req("c", 1000, 1000)
        },
        2,
    );
    push(
        &mut q,
        &FlowRequest {
            priority: 3,
            ..req("c", 1, 1)
        },
        3,
    );
    assert_eq!(q.band_len(0), 1);
    assert_eq!(
        q.band_len(MAX_BANDS - 1),
        1,
        "a priority past the last band is the last"
    );
    // c's heavy request of band 0 first; then band 3 by counters (a is
    // lighter than c, who was just charged 1000); then band 7.
    assert_eq!(drain(&mut q), [2, 0, 3, 1]);
}

#[test]
fn the_tenant_with_the_lowest_counter_goes_next() {
    let mut q = queue(16);
    // a's requests cost 100 prompt tokens, b's 10: while both wait, b is
    // dispatched about ten times for each of a's.
    for id in 0..4 {
        push(&mut q, &req("a", 100, 0), id);
    }
    for id in 10..16 {
        push(&mut q, &req("b", 10, 0), id);
    }
    let order = drain(&mut q);
    // Ties go to the older head: a's first request, then b's six (b reaches
    // 60 < 100), then a's, and so on.
    assert_eq!(order, [0, 10, 11, 12, 13, 14, 15, 1, 2, 3]);
    assert_eq!(q.counter("a"), Some(400.0));
    assert_eq!(q.counter("b"), Some(60.0));
}

#[test]
fn output_is_charged_as_reported_and_reserved_until_settled() {
    let mut q = queue(16);
    push(&mut q, &req("a", 0, 100), 0);
    let (_, mut ra) = q.pop(0).unwrap();
    assert_eq!(
        q.counter("a"),
        Some(0.0),
        "the counter holds actual tokens only"
    );
    // a's 100 reserved output tokens (w_q = 2: 200) order it behind b.
    push(&mut q, &req("a", 0, 1), 1);
    push(&mut q, &req("b", 150, 1), 2);
    let (id, rb) = q.pop(0).unwrap();
    assert_eq!(id, 2, "b (150) before a (0 + 200 reserved)");
    q.report_output(&mut ra, 30);
    assert_eq!(q.counter("a"), Some(60.0));
    assert_eq!(ra.reported_output(), 30);
    // Settled at 40 in all: 20 more charged, the rest released.
    q.settle(ra, 40);
    assert_eq!(q.counter("a"), Some(80.0));
    q.settle(rb, 0);
    assert_eq!(drain(&mut q), [1]);
}

#[test]
fn an_idle_tenant_rejoins_at_the_lowest_backlogged_counter() {
    let mut q = queue(16);
    for id in 0..3 {
        push(&mut q, &req("busy", 100, 0), id);
    }
    push(&mut q, &req("other", 50, 0), 9);
    let (_, r) = q.pop(0).unwrap(); // busy 0 (tie, older): busy at 100
    q.settle(r, 0);
    let (_, r) = q.pop(0).unwrap(); // other: 50, then it is idle
    q.settle(r, 0);
    assert_eq!(q.pop(0).map(|(id, r)| (id, q.settle(r, 0))), Some((1, ())));
    // busy is at 200 and still backlogged; "late" was never seen: it joins
    // at 200, not at 0, and so does "other" (50 < 200).
    push(&mut q, &req("late", 1, 0), 20);
    push(&mut q, &req("other", 1, 0), 21);
    assert_eq!(q.counter("late"), Some(200.0));
    assert_eq!(q.counter("other"), Some(200.0));
    assert_eq!(drain(&mut q), [2, 20, 21]);
}

#[test]
fn with_nobody_backlogged_a_tenant_rejoins_at_the_floor() {
    let mut q = queue(4);
    push(&mut q, &req("a", 100, 0), 0);
    drain(&mut q);
    assert_eq!(q.floor(), 100.0, "a's counter when the last waiter left");
    push(&mut q, &req("b", 1, 0), 1);
    assert_eq!(q.counter("b"), Some(100.0));
}

#[test]
fn a_full_queue_sheds_the_heaviest_tenants_newest_request() {
    let mut q = queue(4);
    for id in 0..3 {
        push(&mut q, &req("heavy", 10, 0), id);
    }
    push(&mut q, &req("light", 10, 0), 10);
    // Full: light's arrival (10 + its 10 waiting) is lighter than heavy
    // (30 waiting): heavy's newest, 2, goes.
    let mut shed = Vec::new();
    let key = q.push(&req("light", 10, 0), 11, 0, |v| shed.push(v));
    assert!(key.is_ok());
    assert_eq!(shed, [2]);
    // heavy's arrival is the heaviest: refused itself, nothing shed.
    let refused = q.push(&req("heavy", 10, 0), 3, 0, |v| panic!("{v} shed"));
    assert_eq!(refused.unwrap_err(), (FlowRejection::QueueFull, 3));
    assert_eq!(q.len(), 4);
}

#[test]
fn shedding_takes_the_least_important_band_first() {
    let mut q = queue(2);
    push(
        &mut q,
        &FlowRequest {
            priority: 0,
            ..req("a", 50, 0)
        },
        0,
    );
    push(
        &mut q,
        &FlowRequest {
            priority: 2,
            ..req("b", 1, 0)
        },
        1,
    );
    // A band-1 arrival sheds band 2 even though its own tenant is heavier.
    let mut shed = Vec::new();
    let r = FlowRequest {
        priority: 1,
        ..req("a", 50, 0)
    };
    assert!(q.push(&r, 2, 0, |v| shed.push(v)).is_ok());
    assert_eq!(shed, [1]);
    // A band-2 arrival finds only more important requests: refused.
    let r = FlowRequest {
        priority: 2,
        ..req("c", 1, 0)
    };
    let refused = q.push(&r, 3, 0, |v| panic!("{v} shed"));
    assert_eq!(refused.unwrap_err().0, FlowRejection::QueueFull);
}

#[test]
fn the_token_bound_sheds_as_many_as_it_takes_or_none() {
    let config = FlowConfig {
        queue_tokens: Some(100),
        ..FlowConfig::new(10)
    };
    let mut q = FlowQueue::new(&config).unwrap();
    for id in 0..4 {
        push(&mut q, &req("heavy", 20, 0), id);
    }
    assert_eq!(q.tokens(), 80);
    // 50 more tokens: heavy's two newest (40) make room.
    let mut shed = Vec::new();
    assert!(q
        .push(&req("light", 50, 0), 10, 0, |v| shed.push(v))
        .is_ok());
    assert_eq!(shed, [3, 2]);
    assert_eq!(q.tokens(), 90);
    // More than the whole bound: refused at once.
    let refused = q.push(&req("light", 101, 0), 11, 0, |v| panic!("{v} shed"));
    assert_eq!(refused.unwrap_err().0, FlowRejection::QueueFull);
    // light (counter 0 + 50 waiting + 40) would need heavy's last two (40
    // waiting), then be the heaviest itself: refused, and nothing shed.
    let refused = q.push(&req("light", 40, 0), 12, 0, |v| panic!("{v} shed"));
    assert_eq!(refused.unwrap_err().0, FlowRejection::QueueFull);
    assert_eq!(q.len(), 3);
}

#[test]
fn deadlines_expire_exactly_and_may_be_given_per_request() {
    let config = FlowConfig {
        deadline: Duration::from_millis(100),
        ..FlowConfig::new(8)
    };
    let mut q = FlowQueue::new(&config).unwrap();
    q.push(&req("a", 1, 1), 0, 0, drop).unwrap();
    let short = FlowRequest {
        deadline: Some(Duration::from_millis(10)),
        ..req("a", 1, 1)
    };
    q.push(&short, 1, 5 * MS, drop).unwrap();
    assert_eq!(q.next_deadline(), Some(15 * MS));
    let mut expired = Vec::new();
    assert_eq!(q.expire(15 * MS - 1, |v| expired.push(v)), 0);
    assert_eq!(q.expire(15 * MS, |v| expired.push(v)), 1);
    assert_eq!(q.next_deadline(), Some(100 * MS));
    assert_eq!(q.expire(100 * MS, |v| expired.push(v)), 1);
    assert_eq!(expired, [1, 0]);
    assert_eq!(q.next_deadline(), None);
}

#[test]
fn a_cancel_leaves_at_once_and_only_once() {
    let mut q = queue(4);
    let k0 = q.push(&req("a", 1, 1), 0, 0, drop).unwrap();
    let k1 = q.push(&req("a", 1, 1), 1, 0, drop).unwrap();
    assert_eq!(q.cancel(k0), Some(0));
    assert_eq!(q.cancel(k0), None, "a second cancel finds nothing");
    // A new request reusing the slot is not cancelled by the stale key.
    let k2 = q.push(&req("b", 1, 1), 2, 0, drop).unwrap();
    assert_eq!(q.cancel(k0), None);
    assert_eq!(drain(&mut q), [1, 2]);
    assert_eq!(q.cancel(k1), None, "dispatched: not queued any more");
    assert_eq!(q.cancel(k2), None);
    assert_eq!(q.next_deadline(), None);
}

#[test]
fn a_flood_of_tenant_ids_stays_within_the_table() {
    let config = FlowConfig {
        max_tenants: 64,
        ..FlowConfig::new(16)
    };
    let mut q = FlowQueue::new(&config).unwrap();
    for i in 0..100_000u32 {
        let name = format!("t{i}");
        if let Ok(_key) = q.push(&req(&name, 1, 1), i, 0, drop) {
            if let Some((_, r)) = q.pop(0) {
                q.settle(r, 1);
            }
        }
        assert!(q.tenants() <= 64);
    }
    // A known tenant with its requests queued is never forgotten.
    let mut q = FlowQueue::new(&FlowConfig {
        max_tenants: 2,
        ..FlowConfig::new(16)
    })
    .unwrap();
    push(&mut q, &req("a", 1, 1), 0);
    push(&mut q, &req("b", 1, 1), 1);
    let refused = q.push(&req("c", 1, 1), 2, 0, drop);
    assert_eq!(refused.unwrap_err().0, FlowRejection::QueueFull);
    assert_eq!(drain(&mut q), [0, 1]);
    push(&mut q, &req("c", 1, 1), 2);
}

#[test]
fn forgetting_a_tenant_at_the_floor_changes_nothing() {
    let mut q = FlowQueue::new(&FlowConfig {
        max_tenants: 2,
        ..FlowConfig::new(16)
    })
    .unwrap();
    push(&mut q, &req("a", 10, 0), 0);
    push(&mut q, &req("b", 30, 0), 1);
    drain(&mut q);
    // Floor 30 (b's counter when the queue emptied); a (10) is forgotten
    // for c, and comes back at the floor, as it would have.
    push(&mut q, &req("c", 1, 0), 2);
    push(&mut q, &req("a", 1, 0), 3);
    assert_eq!(q.counter("a"), Some(30.0));
}

#[test]
fn absurd_sizes_saturate_and_bad_input_is_refused() {
    let mut q = queue(4);
    let huge = FlowRequest {
        deadline: Some(Duration::MAX),
        ..req("a", u64::MAX, u64::MAX)
    };
    push(&mut q, &huge, 0);
    push(&mut q, &huge, 1);
    assert_eq!(q.tokens(), 4 * u128::from(u64::MAX));
    assert_eq!(
        q.next_deadline(),
        Some(3_600_000 * MS),
        "the longest deadline"
    );
    let (_, mut r) = q.pop(0).unwrap();
    q.report_output(&mut r, u64::MAX);
    q.report_output(&mut r, u64::MAX);
    q.settle(r, u64::MAX);
    assert!(q.counter("a").unwrap().is_finite());
    let long = "x".repeat(257);
    let refused = q.push(&req(&long, 1, 1), 9, 0, drop);
    assert_eq!(refused.unwrap_err().0, FlowRejection::InvalidTenant);
    let bad = |c: FlowConfig| FlowQueue::<u32>::new(&c).err().unwrap();
    assert!(matches!(
        bad(FlowConfig::new(0)),
        FlowConfigError::Invalid {
            field: "queue_limit",
            ..
        }
    ));
    assert!(matches!(
        bad(FlowConfig {
            output_weight: f64::NAN,
            ..FlowConfig::new(1)
        }),
        FlowConfigError::Invalid {
            field: "output_weight",
            ..
        }
    ));
    let e = bad(FlowConfig {
        tenant_weights: vec![("t".into(), 0.0)],
        ..FlowConfig::new(1)
    });
    assert_eq!(
        e.to_string(),
        "tenant_weights[\"t\"] must be a number from 0.000001 to 1000000"
    );
}

#[test]
fn retry_after_follows_the_drain_rate() {
    let mut q = queue(64);
    assert_eq!(
        q.retry_after(),
        Duration::from_secs(60),
        "nothing drained yet"
    );
    for id in 0..40 {
        push(&mut q, &req("a", 1, 1), id);
    }
    // 10 dispatches 100 ms apart: 10 per second; 30 left: 3 s.
    for i in 0..10 {
        let (_, r) = q.pop(i * 100 * MS).unwrap();
        q.settle(r, 0);
    }
    assert_eq!(q.len(), 30);
    assert_eq!(q.retry_after(), Duration::from_secs(3));
}

#[test]
fn a_tenants_weight_divides_its_charges() {
    let config = FlowConfig {
        tenant_weights: vec![("gold".into(), 2.0)],
        ..FlowConfig::new(32)
    };
    let mut q = FlowQueue::new(&config).unwrap();
    for id in 0..6 {
        push(&mut q, &req("gold", 10, 0), id);
        push(&mut q, &req("plain", 10, 0), 100 + id);
    }
    let order = drain(&mut q);
    // gold is charged 5 per request, plain 10. Pushes alternate, so on a
    // tie the older head is plain's from the second round on: gold 0 (5),
    // plain 100 (10), gold 1 (10), plain 101 (20, the tie to the older
    // head), gold 2 (15), gold 3 (20): gold goes twice as often.
    assert_eq!(&order[..6], [0, 100, 1, 101, 2, 3]);
}

#[test]
fn a_request_put_back_regains_its_place_and_is_charged_once() {
    let mut q = queue(8);
    push(&mut q, &req("a", 100, 0), 0);
    push(&mut q, &req("a", 100, 0), 1);
    push(&mut q, &req("b", 100, 0), 2);
    let (id, r) = q.pop(0).unwrap();
    assert_eq!(id, 0);
    assert_eq!(q.counter("a"), Some(100.0));
    // A worker refused it before it started: its charge is undone and it
    // is next again, ahead of its tenant's later request.
    q.requeue(r, 0, 1, |v| panic!("{v} shed")).unwrap();
    assert_eq!(q.counter("a"), Some(0.0));
    assert_eq!(drain(&mut q), [0, 2, 1]);
    assert_eq!(q.counter("a"), Some(200.0), "charged twice");
}

#[test]
fn a_request_put_back_keeps_its_deadline() {
    let mut q = queue(8);
    let r = FlowRequest {
        deadline: Some(Duration::from_millis(10)),
        ..req("a", 1, 1)
    };
    push(&mut q, &r, 0);
    let (_, res) = q.pop(3 * MS).unwrap();
    let (e, id) = q.requeue(res, 0, 10 * MS, |_| {}).unwrap_err();
    assert_eq!((e, id), (FlowRejection::QueueDeadline, 0));
    assert_eq!(q.counter("a"), Some(0.0), "a refused request costs nothing");
    push(&mut q, &r, 1);
    let (_, res) = q.pop(3 * MS).unwrap();
    q.requeue(res, 1, 4 * MS, |_| {}).unwrap();
    assert_eq!(q.next_deadline(), Some(10 * MS));
}
