//! The engine emulator: one data-parallel rank of a continuous-batching
//! engine, scheduled the way vLLM's scheduler does it.
//!
//! * A waiting queue (FIFO) and a running set of at most `max_num_seqs`.
//! * Each step has a token budget, `max_num_batched_tokens`. Running
//!   requests are served first (a decoding request takes one token, one
//!   still in prefill takes what is left of its prompt, cut to the budget:
//!   chunked prefill); then waiting requests join while seats, budget and
//!   KV blocks last.
//! * KV cache in blocks of `block_size` tokens, `num_gpu_blocks` of them. A
//!   running request that needs a block when none is free preempts the
//!   newest running request (recompute: its blocks are freed, its computed
//!   tokens discarded, and it goes back to the head of the waiting queue,
//!   to be prefilled again, prompt and generated tokens both), as vLLM
//!   does. No waiting request is admitted in a step that preempted.
//! * A step takes Dynamo's mocker's time (its polynomial model, as the
//!   `ai-dynamo` 1.6.1 wheel runs it): `prefill(T) + decode(K)`
//!   milliseconds, where `T` is the new prompt tokens the step computes
//!   (`prefill(T) = p₂T² + p₁T + p₀`, nothing without any) and `K` the
//!   context tokens (prompt and generated) of the requests that decode in
//!   it (`decode(K) = max(floor, d₂u² + d₁u + d₀)` with `u = K` over the KV
//!   capacity in tokens, at most 1; nothing without any), divided by
//!   `speedup_ratio`. A request whose prompt finishes in a step is not one
//!   of its decoders.
//!
//! A step is two calls: [`Engine::begin_step`] schedules the batch and
//! returns how long it takes; [`Engine::end_step`] applies it and returns
//! the tokens it produced, timestamped by the caller at the step's end.
//! A request's first token comes out of the step that finishes its prompt.
//! The engine reports what real engines report: Dynamo's per-rank load and
//! vLLM's gauges ([`Engine::signals`]). Like vLLM's, its waiting count is
//! the requests its last step's scheduling left waiting: a request that
//! arrives during a step is counted only if the next step cannot take it.
//!
//! Default parameters ([`EngineConfig::default`]) are for an 8B model on
//! one H100-class GPU; docs/overload.md gives the source of each.

use std::collections::{HashMap, VecDeque};

/// Step time model, in milliseconds (module docs): Dynamo's mocker's
/// polynomials (`aisimulate-core` 0.13.0, `engine/common/perf_model.rs`,
/// which the `ai-dynamo-runtime` 1.6.1 wheel links).
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct StepModel {
    /// `[p₀, p₁, p₂]`: prefill of `T` new prompt tokens,
    /// `p₀ + p₁T + p₂T²`, paid once per step with any prefill.
    pub prefill_ms: [f64; 3],
    /// `[d₀, d₁, d₂]`: decode at KV use `u`, `d₀ + d₁u + d₂u²`.
    pub decode_ms: [f64; 3],
    /// Shortest decode.
    pub decode_floor_ms: f64,
}

impl Default for StepModel {
    fn default() -> Self {
        Self {
            prefill_ms: [16.501_42, 1.518_344e-2, 4.209_989e-7],
            decode_ms: [5.74, 54.01, -25.74],
            decode_floor_ms: 1.0,
        }
    }
}

impl StepModel {
    /// Prefill of `tokens` new prompt tokens, ms (nothing without any).
    pub fn prefill(&self, tokens: u64) -> f64 {
        if tokens == 0 {
            return 0.0;
        }
        let t = tokens as f64;
        let [p0, p1, p2] = self.prefill_ms;
        p0 + p1 * t + p2 * t * t
    }

