//! The file backend's watcher: one thread listing `{path}/v1/mdc` every
//! interval and keeping the monitor's workers in step with the records.

use std::collections::HashMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::SystemTime;

use percent_encoding::percent_decode_str;

use super::registrar::{Registrar, Value};
use super::{lock, DiscoveryConfig, DiscoveryStats};
use crate::fork::ForkGuard;
use crate::Monitor;

/// Watches a Dynamo file-backend directory and registers the workers its
/// model cards describe (see the [module docs](super)). Stops on
/// [`close`](Self::close) or drop, which remove the workers it registered.
pub struct FileDiscovery {
    stats: Arc<Mutex<DiscoveryStats>>,
    stop: Option<mpsc::Sender<()>>,
    thread: Option<JoinHandle<()>>,
    /// The process that started the thread: a forked child has none to
    /// stop or wait for.
    made_in: ForkGuard,
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
        let interval = config.interval;
        let mut watcher = Watcher {
            dir: path.into().join("v1").join("mdc"),
            registrar: Registrar::new(config, monitor, Arc::clone(&stats)),
            stamps: HashMap::new(),
        };
        watcher.scan(SystemTime::now());
        let (stop, stopped) = mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("loadgate-discovery".to_owned())
            .spawn(move || {
                while let Err(RecvTimeoutError::Timeout) = stopped.recv_timeout(interval) {
                    watcher.scan(SystemTime::now());
                }
                watcher.registrar.forget_all();
            })?;
        Ok(Self {
            stats,
            stop: Some(stop),
            thread: Some(thread),
            made_in: ForkGuard::new(),
        })
    }

    /// What the watcher has done so far.
    pub fn stats(&self) -> DiscoveryStats {
        lock(&self.stats).clone()
    }

    /// Stops watching, removes the workers it registered from the monitor,
    /// and waits for the thread (at most one listing). Idempotent. In a
    /// forked child, where the thread is not, it only lets the thread's
    /// handle go.
    pub fn close(&mut self) {
        drop(self.stop.take());
        if let Some(thread) = self.thread.take() {
            if self.made_in.same_process() {
                let _ = thread.join();
            } else {
                std::mem::forget(thread);
            }
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

struct Watcher {
    dir: PathBuf,
    registrar: Registrar,
    /// Each record's modification time and size when last read: a record
    /// is read again when they change.
    stamps: HashMap<String, (SystemTime, u64)>,
}

impl Watcher {
    fn scan(&mut self, now: SystemTime) {
        self.registrar.count(|s| s.scans += 1);
        let listing = match std::fs::read_dir(&self.dir) {
            Ok(listing) => Some(listing),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => {
                let error = format!("listing {}: {e}", self.dir.display());
                self.registrar.count(|s| {
                    s.scan_errors += 1;
                    s.last_error = Some(error);
                });
                return;
            }
        };
        let config = &self.registrar.config;
        let mut live: HashMap<String, (SystemTime, u64)> = HashMap::new();
        let mut over_limit = 0;
        for entry in listing.into_iter().flatten().flatten() {
            let Ok(meta) = entry.metadata() else { continue };
            if !meta.is_file() {
                continue;
            }
            let modified = meta.modified().unwrap_or(now);
            let stale = config
                .ttl
                .is_some_and(|ttl| now.duration_since(modified).is_ok_and(|age| age > ttl));
            if stale {
                continue;
            }
            if live.len() == config.max_records {
                over_limit += 1;
                continue;
            }
            let name = entry.file_name().to_string_lossy().into_owned();
            live.insert(name, (modified, meta.len()));
        }
        self.registrar.count(|s| s.refused_over_limit += over_limit);
        // Records gone (deleted, stale, or beyond the limit) first, so that
        // a worker whose record moved is free to register again.
        self.registrar.keep_only(|name| live.contains_key(name));
        self.stamps.retain(|name, _| live.contains_key(name));
        for (name, stamp) in live {
            if self.stamps.get(&name) == Some(&stamp) {
                continue;
            }
            let key = percent_decode_str(&name).decode_utf8_lossy().into_owned();
            if stamp.1 > self.registrar.config.max_record_bytes {
                self.registrar.put(&name, &key, Value::TooLarge);
            } else {
                let limit = self.registrar.config.max_record_bytes;
                match read_bounded(&self.dir.join(&name), limit) {
                    Ok(Some(bytes)) => self.registrar.put(&name, &key, Value::Bytes(&bytes)),
                    Ok(None) => self.registrar.put(&name, &key, Value::TooLarge),
                    Err(e) => {
                        // Deleted since the listing, most likely: the next
                        // listing settles it.
                        let error = format!("reading {key}: {e}");
                        self.registrar.count(|s| s.last_error = Some(error));
                        continue;
                    }
                }
            }
            self.stamps.insert(name, stamp);
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
