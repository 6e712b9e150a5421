//! Busy thresholds and the busy rule.
//!
//! Four thresholds per model, each off (`None`) by default; setting one
//! enables only that check. This module holds the validated threshold values,
//! the merge/clear update, and the rule itself as pure functions over one
//! rank's load, so that it is written once and tested directly.

use crate::error::ThresholdError;

/// `max_num_batched_tokens` assumed when a worker never reported it.
pub const DEFAULT_MAX_NUM_BATCHED_TOKENS: u64 = 10_000_000;

/// The four busy thresholds of one model.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Thresholds {
    /// Decode: a rank is busy when `kv_used_blocks` or `active_decode_blocks`
    /// exceeds `t * kv_total_blocks`. Finite, in `[0, 1]`.
    pub active_decode_blocks_threshold: Option<f64>,
    /// Absolute prefill: busy when `active_prefill_tokens > n`.
    pub active_prefill_tokens_threshold: Option<u64>,
    /// Fractional prefill: busy when
    /// `active_prefill_tokens > floor(f * max_num_batched_tokens)`. Finite, `>= 0`.
    pub active_prefill_tokens_threshold_frac: Option<f64>,
    /// Waiting requests: busy when `waiting_requests > n`, for ranks that
    /// reported waiting requests.
    pub waiting_requests_threshold: Option<u64>,
}

/// Names one threshold field (for `clear` and errors).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ThresholdField {
    /// `active_decode_blocks_threshold`
    ActiveDecodeBlocks,
    /// `active_prefill_tokens_threshold`
    ActivePrefillTokens,
    /// `active_prefill_tokens_threshold_frac`
    ActivePrefillTokensFrac,
    /// `waiting_requests_threshold`
    WaitingRequests,
}

impl ThresholdField {
    /// All fields, in wire order.
    pub const ALL: [ThresholdField; 4] = [
        ThresholdField::ActiveDecodeBlocks,
        ThresholdField::ActivePrefillTokens,
        ThresholdField::ActivePrefillTokensFrac,
        ThresholdField::WaitingRequests,
    ];

    /// The wire name, e.g. `active_decode_blocks_threshold`.
    pub const fn name(self) -> &'static str {
        match self {
            ThresholdField::ActiveDecodeBlocks => "active_decode_blocks_threshold",
            ThresholdField::ActivePrefillTokens => "active_prefill_tokens_threshold",
            ThresholdField::ActivePrefillTokensFrac => "active_prefill_tokens_threshold_frac",
            ThresholdField::WaitingRequests => "waiting_requests_threshold",
        }
    }

    /// Parses a wire name.
    pub fn from_name(name: &str) -> Result<Self, ThresholdError> {
        Self::ALL
            .into_iter()
            .find(|f| f.name() == name)
            .ok_or_else(|| ThresholdError::UnknownField(name.to_owned()))
    }
}

/// A set of threshold fields (the `clear` of an update): a bitset with bit
/// `1 << i` for the `i`-th field of [`ThresholdField::ALL`], the values of
/// the C ABI's `LG_CLEAR_*` flags. Naming a field twice names it once.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct ThresholdFields(u8);

impl ThresholdFields {
    /// No field.
    pub const NONE: ThresholdFields = ThresholdFields(0);

    /// The bit of `field`.
    const fn bit(field: ThresholdField) -> u8 {
        1 << field as u8
    }

    /// Every bit that names a field.
    const KNOWN: u8 = (1 << ThresholdField::ALL.len()) - 1;

    /// The fields of a bitset; `Err` with the bits that name no field.
    pub const fn from_bits(bits: u32) -> Result<Self, u32> {
        let unknown = bits & !(Self::KNOWN as u32);
        if unknown != 0 {
            return Err(unknown);
        }
        Ok(Self(bits as u8))
    }

    /// The bitset.
    pub const fn bits(self) -> u32 {
        self.0 as u32
    }

