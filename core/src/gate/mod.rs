//! Worker admission gate: exactly `N` running and `Q` queued, FIFO,
//! cancel-safe.
//!
//! # Two queues
//!
//! The gate is a counting semaphore over a packed atomic state word
//! (`running`, `queued`, `limit`, `closed`; see `state.rs`) and a queue of
//! waiters. Which queue depends on the configuration:
//!
//! * **No adaptive LIFO** (the default gate, the reference's, and gates
//!   with priority classes or a wait limit): the lock-free cancellable
//!   queue of `fifo.rs` (CQS over pooled segments), one per class, driven
//!   by `lockfree.rs`; with several classes or a wait limit each class also
//!   keeps its own count behind the word's total (`classes.rs`), and the
//!   wait count sits beside the word (`wait.rs`). Every
//!   path takes no lock: direct admission, rejection, enqueue,
//!   displacement, handoff, a future's poll and cancel, a callback
//!   ticket's cancel, a blocking wait and its timeout, queue-deadline
//!   expiry, `close`, statistics, a first response. `set_limit` takes the
//!   gate's mutex to serialize limit changes (and may grow the queues'
//!   storage); each
//!   queue's storage, reserved when the gate is built for its class's
//!   waiters and `N` granted ones, grows under its own lock only when
//!   rejected waiters that have not looked yet hold every cell
//!   (`fifo.rs`). `lockfree.rs` and `classes.rs` give the protocol between
//!   the word, the counts and the queues. Two waits are not lock-free in
//!   the strict sense, each for another thread a few instructions from
//!   done: `close` for an arrival between its count and its push, and an
//!   arrival of a gate with classes that finds the queue full for a place
//!   between its two counts (`classes.rs`).
//! * **Adaptive LIFO**: a waiter table behind a
//!   `Mutex<Table>` (one intrusive FIFO list of cells per class; see
//!   `table.rs`), described in the rest of these docs. Direct admission,
//!   release while nobody waits, rejection, a future's poll and cancel
//!   stay lock-free there; the queue's other paths take the mutex.
//!
//! # The locked table: what is lock-free and what takes the mutex
//!
//! On the state word alone, without the mutex:
//!
//! * **Direct admit**: if the gate is open, nobody is queued and
//!   `running < limit`, CAS `running + 1`. Checking `queued == 0` in the same
//!   word is what forbids barging: a newcomer never takes a slot a waiter is
//!   owed.
//! * **Reject when full**: if it cannot admit directly and `queued >= Q`, the
//!   request is rejected without touching the mutex (unless a queue deadline
//!   is due, in which case the slow path expires the head first). A closed
//!   gate rejects the same way.
//! * **Release**: `fetch_sub` of `running`, one read-modify-write that
//!   cannot fail. If the old value showed `queued > 0`, the releaser then
//!   takes the mutex to hand the freed slot to the oldest waiter (below);
//!   no arrival can take it meanwhile, since a direct admission needs
//!   `queued == 0`.
//! * Reading gauges ([`AdmissionGate::running`], [`AdmissionGate::stats`])
//!   and the head-deadline hint ([`AdmissionGate::next_deadline`]).
//!
//! Under the mutex (short critical sections, no allocation, no user code):
//!
//! * **Enqueue**: re-read the word; admit directly, reject, or CAS
//!   `queued + 1` and link a cell at the tail of the list. Cells come from a
//!   free stack over storage reserved for `Q + N` cells when the gate is
//!   built (`cell.rs`), so queueing allocates nothing.
//! * **Handoff**: a release whose `fetch_sub` found `queued > 0` grants the
//!   freed slot to the oldest waiter of the most important class with room:
//!   `running + 1, queued - 1`, cell marked granted (after expiring due
//!   waiters). If a lowered limit left `running >= limit`, nobody is
//!   granted.
//! * A callback ticket's `cancel` (the callback holds a handle to the gate,
//!   a cycle the cancel itself must end, so it unlinks and drops it at
//!   once), every wake-up and timeout of a blocked thread, swapping a queued
//!   future's waker, expiry, displacement, [`AdmissionGate::set_limit`],
//!   [`AdmissionGate::close`], [`AdmissionGate::next_deadline`] after a
//!   cancel, and the queue-wait histogram of
//!   [`AdmissionGate::metrics_text`].
//!
//! Without the mutex, on each cell's atomic status word (`cell.rs`):
//!
//! * a queued future's poll (it reads whether it was granted or rejected
//!   and keeps waiting if not; the waker it registered stays in the cell),
//!   a callback ticket's `is_queued`, and an owner freeing its resolved
//!   cell;
//! * **cancel** of a dropped future: CAS the cell from queued to cancelled, push it on the cancelled stack, then
//!   `queued - 1` in the word (the linearization point: the place is free).
//!   The cell stays linked until a mutex holder meets it (every pick skips
//!   and unlinks cancelled cells at the list's ends) or takes it off the
//!   stack (enqueue and `stats` do first, so queue lengths count only live
//!   waiters), unlinks it and frees it, dropping its waker or callback
//!   after unlocking.
//!
//! A resolver first *claims* a queued cell (CAS queued → claimed, which a
//! racing cancel loses), then fixes the state word, then stores the outcome:
//! so an owner that sees its grant may release at once, and one that sees
//! its rejection finds its place already given back. A cancel that finds
//! its cell claimed takes the mutex once, after which the outcome is there
//! (granted: the cancel releases the slot, which is handed on; rejected:
//! nothing to do). So no slot is lost or duplicated.
//!
//! So a gate on the table is lock-free only while nobody waits: under
//! overload, when requests queue, admissions and handoffs go through the
//! mutex.
//!
//! # With a wait limit `W`
//!
//! A gate built with [`GateConfig::wait_limit`] also counts admitted
//! requests that have not produced their first response, in an atomic
//! beside the state word (which has no room for it; see `wait.rs`). A gate
//! without a wait limit pays one never-taken branch in the direct-admit
//! CAS loop and a flag in each permit. On the lock-free queues a gate with
//! a wait limit takes no lock: admission (direct ones too, out of the
//! inlined fast path), `first_response`, release, handoff and statistics
//! run on the word, the class counts and the wait count (`wait.rs` gives
//! the protocol). On the table (adaptive LIFO):
//!
//! * Lock-free, on the state word alone: rejection when no request slot is
//!   free (or someone is queued) and the queue is full, rejection by a
//!   closed gate, release of a permit that already called
//!   [`Permit::first_response`] while nobody is queued, and the single
//!   gauges ([`AdmissionGate::running`], [`AdmissionGate::waiting`]).
//! * Under the mutex: [`AdmissionGate::stats`] (so that `waiting` and
//!   `running` are one consistent pair), every admission, direct ones included (`try_admit`
//!   and the `admit*` calls admit only under the mutex, where the wait
//!   count is checked), every `first_response` (it gives the wait slot back
//!   and, when a request slot is free, hands both to the oldest waiter),
//!   and the release of a permit that still holds its wait slot; plus
//!   everything listed above as taking the mutex.
//!
//! A waiter is granted only when a request slot and a wait slot are both
//! free, always the oldest (FIFO, no barging). Invariant 4 of the state
//! word becomes: `queued > 0` implies `running >= limit`, or every wait slot
//! taken, or `closed`. So a release hands its slot on only if a wait slot is
//! free (its own, if it never responded), and a first response hands its
//! wait slot on only if a request slot is free.
//!
//! Waiters are told (waker woken, condition variable notified, callback
//! called) only after the mutex is released; a fixed-size list on the stack
//! carries them out of the critical section (`wake.rs`).
//!
//! Cells: the gate reserves `Q + N` cells (more, in a new chunk, when they
//! are all taken). A cell is owned by its waiter from enqueue until the waiter takes
//! its outcome (a callback's cell is freed as soon as it is resolved). At
//! most `Q` cells are queued and at most `N` granted-but-not-taken, so the
//! table grows only if futures or threads that were *rejected* have not yet
//! looked while the queue refilled behind them; never in steady state.
//!
//! # Queue deadline
//!
//! With a deadline set, a waiter queued at `t` is rejected with
//! [`AdmitError::QueueTimeout`] once the clock reads `t + timeout` or later.
//! Expiry is checked from the head (the oldest) whenever the queue moves: on
//! release with waiters, on admit into a full queue, on `set_limit`; by a
//! blocking waiter when its own wait reaches the deadline; and by
//! [`AdmissionGate::expire`], which an event loop can call at
//! [`AdmissionGate::next_deadline`].
//!
//! # Layout
//!
//! * `admission.rs`: [`AdmissionGate`], the public type, a thin layer over
//! * `raw.rs`: the raw gate, the algorithm above and its memory orderings;
//!   `state.rs` (the state word), `table.rs` (the waiter table),
//!   `cell.rs` (each cell's status word and the free cells) and
//!   `blocking.rs` (the blocking wait) belong to it;
//! * `wait.rs`: the wait limit's locked paths (first response, release of
//!   a permit still waiting, `try_admit`);
//! * `permit.rs`: [`Permit`] and [`OwnedPermit`];
//! * `future.rs`: the futures [`Admit`] and [`AdmitOwned`];
//! * `callback.rs`: [`AdmitCallback`], [`CallbackTicket`] and the callback
//!   trampoline;
//! * `wake.rs`: the wake list;
//! * `fifo.rs`: the lock-free cancellable waiter queue (CQS over pooled
//!   segments; its own loom models, a differential test against a plain
//!   queue and a threaded test run it under a small counting gate), over
//!   `chunks.rs` (storage that grows without moving);
//! * `lockfree.rs`: the raw gate's paths on that queue; `tell.rs` (each
//!   cell's waker or callback) belongs to it;
//! * `waits.rs`: the queue-wait histogram (atomic buckets);
//! * `error.rs`, `stats.rs`, `config.rs`, `metrics.rs`: errors, statistics,
//!   configuration and metrics rendering.

