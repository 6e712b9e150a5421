//! The file backend's watcher: one thread listing `{path}/v1/mdc` every
//! interval and keeping the monitor's workers in step with the records.

use std::collections::HashMap;
use std::ffi::OsString;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::SystemTime;

use percent_encoding::percent_decode_str;

use super::card::{parse_card, DiscoveredWorker};
use super::{DiscoveryConfig, DiscoveryStats};
use crate::sync::lock;
use crate::Monitor;

/// Watches a Dynamo file-backend directory and registers the workers its
/// model cards describe (see the [module docs](super)). Stops on
/// [`close`](Self::close) or drop, which remove the workers it registered.
pub struct FileDiscovery {
    stats: Arc<Mutex<DiscoveryStats>>,
    stop: Option<mpsc::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl FileDiscovery {
    /// Reads the store at `path` once (so its workers are registered when
    /// this returns), then keeps watching it on a thread of its own.
    /// Fails only if the thread cannot be started.
    pub fn start(
        monitor: Arc<Monitor>,
        path: impl Into<PathBuf>,
        config: DiscoveryConfig,
    ) -> std::io::Result<Self> {
        let stats = Arc::new(Mutex::new(DiscoveryStats::default()));
        let mut watcher = Watcher {
            dir: path.into().join("v1").join("mdc"),
            config,
            monitor,
            stats: Arc::clone(&stats),
            known: HashMap::new(),
        };
        watcher.scan(SystemTime::now());
        let (stop, stopped) = mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("loadgate-discovery".to_owned())
            .spawn(move || {
                while let Err(RecvTimeoutError::Timeout) =
                    stopped.recv_timeout(watcher.config.interval)
                {
                    watcher.scan(SystemTime::now());
                }
                watcher.forget_all();
            })?;
        Ok(Self {
            stats,
            stop: Some(stop),
            thread: Some(thread),
        })
    }

    /// What the watcher has done so far.
    pub fn stats(&self) -> DiscoveryStats {
        lock(&self.stats).clone()
    }

    /// Stops watching, removes the workers it registered from the monitor,
    /// and waits for the thread (at most one listing). Idempotent.
    pub fn close(&mut self) {
        drop(self.stop.take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for FileDiscovery {
    fn drop(&mut self) {
        self.close();
    }
}

impl std::fmt::Debug for FileDiscovery {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FileDiscovery")
            .field("stats", &self.stats())
            .finish()
    }
}

/// What the watcher last saw of one record.
struct Seen {
    /// Modification time and size: the record is read again when they change.
    stamp: (SystemTime, u64),
    /// The worker it registered from this record, if any.
    registered: Option<DiscoveredWorker>,
}

struct Watcher {
    dir: PathBuf,
    config: DiscoveryConfig,
    monitor: Arc<Monitor>,
    stats: Arc<Mutex<DiscoveryStats>>,
    known: HashMap<OsString, Seen>,
}

impl Watcher {
    fn scan(&mut self, now: SystemTime) {
        let mut stats = lock(&self.stats).clone();
        stats.scans += 1;
        let listing = match std::fs::read_dir(&self.dir) {
            Ok(listing) => Some(listing),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => {
                stats.scan_errors += 1;
                stats.last_error = Some(format!("listing {}: {e}", self.dir.display()));
                *lock(&self.stats) = stats;
                return;
            }
        };
        let mut live: HashMap<OsString, (SystemTime, u64)> = HashMap::new();
        for entry in listing.into_iter().flatten().flatten() {
            let Ok(meta) = entry.metadata() else { continue };
            if !meta.is_file() {
                continue;
            }
            let modified = meta.modified().unwrap_or(now);
            let stale = self
                .config
                .ttl
                .is_some_and(|ttl| now.duration_since(modified).is_ok_and(|age| age > ttl));
            if stale {
                continue;
            }
            if live.len() == self.config.max_records {
                stats.refused_over_limit += 1;
                continue;
            }
            live.insert(entry.file_name(), (modified, meta.len()));
        }
        // Records gone (deleted, stale, or beyond the limit) first, so that
        // a worker whose record moved is free to register again.
        let gone: Vec<OsString> = self
            .known
            .keys()
            .filter(|name| !live.contains_key(*name))
            .cloned()
            .collect();
        for name in gone {
            if let Some(seen) = self.known.remove(&name) {
                self.unregister(seen.registered, &mut stats);
            }
        }
        for (name, stamp) in live {
            if self.known.get(&name).is_some_and(|s| s.stamp == stamp) {
                continue;
            }
            let previous = self.known.remove(&name).and_then(|s| s.registered);
            let found = self.read(&name, stamp.1, &mut stats);
            let registered = match (previous, found) {
                (Some(old), Some(new)) if old == new => Some(old),
                (old, new) => {
                    self.unregister(old, &mut stats);
                    new.and_then(|w| self.register(w, &mut stats))
                }
            };
            self.known.insert(name, Seen { stamp, registered });
        }
        stats.workers = self
            .known
            .values()
            .filter(|s| s.registered.is_some())
            .count() as u64;
        *lock(&self.stats) = stats;
    }

    /// The worker record `name` describes, if it is one to register.
    fn read(
        &self,
        name: &OsString,
        len: u64,
        stats: &mut DiscoveryStats,
    ) -> Option<DiscoveredWorker> {
        if len > self.config.max_record_bytes {
            stats.refused_too_large += 1;
            return None;
        }
        let key = percent_decode_str(&name.to_string_lossy())
            .decode_utf8_lossy()
            .into_owned();
        let value = match read_bounded(&self.dir.join(name), self.config.max_record_bytes) {
            Ok(Some(value)) => value,
            Ok(None) => {
                stats.refused_too_large += 1;
                return None;
            }
            Err(e) => {
                stats.last_error = Some(format!("reading {key}: {e}"));
                return None;
            }
        };
        match parse_card(&key, &value) {
            Ok(worker) if self.config.wants(&worker) => Some(worker),
            Ok(_) => {
                stats.skipped += 1;
                None
            }
            Err(e) => {
                match e.kind() {
                    "mismatched" => stats.refused_mismatched += 1,
                    _ => stats.refused_malformed += 1,
                }
                stats.last_error = Some(format!("{key}: {e}"));
                None
            }
        }
    }

    /// Removes every worker this watcher registered.
    fn forget_all(&mut self) {
        let mut stats = lock(&self.stats).clone();
        for (_, seen) in std::mem::take(&mut self.known) {
            self.unregister(seen.registered, &mut stats);
        }
        stats.workers = 0;
        *lock(&self.stats) = stats;
    }

    fn register(
        &self,
        worker: DiscoveredWorker,
        stats: &mut DiscoveryStats,
    ) -> Option<DiscoveredWorker> {
        match self
            .monitor
            .add_worker(&worker.model, worker.instance_id, worker.spec)
        {
            Ok(()) => {
                stats.workers_added += 1;
                Some(worker)
            }
            Err(e) => {
                stats.refused_registration += 1;
                stats.last_error = Some(format!(
                    "registering worker {} of {:?}: {e}",
                    worker.instance_id, worker.model
                ));
                None
            }
        }
    }

    fn unregister(&self, worker: Option<DiscoveredWorker>, stats: &mut DiscoveryStats) {
        if let Some(worker) = worker {
            // Someone else may have removed it already; it is gone either way.
            let _ = self.monitor.remove_worker(worker.instance_id);
            stats.workers_removed += 1;
        }
    }
}

/// The file's bytes, or `None` if it has grown past `limit` since it was
/// listed; never reads more than `limit + 1` bytes.
fn read_bounded(path: &Path, limit: u64) -> std::io::Result<Option<Vec<u8>>> {
    let mut value = Vec::new();
    std::fs::File::open(path)?
        .take(limit + 1)
        .read_to_end(&mut value)?;
    Ok((value.len() as u64 <= limit).then_some(value))
}