    /// Decode of `decoders` requests holding `kv_tokens` context tokens,
    /// on a rank of `capacity` KV tokens, ms (nothing without decoders).
    pub fn decode(&self, decoders: u64, kv_tokens: u64, capacity: u64) -> f64 {
        if decoders == 0 {
            return 0.0;
        }
        let u = (kv_tokens as f64 / capacity.max(1) as f64).min(1.0);
        let [d0, d1, d2] = self.decode_ms;
        (d0 + d1 * u + d2 * u * u).max(self.decode_floor_ms)
    }

    /// Every coefficient, for checks.
    fn coefficients(&self) -> impl Iterator<Item = f64> + '_ {
        self.prefill_ms
            .iter()
            .chain(&self.decode_ms)
            .copied()
            .chain([self.decode_floor_ms])
    }
}

/// One rank's shape, named as vLLM and Dynamo's mocker name the flags.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct EngineConfig {
    /// `--max-num-seqs`: most requests in the running batch.
    pub max_num_seqs: u32,
    /// `--max-num-batched-tokens`: token budget of one step.
    pub max_num_batched_tokens: u32,
    /// `--block-size`: tokens per KV block.
    pub block_size: u32,
    /// `--num-gpu-blocks-override`: KV blocks of the rank.
    pub num_gpu_blocks: u32,
    /// `--speedup-ratio`: steps run this many times faster than modelled.
    pub speedup_ratio: f64,
    /// The step time model.
    pub step: StepModel,
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            max_num_seqs: 256,
            max_num_batched_tokens: 8192,
            block_size: 16,
            num_gpu_blocks: 25_000,
            speedup_ratio: 1.0,
            step: StepModel::default(),
        }
    }
}

impl EngineConfig {
    /// Dynamo's mocker's default engine (`ai-dynamo` 1.6.1, vLLM backend:
    /// `aisimulate-core` 0.13.0 `engine/config.rs` and
    /// `engine/common/protocols.rs`): 256 sequences, a budget of 8192
    /// tokens, 16384 blocks of 64 tokens.
    pub fn mocker() -> Self {
        Self {
            max_num_seqs: 256,
            max_num_batched_tokens: 8192,
            block_size: 64,
            num_gpu_blocks: 16_384,
            speedup_ratio: 1.0,
            step: StepModel::default(),
        }
    }

    /// The first parameter no engine can run with, if any.
    pub fn invalid(&self) -> Option<&'static str> {
        let s = &self.step;
        if self.max_num_seqs == 0 {
            Some("max_num_seqs must be at least 1")
        } else if self.max_num_batched_tokens == 0 {
            Some("max_num_batched_tokens must be at least 1")
        } else if self.block_size == 0 {
            Some("block_size must be at least 1")
        } else if self.num_gpu_blocks == 0 {
            Some("num_gpu_blocks must be at least 1")
        } else if !(self.speedup_ratio.is_finite() && self.speedup_ratio > 0.0) {
            Some("speedup_ratio must be finite and above 0")
        } else if s.coefficients().any(|v| !v.is_finite()) {
            Some("step model coefficients must be finite")
        } else if s.prefill(1) < 0.0
            || s.prefill(u64::from(self.max_num_batched_tokens)) < 0.0
            || s.decode_floor_ms < 0.0
        {
            Some("step model times must be at least 0")
        } else {
            None
        }
    }

    /// Time of a step that computes `prefill_tokens` new prompt tokens and
    /// decodes `decoders` requests holding `decode_kv_tokens` context
    /// tokens, in nanoseconds (at least 1).
    pub fn step_nanos(&self, prefill_tokens: u64, decoders: u64, decode_kv_tokens: u64) -> u64 {
        let capacity = u64::from(self.num_gpu_blocks) * u64::from(self.block_size);
        let ms = self.step.prefill(prefill_tokens)
            + self.step.decode(decoders, decode_kv_tokens, capacity);
        ((ms * 1e6 / self.speedup_ratio) as u64).max(1)
    }
}

