//! The arguments the calls draw from the input: handles (NULL or one of the
//! live handles of a kind), strings as pointer and length (valid, cut, not
//! UTF-8, NULL), small numbers with edges, text buffers, and the C structs
//! built from them.

use std::ptr::null;

use libfuzzer_sys::arbitrary::{self, Arbitrary, Unstructured};
use loadgate_ffi::{lg_gate_class, lg_load_report, lg_worker_spec};

/// A handle argument: NULL, or one of the live handles of its kind.
#[derive(Debug, Clone, Copy, Arbitrary)]
pub struct Handle(pub u8);

/// A string argument as pointer + length.
#[derive(Debug, Arbitrary)]
pub enum Str {
    /// A known-good value ("llama", "mistral", "GET", "application/json"...).
    Known(u8),
    /// Any bytes, UTF-8 or not.
    Bytes(Vec<u8>),
    /// A known value cut short (possibly inside a UTF-8 sequence).
    Cut(u8, u8),
    /// NULL with length 0 (allowed) or with a length (refused).
    Null(u8),
}

pub const KNOWN: [&str; 8] = [
    "llama",
    "mistral",
    "GET",
    "POST",
    "application/json",
    r#"{"model": "llama", "active_decode_blocks_threshold": 0.5}"#,
    "héllo",
    "dynamo_x",
];

impl Str {
    /// Pointer and length; `keep` holds the bytes for the call.
    pub fn raw<'a>(&'a self, keep: &'a mut Vec<u8>) -> (*const u8, usize) {
        match self {
            Str::Known(i) => {
                let s = KNOWN[usize::from(*i) % KNOWN.len()];
                (s.as_ptr(), s.len())
            }
            Str::Bytes(b) => (b.as_ptr(), b.len()),
            Str::Cut(i, n) => {
                let s = KNOWN[usize::from(*i) % KNOWN.len()].as_bytes();
                keep.extend_from_slice(&s[..usize::from(*n) % (s.len() + 1)]);
                (keep.as_ptr(), keep.len())
            }
            Str::Null(n) => (null(), usize::from(*n % 2) * 7),
        }
    }

    /// Whether the callee must refuse it as a string (NULL with a length or
    /// not UTF-8).
    pub fn invalid(&self) -> bool {
        let mut keep = Vec::new();
        let (p, len) = self.raw(&mut keep);
        if p.is_null() {
            return len != 0;
        }
        // SAFETY: `raw` returns a pointer valid for `len` bytes.
        std::str::from_utf8(unsafe { std::slice::from_raw_parts(p, len) }).is_err()
    }
}

/// A small value most of the time, an edge sometimes.
#[derive(Debug, Clone, Copy)]
pub struct Small(pub u64);

impl<'a> Arbitrary<'a> for Small {
    fn arbitrary(u: &mut Unstructured<'a>) -> arbitrary::Result<Self> {
        Ok(Small(match u.arbitrary::<u8>()? {
            0..=199 => u64::from(u.int_in_range(0u8..=9)?),
            200..=239 => u.arbitrary()?,
            n => u64::MAX - u64::from(n % 3),
        }))
    }
}

/// A count setting: small most of the time; at the ends of the documented
/// ranges (1,048,576 requests or tenants, 4,096 frontends) or anything
/// sometimes.
#[derive(Debug, Clone, Copy)]
pub struct Count(pub u32);

impl<'a> Arbitrary<'a> for Count {
    fn arbitrary(u: &mut Unstructured<'a>) -> arbitrary::Result<Self> {
        const EDGES: [u32; 6] = [0, 1_048_575, 1_048_576, 1_048_577, 4096, 4097];
        Ok(Count(match u.arbitrary::<u8>()? {
            0..=199 => u32::from(u.int_in_range(0u8..=9)?),
            200..=229 => EDGES[usize::from(u.int_in_range(0u8..=5)?)],
            _ => u.arbitrary()?,
        }))
    }
}

/// A text buffer: NULL or `len` bytes (`len` may be 0 or too short).
#[derive(Debug, Clone, Copy, Arbitrary)]
pub struct Buf {
    pub null: bool,
    pub len: u16,
}