    /// Adds `field`.
    pub fn insert(&mut self, field: ThresholdField) {
        self.0 |= Self::bit(field);
    }

    /// Adds the field with wire name `name`: the one parser of a `clear`
    /// list. An unknown name is [`ThresholdError::UnknownField`] and adds
    /// nothing.
    pub fn insert_name(&mut self, name: &str) -> Result<(), ThresholdError> {
        self.insert(ThresholdField::from_name(name)?);
        Ok(())
    }

    /// Whether `field` is in the set.
    pub const fn contains(self, field: ThresholdField) -> bool {
        self.0 & Self::bit(field) != 0
    }

    /// True when no field is in the set.
    pub const fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// The fields in the set, in wire order.
    pub fn iter(self) -> impl Iterator<Item = ThresholdField> {
        ThresholdField::ALL
            .into_iter()
            .filter(move |f| self.contains(*f))
    }
}

impl From<ThresholdField> for ThresholdFields {
    fn from(field: ThresholdField) -> Self {
        Self(Self::bit(field))
    }
}

impl FromIterator<ThresholdField> for ThresholdFields {
    fn from_iter<I: IntoIterator<Item = ThresholdField>>(fields: I) -> Self {
        let mut set = Self::NONE;
        for f in fields {
            set.insert(f);
        }
        set
    }
}

/// A partial update: fields given are set, fields in `clear` are unset, the
/// rest keep their value.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ThresholdUpdate {
    /// New decode threshold, if given.
    pub active_decode_blocks_threshold: Option<f64>,
    /// New absolute prefill threshold, if given.
    pub active_prefill_tokens_threshold: Option<u64>,
    /// New fractional prefill threshold, if given.
    pub active_prefill_tokens_threshold_frac: Option<f64>,
    /// New waiting-requests threshold, if given.
    pub waiting_requests_threshold: Option<u64>,
    /// Fields to unset.
    pub clear: ThresholdFields,
}

impl ThresholdUpdate {
    /// True when the update neither sets nor clears anything (a read).
    pub fn is_empty(&self) -> bool {
        self.active_decode_blocks_threshold.is_none()
            && self.active_prefill_tokens_threshold.is_none()
            && self.active_prefill_tokens_threshold_frac.is_none()
            && self.waiting_requests_threshold.is_none()
            && self.clear.is_empty()
    }
}

impl Thresholds {
    /// True when at least one check is configured.
    pub fn any(&self) -> bool {
        self.active_decode_blocks_threshold.is_some()
            || self.active_prefill_tokens_threshold.is_some()
            || self.active_prefill_tokens_threshold_frac.is_some()
            || self.waiting_requests_threshold.is_some()
    }

