//! Every size input chooses is bounded before anything is allocated
//! (docs/limits.md): the monitor's limits, and the subscriber's payload
//! bound, sender check and refusal counters.

use std::sync::Arc;

use loadgate::cluster::wire::{LoadMessage, SCHEMA_VERSION};
use loadgate::cluster::{Applied, HandleError, Subscriber, SubscriberConfig};
use loadgate::{
    Limits, ManualClock, Monitor, MonitorConfig, Policy, RouteError, ThresholdUpdate, WorkerError,
    WorkerSpec,
};

fn monitor(limits: Limits) -> Arc<Monitor> {
    let config = MonitorConfig {
        limits,
        ..Default::default()
    };
    Arc::new(Monitor::with_config(config, ManualClock::new()).unwrap())
}

fn ranks(dp_start: u32, dp_size: u32) -> WorkerSpec {
    WorkerSpec {
        dp_start,
        dp_size,
        ..Default::default()
    }
}

#[test]
fn a_huge_rank_count_is_refused_not_allocated() {
    let m = monitor(Limits::default());
    // 2^31 ranks would be 120 GB of rank state.
    assert_eq!(
        m.add_worker("m", 1, ranks(0, 1 << 31)),
        Err(WorkerError::TooManyRanks {
            dp_size: 1 << 31,
            limit: 1024
        })
    );
    assert_eq!(
        m.add_worker("m", 1, ranks(u32::MAX - 1, 1 << 31)),
        Err(WorkerError::InvalidRanks {
            dp_start: u32::MAX - 1,
            dp_size: 1 << 31
        })
    );
    assert!(m.models().is_empty(), "nothing stored");
    m.add_worker("m", 1, ranks(7, 1024)).unwrap();
    assert!(m.rank_load(1, 7 + 1023).is_ok());
}

#[test]
fn names_workers_and_ranks_are_bounded_per_monitor() {
    let m = monitor(Limits {
        max_name_len: 8,
        max_workers: 3,
        max_ranks: 5,
        ..Limits::default()
    });
    let long = "x".repeat(9);
    assert_eq!(
        m.add_worker(&long, 1, ranks(0, 1)),
        Err(WorkerError::NameTooLong { len: 9, limit: 8 })
    );
    assert!(m.add_worker(&"x".repeat(10 << 20), 1, ranks(0, 1)).is_err());
    m.add_worker("12345678", 1, ranks(0, 4)).unwrap();
    assert_eq!(
        m.add_worker("a", 2, ranks(0, 2)),
        Err(WorkerError::RankBudget {
            dp_size: 2,
            limit: 5
        })
    );
    m.add_worker("a", 2, ranks(0, 1)).unwrap();
    m.add_worker("a", 3, ranks(0, 0)).unwrap();
    assert_eq!(
        m.add_worker("a", 4, ranks(0, 0)),
        Err(WorkerError::TooManyWorkers { limit: 3 })
    );
    // Removing a worker gives back its place and its ranks.
    m.remove_worker(1).unwrap();
    m.add_worker("a", 4, ranks(0, 4)).unwrap();
    assert_eq!(m.workers("a"), vec![2, 3, 4]);
    let refused: Vec<_> = m
        .refused_registrations()
        .into_iter()
        .filter(|(_, n)| *n > 0)
        .collect();
    assert_eq!(
        refused,
        vec![
            ("name_too_long", 2),
            ("too_many_workers", 1),
            ("rank_budget", 1)
        ]
    );
    assert!(m
        .metrics_text()
        .contains("dynamo_frontend_worker_registrations_refused_total{reason=\"rank_budget\"} 1"));
}

#[test]
fn a_full_model_table_drops_only_models_nothing_depends_on() {
    let m = monitor(Limits {
        max_models: 2,
        ..Limits::default()
    });
    m.add_worker("kept-by-worker", 1, ranks(0, 1)).unwrap();
    m.add_worker("kept-by-thresholds", 2, ranks(0, 1)).unwrap();
    let t = ThresholdUpdate {
        active_decode_blocks_threshold: Some(0.5),
        ..Default::default()
    };
    m.set_thresholds("kept-by-thresholds", &t).unwrap();
    m.remove_worker(2).unwrap();
    assert_eq!(
        m.add_worker("new", 3, ranks(0, 1)),
        Err(WorkerError::TooManyModels { limit: 2 }),
        "one model has a worker, the other its own thresholds"
    );
    assert_eq!(m.models(), vec!["kept-by-thresholds", "kept-by-worker"]);

    // A model with no workers and no settings makes room, unless a Route
    // handle still uses it.
    let m = monitor(Limits {
        max_models: 1,
        ..Limits::default()
    });
    m.add_worker("old", 1, ranks(0, 1)).unwrap();
    m.remove_worker(1).unwrap();
    let route = m.route("old").unwrap();
    assert_eq!(
        m.add_worker("new", 2, ranks(0, 1)),
        Err(WorkerError::TooManyModels { limit: 1 })
    );
    drop(route);
    m.add_worker("new", 2, ranks(0, 1)).unwrap();
    assert_eq!(m.models(), vec!["new"]);
    assert_eq!(m.select("new", Policy::RoundRobin), Ok(2));
}

