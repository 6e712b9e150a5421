//! The arms: the admission designs compared, each built from loadgate's
//! own parts (or from none), with the knobs the tuning grid searches.

use std::time::Duration;

use loadgate::flow::FlowConfig;
use loadgate::monitor::FlowControlConfig;
use loadgate::{ClassConfig, GateConfig, Policy, Staleness, ThresholdUpdate};
use rand::seq::SliceRandom;
use rand::SeedableRng;
use serde::Serialize;

/// Which design an arm is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub enum ArmKind {
    /// (a) No admission control: the frontend routes round-robin, the engine
    /// queues everything.
    NoControl,
    /// (b) The engine's own `max_num_seqs` as the only limit.
    EngineLimit,
    /// (c) Dynamo 1.6.1's request rejection, held to its own semantics: busy
    /// thresholds at the frontend over worker-reported load and the
    /// router's bookings (decode, absolute and fractional prefill), an
    /// `N + Q` FIFO limit at the worker with `Q ≥ 2`, a worker's refusal
    /// leased and answered 529, no deadline, no `Retry-After`.
    Dynamo,
    /// (d) An llm-d-style saturation detector: a worker is saturated when
    /// its waiting queue or its KV cache reaches a threshold, or its
    /// metrics are stale; all saturated means reject.
    Saturation,
    /// (e) loadgate with every feature it has: thresholds, gate, wait limit,
    /// deadlines, priority classes, `Retry-After`, stale-signal policy.
    Loadgate,
    /// (f) A token bucket at the measured capacity `C*`, joined to the
    /// shortest queue.
    TokenBucket,
    /// (g) Arm (e) with a frontend queue: a request that finds every worker
    /// busy waits (priority bands, then first in, first out) and is sent
    /// the moment one has room.
    Queue,
    /// (h) Arm (g) with each tenant's requests ordered and shed by virtual
    /// token counters.
    FairQueue,
    /// (i) loadgate given only the run's SLO (`Monitor::set_slo`): no
    /// threshold, gate or queue; untuned.
    Slo,
}

impl ArmKind {
    /// Every arm, in report order.
    pub const ALL: [ArmKind; 9] = [
        ArmKind::NoControl,
        ArmKind::EngineLimit,
        ArmKind::Dynamo,
        ArmKind::Saturation,
        ArmKind::Loadgate,
        ArmKind::TokenBucket,
        ArmKind::Queue,
        ArmKind::FairQueue,
        ArmKind::Slo,
    ];

    /// The arms whose knobs are searched (the others have none).
    pub const TUNABLE: [ArmKind; 6] = [
        ArmKind::EngineLimit,
        ArmKind::Dynamo,
        ArmKind::Saturation,
        ArmKind::Loadgate,
        ArmKind::Queue,
        ArmKind::FairQueue,
    ];

