//! The lab's own promises: a run is a function of its inputs and seed, every
//! run balances its accounting, every refusal a loadgate arm's client hears
//! is the monitor's answer, clients retry no more than they may, and the
//! designs separate under overload the way the report says they do.

use loadgate_lab::arm::{Arm, ArmKind, GateKnobs};
use loadgate_lab::sim::{run, Conditions};
use loadgate_lab::workload::{Client, Retry, WorkloadSpec};

/// Dynamo's design with a decode threshold and a worker limit set (as
/// shipped it has neither).
fn dynamo() -> Arm {
    Arm {
        decode_threshold: Some(0.9),
        gate: Some(GateKnobs {
            limit: 256,
            queue: 16,
            wait_limit: None,
            deadline_s: None,
            classes: None,
        }),
        ..Arm::base(ArmKind::Dynamo)
    }
}

fn conditions() -> Conditions {
    Conditions {
        workers: 2,
        warmup_s: 2.0,
        drain_s: 15.0,
        ..Conditions::default()
    }
}

#[test]
fn the_same_seed_gives_the_same_run_for_every_arm() {
    let c = conditions();
    let w = WorkloadSpec::steady(95.0, 10.0, 7);
    let reqs = w.generate();
    for kind in ArmKind::ALL {
        let mut arm = Arm::base(kind);
        arm.bucket_rate = Some(40.0);
        let a = run(&arm, &w, &reqs, &c, 40.0).expect("a run");
        let b = run(&arm, &w, &reqs, &c, 40.0).expect("a run");
        assert_eq!(a, b, "{kind:?}");
        let acc = a.measured.accounting;
        assert_eq!(
            acc.offered,
            acc.completed + acc.rejected + acc.cancelled + acc.in_flight
        );
        assert!(acc.offered > 700);
    }
}

#[test]
fn every_refusal_of_a_loadgate_arm_is_the_monitors_answer() {
    // Overloaded, so that frontends refuse and workers' gates refuse what
    // the frontends sent: each refusal a client hears must have been
    // answered by a shipped call (dispatch, or redispatch after a worker
    // refused), and so counted by the monitor.
    let c = conditions();
    let w = WorkloadSpec::steady(185.0, 10.0, 5);
    let reqs = w.generate();
    for arm in [
        dynamo(),
        Arm::base(ArmKind::Saturation),
        Arm::base(ArmKind::Loadgate),
        Arm::base(ArmKind::Queue),
        Arm::base(ArmKind::FairQueue),
    ] {
        let r = run(&arm, &w, &reqs, &c, 40.0).expect("a run");
        let kind = arm.kind;
        assert!(r.refusals_heard > 100, "{kind:?}: {}", r.refusals_heard);
        assert_eq!(r.refusals_heard, r.monitor_refusals, "{kind:?}");
    }
    // Dynamo 1.6.1 as shipped (no threshold, no worker limit) refuses
    // nothing, however overloaded.
    let shipped = run(&Arm::base(ArmKind::Dynamo), &w, &reqs, &c, 40.0).expect("a run");
    assert_eq!(shipped.refusals_heard, 0);
}

#[test]
fn every_tunable_arm_gets_the_same_budget_from_its_own_space() {
    for kind in ArmKind::TUNABLE {
        let space = Arm::space(kind);
        let search = Arm::search(kind, 24, 9);
        assert_eq!(search.len(), 24.min(space.len() + 1), "{kind:?}");
        assert_eq!(search[0], Arm::base(kind), "{kind:?}: the defaults first");
        for (i, a) in search.iter().enumerate().skip(1) {
            assert!(space.contains(a), "{kind:?}: outside its space");
            assert!(!search[..i].contains(a), "{kind:?}: a repeat");
        }
        assert_eq!(
            search,
            Arm::search(kind, 24, 9),
            "{kind:?}: the seed repeats"
        );
        assert_ne!(search, Arm::search(kind, 24, 10), "{kind:?}: another seed");
    }
    // Dynamo 1.6.1 cannot express a worker queue under 2, nor a deadline.
    for a in Arm::space(ArmKind::Dynamo) {
        if let Some(g) = a.gate {
            assert!(g.queue >= 2 && g.deadline_s.is_none() && g.wait_limit.is_none());
        }
        assert_eq!(a.reroute, 0);
    }
}

#[test]
fn retrying_clients_stop_at_their_cap() {
    let c = conditions();
    let mut w = WorkloadSpec::steady(185.0, 10.0, 3);
    w.client = Client {
        retry: Retry::Immediate,
        max_retries: 2,
        ..Client::default()
    };
    let reqs = w.generate();
    let r = run(&dynamo(), &w, &reqs, &c, 40.0).expect("a run");
    let m = &r.measured;
    assert!(m.reject_rate > 0.2, "overloaded: {m:?}");
    assert!(m.attempts_per_request > 1.0);
    assert!(m.attempts_per_request <= 3.0);
}

