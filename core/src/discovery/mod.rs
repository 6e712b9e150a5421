//! Workers and capacities learned from Dynamo's discovery store, so that a
//! monitor beside Dynamo 1.6.1 workers needs no `add_worker` glue.
//!
//! Each Dynamo worker writes its model card under `v1/mdc/` in the store
//! ([`parse_card`] reads one): the model it serves, its instance id (the
//! `worker_id` of its load events), its data-parallel ranks, its KV blocks,
//! its prefill batch size and its seats (`max_num_seqs`). With feature
//! `etcd`, `etcd::EtcdDiscovery` watches the cards in etcd (Dynamo's
//! default backend), where leases
//! remove a dead worker's card. [`FileDiscovery`] watches the file backend's
//! directory (`DYN_FILE_KV`, else `$TMPDIR/dynamo_store_kv`, as Dynamo
//! chooses it): a card that appears registers its worker in the monitor, a
//! card that changes re-registers it, and a card that disappears, or that
//! its worker stopped refreshing for `ttl`, removes it. Dynamo's workers
//! rewrite their records about every 3.3 s and a killed worker's records are
//! deleted about 10 s after their last refresh, which the default `ttl`
//! matches, so a dead worker leaves even when no Dynamo process is left to
//! delete its files. Closing the watcher removes the workers it registered.
//!
//! The watcher polls: one directory listing per `interval` (0.5 s by
//! default), reading only the files whose size or modification time changed.
//! Every input is bounded: records over `max_record_bytes` are refused
//! unread, at most `max_records` are considered per listing, and the
//! monitor's own limits bound models, workers, ranks and names. Refusals are
//! counted by reason in [`DiscoveryStats`]; nothing in the store can make
//! the watcher panic or allocate beyond those bounds.
//!
//! Files: `card.rs` (one record), `registrar.rs` (records to registered
//! workers, shared by the backends), `file.rs` (the directory watcher),
//! `etcd.rs` (the etcd watcher, feature `etcd`).

mod card;
#[cfg(feature = "etcd")]
pub mod etcd;
mod file;
mod registrar;

use std::path::PathBuf;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

pub use card::{parse_card, CardError, DiscoveredWorker};
pub use file::FileDiscovery;

/// The environment variable naming the file backend's directory.
pub const FILE_KV_ENV: &str = "DYN_FILE_KV";

/// The file backend's directory as Dynamo chooses it: `DYN_FILE_KV`, else
/// `dynamo_store_kv` in the system's temporary directory.
pub fn default_file_kv_path() -> PathBuf {
    match std::env::var_os(FILE_KV_ENV) {
        Some(path) if !path.is_empty() => PathBuf::from(path),
        _ => std::env::temp_dir().join("dynamo_store_kv"),
    }
}

/// What to learn and how often.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiscoveryConfig {
    /// The Dynamo namespace whose workers to learn (`dynamo` by default).
    pub namespace: String,
    /// Only this component's workers (`None`: any component).
    pub component: Option<String>,
    /// Only this endpoint's workers (`None`: any endpoint).
    pub endpoint: Option<String>,
    /// Time between two listings of the store.
    pub interval: Duration,
    /// A record its worker has not refreshed for this long is taken as gone
    /// (`None`: only a deleted record removes its worker).
    pub ttl: Option<Duration>,
    /// Records larger than this are refused unread.
    pub max_record_bytes: u64,
    /// At most this many records are considered per listing; the rest are
    /// counted and ignored.
    pub max_records: usize,
}

impl Default for DiscoveryConfig {
    fn default() -> Self {
        Self {
            namespace: "dynamo".to_owned(),
            component: None,
            endpoint: None,
            interval: Duration::from_millis(500),
            ttl: Some(Duration::from_secs(10)),
            max_record_bytes: 1 << 20,
            max_records: 16_384,
        }
    }
}

/// Discovery settings refused before anything starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SettingsError {
    /// An empty namespace.
    EmptyNamespace,
}

impl std::fmt::Display for SettingsError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SettingsError::EmptyNamespace => f.write_str("namespace must not be empty"),
        }
    }
}

impl std::error::Error for SettingsError {}

impl DiscoveryConfig {
    /// The defaults, for the workers of `namespace` (`None`: `dynamo`) and,
    /// when given, of `component` and `endpoint`.
    pub fn for_endpoints(
        namespace: Option<&str>,
        component: Option<&str>,
        endpoint: Option<&str>,
    ) -> Result<Self, SettingsError> {
        let mut config = Self::default();
        if let Some(namespace) = namespace {
            if namespace.is_empty() {
                return Err(SettingsError::EmptyNamespace);
            }
            config.namespace = namespace.to_owned();
        }
        config.component = component.map(str::to_owned);
        config.endpoint = endpoint.map(str::to_owned);
        Ok(config)
    }

    /// Whether a worker of `worker`'s namespace, component and endpoint is
    /// one to learn.
    fn wants(&self, worker: &DiscoveredWorker) -> bool {
        worker.namespace == self.namespace
            && self
                .component
                .as_ref()
                .is_none_or(|c| *c == worker.component)
            && self.endpoint.as_ref().is_none_or(|e| *e == worker.endpoint)
    }
}

/// The counters, as a panicking holder left them (they are plain numbers).
/// A std mutex even in loom builds: the watchers are cold-path threads that
/// no loom model runs.
fn lock(stats: &Mutex<DiscoveryStats>) -> MutexGuard<'_, DiscoveryStats> {
    stats.lock().unwrap_or_else(PoisonError::into_inner)
}

/// What a watcher has done so far.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DiscoveryStats {
    /// Listings of the store.
    pub scans: u64,
    /// Listings that failed (the directory unreadable; a missing directory
    /// is an empty store, not an error).
    pub scan_errors: u64,
    /// Workers registered now by this watcher.
    pub workers: u64,
    /// Workers registered so far.
    pub workers_added: u64,
    /// Workers removed so far (record deleted, stale, or changed).
    pub workers_removed: u64,
    /// Records of other namespaces, components or endpoints.
    pub skipped: u64,
    /// Records refused: over `max_record_bytes`.
    pub refused_too_large: u64,
    /// Records refused: not a model card.
    pub refused_malformed: u64,
    /// Records refused: key and card name different workers.
    pub refused_mismatched: u64,
    /// Records ignored beyond `max_records` in one listing.
    pub refused_over_limit: u64,
    /// Workers the monitor refused to register (a duplicate id, a limit).
    pub refused_registration: u64,
    /// The last error, as text.
    pub last_error: Option<String>,
}

/// A running discovery of either backend, as the bindings hold it.
#[derive(Debug)]
pub enum Discovery {
    /// The file backend's watcher.
    File(FileDiscovery),
    /// The etcd backend's watcher.
    #[cfg(feature = "etcd")]
    Etcd(etcd::EtcdDiscovery),
}

impl Discovery {
    /// What the watcher has done so far.
    pub fn stats(&self) -> DiscoveryStats {
        match self {
            Discovery::File(d) => d.stats(),
            #[cfg(feature = "etcd")]
            Discovery::Etcd(d) => d.stats(),
        }
    }

    /// Stops watching and removes the workers it registered. Idempotent.
    pub fn close(&mut self) {
        match self {
            Discovery::File(d) => d.close(),
            #[cfg(feature = "etcd")]
            Discovery::Etcd(d) => d.close(),
        }
    }
}
