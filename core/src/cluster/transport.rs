//! Subjects and transports.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use percent_encoding::{utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};

use super::{lock, ClusterError};
use crate::cluster::wire::KV_METRICS_TOPIC;

/// Default subject prefix.
pub const DEFAULT_PREFIX: &str = "loadgate";
/// Longest token of a subject prefix or namespace, in bytes.
pub const MAX_TOKEN_LEN: usize = 256;

/// The subjects one deployment uses: `{prefix}.{namespace}.load.{worker_id}`
/// for load reports, `{prefix}.{namespace}.bookings.{frontend_id}` for the
/// frontends' booking snapshots.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Subjects {
    base: String,
}

/// Checks that `token` can stand as one NATS subject token: non-empty, at
/// most [`MAX_TOKEN_LEN`] bytes, without whitespace, `.`, `*` or `>`;
/// `what` names it in the error.
pub(crate) fn check_token(token: &str, what: &str) -> Result<(), ClusterError> {
    if token.len() > MAX_TOKEN_LEN {
        return Err(ClusterError::InvalidSubject(format!(
            "a token of {} bytes in {what} is too long: at most {MAX_TOKEN_LEN} bytes",
            token.len()
        )));
    }
    let bad = token.is_empty()
        || token
            .chars()
            .any(|c| c.is_whitespace() || matches!(c, '.' | '*' | '>'));
    if bad {
        return Err(ClusterError::InvalidSubject(format!(
            "{token:?} in {what}: tokens must be non-empty without whitespace, '.', '*' or '>'"
        )));
    }
    Ok(())
}

impl Subjects {
    /// Subjects under the default prefix `loadgate`.
    pub fn new(namespace: &str) -> Result<Self, ClusterError> {
        Self::with_prefix(DEFAULT_PREFIX, namespace)
    }

    /// Subjects under `prefix` (one or more dot-separated tokens). Each
    /// token is at most [`MAX_TOKEN_LEN`] bytes.
    pub fn with_prefix(prefix: &str, namespace: &str) -> Result<Self, ClusterError> {
        let what = format!("prefix {prefix:?} / namespace {namespace:?}");
        for token in prefix.split('.').chain(std::iter::once(namespace)) {
            check_token(token, &what)?;
        }
        Ok(Self {
            base: format!("{prefix}.{namespace}"),
        })
    }

    /// The subject one worker publishes on.
    pub fn load(&self, worker_id: u64) -> String {
        format!("{}.load.{worker_id}", self.base)
    }

    /// The wildcard subject a frontend subscribes to.
    pub fn load_all(&self) -> String {
        format!("{}.load.*", self.base)
    }

    /// The subject one frontend publishes its booking snapshots on.
    pub fn bookings(&self, frontend_id: &str) -> String {
        format!("{}.bookings.{frontend_id}", self.base)
    }

    /// The wildcard subject of every frontend's booking snapshots.
    pub fn bookings_all(&self) -> String {
        format!("{}.bookings.*", self.base)
    }
}

/// What the reference leaves unencoded in a subject segment: `[A-Za-z0-9_-]`.
const DYNAMO_SEGMENT: &AsciiSet = &NON_ALPHANUMERIC.remove(b'_').remove(b'-');

/// The subject a reference worker publishes its load on:
/// `namespace.{namespace}.component.{component}.endpoint.{endpoint}.kv_metrics`,
/// each segment percent-encoded except `[A-Za-z0-9_-]`, as the reference
/// encodes them. A segment that is exactly `*` stays a wildcard (one
/// segment), so a frontend can follow every component or endpoint.
pub fn dynamo_kv_metrics_subject(
    namespace: &str,
    component: &str,
    endpoint: &str,
) -> Result<String, ClusterError> {
    let mut subject = String::new();
    for (name, segment) in [
        ("namespace", namespace),
        ("component", component),
        ("endpoint", endpoint),
    ] {
        if segment.is_empty() || segment.len() > MAX_TOKEN_LEN {
            return Err(ClusterError::InvalidSubject(format!(
                "{name} must be 1 to {MAX_TOKEN_LEN} bytes, not {}",
                segment.len()
            )));
        }
        subject.push_str(name);
        subject.push('.');
        if segment == "*" {
            subject.push('*');
        } else {
            subject.extend(utf8_percent_encode(segment, DYNAMO_SEGMENT));
        }
        subject.push('.');
    }
    subject.push_str(KV_METRICS_TOPIC);
    Ok(subject)
}

/// The subject of `topic` on the same Dynamo endpoint as a `kv_metrics`
/// subject (`None` for any other subject).
pub(crate) fn dynamo_sibling_subject(kv_metrics_subject: &str, topic: &str) -> Option<String> {
    let endpoint = kv_metrics_subject.strip_suffix(KV_METRICS_TOPIC)?;
    endpoint
        .ends_with('.')
        .then(|| format!("{endpoint}{topic}"))
}

/// Whether `subject` matches a NATS `pattern` (`*` one token, `>` the rest).
pub fn subject_matches(pattern: &str, subject: &str) -> bool {
    let mut subject_tokens = subject.split('.');
    for p in pattern.split('.') {
        match (p, subject_tokens.next()) {
            (">", Some(_)) => return true,
            (_, None) => return false,
            ("*", Some(_)) => {}
            (p, Some(s)) if p == s => {}
            _ => return false,
        }
    }
    subject_tokens.next().is_none()
}

/// A message handler: called with the subject and payload of each message
/// on the subscribed subject.
pub type Handler = Arc<dyn Fn(&str, &[u8]) + Send + Sync>;

