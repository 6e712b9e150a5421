//! One data-parallel rank in real time: the emulator's step loop on a
//! thread of its own, and a channel per request that carries its tokens to
//! the HTTP response streaming them.
//!
//! The loop runs `begin_step`, sleeps the step's duration (the engine has
//! already divided it by `--speedup-ratio`), runs `end_step` and hands each
//! token to its request's channel. Sleeps aim at absolute deadlines, each
//! step starting where the previous one was due to end, so the scheduler's
//! wake-up latency does not add up over a run of steps; a step after an
//! idle spell, or after a stall of more than [`MAX_CATCH_UP`], starts from
//! now instead (no missed steps run back to back). A thread (not a tokio task) runs
//! it because tokio's timer counts whole milliseconds and a step at a high
//! speedup ratio takes less than one.
//!
//! A request whose client goes away is aborted in the engine
//! ([`Engine::abort`]), which frees its KV blocks at once, as vLLM does.

use std::collections::HashMap;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use loadgate::cluster::Publisher;
use loadgate::LoadReport;
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver, UnboundedSender};

use crate::engine::{Engine, EngineConfig, EngineRequest, Signals, Token};

/// How far behind its deadlines a rank may fall before it stops catching up.
pub const MAX_CATCH_UP: Duration = Duration::from_millis(20);

/// Counters of one rank, for `/metrics`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counters {
    /// Requests the rank took.
    pub requests: u64,
    /// Requests that produced all their tokens.
    pub finished: u64,
    /// Requests taken out by their client leaving.
    pub aborted: u64,
    /// Prompt tokens of the requests taken.
    pub prompt_tokens: u64,
    /// Output tokens produced.
    pub generation_tokens: u64,
    /// Output tokens after a request's first, each one gap: vLLM's
    /// inter-token latency histogram's count.
    pub gaps: u64,
    /// The steps' time those gaps took, nanoseconds: the histogram's sum.
    pub gap_nanos: u64,
}

/// What `/metrics` shows of a rank, read under one lock.
#[derive(Debug, Clone, Copy)]
pub struct Snapshot {
    /// The engine's gauges.
    pub signals: Signals,
    /// Work counters.
    pub counters: Counters,
    /// Preemptions so far.
    pub preemptions: u64,
}

struct State {
    engine: Engine,
    streams: HashMap<u64, UnboundedSender<Token>>,
    counters: Counters,
}

/// One rank: its engine, its open streams and the thread stepping it.
pub struct Rank {
    index: u32,
    state: Mutex<State>,
    wake: Condvar,
    publisher: Option<Arc<Publisher>>,
}

impl std::fmt::Debug for Rank {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Rank")
            .field("index", &self.index)
            .finish_non_exhaustive()
    }
}

impl Rank {
    /// Starts rank `index` of an engine of `config` (checked by the caller)
    /// with its stepping thread; its load goes to `publisher` after every
    /// change.
    pub fn start(
        index: u32,
        config: EngineConfig,
        publisher: Option<Arc<Publisher>>,
    ) -> std::io::Result<Arc<Self>> {
        let rank = Arc::new(Self {
            index,
            state: Mutex::new(State {
                engine: Engine::new(config),
                streams: HashMap::new(),
                counters: Counters::default(),
            }),
            wake: Condvar::new(),
            publisher,
        });
        let stepping = rank.clone();
        std::thread::Builder::new()
            .name(format!("rank-{index}"))
            .spawn(move || stepping.run())?;
        rank.publish(&rank.lock());
        Ok(rank)
    }

    /// The rank's index, its `engine` label.
    pub fn index(&self) -> u32 {
        self.index
    }

    /// Requests in the rank, running and waiting.
    pub fn len(&self) -> u64 {
        self.lock().engine.len()
    }

    /// True when the rank holds no request.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Queues `request` and returns the channel its tokens arrive on, or
    /// `None` when its prompt and output can never fit in the rank's KV
    /// cache (nothing changes then).
    pub fn submit(&self, request: EngineRequest) -> Option<UnboundedReceiver<Token>> {
        let mut st = self.lock();
        if !st.engine.add(request) {
            return None;
        }
        let (tx, rx) = unbounded_channel();
        st.streams.insert(request.id, tx);
        st.counters.requests += 1;
        st.counters.prompt_tokens += u64::from(request.prompt.max(1));
        self.publish(&st);
        drop(st);
        self.wake.notify_one();
        Some(rx)
    }

    /// Takes request `id` out (its client went away); nothing if it has
    /// finished or was never here.
    pub fn abort(&self, id: u64) {
        let mut st = self.lock();
        if st.streams.remove(&id).is_some() {
            st.engine.abort(id);
            st.counters.aborted += 1;
            self.publish(&st);
        }
    }

    /// The gauges and counters, read together.
    pub fn snapshot(&self) -> Snapshot {
        let st = self.lock();
        Snapshot {
            signals: st.engine.signals(),
            counters: st.counters,
            preemptions: st.engine.totals().preemptions,
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The load as a Dynamo worker reports it, to the publisher if any.
    fn publish(&self, st: &State) {
        let Some(publisher) = &self.publisher else {
            return;
        };
        let s = st.engine.signals();
        let report = LoadReport {
            active_decode_blocks: Some(s.active_decode_blocks),
            kv_used_blocks: Some(s.kv_used_blocks),
            kv_total_blocks: Some(s.kv_total_blocks),
            active_prefill_tokens: Some(s.active_prefill_tokens),
            max_num_batched_tokens: Some(s.max_num_batched_tokens),
            waiting_requests: Some(s.num_requests_waiting),
            max_num_seqs: Some(u64::from(st.engine.config().max_num_seqs)),
        };
        // The rank is declared and the values are the engine's own counts:
        // a refusal would be a bug in the declaration, not a runtime state.
        let _ = publisher.report(self.index, &report);
    }

    /// The step loop.
    fn run(&self) {
        let mut tokens = Vec::new();
        // When the last step was due to end.
        let mut due = Instant::now();
        loop {
            let mut st = self.lock();
            let mut waited = false;
            let nanos = loop {
                if st.engine.has_work() {
                    if let Some(nanos) = st.engine.begin_step() {
                        break nanos;
                    }
                }
                // Nothing to run: wait for a request (or an abort that
                // changes what can run).
                st = self
                    .wake
                    .wait_timeout(st, Duration::from_millis(100))
                    .unwrap_or_else(|e| e.into_inner())
                    .0;
                waited = true;
            };
            drop(st);
            // A step after an idle spell starts now; one right after
            // another starts when the other was due to end.
            let now = Instant::now();
            if waited || now.saturating_duration_since(due) > MAX_CATCH_UP {
                due = now;
            }
            due += Duration::from_nanos(nanos);
            let left = due.saturating_duration_since(Instant::now());
            if !left.is_zero() {
                std::thread::sleep(left);
            }
            let mut st = self.lock();
            tokens.clear();
            st.engine.end_step(&mut tokens);
            for t in &tokens {
                st.counters.generation_tokens += 1;
                if t.generated > 1 {
                    st.counters.gaps += 1;
                    st.counters.gap_nanos += nanos;
                }
                if t.finished {
                    st.counters.finished += 1;
                }
                let gone = match st.streams.get(&t.id) {
                    Some(tx) => tx.send(*t).is_err(),
                    None => false,
                };
                if t.finished || gone {
                    st.streams.remove(&t.id);
                }
                if gone && !t.finished {
                    st.engine.abort(t.id);
                    st.counters.aborted += 1;
                }
            }
            self.publish(&st);
        }
    }
}
