//! What every discovery backend shares: records in, workers registered in
//! the monitor out. A backend says which records exist and what they hold
//! ([`Registrar::put`], [`Registrar::delete`], [`Registrar::keep_only`]);
//! the registrar parses each card, keeps the workers it registered keyed
//! by record, and counts everything in [`DiscoveryStats`].

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use super::card::{parse_card, CardError, DiscoveredWorker};
use super::{lock, DiscoveryConfig, DiscoveryStats};
use crate::Monitor;

/// A record's value as a backend found it.
pub(super) enum Value<'a> {
    /// The record's bytes.
    Bytes(&'a [u8]),
    /// Over `max_record_bytes`: refused unread.
    TooLarge,
}

pub(super) struct Registrar {
    pub(super) config: DiscoveryConfig,
    monitor: Arc<Monitor>,
    stats: Arc<Mutex<DiscoveryStats>>,
    /// Every record seen, by the backend's id for it, with the worker it
    /// registered (`None`: refused, skipped, or not registered).
    known: HashMap<String, Option<DiscoveredWorker>>,
}

impl Registrar {
    pub(super) fn new(
        config: DiscoveryConfig,
        monitor: Arc<Monitor>,
        stats: Arc<Mutex<DiscoveryStats>>,
    ) -> Self {
        Self {
            config,
            monitor,
            stats,
            known: HashMap::new(),
        }
    }

    /// Runs `f` on the shared counters.
    pub(super) fn count(&self, f: impl FnOnce(&mut DiscoveryStats)) {
        f(&mut lock(&self.stats));
    }

    /// Whether record `id` has been seen.
    pub(super) fn knows(&self, id: &str) -> bool {
        self.known.contains_key(id)
    }

    /// Record `id` (its card's key `key`) now holds `value`: registers its
    /// worker, re-registers it if the card changed, or removes it if the
    /// record no longer describes one to register. A new record beyond
    /// `max_records` is counted and ignored.
    pub(super) fn put(&mut self, id: &str, key: &str, value: Value<'_>) {
        if !self.knows(id) && self.known.len() >= self.config.max_records {
            self.count(|s| s.refused_over_limit += 1);
            return;
        }
        let found = self.read(key, value);
        let previous = self.known.remove(id).flatten();
        let registered = match (previous, found) {
            (Some(old), Some(new)) if old == new => Some(old),
            (old, new) => {
                self.unregister(old);
                new.and_then(|w| self.register(w))
            }
        };
        self.known.insert(id.to_owned(), registered);
        self.publish_workers();
    }

    /// Record `id` is gone: its worker, if registered, is removed.
    pub(super) fn delete(&mut self, id: &str) {
        if let Some(registered) = self.known.remove(id) {
            self.unregister(registered);
            self.publish_workers();
        }
    }

    /// Every record not in `live` is gone.
    pub(super) fn keep_only(&mut self, live: impl Fn(&str) -> bool) {
        let gone: Vec<String> = self.known.keys().filter(|id| !live(id)).cloned().collect();
        for id in gone {
            self.delete(&id);
        }
    }

    /// Removes every worker this registrar registered.
    pub(super) fn forget_all(&mut self) {
        for (_, registered) in std::mem::take(&mut self.known) {
            self.unregister(registered);
        }
        self.publish_workers();
    }

    /// The worker the card under `key` describes, if it is one to register.
    fn read(&self, key: &str, value: Value<'_>) -> Option<DiscoveredWorker> {
        let Value::Bytes(bytes) = value else {
            self.count(|s| s.refused_too_large += 1);
            return None;
        };
        match parse_card(key, bytes) {
            Ok(worker) if self.config.wants(&worker) => Some(worker),
            Ok(_) => {
                self.count(|s| s.skipped += 1);
                None
            }
            Err(e) => {
                self.count(|s| {
                    match e {
                        CardError::Mismatched(_) => s.refused_mismatched += 1,
                        CardError::Malformed(_) => s.refused_malformed += 1,
                    }
                    s.last_error = Some(format!("{key}: {e}"));
                });
                None
            }
        }
    }

    fn register(&self, worker: DiscoveredWorker) -> Option<DiscoveredWorker> {
        match self
            .monitor
            .add_worker(&worker.model, worker.instance_id, worker.spec)
        {
            Ok(()) => {
                self.count(|s| s.workers_added += 1);
                Some(worker)
            }
            Err(e) => {
                self.count(|s| {
                    s.refused_registration += 1;
                    s.last_error = Some(format!(
                        "registering worker {} of {:?}: {e}",
                        worker.instance_id, worker.model
                    ));
                });
                None
            }
        }
    }

    fn unregister(&self, worker: Option<DiscoveredWorker>) {
        if let Some(worker) = worker {
            // Someone else may have removed it already; it is gone either way.
            let _ = self.monitor.remove_worker(worker.instance_id);
            self.count(|s| s.workers_removed += 1);
        }
    }

    fn publish_workers(&self) {
        let workers = self.known.values().filter(|w| w.is_some()).count() as u64;
        self.count(|s| s.workers = workers);
    }
}
