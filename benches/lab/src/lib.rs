//! The overload lab: what loadgate is worth to a fleet under overload.
//!
//! One seeded, open-loop workload drives a fleet of emulated
//! continuous-batching engines on a virtual clock, once per admission
//! design ("arm"), in the same process: no control, the engine's own
//! limit, Dynamo's design (tuned, and as 1.6.1 ships it), an llm-d-style
//! saturation detector, loadgate with every feature and with its frontend
//! queue, and a token bucket at capacity. loadgate's real
//! code decides (its `Monitor`, bookings, `AdmissionGate`, `Publisher` and
//! `Subscriber`); only the engines and the clients are emulated.
//!
//! Every frontend and worker decision of an arm built on loadgate is a call
//! into a shipped API, made with the arm's settings: the frontend asks
//! `Monitor::dispatch` (which picks the worker and its rank, books it, and
//! sends, queues or refuses the request), a worker's gate admits or
//! refuses, and a refusal of a request the worker never started goes back
//! through `Monitor::redispatch` (lease, then another worker or the queue,
//! or a 529). The lab has no routing, booking, threshold or queue rule of
//! its own; its test `every_refusal_of_a_loadgate_arm_is_the_monitors_answer`
//! checks that each refusal such an arm's clients hear was counted by a
//! monitor. Only the arms that are not loadgate's (no control, the engine's
//! limit, the token bucket) route in the lab's code.
//!
//! * [`engine`]: the continuous-batching engine emulator;
//! * [`calibrate`]: the emulator against Dynamo's own mocker, on its
//!   replay workload;
//! * [`serve`]: the same emulator over real HTTP (the `engine` binary);
//! * [`workload`]: arrivals, lengths, tenants, priorities and clients;
//! * [`arm`]: the designs and their tuning grids;
//! * [`sim`]: one run, event by event;
//! * [`record`]: what a run measured, with vLLM `bench serve`'s definitions;
//! * [`matrix`]: `C*`, the tuning, and every scenario;
//! * [`scenario`]: the scenarios, evaluation and calibration;
//! * [`shift`]: the off-calibration cells (the workload or the hardware
//!   moved);
//! * [`replicas`]: many frontends in front of one fleet, sharing their
//!   bookings or not;
//! * [`report`]: docs/overload.md, its plots and `--json`.
//!
//! `cargo run --release -p loadgate-lab` runs the whole matrix.

pub mod arm;
pub mod calibrate;
pub mod engine;
pub mod matrix;
pub mod record;
pub mod replicas;
pub mod report;
pub mod scenario;
pub mod serve;
pub mod shift;
pub mod sim;
pub mod workload;