    /// Short label, `(a)` to `(h)` with a name.
    pub fn label(self) -> &'static str {
        match self {
            ArmKind::NoControl => "(a) no control",
            ArmKind::EngineLimit => "(b) engine max_num_seqs",
            ArmKind::Dynamo => "(c) Dynamo's design",
            ArmKind::Saturation => "(d) llm-d-style saturation",
            ArmKind::Loadgate => "(e) loadgate, every feature",
            ArmKind::TokenBucket => "(f) token bucket at C*",
            ArmKind::Queue => "(g) loadgate with the queue",
            ArmKind::FairQueue => "(h) queue and fairness",
            ArmKind::Slo => "(i) loadgate, only the SLO",
        }
    }

    /// What the arm is, in a sentence or two, for the report.
    pub fn describe(self) -> &'static str {
        match self {
            ArmKind::NoControl => {
                "the frontend routes round-robin and the engines queue everything (vLLM as it ships, \
                 no admission layer)."
            }
            ArmKind::EngineLimit => {
                "as (a), with the engine's own `max_num_seqs` as the only knob; the engines still queue \
                 everything else. Its defaults are the engine's (256)."
            }
            ArmKind::Dynamo => {
                "Dynamo 1.6.1's request rejection, held to its semantics and built from loadgate's parts \
                 with Dynamo's settings: busy thresholds at the frontend (`active_decode_blocks_threshold`, \
                 `active_prefill_tokens_threshold` in tokens and `active_prefill_tokens_threshold_frac` of \
                 the step's token budget) over worker-reported KV use and the router's own bookings of \
                 blocks and prompt tokens, round-robin routing, an `N + Q` FIFO limit at each worker with \
                 `Q ≥ 2` (1.6.1 cannot express less) and no wait limit, deadline or `Retry-After`; a \
                 worker's refusal leases that worker (`reroutes = 0`) and the client hears 529. Its \
                 defaults are 1.6.1 as shipped: every threshold unset and no worker limit, so nothing is \
                 ever refused. The lab sets thresholds once before traffic, so 1.6.1's lazy \
                 re-evaluation of a changed threshold (at the next load event) does not arise here."
            }
            ArmKind::Saturation => {
                "a saturation detector in the style of llm-d and the Gateway API inference extension \
                 (not its code: its scorers are not modelled), built from loadgate's monitor: a worker \
                 is saturated when its waiting queue reaches the queue threshold (5 by default) or its KV \
                 use the KV threshold (0.8), or when its metrics are older than 200 ms; all saturated \
                 means reject; power-of-two routing. No worker gate: the engines queue what is admitted."
            }
            ArmKind::Loadgate => {
                "loadgate with every feature it has: decode, prefill and waiting-requests thresholds, \
                 router bookings, ranks stale for 3 s counted busy, the worker gate with a wait limit, a \
                 queue deadline and two priority classes (reserved slots for class 0), a worker's \
                 refusal handed back to the monitor (`Monitor::redispatch`: leased, then routed again up \
                 to the tuned number of times), and `Retry-After` on every rejection."
            }
            ArmKind::TokenBucket => {
                "admits with a token bucket at `C*` (a tenth of a second deep) and sends each request \
                 to the worker with the fewest requests in it. Not an upper bound: it knows nothing of \
                 bursts, retries or which requests will still meet their SLO. The reference for each \
                 cell is instead the best goodput any arm reached when tuned on that cell."
            }
            ArmKind::Queue => {
                "loadgate with its frontend queue (`Monitor::dispatch`): a request that finds every \
                 worker busy waits, priority band first and then in arrival order, until a report, a \
                 finished request's released booking or a sweep shows a worker with room, or until its \
                 queue deadline (refused with `Retry-After` from the queue's drain rate); a full queue \
                 turns away its newest, least important request; a worker's refusal goes back into the \
                 queue at its place (`Monitor::redispatch`). Its own search covers arm (e)'s knobs and \
                 the queue's."
            }
            ArmKind::FairQueue => {
                "arm (g) with each request carrying its tenant: within a band, the tenant with the \
                 lowest virtual token counter (VTC: prompt tokens at dispatch, twice the output tokens \
                 as they stream) goes first, and a full queue turns away the heaviest tenant's newest \
                 request. Its own search, over the same space as (g)."
            }
            ArmKind::Slo => {
                "loadgate given the run's SLO and nothing else (`Monitor::set_slo`, enforced): each \
                 rank's step time fitted from the streams the frontend sees, each request's answer \
                 reserved in the KV from the answers' learned lengths, and a rank busy while its \
                 predicted time to first token or per output token misses the SLO or its bookings \
                 fill its KV; power-of-two routing by the predictions' slack; a request no rank can \
                 take waits in the frontend queue only while its measured drain (the lesser of the \
                 queue's dispatches and the bookings that ended) predicts a dispatch in time for \
                 the TTFT target, else hears 529 at once. Router bookings, no threshold \
                 or gate; the queue at its defaults with room never to fill. No knobs: never tuned."
            }
        }
    }

    /// Whether the arm's frontend runs a loadgate `Monitor` fed by load
    /// reports.
    pub fn uses_monitor(self) -> bool {
        matches!(
            self,
            ArmKind::Dynamo
                | ArmKind::Saturation
                | ArmKind::Loadgate
                | ArmKind::Queue
                | ArmKind::FairQueue
                | ArmKind::Slo
        )
    }
}

/// Arm (i)'s queue: room for more requests than its SLO lets wait.
const SLO_QUEUE: u32 = 4096;

/// The frontend queue's knobs (`Monitor::set_flow_control`).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct FlowKnobs {
    /// Requests that may wait.
    pub limit: u32,
    /// How long a request may wait, seconds.
    pub deadline_s: f64,
    /// Requests carry their tenant (VTC order and shedding); without it
    /// every request is of one tenant.
    pub fair: bool,
}

impl FlowKnobs {
    /// The monitor's flow-control configuration, dispatching by `policy`.
    pub fn config(&self, policy: Policy) -> FlowControlConfig {
        let mut queue = FlowConfig::new(self.limit);
        queue.deadline = Duration::from_secs_f64(self.deadline_s);
        FlowControlConfig { queue, policy }
    }
}

