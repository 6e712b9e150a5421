//! NATS core pub/sub transport (feature `nats`).

use std::future::Future;
use std::sync::OnceLock;
use std::time::Duration;

use futures_util::StreamExt;
use tokio::runtime::Runtime;
use tokio::sync::mpsc;

use super::{ClusterError, Handler, Subscription, Transport};

/// The process's NATS runtime: one worker thread, started on first use
/// (so processes that fork workers before connecting stay single-threaded).
fn runtime() -> &'static Runtime {
    static RUNTIME: OnceLock<Runtime> = OnceLock::new();
    RUNTIME.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("loadgate-nats")
            .enable_all()
            .build()
            .expect("cannot start the loadgate NATS runtime")
    })
}

/// Runs `f` to completion on the NATS runtime, from any thread
/// (including threads that are themselves inside a tokio runtime).
fn block_on<F>(f: F) -> F::Output
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    if tokio::runtime::Handle::try_current().is_ok() {
        std::thread::spawn(move || runtime().block_on(f))
            .join()
            .expect("NATS call panicked")
    } else {
        runtime().block_on(f)
    }
}

/// A connection to a NATS server. Publishing is non-blocking and keeps
/// order; the connection reconnects by itself after the server restarts
/// and restores its subscriptions.
#[derive(Debug, Clone)]
pub struct NatsTransport {
    client: async_nats::Client,
    outbox: mpsc::UnboundedSender<(String, bytes::Bytes)>,
}

impl NatsTransport {
    /// Connects to `url` (e.g. `nats://127.0.0.1:4222`; scheme and port
    /// default to `nats://` and 4222). A malformed URL is
    /// [`ClusterError::InvalidConfig`]; a server that cannot be reached
    /// within two seconds is [`ClusterError::Transport`].
    pub fn connect(url: &str) -> Result<Self, ClusterError> {
        let invalid = |why: &dyn std::fmt::Display| {
            ClusterError::InvalidConfig(format!("{url:?} is not a NATS server URL ({why})"))
        };
        let url: async_nats::ServerAddr = url.parse().map_err(|e| invalid(&e))?;
        if url.host().is_empty() {
            return Err(invalid(&"no host"));
        }
        let client = block_on(async move {
            async_nats::ConnectOptions::new()
                .name("loadgate")
                .connection_timeout(Duration::from_secs(2))
                .max_reconnects(None)
                .reconnect_delay_callback(|attempts| {
                    Duration::from_millis((50 * attempts as u64).clamp(50, 1000))
                })
                .connect(url)
                .await
        })
        .map_err(|e| ClusterError::Transport(format!("cannot connect to NATS: {e}")))?;
        let (outbox, mut rx) = mpsc::unbounded_channel::<(String, bytes::Bytes)>();
        let publisher = client.clone();
        runtime().spawn(async move {
            while let Some((subject, payload)) = rx.recv().await {
                // A failed publish (server away) is dropped: heartbeats
                // re-send the state once the connection is back.
                let _ = publisher.publish(subject, payload).await;
            }
        });
        Ok(Self { client, outbox })
    }

    /// Waits until everything published so far reached the server.
    pub fn flush(&self) -> Result<(), ClusterError> {
        let client = self.client.clone();
        block_on(async move { client.flush().await })
            .map_err(|e| ClusterError::Transport(format!("flush failed: {e}")))
    }
}

impl Transport for NatsTransport {
    fn publish(&self, subject: &str, payload: Vec<u8>) -> Result<(), ClusterError> {
        self.outbox
            .send((subject.to_owned(), payload.into()))
            .map_err(|_| ClusterError::Transport("the NATS runtime has stopped".into()))
    }

    fn subscribe(&self, subject: &str, handler: Handler) -> Result<Subscription, ClusterError> {
        let client = self.client.clone();
        let subject = subject.to_owned();
        let mut stream = block_on(async move { client.subscribe(subject).await })
            .map_err(|e| ClusterError::Transport(format!("cannot subscribe: {e}")))?;
        let task = runtime().spawn(async move {
            while let Some(msg) = stream.next().await {
                handler(&msg.subject, &msg.payload);
            }
        });
        Ok(Subscription::new(move || task.abort()))
    }
}
