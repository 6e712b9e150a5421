//! The load-report wire decoder (msgpack and JSON,
//! docs/behaviour.md#across-machines).
//!
//! Two checks per input:
//! * the raw bytes: `decode` never panics; whatever it accepts re-encodes
//!   (msgpack and JSON) and decodes to the same value (forward-pass
//!   metrics and router booking events, which are only read, stay within
//!   what the monitor takes);
//! * the bytes read as an envelope's fields: an envelope this crate encodes
//!   decodes to itself in both encodings when it is valid, and to the typed
//!   error its fault calls for when it is not.
#![no_main]

use libfuzzer_sys::arbitrary::{self, Unstructured};
use libfuzzer_sys::fuzz_target;
use loadgate::cluster::wire::{
    decode, ActiveLoad, Decoded, Envelope, LoadMessage, WireError, MAX_REQUEST_ID, SCHEMA_VERSION,
};

/// Field values biased towards the boundaries `decode` validates.
fn u32_field(u: &mut Unstructured<'_>) -> arbitrary::Result<u32> {
    Ok(match u.arbitrary::<u8>()? {
        0..=199 => u32::from(u.int_in_range(0u8..=4)?),
        200..=239 => u.arbitrary()?,
        n => u32::MAX - u32::from(n % 4),
    })
}

fn u64_field(u: &mut Unstructured<'_>) -> arbitrary::Result<Option<u64>> {
    Ok(match u.arbitrary::<u8>()? {
        0..=63 => None,
        64..=191 => Some(u64::from(u.arbitrary::<u16>()?)),
        192..=247 => Some(u.arbitrary()?),
        n => Some(u64::MAX - u64::from(n % 2)),
    })
}

fn message(u: &mut Unstructured<'_>) -> arbitrary::Result<LoadMessage> {
    let v = if u.ratio(7u8, 8)? {
        SCHEMA_VERSION
    } else {
        u.arbitrary()?
    };
    let model = if u.ratio(1u8, 16)? {
        String::new()
    } else {
        let s: String = u.arbitrary()?;
        if s.is_empty() {
            "llama".to_owned()
        } else {
            s
        }
    };
    Ok(LoadMessage {
        v,
        instance: u.arbitrary()?,
        seq: u.arbitrary()?,
        worker_id: u.arbitrary()?,
        model,
        dp_start: u32_field(u)?,
        dp_size: u32_field(u)?,
        dp_rank: u32_field(u)?,
        kv_total_blocks: u64_field(u)?,
        max_num_batched_tokens: u64_field(u)?,
        active_decode_blocks: u64_field(u)?,
        kv_used_blocks: u64_field(u)?,
        active_prefill_tokens: u64_field(u)?,
        waiting_requests: u64_field(u)?,
        max_num_seqs: u64_field(u)?,
    })
}

fn envelope(u: &mut Unstructured<'_>) -> arbitrary::Result<Envelope> {
    Ok(Envelope {
        publisher_id: u.arbitrary()?,
        sequence: u.arbitrary()?,
        load: ActiveLoad {
            worker_id: u.arbitrary()?,
            dp_rank: u32_field(u)?,
            active_decode_blocks: u64_field(u)?,
            active_prefill_tokens: u64_field(u)?,
            kv_used_blocks: u64_field(u)?,
        },
    })
}

/// What `decode` must answer for an encoded `m`.
fn expected(m: &LoadMessage) -> Result<(), &'static str> {
    if m.v != SCHEMA_VERSION {
        return Err("unsupported_version");
    }
    let ranks_ok = m
        .dp_start
        .checked_add(m.dp_size)
        .is_some_and(|end| (m.dp_start..end).contains(&m.dp_rank));
    // u64::MAX marks a field never reported, so no message may carry it.
    let reserved =
        m.active_prefill_tokens == Some(u64::MAX) || m.waiting_requests == Some(u64::MAX);
    if m.model.is_empty() || !ranks_ok || reserved {
        return Err("invalid");
    }
    Ok(())
}

fn round_trips(decoded: &Decoded) {
    match decoded {
        Decoded::Load(m) => {
            assert_eq!(decode(&m.to_msgpack()).as_ref(), Ok(decoded), "msgpack");
            assert_eq!(decode(&m.to_json()).as_ref(), Ok(decoded), "json");
        }
        Decoded::ActiveLoad(a) => {
            let packed = rmp_serde::to_vec_named(a).expect("ActiveLoad serializes");
            assert_eq!(decode(&packed).as_ref(), Ok(decoded), "msgpack");
            let json = serde_json::to_vec(a).expect("ActiveLoad serializes");
            assert_eq!(decode(&json).as_ref(), Ok(decoded), "json");
        }
        Decoded::Envelope(e) => {
            assert_eq!(decode(&e.to_msgpack(1)).as_ref(), Ok(decoded), "msgpack");
            assert_eq!(decode(&e.to_json(1)).as_ref(), Ok(decoded), "json");
        }
        // Read, never written: what is accepted is a report the monitor takes
        // (never the marker of a field not reported).
        Decoded::ForwardPass(f) => {
            assert!(f.queued_requests < u64::MAX, "{f:?}");
            assert!(f.report().waiting_requests.is_some());
        }
        // Read, never written: a request id that fits the bound.
        Decoded::Sequence(e) => {
            assert!(
                !e.request_id.is_empty() && e.request_id.len() <= MAX_REQUEST_ID,
                "{e:?}"
            );
        }
    }
}

fuzz_target!(|data: &[u8]| {
    match decode(data) {
        Ok(decoded) => round_trips(&decoded),
        Err(e) => {
            // Typed, printable, and labelled for metrics.
            assert!(!e.to_string().is_empty());
            assert!(matches!(
                e.kind(),
                "malformed" | "unsupported_version" | "invalid"
            ));
        }
    }

    let mut u = Unstructured::new(data);
    if let Ok(e) = envelope(&mut u) {
        // The reference's envelope, as it writes it, reads back as itself.
        let want = Ok(Decoded::Envelope(e.clone()));
        assert_eq!(decode(&e.to_msgpack(u64::MAX)), want, "msgpack envelope");
        assert_eq!(decode(&e.to_json(0)), want, "json envelope");
    }
    let Ok(m) = message(&mut u) else { return };
    for (encoding, bytes) in [("msgpack", m.to_msgpack()), ("json", m.to_json())] {
        let got = decode(&bytes);
        match expected(&m) {
            Ok(()) => assert_eq!(
                got,
                Ok(Decoded::Load(m.clone())),
                "{encoding} envelope does not round-trip"
            ),
            Err(kind) => {
                let e = got.expect_err("an invalid envelope is refused");
                assert_eq!(e.kind(), kind, "{encoding}: {e}");
                if let WireError::UnsupportedVersion(v) = e {
                    assert_eq!(v, u64::from(m.v));
                }
            }
        }
    }
});