#[test]
fn admission_control_keeps_goodput_where_none_collapses() {
    let c = conditions();
    // About three times what two workers serve within the SLOs.
    let w = WorkloadSpec::steady(160.0, 20.0, 11);
    let reqs = w.generate();
    let none = run(&Arm::base(ArmKind::NoControl), &w, &reqs, &c, 40.0).expect("a run");
    let seed = run(&dynamo(), &w, &reqs, &c, 40.0).expect("a run");
    let lg = run(&Arm::base(ArmKind::Loadgate), &w, &reqs, &c, 40.0).expect("a run");
    for r in [&seed, &lg] {
        assert!(
            r.measured.goodput_rps > 20.0,
            "{:?}",
            r.measured.goodput_rps
        );
        assert!(
            none.measured.goodput_rps < 0.25 * r.measured.goodput_rps,
            "{:?}",
            none.measured.goodput_rps
        );
    }
    // With its wait limit and deadline, loadgate's admitted requests keep
    // their first token within the SLO.
    assert!(
        lg.measured.ttft_ms.p99 < 2000.0,
        "{:?}",
        lg.measured.ttft_ms
    );
    // No rejection waits longer than the gate's queue deadline plus one
    // network round trip (1 ms), once per worker it is routed to (a
    // refusal is routed again `reroute` times): nobody hangs until the
    // client gives up.
    let arm = Arm::base(ArmKind::Loadgate);
    let gate = arm.gate.expect("a gate");
    let tries = f64::from(arm.reroute + 1);
    let most = tries * (gate.deadline_s.expect("a deadline") * 1e3 + 1.0);
    assert!(
        lg.measured.time_to_reject_ms.p999 <= most * 1.001,
        "{:?}",
        lg.measured.time_to_reject_ms
    );
    assert_eq!(lg.measured.cancel_rate, 0.0);
}

#[test]
fn data_parallel_ranks_share_the_work() {
    let c = Conditions {
        dp_size: 2,
        ..conditions()
    };
    let w = WorkloadSpec::steady(75.0, 10.0, 5);
    let reqs = w.generate();
    let one_rank = run(
        &Arm::base(ArmKind::Loadgate),
        &w,
        &reqs,
        &conditions(),
        60.0,
    )
    .expect("a run");
    let two_ranks = run(&Arm::base(ArmKind::Loadgate), &w, &reqs, &c, 40.0).expect("a run");
    let (a, b) = (&one_rank.measured, &two_ranks.measured);
    assert_eq!(
        b.accounting.offered,
        b.accounting.completed
            + b.accounting.rejected
            + b.accounting.cancelled
            + b.accounting.in_flight
    );
    // Twice the engines serve the same load with fewer rejections and more
    // goodput.
    assert!(
        b.reject_rate < a.reject_rate,
        "{} vs {}",
        b.reject_rate,
        a.reject_rate
    );
    assert!(b.goodput_rps > a.goodput_rps);
}

/// Goodput of tenant `t`, requests per second.
fn tenant_rps(r: &loadgate_lab::sim::RunResult, t: usize) -> f64 {
    r.measured.tenant_goodput_rps(t)
}

#[test]
fn the_fair_queue_keeps_light_tenants_whole_beside_a_heavy_one() {
    let c = Conditions {
        workers: 4,
        ..conditions()
    };
    // About twice what four workers serve, one tenant sending ten times
    // each of the others.
    // One priority class: tenants against tenants (with two, a light
    // tenant's class-1 requests wait behind the heavy one's class 0, and
    // the lab's tenants cell reports what that costs).
    let mut w = WorkloadSpec::steady(160.0, 20.0, 13);
    w.tenants = vec![10.0, 1.0, 1.0];
    w.priorities = vec![0.0, 1.0];
    let reqs = w.generate();
    // A decode line that keeps admitted requests within the TPOT SLO.
    let queue = |kind| Arm {
        decode_threshold: Some(0.7),
        ..Arm::base(kind)
    };
    let fifo = run(&queue(ArmKind::Queue), &w, &reqs, &c, 40.0).expect("a run");
    let fair = run(&queue(ArmKind::FairQueue), &w, &reqs, &c, 40.0).expect("a run");
    for t in [1, 2] {
        let own: Vec<_> = reqs
            .iter()
            .filter(|r| usize::from(r.tenant) == t)
            .copied()
            .collect();
        let alone = run(&queue(ArmKind::FairQueue), &w, &own, &c, 40.0).expect("a run");
        let (a, f, q) = (
            tenant_rps(&alone, t),
            tenant_rps(&fair, t),
            tenant_rps(&fifo, t),
        );
        assert!(
            f >= 0.9 * a,
            "tenant {t}: {f} beside the heavy one, {a} alone"
        );
        // Without fairness the heavy tenant's flood takes its share.
        assert!(q < 0.8 * a, "tenant {t}: {q} in arrival order, {a} alone");
    }
    for r in [&fifo, &fair] {
        let acc = r.measured.accounting;
        assert_eq!(
            acc.offered,
            acc.completed + acc.rejected + acc.cancelled + acc.in_flight
        );
        // The queue, not the workers, turns requests away.
        assert!(
            r.measured
                .rejections_by
                .keys()
                .all(|k| k.starts_with("frontend queue")),
            "{:?}",
            r.measured.rejections_by
        );
    }
}

