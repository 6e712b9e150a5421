//! The scrape calls, made only with an argument they must refuse before a
//! scrape starts (so none runs and the target never touches the network),
//! and on NULL handles.

use std::mem::MaybeUninit;
use std::ptr::{null, null_mut};

use libfuzzer_sys::arbitrary::{self, Arbitrary};
use loadgate_ffi::*;

use crate::args::{Handle, Str};
use crate::state::{checked, dangling, pick, refuses_null, State};

/// A scrape call.
#[derive(Debug, Arbitrary)]
pub enum Call {
    /// `lg_monitor_scrape` with one argument it must refuse (`fault`); the
    /// others are whatever the input says.
    Start {
        m: Handle,
        model: Str,
        id: u64,
        url: Str,
        engine: u32,
        interval_ms: u64,
        timeout_ms: u64,
        max_num_seqs: u64,
        fault: u8,
    },
    /// `lg_scrape_get_stats` and `lg_scrape_free` on NULL.
    NullScrape { out_null: bool },
}

impl Call {
    /// Makes the call on the input's handles and checks its status,
    /// out-parameter and error message.
    pub fn apply(&self, state: &mut State) {
        match self {
            Call::Start {
                m,
                model,
                id,
                url,
                engine,
                interval_ms,
                timeout_ms,
                max_num_seqs,
                fault,
            } => {
                let mut m = pick(&state.monitors, *m);
                let (mut k1, mut k2) = (Vec::new(), Vec::new());
                let (mut mp, mut ml) = model.raw(&mut k1);
                let (mut up, mut ul) = url.raw(&mut k2);
                let mut engine_kind = engine % 2;
                let mut out: *mut lg_scrape = dangling();
                let mut out_ptr: *mut *mut lg_scrape = &mut out;
                match fault % 7 {
                    0 => out_ptr = null_mut(),
                    1 => m = null_mut(),
                    2 => (up, ul) = (null(), 3),
                    3 => (up, ul) = (b"ftp://127.0.0.1:9/metrics".as_ptr(), 25),
                    4 => engine_kind = engine.saturating_add(2).max(2),
                    5 => (mp, ml) = (b"".as_ptr(), 0), // empty, not NULL
                    _ => (up, ul) = (b"http://\xff/".as_ptr(), 9), // not UTF-8
                }
                // SAFETY: `m` is NULL or a live monitor from `State::monitors`; every string is
                // NULL or valid for its length (`Str::raw` or a literal); the out-pointer is NULL
                // or a local.
                let st = checked("lg_monitor_scrape", unsafe {
                    lg_monitor_scrape(
                        m,
                        mp.cast(),
                        ml,
                        *id,
                        up.cast(),
                        ul,
                        engine_kind,
                        *interval_ms,
                        *timeout_ms,
                        *max_num_seqs,
                        out_ptr,
                    )
                });
                assert_eq!(
                    st,
                    lg_status::LG_INVALID_ARGUMENT,
                    "lg_monitor_scrape, fault {fault}"
                );
                assert_eq!(out, dangling(), "scrape written on failure");
            }
            Call::NullScrape { out_null } => {
                let mut s = MaybeUninit::<lg_scrape_stats>::uninit();
                // SAFETY: NULL is a handle the call must refuse; the out-pointer is NULL or a
                // local.
                let st = checked("lg_scrape_get_stats", unsafe {
                    lg_scrape_get_stats(
                        null(),
                        if *out_null {
                            null_mut()
                        } else {
                            s.as_mut_ptr()
                        },
                    )
                });
                refuses_null("lg_scrape_get_stats", st, true);
                // SAFETY: `lg_scrape_free(NULL)` is a no-op.
                unsafe { lg_scrape_free(null_mut()) };
            }
        }
    }
}
