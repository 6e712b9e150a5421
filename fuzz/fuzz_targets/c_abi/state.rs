//! The state one input runs on: the live handles of each kind, the
//! callbacks owed and seen, and the checks every call's status goes through.

use std::collections::HashMap;
use std::ffi::{c_char, c_void, CStr};
use std::ptr::null_mut;
use std::sync::Mutex;

use loadgate_ffi::*;

use crate::args::{Buf, Handle};

/// What callbacks report, shared with them through `user_data`.
#[derive(Default)]
pub struct CallbackLog {
    pub calls: Mutex<Vec<(lg_status, usize)>>,
}

pub unsafe extern "C" fn on_admit(
    user_data: *mut c_void,
    status: lg_status,
    permit: *mut lg_permit,
) {
    // SAFETY: user_data is the `CallbackLog` of the running input, which
    // outlives every request (all gates are closed before it is dropped).
    let log = unsafe { &*(user_data as *const CallbackLog) };
    log.calls.lock().unwrap().push((status, permit as usize));
}

/// Live handles of each kind; a freed handle leaves its list at once.
pub struct State {
    pub monitors: Vec<*mut lg_monitor>,
    pub gates: Vec<*mut lg_gate>,
    pub bookings: Vec<*mut lg_booking>,
    pub permits: Vec<*mut lg_permit>,
    pub tickets: Vec<*mut lg_ticket>,
    pub dispatches: Vec<*mut lg_dispatch>,
    /// Each live gate's class reservations, by handle (absent: no
    /// classes), to tell when a blocking admit cannot wait.
    pub reserved: HashMap<usize, Vec<u32>>,
    pub log: Box<CallbackLog>,
    /// Callbacks seen so far (`log` entries already checked).
    pub seen: usize,
    /// Async requests accepted and not cancelled: each owes one callback.
    pub owed: usize,
}

pub fn pick<T>(list: &[*mut T], h: Handle) -> *mut T {
    if h.0 == 0 || list.is_empty() {
        null_mut()
    } else {
        list[usize::from(h.0 - 1) % list.len()]
    }
}

pub fn take<T>(list: &mut Vec<*mut T>, h: Handle) -> *mut T {
    if h.0 == 0 || list.is_empty() {
        null_mut()
    } else {
        let i = usize::from(h.0 - 1) % list.len();
        list.swap_remove(i)
    }
}

pub const SENTINEL: u64 = 0x5a5a_5a5a_5a5a_5a5a;
pub fn dangling<T>() -> *mut T {
    SENTINEL as usize as *mut T
}

/// Every status: not a panic; a failure leaves a message.
pub fn checked(call: &str, status: lg_status) -> lg_status {
    assert_ne!(
        status,
        lg_status::LG_PANIC,
        "{call} panicked: {}",
        last_error()
    );
    if status != lg_status::LG_OK {
        assert!(
            !last_error().is_empty(),
            "{call} failed with {status:?} and no message"
        );
    }
    status
}

pub fn last_error() -> String {
    // SAFETY: lg_last_error_message returns a valid C string.
    unsafe { CStr::from_ptr(lg_last_error_message()) }
        .to_str()
        .expect("UTF-8 message")
        .to_owned()
}

/// A NULL this call cannot take must be refused.
pub fn refuses_null(call: &str, status: lg_status, null: bool) {
    if null {
        assert_eq!(
            status,
            lg_status::LG_INVALID_ARGUMENT,
            "{call} with a NULL argument"
        );
    }
}

/// snprintf semantics of the text calls.
pub fn check_text(call: &str, status: lg_status, buf: &[u8], b: Buf, needed: usize) {
    match status {
        lg_status::LG_OK => {
            assert!(
                needed < buf.len(),
                "{call}: OK with needed {needed} >= {}",
                buf.len()
            );
            assert_eq!(buf[needed], 0, "{call}: text not NUL-terminated");
            assert!(!buf[..needed].contains(&0), "{call}: NUL inside the text");
        }
        lg_status::LG_BUFFER_TOO_SMALL => {
            assert!(
                needed >= buf.len(),
                "{call}: too small with needed {needed}"
            );
            if !b.null && !buf.is_empty() {
                assert_eq!(buf[buf.len() - 1], 0, "{call}: cut text not NUL-terminated");
            }
        }
        _ => assert_eq!(
            needed, SENTINEL as usize,
            "{call}: needed written on failure"
        ),
    }
}

