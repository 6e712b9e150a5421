//! The process's I/O runtime (features `nats`, `scrape` and `etcd`): one
//! tokio worker thread, started on first use, that the NATS transport, the
//! engine scraper and the etcd discovery share. Starting it lazily keeps a process that forks its
//! workers before connecting or scraping single-threaded until then.
//!
//! # Fork
//!
//! `fork()` copies only the calling thread: in a child, the parent's runtime
//! has no worker thread, so nothing spawned on it would ever run and a call
//! that waits on it would wait forever (what `gunicorn --preload` and
//! `multiprocessing`'s fork start method would hit). So the runtime belongs
//! to the process that started it: the first use in a child (a different
//! process id) starts the child's own runtime. The parent's copy is leaked,
//! not shut down, since shutting it down would wait for threads the child
//! does not have. Objects bound to the parent's runtime (a NATS connection,
//! a running scrape) cannot follow across a fork; they say so
//! (`fork.rs`).

use std::future::Future;
use std::ptr;
use std::sync::atomic::{AtomicPtr, Ordering};

use tokio::runtime::Runtime;

/// A process's runtime and the process that started it. Leaked: never
/// freed, so a pointer to one stays valid for the life of the process (and
/// of its forked children, which inherit the memory).
struct Entry {
    pid: u32,
    runtime: Runtime,
}

/// The current process's runtime entry, or null before the first use.
static CURRENT: AtomicPtr<Entry> = AtomicPtr::new(ptr::null_mut());

/// The shared runtime of this process, started on its first call here.
pub(crate) fn runtime() -> &'static Runtime {
    let pid = std::process::id();
    // Acquire, pairing with the Release of the exchange that published the
    // entry: its runtime is fully built before we use it.
    let mut seen = CURRENT.load(Ordering::Acquire);
    loop {
        // SAFETY: a non-null pointer in CURRENT comes from `Box::leak` below
        // and is never freed, so it points to a valid `Entry` forever.
        if let Some(entry) = unsafe { seen.as_ref() } {
            if entry.pid == pid {
                return &entry.runtime;
            }
        }
        // First use in this process (or a parent's entry, after a fork).
        let fresh: &'static mut Entry = Box::leak(Box::new(Entry {
            pid,
            runtime: tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .thread_name("loadgate-io")
                .enable_all()
                .build()
                .expect("cannot start the loadgate I/O runtime"),
        }));
        // AcqRel: Release publishes the built runtime; Acquire (also on
        // failure) reads a runtime another thread published first.
        match CURRENT.compare_exchange(seen, fresh, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => return &fresh.runtime,
            Err(actual) => {
                // Another thread of this process started one first: ours
                // was never used, so it can shut down and be freed.
                // SAFETY: `fresh` was leaked just above and never published,
                // so this is its only reference.
                drop(unsafe { Box::from_raw(fresh as *mut Entry) });
                seen = actual;
            }
        }
    }
}

/// Runs `f` to completion on the shared runtime, from any thread
/// (including threads that are themselves inside a tokio runtime).
#[cfg_attr(not(any(feature = "nats", feature = "etcd")), allow(dead_code))]
pub(crate) fn block_on<F>(f: F) -> F::Output
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    if tokio::runtime::Handle::try_current().is_ok() {
        std::thread::spawn(move || runtime().block_on(f))
            .join()
            .expect("a call on the loadgate I/O runtime panicked")
    } else {
        runtime().block_on(f)
    }
}
