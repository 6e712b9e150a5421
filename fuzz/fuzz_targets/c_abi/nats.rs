//! The cluster calls (reporter, subscription), made only with an argument
//! they must refuse before connecting, and on NULL handles: the target never
//! touches the network.

use std::ptr::{null, null_mut};

use libfuzzer_sys::arbitrary::{self, Arbitrary};
use loadgate_ffi::*;

use crate::args::{worker_report, worker_spec, Handle, Report, Spec, Str};
use crate::state::{checked, dangling, pick, refuses_null, State};

/// A cluster call.
#[derive(Debug, Arbitrary)]
pub enum Call {
    /// `lg_reporter_new` with one argument it must refuse (`fault`).
    ReporterNew {
        url: Str,
        namespace: Str,
        id: u8,
        model: Str,
        spec: Option<Spec>,
        fault: u8,
    },
    /// `lg_monitor_subscribe_nats` with one argument it must refuse.
    Subscribe {
        m: Handle,
        url: Str,
        namespace: Str,
        fault: u8,
    },
    /// The reporter and subscription calls on NULL handles.
    NullNatsHandles { out_null: bool },
}

impl Call {
    /// Makes the call on the input's handles and checks its status,
    /// out-parameters and error message.
    pub fn apply(&self, state: &mut State) {
        match self {
            Call::ReporterNew {
                url,
                namespace,
                id,
                model,
                spec,
                fault,
            } => {
                let (mut k1, mut k2, mut k3) = (Vec::new(), Vec::new(), Vec::new());
                let (mut up, mut ul) = url.raw(&mut k1);
                let (mut np, mut nl) = namespace.raw(&mut k2);
                let (mut mp, mut ml) = model.raw(&mut k3);
                let mut spec = spec.as_ref().map(worker_spec);
                let mut out: *mut lg_reporter = dangling();
                let mut out_ptr: *mut *mut lg_reporter = &mut out;
                match fault % 6 {
                    0 => out_ptr = null_mut(),
                    1 => (up, ul) = (null(), 7),
                    2 => (mp, ml) = (null(), 0), // empty model
                    3 => (np, nl) = (b"a.b".as_ptr(), 3),
                    4 => (np, nl) = (null(), 0), // empty namespace
                    _ => {
                        spec = Some(lg_worker_spec {
                            dp_start: u32::MAX,
                            dp_size: 2,
                            ..worker_spec(&Spec::default())
                        })
                    }
                }
                // SAFETY: every string is NULL or valid for its length (`Str::raw` or a literal);
                // the spec is NULL or a local; the out-pointer is NULL or a local.
                let st = checked("lg_reporter_new", unsafe {
                    lg_reporter_new(
                        up.cast(),
                        ul,
                        np.cast(),
                        nl,
                        u64::from(*id),
                        mp.cast(),
                        ml,
                        spec.as_ref().map_or(null(), |s| s as *const _),
                        out_ptr,
                    )
                });
                assert_eq!(
                    st,
                    lg_status::LG_INVALID_ARGUMENT,
                    "lg_reporter_new, fault {fault}"
                );
                assert_eq!(out, dangling(), "reporter written on failure");
            }
            Call::Subscribe {
                m,
                url,
                namespace,
                fault,
            } => {
                let mut m = pick(&state.monitors, *m);
                let (mut k1, mut k2) = (Vec::new(), Vec::new());
                let (mut up, mut ul) = url.raw(&mut k1);
                let (mut np, mut nl) = namespace.raw(&mut k2);
                let mut out: *mut lg_subscription = dangling();
                let mut out_ptr: *mut *mut lg_subscription = &mut out;
                match fault % 5 {
                    0 => out_ptr = null_mut(),
                    1 => m = null_mut(),
                    2 => (up, ul) = (null(), 3),
                    3 => (np, nl) = (b"x y".as_ptr(), 3),
                    _ => (np, nl) = (b">".as_ptr(), 1),
                }
                // SAFETY: `m` is NULL or a live monitor from `State::monitors`; the strings are
                // NULL or valid for their lengths (`Str::raw` or a literal); the out-pointer is
                // NULL or a local.
                let st = checked("lg_monitor_subscribe_nats", unsafe {
                    lg_monitor_subscribe_nats(m, up.cast(), ul, np.cast(), nl, out_ptr)
                });
                assert_eq!(
                    st,
                    lg_status::LG_INVALID_ARGUMENT,
                    "lg_monitor_subscribe_nats, fault {fault}"
                );
                assert_eq!(out, dangling(), "subscription written on failure");
            }
            Call::NullNatsHandles { out_null } => {
                let report = worker_report(&Report::default());
                // SAFETY: NULL is a handle the call must refuse; `report` is a local.
                let st = checked("lg_reporter_report", unsafe {
                    lg_reporter_report(null(), 0, &report)
                });
                refuses_null("lg_reporter_report", st, true);
                let mut rs = std::mem::MaybeUninit::<lg_reporter_stats>::uninit();
                // SAFETY: NULL is a handle the call must refuse; the out-pointer is NULL or a
                // local.
                let st = checked("lg_reporter_get_stats", unsafe {
                    lg_reporter_get_stats(
                        null(),
                        if *out_null {
                            null_mut()
                        } else {
                            rs.as_mut_ptr()
                        },
                    )
                });
                refuses_null("lg_reporter_get_stats", st, true);
                let mut ss = std::mem::MaybeUninit::<lg_subscription_stats>::uninit();
                // SAFETY: NULL is a handle the call must refuse; the out-pointer is NULL or a
                // local.
                let st = checked("lg_subscription_get_stats", unsafe {
                    lg_subscription_get_stats(
                        null(),
                        if *out_null {
                            null_mut()
                        } else {
                            ss.as_mut_ptr()
                        },
                    )
                });
                refuses_null("lg_subscription_get_stats", st, true);
                // SAFETY: `_free(NULL)` is a no-op.
                unsafe {
                    lg_reporter_free(null_mut());
                    lg_subscription_free(null_mut());
                }
            }
        }
    }
}
