//! The process's I/O runtime (features `nats` and `scrape`): one tokio
//! worker thread, started on first use, that the NATS transport and the
//! engine scraper share. Starting it lazily keeps a process that forks its
//! workers before connecting or scraping single-threaded until then.

use std::future::Future;
use std::sync::OnceLock;

use tokio::runtime::Runtime;

/// The shared runtime, started on the first call.
pub(crate) fn runtime() -> &'static Runtime {
    static RUNTIME: OnceLock<Runtime> = OnceLock::new();
    RUNTIME.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("loadgate-io")
            .enable_all()
            .build()
            .expect("cannot start the loadgate I/O runtime")
    })
}

/// Runs `f` to completion on the shared runtime, from any thread
/// (including threads that are themselves inside a tokio runtime).
#[cfg_attr(not(feature = "nats"), allow(dead_code))]
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
