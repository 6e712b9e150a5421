//! Permits and tickets: what admissions hand out (`lg_permit_release`,
//! `lg_permit_first_response`, `lg_ticket_*`).

use std::ptr::null_mut;

use libfuzzer_sys::arbitrary::{self, Arbitrary};
use loadgate_ffi::*;

use crate::args::Handle;
use crate::state::{checked, pick, refuses_null, take, State};

/// A permit or ticket call.
#[derive(Debug, Arbitrary)]
pub enum Call {
    PermitRelease(Handle),
    /// First response, on a pooled permit (updated in place) or on NULL.
    PermitFirstResponse {
        p: Handle,
        null_slot: bool,
    },
    TicketCancel {
        t: Handle,
        out_null: bool,
    },
    TicketIsQueued {
        t: Handle,
        out_null: bool,
    },
    TicketFree(Handle),
}

impl Call {
    /// Makes the call on the input's handles and checks its status,
    /// out-parameters and error message.
    pub fn apply(&self, state: &mut State) {
        match self {
            // SAFETY: `take` removes the permit from `State::permits` (or gives NULL), so it is
            // released once and never used again.
            Call::PermitRelease(p) => unsafe { lg_permit_release(take(&mut state.permits, *p)) },
            Call::PermitFirstResponse { p, null_slot } => {
                let i = usize::from(p.0);
                match state.permits.len() {
                    // SAFETY: NULL is a no-op by the contract.
                    _ if *null_slot => unsafe { lg_permit_first_response(null_mut()) },
                    0 => {
                        let mut none: *mut lg_permit = null_mut();
                        // SAFETY: a valid slot holding NULL, a no-op by the contract.
                        unsafe { lg_permit_first_response(&mut none) };
                        assert!(none.is_null());
                    }
                    n => {
                        // SAFETY: the slot holds a live permit from `State::permits`, not
                        // released; the call updates it in place, and the pool keeps the
                        // updated handle for later calls.
                        unsafe { lg_permit_first_response(&mut state.permits[i % n]) };
                        state.drain_callbacks();
                    }
                }
            }
            Call::TicketCancel { t, out_null } => {
                let t = pick(&state.tickets, *t);
                let mut out = false;
                // SAFETY: `t` is NULL or a live ticket from `State::tickets`; each out-pointer is
                // NULL or points at a local.
                let st = checked("lg_ticket_cancel", unsafe {
                    lg_ticket_cancel(t, if *out_null { null_mut() } else { &mut out })
                });
                refuses_null("lg_ticket_cancel", st, t.is_null() || *out_null);
                if st == lg_status::LG_OK && out {
                    // Its callback will never run.
                    state.drain_callbacks();
                    state.owed -= 1;
                }
            }
            Call::TicketIsQueued { t, out_null } => {
                let t = pick(&state.tickets, *t);
                let mut out = false;
                // SAFETY: `t` is NULL or a live ticket from `State::tickets`; each out-pointer is
                // NULL or points at a local.
                let st = checked("lg_ticket_is_queued", unsafe {
                    lg_ticket_is_queued(t, if *out_null { null_mut() } else { &mut out })
                });
                refuses_null("lg_ticket_is_queued", st, t.is_null() || *out_null);
            }
            // SAFETY: `take` removes the ticket from `State::tickets` (or gives NULL), so it is
            // freed once and never used again.
            Call::TicketFree(t) => unsafe { lg_ticket_free(take(&mut state.tickets, *t)) },
        }
    }
}
