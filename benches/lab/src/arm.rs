//! The arms: the admission designs compared, each built from loadgate's
//! own parts (or from none), with the knobs the tuning grid searches.

use std::time::Duration;

use loadgate::flow::FlowConfig;
use loadgate::monitor::FlowControlConfig;
use loadgate::{ClassConfig, GateConfig, Policy, Staleness, ThresholdUpdate};
use serde::Serialize;

/// Which design an arm is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub enum ArmKind {
    /// (a) No admission control: the frontend routes round-robin, the engine
    /// queues everything.
    NoControl,
    /// (b) The engine's own `max_num_seqs` as the only limit (tuned).
    EngineLimit,
    /// (c) The seed design as Dynamo ships it: busy thresholds at the
    /// frontend over the router's bookings, an `N + Q` FIFO gate at the
    /// worker, no wait limit, no deadline, no `Retry-After`.
    Seed,
    /// (d) An llm-d-style saturation detector: a worker is saturated when its
    /// waiting queue reaches 5 or its KV cache 0.8, or its metrics are stale;
    /// all saturated means reject.
    Saturation,
    /// (e) loadgate with every feature it has: thresholds, gate, wait limit,
    /// deadlines, priority classes, `Retry-After`, stale-signal policy.
    Loadgate,
    /// (f) An oracle that admits exactly `min(offered, capacity)`: a token
    /// bucket at the measured capacity `C*`, joined to the shortest queue.
    Oracle,
    /// (g) Arm (e) with a frontend queue: a request that finds every worker
    /// busy waits (priority bands, then first in, first out) and is sent
    /// the moment one has room.
    Queue,
    /// (h) Arm (g) with each tenant's requests ordered and shed by virtual
    /// token counters.
    FairQueue,
}

impl ArmKind {
    /// Every arm, in report order.
    pub const ALL: [ArmKind; 8] = [
        ArmKind::NoControl,
        ArmKind::EngineLimit,
        ArmKind::Seed,
        ArmKind::Saturation,
        ArmKind::Loadgate,
        ArmKind::Oracle,
        ArmKind::Queue,
        ArmKind::FairQueue,
    ];

