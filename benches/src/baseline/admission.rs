//! Reference admission designs: the two the reference system shipped.
//!
//! * [`ChannelGate`], the first design: a tokio `Semaphore(N)` for the engine
//!   slots and an `mpsc` channel of `Q - 1` for the overflow queue, drained by
//!   one dispatcher task that holds one request while it waits for a slot
//!   (which is why the reference needs `Q >= 2` for an exact `N + Q`). A
//!   request first tries the semaphore, then the channel; a full channel is a
//!   rejection. A queued request waits on a `oneshot` for its permit.
//! * [`MutexGate`], the newest design: one `parking_lot::Mutex` around the
//!   active count and a `VecDeque` of waiters, each with a `oneshot` sender.
//!   Admission, queueing and release each take the mutex; release pops the
//!   oldest live waiter and sends it the slot.
//! * [`WaitMutexGate`], the newest design's wait limit as it ships: the
//!   same mutex also guards the count of admitted requests without a first
//!   response; admission needs a request slot and a wait slot, and the first
//!   response and the release each take the mutex to give theirs back and
//!   hand on to the oldest waiter.
//! * [`ClassMutexGate`], the same design with [`CLASSES`] priority classes,
//!   as one would extend it: one `VecDeque` of waiters per class under the
//!   same mutex, release popping the first non-empty one (class 0 the most
//!   important).
//!
//! The third reference point, tokio's `Semaphore::try_acquire` + drop (what
//! tower's `ConcurrencyLimit` uses), needs no wrapper: the benches call
//! tokio directly.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use parking_lot::Mutex;
use tokio::sync::{mpsc, oneshot, OwnedSemaphorePermit, Semaphore};

/// The first reference design. See the module docs.
#[derive(Debug)]
pub struct ChannelGate {
    slots: Arc<Semaphore>,
    queue: mpsc::Sender<oneshot::Sender<OwnedSemaphorePermit>>,
}

/// Outcome of [`ChannelGate::admit`].
#[derive(Debug)]
pub enum ChannelAdmission {
    /// A slot was free.
    Admitted(OwnedSemaphorePermit),
    /// Queued: the permit arrives on this receiver.
    Queued(oneshot::Receiver<OwnedSemaphorePermit>),
    /// Slots and queue full ("worker at capacity").
    Rejected,
}

impl ChannelGate {
    /// `limit` slots and a queue of `queue` (at least 2); the dispatcher task
    /// is spawned on `runtime`.
    pub fn new(runtime: &tokio::runtime::Handle, limit: usize, queue: usize) -> Self {
        assert!(queue >= 2, "the first reference design needs Q >= 2");
        let slots = Arc::new(Semaphore::new(limit));
        let (tx, mut rx) = mpsc::channel::<oneshot::Sender<OwnedSemaphorePermit>>(queue - 1);
        let dispatcher_slots = slots.clone();
        runtime.spawn(async move {
            // Holds one request between the channel and a slot.
            while let Some(reply) = rx.recv().await {
                let Ok(permit) = dispatcher_slots.clone().acquire_owned().await else {
                    break;
                };
                // A requester that went away drops the permit: slot released.
                let _ = reply.send(permit);
            }
        });
        Self { slots, queue: tx }
    }

    /// Admits, queues or rejects one request.
    #[inline]
    pub fn admit(&self) -> ChannelAdmission {
        if let Ok(permit) = self.slots.clone().try_acquire_owned() {
            return ChannelAdmission::Admitted(permit);
        }
        let (reply, rx) = oneshot::channel();
        match self.queue.try_send(reply) {
            Ok(()) => ChannelAdmission::Queued(rx),
            Err(_) => ChannelAdmission::Rejected,
        }
    }

    /// Free slots now.
    pub fn available(&self) -> usize {
        self.slots.available_permits()
    }

    /// Free places in the channel now (the dispatcher's held request aside).
    pub fn queue_room(&self) -> usize {
        self.queue.capacity()
    }
}

