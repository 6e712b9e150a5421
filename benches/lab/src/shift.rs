//! Off-calibration cells: the workload or the hardware moved away from the
//! one the arms were tuned on. Users never tune on the workload they will
//! face tomorrow, so every arm runs these with its knobs frozen as tuned on
//! the calibration scenario, and with its defaults.
//!
//! Each shift changes the lengths of the requests, the engines, or the
//! fleet; its cells run at 2, 4 and 10 × that cell's own `C*` (found by the
//! same bisection as the base `C*`, on the shifted workload and fleet), with
//! a drain long enough for an admitted long answer to finish.

use serde::Serialize;

use crate::sim::Conditions;
use crate::workload::{LengthClass, WorkloadSpec};

/// One way the workload or the hardware moves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub enum Shift {
    /// Reasoning-style answers: outputs five times the chat class's.
    LongOutputs,
    /// Retrieval: prompts of several thousand tokens.
    LongPrompts,
    /// A larger model: every step term three times larger, half the KV
    /// blocks.
    SlowerEngine,
    /// A quarter of the KV blocks.
    SmallerKv,
    /// Half the workers run at half the speed.
    MixedFleet,
    /// Chat for the first half of the run, long outputs for the second.
    SwitchToLongOutputs,
}

impl Shift {
    /// Every shift, in report order.
    pub const ALL: [Shift; 6] = [
        Shift::LongOutputs,
        Shift::LongPrompts,
        Shift::SlowerEngine,
        Shift::SmallerKv,
        Shift::MixedFleet,
        Shift::SwitchToLongOutputs,
    ];

    /// Its name in the report.
    pub fn name(self) -> &'static str {
        match self {
            Shift::LongOutputs => "long outputs",
            Shift::LongPrompts => "long prompts",
            Shift::SlowerEngine => "slower engine",
            Shift::SmallerKv => "smaller KV cache",
            Shift::MixedFleet => "mixed fleet",
            Shift::SwitchToLongOutputs => "chat, then long outputs",
        }
    }

    /// What it changes, for the report.
    pub fn describe(self) -> &'static str {
        match self {
            Shift::LongOutputs => {
                "reasoning-style answers: 90 % of requests have the chat class's prompts and outputs \
                 of median 1000 tokens (five times the chat class's; σ 0.7, at most 8192), 10 % long \
                 prompts as before"
            }
            Shift::LongPrompts => {
                "retrieval: 90 % of requests have prompts of median 3000 tokens (σ 0.5, at most \
                 16,000) and chat-sized answers, 10 % long prompts as before"
            }
            Shift::SlowerEngine => {
                "a larger model on the same GPUs: every term of the step time three times larger \
                 and half the KV blocks"
            }
            Shift::SmallerKv => "a quarter of the KV blocks (a longer context or a smaller GPU)",
            Shift::MixedFleet => "every other worker runs at half the speed (two GPU kinds)",
            Shift::SwitchToLongOutputs => {
                "the base workload for the first half of the arrivals, then the long-outputs \
                 workload"
            }
        }
    }

    /// The lengths of the long-outputs workload.
    fn long_outputs() -> Vec<LengthClass> {
        vec![
            LengthClass {
                weight: 0.9,
                ..LengthClass::long_output()
            },
            LengthClass::long_prompt(),
        ]
    }

    /// Changes `w` (arrivals stop at `w.duration_s`).
    pub fn apply_workload(self, w: &mut WorkloadSpec) {
        match self {
            Shift::LongOutputs => w.lengths = Self::long_outputs(),
            Shift::LongPrompts => {
                w.lengths = vec![
                    LengthClass {
                        weight: 0.9,
                        ..LengthClass::retrieval()
                    },
                    LengthClass::long_prompt(),
                ]
            }
            Shift::SwitchToLongOutputs => {
                w.lengths_after = Some((w.duration_s / 2.0, Self::long_outputs()));
            }
            Shift::SlowerEngine | Shift::SmallerKv | Shift::MixedFleet => {}
        }
    }

    /// Changes the fleet.
    pub fn apply_conditions(self, c: &mut Conditions) {
        let e = &mut c.engine;
        match self {
            Shift::SlowerEngine => {
                for v in e.step.prefill_ms.iter_mut().chain(&mut e.step.decode_ms) {
                    *v *= 3.0;
                }
                e.step.decode_floor_ms *= 3.0;
                e.num_gpu_blocks /= 2;
            }
            Shift::SmallerKv => e.num_gpu_blocks /= 4,
            Shift::MixedFleet => c.odd_worker_speedup = Some(0.5),
            Shift::LongOutputs | Shift::LongPrompts | Shift::SwitchToLongOutputs => {}
        }
        // Long enough for an admitted long answer to finish.
        c.drain_s = c.drain_s.max(match self {
            Shift::LongOutputs | Shift::SwitchToLongOutputs => 240.0,
            _ => 60.0,
        });
    }
}
