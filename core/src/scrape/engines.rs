//! What a stock engine's `/metrics` says about its load, per data-parallel
//! rank: KV cache used and total, and waiting requests.
//!
//! The metric names and labels are those of **vLLM v0.10–v0.11** (V1
//! engine) and **SGLang v0.4–v0.5**; see docs/scrape.md for the table.
//!
//! * vLLM: `vllm:kv_cache_usage_perc` (0–1; `vllm:gpu_cache_usage_perc`, its
//!   name before v0.10, is read when the new one is absent) times
//!   `num_gpu_blocks` (a label of the info gauge `vllm:cache_config_info`)
//!   gives `kv_used_blocks` of `kv_total_blocks = num_gpu_blocks`;
//!   `vllm:num_requests_waiting` gives `waiting_requests`. Data-parallel
//!   engines are told apart by the label `engine` (the rank); a series
//!   without it is rank 0.
//! * SGLang: `sglang:num_used_tokens` (or `sglang:token_usage` times the
//!   capacity) gives `kv_used_blocks`; `sglang:max_total_num_tokens`, or
//!   else `num_used_tokens / token_usage`, gives `kv_total_blocks`; SGLang
//!   pages its KV cache by token, so these count tokens, which the decode
//!   check (a fraction of capacity) reads the same way.
//!   `sglang:num_queue_reqs` gives `waiting_requests`. Ranks are the label
//!   `dp_rank` (rank 0 without it); several series of one rank (e.g. one per
//!   `tp_rank`) count as the largest.
//!
//! Both engines' inter-token latency histogram
//! (`vllm:inter_token_latency_seconds`, v0.10's
//! `vllm:time_per_output_token_seconds` when it is absent;
//! `sglang:inter_token_latency_seconds`), its `_sum` and `_count`, gives
//! the rank's token gaps so far: an SLO's step fit reads their growth
//! between two scrapes (`mod.rs`). Optional: a body without it maps as
//! before.
//!
//! The model is the label `model_name`. Every other metric is ignored.

use std::collections::BTreeMap;

use super::text::{line_name, parse_sample, Sample};

/// The engine whose metrics a scrape reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Engine {
    /// vLLM (`vllm:*` metrics).
    Vllm,
    /// SGLang (`sglang:*` metrics).
    Sglang,
}

impl Engine {
    /// The engine's name: `vllm` or `sglang`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Engine::Vllm => "vllm",
            Engine::Sglang => "sglang",
        }
    }

    /// Parses `vllm` or `sglang`.
    pub fn from_name(name: &str) -> Option<Self> {
        match name {
            "vllm" => Some(Engine::Vllm),
            "sglang" => Some(Engine::Sglang),
            _ => None,
        }
    }

    fn rank_label(self) -> &'static str {
        match self {
            Engine::Vllm => "engine",
            Engine::Sglang => "dp_rank",
        }
    }

    /// The index of `name` among the metrics this engine's mapping reads.
    fn field(self, name: &str) -> Option<Field> {
        Some(match (self, name) {
            (Engine::Vllm, "vllm:kv_cache_usage_perc") => Field::UsageFrac,
            (Engine::Vllm, "vllm:gpu_cache_usage_perc") => Field::OldUsageFrac,
            (Engine::Vllm, "vllm:cache_config_info") => Field::Info,
            (Engine::Vllm, "vllm:num_requests_waiting") => Field::Waiting,
            (Engine::Vllm, "vllm:inter_token_latency_seconds_sum") => Field::GapSum,
            (Engine::Vllm, "vllm:inter_token_latency_seconds_count") => Field::GapCount,
            (Engine::Vllm, "vllm:time_per_output_token_seconds_sum") => Field::OldGapSum,
            (Engine::Vllm, "vllm:time_per_output_token_seconds_count") => Field::OldGapCount,
            (Engine::Sglang, "sglang:inter_token_latency_seconds_sum") => Field::GapSum,
            (Engine::Sglang, "sglang:inter_token_latency_seconds_count") => Field::GapCount,
            (Engine::Sglang, "sglang:token_usage") => Field::UsageFrac,
            (Engine::Sglang, "sglang:num_used_tokens") => Field::Used,
            (Engine::Sglang, "sglang:max_total_num_tokens") => Field::Total,
            (Engine::Sglang, "sglang:num_queue_reqs") => Field::Waiting,
            _ => return None,
        })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Field {
    UsageFrac,
    OldUsageFrac,
    Info,
    Used,
    Total,
    Waiting,
    GapSum,
    GapCount,
    OldGapSum,
    OldGapCount,
}

/// An inter-token latency histogram's totals: seconds and gaps.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct Gaps {
    pub(crate) seconds: f64,
    pub(crate) count: u64,
}

