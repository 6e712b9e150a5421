//! Booking sync between frontends: `lg_booking_sync_config_default`,
//! `lg_monitor_sync_bookings` made only with an argument it must refuse
//! before connecting (its settings otherwise anything), and the calls on a
//! sync on NULL: the target never touches the network.

use std::ptr::{null, null_mut};

use libfuzzer_sys::arbitrary::{self, Arbitrary};
use loadgate_ffi::*;

use crate::args::{Count, Handle, Small, Str};
use crate::state::{checked, dangling, pick, refuses_null, State};

/// A sync's settings: lg_booking_sync_config_default()'s, each overridden
/// or not, with any value.
#[derive(Debug, Arbitrary)]
pub struct SyncSettings {
    pub debounce_ms: Option<Small>,
    pub heartbeat_ms: Option<Small>,
    pub expire_after_ms: Option<Small>,
    pub max_frontends: Option<Count>,
    pub max_entries: Option<Count>,
    pub mode: Option<u32>,
    pub lease_ms: Option<Small>,
}

/// A booking sync call.
#[derive(Debug, Arbitrary)]
pub enum Call {
    ConfigDefault {
        out_null: bool,
    },
    /// `lg_monitor_sync_bookings` with one argument it must refuse
    /// (`fault`); the others are whatever the input says.
    Start {
        m: Handle,
        url: Str,
        namespace: Str,
        frontend_id: Str,
        settings: Option<SyncSettings>,
        fault: u8,
    },
    /// `lg_booking_sync_get_stats` and `lg_booking_sync_free` on NULL.
    NullSync {
        out_null: bool,
    },
}

fn default_config() -> lg_booking_sync_config {
    let mut c = std::mem::MaybeUninit::<lg_booking_sync_config>::uninit();
    // SAFETY: `c` is a local, writable.
    let st = unsafe { lg_booking_sync_config_default(c.as_mut_ptr()) };
    assert_eq!(st, lg_status::LG_OK);
    // SAFETY: written on LG_OK.
    unsafe { c.assume_init() }
}

impl Call {
    /// Makes the call on the input's handles and checks its status,
    /// out-parameters and error message.
    pub fn apply(&self, state: &mut State) {
        match self {
            Call::ConfigDefault { out_null } => {
                let mut out = std::mem::MaybeUninit::<lg_booking_sync_config>::uninit();
                // SAFETY: each out-pointer is NULL or points at a local.
                let st = checked("lg_booking_sync_config_default", unsafe {
                    lg_booking_sync_config_default(if *out_null {
                        null_mut()
                    } else {
                        out.as_mut_ptr()
                    })
                });
                refuses_null("lg_booking_sync_config_default", st, *out_null);
                if st == lg_status::LG_OK {
                    // SAFETY: written on LG_OK.
                    let c = unsafe { out.assume_init() };
                    assert_eq!(c.mode, LG_SYNC_SHARED);
                    assert!(c.debounce_ms > 0 && c.heartbeat_ms >= c.debounce_ms);
                    assert!(c.expire_after_ms > c.heartbeat_ms);
                }
            }
            Call::Start {
                m,
                url,
                namespace,
                frontend_id,
                settings,
                fault,
            } => {
                let mut m = pick(&state.monitors, *m);
                let (mut k1, mut k2, mut k3) = (Vec::new(), Vec::new(), Vec::new());
                let (mut up, mut ul) = url.raw(&mut k1);
                let (mut np, mut nl) = namespace.raw(&mut k2);
                let (mut ip, mut il) = frontend_id.raw(&mut k3);
                let mut config = settings.as_ref().map(|s| {
                    let mut c = default_config();
                    let or = |v: Option<Small>, d: u64| v.map_or(d, |v| v.0);
                    c.debounce_ms = or(s.debounce_ms, c.debounce_ms);
                    c.heartbeat_ms = or(s.heartbeat_ms, c.heartbeat_ms);
                    c.expire_after_ms = or(s.expire_after_ms, c.expire_after_ms);
                    c.max_frontends = s.max_frontends.map_or(c.max_frontends, |v| v.0);
                    c.max_entries = s.max_entries.map_or(c.max_entries, |v| v.0);
                    c.mode = s.mode.unwrap_or(c.mode);
                    c.lease_ms = or(s.lease_ms, c.lease_ms);
                    c
                });
                let mut out: *mut lg_booking_sync = dangling();
                let mut out_ptr: *mut *mut lg_booking_sync = &mut out;
                // Settings the sync refuses, whatever the others are.
                let mut refused_setting = |f: &dyn Fn(&mut lg_booking_sync_config)| {
                    let c = config.get_or_insert_with(default_config);
                    f(c);
                };
                match fault % 11 {
                    0 => out_ptr = null_mut(),
                    1 => m = null_mut(),
                    2 => (up, ul) = (null(), 3),
                    3 => (np, nl) = (b"a.b".as_ptr(), 3),
                    4 => (ip, il) = (b"x y".as_ptr(), 3),
                    5 => refused_setting(&|c| c.mode = c.mode.max(LG_SYNC_LEASED + 1)),
                    6 => refused_setting(&|c| c.debounce_ms = 0),
                    7 => refused_setting(&|c| c.expire_after_ms = c.heartbeat_ms),
                    8 => refused_setting(&|c| {
                        c.max_frontends = if c.max_frontends % 2 == 0 { 0 } else { 4097 }
                    }),
                    9 => refused_setting(&|c| c.max_entries = 0),
                    _ => refused_setting(&|c| {
                        // Leased, with a lease shorter than four debounce
                        // intervals.
                        c.mode = LG_SYNC_LEASED;
                        c.debounce_ms = c.debounce_ms.clamp(1, 1 << 40);
                        c.lease_ms = 4 * c.debounce_ms - 1;
                    }),
                }
                // SAFETY: `m` is NULL or a live monitor from `State::monitors`; every string is
                // NULL or valid for its length (`Str::raw` or a literal); the config is NULL or a
                // local; no options; the out-pointer is NULL or a local.
                let st = checked("lg_monitor_sync_bookings", unsafe {
                    lg_monitor_sync_bookings(
                        m,
                        up.cast(),
                        ul,
                        np.cast(),
                        nl,
                        ip.cast(),
                        il,
                        config.as_ref().map_or(null(), |c| c as *const _),
                        null(),
                        out_ptr,
                    )
                });
                assert_eq!(
                    st,
                    lg_status::LG_INVALID_ARGUMENT,
                    "lg_monitor_sync_bookings, fault {}",
                    fault % 11
                );
                assert_eq!(out, dangling(), "sync written on failure");
            }
            Call::NullSync { out_null } => {
                let mut out = std::mem::MaybeUninit::<lg_booking_sync_stats>::uninit();
                // SAFETY: NULL is a handle the call must refuse; the out-pointer is NULL or a
                // local.
                let st = checked("lg_booking_sync_get_stats", unsafe {
                    lg_booking_sync_get_stats(
                        null(),
                        if *out_null {
                            null_mut()
                        } else {
                            out.as_mut_ptr()
                        },
                    )
                });
                refuses_null("lg_booking_sync_get_stats", st, true);
                // SAFETY: `_free(NULL)` is a no-op.
                unsafe { lg_booking_sync_free(null_mut()) };
            }
        }
    }
}
