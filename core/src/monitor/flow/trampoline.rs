//! Dispatch callbacks never nest: a callback called on a thread while
//! another runs there (a callback that dispatches again and is answered at
//! once, or whose completion frees the worker for one answered at once)
//! runs right after it returns, not inside it. So however a host chains
//! them, the stack holds one callback at a time.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::panic::{catch_unwind, AssertUnwindSafe};

/// A callback waiting for the one running on this thread.
type Job = Box<dyn FnOnce()>;

crate::sync::thread_local! {
    /// `Some` while a callback runs on this thread: the ones to run next.
    static PENDING: RefCell<Option<VecDeque<Job>>> = RefCell::new(None);
}

/// Calls `f` now, unless a callback is running on this thread: then right
/// after it (and those queued before) returns. A callback that panics is
/// caught and reported on stderr, and the others still run.
pub(super) fn call(f: impl FnOnce() + 'static) {
    let mut f = Some(f);
    let queued = PENDING
        .try_with(|p| match p.borrow_mut().as_mut() {
            Some(queue) => {
                let f = f.take().expect("not taken yet");
                queue.push_back(Box::new(f));
                true
            }
            None => false,
        })
        .unwrap_or(false);
    if queued {
        return;
    }
    let f = f.take().expect("not taken yet");
    // Outermost: run it, then what was queued meanwhile. If the thread's
    // storage is being torn down, run it as it comes.
    let outermost = PENDING
        .try_with(|p| p.borrow_mut().replace(VecDeque::new()).is_none())
        .unwrap_or(false);
    guarded(f);
    if !outermost {
        return;
    }
    while let Some(next) = PENDING.with(|p| p.borrow_mut().as_mut().and_then(VecDeque::pop_front)) {
        guarded(next);
    }
    PENDING.with(|p| p.borrow_mut().take());
}

fn guarded(f: impl FnOnce()) {
    if catch_unwind(AssertUnwindSafe(f)).is_err() {
        eprintln!("loadgate: a dispatch callback panicked; the panic was caught");
    }
}
