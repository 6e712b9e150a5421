//! The load-report wire format (docs/behaviour.md#across-machines).
//!
//! A [`LoadMessage`] is a msgpack **named map** (field names on the wire, so
//! fields can be added without breaking old readers) carrying a schema
//! version, the worker's identity and declaration (model, ranks, capacities)
//! and one rank's load. Because every message carries the declaration, a
//! frontend that joins late learns the worker from its next heartbeat; no
//! separate discovery is needed. JSON with the same fields is accepted for
//! debugging, and the reference system's `ActiveLoad` payload
//! (`worker_id`, `dp_rank`, `active_decode_blocks?`, `active_prefill_tokens?`,
//! `kv_used_blocks?`) is decoded too.
//!
//! Decoding never panics: malformed input, unknown versions and
//! out-of-range values each give a typed [`WireError`].

use std::borrow::Cow;
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::error::ReportError;
use crate::load::{check_model, check_ranks, rank_index, LoadReport};

mod dynamo;
mod forward_pass;
mod sequences;

pub use dynamo::{Envelope, KV_METRICS_TOPIC};
pub use forward_pass::{ForwardPass, FORWARD_PASS_TOPIC, FORWARD_PASS_VERSION};
pub use sequences::{
    Announcement, SequenceChange, SequenceEvent, ACTIVE_SEQUENCES_TOPIC, MAX_ANNOUNCED_BLOCKS,
    MAX_REQUEST_ID,
};

/// The schema version this crate writes and reads.
pub const SCHEMA_VERSION: u32 = 1;

/// One rank's load and its worker's declaration.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LoadMessage {
    /// Schema version ([`SCHEMA_VERSION`]).
    pub v: u32,
    /// Identifies one run of the publishing process; sequence numbers are
    /// ordered only within one instance, so a restarted worker is accepted.
    pub instance: u64,
    /// Per-instance sequence number, increasing with every message.
    pub seq: u64,
    /// The worker.
    pub worker_id: u64,
    /// The worker's model.
    pub model: String,
    /// First declared rank.
    pub dp_start: u32,
    /// Number of declared ranks.
    pub dp_size: u32,
    /// The rank this load is for.
    pub dp_rank: u32,
    /// KV cache capacity of the rank.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kv_total_blocks: Option<u64>,
    /// Prefill batch capacity of the rank.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_num_batched_tokens: Option<u64>,
    /// Router-side active decode blocks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub active_decode_blocks: Option<u64>,
    /// KV cache blocks in use.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kv_used_blocks: Option<u64>,
    /// Prefill tokens in flight.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub active_prefill_tokens: Option<u64>,
    /// Requests waiting in the engine's queue. Skipped when absent, so
    /// readers that predate the field see the same bytes as before.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waiting_requests: Option<u64>,
    /// Requests the rank's engine runs at once at most (its
    /// `max_num_seqs`). Skipped when absent, as `waiting_requests`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_num_seqs: Option<u64>,
}

impl LoadMessage {
    /// The load fields as a [`LoadReport`].
    pub fn report(&self) -> LoadReport {
        LoadReport {
            active_decode_blocks: self.active_decode_blocks,
            kv_used_blocks: self.kv_used_blocks,
            kv_total_blocks: self.kv_total_blocks,
            active_prefill_tokens: self.active_prefill_tokens,
            max_num_batched_tokens: self.max_num_batched_tokens,
            waiting_requests: self.waiting_requests,
            max_num_seqs: self.max_num_seqs,
        }
    }

    /// Encodes as a msgpack named map.
    pub fn to_msgpack(&self) -> Vec<u8> {
        rmp_serde::to_vec_named(self).expect("a LoadMessage always serializes")
    }

    /// Encodes as JSON (for debugging and tooling).
    pub fn to_json(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("a LoadMessage always serializes")
    }
}

/// The reference system's `ActiveLoad` payload: load only, no declaration.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ActiveLoad {
    /// The worker.
    pub worker_id: u64,
    /// The rank.
    #[serde(default)]
    pub dp_rank: u32,
    /// Router-side active decode blocks.
    #[serde(default)]
    pub active_decode_blocks: Option<u64>,
    /// Prefill tokens in flight.
    #[serde(default)]
    pub active_prefill_tokens: Option<u64>,
    /// KV cache blocks in use.
    #[serde(default)]
    pub kv_used_blocks: Option<u64>,
}

