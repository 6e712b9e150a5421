//! Load messages driven through a frontend's subscriber into its monitor,
//! announcements included, under small limits (docs/limits.md).
//!
//! Checks after every step:
//! * nothing panics or aborts, whatever the sizes a message chooses;
//! * the monitor never holds more models, workers or workers per model
//!   than its limits allow, and a registration never exceeds the limits on
//!   names and ranks;
//! * a message whose worker id differs from its subject's is never applied;
//! * every message is counted exactly once: by outcome, or as a refusal
//!   under one reason.
#![no_main]

use std::sync::Arc;
use std::time::Duration;

use libfuzzer_sys::arbitrary::{self, Arbitrary, Unstructured};
use libfuzzer_sys::fuzz_target;
use loadgate::cluster::wire::{LoadMessage, SCHEMA_VERSION};
use loadgate::cluster::{Applied, Subscriber, SubscriberConfig};
use loadgate::{Limits, ManualClock, Monitor, MonitorConfig};

const LIMITS: Limits = Limits {
    max_models: 3,
    max_workers: 6,
    max_workers_per_model: 4,
    max_ranks_per_worker: 8,
    max_ranks: 16,
    max_name_len: 8,
};
const MAX_PAYLOAD: usize = 512;

/// A message's fields, biased towards the bounds.
#[derive(Debug)]
struct Message(LoadMessage);

impl<'a> Arbitrary<'a> for Message {
    fn arbitrary(u: &mut Unstructured<'a>) -> arbitrary::Result<Self> {
        let size = |u: &mut Unstructured<'a>| -> arbitrary::Result<u32> {
            Ok(match u.arbitrary::<u8>()? {
                0..=191 => u32::from(u.int_in_range(0u8..=10)?),
                192..=223 => u.int_in_range(14..=18)?,
                224..=247 => u.arbitrary()?,
                n => u32::MAX - u32::from(n % 4),
            })
        };
        let models = ["a", "b", "c", "d", "e", "", "123456789", "12345678"];
        let model = match u.arbitrary::<u8>()? {
            0..=239 => models[usize::from(u.int_in_range(0u8..=7)?)].to_owned(),
            _ => "x".repeat(usize::from(u.arbitrary::<u16>()? % 2048)),
        };
        let dp_start = size(u)?;
        let dp_size = size(u)?;
        let dp_rank = if u.ratio(7u8, 8)? {
            dp_start.saturating_add(u32::from(u.arbitrary::<u8>()?) % dp_size.max(1))
        } else {
            size(u)?
        };
        Ok(Message(LoadMessage {
            v: SCHEMA_VERSION,
            instance: u64::from(u.int_in_range(0u8..=2)?),
            seq: u64::from(u.int_in_range(0u8..=8)?),
            worker_id: u64::from(u.int_in_range(0u8..=9)?),
            model,
            dp_start,
            dp_size,
            dp_rank,
            kv_total_blocks: u.arbitrary()?,
            max_num_batched_tokens: u.arbitrary()?,
            active_decode_blocks: u.arbitrary()?,
            kv_used_blocks: u.arbitrary()?,
            active_prefill_tokens: u.arbitrary()?,
            waiting_requests: u.arbitrary()?,
            max_num_seqs: u.arbitrary()?,
        }))
    }
}

#[derive(Arbitrary, Debug)]
enum Op {
    /// A message on its own worker's subject, in msgpack or JSON.
    Own { msg: Message, json: bool },
    /// A message on another worker's subject.
    Spoofed { msg: Message, subject_id: u8 },
    /// A message with no subject check (the reference's subject).
    Unchecked { msg: Message },
    /// Raw bytes, possibly repeated past the payload bound.
    Raw { bytes: Vec<u8>, repeat: u16 },
    /// Time passes and silent workers expire.
    Expire { millis: u16 },
    /// The application removes a worker by hand.
    Remove { worker_id: u8 },
}

fn encode(msg: &LoadMessage, json: bool) -> Vec<u8> {
    if json {
        msg.to_json()
    } else {
        msg.to_msgpack()
    }
}

fuzz_target!(|ops: Vec<Op>| {
    let clock = ManualClock::new();
    let config = MonitorConfig {
        limits: LIMITS,
        ..Default::default()
    };
    let monitor = Arc::new(Monitor::with_config(config, clock.clone()).expect("valid limits"));
    let config = SubscriberConfig {
        expire_after: Duration::from_secs(3),
        max_payload: MAX_PAYLOAD,
        ..Default::default()
    };
    let s = Subscriber::new(monitor.clone(), config, clock.clone()).expect("valid config");
    let mut messages = 0u64;
    for op in ops.iter().take(256) {
        let (result, declared) = match op {
            Op::Own { msg, json } => {
                let subject = format!("loadgate.ns.load.{}", msg.0.worker_id);
                (s.handle_on(&subject, &encode(&msg.0, *json)), Some(&msg.0))
            }
            Op::Spoofed { msg, subject_id } => {
                let subject = format!("loadgate.ns.load.{subject_id}");
                let result = s.handle_on(&subject, &msg.0.to_msgpack());
                if u64::from(*subject_id) != msg.0.worker_id {
                    assert!(result.is_err(), "a spoofed message was applied: {result:?}");
                }
                (result, Some(&msg.0))
            }
            Op::Unchecked { msg } => (s.handle(&msg.0.to_msgpack()), Some(&msg.0)),
            Op::Raw { bytes, repeat } => {
                let payload = bytes.repeat(usize::from(*repeat % 64).max(1));
                (s.handle(&payload), None)
            }
            Op::Expire { millis } => {
                clock.advance(Duration::from_millis(u64::from(*millis) * 8));
                s.expire();
                continue;
            }
            Op::Remove { worker_id } => {
                let _ = monitor.remove_worker(u64::from(*worker_id));
                continue;
            }
        };
        messages += 1;
        assert_ne!(result, Ok(Applied::Queued), "handle never queues");
        if let (Ok(Applied::Announced), Some(msg)) = (&result, declared) {
            assert!(!msg.model.is_empty() && msg.model.len() <= LIMITS.max_name_len);
            assert!(msg.dp_size <= LIMITS.max_ranks_per_worker);
            assert!(monitor.rank_load(msg.worker_id, msg.dp_rank).is_ok());
        }

        let models = monitor.models();
        assert!(models.len() <= LIMITS.max_models, "{models:?}");
        let mut workers = 0;
        for m in &models {
            let n = monitor.workers(m).len();
            assert!(n <= LIMITS.max_workers_per_model);
            workers += n;
        }
        assert!(workers <= LIMITS.max_workers);

        let stats = s.stats();
        let refused: u64 = s.refusals().iter().map(|(_, n)| n).sum();
        assert_eq!(stats.malformed + stats.refused, refused);
        assert_eq!(
            stats.applied + stats.announced + stats.out_of_order + refused,
            messages,
            "every message counted once"
        );
    }
});
