//! The etcd backend's watcher (feature `etcd`): Dynamo's workers keep their
//! model cards under `v1/mdc/{namespace}/{component}/{endpoint}/{id in
//! hex}` on a lease, which etcd deletes when the worker stops renewing it,
//! so a dead worker's card goes by itself and no `ttl` is needed.
//!
//! The watcher lists the prefix once (so the store's workers are registered
//! when [`EtcdDiscovery::start`] returns), then watches it from the next
//! revision: every put registers or re-registers, every delete removes. A
//! broken connection or a cancelled watch (a compaction) is followed by a
//! new connection and a fresh listing, which also removes the workers whose
//! cards went meanwhile. It runs on the shared I/O runtime
//! (`runtime.rs`), with `etcd-client` (tonic) as the client.

use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

use etcd_client::{Client, ConnectOptions, EventType, GetOptions, WatchOptions};
use tokio::sync::oneshot;

use super::registrar::{Registrar, Value};
use super::{lock, DiscoveryConfig, DiscoveryStats};
use crate::fork::ForkGuard;
use crate::Monitor;

/// The prefix of Dynamo's model cards in the store.
pub const MDC_PREFIX: &str = "v1/mdc/";

/// The environment variable Dynamo reads etcd's endpoints from
/// (comma-separated).
pub const ENDPOINTS_ENV: &str = "ETCD_ENDPOINTS";

/// The endpoints of a comma-separated list, trimmed, empty ones left out.
pub fn parse_endpoints(list: &str) -> Vec<String> {
    list.split(',')
        .map(str::trim)
        .filter(|e| !e.is_empty())
        .map(str::to_owned)
        .collect()
}

/// etcd's endpoints as Dynamo chooses them: `ETCD_ENDPOINTS`
/// (comma-separated), else `http://localhost:2379`.
pub fn default_endpoints() -> Vec<String> {
    let listed = parse_endpoints(&std::env::var(ENDPOINTS_ENV).unwrap_or_default());
    if listed.is_empty() {
        vec!["http://localhost:2379".to_owned()]
    } else {
        listed
    }
}

/// How to reach etcd.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EtcdOptions {
    /// `user` and `password`, when etcd has authentication on.
    pub user: Option<(String, String)>,
    /// Bound on connecting, and on each request.
    pub timeout: Duration,
}

impl EtcdOptions {
    /// These options with `user` and `password`, which go together (both
    /// `None`: no authentication).
    pub fn with_credentials(
        mut self,
        user: Option<&str>,
        password: Option<&str>,
    ) -> Result<Self, EtcdError> {
        self.user = match (user, password) {
            (Some(user), Some(password)) => Some((user.to_owned(), password.to_owned())),
            (None, None) => None,
            _ => return Err(EtcdError::HalfCredentials),
        };
        Ok(self)
    }
}

impl Default for EtcdOptions {
    fn default() -> Self {
        Self {
            user: None,
            timeout: Duration::from_secs(2),
        }
    }
}

/// Why watching etcd could not start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EtcdError {
    /// No endpoint, or an empty one.
    NoEndpoints,
    /// A user without a password, or a password without a user.
    HalfCredentials,
    /// etcd could not be reached, refused the credentials, or failed the
    /// first listing (its message).
    Connect(String),
}

impl std::fmt::Display for EtcdError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            EtcdError::NoEndpoints => f.write_str("etcd endpoints must not be empty"),
            EtcdError::HalfCredentials => f.write_str("user and password go together"),
            EtcdError::Connect(e) => write!(f, "cannot read etcd: {e}"),
        }
    }
}

impl std::error::Error for EtcdError {}

/// Watches Dynamo's model cards in etcd and registers their workers (see
/// the [module docs](self)). Stops on [`close`](Self::close) or drop, which
/// remove the workers it registered.
pub struct EtcdDiscovery {
    stats: Arc<Mutex<DiscoveryStats>>,
    stop: Option<oneshot::Sender<()>>,
    done: Option<mpsc::Receiver<()>>,
    /// The process whose runtime runs the watch: a forked child has none.
    made_in: ForkGuard,
}

impl EtcdDiscovery {
    /// Connects to `endpoints` (`http://host:port`), lists the cards once
    /// and registers their workers, then watches on the I/O runtime.
    pub fn start(
        monitor: Arc<Monitor>,
        endpoints: &[String],
        config: DiscoveryConfig,
        options: EtcdOptions,
    ) -> Result<Self, EtcdError> {
        if endpoints.is_empty() || endpoints.iter().any(|e| e.trim().is_empty()) {
            return Err(EtcdError::NoEndpoints);
        }
        let stats = Arc::new(Mutex::new(DiscoveryStats::default()));
        let registrar = Registrar::new(config, monitor, Arc::clone(&stats));
        let store = Store {
            endpoints: endpoints.to_vec(),
            options,
        };
        let (registrar, client, revision) = crate::runtime::block_on(async move {
            let mut registrar = registrar;
            let mut client = store.connect().await?;
            let revision = store.list(&mut client, &mut registrar).await?;
            Ok::<_, EtcdError>((registrar, (store, client), revision))
        })?;
        let (stop, stopped) = oneshot::channel();
        let (finished, done) = mpsc::channel();
        crate::runtime::runtime().spawn(async move {
            let (store, client) = client;
            let mut registrar = registrar;
            tokio::select! {
                () = store.follow(client, revision, &mut registrar) => {}
                _ = stopped => {}
            }
            registrar.forget_all();
            let _ = finished.send(());
        });
        Ok(Self {
            stats,
            stop: Some(stop),
            done: Some(done),
            made_in: ForkGuard::new(),
        })
    }

