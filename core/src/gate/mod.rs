//! Worker admission gate: exactly `N` running and `Q` queued, FIFO,
//! cancel-safe, lock-free.
//!
//! # Implementation details
//!
//! The gate is a counting semaphore over one packed atomic *state word*
//! (`running`, `queued`, `limit`, `closed`; `state.rs`) and a lock-free
//! cancellable queue of waiter cells per priority class (`fifo.rs`: the CQS
//! queue of Koval, Khalanskiy and Alistarh over pooled segments).
//!
//! * **Direct admission** is one CAS of the word, `running + 1`, allowed
//!   only while nobody is queued (no barging) and a slot is free.
//! * **Rejection** needs no write: a full queue (`queued >= Q`) is seen in
//!   the word.
//! * **Queueing**: a waiter counts itself (CAS `queued + 1`), then takes a
//!   position in its class's queue and installs its cell there.
//! * **Release** is one `fetch_sub` of `running`. If waiters are counted,
//!   the releaser *promises* the slot (CAS `running + 1, queued - 1`) and
//!   delivers it at the queue's next position: the waiter there is granted
//!   through its cell's status word, or, if it has not arrived yet, finds
//!   the slot left for it.
//! * **Cancel** claims the cell, then gives its place back through the
//!   count; if every counted waiter was already promised a slot, one is on
//!   its way to this cell and the cancel refuses it, so the resumer hands
//!   it on. No slot is lost or given twice.
//! * Expiry, close and displacement are cancels made by another thread;
//!   adaptive LIFO's grant to the newest waiter is the same leave, ending
//!   in a grant (`queue.rs`).
//! * With several classes or a wait limit, each class has its own count
//!   beside the word's total (`classes.rs`), and the wait count sits beside
//!   the word (`wait.rs`).
//!
//! Every path takes no lock but `set_limit`, which takes a mutex to
//! serialize limit changes (and may grow the queues' storage). A queue's
//! storage, reserved when the gate is built for `Q` waiters and `N` granted
//! ones, grows under its own lock only when rejected waiters that have not
//! looked yet hold every cell (`fifo.rs`). Two waits are not lock-free in
//! the strict sense, each for another thread a few instructions from done:
//! `close` for an arrival between its count and its push, and an arrival
//! of a gate with classes that finds the queue full for a place between its
//! two counts (`classes.rs`).
//!
//! # Queue deadline
//!
//! With a deadline set, a waiter queued at `t` is rejected with
//! [`AdmitError::QueueTimeout`] once the clock reads `t + timeout` or later.
//! Expiry is checked from the head (the oldest) when a slot is handed on,
//! when an arrival finds the queue full, on `set_limit`; by a blocking
//! waiter when its own wait reaches the deadline; and by
//! [`AdmissionGate::expire`], which an event loop can call at
//! [`AdmissionGate::next_deadline`]. With adaptive LIFO, the next handoff
//! after an expiry takes the newest waiter, once.
//!
//! Clock reads: a queued request reads the gate's clock once at its push
//! (`enqueued_at`, the base of both its deadline and its queue-wait time)
//! and its grant once more (the wait histogram); a direct admission or a
//! rejection reads none. Deadlines are exact, not coarse: an expiry check
//! reads the clock afresh and compares it with `enqueued_at + timeout`. The
//! clock is the CPU's time-stamp counter (`crate::clock`, about 9 ns a
//! read). A coarse clock advanced by a timer thread would save the grant's
//! read, but not be worth its price here: the histogram's first bucket is
//! 0.5 ms, finer than a millisecond's tick, and every process that embeds a
//! gate, each forked child too, would have to run that thread.
//!
//! # Layout
//!
//! Three layers, each using only the ones below it:
//!
//! * the public types, one concern per file: `admission.rs`
//!   ([`AdmissionGate`]), `permit.rs` ([`Permit`], [`OwnedPermit`]),
//!   `future.rs` ([`Admit`], [`AdmitOwned`]), `callback.rs`
//!   ([`AdmitCallback`], [`CallbackTicket`], the callback trampoline, and
//!   what a queued callback leaves in its cell), `pending.rs` (admission in
//!   two steps: [`Pending`], [`PendingAdmission`]) and `metrics.rs`
//!   (rendering);
//! * the raw gate, which never names them: `raw.rs` (the word, the queues,
//!   the settings; direct admission, release, `set_limit`, `close`,
//!   expiry), `queue.rs` (enqueue, handoff, adaptive LIFO, poll, cancel,
//!   rejection from the head), `classes.rs` (the classes' counts,
//!   displacement), `wait.rs` (the wait limit's count) and `blocking.rs`
//!   (the blocking wait). It is generic over what a detached waiter leaves
//!   in its cell (`tell.rs`'s `Detached`), which `callback.rs` supplies;
//! * the queue and the leaves: `fifo.rs` (the lock-free cancellable queue;
//!   `fifo/owner.rs` the owner's side of a cell and the hand-over of its
//!   waker, `fifo/scan.rs` the scans and rejections from either end,
//!   `fifo/storage.rs` its segments and cells, `fifo/words.rs` its packed
//!   words; its own loom models, a differential test against a plain queue
//!   and a threaded test run it under a small counting gate), `chunks.rs`
//!   (storage that grows without moving), `tell.rs` (each cell's waker or
//!   callback), `state.rs` (the state word), `waits.rs` (the queue-wait
//!   histogram), `error.rs`, `stats.rs`, `config.rs`.

mod admission;
mod blocking;
mod callback;
mod chunks;
mod classes;
mod config;
mod error;
#[allow(unsafe_code)] // each queued cell's waker, handed on by its status word
mod fifo;
mod future;
mod metrics;
mod pending;
#[allow(unsafe_code)] // the raw-pointer round trip of an owned permit
mod permit;
mod queue;
mod raw;
mod state;
mod stats;
#[allow(unsafe_code)] // the callback a detached waiter's cell holds
mod tell;
mod wait;
mod waits;

pub use admission::AdmissionGate;
pub use callback::{AdmitCallback, CallbackTicket};
pub use config::{
    ClassConfig, ConfigError, GateConfig, DEFAULT_QUEUE_LIMIT, ENGINE_REQUEST_LIMIT_ALIAS,
    ENGINE_REQUEST_LIMIT_ENV, MAX_CLASSES, MAX_LIMIT, MAX_QUEUE, QUEUE_LIMIT_ALIAS,
    QUEUE_LIMIT_ENV, QUEUE_TIMEOUT_ENV, WAIT_LIMIT_ENV,
};
pub use error::{AdmitError, TryAdmitError};
pub use future::{Admit, AdmitOwned};
pub use pending::{Pending, PendingAdmission};
pub use permit::{OwnedPermit, Permit};
pub use stats::{ClassStats, GateStats};
