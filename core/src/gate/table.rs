//! The waiter table: the locked half of each waiter cell (its links, class,
//! queue time and whom to tell) and one intrusive FIFO list per priority
//! class, linked by `u32` indices. Everything here is touched only under
//! the gate's mutex, so it is plain safe code. Each cell's status and the
//! free cells live in `cell.rs`, readable without the mutex.

use std::sync::Arc;
use std::task::Waker;

use super::callback::AdmitCallback;
use super::config::MAX_CLASSES;
use super::AdmissionGate;

pub(super) use super::cell::NIL;

/// How to tell a waiter that it was resolved.
pub(super) enum Waiter {
    /// Nobody to tell (free cell, or already told).
    None,
    /// A future: wake its task.
    Task(Option<Waker>),
    /// A blocked thread: notify its condition variable.
    Thread,
    /// A callback, with the gate handle its permit will hold.
    Callback(AdmitCallback, Arc<AdmissionGate>),
}

/// One waiter's place (the locked half).
pub(super) struct Cell {
    pub(super) prev: u32,
    pub(super) next: u32,
    /// In its class's list (a cancelled cell may be unlinked before the
    /// mutex holder that frees it takes it off the cancelled stack).
    pub(super) linked: bool,
    /// The waiter's priority class.
    pub(super) class: u8,
    /// Clock time when the waiter was queued.
    pub(super) enqueued_at: u64,
    pub(super) waiter: Waiter,
}

/// The state behind the gate's mutex.
pub(super) struct Table {
    /// Cells by index (see `cell.rs` for who hands indices out); capacity
    /// reserved at creation (`Q + N`), filled on first use.
    pub(super) cells: Vec<Cell>,
    /// Oldest queued waiter of each class.
    pub(super) head: [u32; MAX_CLASSES],
    /// Newest queued waiter of each class.
    pub(super) tail: [u32; MAX_CLASSES],
    /// Queued waiters of each class.
    pub(super) len: [u32; MAX_CLASSES],
    /// Adaptive LIFO: the next handoff takes the newest waiter.
    pub(super) lifo_next: bool,
}

impl Table {
    /// A table with room for `capacity` cells before it must grow.
    pub(super) fn new(capacity: usize) -> Self {
        Self {
            cells: Vec::with_capacity(capacity),
            head: [NIL; MAX_CLASSES],
            tail: [NIL; MAX_CLASSES],
            len: [0; MAX_CLASSES],
            lifo_next: false,
        }
    }

    /// Makes sure `capacity` cells fit without reallocating (cold path).
    pub(super) fn reserve_total(&mut self, capacity: usize) {
        let have = self.cells.capacity();
        if capacity > have {
            self.cells.reserve_exact(capacity - self.cells.len());
        }
    }

    /// Links cell `idx` (just taken from the free cells) at the tail of
    /// `class`'s queue. Allocates only for a cell index never used before
    /// beyond the reserved `Q + N`, which needs more than that many waiters
    /// that were resolved but have not looked yet.
    pub(super) fn push_back(&mut self, idx: u32, class: usize, enqueued_at: u64, waiter: Waiter) {
        if idx as usize == self.cells.len() {
            self.cells.push(Cell {
                prev: NIL,
                next: NIL,
                linked: false,
                class: 0,
                enqueued_at: 0,
                waiter: Waiter::None,
            });
        }
        let tail = self.tail[class];
        let cell = &mut self.cells[idx as usize];
        cell.prev = tail;
        cell.next = NIL;
        cell.linked = true;
        cell.class = class as u8;
        cell.enqueued_at = enqueued_at;
        cell.waiter = waiter;
        if tail == NIL {
            self.head[class] = idx;
        } else {
            self.cells[tail as usize].next = idx;
        }
        self.tail[class] = idx;
        self.len[class] += 1;
    }

    /// Unlinks a queued cell from the queue (it stays owned by its waiter).
    pub(super) fn unlink(&mut self, idx: u32) {
        let (prev, next, class) = {
            let cell = &self.cells[idx as usize];
            debug_assert!(cell.linked, "unlinked a cell twice");
            (cell.prev, cell.next, cell.class as usize)
        };
        self.len[class] -= 1;
        if prev == NIL {
            self.head[class] = next;
        } else {
            self.cells[prev as usize].next = next;
        }
        if next == NIL {
            self.tail[class] = prev;
        } else {
            self.cells[next as usize].prev = prev;
        }
        let cell = &mut self.cells[idx as usize];
        cell.prev = NIL;
        cell.next = NIL;
        cell.linked = false;
    }

    /// Takes whom a cell would tell, for the caller to drop after
    /// unlocking (a waker's or callback's drop may run user code).
    pub(super) fn take_waiter(&mut self, idx: u32) -> Waiter {
        std::mem::replace(&mut self.cells[idx as usize].waiter, Waiter::None)
    }
}
