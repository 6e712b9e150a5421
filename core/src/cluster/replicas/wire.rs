//! The booking snapshot a frontend publishes: a msgpack named map (JSON
//! accepted) carrying a schema version, the frontend's id, the instance of
//! its process, a sequence number, and its whole state: every rank it has
//! bookings on, and every flow-controlled model's queue. A snapshot
//! replaces the last one from the same frontend, so a lost one is repaired
//! by the next. In leased mode a snapshot also carries the frontend's
//! [`Lease`] section (`lease.rs`).

use serde::{Deserialize, Serialize};

use crate::cluster::wire::WireError;

/// The snapshot schema version this crate writes and reads.
pub const SNAPSHOT_VERSION: u32 = 1;

/// One frontend's bookings and queues.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Snapshot {
    /// Schema version ([`SNAPSHOT_VERSION`]).
    pub v: u32,
    /// The frontend (also the last token of the subject it is sent on).
    pub frontend: String,
    /// One run of the frontend's process: sequence numbers are ordered
    /// only within one instance, so a restarted frontend is accepted.
    pub instance: u64,
    /// Per-instance sequence number, one more with every snapshot.
    pub seq: u64,
    /// The frontend has just joined: every other frontend sends its own
    /// snapshot at once.
    #[serde(default)]
    pub hello: bool,
    /// Its bookings, one entry per rank that has any.
    #[serde(default)]
    pub ranks: Vec<RankEntry>,
    /// Its queues, one entry per flow-controlled model.
    #[serde(default)]
    pub queues: Vec<QueueEntry>,
    /// Leased mode's section; absent in shared mode.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease: Option<Lease>,
}

/// A leased-mode frontend's claim on every rank's line, and what it has
/// heard from the others (docs/replicas.md, "Leased mode").
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lease {
    /// The sender's clock when it sent this snapshot (its own monotonic
    /// nanoseconds; only the sender compares them), rising with every
    /// snapshot of an instance.
    pub stamp: u64,
    /// The share of every rank's line it may come to use, in parts per
    /// million: never below what it uses.
    pub claim: u32,
    /// The share it uses now: at most its claim, which stays above it
    /// while a raise is confirmed or bookings past a lowered share drain.
    pub used: u32,
    /// A raise of its claim is being confirmed: the others answer at once.
    #[serde(default)]
    pub raising: bool,
    /// The share it would like.
    pub want: u32,
    /// Every frontend it hears: the latest stamp of each.
    pub heard: Vec<Heard>,
}

/// The latest stamp one frontend heard from another.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Heard {
    /// The frontend heard.
    pub frontend: String,
    /// Its instance.
    pub instance: u64,
    /// Its latest stamp (0 for a frontend not in leased mode).
    pub stamp: u64,
}

/// One rank's bookings made by one frontend.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct RankEntry {
    /// The worker.
    pub worker_id: u64,
    /// Its rank.
    pub dp_rank: u32,
    /// Booked KV blocks.
    pub blocks: u64,
    /// Booked prefill tokens.
    #[serde(default)]
    pub prefill: u64,
}

/// One model's frontend queue.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueueEntry {
    /// The model.
    pub model: String,
    /// Requests waiting.
    pub requests: u32,
    /// Estimated tokens waiting.
    pub tokens: u64,
}

impl Snapshot {
    /// Encodes as a msgpack named map.
    pub fn to_msgpack(&self) -> Vec<u8> {
        rmp_serde::to_vec_named(self).expect("a Snapshot always serializes")
    }