mod admission;
mod blocking;
mod callback;
mod cell;
mod chunks;
mod classes;
mod config;
mod error;
mod fifo;
mod future;
mod lockfree;
mod metrics;
#[allow(unsafe_code)] // the raw-pointer round trip of an owned permit
mod permit;
mod raw;
mod state;
mod stats;
mod table;
#[allow(unsafe_code)] // the callback a detached waiter's cell holds
mod tell;
mod wait;
mod waits;
#[allow(unsafe_code)] // the uninitialized wake buffer
mod wake;

pub use admission::AdmissionGate;
pub use callback::{AdmitCallback, CallbackTicket};
pub use config::{
    ClassConfig, ConfigError, GateConfig, DEFAULT_QUEUE_LIMIT, ENGINE_REQUEST_LIMIT_ALIAS,
    ENGINE_REQUEST_LIMIT_ENV, MAX_CLASSES, MAX_LIMIT, MAX_QUEUE, QUEUE_LIMIT_ALIAS,
    QUEUE_LIMIT_ENV, QUEUE_TIMEOUT_ENV, WAIT_LIMIT_ENV,
};
pub use error::{AdmitError, TryAdmitError};
pub use future::{Admit, AdmitOwned};
pub use permit::{OwnedPermit, Permit};
pub use stats::{ClassStats, GateStats};