    /// Validates `update` and returns the merged thresholds; `self` is never
    /// changed, so a refused update leaves nothing half-applied.
    pub fn merged(&self, update: &ThresholdUpdate) -> Result<Thresholds, ThresholdError> {
        if let Some(t) = update.active_decode_blocks_threshold {
            if !(t.is_finite() && (0.0..=1.0).contains(&t)) {
                return Err(ThresholdError::Invalid {
                    field: ThresholdField::ActiveDecodeBlocks.name(),
                    value: t.to_string(),
                    allowed: "a finite number in [0, 1]",
                });
            }
        }
        if let Some(f) = update.active_prefill_tokens_threshold_frac {
            if !(f.is_finite() && f >= 0.0) {
                return Err(ThresholdError::Invalid {
                    field: ThresholdField::ActivePrefillTokensFrac.name(),
                    value: f.to_string(),
                    allowed: "a finite number >= 0",
                });
            }
        }
        let mut next = *self;
        for field in update.clear.iter() {
            let given = match field {
                ThresholdField::ActiveDecodeBlocks => {
                    update.active_decode_blocks_threshold.is_some()
                }
                ThresholdField::ActivePrefillTokens => {
                    update.active_prefill_tokens_threshold.is_some()
                }
                ThresholdField::ActivePrefillTokensFrac => {
                    update.active_prefill_tokens_threshold_frac.is_some()
                }
                ThresholdField::WaitingRequests => update.waiting_requests_threshold.is_some(),
            };
            if given {
                return Err(ThresholdError::SetAndClear(field.name()));
            }
            match field {
                ThresholdField::ActiveDecodeBlocks => next.active_decode_blocks_threshold = None,
                ThresholdField::ActivePrefillTokens => next.active_prefill_tokens_threshold = None,
                ThresholdField::ActivePrefillTokensFrac => {
                    next.active_prefill_tokens_threshold_frac = None
                }
                ThresholdField::WaitingRequests => next.waiting_requests_threshold = None,
            }
        }
        if let Some(t) = update.active_decode_blocks_threshold {
            next.active_decode_blocks_threshold = Some(t);
        }
        if let Some(n) = update.active_prefill_tokens_threshold {
            next.active_prefill_tokens_threshold = Some(n);
        }
        if let Some(f) = update.active_prefill_tokens_threshold_frac {
            next.active_prefill_tokens_threshold_frac = Some(f);
        }
        if let Some(n) = update.waiting_requests_threshold {
            next.waiting_requests_threshold = Some(n);
        }
        Ok(next)
    }

    /// The most KV blocks a rank of `kv_total_blocks` holds before the
    /// decode check calls it busy: `floor(t * kv_total_blocks)`, or all of
    /// them without a decode threshold; 0 while its capacity is unknown.
    /// Booking sync's leased mode splits this line between the frontends.
    pub fn decode_line(&self, kv_total_blocks: u64) -> u64 {
        match self.active_decode_blocks_threshold {
            Some(t) => (t * kv_total_blocks as f64).floor() as u64,
            None => kv_total_blocks,
        }
    }

    /// The busy rule for one rank (docs/behaviour.md#busy-rule), before
    /// staleness.
    ///
    /// * decode: busy when `kv_used_blocks` **or** `active_decode_blocks` is
    ///   strictly above `t * kv_total_blocks`; a `kv_total_blocks` of 0 never
    ///   trips. Because both latest values are kept, a rank flagged by one
    ///   signal clears only when both are at or below the line (the latch).
    /// * prefill checks apply only when the rank reported prefill tokens.
    /// * waiting requests: busy when `waiting_requests > n`, only when the
    ///   rank reported waiting requests.
    pub fn rank_busy(&self, load: &RankLoad) -> bool {
        if let Some(t) = self.active_decode_blocks_threshold {
            if load.kv_total_blocks > 0 {
                let line = t * load.kv_total_blocks as f64;
                if load.kv_used_blocks as f64 > line || load.active_decode_blocks as f64 > line {
                    return true;
                }
            }
        }
        if let Some(tokens) = load.active_prefill_tokens {
            if let Some(n) = self.active_prefill_tokens_threshold {
                if tokens > n {
                    return true;
                }
            }
            if let Some(f) = self.active_prefill_tokens_threshold_frac {
                let line = (f * load.max_num_batched_tokens as f64).floor();
                if tokens as f64 > line {
                    return true;
                }
            }
        }
        if let (Some(n), Some(waiting)) = (self.waiting_requests_threshold, load.waiting_requests) {
            if waiting > n {
                return true;
            }
        }
        false
    }
}

/// The latest load of one data-parallel rank, as the busy rule sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RankLoad {
    /// Router-side active decode blocks.
    pub active_decode_blocks: u64,
    /// Worker-reported KV cache occupancy.
    pub kv_used_blocks: u64,
    /// KV cache capacity; 0 when unknown.
    pub kv_total_blocks: u64,
    /// Active prefill tokens; `None` until the rank reports them.
    pub active_prefill_tokens: Option<u64>,
    /// Prefill batch capacity.
    pub max_num_batched_tokens: u64,
    /// Requests waiting in the engine's queue; `None` until the rank reports
    /// them.
    pub waiting_requests: Option<u64>,
}