impl ActiveLoad {
    /// The load fields as a [`LoadReport`].
    pub fn report(&self) -> LoadReport {
        LoadReport {
            active_decode_blocks: self.active_decode_blocks,
            kv_used_blocks: self.kv_used_blocks,
            active_prefill_tokens: self.active_prefill_tokens,
            ..Default::default()
        }
    }
}

/// A decoded payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decoded {
    /// A loadgate envelope.
    Load(LoadMessage),
    /// A reference `ActiveLoad`.
    ActiveLoad(ActiveLoad),
    /// A reference event-plane envelope carrying an `ActiveLoad`.
    Envelope(Envelope),
    /// A reference event-plane envelope carrying forward-pass metrics.
    ForwardPass(ForwardPass),
    /// A reference event-plane envelope carrying a change to a router's
    /// bookings.
    Sequence(SequenceEvent),
}

/// Why a payload was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WireError {
    /// Not valid msgpack or JSON, or a field has the wrong type.
    Malformed(String),
    /// A schema version this reader does not know.
    UnsupportedVersion(u64),
    /// A value outside its range (e.g. a rank outside the declared ranks).
    Invalid(String),
}

impl WireError {
    /// Every [`kind`](Self::kind), in metrics order.
    pub const KINDS: [&'static str; 3] = ["malformed", "unsupported_version", "invalid"];

    /// Stable name, used as a metrics label.
    pub const fn kind(&self) -> &'static str {
        match self {
            WireError::Malformed(_) => "malformed",
            WireError::UnsupportedVersion(_) => "unsupported_version",
            WireError::Invalid(_) => "invalid",
        }
    }
}

impl fmt::Display for WireError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WireError::Malformed(why) => write!(f, "malformed load message: {why}"),
            WireError::UnsupportedVersion(v) => {
                write!(
                    f,
                    "unsupported load message version {v} (this reader knows {SCHEMA_VERSION})"
                )
            }
            WireError::Invalid(why) => write!(f, "invalid load message: {why}"),
        }
    }
}

impl std::error::Error for WireError {}

/// Every field either payload may carry; decoding goes through this so the
/// two shapes are told apart by their fields, not by trial and error.
#[derive(Deserialize, Default, Debug, PartialEq)]
struct AnyPayload<'a> {
    v: Option<u64>,
    instance: Option<u64>,
    seq: Option<u64>,
    worker_id: Option<u64>,
    #[serde(borrow)]
    model: Option<Cow<'a, str>>,
    dp_start: Option<u32>,
    dp_size: Option<u32>,
    dp_rank: Option<u32>,
    kv_total_blocks: Option<u64>,
    max_num_batched_tokens: Option<u64>,
    active_decode_blocks: Option<u64>,
    kv_used_blocks: Option<u64>,
    active_prefill_tokens: Option<u64>,
    waiting_requests: Option<u64>,
    max_num_seqs: Option<u64>,
    // The reference event-plane envelope (`published_at` is not needed, so
    // not read).
    publisher_id: Option<u64>,
    #[serde(borrow)]
    topic: Option<Cow<'a, str>>,
    sequence: Option<u64>,
    #[serde(borrow)]
    payload: Option<dynamo::Payload<'a>>,
}

/// A decoded envelope that borrows the model name from the payload, so the
/// subscriber's hot path allocates nothing for known workers.
#[derive(Debug)]
pub(crate) struct LoadRef<'a> {
    pub(crate) instance: u64,
    pub(crate) seq: u64,
    pub(crate) worker_id: u64,
    pub(crate) model: Cow<'a, str>,
    pub(crate) dp_start: u32,
    pub(crate) dp_size: u32,
    pub(crate) dp_rank: u32,
    pub(crate) report: LoadReport,
}

impl LoadMessage {
    /// Borrows this message as the subscriber reads it.
    pub(crate) fn as_ref(&self) -> LoadRef<'_> {
        LoadRef {
            instance: self.instance,
            seq: self.seq,
            worker_id: self.worker_id,
            model: Cow::Borrowed(&self.model),
            dp_start: self.dp_start,
            dp_size: self.dp_size,
            dp_rank: self.dp_rank,
            report: self.report(),
        }
    }
}

