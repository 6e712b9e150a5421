//! The message a frontend publishes: a msgpack named map (JSON accepted)
//! carrying a schema version, the frontend's id, the instance of its
//! process, a sequence number, and either its whole state (`full`: every
//! rank it has bookings on, every flow-controlled model's queue) or what
//! changed since its previous message (each rank and queue whose totals
//! changed, with its new totals; zero for one it no longer has).
//!
//! A change is a rank's new totals, not a booking's increment: the
//! bookings a busy rank takes and releases within one debounce interval
//! travel as one entry; a repeated message changes nothing; a change
//! applied after a lost one still sets its rank right, and only the ranks
//! last changed in the lost one wait for the repair (the next whole
//! state, which the receiver asks for by naming the sender in `resync`).
//! A receiver holds one entry per frontend and rank either way.
//!
//! A rank entry travels as an array `[worker_id, dp_rank, blocks,
//! prefill]`, about 20 bytes. In leased mode every message also carries the
//! frontend's [`Lease`] section (`lease.rs`).

use serde::{Deserialize, Serialize};

use crate::cluster::wire::WireError;

/// The schema version this crate writes and reads (1 was whole snapshots
/// only, with named rank entries: refused, and counted).
pub const SYNC_VERSION: u32 = 2;

/// Most frontends one message may ask for a whole state.
pub const MAX_RESYNC: usize = super::config::MAX_FRONTENDS;

/// One frontend's bookings and queues: whole, or what changed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SyncMessage {
    /// Schema version ([`SYNC_VERSION`]).
    pub v: u32,
    /// The frontend (also the last token of the subject it is sent on).
    pub frontend: String,
    /// One run of the frontend's process: sequence numbers are ordered
    /// only within one instance, so a restarted frontend is accepted.
    pub instance: u64,
    /// Per-instance sequence number, one more with every message.
    pub seq: u64,
    /// The frontend has just joined: every other frontend sends its whole
    /// state at once.
    #[serde(default, skip_serializing_if = "is_false")]
    pub hello: bool,
    /// `ranks` and `queues` are the whole state; otherwise they are what
    /// changed since the message before.
    #[serde(default, skip_serializing_if = "is_false")]
    pub full: bool,
    /// Its bookings: one entry per rank that has any (whole), or per rank
    /// whose totals changed (a change; all zero when it has none left).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ranks: Vec<RankEntry>,
    /// Its queues, one entry per flow-controlled model, the same way.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub queues: Vec<QueueEntry>,
    /// Frontends whose whole state the sender needs: it missed one of
    /// their messages. Each one named sends it at its next tick.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub resync: Vec<String>,
    /// Leased mode's section; absent in shared mode.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease: Option<Lease>,
}

fn is_false(b: &bool) -> bool {
    !*b
}

