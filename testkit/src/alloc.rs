//! A counting allocator: the system allocator, counting the allocations each
//! thread makes, so a test or a bench can prove that a hot path allocated
//! nothing while it ran.
//!
//! Register it in its own binary (a test file, the bench binary, a fuzz
//! target), since a binary has one global allocator:
//!
//! ```ignore
//! #[global_allocator]
//! static ALLOC: loadgate_testkit::alloc::CountingAlloc = loadgate_testkit::alloc::CountingAlloc;
//! ```
//!
//! then read [`thread_allocations`] before and after the code under test, or
//! wrap it in [`allocations`]. Counts are per thread, so other threads'
//! allocations (a test harness, a background task) never show up.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

thread_local! {
    static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
}

/// The system allocator, counting allocations (and reallocations) per
/// thread.
#[derive(Debug, Clone, Copy, Default)]
pub struct CountingAlloc;

#[inline]
fn count() {
    // `try_with`: the slot may be gone while the thread is being torn down;
    // such allocations are simply not counted.
    let _ = ALLOCATIONS.try_with(|c| c.set(c.get() + 1));
}

// SAFETY: every method forwards to the system allocator with the caller's
// arguments; the counter is a const-initialized thread-local `Cell` without a
// destructor, whose access never allocates or re-enters the allocator.
unsafe impl GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count();
        // SAFETY: the caller upholds `GlobalAlloc::alloc`'s contract.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        count();
        // SAFETY: the caller upholds `GlobalAlloc::alloc_zeroed`'s contract.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller upholds `GlobalAlloc::dealloc`'s contract.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count();
        // SAFETY: the caller upholds `GlobalAlloc::realloc`'s contract.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

/// Allocations (including reallocations) made by this thread so far. Always
/// 0 unless [`CountingAlloc`] is the global allocator.
pub fn thread_allocations() -> u64 {
    ALLOCATIONS.try_with(Cell::get).unwrap_or(0)
}

/// Allocations made by this thread while running `f`, and what `f` returned.
pub fn allocations<R>(f: impl FnOnce() -> R) -> (u64, R) {
    let before = thread_allocations();
    let r = f();
    (thread_allocations() - before, r)
}
