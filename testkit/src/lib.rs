//! Test-only helpers, kept once and shared by the differential tests in
//! `core/tests/`, the fuzz targets in `fuzz/` and the `compare` bench:
//!
//! * [`reference_monitor`]: the monitor written out again with plain maps,
//!   one method per operation, each returning what the real monitor must
//!   answer;
//! * [`reference_gate`]: the admission gate as a `VecDeque` and counters;
//! * [`reference_flow`]: the frontend queue as a list and a map of tenants;
//! * [`flow_pair`]: the real queue and the reference driven side by side;
//! * [`gate_pair`]: the real gate and the reference gate driven side by
//!   side, one method per operation, for the gate's differential drivers;
//! * [`alloc`]: a counting global allocator, to prove that a hot path
//!   allocates nothing.
//!
//! Not published: a driver depends on it by path.
#![deny(unsafe_code)]

#[allow(unsafe_code)] // the `GlobalAlloc` implementation, and nothing else
pub mod alloc;
pub mod flow_pair;
pub mod gate_pair;
pub mod reference_flow;
pub mod reference_gate;
pub mod reference_monitor;