#[derive(Debug)]
struct MutexState {
    active: usize,
    waiters: VecDeque<oneshot::Sender<()>>,
}

/// The newest reference design. See the module docs.
#[derive(Debug)]
pub struct MutexGate {
    state: Mutex<MutexState>,
    limit: usize,
    queue: usize,
}

/// A slot of a [`MutexGate`], released on drop.
#[derive(Debug)]
pub struct MutexPermit<'a> {
    gate: &'a MutexGate,
}

impl Drop for MutexPermit<'_> {
    fn drop(&mut self) {
        self.gate.release();
    }
}

/// A queued request of a [`MutexGate`]: a future, or [`wait`](Self::wait)
/// to block the thread.
#[derive(Debug)]
pub struct MutexWait<'a> {
    gate: &'a MutexGate,
    rx: oneshot::Receiver<()>,
}

impl<'a> MutexWait<'a> {
    /// Blocks the thread until the slot arrives.
    pub fn wait(self) -> Option<MutexPermit<'a>> {
        let gate = self.gate;
        self.rx.blocking_recv().ok().map(|()| MutexPermit { gate })
    }
}

impl<'a> Future for MutexWait<'a> {
    type Output = Option<MutexPermit<'a>>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let gate = self.gate;
        Pin::new(&mut self.rx)
            .poll(cx)
            .map(|r| r.ok().map(|()| MutexPermit { gate }))
    }
}

/// Outcome of [`MutexGate::admit`].
#[derive(Debug)]
pub enum MutexAdmission<'a> {
    /// A slot was free and nobody waited.
    Admitted(MutexPermit<'a>),
    /// Queued.
    Queued(MutexWait<'a>),
    /// Slots and queue full ("worker at capacity").
    Rejected,
}

impl MutexGate {
    /// `limit` slots and a queue of `queue`.
    pub fn new(limit: usize, queue: usize) -> Self {
        Self {
            state: Mutex::new(MutexState {
                active: 0,
                waiters: VecDeque::with_capacity(queue),
            }),
            limit,
            queue,
        }
    }

    /// A slot if one is free and nobody waits; never queues.
    #[inline]
    pub fn try_admit(&self) -> Option<MutexPermit<'_>> {
        let mut s = self.state.lock();
        if s.active < self.limit && s.waiters.is_empty() {
            s.active += 1;
            Some(MutexPermit { gate: self })
        } else {
            None
        }
    }

    /// Admits, queues or rejects one request.
    #[inline]
    pub fn admit(&self) -> MutexAdmission<'_> {
        let mut s = self.state.lock();
        if s.active < self.limit && s.waiters.is_empty() {
            s.active += 1;
            return MutexAdmission::Admitted(MutexPermit { gate: self });
        }
        if s.waiters.len() < self.queue {
            let (tx, rx) = oneshot::channel();
            s.waiters.push_back(tx);
            return MutexAdmission::Queued(MutexWait { gate: self, rx });
        }
        MutexAdmission::Rejected
    }

    /// Hands the slot to the oldest live waiter, or frees it.
    fn release(&self) {
        let mut s = self.state.lock();
        while let Some(tx) = s.waiters.pop_front() {
            if tx.send(()).is_ok() {
                return;
            }
        }
        s.active -= 1;
    }

    /// Requests queued now.
    pub fn queued(&self) -> usize {
        self.state.lock().waiters.len()
    }
}

/// Priority classes of a [`ClassMutexGate`].
pub const CLASSES: usize = 4;

#[derive(Debug)]
struct ClassState {
    active: usize,
    queued: usize,
    waiters: [VecDeque<oneshot::Sender<()>>; CLASSES],
}

/// The newest reference design with priority classes. See the module docs.
#[derive(Debug)]
pub struct ClassMutexGate {
    state: Mutex<ClassState>,
    limit: usize,
    queue: usize,
}