    /// Decodes msgpack or JSON (a payload starting with `{`). Never panics.
    pub fn decode(bytes: &[u8]) -> Result<Self, WireError> {
        let s: Snapshot = if bytes.first() == Some(&b'{') {
            serde_json::from_slice(bytes).map_err(|e| WireError::Malformed(e.to_string()))?
        } else {
            rmp_serde::from_slice(bytes).map_err(|e| WireError::Malformed(e.to_string()))?
        };
        if s.v != SNAPSHOT_VERSION {
            return Err(WireError::UnsupportedVersion(u64::from(s.v)));
        }
        Ok(s)
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    fn snapshot() -> Snapshot {
        Snapshot {
            v: SNAPSHOT_VERSION,
            frontend: "fe-1".into(),
            instance: 7,
            seq: 3,
            hello: true,
            ranks: vec![RankEntry {
                worker_id: 1,
                dp_rank: 0,
                blocks: 40,
                prefill: 512,
            }],
            queues: vec![QueueEntry {
                model: "m".into(),
                requests: 2,
                tokens: 900,
            }],
            lease: None,
        }
    }

    #[test]
    fn msgpack_and_json_round_trip() {
        let s = snapshot();
        assert_eq!(Snapshot::decode(&s.to_msgpack()), Ok(s.clone()));
        let json = serde_json::to_vec(&s).unwrap();
        assert_eq!(Snapshot::decode(&json), Ok(s.clone()));
        let mut leased = s;
        leased.lease = Some(Lease {
            stamp: 9,
            claim: 300_000,
            used: 250_000,
            raising: true,
            want: 1_000_000,
            heard: vec![Heard {
                frontend: "fe-2".into(),
                instance: 4,
                stamp: 77,
            }],
        });
        assert_eq!(Snapshot::decode(&leased.to_msgpack()), Ok(leased));
    }

    /// The size docs/replicas.md gives: the default payload bound holds
    /// every rank of a large fleet.
    #[test]
    fn a_snapshot_takes_under_fifty_bytes_per_booked_rank() {
        let sized = |n: u64| {
            let mut s = snapshot();
            s.hello = false;
            s.queues.clear();
            s.ranks = (0..n)
                .map(|i| RankEntry {
                    worker_id: 1_000_000 + i,
                    dp_rank: (i % 8) as u32,
                    blocks: 25_000,
                    prefill: 8192,
                })
                .collect();
            s.to_msgpack().len()
        };
        let (empty, thousand) = (sized(0), sized(1000));
        let per_rank = (thousand - empty) / 1000;
        let mut s = snapshot();
        s.ranks.clear();
        s.queues[0].model.clear();
        let one_queue = s.to_msgpack().len();
        s.queues.clear();
        let per_queue = one_queue - s.to_msgpack().len();
        eprintln!(
            "snapshot: {empty} bytes empty, {per_rank} bytes per booked rank, \
             {per_queue} per queue plus its model's name"
        );
        // Leased mode's section, with the frontends heard.
        let leased = |heard: usize| {
            let mut s = snapshot();
            s.ranks.clear();
            s.queues.clear();
            s.lease = Some(Lease {
                stamp: u64::MAX / 3,
                claim: 333_333,
                used: 333_333,
                raising: false,
                want: 1_000_000,
                heard: (0..heard)
                    .map(|i| Heard {
                        frontend: format!("frontend-{i:02}"),
                        instance: u64::MAX / 5,
                        stamp: u64::MAX / 7,
                    })
                    .collect(),
            });
            s.to_msgpack().len()
        };
        let section = leased(0) - empty;
        let per_heard = (leased(64) - leased(0)) / 64;
        eprintln!(
            "lease section: {section} bytes, and {per_heard} per frontend heard (an id of 11 \
             characters)"
        );
        assert!(per_rank < 50, "{per_rank}");
        assert!(per_queue < 40, "{per_queue}");
        assert!(section < 80 && per_heard < 60, "{section} {per_heard}");
        assert!(sized(16_384) < super::super::DEFAULT_SNAPSHOT_MAX_PAYLOAD);
    }

    #[test]
    fn bad_payloads_are_typed_errors() {
        assert!(matches!(
            Snapshot::decode(b"\xc1garbage"),
            Err(WireError::Malformed(_))
        ));
        assert!(matches!(
            Snapshot::decode(b""),
            Err(WireError::Malformed(_))
        ));
        let mut s = snapshot();
        s.v = 9;
        assert_eq!(
            Snapshot::decode(&s.to_msgpack()),
            Err(WireError::UnsupportedVersion(9))
        );
        // A rank entry of the wrong type.
        let json = br#"{"v":1,"frontend":"a","instance":1,"seq":1,"ranks":[{"worker_id":-1}]}"#;
        assert!(matches!(
            Snapshot::decode(json),
            Err(WireError::Malformed(_))
        ));
    }
}
