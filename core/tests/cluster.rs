//! Publisher → transport → subscriber → monitor, in process
//! (docs/behaviour.md#across-machines).

use std::sync::Arc;
use std::time::Duration;

use loadgate::cluster::wire::{ActiveLoad, LoadMessage, WireError, SCHEMA_VERSION};
use loadgate::cluster::{
    Applied, HandleError, InProcessBus, Publisher, PublisherConfig, Subjects, Subscriber,
    SubscriberConfig, Transport,
};
use loadgate::{
    LoadReport, ManualClock, Monitor, MonitorConfig, Policy, RouteError, ThresholdUpdate,
};

struct Frontend {
    monitor: Arc<Monitor>,
    subscriber: Arc<Subscriber>,
}

fn frontend(clock: &Arc<ManualClock>) -> Frontend {
    let monitor = Arc::new(Monitor::with_config(MonitorConfig::default(), clock.clone()).unwrap());
    let subscriber =
        Subscriber::new(monitor.clone(), SubscriberConfig::default(), clock.clone()).unwrap();
    Frontend {
        monitor,
        subscriber,
    }
}

fn worker(bus: &InProcessBus, clock: &Arc<ManualClock>, id: u64) -> Publisher {
    let config = PublisherConfig {
        dp_size: 2,
        kv_total_blocks: Some(100),
        ..PublisherConfig::new(id, "llama")
    };
    Publisher::new(
        config,
        Arc::new(bus.clone()),
        &Subjects::new("test").unwrap(),
        clock.clone(),
    )
    .unwrap()
}

fn used(n: u64) -> LoadReport {
    LoadReport {
        kv_used_blocks: Some(n),
        ..Default::default()
    }
}

fn message(seq: u64) -> LoadMessage {
    LoadMessage {
        v: SCHEMA_VERSION,
        instance: 1,
        seq,
        worker_id: 5,
        model: "llama".into(),
        dp_start: 0,
        dp_size: 1,
        dp_rank: 0,
        kv_total_blocks: Some(100),
        max_num_batched_tokens: None,
        active_decode_blocks: None,
        kv_used_blocks: Some(seq),
        active_prefill_tokens: None,
        waiting_requests: None,
        max_num_seqs: None,
    }
}

#[test]
fn frontends_learn_workers_and_converge_on_one_busy_set() {
    let clock = ManualClock::new();
    let bus = InProcessBus::new();
    let subjects = Subjects::new("test").unwrap();
    let frontends: Vec<Frontend> = (0..3).map(|_| frontend(&clock)).collect();
    let attached: Vec<_> = frontends
        .iter()
        .map(|f| f.subscriber.attach(&bus, &subjects).unwrap())
        .collect();
    let workers: Vec<Publisher> = (1..=4).map(|id| worker(&bus, &clock, id)).collect();
    for w in &workers {
        w.flush(); // announcement
    }
    // Announcements register on each subscriber's own thread.
    for a in &attached {
        a.settle();
    }
    let decode = ThresholdUpdate {
        active_decode_blocks_threshold: Some(0.5),
        ..Default::default()
    };
    for f in &frontends {
        assert_eq!(
            f.monitor.workers("llama"),
            vec![1, 2, 3, 4],
            "learned from the first heartbeat"
        );
        f.monitor.set_thresholds("llama", &decode).unwrap();
    }
    for (i, w) in workers.iter().enumerate() {
        w.report(0, &used(90)).unwrap();
        w.report(1, &used(if i % 2 == 0 { 90 } else { 10 }))
            .unwrap();
        assert_eq!(w.flush(), 2, "two changed ranks, no heartbeat due");
    }
    for f in &frontends {
        assert_eq!(f.monitor.busy_workers("llama"), vec![1, 3]);
    }
    // Thresholds stay local to each frontend.
    frontends[0]
        .monitor
        .set_thresholds(
            "llama",
            &ThresholdUpdate {
                active_decode_blocks_threshold: Some(0.95),
                ..Default::default()
            },
        )
        .unwrap();
    assert!(frontends[0].monitor.busy_workers("llama").is_empty());
    assert_eq!(frontends[1].monitor.busy_workers("llama"), vec![1, 3]);
    assert_eq!(frontends[2].monitor.thresholds("llama").unwrap().version, 1);
}

