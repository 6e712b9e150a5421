//! How the hot paths tell the monitor's maintenance (`duty.rs`) that it has
//! work: a report or booking change that may have freed a worker, a
//! request queued, a clock moved by hand.
//!
//! Raising the signal is one atomic swap and, for the first raise since
//! the maintenance last took it, an unpark of its thread: no lock, no
//! waiting, no host code. The maintenance *takes* the signal before it
//! looks at the queues, so a raise either lands before the take (the take
//! acquires what the raiser published) or after it (and unparks the thread
//! again, or leaves the flag for the next take).

use std::sync::Arc;
use std::task::Wake;

use arc_swap::ArcSwapOption;

use crate::sync::{AtomicBool, Ordering, Thread};

/// See the module docs.
pub(crate) struct Signal {
    /// Raised since the maintenance last took it.
    raised: AtomicBool,
    /// The monitor is gone: the thread ends.
    stopped: AtomicBool,
    /// The maintenance thread, once started.
    thread: ArcSwapOption<Thread>,
}

impl std::fmt::Debug for Signal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Signal")
            .field("raised", &self.raised)
            .field("stopped", &self.stopped)
            .finish_non_exhaustive()
    }
}

impl Signal {
    pub(crate) fn new() -> Self {
        Self {
            raised: AtomicBool::new(false),
            stopped: AtomicBool::new(false),
            thread: ArcSwapOption::empty(),
        }
    }

    /// There may be work: tells the maintenance, waking its thread if it
    /// has not been told since it last looked.
    #[inline]
    pub(crate) fn raise(&self) {
        // AcqRel: the take that reads this raise acquires the raiser's
        // change (module docs).
        if !self.raised.swap(true, Ordering::AcqRel) {
            if let Some(t) = self.thread.load().as_ref() {
                t.unpark();
            }
        }
    }

    /// Takes the signal: whether it was raised since the last take.
    pub(crate) fn take(&self) -> bool {
        self.raised.swap(false, Ordering::AcqRel)
    }

    /// Whether it was raised since the last take, leaving it so.
    pub(crate) fn is_raised(&self) -> bool {
        self.raised.load(Ordering::Acquire)
    }

    /// The maintenance thread that raises wake.
    pub(crate) fn set_thread(&self, thread: Thread) {
        self.thread.store(Some(Arc::new(thread)));
    }

    /// Ends the maintenance thread: it sees the raise (or its unpark) and
    /// then the stop.
    pub(crate) fn stop(&self) {
        self.stopped.store(true, Ordering::Release);
        self.raise();
    }

    /// Whether the monitor is gone.
    pub(crate) fn is_stopped(&self) -> bool {
        self.stopped.load(Ordering::Acquire)
    }
}

/// A clock moved by hand (`ManualClock`) wakes the maintenance through
/// this, so that deadlines and staleness follow it.
impl Wake for Signal {
    fn wake(self: Arc<Self>) {
        self.raise();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.raise();
    }
}

/// The wake-up protocol under loom: a raiser publishes a change and
/// raises; the maintenance's loop (as in `duty.rs`: take, look, park
/// unless raised meanwhile) must see the change without another raise.
#[cfg(all(test, loom))]
mod tests {
    use super::*;
    use loom::sync::atomic::AtomicBool;
    use loom::thread;

    #[test]
    fn a_raise_is_never_lost() {
        loom::model(|| {
            let signal = Arc::new(Signal::new());
            let change = Arc::new(AtomicBool::new(false));
            let (s, c) = (signal.clone(), change.clone());
            let maintenance = thread::spawn(move || {
                s.set_thread(crate::sync::current_thread());
                loop {
                    s.take();
                    // Relaxed: the take acquires what the raise released.
                    if c.load(Ordering::Relaxed) {
                        return;
                    }
                    if !s.is_raised() {
                        crate::sync::park();
                    }
                }
            });
            change.store(true, Ordering::Relaxed);
            signal.raise();
            maintenance.join().unwrap();
        });
    }

    #[test]
    fn a_stop_ends_the_loop() {
        loom::model(|| {
            let signal = Arc::new(Signal::new());
            let s = signal.clone();
            let maintenance = thread::spawn(move || {
                s.set_thread(crate::sync::current_thread());
                while !s.is_stopped() {
                    s.take();
                    if !s.is_stopped() && !s.is_raised() {
                        crate::sync::park();
                    }
                }
            });
            signal.stop();
            maintenance.join().unwrap();
        });
    }
}