#[test]
fn route_handles_count_against_the_model_limits() {
    // Handles made from names in requests must not grow the monitor.
    let m = monitor(Limits {
        max_models: 2,
        max_name_len: 8,
        ..Limits::default()
    });
    m.add_worker("served", 1, ranks(0, 1)).unwrap();
    assert_eq!(
        m.route("far-too-long").unwrap_err(),
        WorkerError::NameTooLong { len: 12, limit: 8 }
    );
    assert_eq!(m.route("").unwrap_err(), WorkerError::EmptyModel);
    let a = m.route("a").unwrap();
    assert_eq!(
        m.route("b").unwrap_err(),
        WorkerError::TooManyModels { limit: 2 },
        "one model has a worker, the other a handle"
    );
    assert_eq!(m.models(), vec!["a", "served"]);
    drop(a); // "a" is idle now: the next new model takes its place
    let b = m.route("b").unwrap();
    assert_eq!(m.models(), vec!["b", "served"]);
    assert_eq!(b.select(Policy::RoundRobin), Err(RouteError::Unavailable));
    // An existing model needs no room.
    assert_eq!(m.route("served").unwrap().select(Policy::RoundRobin), Ok(1));
}

#[test]
fn limits_out_of_range_are_refused_by_name() {
    for (limits, field) in [
        (
            Limits {
                max_models: 0,
                ..Limits::default()
            },
            "max_models",
        ),
        (
            Limits {
                max_ranks_per_worker: 0,
                ..Limits::default()
            },
            "max_ranks_per_worker",
        ),
        (
            Limits {
                max_workers_per_model: 1 << 30,
                ..Limits::default()
            },
            "max_workers_per_model",
        ),
    ] {
        let config = MonitorConfig {
            limits,
            ..Default::default()
        };
        let e = Monitor::with_config(config, ManualClock::new()).unwrap_err();
        assert_eq!(e.field, field);
    }
}

fn message(worker_id: u64, model: &str, dp_size: u32) -> LoadMessage {
    LoadMessage {
        v: SCHEMA_VERSION,
        instance: 1,
        seq: 1,
        worker_id,
        model: model.into(),
        dp_start: 0,
        dp_size,
        dp_rank: 0,
        kv_total_blocks: Some(100),
        max_num_batched_tokens: None,
        active_decode_blocks: None,
        kv_used_blocks: Some(1),
        active_prefill_tokens: None,
        waiting_requests: None,
        max_num_seqs: None,
    }
}

fn refused(s: &Subscriber, reason: &str) -> u64 {
    s.refusals()
        .iter()
        .find(|(r, _)| *r == reason)
        .map(|(_, n)| *n)
        .unwrap()
}

#[test]
fn hostile_messages_are_refused_and_counted_by_reason() {
    let m = monitor(Limits {
        max_models: 2,
        ..Limits::default()
    });
    let config = SubscriberConfig {
        max_payload: 1024,
        ..Default::default()
    };
    let s = Subscriber::new(m.clone(), config, ManualClock::new()).unwrap();

    // The one message that used to abort every frontend.
    let huge = message(1, "m", 1 << 31).to_msgpack();
    assert!(matches!(
        s.handle(&huge),
        Err(HandleError::Worker(WorkerError::TooManyRanks { .. }))
    ));
    assert!(matches!(
        s.handle(&message(1, &"x".repeat(300), 1).to_msgpack()),
        Err(HandleError::Worker(WorkerError::NameTooLong { .. }))
    ));
    assert!(matches!(
        s.handle(&vec![0x80; 1025]),
        Err(HandleError::Oversized {
            len: 1025,
            limit: 1024
        })
    ));
    // A worker may only speak for the id its subject names.
    assert_eq!(
        s.handle_on("loadgate.ns.load.7", &message(7, "m", 1).to_msgpack()),
        Ok(Applied::Announced)
    );
    assert!(matches!(
        s.handle_on("loadgate.ns.load.7", &message(8, "m", 1).to_msgpack()),
        Err(HandleError::Spoofed { worker_id: 8, .. })
    ));
    assert!(matches!(
        s.handle_on("loadgate.ns.load.x", &message(8, "m", 1).to_msgpack()),
        Err(HandleError::Spoofed { .. })
    ));
    assert!(
        m.rank_load(8, 0).is_err(),
        "the spoofed worker was not added"
    );
    for model in ["a", "b"] {
        let _ = s.handle(&message(100, model, 1).to_msgpack());
    }
    assert!(matches!(
        s.handle(&message(101, "c", 1).to_msgpack()),
        Err(HandleError::Worker(WorkerError::TooManyModels { limit: 2 }))
    ));

    assert_eq!(refused(&s, "too_many_ranks"), 1);
    assert_eq!(refused(&s, "name_too_long"), 1);
    assert_eq!(refused(&s, "oversized"), 1);
    assert_eq!(refused(&s, "spoofed"), 2);
    assert_eq!(refused(&s, "too_many_models"), 1);
    let stats = s.stats();
    assert_eq!((stats.malformed, stats.refused), (1, 5));
    let text = s.metrics_text();
    assert!(
        text.contains("dynamo_frontend_load_messages_refused_total{reason=\"spoofed\"} 2"),
        "{text}"
    );
}
