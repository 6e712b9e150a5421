//! The reference system's `active_sequences_events`, read, and written for
//! loadgate's own bookings ([`Announcement`]).
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
//! hashes are counted, never stored. An [`Announcement`] is written with
//! the fields and order of a 1.6.1 router's own events.

use std::borrow::Cow;
use std::fmt;

use serde::de::{IgnoredAny, SeqAccess, Visitor};
use serde::ser::SerializeSeq;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::dynamo::{envelope_msgpack, Payload};
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

/// Most block hashes an announced booking carries: a booking of more blocks
/// is announced as this many (65,536 blocks of 16 tokens are a million
/// tokens; the message stays under 200 KB, within NATS's default 1 MB).
pub const MAX_ANNOUNCED_BLOCKS: u64 = 65_536;

/// One of loadgate's own bookings' changes, written as a reference router
/// writes its own (`cluster::announce`), so that the reference's routers
/// count it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Announcement<'a> {
    /// The envelope's publisher (random per publisher, below 2^53 as the
    /// reference's).
    pub publisher_id: u64,
    /// The envelope's sequence, per publisher from 0.
    pub sequence: u64,
    /// Unix milliseconds.
    pub published_at: u64,
    /// The announcing router's id (never a reference router's own).
    pub router_id: u64,
    /// The request, as named in every event of the booking.
    pub request_id: &'a str,
    /// The worker and rank the booking is on.
    pub worker_id: u64,
    /// Its rank.
    pub dp_rank: u32,
    /// What changed. An `Add`'s blocks travel as that many block hashes
    /// (at most [`MAX_ANNOUNCED_BLOCKS`]): `first_hash`, then 1, 2, …, so
    /// that no two bookings share a leading hash (the reference counts a
    /// leading run shared by two requests on a rank once); its prefill
    /// tokens as `prefill_load_hint.initial_effective_prefill_tokens`.
    pub change: SequenceChange,
    /// The booking's first block hash (`change` above).
    pub first_hash: u64,
}

impl Announcement<'_> {
    /// The envelope, in msgpack, byte for byte as a Dynamo 1.6.1 router
    /// writes its own events (checked against recorded ones in
    /// `tests/fixtures/dynamo-1.6.1`).
    pub fn to_msgpack(&self) -> Vec<u8> {
        let data = match self.change {
            SequenceChange::Add {
                blocks,
                prefill_tokens,
            } => DataOut::AddRequest(AddOut {
                token_sequence: Hashes {
                    first: self.first_hash,
                    len: blocks.min(MAX_ANNOUNCED_BLOCKS),
                },
                track_prefill_tokens: true,
                expected_output_tokens: None,
                prefill_load_hint: Some(HintOut {
                    initial_effective_prefill_tokens: prefill_tokens,
                    expected_prefill_duration: None,
                }),
            }),
            SequenceChange::PrefillDone => DataOut::MarkPrefillCompleted,
            SequenceChange::Free => DataOut::Free,
        };
        let payload = rmp_serde::to_vec_named(&EventOut {
            request_id: self.request_id,
            worker: WorkerOut {
                worker_id: self.worker_id,
                dp_rank: self.dp_rank,
            },
            data,
            router_id: self.router_id,
            lora_name: None,
        })
        .expect("an event always serializes");
        envelope_msgpack(
            self.publisher_id,
            self.sequence,
            self.published_at,
            ACTIVE_SEQUENCES_TOPIC,
            &payload,
        )
    }
}

/// The reference's event, its fields in its order.
#[derive(Serialize)]
struct EventOut<'a> {
    request_id: &'a str,
    worker: WorkerOut,
    data: DataOut,
    router_id: u64,
    lora_name: Option<&'a str>,
}

#[derive(Serialize)]
struct WorkerOut {
    worker_id: u64,
    dp_rank: u32,
}

#[derive(Serialize)]
enum DataOut {
    AddRequest(AddOut),
    MarkPrefillCompleted,
    Free,
}

#[derive(Serialize)]
struct AddOut {
    token_sequence: Hashes,
    track_prefill_tokens: bool,
    expected_output_tokens: Option<u32>,
    prefill_load_hint: Option<HintOut>,
}

#[derive(Serialize)]
struct HintOut {
    initial_effective_prefill_tokens: u64,
    expected_prefill_duration: Option<()>,
}

/// `len` block hashes: `first`, then 1, 2, … (written, never stored).
struct Hashes {
    first: u64,
    len: u64,
}

impl Serialize for Hashes {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let len = usize::try_from(self.len).unwrap_or(usize::MAX);
        let mut seq = s.serialize_seq(Some(len))?;
        for i in 0..self.len {
            seq.serialize_element(&if i == 0 { self.first } else { i })?;
        }
        seq.end()
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