impl Gaps {
    /// The mean gap since `before`, if gaps were added and neither total
    /// ran backwards (an engine that restarted, or a histogram that lies:
    /// no observation).
    pub(crate) fn mean_since(&self, before: &Gaps) -> Option<f64> {
        let added = self.count.checked_sub(before.count).filter(|&n| n > 0)?;
        let seconds = self.seconds - before.seconds;
        (seconds >= 0.0).then(|| seconds / added as f64)
    }
}

/// One rank's load as the engine reported it.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct EngineRank {
    pub(crate) kv_used_blocks: Option<u64>,
    pub(crate) kv_total_blocks: Option<u64>,
    pub(crate) waiting_requests: u64,
    /// The inter-token latency histogram's totals, when it has both.
    pub(crate) gaps: Option<Gaps>,
}

/// A whole scrape: the model the engine names and its ranks' loads.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct EngineLoad {
    pub(crate) model: Option<String>,
    pub(crate) ranks: BTreeMap<u32, EngineRank>,
}

/// Why a scrape's body was refused. Nothing of it is applied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum MapError {
    /// A line of a metric the mapping reads is malformed or out of range.
    Malformed(String),
    /// A metric the mapping needs is absent (for some rank).
    Missing(String),
    /// More ranks than a worker may declare.
    TooManyRanks(usize),
}

impl MapError {
    /// Stable name, used as a metrics label.
    pub(crate) const fn kind(&self) -> &'static str {
        match self {
            MapError::Malformed(_) => "malformed",
            MapError::Missing(_) => "missing",
            MapError::TooManyRanks(_) => "too_many_ranks",
        }
    }
}

impl std::fmt::Display for MapError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            MapError::Malformed(why) => write!(f, "malformed metric: {why}"),
            MapError::Missing(what) => write!(f, "missing metric: {what}"),
            MapError::TooManyRanks(n) => write!(f, "{n} ranks is more than a worker may declare"),
        }
    }
}

/// Values seen for one rank, before they are combined.
#[derive(Debug, Clone, Copy, Default)]
struct Seen {
    usage: Option<f64>,
    old_usage: Option<f64>,
    total: Option<u64>,
    used: Option<u64>,
    waiting: Option<u64>,
    gap_sum: Option<f64>,
    gap_count: Option<u64>,
    old_gap_sum: Option<f64>,
    old_gap_count: Option<u64>,
}

/// The largest of two optional values.
fn max<T: PartialOrd>(a: Option<T>, b: T) -> Option<T> {
    Some(match a {
        Some(a) if a > b => a,
        _ => b,
    })
}

/// A count: finite, `>= 0`, rounded, below 2^53 (exact in an `f64`).
fn count(s: &Sample<'_>) -> Result<u64, MapError> {
    let v = s.value;
    if !(v.is_finite() && (0.0..9.0e15).contains(&v)) {
        return Err(MapError::Malformed(format!("{} = {v}", s.name)));
    }
    Ok(v.round() as u64)
}

/// A usage fraction: finite, in `[0, 1]`.
fn fraction(s: &Sample<'_>) -> Result<f64, MapError> {
    let v = s.value;
    if !(v.is_finite() && (0.0..=1.0).contains(&v)) {
        return Err(MapError::Malformed(format!(
            "{} = {v} is not in [0, 1]",
            s.name
        )));
    }
    Ok(v)
}

/// A histogram's sum of seconds: finite, `>= 0`.
fn seconds(s: &Sample<'_>) -> Result<f64, MapError> {
    let v = s.value;
    if !(v.is_finite() && v >= 0.0) {
        return Err(MapError::Malformed(format!("{} = {v}", s.name)));
    }
    Ok(v)
}

