//! Bookings: `lg_monitor_book` and the `lg_booking_*` calls on the
//! bookings it made, the stream hooks of the SLO included.

use std::ptr::null_mut;

use libfuzzer_sys::arbitrary::{self, Arbitrary};
use loadgate_ffi::*;

use crate::args::{Handle, Small};
use crate::state::{checked, dangling, pick, refuses_null, take, State, SENTINEL};

/// A booking call.
#[derive(Debug, Arbitrary)]
pub enum Call {
    Book {
        m: Handle,
        id: u8,
        rank: u8,
        blocks: Small,
        out_null: bool,
    },
    BookingAdd {
        b: Handle,
        blocks: Small,
    },
    BookingBlocks {
        b: Handle,
        out_null: bool,
    },
    BookingFirstToken(Handle),
    BookingTokens {
        b: Handle,
        n: Small,
    },
    BookingExpect {
        b: Handle,
        max_tokens: Small,
    },
    BookingReserved {
        b: Handle,
        out_null: bool,
    },
    BookingFinish {
        b: Handle,
        output_tokens: Small,
    },
    BookingFree(Handle),
}

impl Call {
    /// Makes the call on the input's handles and checks its status,
    /// out-parameters and error message.
    pub fn apply(&self, state: &mut State) {
        match self {
            Call::Book {
                m,
                id,
                rank,
                blocks,
                out_null,
            } => {
                let m = pick(&state.monitors, *m);
                let mut out: *mut lg_booking = dangling();
                // SAFETY: `m` is NULL or a live monitor from `State::monitors`; each out-pointer is
                // NULL or points at a local.
                let st = checked("lg_monitor_book", unsafe {
                    lg_monitor_book(
                        m,
                        u64::from(*id % 8),
                        u32::from(*rank % 5),
                        blocks.0,
                        if *out_null { null_mut() } else { &mut out },
                    )
                });
                refuses_null("lg_monitor_book", st, m.is_null() || *out_null);
                if st == lg_status::LG_OK {
                    state.bookings.push(out);
                } else {
                    assert_eq!(out, dangling(), "booking written on failure");
                }
            }
            Call::BookingAdd { b, blocks } => {
                let b = pick(&state.bookings, *b);
                // SAFETY: `b` is NULL or a live booking from `State::bookings`.
                let st = checked("lg_booking_add_output_blocks", unsafe {
                    lg_booking_add_output_blocks(b, blocks.0)
                });
                refuses_null("lg_booking_add_output_blocks", st, b.is_null());
            }
            Call::BookingBlocks { b, out_null } => {
                let b = pick(&state.bookings, *b);
                let mut out = SENTINEL;
                // SAFETY: `b` is NULL or a live booking from `State::bookings`; each out-pointer is
                // NULL or points at a local.
                let st = checked("lg_booking_blocks", unsafe {
                    lg_booking_blocks(b, if *out_null { null_mut() } else { &mut out })
                });
                refuses_null("lg_booking_blocks", st, b.is_null() || *out_null);
            }
            Call::BookingFirstToken(b) => {
                let b = pick(&state.bookings, *b);
                // SAFETY: `b` is NULL or a live booking from `State::bookings`.
                let st = checked("lg_booking_first_token", unsafe {
                    lg_booking_first_token(b)
                });
                refuses_null("lg_booking_first_token", st, b.is_null());
                assert!(b.is_null() || st == lg_status::LG_OK);
            }
            Call::BookingTokens { b, n } => {
                let b = pick(&state.bookings, *b);
                // SAFETY: `b` is NULL or a live booking from `State::bookings`.
                let st = checked("lg_booking_tokens", unsafe { lg_booking_tokens(b, n.0) });
                refuses_null("lg_booking_tokens", st, b.is_null());
                assert!(b.is_null() || st == lg_status::LG_OK);
            }
            Call::BookingExpect { b, max_tokens } => {
                let b = pick(&state.bookings, *b);
                // SAFETY: `b` is NULL or a live booking from `State::bookings`.
                let st = checked("lg_booking_expect_output", unsafe {
                    lg_booking_expect_output(b, max_tokens.0)
                });
                refuses_null("lg_booking_expect_output", st, b.is_null());
                assert!(b.is_null() || st == lg_status::LG_OK);
            }
            Call::BookingReserved { b, out_null } => {
                let b = pick(&state.bookings, *b);
                let mut out = SENTINEL;
                // SAFETY: `b` is NULL or a live booking from `State::bookings`; each out-pointer is
                // NULL or points at a local.
                let st = checked("lg_booking_reserved_blocks", unsafe {
                    lg_booking_reserved_blocks(b, if *out_null { null_mut() } else { &mut out })
                });
                refuses_null("lg_booking_reserved_blocks", st, b.is_null() || *out_null);
            }
            // SAFETY: `take` removes the handle from `State::bookings` (or gives NULL), so it is
            // finished once and never used again.
            Call::BookingFinish { b, output_tokens } => unsafe {
                lg_booking_finish(take(&mut state.bookings, *b), output_tokens.0)
            },
            // SAFETY: `take` removes the handle from `State::bookings` (or gives NULL), so it is
            // freed once and never used again.
            Call::BookingFree(b) => unsafe { lg_booking_free(take(&mut state.bookings, *b)) },
        }
    }
}