#[test]
fn a_late_frontend_learns_everything_from_the_heartbeat() {
    let clock = ManualClock::new();
    let bus = InProcessBus::new();
    let w = worker(&bus, &clock, 9);
    w.report(
        1,
        &LoadReport {
            active_prefill_tokens: Some(7),
            waiting_requests: Some(3),
            ..used(40)
        },
    )
    .unwrap();
    w.flush();
    let late = frontend(&clock);
    let a = late
        .subscriber
        .attach(&bus, &Subjects::new("test").unwrap())
        .unwrap();
    assert_eq!(w.flush(), 0, "nothing changed and no heartbeat due");
    clock.advance(Duration::from_secs(1));
    assert_eq!(w.flush(), 2, "the heartbeat re-sends every rank");
    a.settle();
    let load = late.monitor.rank_load(9, 1).unwrap();
    assert_eq!(
        (
            load.kv_used_blocks,
            load.active_prefill_tokens,
            load.kv_total_blocks,
            load.waiting_requests
        ),
        (40, Some(7), 100, Some(3))
    );
    assert_eq!(
        late.monitor.rank_load(9, 0).unwrap().waiting_requests,
        None,
        "a rank that never reported waiting requests"
    );
}

#[test]
fn publishers_coalesce_reports_between_flushes() {
    let clock = ManualClock::new();
    let bus = InProcessBus::new();
    let f = frontend(&clock);
    let a = f
        .subscriber
        .attach(&bus, &Subjects::new("test").unwrap())
        .unwrap();
    let w = worker(&bus, &clock, 1);
    w.flush();
    a.settle();
    for n in 0..50 {
        w.report(0, &used(n)).unwrap();
    }
    w.report(
        0,
        &LoadReport {
            active_decode_blocks: Some(3),
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(w.flush(), 1);
    let load = f.monitor.rank_load(1, 0).unwrap();
    assert_eq!(
        (load.kv_used_blocks, load.active_decode_blocks),
        (49, 3),
        "merged: absent fields keep"
    );
    assert_eq!(w.messages_sent(), 3);
    assert!(matches!(
        w.report(2, &used(1)),
        Err(loadgate::ReportError::UndeclaredRank { .. })
    ));
}

#[test]
fn out_of_order_and_malformed_messages_are_counted_and_ignored() {
    let clock = ManualClock::new();
    let f = frontend(&clock);
    let s = &f.subscriber;
    assert_eq!(s.handle(&message(10).to_msgpack()), Ok(Applied::Announced));
    assert_eq!(s.handle(&message(12).to_json()), Ok(Applied::Report));
    assert_eq!(s.handle(&message(11).to_msgpack()), Ok(Applied::OutOfOrder));
    assert_eq!(s.handle(&message(12).to_msgpack()), Ok(Applied::OutOfOrder));
    assert_eq!(
        f.monitor.rank_load(5, 0).unwrap().kv_used_blocks,
        12,
        "older messages change nothing"
    );
    assert!(matches!(
        s.handle(b"\xc1garbage"),
        Err(HandleError::Wire(WireError::Malformed(_)))
    ));
    assert!(matches!(
        s.handle(b"{\"worker_id\": 5, \"v\": 9}"),
        Err(HandleError::Wire(WireError::UnsupportedVersion(9)))
    ));
    let mut bad = message(13);
    bad.dp_rank = 3;
    assert!(matches!(
        s.handle(&bad.to_msgpack()),
        Err(HandleError::Wire(WireError::Invalid(_)))
    ));
    let stats = s.stats();
    assert_eq!(
        (
            stats.announced,
            stats.applied,
            stats.out_of_order,
            stats.malformed
        ),
        (1, 1, 2, 3)
    );
    let text = s.metrics_text();
    assert!(
        text.contains("dynamo_frontend_load_messages_total{outcome=\"out_of_order\"} 2"),
        "{text}"
    );
}

#[test]
fn a_restarted_worker_is_accepted_with_its_new_sequence() {
    let clock = ManualClock::new();
    let f = frontend(&clock);
    f.subscriber.handle(&message(100).to_msgpack()).unwrap();
    let mut restarted = message(1);
    restarted.instance = 2;
    restarted.dp_size = 2;
    assert_eq!(
        f.subscriber.handle(&restarted.to_msgpack()),
        Ok(Applied::Announced)
    );
    assert_eq!(f.monitor.rank_load(5, 0).unwrap().kv_used_blocks, 1);
    assert!(
        f.monitor.rank_load(5, 1).is_ok(),
        "the new declaration replaced the old one"
    );
}

#[test]
fn reference_active_load_updates_known_workers_only() {
    let clock = ManualClock::new();
    let f = frontend(&clock);
    let active = |id| {
        serde_json::to_vec(&ActiveLoad {
            worker_id: id,
            dp_rank: 0,
            active_decode_blocks: Some(77),
            active_prefill_tokens: Some(5),
            kv_used_blocks: None,
        })
        .unwrap()
    };
    assert!(matches!(
        f.subscriber.handle(&active(5)),
        Err(HandleError::Report(_))
    ));
    f.subscriber.handle(&message(1).to_msgpack()).unwrap();
    assert_eq!(f.subscriber.handle(&active(5)), Ok(Applied::Report));
    let load = f.monitor.rank_load(5, 0).unwrap();
    assert_eq!(
        (
            load.active_decode_blocks,
            load.active_prefill_tokens,
            load.kv_used_blocks
        ),
        (77, Some(5), 1)
    );
}

#[test]
fn a_silent_worker_is_removed_and_its_model_becomes_unavailable() {
    let clock = ManualClock::new();
    let bus = InProcessBus::new();
    let f = frontend(&clock);
    let w = worker(&bus, &clock, 3);
    // Subscribe without `attach`'s sweeping thread: this test sweeps by hand.
    let s = f.subscriber.clone();
    let all = Subjects::new("test").unwrap().load_all();
    let _sub = bus
        .subscribe(
            &all,
            Arc::new(move |subject: &str, p: &[u8]| drop(s.handle_on(subject, p))),
        )
        .unwrap();
    w.flush();
    assert_eq!(f.monitor.select("llama", Policy::RoundRobin), Ok(3));
    // The sweep turns "heard since the last sweep" into a time.
    assert!(f.subscriber.expire().is_empty());
    clock.advance(Duration::from_millis(2999));
    assert!(f.subscriber.expire().is_empty());
    clock.advance(Duration::from_millis(1));
    assert_eq!(f.subscriber.expire(), vec![3]);
    assert_eq!(
        f.monitor.select("llama", Policy::RoundRobin),
        Err(RouteError::Unavailable)
    );
    assert_eq!(f.subscriber.stats().expired, 1);
    // It comes back with its next heartbeat.
    w.flush();
    assert_eq!(f.monitor.select("llama", Policy::RoundRobin), Ok(3));
}

#[test]
fn a_spawned_publisher_sends_changes_by_itself() {
    let clock = ManualClock::new();
    let bus = InProcessBus::new();
    let f = frontend(&clock);
    let _a = f
        .subscriber
        .attach(&bus, &Subjects::new("test").unwrap())
        .unwrap();
    let transport: Arc<dyn Transport> = Arc::new(bus.clone());
    let w = Publisher::spawn(
        PublisherConfig::new(8, "llama"),
        transport,
        &Subjects::new("test").unwrap(),
    )
    .unwrap();
    w.report(0, &used(33)).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while f.monitor.rank_load(8, 0).map(|l| l.kv_used_blocks) != Ok(33) {
        assert!(
            std::time::Instant::now() < deadline,
            "the publisher thread never sent"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    drop(w);
}

#[test]
fn a_worker_removed_by_the_application_is_registered_again_by_its_next_message() {
    let clock = ManualClock::new();
    let f = frontend(&clock);
    assert_eq!(
        f.subscriber.handle(&message(1).to_msgpack()),
        Ok(Applied::Announced)
    );
    f.monitor.remove_worker(5).unwrap();
    assert!(matches!(
        f.subscriber.handle(&message(2).to_msgpack()),
        Err(HandleError::Report(loadgate::ReportError::UnknownWorker(5)))
    ));
    assert_eq!(
        f.subscriber.handle(&message(3).to_msgpack()),
        Ok(Applied::Announced)
    );
    assert_eq!(f.monitor.rank_load(5, 0).unwrap().kv_used_blocks, 3);
}
