//! Workers learned from Dynamo's file-backend discovery store: the model
//! cards a real Dynamo 1.6.1 wrote (`tests/fixtures/dynamo-1.6.1/discovery`)
//! register their workers with their ranks and capacities, the recorded load
//! events of those workers then apply with no `add_worker` call, and records
//! that disappear, go stale or are hostile are handled as the module docs
//! say.

#[allow(dead_code)] // each test binary uses part of the support code
mod support;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use base64::Engine as _;
use loadgate::cluster::wire::{decode, Decoded};
use loadgate::discovery::{DiscoveryConfig, DiscoveryStats, FileDiscovery};
use loadgate::{LoadReport, Monitor};
use support::recorded::fixture;

/// The workers of the recording: one rank, two ranks, and (started after
/// the other two were gone) one rank with a prefill batch of 512 tokens.
const ONE_RANK: u64 = 0x8407_4162_003d_704a;
const TWO_RANKS: u64 = 0xfb1e_e5f8_0665_0f6a;
const LATER: u64 = 0x636e_8b09_d651_9ba7;

/// A fresh copy of the recorded stores, all three workers' cards (files
/// written now, so not stale).
fn store(name: &str) -> PathBuf {
    let root =
        std::env::temp_dir().join(format!("loadgate-discovery-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    let mdc = root.join("v1/mdc");
    std::fs::create_dir_all(&mdc).unwrap();
    for recorded in ["discovery/kv/v1/mdc", "discovery/kv-worker3/v1/mdc"] {
        for entry in std::fs::read_dir(fixture(recorded)).unwrap() {
            let entry = entry.unwrap();
            std::fs::copy(entry.path(), mdc.join(entry.file_name())).unwrap();
        }
    }
    root
}

fn record(root: &Path, id: u64) -> PathBuf {
    root.join(format!("v1/mdc/dynamo%2Fbackend%2Fgenerate%2F{id:x}"))
}

fn fast() -> DiscoveryConfig {
    DiscoveryConfig {
        interval: Duration::from_millis(20),
        ..Default::default()
    }
}

fn wait_until(what: &str, discovery: &FileDiscovery, cond: impl Fn(&DiscoveryStats) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !cond(&discovery.stats()) {
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {what}: {:?}",
            discovery.stats()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn recorded_cards_register_their_workers_and_the_recorded_load_applies() {
    let root = store("recorded");
    let monitor = Arc::new(Monitor::new());
    let discovery = FileDiscovery::start(Arc::clone(&monitor), &root, fast()).unwrap();
    // Registered before start returns.
    let mut workers = monitor.workers("tiny");
    workers.sort_unstable();
    assert_eq!(workers, vec![LATER, ONE_RANK, TWO_RANKS]);
    let stats = discovery.stats();
    assert_eq!((stats.workers, stats.workers_added), (3, 3), "{stats:?}");
    for (id, ranks, batch) in [(ONE_RANK, 1, 8192), (TWO_RANKS, 2, 8192), (LATER, 1, 512)] {
        for rank in 0..ranks {
            let load = monitor.rank_load(id, rank).unwrap();
            assert_eq!(load.kv_total_blocks, 64);
            assert_eq!(load.max_num_batched_tokens, batch);
        }
        assert!(monitor.rank_load(id, ranks).is_err(), "no rank {ranks}");
    }

    // Every recorded kv_metrics envelope of those workers applies.
    let text = std::fs::read_to_string(fixture("nats/messages.jsonl")).unwrap();
    let mut applied = 0;
    for line in text.lines().filter(|l| l.contains(".kv_metrics\"")) {
        let message: serde_json::Value = serde_json::from_str(line).unwrap();
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(message["payload_b64"].as_str().unwrap())
            .unwrap();
        let Ok(Decoded::Envelope(e)) = decode(&bytes) else {
            panic!("not an envelope")
        };
        let report = LoadReport {
            kv_used_blocks: e.load.kv_used_blocks,
            ..Default::default()
        };
        monitor
            .report(e.load.worker_id, e.load.dp_rank, &report)
            .unwrap_or_else(|err| panic!("worker {:x}: {err}", e.load.worker_id));
        applied += 1;
    }
    assert!(applied >= 10, "{applied} envelopes");

    // A worker whose record is deleted leaves.
    std::fs::remove_file(record(&root, ONE_RANK)).unwrap();
    wait_until("the deleted record's worker to leave", &discovery, |s| {
        s.workers == 2
    });
    assert!(!monitor.workers("tiny").contains(&ONE_RANK));

    // A worker that stops refreshing its record leaves after the ttl.
    let old = SystemTime::now() - Duration::from_secs(11);
    std::fs::File::options()
        .write(true)
        .open(record(&root, TWO_RANKS))
        .unwrap()
        .set_modified(old)
        .unwrap();
    wait_until("the stale record's worker to leave", &discovery, |s| {
        s.workers == 1
    });
    assert_eq!(monitor.workers("tiny"), vec![LATER]);
    assert_eq!(discovery.stats().workers_removed, 2);
    std::fs::remove_dir_all(&root).unwrap();
}

#[test]
fn a_worker_that_appears_later_is_registered_and_a_changed_card_re_registers() {
    let root = store("later");
    let card = std::fs::read(record(&root, ONE_RANK)).unwrap();
    std::fs::remove_file(record(&root, ONE_RANK)).unwrap();
    let monitor = Arc::new(Monitor::new());
    let discovery = FileDiscovery::start(Arc::clone(&monitor), &root, fast()).unwrap();
    assert!(!monitor.workers("tiny").contains(&ONE_RANK));
    std::fs::write(record(&root, ONE_RANK), &card).unwrap();
    wait_until("the new worker", &discovery, |s| s.workers == 3);
    // The same worker with more KV blocks: removed and registered again.
    let bigger = String::from_utf8(card)
        .unwrap()
        .replace("\"total_kv_blocks\":64", "\"total_kv_blocks\":128");
    std::fs::write(record(&root, ONE_RANK), bigger).unwrap();
    wait_until("the changed card", &discovery, |s| s.workers_added == 4);
    assert_eq!(monitor.rank_load(ONE_RANK, 0).unwrap().kv_total_blocks, 128);
    assert_eq!(discovery.stats().workers, 3);
    drop(discovery);
    std::fs::remove_dir_all(&root).unwrap();
}

#[test]
fn hostile_and_foreign_records_are_counted_and_never_registered() {
    let root = store("hostile");
    let card = std::fs::read_to_string(record(&root, ONE_RANK)).unwrap();
    let mdc = root.join("v1/mdc");
    // Too large: a sparse file of 2 MiB is refused unread.
    std::fs::File::create(mdc.join("big"))
        .unwrap()
        .set_len(2 << 20)
        .unwrap();
    std::fs::write(mdc.join("garbage"), b"\xff{not json").unwrap();
    // Another worker's card under a key naming a third.
    std::fs::write(mdc.join("dynamo%2Fbackend%2Fgenerate%2F1"), &card).unwrap();
    // Another namespace's worker.
    let other = card
        .replace("\"namespace\":\"dynamo\"", "\"namespace\":\"other\"")
        .replace(&format!("{ONE_RANK}"), "2");
    std::fs::write(mdc.join("other%2Fbackend%2Fgenerate%2F2"), other).unwrap();
    std::fs::create_dir(mdc.join("a-directory")).unwrap();

    let monitor = Arc::new(Monitor::new());
    let discovery = FileDiscovery::start(Arc::clone(&monitor), &root, fast()).unwrap();
    let s = discovery.stats();
    assert_eq!(s.workers, 3, "{s:?}");
    assert_eq!(s.refused_too_large, 1, "{s:?}");
    assert_eq!(s.refused_malformed, 1, "{s:?}");
    assert_eq!(s.refused_mismatched, 1, "{s:?}");
    assert_eq!(s.skipped, 1, "{s:?}");
    assert_eq!(monitor.models(), vec!["tiny".to_owned()]);
    drop(discovery);

    // At most max_records per listing.
    let limited = DiscoveryConfig {
        max_records: 1,
        ..fast()
    };
    let monitor = Arc::new(Monitor::new());
    let discovery = FileDiscovery::start(Arc::clone(&monitor), &root, limited).unwrap();
    let s = discovery.stats();
    assert!(s.workers <= 1 && s.refused_over_limit >= 6, "{s:?}");
    drop(discovery);

    // A missing directory is an empty store, not an error.
    let monitor = Arc::new(Monitor::new());
    let discovery = FileDiscovery::start(monitor, root.join("nowhere"), fast()).unwrap();
    let s = discovery.stats();
    assert_eq!((s.workers, s.scan_errors), (0, 0));
    std::fs::remove_dir_all(&root).unwrap();
}

#[test]
fn a_worker_the_monitor_already_has_is_counted_not_taken_over_and_close_removes_only_its_own() {
    let root = store("duplicate");
    let monitor = Arc::new(Monitor::new());
    monitor
        .add_worker("tiny", ONE_RANK, loadgate::WorkerSpec::default())
        .unwrap();
    let mut discovery = FileDiscovery::start(Arc::clone(&monitor), &root, fast()).unwrap();
    let s = discovery.stats();
    assert_eq!((s.workers, s.refused_registration), (2, 1), "{s:?}");
    assert!(s.last_error.unwrap().contains(&ONE_RANK.to_string()));
    discovery.close();
    // Closing removes the workers it registered, and only those.
    discovery.close();
    assert_eq!(monitor.workers("tiny"), vec![ONE_RANK]);
    assert_eq!(discovery.stats().workers, 0);
    std::fs::remove_dir_all(&root).unwrap();
}

#[test]
fn settings_are_checked_before_anything_starts() {
    use loadgate::discovery::SettingsError;
    let c = DiscoveryConfig::for_endpoints(None, Some("backend"), None).unwrap();
    assert_eq!(
        (c.namespace.as_str(), c.component.as_deref(), c.endpoint),
        ("dynamo", Some("backend"), None)
    );
    let e = DiscoveryConfig::for_endpoints(Some(""), None, None).unwrap_err();
    assert_eq!(e, SettingsError::EmptyNamespace);
    assert_eq!(e.to_string(), "namespace must not be empty");
}