#[derive(Debug, Default, Arbitrary)]
pub struct Spec {
    pub dp_start_high: bool,
    pub dp_start: u8,
    pub dp_size: u8,
    pub total: Option<Small>,
    pub mnbt: Option<Small>,
    pub seats: Option<Small>,
}

#[derive(Debug, Default, Arbitrary)]
pub struct Report {
    pub decode: Option<Small>,
    pub used: Option<Small>,
    pub total: Option<Small>,
    pub prefill: Option<Small>,
    pub mnbt: Option<Small>,
    pub waiting: Option<Small>,
    pub seats: Option<Small>,
}

#[derive(Debug, Arbitrary)]
pub struct Update {
    pub decode: Option<f64>,
    pub abs: Option<Small>,
    pub frac: Option<f64>,
    pub waiting: Option<Small>,
    pub clear: u8,
}

#[derive(Debug, Arbitrary)]
pub struct MonitorConfig {
    pub lease_ms: u8,
    pub stale_after_ms: u16,
    pub staleness: u32,
    pub max_workers: u8,
    pub prefix: Option<Str>,
    pub dynamo_env: bool,
    /// A policy, or (3) none that exists.
    pub routing: u8,
    /// Past 16 is refused.
    pub reroutes: u8,
}

#[derive(Debug, Arbitrary)]
pub struct GateConfig {
    pub limit: u8,
    pub queue: u8,
    pub timeout_ms: u8,
    pub lifo: bool,
    pub wait_limit: u8,
    pub prefix: Option<Str>,
    pub classes: Option<Classes>,
}

/// The priority classes of a gate config: an array of any length (more
/// than LG_MAX_CLASSES is refused), or NULL with a count (refused unless
/// the count is 0).
#[derive(Debug, Arbitrary)]
pub enum Classes {
    Array(Vec<GateClass>),
    Null(u8),
}

/// One class; its queue and reservation sometimes exceed the gate's queue
/// and limit (refused).
#[derive(Debug, Clone, Copy, Arbitrary)]
pub struct GateClass {
    pub queue: u8,
    pub timeout_ms: u8,
    pub reserved: u8,
}

impl GateClass {
    pub fn raw(&self) -> lg_gate_class {
        lg_gate_class {
            queue: u32::from(self.queue % 42),
            queue_timeout_ms: [0, 1, 60_000, u64::MAX][usize::from(self.timeout_ms % 4)],
            reserved: u32::from(self.reserved % 6),
        }
    }
}

pub fn worker_spec(s: &Spec) -> lg_worker_spec {
    lg_worker_spec {
        dp_start: if s.dp_start_high {
            u32::MAX - u32::from(s.dp_start % 4)
        } else {
            u32::from(s.dp_start % 4)
        },
        dp_size: u32::from(s.dp_size % 4),
        has_kv_total_blocks: s.total.is_some(),
        kv_total_blocks: s.total.map_or(0, |v| v.0),
        has_max_num_batched_tokens: s.mnbt.is_some(),
        max_num_batched_tokens: s.mnbt.map_or(0, |v| v.0),
        has_max_num_seqs: s.seats.is_some(),
        max_num_seqs: s.seats.map_or(0, |v| v.0),
    }
}

pub fn worker_report(r: &Report) -> lg_load_report {
    lg_load_report {
        has_active_decode_blocks: r.decode.is_some(),
        active_decode_blocks: r.decode.map_or(0, |v| v.0),
        has_kv_used_blocks: r.used.is_some(),
        kv_used_blocks: r.used.map_or(0, |v| v.0),
        has_kv_total_blocks: r.total.is_some(),
        kv_total_blocks: r.total.map_or(0, |v| v.0),
        has_active_prefill_tokens: r.prefill.is_some(),
        active_prefill_tokens: r.prefill.map_or(0, |v| v.0),
        has_max_num_batched_tokens: r.mnbt.is_some(),
        max_num_batched_tokens: r.mnbt.map_or(0, |v| v.0),
        has_waiting_requests: r.waiting.is_some(),
        waiting_requests: r.waiting.map_or(0, |v| v.0),
        has_max_num_seqs: r.seats.is_some(),
        max_num_seqs: r.seats.map_or(0, |v| v.0),
    }
}
