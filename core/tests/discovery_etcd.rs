//! Workers learned from Dynamo's discovery store in a real etcd (Debian's
//! etcd-server, started on loopback for each test): the records a Dynamo
//! 1.6.1 worker wrote to etcd (`tests/fixtures/dynamo-1.6.1/discovery/etcd`)
//! register its worker; a deleted card and an expired lease remove it; a
//! restarted etcd is reconnected to and listed afresh; hostile values are
//! counted and never registered.
#![cfg(feature = "etcd")]

#[allow(dead_code)] // each test binary uses part of the support code
mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use etcd_client::{Client, PutOptions};
use loadgate::discovery::etcd::{parse_endpoints, EtcdDiscovery, EtcdError, EtcdOptions};
use loadgate::discovery::{DiscoveryConfig, DiscoveryStats};
use loadgate::Monitor;
use support::etcd_server::EtcdServer;
use support::recorded::fixture;

/// The recorded worker's card: its key and value.
fn recorded_card() -> (String, String, u64) {
    let text = std::fs::read_to_string(fixture("discovery/etcd/records.json")).unwrap();
    let records: serde_json::Value = serde_json::from_str(&text).unwrap();
    let card = records["while_running"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["key"].as_str().unwrap().starts_with("v1/mdc/"))
        .expect("a recorded model card");
    assert_eq!(card["leased"], true, "Dynamo keeps its card on a lease");
    let key = card["key"].as_str().unwrap().to_owned();
    let id = u64::from_str_radix(key.rsplit('/').next().unwrap(), 16).unwrap();
    (key, card["value"].as_str().unwrap().to_owned(), id)
}

/// The same card for another instance id.
fn card_for(value: &str, from: u64, to: u64) -> (String, String) {
    let key = format!("v1/mdc/dynamo/backend/generate/{to:x}");
    (key, value.replace(&from.to_string(), &to.to_string()))
}

fn run<F: std::future::Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(f)
}

fn put(endpoint: &str, key: &str, value: &str, lease_ttl: Option<i64>) -> Option<i64> {
    run(async {
        let mut client = Client::connect([endpoint], None).await.unwrap();
        let lease = match lease_ttl {
            Some(ttl) => Some(client.lease_grant(ttl, None).await.unwrap().id()),
            None => None,
        };
        let options = lease.map(|id| PutOptions::new().with_lease(id));
        client.put(key, value, options).await.unwrap();
        lease
    })
}

fn delete(endpoint: &str, key: &str) {
    run(async {
        let mut client = Client::connect([endpoint], None).await.unwrap();
        client.delete(key, None).await.unwrap();
    })
}