impl LoadRef<'_> {
    pub(crate) fn into_owned(self) -> LoadMessage {
        LoadMessage {
            v: SCHEMA_VERSION,
            instance: self.instance,
            seq: self.seq,
            worker_id: self.worker_id,
            model: self.model.into_owned(),
            dp_start: self.dp_start,
            dp_size: self.dp_size,
            dp_rank: self.dp_rank,
            kv_total_blocks: self.report.kv_total_blocks,
            max_num_batched_tokens: self.report.max_num_batched_tokens,
            active_decode_blocks: self.report.active_decode_blocks,
            kv_used_blocks: self.report.kv_used_blocks,
            active_prefill_tokens: self.report.active_prefill_tokens,
            waiting_requests: self.report.waiting_requests,
            max_num_seqs: self.report.max_num_seqs,
        }
    }
}

/// [`Decoded`], borrowing from the payload.
#[derive(Debug)]
pub(crate) enum DecodedRef<'a> {
    Load(LoadRef<'a>),
    ActiveLoad(ActiveLoad),
    Envelope(Envelope),
    ForwardPass(ForwardPass),
    Sequence(SequenceEvent),
}

/// Decodes a msgpack or JSON payload (JSON when it starts with `{`).
pub fn decode(bytes: &[u8]) -> Result<Decoded, WireError> {
    Ok(match decode_ref(bytes)? {
        DecodedRef::Load(l) => Decoded::Load(l.into_owned()),
        DecodedRef::ActiveLoad(a) => Decoded::ActiveLoad(a),
        DecodedRef::Envelope(e) => Decoded::Envelope(e),
        DecodedRef::ForwardPass(f) => Decoded::ForwardPass(f),
        DecodedRef::Sequence(s) => Decoded::Sequence(s),
    })
}

pub(crate) fn decode_ref(bytes: &[u8]) -> Result<DecodedRef<'_>, WireError> {
    let first = bytes.iter().find(|b| !b.is_ascii_whitespace());
    let any: AnyPayload<'_> = match first {
        None => return Err(WireError::Malformed("empty payload".into())),
        Some(b'{') => {
            serde_json::from_slice(bytes).map_err(|e| WireError::Malformed(e.to_string()))?
        }
        Some(_) => match decode_msgpack_fast(bytes) {
            Some(any) => any,
            None => {
                rmp_serde::from_slice(bytes).map_err(|e| WireError::Malformed(e.to_string()))?
            }
        },
    };
    let missing = |field: &str| WireError::Malformed(format!("missing field {field}"));
    if let Some(payload) = any.payload {
        let publisher_id = any.publisher_id.ok_or_else(|| missing("publisher_id"))?;
        let sequence = any.sequence.ok_or_else(|| missing("sequence"))?;
        match any.topic.as_deref() {
            Some(FORWARD_PASS_TOPIC) => {
                let f = forward_pass::decode(publisher_id, sequence, payload)?;
                return Ok(DecodedRef::ForwardPass(f));
            }
            Some(ACTIVE_SEQUENCES_TOPIC) => {
                return Ok(DecodedRef::Sequence(sequences::decode(payload)?));
            }
            _ => {}
        }
        return Ok(DecodedRef::Envelope(Envelope {
            publisher_id,
            sequence,
            load: dynamo::decode_payload(payload)?,
        }));
    }
    let worker_id = any.worker_id.ok_or_else(|| missing("worker_id"))?;
    let Some(v) = any.v else {
        return Ok(DecodedRef::ActiveLoad(ActiveLoad {
            worker_id,
            dp_rank: any.dp_rank.unwrap_or(0),
            active_decode_blocks: any.active_decode_blocks,
            active_prefill_tokens: any.active_prefill_tokens,
            kv_used_blocks: any.kv_used_blocks,
        }));
    };
    if v != u64::from(SCHEMA_VERSION) {
        return Err(WireError::UnsupportedVersion(v));
    }
    let msg = LoadRef {
        instance: any.instance.ok_or_else(|| missing("instance"))?,
        seq: any.seq.ok_or_else(|| missing("seq"))?,
        worker_id,
        model: any.model.ok_or_else(|| missing("model"))?,
        dp_start: any.dp_start.unwrap_or(0),
        dp_size: any.dp_size.unwrap_or(1),
        dp_rank: any.dp_rank.ok_or_else(|| missing("dp_rank"))?,
        report: LoadReport {
            active_decode_blocks: any.active_decode_blocks,
            kv_used_blocks: any.kv_used_blocks,
            kv_total_blocks: any.kv_total_blocks,
            active_prefill_tokens: any.active_prefill_tokens,
            max_num_batched_tokens: any.max_num_batched_tokens,
            waiting_requests: any.waiting_requests,
            max_num_seqs: any.max_num_seqs,
        },
    };
    validate(&msg)?;
    Ok(DecodedRef::Load(msg))
}