/// Pub/sub as loadgate needs it: fire-and-forget publish, wildcard subscribe.
pub trait Transport: Send + Sync {
    /// Publishes `payload` on `subject` without waiting for delivery.
    fn publish(&self, subject: &str, payload: Vec<u8>) -> Result<(), ClusterError>;
    /// Calls `handler` for every message on `subject` (wildcards allowed)
    /// until the returned [`Subscription`] is dropped.
    fn subscribe(&self, subject: &str, handler: Handler) -> Result<Subscription, ClusterError>;
    /// How many times so far this transport may have lost messages (lost
    /// its connection, or dropped messages for a slow subscriber), or
    /// `u64::MAX` while it is not connected. Booking sync's leased mode
    /// starts its join window again after one. A transport that never
    /// loses messages keeps the default, 0.
    fn interruptions(&self) -> u64 {
        0
    }
}

/// An active subscription; dropping it unsubscribes.
pub struct Subscription {
    on_drop: Option<Box<dyn FnOnce() + Send>>,
}

impl Subscription {
    /// A subscription that runs `cancel` when dropped.
    pub fn new(cancel: impl FnOnce() + Send + 'static) -> Self {
        Self {
            on_drop: Some(Box::new(cancel)),
        }
    }
}

impl fmt::Debug for Subscription {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Subscription")
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        if let Some(cancel) = self.on_drop.take() {
            cancel();
        }
    }
}

/// The embedded default transport: delivery inside one process, synchronous
/// on the publishing thread. Cloning shares the bus.
#[derive(Clone, Default)]
pub struct InProcessBus {
    inner: Arc<BusInner>,
}

#[derive(Default)]
struct BusInner {
    subscribers: Mutex<Vec<(u64, String, Handler)>>,
    next_id: AtomicU64,
}

impl InProcessBus {
    /// A new, empty bus.
    pub fn new() -> Self {
        Self::default()
    }
}

impl fmt::Debug for InProcessBus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("InProcessBus")
            .field("subscribers", &lock(&self.inner.subscribers).len())
            .finish()
    }
}

impl Transport for InProcessBus {
    fn publish(&self, subject: &str, payload: Vec<u8>) -> Result<(), ClusterError> {
        let handlers: Vec<Handler> = lock(&self.inner.subscribers)
            .iter()
            .filter(|(_, pattern, _)| subject_matches(pattern, subject))
            .map(|(_, _, h)| h.clone())
            .collect();
        for h in handlers {
            h(subject, &payload);
        }
        Ok(())
    }

    fn subscribe(&self, subject: &str, handler: Handler) -> Result<Subscription, ClusterError> {
        let id = self.inner.next_id.fetch_add(1, Ordering::Relaxed);
        lock(&self.inner.subscribers).push((id, subject.to_owned(), handler));
        let weak = Arc::downgrade(&self.inner);
        Ok(Subscription::new(move || {
            if let Some(inner) = weak.upgrade() {
                lock(&inner.subscribers).retain(|(i, _, _)| *i != id);
            }
        }))
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::cluster::wire::{ACTIVE_SEQUENCES_TOPIC, FORWARD_PASS_TOPIC};

    #[test]
    fn subjects_and_wildcards() {
        let s = Subjects::new("prod").unwrap();
        assert_eq!(s.load(7), "loadgate.prod.load.7");
        assert!(subject_matches(&s.load_all(), &s.load(7)));
        assert!(!subject_matches(&s.load_all(), "loadgate.dev.load.7"));
        assert!(subject_matches("a.>", "a.b.c"));
        assert!(!subject_matches("a.>", "a"));
        assert!(!subject_matches("a.*", "a.b.c"));
        assert!(subject_matches("a.b", "a.b"));
        for bad in ["", "a.b", "a b", "*", ">"] {
            assert!(Subjects::new(bad).is_err(), "{bad:?}");
        }
        assert!(Subjects::with_prefix("corp.loadgate", "ns").is_ok());
        assert!(Subjects::with_prefix("corp..x", "ns").is_err());
        assert!(Subjects::new(&"n".repeat(MAX_TOKEN_LEN)).is_ok());
        assert_eq!(
            dynamo_kv_metrics_subject("dynamo", "backend", "generate").unwrap(),
            "namespace.dynamo.component.backend.endpoint.generate.kv_metrics"
        );
        assert_eq!(
            dynamo_kv_metrics_subject("my ns.v1", "vllm-worker_2", "gen/é").unwrap(),
            "namespace.my%20ns%2Ev1.component.vllm-worker_2.endpoint.gen%2F%C3%A9.kv_metrics"
        );
        let all = dynamo_kv_metrics_subject("dynamo", "*", "*").unwrap();
        assert_eq!(all, "namespace.dynamo.component.*.endpoint.*.kv_metrics");
        assert!(subject_matches(
            &all,
            &dynamo_kv_metrics_subject("dynamo", "a.b", "c").unwrap()
        ));
        assert_eq!(
            dynamo_sibling_subject(&all, FORWARD_PASS_TOPIC).as_deref(),
            Some("namespace.dynamo.component.*.endpoint.*.forward-pass-metrics")
        );
        assert_eq!(
            dynamo_sibling_subject(&all, ACTIVE_SEQUENCES_TOPIC).as_deref(),
            Some("namespace.dynamo.component.*.endpoint.*.active_sequences_events")
        );
        assert_eq!(
            dynamo_sibling_subject("loadgate.prod.load.*", FORWARD_PASS_TOPIC),
            None
        );
        assert_eq!(
            dynamo_sibling_subject("kv_metrics", FORWARD_PASS_TOPIC),
            None
        );
        assert!(dynamo_kv_metrics_subject("", "c", "e").is_err());
        assert!(dynamo_kv_metrics_subject("n", "c", &"e".repeat(MAX_TOKEN_LEN + 1)).is_err());
        assert!(Subjects::new(&"n".repeat(MAX_TOKEN_LEN + 1)).is_err());
    }
}