#[test]
fn the_queue_serves_a_burst_that_refusing_at_once_turns_away() {
    let c = conditions();
    let mut w = WorkloadSpec::steady(50.0, 20.0, 17);
    w.arrivals = loadgate_lab::workload::Arrivals::Gamma { burstiness: 0.25 };
    let reqs = w.generate();
    let at_once = run(&Arm::base(ArmKind::Loadgate), &w, &reqs, &c, 40.0).expect("a run");
    let queued = run(&Arm::base(ArmKind::Queue), &w, &reqs, &c, 40.0).expect("a run");
    assert!(
        queued.measured.reject_rate < at_once.measured.reject_rate,
        "{} vs {}",
        queued.measured.reject_rate,
        at_once.measured.reject_rate
    );
    assert!(queued.measured.goodput_rps > at_once.measured.goodput_rps);
    assert!(queued.measured.ttft_ms.p99 < 2000.0);
}

#[test]
fn replicas_without_worker_gates_need_booking_sync() {
    // Four workers at about twice their capacity, behind four frontend
    // replicas that decide alone (no worker gates).
    let mut w = WorkloadSpec::steady(160.0, 20.0, 23);
    w.tenants = vec![1.0];
    let reqs = w.generate();
    let arm = Arm {
        gate: None,
        ..Arm::base(ArmKind::Queue)
    };
    let base = Conditions {
        workers: 4,
        ..conditions()
    };
    let with = |frontends: u32, sync: Option<f64>| {
        let c = Conditions {
            frontends,
            sync_debounce_s: sync,
            ..base
        };
        run(&arm, &w, &reqs, &c, 130.0).expect("a run")
    };
    let (one, apart, shared) = (with(1, None), with(4, None), with(4, Some(0.002)));
    let good = |r: &loadgate_lab::sim::RunResult| r.measured.goodput_rps;
    assert!(
        good(&apart) < 0.97 * good(&one),
        "apart {} one {}",
        good(&apart),
        good(&one)
    );
    assert!(
        good(&shared) > good(&apart),
        "shared {} apart {}",
        good(&shared),
        good(&apart)
    );
    // At most one snapshot per replica per debounce interval, and a run is
    // still a function of its seed.
    let intervals = ((20.0 + base.drain_s) / 0.002) as u64 + 1;
    assert!(shared.sync_messages > 0 && shared.sync_messages <= 4 * intervals);
    assert_eq!(shared, with(4, Some(0.002)));
}

#[test]
fn leased_replicas_never_admit_past_a_line() {
    // The same fleet, four replicas: with leased sync no admission leaves
    // a rank's admitted blocks past its line; without sync they pass it.
    let mut w = WorkloadSpec::steady(160.0, 20.0, 23);
    w.tenants = vec![1.0];
    let reqs = w.generate();
    let arm = Arm {
        gate: None,
        decode_threshold: Some(0.5),
        ..Arm::base(ArmKind::Queue)
    };
    let with = |sync: Option<f64>, leased: bool| {
        let c = Conditions {
            workers: 4,
            frontends: 4,
            sync_debounce_s: sync,
            sync_leased: leased,
            ..conditions()
        };
        run(&arm, &w, &reqs, &c, 130.0).expect("a run")
    };
    let (apart, leased) = (with(None, false), with(Some(0.002), true));
    assert!(apart.line_breaches > 0, "{apart:?}");
    assert_eq!(leased.line_breaches, 0, "{leased:?}");
    assert!(leased.measured.goodput_rps > 0.8 * apart.measured.goodput_rps);
    assert_eq!(leased, with(Some(0.002), true));
}