/// A slot of a [`ClassMutexGate`], released on drop.
#[derive(Debug)]
pub struct ClassPermit<'a> {
    gate: &'a ClassMutexGate,
}

impl Drop for ClassPermit<'_> {
    fn drop(&mut self) {
        self.gate.release();
    }
}

/// A queued request of a [`ClassMutexGate`]: a future.
#[derive(Debug)]
pub struct ClassWait<'a> {
    gate: &'a ClassMutexGate,
    rx: oneshot::Receiver<()>,
}

impl<'a> Future for ClassWait<'a> {
    type Output = Option<ClassPermit<'a>>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let gate = self.gate;
        Pin::new(&mut self.rx)
            .poll(cx)
            .map(|r| r.ok().map(|()| ClassPermit { gate }))
    }
}

/// Outcome of [`ClassMutexGate::admit`].
#[derive(Debug)]
pub enum ClassAdmission<'a> {
    /// A slot was free and nobody of this class or a more important one
    /// waited.
    Admitted(ClassPermit<'a>),
    /// Queued in its class.
    Queued(ClassWait<'a>),
    /// Slots and queue full.
    Rejected,
}

impl ClassMutexGate {
    /// `limit` slots and a queue of `queue` shared by the classes.
    pub fn new(limit: usize, queue: usize) -> Self {
        Self {
            state: Mutex::new(ClassState {
                active: 0,
                queued: 0,
                waiters: std::array::from_fn(|_| VecDeque::with_capacity(queue)),
            }),
            limit,
            queue,
        }
    }

    /// Admits, queues or rejects one request of class `class` (0 the most
    /// important; past the last counts as the last).
    #[inline]
    pub fn admit(&self, class: usize) -> ClassAdmission<'_> {
        let class = class.min(CLASSES - 1);
        let mut s = self.state.lock();
        if s.active < self.limit && s.waiters[..=class].iter().all(VecDeque::is_empty) {
            s.active += 1;
            return ClassAdmission::Admitted(ClassPermit { gate: self });
        }
        if s.queued < self.queue {
            let (tx, rx) = oneshot::channel();
            s.waiters[class].push_back(tx);
            s.queued += 1;
            return ClassAdmission::Queued(ClassWait { gate: self, rx });
        }
        ClassAdmission::Rejected
    }

    /// Hands the slot to the oldest live waiter of the most important class
    /// that has one, or frees it.
    fn release(&self) {
        let mut s = self.state.lock();
        let s = &mut *s;
        for q in &mut s.waiters {
            while let Some(tx) = q.pop_front() {
                s.queued -= 1;
                if tx.send(()).is_ok() {
                    return;
                }
            }
        }
        s.active -= 1;
    }

    /// Requests queued now.
    pub fn queued(&self) -> usize {
        self.state.lock().queued
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::fixture::{noop_waker, poll_once};

    #[test]
    fn class_mutex_gate_serves_the_most_important_class_first() {
        let gate = ClassMutexGate::new(1, 8);
        let ClassAdmission::Admitted(p) = gate.admit(0) else {
            panic!("first admit")
        };
        let mut waits: Vec<ClassWait<'_>> = (0..CLASSES)
            .rev()
            .map(|c| match gate.admit(c) {
                ClassAdmission::Queued(w) => w,
                _ => panic!("queues"),
            })
            .collect();
        assert_eq!(gate.queued(), CLASSES);
        let waker = noop_waker();
        let mut held = p;
        // Queued least important first; served most important first.
        while let Some(mut w) = waits.pop() {
            drop(held);
            held = match poll_once(&mut w, &waker) {
                Poll::Ready(Some(p)) => p,
                _ => panic!("the most important waiter was not handed the slot"),
            };
            assert_eq!(gate.queued(), waits.len());
        }
        drop(held);
        assert!(matches!(
            gate.admit(CLASSES - 1),
            ClassAdmission::Admitted(_)
        ));
    }

    #[test]
    fn mutex_gate_is_exact_and_fifo() {
        let gate = MutexGate::new(1, 1);
        let MutexAdmission::Admitted(p) = gate.admit() else {
            panic!("first admit")
        };
        assert!(gate.try_admit().is_none());
        let MutexAdmission::Queued(w) = gate.admit() else {
            panic!("second queues")
        };
        assert!(matches!(gate.admit(), MutexAdmission::Rejected));
        drop(p);
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let p = rt.block_on(w).expect("handed the slot");
        assert!(gate.try_admit().is_none());
        drop(p);
        assert!(gate.try_admit().is_some());
    }

    #[test]
    fn channel_gate_caps_at_n_plus_q() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let gate = ChannelGate::new(rt.handle(), 1, 2);
        let ChannelAdmission::Admitted(p) = gate.admit() else {
            panic!("first admit")
        };
        let ChannelAdmission::Queued(a) = gate.admit() else {
            panic!("second queues")
        };
        // Let the dispatcher take the first queued request.
        rt.block_on(tokio::task::yield_now());
        let ChannelAdmission::Queued(b) = gate.admit() else {
            panic!("third queues")
        };
        assert!(matches!(gate.admit(), ChannelAdmission::Rejected));
        drop(p);
        let p = rt.block_on(a).expect("first waiter gets the slot");
        drop(p);
        let p = rt.block_on(b).expect("second waiter gets the slot");
        assert_eq!(gate.available(), 0);
        drop(p);
        assert_eq!(gate.available(), 1);
    }
}