/// Reads `body` as `engine`'s metrics. `max_ranks` bounds the ranks one
/// body may name (the monitor's `Limits::max_ranks_per_worker`).
pub(crate) fn map(engine: Engine, body: &str, max_ranks: u32) -> Result<EngineLoad, MapError> {
    let mut model: Option<String> = None;
    let mut seen: BTreeMap<u32, Seen> = BTreeMap::new();
    // vLLM's info gauge without an `engine` label speaks for every rank.
    let mut shared_total: Option<u64> = None;
    for line in body.lines() {
        let Some(field) = line_name(line).and_then(|n| engine.field(n)) else {
            continue;
        };
        let s = parse_sample(line)
            .map_err(|e| MapError::Malformed(format!("{}: {e}", line_name(line).unwrap_or(""))))?;
        if model.is_none() {
            model = s.label("model_name").map(str::to_owned);
        }
        let rank = match s.label(engine.rank_label()) {
            None => None,
            Some(r) => Some(r.parse::<u32>().map_err(|_| {
                MapError::Malformed(format!("{} label {r:?} is not a rank", engine.rank_label()))
            })?),
        };
        if field == Field::Info {
            let blocks = s.label("num_gpu_blocks").ok_or_else(|| {
                MapError::Missing("num_gpu_blocks label of vllm:cache_config_info".into())
            })?;
            let blocks = blocks.parse::<u64>().map_err(|_| {
                MapError::Malformed(format!("num_gpu_blocks {blocks:?} is not a count"))
            })?;
            match rank {
                None => shared_total = Some(blocks),
                Some(r) => slot(&mut seen, r, max_ranks)?.total = Some(blocks),
            }
            continue;
        }
        let e = slot(&mut seen, rank.unwrap_or(0), max_ranks)?;
        match field {
            Field::UsageFrac => e.usage = max(e.usage, fraction(&s)?),
            Field::OldUsageFrac => e.old_usage = max(e.old_usage, fraction(&s)?),
            Field::Used => e.used = max(e.used, count(&s)?),
            Field::Total => e.total = max(e.total, count(&s)?),
            Field::Waiting => e.waiting = max(e.waiting, count(&s)?),
            Field::GapSum => e.gap_sum = max(e.gap_sum, seconds(&s)?),
            Field::GapCount => e.gap_count = max(e.gap_count, count(&s)?),
            Field::OldGapSum => e.old_gap_sum = max(e.old_gap_sum, seconds(&s)?),
            Field::OldGapCount => e.old_gap_count = max(e.old_gap_count, count(&s)?),
            Field::Info => unreachable!("handled above"),
        }
    }
    let waiting_name = match engine {
        Engine::Vllm => "vllm:num_requests_waiting",
        Engine::Sglang => "sglang:num_queue_reqs",
    };
    if seen.is_empty() {
        return Err(MapError::Missing(waiting_name.into()));
    }
    let mut ranks = BTreeMap::new();
    for (rank, s) in seen {
        let missing = |what: &str| MapError::Missing(format!("{what} for rank {rank}"));
        let waiting = s.waiting.ok_or_else(|| missing(waiting_name))?;
        let gaps = match (s.gap_sum, s.gap_count, s.old_gap_sum, s.old_gap_count) {
            (Some(seconds), Some(count), _, _) | (_, _, Some(seconds), Some(count)) => {
                Some(Gaps { seconds, count })
            }
            _ => None,
        };
        let r = match engine {
            Engine::Vllm => {
                let usage = s
                    .usage
                    .or(s.old_usage)
                    .ok_or_else(|| missing("vllm:kv_cache_usage_perc"))?;
                let total = s
                    .total
                    .or(shared_total)
                    .ok_or_else(|| missing("vllm:cache_config_info{num_gpu_blocks}"))?;
                EngineRank {
                    kv_used_blocks: Some((usage * total as f64).round() as u64),
                    kv_total_blocks: Some(total),
                    waiting_requests: waiting,
                    gaps,
                }
            }
            Engine::Sglang => {
                let (used, total) = match (s.used, s.total, s.usage) {
                    (Some(u), Some(t), _) => (u, Some(t)),
                    (Some(u), None, Some(f)) if f > 0.0 => (u, Some((u as f64 / f).round() as u64)),
                    (Some(u), None, _) => (u, None),
                    (None, Some(t), Some(f)) => ((f * t as f64).round() as u64, Some(t)),
                    _ => return Err(missing("sglang:num_used_tokens")),
                };
                EngineRank {
                    kv_used_blocks: Some(used),
                    kv_total_blocks: total,
                    waiting_requests: waiting,
                    gaps,
                }
            }
        };
        ranks.insert(rank, r);
    }
    Ok(EngineLoad { model, ranks })
}

