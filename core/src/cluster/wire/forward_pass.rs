//! The reference system's `forward-pass-metrics`, read.
//!
//! A Dynamo 1.6.1 worker publishes `kv_metrics` only when its KV use
//! changes, so an idle worker is silent there; `forward-pass-metrics` is the
//! one subject it never leaves silent: one message per forward pass under
//! load, and an all-zero heartbeat about once a second per rank while idle.
//! It is also the only subject that carries queue depth. loadgate reads it
//! for both: each message marks its rank alive (so no staleness policy
//! turns an idle worker stale while its heartbeat arrives) and sets the
//! rank's waiting requests (the queued prefill and decode requests).
//!
//! The envelope is the one `kv_metrics` travels in (`dynamo.rs`), with
//! `topic: "forward-pass-metrics"`; its `payload` is msgpack of a versioned
//! `ForwardPassMetrics` map: `version` (1), `worker_id` (a decimal string,
//! unlike every other subject's integer; an integer is accepted too),
//! `dp_rank`, `counter_id`, `wall_time`, `scheduled_requests{…}` and
//! `queued_requests{num_prefill_requests, sum_prefill_tokens,
//! var_prefill_length, num_decode_requests, sum_decode_kv_tokens,
//! var_decode_kv_tokens}`. Fields are read by name, unknown ones ignored;
//! an absent `queued_requests` means nothing queued.

use std::borrow::Cow;

use serde::Deserialize;

use super::dynamo::Payload;
use super::WireError;
use crate::load::LoadReport;

/// The topic of the reference's forward-pass metrics.
pub const FORWARD_PASS_TOPIC: &str = "forward-pass-metrics";

/// The `ForwardPassMetrics` version this reader knows.
pub const FORWARD_PASS_VERSION: u64 = 1;

/// One rank's forward-pass metrics, as loadgate uses them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ForwardPass {
    /// The publishing process (a restarted worker has a new one).
    pub publisher_id: u64,
    /// Per-publisher sequence number.
    pub sequence: u64,
    /// The worker.
    pub worker_id: u64,
    /// The rank.
    pub dp_rank: u32,
    /// Requests queued, waiting for prefill or (preempted) for decode.
    pub queued_requests: u64,
    /// Prompt tokens of the requests queued for prefill.
    pub queued_prefill_tokens: u64,
}

impl ForwardPass {
    /// The load it reports: the rank's waiting requests.
    pub fn report(&self) -> LoadReport {
        LoadReport {
            waiting_requests: Some(self.queued_requests),
            ..Default::default()
        }
    }
}

#[derive(Deserialize)]
struct Metrics<'a> {
    version: u64,
    #[serde(borrow)]
    worker_id: Id<'a>,
    #[serde(default)]
    dp_rank: u32,
    #[serde(default)]
    queued_requests: Option<Queued>,
}

/// A worker id as a decimal string (1.6.1) or an integer.
#[derive(Deserialize)]
#[serde(untagged)]
enum Id<'a> {
    Number(u64),
    #[serde(borrow)]
    Text(Cow<'a, str>),
}

#[derive(Deserialize, Default)]
struct Queued {
    #[serde(default)]
    num_prefill_requests: u64,
    #[serde(default)]
    sum_prefill_tokens: u64,
    #[serde(default)]
    num_decode_requests: u64,
}

/// Decodes a forward-pass envelope's payload.
pub(super) fn decode(
    publisher_id: u64,
    sequence: u64,
    payload: Payload<'_>,
) -> Result<ForwardPass, WireError> {
    let Payload::Encoded(bytes) = payload else {
        return Err(WireError::Malformed(
            "forward-pass payload: expected msgpack bytes".into(),
        ));
    };
    let m: Metrics<'_> = rmp_serde::from_slice(&bytes)
        .map_err(|e| WireError::Malformed(format!("forward-pass payload: {e}")))?;
    if m.version != FORWARD_PASS_VERSION {
        return Err(WireError::UnsupportedVersion(m.version));
    }
    let worker_id = match m.worker_id {
        Id::Number(n) => n,
        // At most 20 digits: longer text is refused before parsing.
        Id::Text(t) if t.len() <= 20 && t.bytes().all(|b| b.is_ascii_digit()) => {
            t.parse().map_err(|_| {
                WireError::Invalid(format!("forward-pass worker_id {t:?} is not a u64"))
            })?
        }
        Id::Text(t) => {
            return Err(WireError::Malformed(format!(
                "forward-pass worker_id: expected decimal digits, got {} bytes",
                t.len()
            )))
        }
    };
    let q = m.queued_requests.unwrap_or_default();
    // The sum stays below u64::MAX, which marks a field never reported.
    let queued = q
        .num_prefill_requests
        .checked_add(q.num_decode_requests)
        .filter(|&n| n < u64::MAX)
        .ok_or_else(|| WireError::Invalid("forward-pass queued requests overflow".into()))?;
    Ok(ForwardPass {
        publisher_id,
        sequence,
        worker_id,
        dp_rank: m.dp_rank,
        queued_requests: queued,
        queued_prefill_tokens: q.sum_prefill_tokens,
    })
}
