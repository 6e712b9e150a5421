//! `/metrics` in vLLM's names and labels (V1 engine, v0.10–v0.11), one
//! series per data-parallel rank told apart by the label `engine`, as
//! vLLM labels its data-parallel engines.
//!
//! It carries what loadgate's scraper reads (`core/src/scrape/engines.rs`):
//! `vllm:kv_cache_usage_perc`, `vllm:num_requests_waiting` and the info
//! gauge `vllm:cache_config_info` whose label `num_gpu_blocks` is the KV
//! capacity; the inter-token latency histogram
//! `vllm:inter_token_latency_seconds` (its count and sum: each output token
//! after a request's first, and the step it took), which an SLO's step fit
//! reads; and beside them the gauge `vllm:num_requests_running` and the
//! counters a dashboard of a vLLM fleet plots (preemptions, prompt and
//! generation tokens, finished requests).

use std::fmt::Write;

use super::rank::Snapshot;
use crate::engine::EngineConfig;

/// A metric family: name, help, and its value for a rank.
type Family<T> = (&'static str, &'static str, fn(&Snapshot) -> T);

/// The exposition of ranks `snapshots` (rank `i` at index `i`) serving
/// `model`, each of shape `config`.
pub fn render(model: &str, config: &EngineConfig, snapshots: &[Snapshot]) -> String {
    let model = escape(model);
    let mut out = String::with_capacity(512 + snapshots.len() * 1024);
    let gauges: [Family<f64>; 3] = [
        (
            "vllm:num_requests_running",
            "Number of requests in model execution batches.",
            |s| s.signals.num_requests_running as f64,
        ),
        (
            "vllm:num_requests_waiting",
            "Number of requests waiting to be processed.",
            |s| s.signals.num_requests_waiting as f64,
        ),
        (
            "vllm:kv_cache_usage_perc",
            "KV-cache usage. 1 means 100 percent usage.",
            |s| s.signals.kv_cache_usage_perc,
        ),
    ];
    for (name, help, value) in gauges {
        family(&mut out, name, help, "gauge");
        for (rank, s) in snapshots.iter().enumerate() {
            let _ = writeln!(
                out,
                "{name}{{engine=\"{rank}\",model_name=\"{model}\"}} {:?}",
                value(s)
            );
        }
    }
    family(
        &mut out,
        "vllm:cache_config_info",
        "Information of the LLMEngine CacheConfig",
        "gauge",
    );
    for rank in 0..snapshots.len() {
        let _ = writeln!(
            out,
            "vllm:cache_config_info{{block_size=\"{}\",cache_dtype=\"auto\",enable_prefix_caching=\"False\",\
             engine=\"{rank}\",gpu_memory_utilization=\"0.9\",num_cpu_blocks=\"None\",\
             num_gpu_blocks=\"{}\",num_gpu_blocks_override=\"{}\",sliding_window=\"None\"}} 1.0",
            config.block_size, config.num_gpu_blocks, config.num_gpu_blocks
        );
    }
    let counters: [Family<u64>; 4] = [
        (
            "vllm:num_preemptions_total",
            "Cumulative number of preemption from the engine.",
            |s| s.preemptions,
        ),
        (
            "vllm:prompt_tokens_total",
            "Number of prefill tokens processed.",
            |s| s.counters.prompt_tokens,
        ),
        (
            "vllm:generation_tokens_total",
            "Number of generation tokens processed.",
            |s| s.counters.generation_tokens,
        ),
        (
            "vllm:request_success_total",
            "Count of successfully processed requests.",
            |s| s.counters.finished,
        ),
    ];
    for (name, help, value) in counters {
        family(&mut out, name, help, "counter");
        for (rank, s) in snapshots.iter().enumerate() {
            let extra = if name == "vllm:request_success_total" {
                ",finished_reason=\"length\""
            } else {
                ""
            };
            let _ = writeln!(
                out,
                "{name}{{engine=\"{rank}\"{extra},model_name=\"{model}\"}} {:?}",
                value(s) as f64
            );
        }
    }
    let name = "vllm:inter_token_latency_seconds";
    family(
        &mut out,
        name,
        "Histogram of inter-token latency in seconds.",
        "histogram",
    );
    for (rank, s) in snapshots.iter().enumerate() {
        let labels = format!("engine=\"{rank}\",model_name=\"{model}\"");
        let (count, sum) = (s.counters.gaps as f64, s.counters.gap_nanos as f64 * 1e-9);
        let _ = writeln!(
            out,
            "{name}_bucket{{engine=\"{rank}\",le=\"+Inf\",model_name=\"{model}\"}} {count:?}"
        );
        let _ = writeln!(out, "{name}_count{{{labels}}} {count:?}");
        let _ = writeln!(out, "{name}_sum{{{labels}}} {sum:?}");
    }
    out
}

fn family(out: &mut String, name: &str, help: &str, kind: &str) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
}

/// A label value in the text format: backslash, quote and newline escaped.
fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::Signals;
    use crate::serve::rank::Counters;

    #[test]
    fn one_series_per_rank_with_the_capacity_label() {
        let s = |used: u64, waiting: u64| Snapshot {
            signals: Signals {
                kv_used_blocks: used,
                kv_cache_usage_perc: used as f64 / 100.0,
                num_requests_waiting: waiting,
                num_requests_running: 1,
                ..Default::default()
            },
            counters: Counters {
                finished: 3,
                gaps: 4,
                gap_nanos: 20_000_000,
                ..Default::default()
            },
            preemptions: 0,
        };
        let config = EngineConfig {
            num_gpu_blocks: 100,
            ..Default::default()
        };
        let text = render("a\"b", &config, &[s(50, 0), s(25, 7)]);
        assert!(
            text.contains("vllm:kv_cache_usage_perc{engine=\"1\",model_name=\"a\\\"b\"} 0.25\n")
        );
        assert!(
            text.contains("vllm:num_requests_waiting{engine=\"1\",model_name=\"a\\\"b\"} 7.0\n")
        );
        assert!(text.contains("num_gpu_blocks=\"100\""));
        assert!(text.contains(
            "vllm:request_success_total{engine=\"0\",finished_reason=\"length\",model_name=\"a\\\"b\"} 3.0\n"
        ));
        assert_eq!(text.matches("vllm:cache_config_info{").count(), 2);
        assert!(text.contains(
            "vllm:inter_token_latency_seconds_count{engine=\"1\",model_name=\"a\\\"b\"} 4.0\n"
        ));
        assert!(text.contains(
            "vllm:inter_token_latency_seconds_sum{engine=\"0\",model_name=\"a\\\"b\"} 0.02\n"
        ));
    }
}