/// What a request asks of the engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EngineRequest {
    /// Caller's id, unique among the requests in this engine.
    pub id: u64,
    /// Prompt tokens (at least 1).
    pub prompt: u32,
    /// Output tokens to generate (at least 1).
    pub output: u32,
}

/// A token one step produced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Token {
    /// The request.
    pub id: u64,
    /// Output tokens generated so far, this one included (1: the first).
    pub generated: u32,
    /// True when this was the request's last token: it has left the engine.
    pub finished: bool,
}

/// What the rank reports: Dynamo's per-rank load and vLLM's gauges.
#[derive(Debug, Clone, Copy, PartialEq, Default, serde::Serialize)]
pub struct Signals {
    /// Dynamo `kv_used_blocks`: KV blocks allocated.
    pub kv_used_blocks: u64,
    /// Dynamo `active_decode_blocks`: blocks of running requests.
    pub active_decode_blocks: u64,
    /// Dynamo `active_prefill_tokens`: prompt tokens not yet prefilled, of
    /// running and waiting requests.
    pub active_prefill_tokens: u64,
    /// Dynamo `max_num_batched_tokens`.
    pub max_num_batched_tokens: u64,
    /// KV blocks of the rank.
    pub kv_total_blocks: u64,
    /// vLLM `num_requests_running`.
    pub num_requests_running: u64,
    /// vLLM `num_requests_waiting`.
    pub num_requests_waiting: u64,
    /// vLLM `kv_cache_usage_perc` (0 to 1).
    pub kv_cache_usage_perc: f64,
}

/// Counters of engine work.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
pub struct EngineTotals {
    /// Steps run.
    pub steps: u64,
    /// Tokens computed (prefill and decode), counted when their step is
    /// scheduled.
    pub computed_tokens: u64,
    /// Preemptions (recompute).
    pub preemptions: u64,
    /// Computed tokens thrown away by preemption or abort.
    pub wasted_tokens: u64,
}

#[derive(Debug, Clone)]
struct Seq {
    id: u64,
    prompt: u32,
    output: u32,
    generated: u32,
    /// Tokens whose KV is computed.
    computed: u32,
    blocks: u32,
    /// Tokens scheduled in the step under way.
    scheduled: u32,
}

impl Seq {
    /// Tokens the request holds: its prompt and what it generated.
    fn tokens(&self) -> u32 {
        self.prompt + self.generated
    }

    /// Tokens still to compute before the next sample.
    fn pending(&self) -> u32 {
        self.tokens() - self.computed
    }

    /// Prompt tokens not yet prefilled.
    fn prefill_left(&self) -> u32 {
        self.prompt.saturating_sub(self.computed)
    }
}

/// One data-parallel rank.
#[derive(Debug)]
pub struct Engine {
    config: EngineConfig,
    waiting: VecDeque<Seq>,
    running: Vec<Seq>,
    free_blocks: u32,
    /// Ids aborted while waiting: skipped when reached.
    aborted_waiting: HashMap<u64, ()>,
    live_waiting: u64,
    /// The waiting the last step's scheduling left (what vLLM's
    /// `num_requests_waiting` shows: its scheduler's stats after a step).
    scheduled_waiting: u64,
    waiting_prefill: u64,
    in_step: bool,
    totals: EngineTotals,
}

impl Engine {
    /// An idle rank. Panics on a configuration [`EngineConfig::invalid`]
    /// refuses: callers check it first.
    pub fn new(config: EngineConfig) -> Self {
        assert!(config.invalid().is_none(), "{:?}", config.invalid());
        Self {
            config,
            waiting: VecDeque::new(),
            running: Vec::new(),
            free_blocks: config.num_gpu_blocks,
            aborted_waiting: HashMap::new(),
            live_waiting: 0,
            scheduled_waiting: 0,
            waiting_prefill: 0,
            in_step: false,
            totals: EngineTotals::default(),
        }
    }

    /// The rank's shape.
    pub fn config(&self) -> &EngineConfig {
        &self.config
    }

