//! Benchmarks of loadgate's hot paths against the designs a user would
//! otherwise run, measured in the same process.
//!
//! * [`baseline`]: the reference designs, implemented here from their
//!   descriptions so they can be measured on the same machine in the same
//!   run: the reference routing snapshot, the reference monitor, the two
//!   reference admission gates, and the newer one with priority classes.
//! * [`floor`]: the least work any busy-aware router can do (a bit test; an
//!   AND-NOT and trailing-zeros pick) and the least an exact gate can do (a
//!   compare-exchange and a fetch-sub), to show how close loadgate gets.
//! * [`fixture`]: the same workers and busy set in loadgate, the reference and
//!   the floor.
//! * [`harness`]: the interleaved measuring loop of the `compare` binary,
//!   with hdrhistogram latencies and allocation counts (the per-thread
//!   counting allocator of `loadgate-testkit`).
//!
//! `cargo bench -p loadgate-benches` runs the criterion benches;
//! `cargo run --release -p loadgate-benches --bin compare` prints the
//! comparison table (add `--quick` for the short CI mode).

pub mod baseline;
pub mod fixture;
pub mod floor;
pub mod harness;
pub mod rng;