/// The worker gate's knobs.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct GateKnobs {
    /// `N`: requests running at once.
    pub limit: u32,
    /// `Q`: requests waiting.
    pub queue: u32,
    /// `W`: admitted requests without their first token.
    pub wait_limit: Option<u32>,
    /// Queue deadline.
    pub deadline_s: Option<f64>,
    /// Two priority classes: class 0 may use the whole queue and `reserved`
    /// slots no class-1 request may take; class 1 waits at most half as
    /// long.
    pub classes: Option<u32>,
}

impl GateKnobs {
    /// The loadgate gate configuration.
    pub fn config(&self) -> GateConfig {
        let deadline = self.deadline_s.map(Duration::from_secs_f64);
        let mut config = GateConfig::new(self.limit)
            .with_queue(self.queue)
            .with_wait_limit(self.wait_limit)
            .with_queue_timeout(deadline);
        if let Some(reserved) = self.classes {
            config = config
                .with_classes(2)
                .with_class(
                    0,
                    ClassConfig {
                        queue: self.queue,
                        queue_timeout: deadline,
                        reserved,
                    },
                )
                .with_class(
                    1,
                    ClassConfig {
                        queue: self.queue,
                        queue_timeout: deadline.map(|d| d / 2),
                        reserved: 0,
                    },
                );
        }
        config
    }
}

/// One arm with its knobs.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Arm {
    /// The design.
    pub kind: ArmKind,
    /// Engine `max_num_seqs` override.
    pub max_num_seqs: Option<u32>,
    /// Frontend decode threshold (fraction of KV blocks).
    pub decode_threshold: Option<f64>,
    /// Frontend waiting-requests threshold (busy above it).
    pub waiting_threshold: Option<u64>,
    /// Frontend absolute prefill threshold, tokens.
    pub prefill_tokens: Option<u64>,
    /// Frontend fractional prefill threshold.
    pub prefill_frac: Option<f64>,
    /// Staleness policy (`"busy"` or `"free"`) and its silence, seconds.
    pub staleness: Option<(&'static str, f64)>,
    /// The router books each request's blocks and prompt on its worker.
    pub book: bool,
    /// Routing policy name (`round_robin`, `power_of_two`).
    pub policy: &'static str,
    /// The worker gate, if any.
    pub gate: Option<GateKnobs>,
    /// `Retry-After` sent with each rejection, seconds.
    pub retry_after_s: Option<f64>,
    /// Admission rate of the token bucket (fleet, requests per second).
    pub bucket_rate: Option<f64>,
    /// How many times the monitor routes a request again after workers
    /// refused it (`MonitorConfig::reroutes`; the worker is under an
    /// overload lease meanwhile), before answering 529. With a frontend
    /// queue the request goes back into it instead.
    pub reroute: u32,
    /// The frontend queue, if any.
    pub flow: Option<FlowKnobs>,
    /// The monitor is given the run's SLO (`Monitor::set_slo`).
    pub slo: bool,
}

impl Arm {
    /// An arm of `kind` with its defaults: what a user who installs the
    /// design and tunes nothing runs.
    pub fn base(kind: ArmKind) -> Self {
        let arm = Self {
            kind,
            max_num_seqs: None,
            decode_threshold: None,
            waiting_threshold: None,
            prefill_tokens: None,
            prefill_frac: None,
            staleness: None,
            book: false,
            policy: "round_robin",
            gate: None,
            retry_after_s: None,
            bucket_rate: None,
            reroute: 0,
            flow: None,
            slo: false,
        };
        match kind {
            ArmKind::NoControl | ArmKind::EngineLimit | ArmKind::TokenBucket => arm,
            // The SLO's own decisions: routing by slack, a queue it
            // decides who may wait in (the default deadline, room for
            // more than the SLO ever lets wait).
            ArmKind::Slo => Self {
                book: true,
                slo: true,
                policy: "power_of_two",
                flow: Some(FlowKnobs {
                    limit: SLO_QUEUE,
                    deadline_s: loadgate::flow::DEFAULT_FLOW_DEADLINE.as_secs_f64(),
                    fair: false,
                }),
                ..arm
            },
            // 1.6.1 as shipped: thresholds unset, no worker limit; the
            // router books what it routes.
            ArmKind::Dynamo => Self { book: true, ..arm },
            ArmKind::Saturation => Self {
                decode_threshold: Some(0.8),
                waiting_threshold: Some(4),
                staleness: Some(("busy", 0.2)),
                policy: "power_of_two",
                ..arm
            },
            ArmKind::Loadgate => Self {
                decode_threshold: Some(0.9),
                waiting_threshold: Some(4),
                staleness: Some(("busy", 3.0)),
                book: true,
                policy: "power_of_two",
                gate: Some(GateKnobs {
                    limit: 128,
                    queue: 32,
                    wait_limit: Some(32),
                    deadline_s: Some(1.0),
                    classes: Some(8),
                }),
                retry_after_s: Some(1.0),
                reroute: 1,
                ..arm
            },
            // A prefill threshold keeps a queue from sending more prompts
            // than a worker's step takes.
            ArmKind::Queue | ArmKind::FairQueue => {
                let e = Self::base(ArmKind::Loadgate);
                Self {
                    kind,
                    prefill_frac: Some(1.0),
                    gate: e.gate.map(|g| GateKnobs { queue: 0, ..g }),
                    flow: Some(FlowKnobs {
                        limit: 256,
                        deadline_s: 1.5,
                        fair: kind == ArmKind::FairQueue,
                    }),
                    ..e
                }
            }
        }
    }

