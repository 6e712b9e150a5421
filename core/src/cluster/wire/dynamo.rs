//! The reference system's event-plane envelope, read and written.
//!
//! A reference worker publishes each rank's load as `rmp_serde::to_vec_named`
//! of an envelope — a msgpack map `{publisher_id: u64, sequence: u64 (per
//! publisher, from 0), published_at: u64 (unix ms), topic: "kv_metrics",
//! payload: bin}` — whose `payload` is `to_vec_named` of its `ActiveLoad`
//! (`worker_id`, `dp_rank`, `active_decode_blocks?`, `active_prefill_tokens?`,
//! `kv_used_blocks?`, with `None` written as nil: Dynamo 1.6.1's five keys,
//! which is what the writer here produces, byte for byte; some releases add
//! `scheduler_load_scope`, which the reader skips).
//! Fields are matched by name, so older envelopes (`topic` first, or
//! `published_at_ns`) and older payloads (without `scheduler_load_scope` or
//! `kv_used_blocks`) decode too; unknown fields are ignored; nil is absent.
//! The JSON form carries `payload` as an array of bytes (how serde writes
//! bytes to JSON) or as the nested `ActiveLoad` object.

use std::borrow::Cow;
use std::fmt;

use serde::de::{self, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::{ActiveLoad, WireError};

/// The topic a reference worker's load travels under.
pub const KV_METRICS_TOPIC: &str = "kv_metrics";

/// A reference event-plane envelope carrying one rank's load.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Envelope {
    /// The publishing process (a restarted worker has a new one).
    pub publisher_id: u64,
    /// Per-publisher sequence number, from 0.
    pub sequence: u64,
    /// The load.
    pub load: ActiveLoad,
}

impl Envelope {
    /// Encodes as the reference writes it: a msgpack named map, `payload` a
    /// msgpack `bin` of the named `ActiveLoad` with absent fields as nil,
    /// stamped `published_at` (unix milliseconds) and `topic` `kv_metrics`.
    pub fn to_msgpack(&self, published_at: u64) -> Vec<u8> {
        self.with_fields(published_at, |out| rmp_serde::to_vec_named(out).ok())
    }

    /// Encodes as JSON, as serde writes the reference's envelope: `payload`
    /// as an array of the msgpack bytes.
    pub fn to_json(&self, published_at: u64) -> Vec<u8> {
        self.with_fields(published_at, |out| serde_json::to_vec(out).ok())
    }

    /// Builds the envelope's fields (the payload encoded as the reference
    /// encodes its `ActiveLoad`) and hands them to `encode`.
    fn with_fields(
        &self,
        published_at: u64,
        encode: impl FnOnce(&EnvelopeOut<'_>) -> Option<Vec<u8>>,
    ) -> Vec<u8> {
        let payload = rmp_serde::to_vec_named(&ActiveLoadOut::from(&self.load))
            .expect("an ActiveLoad always serializes");
        encode(&EnvelopeOut {
            publisher_id: self.publisher_id,
            sequence: self.sequence,
            published_at,
            topic: KV_METRICS_TOPIC,
            payload: Bin(&payload),
        })
        .expect("an envelope always serializes")
    }
}

/// An envelope of `topic` around an encoded `payload`, in msgpack, as the
/// reference writes it.
pub(super) fn envelope_msgpack(
    publisher_id: u64,
    sequence: u64,
    published_at: u64,
    topic: &str,
    payload: &[u8],
) -> Vec<u8> {
    rmp_serde::to_vec_named(&EnvelopeOut {
        publisher_id,
        sequence,
        published_at,
        topic,
        payload: Bin(payload),
    })
    .expect("an envelope always serializes")
}

/// The envelope's field order as the reference writes it.
#[derive(Serialize)]
struct EnvelopeOut<'a> {
    publisher_id: u64,
    sequence: u64,
    published_at: u64,
    topic: &'a str,
    payload: Bin<'a>,
}

/// The reference `ActiveLoad` as Dynamo 1.6.1 writes it: five fields in
/// this order, `None` as nil.
#[derive(Serialize)]
struct ActiveLoadOut {
    worker_id: u64,
    dp_rank: u32,
    active_decode_blocks: Option<u64>,
    active_prefill_tokens: Option<u64>,
    kv_used_blocks: Option<u64>,
}

impl From<&ActiveLoad> for ActiveLoadOut {
    fn from(a: &ActiveLoad) -> Self {
        Self {
            worker_id: a.worker_id,
            dp_rank: a.dp_rank,
            active_decode_blocks: a.active_decode_blocks,
            active_prefill_tokens: a.active_prefill_tokens,
            kv_used_blocks: a.kv_used_blocks,
        }
    }
}

/// Bytes written as msgpack `bin` (serde writes a plain `&[u8]` as an array).
struct Bin<'a>(&'a [u8]);

impl Serialize for Bin<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_bytes(self.0)
    }
}

/// An envelope's `payload` as received: the encoded `ActiveLoad` (msgpack
/// `bin`, or a JSON array of bytes), or the `ActiveLoad` itself as a nested
/// map.
#[derive(Debug, PartialEq)]
pub(crate) enum Payload<'a> {
    Encoded(Cow<'a, [u8]>),
    Nested(ActiveLoad),
}

impl<'de: 'a, 'a> Deserialize<'de> for Payload<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct PayloadVisitor;

        impl<'de> Visitor<'de> for PayloadVisitor {
            type Value = Payload<'de>;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("bytes, an array of bytes or an ActiveLoad map")
            }

            fn visit_borrowed_bytes<E: de::Error>(self, v: &'de [u8]) -> Result<Self::Value, E> {
                Ok(Payload::Encoded(Cow::Borrowed(v)))
            }

            fn visit_bytes<E: de::Error>(self, v: &[u8]) -> Result<Self::Value, E> {
                Ok(Payload::Encoded(Cow::Owned(v.to_vec())))
            }

            fn visit_byte_buf<E: de::Error>(self, v: Vec<u8>) -> Result<Self::Value, E> {
                Ok(Payload::Encoded(Cow::Owned(v)))
            }

            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                // Bounded by the message, which the subscriber bounds.
                let mut bytes = Vec::new();
                while let Some(b) = seq.next_element::<u8>()? {
                    bytes.push(b);
                }
                Ok(Payload::Encoded(Cow::Owned(bytes)))
            }

            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
                let load = ActiveLoad::deserialize(de::value::MapAccessDeserializer::new(map))?;
                Ok(Payload::Nested(load))
            }
        }

        d.deserialize_any(PayloadVisitor)
    }
}

/// Decodes an envelope's payload into the load it carries.
pub(super) fn decode_payload(payload: Payload<'_>) -> Result<ActiveLoad, WireError> {
    let bytes = match payload {
        Payload::Nested(load) => return Ok(load),
        Payload::Encoded(bytes) => bytes,
    };
    let decoded = match bytes.iter().find(|b| !b.is_ascii_whitespace()) {
        None => return Err(WireError::Malformed("empty envelope payload".into())),
        Some(b'{') => serde_json::from_slice(&bytes).map_err(|e| e.to_string()),
        Some(_) => rmp_serde::from_slice(&bytes).map_err(|e| e.to_string()),
    };
    decoded.map_err(|e| WireError::Malformed(format!("envelope payload: {e}")))
}