/// The fast path for the msgpack this crate writes: a flat map of known keys
/// with unsigned integer, nil or (for `model`) string values, read without
/// serde. Anything else returns `None` and the serde path decides, with its
/// precise error.
fn decode_msgpack_fast(bytes: &[u8]) -> Option<AnyPayload<'_>> {
    const KEYS: [&[u8]; 15] = [
        b"v",
        b"instance",
        b"seq",
        b"worker_id",
        b"model",
        b"dp_start",
        b"dp_size",
        b"dp_rank",
        b"kv_total_blocks",
        b"max_num_batched_tokens",
        b"active_decode_blocks",
        b"kv_used_blocks",
        b"active_prefill_tokens",
        b"waiting_requests",
        b"max_num_seqs",
    ];
    let mut rd = bytes;
    let entries = take_map_len(&mut rd)?;
    let mut any = AnyPayload::default();
    // A repeated key is an error for serde; leave it to that path.
    let mut seen = 0u16;
    for _ in 0..entries {
        let key = take_str(&mut rd)?;
        let k = KEYS.iter().position(|&name| name == key)?;
        if seen & 1 << k != 0 {
            return None;
        }
        seen |= 1 << k;
        if rd.first() == Some(&0xc0) {
            rd = &rd[1..];
            continue; // nil: the field stays absent
        }
        if k == 4 {
            any.model = Some(Cow::Borrowed(std::str::from_utf8(take_str(&mut rd)?).ok()?));
            continue;
        }
        let value = Some(take_uint(&mut rd)?);
        let small = || value.map(u32::try_from).transpose().ok();
        match k {
            0 => any.v = value,
            1 => any.instance = value,
            2 => any.seq = value,
            3 => any.worker_id = value,
            5 => any.dp_start = small()?,
            6 => any.dp_size = small()?,
            7 => any.dp_rank = small()?,
            8 => any.kv_total_blocks = value,
            9 => any.max_num_batched_tokens = value,
            10 => any.active_decode_blocks = value,
            11 => any.kv_used_blocks = value,
            12 => any.active_prefill_tokens = value,
            13 => any.waiting_requests = value,
            _ => any.max_num_seqs = value,
        }
    }
    rd.is_empty().then_some(any)
}

/// Takes `n` bytes off the front of `rd`.
#[inline]
fn take<'a>(rd: &mut &'a [u8], n: usize) -> Option<&'a [u8]> {
    if rd.len() < n {
        return None;
    }
    let (head, rest) = rd.split_at(n);
    *rd = rest;
    Some(head)
}

/// A big-endian unsigned integer of `n` (1, 2, 4 or 8) bytes.
#[inline]
fn take_be(rd: &mut &[u8], n: usize) -> Option<u64> {
    Some(
        take(rd, n)?
            .iter()
            .fold(0, |acc, &b| acc << 8 | u64::from(b)),
    )
}

/// A msgpack map header (fixmap, map 16, map 32).
#[inline]
fn take_map_len(rd: &mut &[u8]) -> Option<u64> {
    let marker = take(rd, 1)?[0];
    match marker {
        0x80..=0x8f => Some(u64::from(marker & 0x0f)),
        0xde => take_be(rd, 2),
        0xdf => take_be(rd, 4),
        _ => None,
    }
}

/// A msgpack string's bytes (fixstr, str 8, str 16), not yet checked as
/// UTF-8: keys are compared as bytes, and the one string value is checked.
#[inline]
fn take_str<'a>(rd: &mut &'a [u8]) -> Option<&'a [u8]> {
    let marker = take(rd, 1)?[0];
    let len = match marker {
        0xa0..=0xbf => u64::from(marker & 0x1f),
        0xd9 => take_be(rd, 1)?,
        0xda => take_be(rd, 2)?,
        _ => return None,
    };
    take(rd, len as usize)
}