fn wait_until(what: &str, d: &EtcdDiscovery, cond: impl Fn(&DiscoveryStats) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !cond(&d.stats()) {
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {what}: {:?}",
            d.stats()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn fast() -> DiscoveryConfig {
    DiscoveryConfig {
        interval: Duration::from_millis(50),
        ..Default::default()
    }
}

#[test]
fn the_recorded_card_registers_its_worker_and_etcd_changes_follow() {
    let mut etcd = EtcdServer::start();
    let endpoint = etcd.endpoint();
    let (key, value, id) = recorded_card();
    put(&endpoint, &key, &value, None);
    let monitor = Arc::new(Monitor::new());
    let endpoints = [endpoint.clone()];
    let mut d = EtcdDiscovery::start(
        Arc::clone(&monitor),
        &endpoints,
        fast(),
        EtcdOptions::default(),
    )
    .unwrap();
    // Registered when start returns: two ranks of 64 blocks.
    assert_eq!(monitor.workers("tiny"), vec![id]);
    assert_eq!(monitor.rank_load(id, 1).unwrap().kv_total_blocks, 64);
    assert!(monitor.rank_load(id, 2).is_err());
    assert_eq!(d.stats().workers, 1);

    // A second worker joins on a lease; the lease expires and it leaves.
    let (key2, value2) = card_for(&value, id, 0x1234);
    put(&endpoint, &key2, &value2, Some(1));
    wait_until("the second worker", &d, |s| s.workers == 2);
    wait_until("the lease to expire", &d, |s| s.workers == 1);
    assert_eq!(monitor.workers("tiny"), vec![id]);

    // A deleted card removes its worker.
    delete(&endpoint, &key);
    wait_until("the deletion", &d, |s| s.workers == 0);
    assert!(monitor.workers("tiny").is_empty());

    // etcd goes away and comes back with a card written meanwhile: the
    // watcher reconnects, lists afresh and registers it.
    put(&endpoint, &key, &value, None);
    wait_until("the card again", &d, |s| s.workers == 1);
    etcd.stop();
    wait_until("the broken watch to be seen", &d, |s| s.scan_errors >= 1);
    etcd.restart();
    put(&endpoint, &key2, &value2, None);
    wait_until("the card written while away", &d, |s| s.workers == 2);
    assert!(d.stats().scans >= 2, "{:?}", d.stats());

    // Closing removes what it registered.
    d.close();
    assert!(monitor.workers("tiny").is_empty());
}

#[test]
fn hostile_values_are_counted_and_a_dead_etcd_is_an_error_at_start() {
    let etcd = EtcdServer::start();
    let endpoint = etcd.endpoint();
    let (_, value, id) = recorded_card();
    put(&endpoint, "v1/mdc/dynamo/backend/generate/1", &value, None); // another id's card
    put(
        &endpoint,
        "v1/mdc/dynamo/backend/generate/2",
        "{not json",
        None,
    );
    put(
        &endpoint,
        "v1/mdc/dynamo/backend/generate/3",
        &" ".repeat(300),
        None,
    );
    let (_, other) = card_for(&value, id, 4);
    let other = other.replace("\"namespace\":\"dynamo\"", "\"namespace\":\"elsewhere\"");
    put(
        &endpoint,
        "v1/mdc/elsewhere/backend/generate/4",
        &other,
        None,
    );
    let config = DiscoveryConfig {
        max_record_bytes: 256,
        ..fast()
    };
    let monitor = Arc::new(Monitor::new());
    let d = EtcdDiscovery::start(
        Arc::clone(&monitor),
        std::slice::from_ref(&endpoint),
        config,
        EtcdOptions::default(),
    )
    .unwrap();
    let s = d.stats();
    // The recorded card is 1.7 KiB: over this watcher's 256-byte limit too.
    assert_eq!(s.workers, 0, "{s:?}");
    assert_eq!(s.refused_too_large, 3, "{s:?}");
    assert_eq!(s.refused_malformed, 1, "{s:?}");
    assert!(monitor.models().is_empty());
    drop(d);

    let d = EtcdDiscovery::start(
        Arc::clone(&monitor),
        &[endpoint],
        fast(),
        EtcdOptions::default(),
    )
    .unwrap();
    let s = d.stats();
    assert_eq!(s.workers, 0, "{s:?}");
    assert_eq!(
        (s.refused_mismatched, s.refused_malformed, s.skipped),
        (1, 2, 1),
        "{s:?}"
    );
    drop(d);

    let nowhere = ["http://127.0.0.1:1".to_owned()];
    let options = EtcdOptions {
        timeout: Duration::from_millis(300),
        ..Default::default()
    };
    let e = EtcdDiscovery::start(Arc::clone(&monitor), &nowhere, fast(), options).unwrap_err();
    assert!(matches!(e, EtcdError::Connect(_)), "{e}");
    let e = EtcdDiscovery::start(monitor, &[], fast(), EtcdOptions::default()).unwrap_err();
    assert_eq!(e, EtcdError::NoEndpoints);
}

#[test]
fn endpoints_and_credentials_are_checked_before_connecting() {
    assert_eq!(
        parse_endpoints(" http://a:1 ,, http://b:2,"),
        vec!["http://a:1".to_owned(), "http://b:2".to_owned()]
    );
    assert!(parse_endpoints(" , ").is_empty());
    let o = EtcdOptions::default()
        .with_credentials(Some("u"), Some("p"))
        .unwrap();
    assert_eq!(o.user, Some(("u".to_owned(), "p".to_owned())));
    for (user, password) in [(Some("u"), None), (None, Some("p"))] {
        let e = EtcdOptions::default()
            .with_credentials(user, password)
            .unwrap_err();
        assert_eq!(e, EtcdError::HalfCredentials);
    }
    let e = EtcdDiscovery::start(
        Arc::new(Monitor::new()),
        &parse_endpoints(" , "),
        fast(),
        EtcdOptions::default(),
    )
    .unwrap_err();
    assert_eq!(e, EtcdError::NoEndpoints);
}