/// Tokens per KV block where loadgate counts blocks it was not told (a
/// dispatch's blocks by default, prefill tokens in a rank's load score):
/// vLLM's and SGLang's default block size.
pub const DEFAULT_BLOCK_TOKENS: u64 = 16;

impl RankLoad {
    /// How loaded the rank is: its KV blocks in use (the larger of booked
    /// and reported) plus its prefill tokens in blocks of
    /// [`DEFAULT_BLOCK_TOKENS`]. The one rule for every choice by load:
    /// power-of-two compares workers by the sum over their ranks, and a
    /// dispatch books the least loaded rank of its worker.
    pub fn load_score(&self) -> u64 {
        self.active_decode_blocks
            .max(self.kv_used_blocks)
            .saturating_add(self.active_prefill_tokens.unwrap_or(0) / DEFAULT_BLOCK_TOKENS)
    }
}

impl Default for RankLoad {
    fn default() -> Self {
        Self {
            active_decode_blocks: 0,
            kv_used_blocks: 0,
            kv_total_blocks: 0,
            active_prefill_tokens: None,
            max_num_batched_tokens: DEFAULT_MAX_NUM_BATCHED_TOKENS,
            waiting_requests: None,
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    fn decode(t: f64) -> Thresholds {
        Thresholds {
            active_decode_blocks_threshold: Some(t),
            ..Default::default()
        }
    }

    fn load(used: u64, active: u64, total: u64) -> RankLoad {
        RankLoad {
            kv_used_blocks: used,
            active_decode_blocks: active,
            kv_total_blocks: total,
            ..Default::default()
        }
    }

    #[test]
    fn nothing_is_busy_without_thresholds() {
        let t = Thresholds::default();
        assert!(!t.any());
        let l = RankLoad {
            active_prefill_tokens: Some(u64::MAX - 1),
            ..load(100, 100, 100)
        };
        assert!(!t.rank_busy(&l));
    }

    #[test]
    fn decode_is_strict_on_both_signals() {
        let t = decode(0.5);
        assert!(!t.rank_busy(&load(50, 50, 100)), "at the line is not busy");
        assert!(t.rank_busy(&load(51, 0, 100)), "kv_used above the line");
        assert!(
            t.rank_busy(&load(0, 51, 100)),
            "active_decode above the line"
        );
        assert!(!t.rank_busy(&load(1000, 1000, 0)), "kv_total 0 never trips");
        assert!(
            decode(0.0).rank_busy(&load(1, 0, 100)),
            "threshold 0: any use is busy"
        );
        assert!(!decode(0.0).rank_busy(&load(0, 0, 100)));
        assert!(!decode(1.0).rank_busy(&load(100, 100, 100)));
    }

    #[test]
    fn decode_latch_clears_only_when_both_are_below() {
        let t = decode(0.5);
        // Busy by kv_used; active_decode falls below but kv_used stays high.
        assert!(t.rank_busy(&load(80, 10, 100)));
        // Busy by active_decode while kv_used already fell.
        assert!(t.rank_busy(&load(10, 80, 100)));
        assert!(!t.rank_busy(&load(50, 50, 100)));
    }

    #[test]
    fn prefill_checks_only_ranks_that_reported_prefill() {
        let t = Thresholds {
            active_prefill_tokens_threshold: Some(100),
            ..Default::default()
        };
        assert!(!t.rank_busy(&RankLoad::default()));
        let l = |p| RankLoad {
            active_prefill_tokens: Some(p),
            ..Default::default()
        };
        assert!(!t.rank_busy(&l(100)));
        assert!(t.rank_busy(&l(101)));
        let t = Thresholds {
            active_prefill_tokens_threshold: Some(0),
            ..Default::default()
        };
        assert!(!t.rank_busy(&l(0)));
        assert!(t.rank_busy(&l(1)));
    }

    #[test]
    fn waiting_requests_checks_only_ranks_that_reported_them() {
        let t = Thresholds {
            waiting_requests_threshold: Some(4),
            ..Default::default()
        };
        assert!(t.any());
        assert!(!t.rank_busy(&RankLoad::default()), "never reported: free");
        let l = |w| RankLoad {
            waiting_requests: Some(w),
            ..Default::default()
        };
        assert!(!t.rank_busy(&l(4)), "at the line is not busy");
        assert!(t.rank_busy(&l(5)));
        let zero = Thresholds {
            waiting_requests_threshold: Some(0),
            ..Default::default()
        };
        assert!(!zero.rank_busy(&l(0)));
        assert!(zero.rank_busy(&l(1)));
        let max = Thresholds {
            waiting_requests_threshold: Some(u64::MAX),
            ..Default::default()
        };
        assert!(!max.rank_busy(&l(u64::MAX)), "u64::MAX never trips");
        assert!(
            !Thresholds::default().rank_busy(&l(u64::MAX)),
            "no threshold, no check"
        );
    }

    #[test]
    fn fractional_prefill_uses_floor_and_the_default_batch() {
        let t = Thresholds {
            active_prefill_tokens_threshold_frac: Some(0.333),
            ..Default::default()
        };
        let l = |p, m| RankLoad {
            active_prefill_tokens: Some(p),
            max_num_batched_tokens: m,
            ..Default::default()
        };
        // floor(0.333 * 10) = 3
        assert!(!t.rank_busy(&l(3, 10)));
        assert!(t.rank_busy(&l(4, 10)));
        // Unknown batch size means 10,000,000: line 3,330,000.
        let d = RankLoad {
            active_prefill_tokens: Some(3_330_000),
            ..Default::default()
        };
        assert!(!t.rank_busy(&d));
        let d = RankLoad {
            active_prefill_tokens: Some(3_330_001),
            ..Default::default()
        };
        assert!(t.rank_busy(&d));
        // Fractions above 1 are legal.
        let t = Thresholds {
            active_prefill_tokens_threshold_frac: Some(64.0),
            ..Default::default()
        };
        assert!(!t.rank_busy(&l(640, 10)));
        assert!(t.rank_busy(&l(641, 10)));
    }

    #[test]
    fn invalid_values_are_refused_and_name_the_field() {
        let base = decode(0.5);
        for bad in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY, -0.1, 1.0001] {
            let err = base
                .merged(&ThresholdUpdate {
                    active_decode_blocks_threshold: Some(bad),
                    active_prefill_tokens_threshold: Some(5),
                    ..Default::default()
                })
                .unwrap_err();
            assert!(
                matches!(
                    err,
                    ThresholdError::Invalid {
                        field: "active_decode_blocks_threshold",
                        ..
                    }
                ),
                "{bad}: {err}"
            );
            assert!(err.to_string().contains("[0, 1]"));
        }
        for bad in [f64::NAN, f64::INFINITY, -1.0] {
            let err = base
                .merged(&ThresholdUpdate {
                    active_prefill_tokens_threshold_frac: Some(bad),
                    ..Default::default()
                })
                .unwrap_err();
            assert!(matches!(
                err,
                ThresholdError::Invalid {
                    field: "active_prefill_tokens_threshold_frac",
                    ..
                }
            ));
        }
        assert_eq!(base, decode(0.5), "a refused update changes nothing");
    }

    #[test]
    fn merge_keeps_unnamed_fields_and_clear_unsets() {
        let t = Thresholds::default()
            .merged(&ThresholdUpdate {
                active_decode_blocks_threshold: Some(0.9),
                active_prefill_tokens_threshold: Some(1000),
                ..Default::default()
            })
            .unwrap();
        let t = t
            .merged(&ThresholdUpdate {
                active_prefill_tokens_threshold_frac: Some(1.5),
                ..Default::default()
            })
            .unwrap();
        assert_eq!(t.active_decode_blocks_threshold, Some(0.9));
        assert_eq!(t.active_prefill_tokens_threshold, Some(1000));
        assert_eq!(t.active_prefill_tokens_threshold_frac, Some(1.5));
        let t = t
            .merged(&ThresholdUpdate {
                clear: ThresholdField::ActiveDecodeBlocks.into(),
                ..Default::default()
            })
            .unwrap();
        assert_eq!(t.active_decode_blocks_threshold, None);
        assert_eq!(t.active_prefill_tokens_threshold, Some(1000));
        let err = t
            .merged(&ThresholdUpdate {
                active_prefill_tokens_threshold: Some(1),
                clear: ThresholdField::ActivePrefillTokens.into(),
                ..Default::default()
            })
            .unwrap_err();
        assert_eq!(
            err,
            ThresholdError::SetAndClear("active_prefill_tokens_threshold")
        );
        assert!(ThresholdField::from_name("nope").is_err());
        let mut clear = ThresholdFields::NONE;
        clear
            .insert_name("active_prefill_tokens_threshold")
            .unwrap();
        clear
            .insert_name("active_prefill_tokens_threshold")
            .unwrap();
        assert_eq!(
            clear.insert_name("nope"),
            Err(ThresholdError::UnknownField("nope".into()))
        );
        assert_eq!(
            clear.iter().collect::<Vec<_>>(),
            [ThresholdField::ActivePrefillTokens],
            "a name given twice is cleared once; an unknown one adds nothing"
        );
        assert_eq!(
            ThresholdField::from_name("active_prefill_tokens_threshold_frac").unwrap(),
            ThresholdField::ActivePrefillTokensFrac
        );
        let t = t
            .merged(&ThresholdUpdate {
                waiting_requests_threshold: Some(u64::MAX),
                ..Default::default()
            })
            .unwrap();
        assert_eq!(t.waiting_requests_threshold, Some(u64::MAX));
        assert_eq!(t.active_prefill_tokens_threshold, Some(1000));
        let mut clear = ThresholdFields::NONE;
        clear.insert_name("waiting_requests_threshold").unwrap();
        let t = t
            .merged(&ThresholdUpdate {
                clear,
                ..Default::default()
            })
            .unwrap();
        assert_eq!(t.waiting_requests_threshold, None);
        assert_eq!(t.active_prefill_tokens_threshold, Some(1000));
        assert_eq!(
            t.merged(&ThresholdUpdate {
                waiting_requests_threshold: Some(1),
                clear,
                ..Default::default()
            }),
            Err(ThresholdError::SetAndClear("waiting_requests_threshold"))
        );
    }

    #[test]
    fn field_sets_are_the_c_clear_flags() {
        assert_eq!(
            ThresholdField::ALL.map(|f| ThresholdFields::from(f).bits()),
            [1, 2, 4, 8]
        );
        let all: ThresholdFields = ThresholdField::ALL.into_iter().collect();
        assert_eq!(all.bits(), 15);
        assert_eq!(ThresholdFields::from_bits(15), Ok(all));
        assert_eq!(ThresholdFields::from_bits(0), Ok(ThresholdFields::NONE));
        assert!(ThresholdFields::NONE.is_empty());
        assert_eq!(ThresholdFields::from_bits(16 | 2), Err(16));
        assert_eq!(ThresholdFields::from_bits(u32::MAX), Err(!15));
        let two = ThresholdFields::from_bits(5).unwrap();
        assert_eq!(
            two.iter().collect::<Vec<_>>(),
            [
                ThresholdField::ActiveDecodeBlocks,
                ThresholdField::ActivePrefillTokensFrac
            ]
        );
        assert!(!two.contains(ThresholdField::ActivePrefillTokens));
    }
}
