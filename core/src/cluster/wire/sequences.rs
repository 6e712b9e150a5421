//! The reference system's `active_sequences_events`, read.
//!
//! A Dynamo 1.6.1 KV router keeps its own bookings: each routed request's
//! blocks and prefill tokens on its worker rank, until the request's
//! prefill completes and until it is freed. It decides its busy thresholds
//! on them, and its workers never publish them. With
//! `--router-replica-sync` it publishes every change on the endpoint's
//! `active_sequences_events` subject, in the envelope `kv_metrics` travels
//! in, so that its replicas see each other's bookings: `AddRequest` (the
//! worker and rank, the hashes of the request's full blocks, and
//! `prefill_load_hint.initial_effective_prefill_tokens`), then
//! `MarkPrefillCompleted` and `Free`. Workers publish their own
//! `MarkPrefillCompleted` there too, with their worker id as `router_id`.
//! loadgate reads these to hold the same bookings
//! (`cluster/bookings.rs`).
//!
//! The payload is msgpack of a map: `request_id` (text, at most
//! [`MAX_REQUEST_ID`] bytes here), `worker{worker_id, dp_rank}`, `data` (the
//! name of a unit variant, or a one-key map for `AddRequest`), `router_id`
//! and `lora_name`. Fields are read by name, unknown ones ignored; the block
//! hashes are counted, never stored.

use std::borrow::Cow;
use std::fmt;

use serde::de::{IgnoredAny, SeqAccess, Visitor};
use serde::{Deserialize, Deserializer};

use super::dynamo::Payload;
use super::WireError;

/// The topic of the reference's router bookings.
pub const ACTIVE_SEQUENCES_TOPIC: &str = "active_sequences_events";

/// Longest `request_id` accepted (Dynamo's are 36-byte UUIDs).
pub const MAX_REQUEST_ID: usize = 256;

/// One change to a reference router's bookings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SequenceEvent {
    /// The router (or, for a worker's own `MarkPrefillCompleted`, the
    /// worker) that published it.
    pub router_id: u64,
    /// The request, as the router names it.
    pub request_id: String,
    /// The worker the request was routed to.
    pub worker_id: u64,
    /// Its rank.
    pub dp_rank: u32,
    /// What changed.
    pub change: SequenceChange,
}

/// What a [`SequenceEvent`] changes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SequenceChange {
    /// A request was routed: it books `blocks` (its full blocks) and
    /// `prefill_tokens` (0 when the router does not track them).
    Add {
        /// Full KV blocks of its prompt.
        blocks: u64,
        /// Prompt tokens still to prefill.
        prefill_tokens: u64,
    },
    /// Its prefill completed: its prefill tokens are released.
    PrefillDone,
    /// It ended: everything it booked is released.
    Free,
}

#[derive(Deserialize)]
struct Event<'a> {
    #[serde(borrow)]
    request_id: Cow<'a, str>,
    worker: Worker,
    data: Data,
    router_id: u64,
}

#[derive(Deserialize)]
struct Worker {
    worker_id: u64,
    #[serde(default)]
    dp_rank: u32,
}

#[derive(Deserialize)]
enum Data {
    AddRequest(Add),
    MarkPrefillCompleted,
    Free,
}

#[derive(Deserialize)]
struct Add {
    #[serde(default)]
    token_sequence: Option<Count>,
    #[serde(default = "tracked")]
    track_prefill_tokens: bool,
    #[serde(default)]
    prefill_load_hint: Option<Hint>,
}

fn tracked() -> bool {
    true
}

#[derive(Deserialize)]
struct Hint {
    #[serde(default)]
    initial_effective_prefill_tokens: u64,
}

/// The length of a sequence, its elements skipped unread.
struct Count(u64);

impl<'de> Deserialize<'de> for Count {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct CountVisitor;

        impl<'de> Visitor<'de> for CountVisitor {
            type Value = Count;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a sequence of block hashes")
            }

            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Count, A::Error> {
                let mut n = 0;
                while seq.next_element::<IgnoredAny>()?.is_some() {
                    n += 1;
                }
                Ok(Count(n))
            }
        }

        d.deserialize_seq(CountVisitor)
    }
}

/// Decodes an `active_sequences_events` envelope's payload.
pub(super) fn decode(payload: Payload<'_>) -> Result<SequenceEvent, WireError> {
    let Payload::Encoded(bytes) = payload else {
        return Err(WireError::Malformed(
            "active-sequences payload: expected msgpack bytes".into(),
        ));
    };
    let event: Event<'_> = rmp_serde::from_slice(&bytes)
        .map_err(|e| WireError::Malformed(format!("active-sequences payload: {e}")))?;
    if event.request_id.is_empty() || event.request_id.len() > MAX_REQUEST_ID {
        return Err(WireError::Invalid(format!(
            "active-sequences request_id of {} bytes: must be 1 to {MAX_REQUEST_ID}",
            event.request_id.len()
        )));
    }
    let change = match event.data {
        Data::AddRequest(add) => SequenceChange::Add {
            blocks: add.token_sequence.map_or(0, |c| c.0),
            prefill_tokens: match (add.track_prefill_tokens, add.prefill_load_hint) {
                (true, Some(hint)) => hint.initial_effective_prefill_tokens,
                _ => 0,
            },
        },
        Data::MarkPrefillCompleted => SequenceChange::PrefillDone,
        Data::Free => SequenceChange::Free,
    };
    Ok(SequenceEvent {
        router_id: event.router_id,
        request_id: event.request_id.into_owned(),
        worker_id: event.worker.worker_id,
        dp_rank: event.worker.dp_rank,
        change,
    })
}