    /// Queues a request (the engine's own queue is unbounded). Refuses one
    /// whose prompt and output could never fit in the KV cache (vLLM
    /// refuses it at its model length): false, and nothing changes.
    pub fn add(&mut self, request: EngineRequest) -> bool {
        let tokens = u64::from(request.prompt.max(1)) + u64::from(request.output.max(1));
        if tokens > u64::from(self.config.num_gpu_blocks) * u64::from(self.config.block_size) {
            return false;
        }
        let seq = Seq {
            id: request.id,
            prompt: request.prompt.max(1),
            output: request.output.max(1),
            generated: 0,
            computed: 0,
            blocks: 0,
            scheduled: 0,
        };
        self.waiting_prefill += u64::from(seq.prompt);
        self.live_waiting += 1;
        self.waiting.push_back(seq);
        true
    }

    /// Takes a request out (the client went away): its blocks are freed at
    /// once, its computed tokens count as wasted. False if it is not here.
    pub fn abort(&mut self, id: u64) -> bool {
        if let Some(i) = self.running.iter().position(|s| s.id == id) {
            let seq = self.running.remove(i);
            self.free_blocks += seq.blocks;
            self.totals.wasted_tokens += u64::from(seq.computed + seq.scheduled);
            return true;
        }
        if self.aborted_waiting.contains_key(&id) {
            return false;
        }
        let Some(seq) = self.waiting.iter().find(|s| s.id == id) else {
            return false;
        };
        self.waiting_prefill -= u64::from(seq.prefill_left());
        self.live_waiting -= 1;
        self.aborted_waiting.insert(id, ());
        true
    }

    /// True when there is anything to run.
    pub fn has_work(&self) -> bool {
        !self.running.is_empty() || self.live_waiting > 0
    }

    /// Schedules the next step and returns its duration in nanoseconds, or
    /// `None` when there is nothing to run. Call [`end_step`](Self::end_step)
    /// when that time has passed.
    pub fn begin_step(&mut self) -> Option<u64> {
        assert!(!self.in_step, "begin_step twice without end_step");
        let mut budget = self.config.max_num_batched_tokens;
        let mut preempted = false;
        let mut prefill_tokens = 0u64;
        let (mut decoders, mut decode_kv) = (0u64, 0u64);
        let mut scheduled_any = false;
        // Running requests first, oldest first; the newest is preempted
        // when blocks run out.
        let mut i = 0;
        while i < self.running.len() && budget > 0 {
            let want = self.running[i].pending().min(budget);
            let needed = self.blocks_for(self.running[i].computed + want);
            let extra = needed.saturating_sub(self.running[i].blocks);
            if extra > self.free_blocks {
                // Preempt from the newest end until this one fits or is itself
                // the newest.
                let mut fits = false;
                while self.running.len() - 1 > i {
                    self.preempt_newest();
                    preempted = true;
                    if extra <= self.free_blocks {
                        fits = true;
                        break;
                    }
                }
                if !fits {
                    // It is the newest: preempt it too.
                    self.preempt_newest();
                    preempted = true;
                    break;
                }
            }
            let seq = &mut self.running[i];
            self.free_blocks -= extra;
            seq.blocks = needed;
            seq.scheduled = want;
            if seq.computed < seq.prompt {
                prefill_tokens += u64::from(want);
            } else if want > 1 {
                // Recomputing generated tokens after a preemption.
                prefill_tokens += u64::from(want - 1);
            } else {
                // A decoder: its context is what it holds with this token.
                decoders += 1;
                decode_kv += u64::from(seq.computed + want);
            }
            budget -= want;
            scheduled_any = true;
            i += 1;
        }
        // Then waiting requests, FIFO, while seats, budget and blocks last.
        while !preempted
            && budget > 0
            && (self.running.len() as u64) < u64::from(self.config.max_num_seqs)
        {
            let Some(front) = self.waiting.front() else {
                break;
            };
            if self.aborted_waiting.remove(&front.id).is_some() {
                self.waiting.pop_front();
                continue;
            }
            let want = front.pending().min(budget);
            let needed = self.blocks_for(front.computed + want);
            if needed > self.free_blocks {
                break;
            }
            let mut seq = self.waiting.pop_front().expect("front exists");
            self.live_waiting -= 1;
            self.waiting_prefill -= u64::from(seq.prefill_left());
            self.free_blocks -= needed;
            seq.blocks = needed;
            seq.scheduled = want;
            prefill_tokens += u64::from(want.saturating_sub(u32::from(seq.generated > 0)));
            budget -= want;
            scheduled_any = true;
            self.running.push(seq);
        }
        self.scheduled_waiting = self.live_waiting;
        if !scheduled_any {
            return None;
        }
        self.in_step = true;
        // The step computes what it scheduled, whatever leaves meanwhile.
        self.totals.computed_tokens += self
            .running
            .iter()
            .map(|s| u64::from(s.scheduled))
            .sum::<u64>();
        Some(self.config.step_nanos(prefill_tokens, decoders, decode_kv))
    }