/// A msgpack unsigned integer (positive fixint, uint 8/16/32/64). Other
/// encodings leave the payload to the serde path.
#[inline]
fn take_uint(rd: &mut &[u8]) -> Option<u64> {
    let marker = take(rd, 1)?[0];
    match marker {
        0x00..=0x7f => Some(u64::from(marker)),
        0xcc => take_be(rd, 1),
        0xcd => take_be(rd, 2),
        0xce => take_be(rd, 4),
        0xcf => take_be(rd, 8),
        _ => None,
    }
}

/// The declaration and report rules of [`crate::load`] (the monitor's and
/// the publisher's), worded as wire errors.
fn validate(msg: &LoadRef<'_>) -> Result<(), WireError> {
    if check_model(&msg.model).is_err() {
        return Err(WireError::Invalid("model is empty".into()));
    }
    let end = check_ranks(msg.dp_start, msg.dp_size).map_err(|_| {
        WireError::Invalid(format!(
            "dp_start {} + dp_size {} overflows",
            msg.dp_start, msg.dp_size
        ))
    })?;
    if rank_index(msg.worker_id, msg.dp_start, msg.dp_size, msg.dp_rank).is_err() {
        return Err(WireError::Invalid(format!(
            "dp_rank {} outside declared ranks {}..{end}",
            msg.dp_rank, msg.dp_start
        )));
    }
    if let Err(ReportError::InvalidValue { field, .. }) = msg.report.check() {
        return Err(WireError::Invalid(format!("{field} out of range")));
    }
    Ok(())
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    fn message() -> LoadMessage {
        LoadMessage {
            v: SCHEMA_VERSION,
            instance: 77,
            seq: 5,
            worker_id: 3,
            model: "llama".into(),
            dp_start: 2,
            dp_size: 2,
            dp_rank: 3,
            kv_total_blocks: Some(1000),
            max_num_batched_tokens: None,
            active_decode_blocks: None,
            kv_used_blocks: Some(10),
            active_prefill_tokens: Some(0),
            waiting_requests: None,
            max_num_seqs: None,
        }
    }

    #[test]
    fn envelopes_round_trip_in_msgpack_and_json() {
        let m = message();
        assert_eq!(decode(&m.to_msgpack()), Ok(Decoded::Load(m.clone())));
        assert_eq!(decode(&m.to_json()), Ok(Decoded::Load(m.clone())));
        // Named map: field names are on the wire.
        let bytes = m.to_msgpack();
        assert!(bytes.windows(9).any(|w| w == b"worker_id"));
        assert!(
            !bytes.windows(11).any(|w| w == b"active_deco"),
            "absent fields are not sent"
        );
    }

    #[test]
    fn the_envelopes_this_crate_writes_take_the_fast_path() {
        let mut m = message();
        m.active_decode_blocks = Some(u64::MAX - 1);
        m.max_num_batched_tokens = Some(0);
        assert!(decode_msgpack_fast(&m.to_msgpack()).is_some());
    }

    /// An optional field named `name`, absent from a message's bytes until
    /// `set` gives it a value; then read back on every path.
    fn travels_only_when_given(name: &[u8], set: impl FnOnce(&mut LoadMessage)) -> LoadMessage {
        let mut m = message();
        assert!(
            !m.to_msgpack().windows(name.len()).any(|w| w == name),
            "absent, so a reader that predates the field sees the old bytes"
        );
        set(&mut m);
        let bytes = m.to_msgpack();
        assert!(bytes.windows(name.len()).any(|w| w == name));
        assert!(decode_msgpack_fast(&bytes).is_some());
        assert_eq!(decode(&bytes), Ok(Decoded::Load(m.clone())));
        assert_eq!(decode(&m.to_json()), Ok(Decoded::Load(m.clone())));
        m
    }

    #[test]
    fn waiting_requests_travel_only_when_given() {
        let mut m = travels_only_when_given(b"waiting_requests", |m| m.waiting_requests = Some(17));
        assert_eq!(m.report().waiting_requests, Some(17));
        m.waiting_requests = Some(u64::MAX);
        assert!(matches!(
            decode(&m.to_msgpack()),
            Err(WireError::Invalid(why)) if why.contains("waiting_requests")
        ));
    }

    #[test]
    fn the_engines_seats_travel_only_when_given() {
        let m = travels_only_when_given(b"max_num_seqs", |m| m.max_num_seqs = Some(256));
        assert_eq!(m.report().max_num_seqs, Some(256));
    }

    /// Whenever the fast path accepts a payload, serde reads the same from it.
    fn fast_path_agrees_with_serde(bytes: &[u8]) {
        if let Some(fast) = decode_msgpack_fast(bytes) {
            let slow: AnyPayload<'_> = rmp_serde::from_slice(bytes)
                .unwrap_or_else(|e| panic!("fast path accepted {bytes:x?}, serde refused: {e}"));
            assert_eq!(fast, slow, "{bytes:x?}");
        }
    }

    #[test]
    fn the_fast_path_reads_what_serde_reads() {
        let mut rng = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = move || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        for round in 0..20_000 {
            let r = next();
            // Values of every msgpack width, fields present or absent.
            let v: [Option<u64>; 6] = std::array::from_fn(|b| {
                (r >> (20 + b) & 1 == 1).then(|| {
                    let x = next();
                    x >> (next() % 64)
                })
            });
            let m = LoadMessage {
                v: SCHEMA_VERSION,
                instance: next(),
                seq: next() >> (r % 64),
                worker_id: next() >> 40,
                model: "é-model-".repeat(1 + (r >> 8) as usize % 40),
                dp_start: (next() % 8) as u32,
                dp_size: 1 + (next() % 8) as u32,
                dp_rank: (next() % 16) as u32,
                kv_total_blocks: v[0],
                max_num_batched_tokens: v[1],
                active_decode_blocks: v[2],
                kv_used_blocks: v[3],
                active_prefill_tokens: v[4],
                waiting_requests: v[5],
                max_num_seqs: None,
            };
            let bytes = m.to_msgpack();
            assert!(decode_msgpack_fast(&bytes).is_some(), "{m:?}");
            fast_path_agrees_with_serde(&bytes);
            // Damaged copies: a changed byte, a cut, a repeated entry.
            let mut bad = bytes.clone();
            let i = (next() % bad.len() as u64) as usize;
            bad[i] = next() as u8;
            fast_path_agrees_with_serde(&bad);
            fast_path_agrees_with_serde(&bytes[..i]);
            if round % 7 == 0 {
                let mut dup = bytes.clone();
                dup[0] += 1; // one more entry in the fixmap ...
                dup.extend_from_slice(&bytes[1..4]); // ... repeating "v": 1
                fast_path_agrees_with_serde(&dup);
                assert!(decode_msgpack_fast(&dup).is_none());
            }
        }
    }

    #[test]
    fn reference_active_load_is_decoded() {
        let json = br#"{"worker_id": 9, "dp_rank": 1, "active_decode_blocks": 12, "active_prefill_tokens": null}"#;
        let want = ActiveLoad {
            worker_id: 9,
            dp_rank: 1,
            active_decode_blocks: Some(12),
            active_prefill_tokens: None,
            kv_used_blocks: None,
        };
        assert_eq!(decode(json), Ok(Decoded::ActiveLoad(want.clone())));
        let packed = rmp_serde::to_vec_named(&want).unwrap();
        assert_eq!(decode(&packed), Ok(Decoded::ActiveLoad(want)));
    }

    #[test]
    fn bad_payloads_are_typed_errors() {
        assert!(matches!(decode(b""), Err(WireError::Malformed(_))));
        assert!(matches!(decode(b"{nope"), Err(WireError::Malformed(_))));
        assert!(matches!(
            decode(&[0xc1, 0xff, 0x00]),
            Err(WireError::Malformed(_))
        ));
        assert!(matches!(
            decode(br#"{"dp_rank": 1}"#),
            Err(WireError::Malformed(_))
        ));
        assert!(matches!(
            decode(br#"{"worker_id": "x"}"#),
            Err(WireError::Malformed(_))
        ));
        assert!(matches!(
            decode(br#"{"worker_id": -1}"#),
            Err(WireError::Malformed(_))
        ));
        let mut m = message();
        m.v = 2;
        assert_eq!(decode(&m.to_json()), Err(WireError::UnsupportedVersion(2)));
        let mut m = message();
        m.dp_rank = 4;
        assert!(matches!(
            decode(&m.to_msgpack()),
            Err(WireError::Invalid(_))
        ));
        let mut m = message();
        m.model.clear();
        assert!(matches!(
            decode(&m.to_msgpack()),
            Err(WireError::Invalid(_))
        ));
        let mut m = message();
        m.dp_start = u32::MAX;
        assert!(matches!(decode(&m.to_json()), Err(WireError::Invalid(_))));
    }
}