    /// Every candidate of the design's own knob space (empty for the arms
    /// with no knobs).
    pub fn space(kind: ArmKind) -> Vec<Arm> {
        let base = Arm::base(kind);
        let mut out = Vec::new();
        match kind {
            ArmKind::NoControl | ArmKind::TokenBucket | ArmKind::Slo => {}
            ArmKind::EngineLimit => {
                for n in [4, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256] {
                    out.push(Arm {
                        max_num_seqs: Some(n),
                        ..base.clone()
                    });
                }
            }
            ArmKind::Dynamo => {
                let decode = [
                    None,
                    Some(0.5),
                    Some(0.6),
                    Some(0.7),
                    Some(0.8),
                    Some(0.9),
                    Some(0.95),
                ];
                let tokens = [
                    None,
                    Some(2048),
                    Some(4096),
                    Some(8192),
                    Some(16384),
                    Some(32768),
                ];
                let frac = [None, Some(0.5), Some(1.0), Some(1.5), Some(2.0), Some(4.0)];
                let limit = [None, Some(32), Some(64), Some(128), Some(192), Some(256)];
                for d in decode {
                    for t in tokens {
                        for f in frac {
                            for n in limit {
                                // Q >= 2: Dynamo 1.6.1 cannot express less.
                                let queues: &[u32] = if n.is_some() {
                                    &[2, 4, 8, 16, 32, 64]
                                } else {
                                    &[0]
                                };
                                for &q in queues {
                                    out.push(Arm {
                                        decode_threshold: d,
                                        prefill_tokens: t,
                                        prefill_frac: f,
                                        gate: n.map(|limit| GateKnobs {
                                            limit,
                                            queue: q,
                                            wait_limit: None,
                                            deadline_s: None,
                                            classes: None,
                                        }),
                                        ..base.clone()
                                    });
                                }
                            }
                        }
                    }
                }
            }
            ArmKind::Saturation => {
                for kv in [0.5, 0.6, 0.7, 0.8, 0.85, 0.9, 0.95] {
                    for w in [0, 1, 2, 4, 7, 11, 15] {
                        out.push(Arm {
                            decode_threshold: Some(kv),
                            waiting_threshold: Some(w),
                            ..base.clone()
                        });
                    }
                }
            }
            ArmKind::Loadgate => out = Self::loadgate_space(&base),
            ArmKind::Queue | ArmKind::FairQueue => {
                for arm in Self::loadgate_space(&base) {
                    for limit in [64, 256, 1024] {
                        for deadline_s in [0.5, 1.0, 1.5, 2.0] {
                            let flow = FlowKnobs {
                                limit,
                                deadline_s,
                                fair: kind == ArmKind::FairQueue,
                            };
                            out.push(Arm {
                                flow: Some(flow),
                                ..arm.clone()
                            });
                        }
                    }
                }
            }
        }
        out
    }