fn slot(seen: &mut BTreeMap<u32, Seen>, rank: u32, max_ranks: u32) -> Result<&mut Seen, MapError> {
    if !seen.contains_key(&rank) && seen.len() >= max_ranks as usize {
        return Err(MapError::TooManyRanks(seen.len() + 1));
    }
    Ok(seen.entry(rank).or_default())
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    const LLAMA: &str = "meta-llama/Llama-3.1-8B-Instruct";

    /// vLLM v0.11's exposition (prometheus_client), trimmed to a few
    /// families: two data-parallel engines.
    fn vllm(usage: [&str; 2], waiting: [&str; 2]) -> String {
        let mut s = String::new();
        s += "# HELP vllm:num_requests_running Number of requests in model execution batches.\n";
        s += "# TYPE vllm:num_requests_running gauge\n";
        for e in 0..2 {
            s += &format!(
                "vllm:num_requests_running{{model_name=\"{LLAMA}\",engine=\"{e}\"}} 4.0\n"
            );
        }
        s += "# HELP vllm:num_requests_waiting Number of requests waiting to be processed.\n";
        s += "# TYPE vllm:num_requests_waiting gauge\n";
        for (e, v) in waiting.iter().enumerate() {
            s += &format!(
                "vllm:num_requests_waiting{{model_name=\"{LLAMA}\",engine=\"{e}\"}} {v}\n"
            );
        }
        s += "# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.\n";
        s += "# TYPE vllm:kv_cache_usage_perc gauge\n";
        for (e, v) in usage.iter().enumerate() {
            s +=
                &format!("vllm:kv_cache_usage_perc{{model_name=\"{LLAMA}\",engine=\"{e}\"}} {v}\n");
        }
        s += "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n";
        s += "# TYPE vllm:cache_config_info gauge\n";
        for e in 0..2 {
            s += &format!(
                "vllm:cache_config_info{{block_size=\"16\",cache_dtype=\"auto\",enable_prefix_caching=\"True\",engine=\"{e}\",gpu_memory_utilization=\"0.9\",num_cpu_blocks=\"None\",num_gpu_blocks=\"2048\",num_gpu_blocks_override=\"None\",sliding_window=\"None\"}} 1.0\n"
            );
        }
        s += "# TYPE vllm:time_to_first_token_seconds histogram\n";
        s += &format!("vllm:time_to_first_token_seconds_bucket{{engine=\"0\",le=\"+Inf\",model_name=\"{LLAMA}\"}} 7.0\n");
        s
    }

    #[test]
    fn vllm_usage_times_blocks_and_waiting_per_engine() {
        let got = map(Engine::Vllm, &vllm(["0.5", "0.03125"], ["0.0", "7.0"]), 16).unwrap();
        assert_eq!(got.model.as_deref(), Some(LLAMA));
        assert_eq!(
            got.ranks.into_iter().collect::<Vec<_>>(),
            vec![
                (
                    0,
                    EngineRank {
                        kv_used_blocks: Some(1024),
                        kv_total_blocks: Some(2048),
                        waiting_requests: 0,
                        gaps: None,
                    }
                ),
                (
                    1,
                    EngineRank {
                        kv_used_blocks: Some(64),
                        kv_total_blocks: Some(2048),
                        waiting_requests: 7,
                        gaps: None,
                    }
                ),
            ]
        );
    }

    #[test]
    fn the_inter_token_latency_histogram_gives_the_gaps() {
        let mut body = vllm(["0.5", "0.5"], ["0.0", "0.0"]);
        body += "vllm:inter_token_latency_seconds_sum{model_name=\"m\",engine=\"1\"} 12.5\n\
                 vllm:inter_token_latency_seconds_count{model_name=\"m\",engine=\"1\"} 500.0\n\
                 vllm:time_per_output_token_seconds_sum{model_name=\"m\",engine=\"1\"} 99.0\n\
                 vllm:time_per_output_token_seconds_count{model_name=\"m\",engine=\"1\"} 9.0\n\
                 vllm:time_per_output_token_seconds_sum{model_name=\"m\",engine=\"0\"} 1.0\n\
                 vllm:time_per_output_token_seconds_count{model_name=\"m\",engine=\"0\"} 40.0\n";
        let got = map(Engine::Vllm, &body, 16).unwrap();
        let gaps = |seconds, count| Some(Gaps { seconds, count });
        assert_eq!(got.ranks[&1].gaps, gaps(12.5, 500), "the new name first");
        assert_eq!(got.ranks[&0].gaps, gaps(1.0, 40), "v0.10's name");
        let body = "sglang:num_used_tokens{model_name=\"q\"} 5.0\n\
                    sglang:max_total_num_tokens{model_name=\"q\"} 100.0\n\
                    sglang:num_queue_reqs{model_name=\"q\"} 0.0\n\
                    sglang:inter_token_latency_seconds_sum{model_name=\"q\"} 3.0\n";
        let got = map(Engine::Sglang, body, 16).unwrap();
        assert_eq!(got.ranks[&0].gaps, None, "a sum without its count");
        let body =
            format!("{body}sglang:inter_token_latency_seconds_count{{model_name=\"q\"}} 100\n");
        let got = map(Engine::Sglang, &body, 16).unwrap();
        assert_eq!(got.ranks[&0].gaps, gaps(3.0, 100));
        let bad = body.replace("_sum{model_name=\"q\"} 3.0", "_sum{model_name=\"q\"} -3.0");
        assert!(matches!(
            map(Engine::Sglang, &bad, 16),
            Err(MapError::Malformed(_))
        ));
        // Growth between two scrapes: the mean gap, or nothing when a
        // total ran backwards or nothing was added.
        let before = Gaps {
            seconds: 3.0,
            count: 100,
        };
        let now = Gaps {
            seconds: 4.0,
            count: 150,
        };
        assert_eq!(now.mean_since(&before), Some(0.02));
        assert_eq!(before.mean_since(&now), None);
        assert_eq!(before.mean_since(&before), None);
        let lying = Gaps {
            seconds: 2.0,
            count: 150,
        };
        assert_eq!(lying.mean_since(&before), None);
    }

    #[test]
    fn vllm_before_v0_10_and_without_data_parallel_labels() {
        let body = "vllm:gpu_cache_usage_perc{model_name=\"m\"} 0.25\n\
                    vllm:num_requests_waiting{model_name=\"m\"} 2.0\n\
                    vllm:cache_config_info{block_size=\"16\",num_gpu_blocks=\"100\"} 1.0\n";
        let got = map(Engine::Vllm, body, 16).unwrap();
        assert_eq!(
            got.ranks.get(&0),
            Some(&EngineRank {
                kv_used_blocks: Some(25),
                kv_total_blocks: Some(100),
                waiting_requests: 2,
                gaps: None,
            })
        );
    }

    #[test]
    fn sglang_tokens_with_or_without_a_capacity_metric() {
        let body = "# HELP sglang:num_used_tokens The number of used tokens.\n\
            # TYPE sglang:num_used_tokens gauge\n\
            sglang:num_used_tokens{model_name=\"qwen\"} 1812.0\n\
            # HELP sglang:token_usage The token usage.\n\
            # TYPE sglang:token_usage gauge\n\
            sglang:token_usage{model_name=\"qwen\"} 0.0125\n\
            # TYPE sglang:num_queue_reqs gauge\n\
            sglang:num_queue_reqs{model_name=\"qwen\"} 3.0\n";
        let got = map(Engine::Sglang, body, 16).unwrap();
        assert_eq!(got.model.as_deref(), Some("qwen"));
        assert_eq!(
            got.ranks[&0],
            EngineRank {
                kv_used_blocks: Some(1812),
                kv_total_blocks: Some(144_960),
                waiting_requests: 3,
                gaps: None,
            }
        );
        let body = "sglang:num_used_tokens{dp_rank=\"1\",engine_type=\"unified\",model_name=\"q\",pp_rank=\"0\",tp_rank=\"0\"} 10.0\n\
            sglang:num_used_tokens{dp_rank=\"1\",engine_type=\"unified\",model_name=\"q\",pp_rank=\"0\",tp_rank=\"1\"} 12.0\n\
            sglang:max_total_num_tokens{dp_rank=\"1\",model_name=\"q\",tp_rank=\"0\"} 1000.0\n\
            sglang:num_queue_reqs{dp_rank=\"1\",model_name=\"q\",tp_rank=\"0\"} 0.0\n\
            sglang:token_usage{dp_rank=\"1\",model_name=\"q\",tp_rank=\"0\"} 0.0\n";
        let got = map(Engine::Sglang, body, 16).unwrap();
        assert_eq!(
            got.ranks.into_iter().collect::<Vec<_>>(),
            vec![(
                1,
                EngineRank {
                    kv_used_blocks: Some(12),
                    kv_total_blocks: Some(1000),
                    waiting_requests: 0,
                    gaps: None,
                }
            )],
            "the largest of a rank's series; the capacity metric wins"
        );
        let idle = "sglang:num_used_tokens{model_name=\"q\"} 0.0\n\
                    sglang:token_usage{model_name=\"q\"} 0.0\n\
                    sglang:num_queue_reqs{model_name=\"q\"} 0.0\n";
        assert_eq!(
            map(Engine::Sglang, idle, 16).unwrap().ranks[&0].kv_total_blocks,
            None,
            "an idle engine without the capacity metric: unknown, kept"
        );
    }

    #[test]
    fn missing_malformed_and_too_many_ranks_are_errors() {
        let kind = |engine, body: &str| map(engine, body, 4).unwrap_err().kind();
        assert_eq!(kind(Engine::Vllm, ""), "missing");
        assert_eq!(
            kind(Engine::Vllm, "up 1\nother_metric{a=\"b\"} 2\n"),
            "missing"
        );
        let no_info = "vllm:kv_cache_usage_perc{engine=\"0\"} 0.5\nvllm:num_requests_waiting{engine=\"0\"} 1\n";
        assert_eq!(kind(Engine::Vllm, no_info), "missing");
        let no_waiting =
            "vllm:kv_cache_usage_perc 0.5\nvllm:cache_config_info{num_gpu_blocks=\"8\"} 1\n";
        assert_eq!(kind(Engine::Vllm, no_waiting), "missing");
        let none_blocks = "vllm:cache_config_info{num_gpu_blocks=\"None\"} 1\n";
        assert_eq!(kind(Engine::Vllm, none_blocks), "malformed");
        for bad in [
            "vllm:num_requests_waiting{engine=\"0\"} lots\n",
            "vllm:num_requests_waiting{engine=\"x\"} 1\n",
            "vllm:num_requests_waiting -1\n",
            "vllm:num_requests_waiting NaN\n",
            "vllm:num_requests_waiting +Inf\n",
            "vllm:kv_cache_usage_perc 1.5\n",
            "vllm:num_requests_waiting{engine=\"0\" 1\n",
        ] {
            assert_eq!(kind(Engine::Vllm, bad), "malformed", "{bad}");
        }
        let sg = "sglang:num_queue_reqs 1\n";
        assert_eq!(kind(Engine::Sglang, sg), "missing");
        let ranks: String = (0..5)
            .map(|e| format!("vllm:num_requests_waiting{{engine=\"{e}\"}} 0\n"))
            .collect();
        assert_eq!(kind(Engine::Vllm, &ranks), "too_many_ranks");
        // Malformed lines of metrics the mapping does not read are ignored.
        let ok =
            "garbage {{{\nvllm:other{ 1\nvllm:kv_cache_usage_perc 0\nvllm:num_requests_waiting 0\n\
                  vllm:cache_config_info{num_gpu_blocks=\"8\"} 1\n";
        assert!(map(Engine::Vllm, ok, 4).is_ok());
    }
}