pub fn text_buf(b: Buf) -> Vec<u8> {
    vec![0xAA; if b.null { 0 } else { usize::from(b.len % 2048) }]
}

pub fn buf_ptr(b: Buf, buf: &mut [u8]) -> (*mut c_char, usize) {
    if b.null {
        // NULL with a length is refused; NULL with 0 asks for the size.
        (null_mut(), usize::from(b.len % 2))
    } else {
        (buf.as_mut_ptr().cast(), buf.len())
    }
}

impl State {
    pub fn new() -> Self {
        State {
            monitors: Vec::new(),
            gates: Vec::new(),
            bookings: Vec::new(),
            permits: Vec::new(),
            tickets: Vec::new(),
            dispatches: Vec::new(),
            reserved: HashMap::new(),
            log: Box::default(),
            seen: 0,
            owed: 0,
        }
    }

    /// New callbacks: each is owed, carries a permit exactly when LG_OK, and
    /// its permit joins the pool.
    pub fn drain_callbacks(&mut self) {
        let calls = self.log.calls.lock().unwrap();
        for &(status, permit) in &calls[self.seen..] {
            assert!(self.owed > 0, "a callback ran that nobody was owed");
            self.owed -= 1;
            match status {
                lg_status::LG_OK => {
                    assert_ne!(permit, 0, "LG_OK without a permit");
                    self.permits.push(permit as *mut lg_permit);
                }
                lg_status::LG_AT_CAPACITY
                | lg_status::LG_QUEUE_TIMEOUT
                | lg_status::LG_CLOSED
                | lg_status::LG_DISPLACED => {
                    assert_eq!(permit, 0, "{status:?} with a permit")
                }
                other => panic!("callback status {other:?}"),
            }
        }
        self.seen = calls.len();
    }

    /// Frees everything the input created; LeakSanitizer checks the rest.
    pub fn finish(mut self) {
        for g in std::mem::take(&mut self.gates) {
            // SAFETY: `g` was taken from `State::gates` and is live until freed just below.
            unsafe {
                checked("lg_gate_close", lg_gate_close(g));
                lg_gate_free(g);
            }
        }
        self.drain_callbacks();
        assert_eq!(self.owed, 0, "callbacks owed after every gate closed");
        for p in std::mem::take(&mut self.permits) {
            // SAFETY: `p` was taken out of `State::permits`: a live permit, released once.
            unsafe { lg_permit_release(p) };
        }
        for t in std::mem::take(&mut self.tickets) {
            // SAFETY: `t` was taken out of `State::tickets`: a live ticket, freed once.
            unsafe { lg_ticket_free(t) };
        }
        for d in std::mem::take(&mut self.dispatches) {
            // SAFETY: `d` was taken out of `State::dispatches`: a live dispatch, completed once.
            unsafe { lg_dispatch_complete(d, 0) };
        }
        for b in std::mem::take(&mut self.bookings) {
            // SAFETY: `take` removes the handle from `State::bookings` (or gives NULL), so it is
            // freed once and never used again.
            unsafe { lg_booking_free(b) };
        }
        for m in std::mem::take(&mut self.monitors) {
            // SAFETY: `take` removes the handle from `State::monitors` (or gives NULL), so it is
            // freed once and never used again.
            unsafe { lg_monitor_free(m) };
        }
    }
}

pub fn sentinel_thresholds() -> lg_thresholds {
    lg_thresholds {
        has_active_decode_blocks_threshold: false,
        active_decode_blocks_threshold: 0.0,
        has_active_prefill_tokens_threshold: false,
        active_prefill_tokens_threshold: 0,
        has_active_prefill_tokens_threshold_frac: false,
        active_prefill_tokens_threshold_frac: 0.0,
        version: SENTINEL,
        has_waiting_requests_threshold: false,
        waiting_requests_threshold: 0,
    }
}

pub fn stats(g: *mut lg_gate) -> lg_gate_stats {
    let mut out = std::mem::MaybeUninit::<lg_gate_stats>::uninit();
    // SAFETY: `g` is a live gate and `out` is writable.
    let st = unsafe { lg_gate_get_stats(g, out.as_mut_ptr()) };
    assert_eq!(st, lg_status::LG_OK);
    // SAFETY: written on LG_OK.
    unsafe { out.assume_init() }
}