    /// Short label, `(a)` to `(f)` with a name.
    pub fn label(self) -> &'static str {
        match self {
            ArmKind::NoControl => "(a) no control",
            ArmKind::EngineLimit => "(b) engine max_num_seqs",
            ArmKind::Seed => "(c) seed (Dynamo as shipped)",
            ArmKind::Saturation => "(d) llm-d saturation detector",
            ArmKind::Loadgate => "(e) loadgate, every feature",
            ArmKind::Oracle => "(f) oracle",
            ArmKind::Queue => "(g) loadgate with the queue",
            ArmKind::FairQueue => "(h) queue and fairness",
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
                "as (a), with the engine's own `max_num_seqs` as the only knob, tuned; the engines \
                 still queue everything else."
            }
            ArmKind::Seed => {
                "Dynamo's request rejection as it ships, built from loadgate's parts: a decode \
                 threshold at the frontend over worker-reported KV use and the router's own bookings, \
                 round-robin routing, a worker refusal marks the worker for a lease, and an N + Q \
                 FIFO gate at each worker with no wait limit, no deadline and no `Retry-After`."
            }
            ArmKind::Saturation => {
                "the saturation detector of llm-d and the Gateway API inference extension, built \
                 from loadgate's monitor: a worker is saturated when its waiting queue reaches the \
                 queue threshold (5 by default) or its KV use the KV threshold (0.8), or when its \
                 metrics are older than 200 ms; all saturated means reject. No worker gate: the \
                 engines queue what is admitted."
            }
            ArmKind::Loadgate => {
                "loadgate with every feature it has: decode and waiting-requests thresholds, router \
                 bookings, ranks stale for 3 s counted busy, the worker gate with a wait limit, a queue \
                 deadline and two priority classes (reserved slots for class 0), a worker's refusal \
                 put under an overload lease and (if the tuning keeps it) routed once more to another \
                 worker, and `Retry-After` on every rejection."
            }
            ArmKind::Oracle => {
                "admits with a token bucket at `C*` (a tenth of a second deep) and sends each request \
                 to the worker with the fewest requests in it, knowing every engine exactly; it does \
                 not know which requests will still meet their SLO, so it admits retries whose first \
                 send is already too old."
            }
            ArmKind::Queue => {
                "arm (e) as tuned, with loadgate's frontend queue (`Monitor::dispatch`): a request \
                 that finds every worker busy waits, priority band first and then in arrival order, \
                 until a report, a finished request's released booking or a sweep shows a worker with \
                 room, or until its queue deadline (refused with `Retry-After` from the queue's drain \
                 rate); a full queue turns away its newest, least important request. Only the queue's \
                 limit and deadline are tuned."
            }
            ArmKind::FairQueue => {
                "arm (g) with its tuned knobs, each request carrying its tenant: within a band, the \
                 tenant with the lowest virtual token counter (VTC: prompt tokens at dispatch, twice \
                 the output tokens as they stream) goes first, and a full queue turns away the \
                 heaviest tenant's newest request."
            }
        }
    }

    /// Whether the arm's frontend runs a loadgate `Monitor` fed by load
    /// reports.
    pub fn uses_monitor(self) -> bool {
        matches!(
            self,
            ArmKind::Seed
                | ArmKind::Saturation
                | ArmKind::Loadgate
                | ArmKind::Queue
                | ArmKind::FairQueue
        )
    }
}

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
    /// The monitor's flow-control configuration.
    pub fn config(&self) -> FlowControlConfig {
        let mut queue = FlowConfig::new(self.limit);
        queue.deadline = Duration::from_secs_f64(self.deadline_s);
        FlowControlConfig {
            queue,
            policy: Policy::RoundRobin,
        }
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
    /// Frontend fractional prefill threshold.
    pub prefill_frac: Option<f64>,
    /// Staleness policy (`"busy"` or `"free"`) and its silence, seconds.
    pub staleness: Option<(&'static str, f64)>,
    /// The router books each request's blocks on its worker.
    pub book: bool,
    /// Routing policy name (`round_robin`, `power_of_two`).
    pub policy: &'static str,
    /// The worker gate, if any.
    pub gate: Option<GateKnobs>,
    /// `Retry-After` sent with each rejection, seconds.
    pub retry_after_s: Option<f64>,
    /// Admission rate of the oracle (fleet, requests per second).
    pub oracle_rate: Option<f64>,
    /// How many times the frontend routes a request again after a worker's
    /// gate refused it at once ("worker at capacity"; the worker is under
    /// an overload lease meanwhile), before answering 529.
    pub reroute: u32,
    /// The frontend queue, if any.
    pub flow: Option<FlowKnobs>,
}

impl Arm {
    /// An arm of `kind` with its untuned defaults.
    pub fn base(kind: ArmKind) -> Self {
        let arm = Self {
            kind,
            max_num_seqs: None,
            decode_threshold: None,
            waiting_threshold: None,
            prefill_frac: None,
            staleness: None,
            book: false,
            policy: "round_robin",
            gate: None,
            retry_after_s: None,
            oracle_rate: None,
            reroute: 0,
            flow: None,
        };
        match kind {
            ArmKind::NoControl | ArmKind::EngineLimit | ArmKind::Oracle => arm,
            // A prefill threshold keeps a queue from sending more prompts
            // than a worker's step takes.
            ArmKind::Queue | ArmKind::FairQueue => Self::queued(
                &{
                    let e = Self::base(ArmKind::Loadgate);
                    Self {
                        prefill_frac: Some(1.0),
                        gate: e.gate.map(|g| GateKnobs { queue: 0, ..g }),
                        ..e
                    }
                },
                FlowKnobs {
                    limit: 256,
                    deadline_s: 1.5,
                    fair: kind == ArmKind::FairQueue,
                },
            ),
            ArmKind::Seed => Self {
                decode_threshold: Some(0.9),
                book: true,
                gate: Some(GateKnobs {
                    limit: 256,
                    queue: 16,
                    wait_limit: None,
                    deadline_s: None,
                    classes: None,
                }),
                ..arm
            },
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
                ..arm
            },
        }
    }

    /// Arm `from` (arm (e)) with a frontend queue of `flow`: arm (g), or
    /// (h) when `flow.fair`.
    pub fn queued(from: &Arm, flow: FlowKnobs) -> Arm {
        Arm {
            kind: if flow.fair {
                ArmKind::FairQueue
            } else {
                ArmKind::Queue
            },
            flow: Some(flow),
            ..from.clone()
        }
    }

    /// The tuning grid of arm (g) over the tuned arm (e), `from`: the
    /// queue's limit and deadline, and the frontend thresholds that decide
    /// when a worker has room for a queued request.
    pub fn queue_grid(from: &Arm, quick: bool) -> Vec<Arm> {
        let mut out = Vec::new();
        let gate = from.gate.expect("arm (e) has a worker gate");
        for decode in [from.decode_threshold, Some(0.5)] {
            for waiting in [from.waiting_threshold, None] {
                for prefill in [from.prefill_frac, Some(1.0), Some(0.5)] {
                    for (queue, wait_limit, gate_deadline) in [
                        (gate.queue, gate.wait_limit, gate.deadline_s),
                        (0, gate.wait_limit, gate.deadline_s),
                        (32, None, gate.deadline_s),
                        (64, Some(64), Some(2.0)),
                        (256, None, None),
                    ] {
                        for limit in [256, 1024] {
                            for deadline_s in [1.0, 0.5, 1.5] {
                                let flow = FlowKnobs {
                                    limit,
                                    deadline_s,
                                    fair: false,
                                };
                                out.push(Arm {
                                    decode_threshold: decode,
                                    waiting_threshold: waiting,
                                    prefill_frac: prefill,
                                    gate: Some(GateKnobs {
                                        queue,
                                        wait_limit,
                                        deadline_s: gate_deadline,
                                        ..gate
                                    }),
                                    ..Self::queued(from, flow)
                                });
                            }
                        }
                    }
                }
            }
        }
        if quick {
            out = out.into_iter().step_by(3).collect();
        }
        out
    }

    /// The tuning grid of this arm's kind: every candidate the calibration
    /// scenario tries, the design's shipped defaults first (so that a tie
    /// keeps them). The oracle's rate is `C*`, set by the caller.
    pub fn grid(kind: ArmKind, quick: bool) -> Vec<Arm> {
        let base = Arm::base(kind);
        let mut out = Vec::new();
        match kind {
            ArmKind::NoControl | ArmKind::Oracle => out.push(base),
            // Tuned over arm (e)'s winner instead (`queue_grid`).
            ArmKind::Queue | ArmKind::FairQueue => out.push(base),
            ArmKind::EngineLimit => {
                for n in [256, 128, 64, 32, 16, 8] {
                    out.push(Arm {
                        max_num_seqs: Some(n),
                        ..base.clone()
                    });
                }
            }
            ArmKind::Seed => {
                for t in [0.9, 0.7, 0.5] {
                    for n in [256, 192, 128, 64] {
                        for q in [16, 0, 64] {
                            let gate = GateKnobs {
                                limit: n,
                                queue: q,
                                ..base.gate.expect("the seed arm has a gate")
                            };
                            out.push(Arm {
                                decode_threshold: Some(t),
                                gate: Some(gate),
                                ..base.clone()
                            });
                        }
                    }
                }
            }
            ArmKind::Saturation => {
                for kv in [0.8, 0.6, 0.9] {
                    for w in [4, 1, 9] {
                        out.push(Arm {
                            decode_threshold: Some(kv),
                            waiting_threshold: Some(w),
                            ..base.clone()
                        });
                    }
                }
            }
            ArmKind::Loadgate => {
                for n in [128, 192, 256] {
                    for w in [Some(8), Some(16), Some(32), None] {
                        for q in [0, 8, 32] {
                            for deadline in [0.5, 1.0] {
                                for waiting in [4, 16] {
                                    for (policy, reroute) in [
                                        ("round_robin", 0),
                                        ("round_robin", 1),
                                        ("power_of_two", 0),
                                        ("power_of_two", 1),
                                    ] {
                                        let gate = GateKnobs {
                                            limit: n,
                                            queue: q,
                                            wait_limit: w,
                                            deadline_s: Some(deadline),
                                            classes: Some(n / 16),
                                        };
                                        out.push(Arm {
                                            waiting_threshold: Some(waiting),
                                            gate: Some(gate),
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
        }
        if quick {
            // CI's quick mode: every third candidate, always the first.
            out = out.into_iter().step_by(3).collect();
        }
        out
    }

    /// The frontend thresholds of this arm.
    pub fn thresholds(&self) -> ThresholdUpdate {
        ThresholdUpdate {
            active_decode_blocks_threshold: self.decode_threshold,
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
        if let Some(f) = self.prefill_frac {
            parts.push(format!("prefill threshold {f}"));
        }
        if let Some((p, s)) = self.staleness {
            parts.push(format!("stale after {s} s counts {p}"));
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
        if let Some(r) = self.oracle_rate {
            parts.push(format!("admits {r:.1} req/s"));
        }
        if parts.is_empty() {
            parts.push("none".into());
        }
        parts.join(", ")
    }
}