    /// Applies the step begun by [`begin_step`](Self::begin_step) and
    /// returns the tokens it produced (appended to `out`).
    pub fn end_step(&mut self, out: &mut Vec<Token>) {
        assert!(self.in_step, "end_step without begin_step");
        self.in_step = false;
        self.totals.steps += 1;
        let mut i = 0;
        while i < self.running.len() {
            let seq = &mut self.running[i];
            let done = seq.scheduled;
            seq.scheduled = 0;
            seq.computed += done;
            if done > 0 && seq.computed == seq.tokens() {
                seq.generated += 1;
                let finished = seq.generated >= seq.output;
                out.push(Token {
                    id: seq.id,
                    generated: seq.generated,
                    finished,
                });
                if finished {
                    let seq = self.running.remove(i);
                    self.free_blocks += seq.blocks;
                    continue;
                }
            }
            i += 1;
        }
    }

    /// The rank's load, as real engines report it.
    pub fn signals(&self) -> Signals {
        let used = u64::from(self.config.num_gpu_blocks - self.free_blocks);
        let running_prefill: u64 = self
            .running
            .iter()
            .map(|s| u64::from(s.prefill_left()))
            .sum();
        Signals {
            kv_used_blocks: used,
            active_decode_blocks: used,
            active_prefill_tokens: running_prefill + self.waiting_prefill,
            max_num_batched_tokens: u64::from(self.config.max_num_batched_tokens),
            kv_total_blocks: u64::from(self.config.num_gpu_blocks),
            num_requests_running: self.running.len() as u64,
            // As vLLM's gauge: the waiting its last step's scheduling left
            // (arrivals since then join at the next), less those aborted.
            num_requests_waiting: self.scheduled_waiting.min(self.live_waiting),
            kv_cache_usage_perc: used as f64 / f64::from(self.config.num_gpu_blocks),
        }
    }

    /// Work counters so far.
    pub fn totals(&self) -> EngineTotals {
        self.totals
    }

    /// Requests in the engine, running and waiting.
    pub fn len(&self) -> u64 {
        self.running.len() as u64 + self.live_waiting
    }

    /// True when no request is in the engine.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn blocks_for(&self, tokens: u32) -> u32 {
        tokens.div_ceil(self.config.block_size)
    }

    fn preempt_newest(&mut self) {
        let mut seq = self.running.pop().expect("a running request to preempt");
        self.free_blocks += seq.blocks;
        self.totals.preemptions += 1;
        self.totals.wasted_tokens += u64::from(seq.computed);
        seq.computed = 0;
        seq.blocks = 0;
        seq.scheduled = 0;
        self.waiting_prefill += u64::from(seq.prefill_left());
        self.live_waiting += 1;
        self.waiting.push_front(seq);
    }
}