/// A leased-mode frontend's claim on every rank's line, and what it has
/// heard from the others (docs/replicas.md, "Leased mode").
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lease {
    /// The sender's clock when it sent this message (its own monotonic
    /// nanoseconds; only the sender compares them), rising with every
    /// message of an instance.
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

/// One rank's bookings made by one frontend (on the wire, an array
/// `[worker_id, dp_rank, blocks, prefill]`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(from = "(u64, u32, u64, u64)", into = "(u64, u32, u64, u64)")]
pub struct RankEntry {
    /// The worker.
    pub worker_id: u64,
    /// Its rank.
    pub dp_rank: u32,
    /// Booked KV blocks.
    pub blocks: u64,
    /// Booked prefill tokens.
    pub prefill: u64,
}

impl From<(u64, u32, u64, u64)> for RankEntry {
    fn from((worker_id, dp_rank, blocks, prefill): (u64, u32, u64, u64)) -> Self {
        Self {
            worker_id,
            dp_rank,
            blocks,
            prefill,
        }
    }
}

impl From<RankEntry> for (u64, u32, u64, u64) {
    fn from(e: RankEntry) -> Self {
        (e.worker_id, e.dp_rank, e.blocks, e.prefill)
    }
}

impl RankEntry {
    /// Its rank.
    pub fn key(&self) -> (u64, u32) {
        (self.worker_id, self.dp_rank)
    }
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

impl SyncMessage {
    /// Encodes as a msgpack named map.
    pub fn to_msgpack(&self) -> Vec<u8> {
        rmp_serde::to_vec_named(self).expect("a SyncMessage always serializes")
    }

    /// Decodes msgpack or JSON (a payload starting with `{`). Never panics.
    pub fn decode(bytes: &[u8]) -> Result<Self, WireError> {
        let s: SyncMessage = if bytes.first() == Some(&b'{') {
            serde_json::from_slice(bytes).map_err(|e| WireError::Malformed(e.to_string()))?
        } else {
            rmp_serde::from_slice(bytes).map_err(|e| WireError::Malformed(e.to_string()))?
        };
        if s.v != SYNC_VERSION {
            return Err(WireError::UnsupportedVersion(u64::from(s.v)));
        }
        if s.resync.len() > MAX_RESYNC {
            return Err(WireError::Invalid(format!(
                "asks {} frontends for their state: at most {MAX_RESYNC}",
                s.resync.len()
            )));
        }
        Ok(s)
    }
}

/// What changed from `old` to `new`, both sorted by `key` with one item
/// per key: every item of `new` not in `old` as it is, and every key of
/// `old` gone from `new` as `gone(item)`.
pub(super) fn changes<T: Clone + PartialEq, K: Ord>(
    old: &[T],
    new: &[T],
    key: impl Fn(&T) -> K,
    gone: impl Fn(&T) -> T,
) -> Vec<T> {
    use std::cmp::Ordering::{Equal, Greater, Less};
    let (mut i, mut j, mut out) = (0, 0, Vec::new());
    while i < old.len() || j < new.len() {
        let order = match (old.get(i), new.get(j)) {
            (Some(a), Some(b)) => key(a).cmp(&key(b)),
            (Some(_), None) => Less,
            _ => Greater,
        };
        match order {
            Less => {
                out.push(gone(&old[i]));
                i += 1;
            }
            Greater => {
                out.push(new[j].clone());
                j += 1;
            }
            Equal => {
                if old[i] != new[j] {
                    out.push(new[j].clone());
                }
                i += 1;
                j += 1;
            }
        }
    }
    out
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    fn message() -> SyncMessage {
        SyncMessage {
            v: SYNC_VERSION,
            frontend: "fe-1".into(),
            instance: 7,
            seq: 3,
            hello: true,
            full: true,
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
            resync: vec!["fe-2".into()],
            lease: None,
        }
    }

    #[test]
    fn msgpack_and_json_round_trip() {
        let s = message();
        assert_eq!(SyncMessage::decode(&s.to_msgpack()), Ok(s.clone()));
        let json = serde_json::to_vec(&s).unwrap();
        assert!(String::from_utf8_lossy(&json).contains(r#""ranks":[[1,0,40,512]]"#));
        assert_eq!(SyncMessage::decode(&json), Ok(s.clone()));
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
        assert_eq!(SyncMessage::decode(&leased.to_msgpack()), Ok(leased));
    }

    /// The sizes docs/replicas.md gives: a change costs about 20 bytes,
    /// and the default payload bound holds every rank of a large fleet.
    #[test]
    fn a_rank_entry_takes_about_twenty_bytes() {
        let sized = |n: u64| {
            let mut s = message();
            s.hello = false;
            s.queues.clear();
            s.resync.clear();
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
        let mut s = message();
        s.ranks.clear();
        s.resync.clear();
        s.queues[0].model.clear();
        let one_queue = s.to_msgpack().len();
        s.queues.clear();
        let per_queue = one_queue - s.to_msgpack().len();
        eprintln!(
            "message: {empty} bytes empty, {per_rank} bytes per rank entry, \
             {per_queue} per queue plus its model's name"
        );
        // Leased mode's section, with the frontends heard.
        let leased = |heard: usize| {
            let mut s = message();
            s.ranks.clear();
            s.queues.clear();
            s.resync.clear();
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
        assert!(empty < 45, "{empty}");
        assert!(per_rank <= 22, "{per_rank}");
        assert!(per_queue < 40, "{per_queue}");
        assert!(section < 80 && per_heard < 60, "{section} {per_heard}");
        assert!(sized(40_000) < super::super::DEFAULT_SNAPSHOT_MAX_PAYLOAD);
    }

    #[test]
    fn changes_are_the_new_items_and_the_gone_ones() {
        let e = |w: u64, blocks: u64| RankEntry {
            worker_id: w,
            dp_rank: 0,
            blocks,
            prefill: 0,
        };
        let zero = |x: &RankEntry| RankEntry {
            blocks: 0,
            prefill: 0,
            ..*x
        };
        let old = [e(1, 5), e(2, 6), e(4, 1)];
        let new = [e(2, 6), e(3, 9), e(4, 2), e(5, 1)];
        assert_eq!(
            changes(&old, &new, RankEntry::key, zero),
            vec![e(1, 0), e(3, 9), e(4, 2), e(5, 1)]
        );
        assert!(changes(&new, &new, RankEntry::key, zero).is_empty());
        assert_eq!(changes(&[], &new, RankEntry::key, zero), new.to_vec());
        assert_eq!(
            changes(&new, &[], RankEntry::key, zero),
            new.iter().map(zero).collect::<Vec<_>>()
        );
    }

    #[test]
    fn bad_payloads_are_typed_errors() {
        assert!(matches!(
            SyncMessage::decode(b"\xc1garbage"),
            Err(WireError::Malformed(_))
        ));
        assert!(matches!(
            SyncMessage::decode(b""),
            Err(WireError::Malformed(_))
        ));
        let mut s = message();
        s.v = 1;
        assert_eq!(
            SyncMessage::decode(&s.to_msgpack()),
            Err(WireError::UnsupportedVersion(1))
        );
        s.v = SYNC_VERSION;
        s.resync = vec![String::new(); MAX_RESYNC + 1];
        assert!(matches!(
            SyncMessage::decode(&s.to_msgpack()),
            Err(WireError::Invalid(_))
        ));
        // A rank entry of the wrong type, or shape.
        for json in [
            &br#"{"v":2,"frontend":"a","instance":1,"seq":1,"ranks":[[-1,0,0,0]]}"#[..],
            br#"{"v":2,"frontend":"a","instance":1,"seq":1,"ranks":[[1,0,0]]}"#,
            br#"{"v":2,"frontend":"a","instance":1,"seq":1,"ranks":[{"worker_id":1}]}"#,
        ] {
            assert!(
                matches!(SyncMessage::decode(json), Err(WireError::Malformed(_))),
                "{}",
                String::from_utf8_lossy(json)
            );
        }
    }
}
