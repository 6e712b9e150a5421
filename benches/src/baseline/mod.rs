//! The reference designs loadgate is compared with, built from the same
//! parts the reference system uses. They are faithful models, not tuned
//! either way: where a detail was cheaper to leave out than to keep (random
//! numbers, tracing), the cheaper choice is taken, so a baseline is never
//! slower than the design it models.

pub mod admission;
pub mod monitor;
pub mod routing;