#[derive(Debug)]
struct WaitMutexState {
    active: usize,
    waiting: usize,
    waiters: VecDeque<oneshot::Sender<()>>,
}

/// The newest reference design with a wait limit. See the module docs.
#[derive(Debug)]
pub struct WaitMutexGate {
    state: Mutex<WaitMutexState>,
    limit: usize,
    wait_limit: usize,
}

/// A slot of a [`WaitMutexGate`], with its wait slot until
/// [`first_response`](Self::first_response); released on drop.
#[derive(Debug)]
pub struct WaitMutexPermit<'a> {
    gate: &'a WaitMutexGate,
    waiting: bool,
}

impl WaitMutexPermit<'_> {
    /// Gives the wait slot back (once).
    pub fn first_response(&mut self) {
        if std::mem::take(&mut self.waiting) {
            let mut s = self.gate.state.lock();
            s.waiting -= 1;
            self.gate.hand_on(&mut s);
        }
    }
}

impl Drop for WaitMutexPermit<'_> {
    fn drop(&mut self) {
        let mut s = self.gate.state.lock();
        s.active -= 1;
        if self.waiting {
            s.waiting -= 1;
        }
        self.gate.hand_on(&mut s);
    }
}

impl WaitMutexGate {
    /// `limit` request slots, `wait_limit` wait slots, a queue of `queue`.
    pub fn new(limit: usize, wait_limit: usize, queue: usize) -> Self {
        Self {
            state: Mutex::new(WaitMutexState {
                active: 0,
                waiting: 0,
                waiters: VecDeque::with_capacity(queue),
            }),
            limit,
            wait_limit,
        }
    }

    /// A request slot and a wait slot if both are free and nobody waits;
    /// never queues.
    #[inline]
    pub fn try_admit(&self) -> Option<WaitMutexPermit<'_>> {
        let mut s = self.state.lock();
        if s.active < self.limit && s.waiting < self.wait_limit && s.waiters.is_empty() {
            s.active += 1;
            s.waiting += 1;
            Some(WaitMutexPermit {
                gate: self,
                waiting: true,
            })
        } else {
            None
        }
    }

    /// Hands a free request slot and wait slot to the oldest live waiter.
    fn hand_on(&self, s: &mut WaitMutexState) {
        while s.active < self.limit && s.waiting < self.wait_limit {
            let Some(tx) = s.waiters.pop_front() else {
                return;
            };
            if tx.send(()).is_ok() {
                s.active += 1;
                s.waiting += 1;
            }
        }
    }
}