    /// Arm (e)'s knob space, on `base` (arm (e), or a queue arm).
    fn loadgate_space(base: &Arm) -> Vec<Arm> {
        let mut out = Vec::new();
        for decode in [0.7, 0.8, 0.9, 0.95] {
            for waiting in [None, Some(1), Some(4), Some(16)] {
                for prefill in [None, Some(0.5), Some(1.0), Some(2.0)] {
                    for n in [64, 128, 192, 256] {
                        for (q, w) in [
                            (0, None),
                            (8, Some(16)),
                            (32, Some(32)),
                            (32, None),
                            (64, Some(64)),
                        ] {
                            for deadline in [0.5, 1.0, 2.0] {
                                for (policy, reroute) in [
                                    ("round_robin", 0),
                                    ("round_robin", 1),
                                    ("power_of_two", 0),
                                    ("power_of_two", 1),
                                ] {
                                    out.push(Arm {
                                        decode_threshold: Some(decode),
                                        waiting_threshold: waiting,
                                        prefill_frac: prefill,
                                        gate: Some(GateKnobs {
                                            limit: n,
                                            queue: q,
                                            wait_limit: w,
                                            deadline_s: Some(deadline),
                                            classes: Some(n / 16),
                                        }),
                                        policy,
                                        reroute,
                                        ..base.clone()
                                    });
                                }
                            }
                        }
                    }
                }
            }
        }
        out
    }

    /// The candidates a search of `budget` tries for `kind`: the design's
    /// defaults first (so that a tie keeps them), then candidates drawn
    /// from its own knob space with `seed`, without repeats; the whole
    /// space when it is smaller than the budget.
    pub fn search(kind: ArmKind, budget: usize, seed: u64) -> Vec<Arm> {
        let base = Arm::base(kind);
        let mut space = Arm::space(kind);
        space.retain(|a| *a != base);
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed ^ kind as u64);
        space.shuffle(&mut rng);
        std::iter::once(base)
            .chain(space)
            .take(budget.max(1))
            .collect()
    }

    /// The frontend thresholds of this arm.
    pub fn thresholds(&self) -> ThresholdUpdate {
        ThresholdUpdate {
            active_decode_blocks_threshold: self.decode_threshold,
            active_prefill_tokens_threshold: self.prefill_tokens,
            active_prefill_tokens_threshold_frac: self.prefill_frac,
            waiting_requests_threshold: self.waiting_threshold,
            ..Default::default()
        }
    }

    /// The routing policy.
    pub fn routing(&self) -> Policy {
        Policy::from_name(self.policy).unwrap_or_default()
    }

    /// The staleness policy and its silence, if any.
    pub fn stale(&self) -> Option<(Staleness, Duration)> {
        self.staleness.map(|(name, after)| {
            (
                Staleness::from_name(name).unwrap_or_default(),
                Duration::from_secs_f64(after),
            )
        })
    }

    /// One line naming the knobs, for the report.
    pub fn knobs(&self) -> String {
        let mut parts = Vec::new();
        if let Some(n) = self.max_num_seqs {
            parts.push(format!("max_num_seqs {n}"));
        }
        if let Some(t) = self.decode_threshold {
            parts.push(format!("decode threshold {t}"));
        }
        if let Some(w) = self.waiting_threshold {
            parts.push(format!("busy above {w} waiting"));
        }
        if let Some(t) = self.prefill_tokens {
            parts.push(format!("prefill threshold {t} tokens"));
        }
        if let Some(f) = self.prefill_frac {
            parts.push(format!("prefill threshold {f} of the step budget"));
        }
        if let Some((p, s)) = self.staleness {
            parts.push(format!("stale after {s} s counts {p}"));
        }
        if self.slo {
            parts.push("the SLO alone".into());
        }
        if self.book {
            parts.push("router bookings".into());
        }
        if self.kind.uses_monitor() {
            parts.push(format!("{} routing", self.policy));
        }
        if let Some(g) = self.gate {
            let mut s = format!("gate N {} Q {}", g.limit, g.queue);
            if let Some(w) = g.wait_limit {
                s += &format!(" W {w}");
            }
            if let Some(d) = g.deadline_s {
                s += &format!(" deadline {d} s");
            }
            if let Some(r) = g.classes {
                s += &format!(" 2 classes ({r} reserved)");
            }
            parts.push(s);
        }
        if self.flow.is_some() {
            parts.push("a worker's refusal back into the queue".into());
        } else if self.reroute > 0 {
            parts.push(format!(
                "a worker's refusal routed again {} time{}",
                self.reroute,
                if self.reroute == 1 { "" } else { "s" }
            ));
        }
        if let Some(f) = self.flow {
            parts.push(format!(
                "frontend queue of {} with a {} s deadline{}",
                f.limit,
                f.deadline_s,
                if f.fair { ", tenants by VTC" } else { "" }
            ));
        }
        if let Some(r) = self.retry_after_s {
            parts.push(format!("Retry-After {r} s"));
        }
        if let Some(r) = self.bucket_rate {
            parts.push(format!("admits {r:.1} req/s"));
        }
        if parts.is_empty() {
            parts.push("none".into());
        }
        parts.join(", ")
    }
}
