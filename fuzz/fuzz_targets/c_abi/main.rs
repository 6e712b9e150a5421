//! C ABI call sequences (ffi-c/, `lg_*`) with NULL handles and
//! out-parameters, NULL-with-length and non-UTF-8 strings, short and NULL
//! text buffers, and out-of-range enums, policies, statuses and limits.
//!
//! Calls go straight to the `extern "C"` functions (ffi-c compiled as an
//! rlib, see `ffi-rlib/`), under AddressSanitizer and LeakSanitizer. Only
//! calls the header allows are made: no dangling or freed handle, no length
//! longer than its buffer. The NATS calls (reporter, subscription, booking
//! sync) are made only with an argument they must refuse before connecting,
//! and the scrape call only with one it must refuse before a scrape starts,
//! so the target never touches the network. Dispatch goes through the
//! blocking `lg_monitor_dispatch` with a zero timeout, so no call waits.
//! Within that contract every call must:
//! * return a status and never `LG_PANIC` (and never crash or leak);
//! * give `LG_INVALID_ARGUMENT` for a NULL it cannot take;
//! * write its out-parameters only on success (snprintf-style text calls:
//!   the length always, a NUL-terminated prefix on `LG_BUFFER_TOO_SMALL`);
//! * leave a message for `lg_last_error_message()` when it fails.
//!
//! And every `lg_gate_admit_async` callback runs exactly once (LG_OK with a
//! permit, or a rejection with NULL) unless its ticket cancelled it; a
//! dispatch that gave up leaves its model's queue (the monitor's
//! `frontend_queue_requests` gauges show no request waiting after it).
#![no_main]

mod args;
mod booking;
mod flow;
mod gate;
mod http;
mod monitor;
mod nats;
mod permit;
mod scrape;
mod state;
mod sync;

use std::ffi::CStr;

use libfuzzer_sys::arbitrary::{self, Arbitrary};
use libfuzzer_sys::fuzz_target;
use loadgate_ffi::{lg_overload_status, lg_version};

use state::State;

/// One call, by the C object it is made on.
#[derive(Debug, Arbitrary)]
enum Call {
    Monitor(monitor::Call),
    Booking(booking::Call),
    Flow(flow::Call),
    Gate(gate::Call),
    Permit(permit::Call),
    Http(http::Call),
    Nats(nats::Call),
    Scrape(scrape::Call),
    Sync(sync::Call),
    Version,
}

impl Call {
    fn apply(&self, state: &mut State) {
        match self {
            Call::Monitor(c) => c.apply(state),
            Call::Booking(c) => c.apply(state),
            Call::Flow(c) => c.apply(state),
            Call::Gate(c) => c.apply(state),
            Call::Permit(c) => c.apply(state),
            Call::Http(c) => c.apply(state),
            Call::Nats(c) => c.apply(state),
            Call::Scrape(c) => c.apply(state),
            Call::Sync(c) => c.apply(state),
            Call::Version => {
                // SAFETY: `lg_version` returns a static NUL-terminated string.
                let v = unsafe { CStr::from_ptr(lg_version()) }.to_str().unwrap();
                assert_eq!(v.split('.').count(), 3, "{v}");
                let _ = lg_overload_status();
            }
        }
        state.drain_callbacks();
    }
}

fuzz_target!(|calls: Vec<Call>| {
    let mut state = State::new();
    for call in calls.iter().take(128) {
        call.apply(&mut state);
    }
    state.finish();
});
