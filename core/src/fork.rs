//! Objects that start threads or tasks remember the process that made them.
//!
//! `fork()` copies only the calling thread, so in a forked child such an
//! object's thread is gone, and a lock that thread held at the moment of the
//! fork stays held forever. An object bound to a thread checks its
//! [`ForkGuard`] first: in another process it refuses with an error (or,
//! when dropped, lets its thread go without waiting for it) instead of
//! waiting forever. What `gunicorn --preload` and `multiprocessing`'s fork
//! start method do: make such objects after the fork.

/// The process an object was made in.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ForkGuard(u32);

impl ForkGuard {
    /// A guard for an object made now, in this process.
    pub(crate) fn new() -> Self {
        ForkGuard(std::process::id())
    }

    /// Whether the object is used in the process that made it.
    pub(crate) fn same_process(self) -> bool {
        self.0 == std::process::id()
    }
}