    /// What the watcher has done so far (`scans` counts listings).
    pub fn stats(&self) -> DiscoveryStats {
        lock(&self.stats).clone()
    }

    /// Stops watching and removes the workers it registered. Idempotent.
    /// In a forked child, where the parent's runtime does not run, it only
    /// lets go.
    pub fn close(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(done) = self.done.take() {
            if self.made_in.same_process() {
                // The task ends at its next await.
                let _ = done.recv_timeout(Duration::from_secs(10));
            }
        }
    }
}

impl Drop for EtcdDiscovery {
    fn drop(&mut self) {
        self.close();
    }
}

impl std::fmt::Debug for EtcdDiscovery {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdDiscovery")
            .field("stats", &self.stats())
            .finish()
    }
}

struct Store {
    endpoints: Vec<String>,
    options: EtcdOptions,
}

impl Store {
    async fn connect(&self) -> Result<Client, EtcdError> {
        let mut options = ConnectOptions::new()
            .with_connect_timeout(self.options.timeout)
            .with_timeout(self.options.timeout)
            .with_keep_alive(Duration::from_secs(5), self.options.timeout);
        if let Some((user, password)) = &self.options.user {
            options = options.with_user(user.clone(), password.clone());
        }
        Client::connect(&self.endpoints, Some(options))
            .await
            .map_err(|e| EtcdError::Connect(e.to_string()))
    }

    /// Lists every card, registers what it finds and removes what is gone;
    /// returns the store's revision.
    async fn list(&self, client: &mut Client, registrar: &mut Registrar) -> Result<i64, EtcdError> {
        registrar.count(|s| s.scans += 1);
        let limit = registrar.config.max_records;
        let get = GetOptions::new()
            .with_prefix()
            .with_limit(i64::try_from(limit).unwrap_or(i64::MAX));
        let response = client
            .get(MDC_PREFIX, Some(get))
            .await
            .map_err(|e| EtcdError::Connect(e.to_string()))?;
        if response.more() {
            let over = u64::try_from(response.count()).unwrap_or(0) - response.kvs().len() as u64;
            registrar.count(|s| s.refused_over_limit += over);
        }
        let mut live = std::collections::HashSet::new();
        for kv in response.kvs() {
            let id = String::from_utf8_lossy(kv.key()).into_owned();
            put(registrar, &id, kv.value());
            live.insert(id);
        }
        registrar.keep_only(|id| live.contains(id));
        Ok(response.header().map_or(0, |h| h.revision()))
    }

    /// Follows the cards from `revision` on, reconnecting and listing
    /// afresh after every failure; returns only when stopped.
    async fn follow(&self, client: Client, revision: i64, registrar: &mut Registrar) {
        let mut next = Some((client, revision));
        let mut backoff = registrar.config.interval;
        loop {
            let resumed = match next.take() {
                Some(resumed) => Ok(resumed),
                None => self.resync(registrar).await,
            };
            let error = match resumed {
                Ok((client, revision)) => {
                    backoff = registrar.config.interval;
                    self.watch(client, revision, registrar).await
                }
                Err(e) => e,
            };
            registrar.count(|s| {
                s.scan_errors += 1;
                s.last_error = Some(error.to_string());
            });
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(Duration::from_secs(5));
        }
    }

    async fn resync(&self, registrar: &mut Registrar) -> Result<(Client, i64), EtcdError> {
        let mut client = self.connect().await?;
        let revision = self.list(&mut client, registrar).await?;
        Ok((client, revision))
    }

    /// Applies the watch's events until it fails; returns why.
    async fn watch(
        &self,
        mut client: Client,
        revision: i64,
        registrar: &mut Registrar,
    ) -> EtcdError {
        let options = WatchOptions::new()
            .with_prefix()
            .with_start_revision(revision + 1);
        let mut stream = match client.watch(MDC_PREFIX, Some(options)).await {
            Ok(stream) => stream,
            Err(e) => return EtcdError::Connect(e.to_string()),
        };
        loop {
            let response = match stream.message().await {
                Ok(Some(response)) => response,
                Ok(None) => return EtcdError::Connect("the watch ended".to_owned()),
                Err(e) => return EtcdError::Connect(e.to_string()),
            };
            if response.canceled() {
                return EtcdError::Connect(format!(
                    "the watch was cancelled (compacted at revision {}): {}",
                    response.compact_revision(),
                    response.cancel_reason()
                ));
            }
            for event in response.events() {
                let Some(kv) = event.kv() else { continue };
                let id = String::from_utf8_lossy(kv.key());
                match event.event_type() {
                    EventType::Put => put(registrar, &id, kv.value()),
                    EventType::Delete => registrar.delete(&id),
                }
            }
        }
    }
}

/// Hands the card stored under `id` to the registrar, refusing it unread
/// when it is too large.
fn put(registrar: &mut Registrar, id: &str, value: &[u8]) {
    let key = id.strip_prefix(MDC_PREFIX).unwrap_or(id);
    let value = if value.len() as u64 > registrar.config.max_record_bytes {
        Value::TooLarge
    } else {
        Value::Bytes(value)
    };
    registrar.put(id, key, value);
}
