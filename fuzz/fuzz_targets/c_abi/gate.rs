//! The admission gate's calls: config, `lg_gate_new`/`_from_env`/`_free`,
//! admissions (try, blocking with a zero or safe timeout, async with a
//! callback), limits, close, expiry, stats and metrics.

use std::ptr::{null, null_mut};

use libfuzzer_sys::arbitrary::{self, Arbitrary};
use loadgate_ffi::*;

use crate::args::{Buf, GateConfig, Handle};
use crate::state::{
    buf_ptr, check_text, checked, dangling, on_admit, pick, refuses_null, stats, take, text_buf,
    CallbackLog, State, SENTINEL,
};

/// A gate call.
#[derive(Debug, Arbitrary)]
pub enum Call {
    GateConfigDefault {
        limit: u32,
        out_null: bool,
    },
    GateNew {
        config: Option<GateConfig>,
        out_null: bool,
    },
    GateFromEnv {
        limit: u8,
        out_null: bool,
    },
    GateFree(Handle),
    TryAdmit {
        g: Handle,
        out_null: bool,
    },
    Admit {
        g: Handle,
        wait: bool,
        out_null: bool,
    },
    AdmitAsync {
        g: Handle,
        callback_null: bool,
        want_ticket: bool,
    },
    SetLimit {
        g: Handle,
        limit: u32,
    },
    Close(Handle),
    Expire {
        g: Handle,
        out_null: bool,
    },
    NextDeadline {
        g: Handle,
        out_null: bool,
    },
    Stats {
        g: Handle,
        out_null: bool,
    },
    GateMetrics {
        g: Handle,
        buf: Buf,
        out_null: bool,
    },
}

impl Call {
    /// Makes the call on the input's handles and checks its status,
    /// out-parameters and error message.
    pub fn apply(&self, state: &mut State) {
        match self {
            Call::GateConfigDefault { limit, out_null } => {
                let mut out = std::mem::MaybeUninit::<lg_gate_config>::uninit();
                // SAFETY: each out-pointer is NULL or points at a local.
                let st = checked("lg_gate_config_default", unsafe {
                    lg_gate_config_default(
                        *limit,
                        if *out_null {
                            null_mut()
                        } else {
                            out.as_mut_ptr()
                        },
                    )
                });
                refuses_null("lg_gate_config_default", st, *out_null);
                if st == lg_status::LG_OK {
                    // SAFETY: written on LG_OK.
                    assert_eq!(unsafe { out.assume_init() }.limit, *limit);
                }
            }
            Call::GateNew { config, out_null } => {
                let mut keep = Vec::new();
                let cfg = config.as_ref().map(|c| {
                    let (prefix, prefix_len) =
                        c.prefix.as_ref().map_or((null(), 0), |s| s.raw(&mut keep));
                    lg_gate_config {
                        limit: if c.limit == 255 {
                            2_097_152
                        } else {
                            u32::from(c.limit % 5)
                        },
                        queue: if c.queue == 255 {
                            2_097_152
                        } else {
                            u32::from(c.queue % 40)
                        },
                        queue_timeout_ms: [0, 0, 1, 60_000][usize::from(c.timeout_ms % 4)],
                        adaptive_lifo: c.lifo,
                        metrics_prefix: prefix.cast(),
                        metrics_prefix_len: prefix_len,
                        // 0 is no wait limit; 255 is over the largest.
                        wait_limit: if c.wait_limit == 255 {
                            2_097_152
                        } else {
                            u32::from(c.wait_limit % 4)
                        },
                    }
                });
                let mut out: *mut lg_gate = dangling();
                // SAFETY: the config is NULL or a local whose prefix comes from `Str::raw`; the
                // out-pointer is NULL or a local.
                let st = checked("lg_gate_new", unsafe {
                    lg_gate_new(
                        cfg.as_ref().map_or(null(), |c| c as *const _),
                        if *out_null { null_mut() } else { &mut out },
                    )
                });
                refuses_null("lg_gate_new", st, *out_null || cfg.is_none());
                if st == lg_status::LG_OK {
                    state.gates.push(out);
                } else {
                    assert_eq!(out, dangling(), "out_gate written on failure");
                }
            }
            Call::GateFromEnv { limit, out_null } => {
                let mut out: *mut lg_gate = dangling();
                // SAFETY: each out-pointer is NULL or points at a local.
                let st = checked("lg_gate_from_env", unsafe {
                    lg_gate_from_env(
                        u32::from(*limit % 4),
                        if *out_null { null_mut() } else { &mut out },
                    )
                });
                refuses_null("lg_gate_from_env", st, *out_null || *limit % 4 == 0);
                if st == lg_status::LG_OK {
                    state.gates.push(out);
                } else {
                    assert_eq!(out, dangling(), "out_gate written on failure");
                }
            }
            Call::GateFree(g) => {
                let g = take(&mut state.gates, *g);
                if !g.is_null() {
                    // Queued callbacks would outlive the input's log: close
                    // first so they run now.
                    // SAFETY: `g` is live: it was taken from `State::gates` and checked for NULL.
                    checked("lg_gate_close", unsafe { lg_gate_close(g) });
                }
                // SAFETY: `take` removed `g` from `State::gates` (or gave NULL), so it is freed
                // once and never used again.
                unsafe { lg_gate_free(g) }
            }
            Call::TryAdmit { g, out_null } => {
                let g = pick(&state.gates, *g);
                let mut out: *mut lg_permit = dangling();
                // SAFETY: `g` is NULL or a live gate from `State::gates`; each out-pointer is NULL
                // or points at a local.
                let st = checked("lg_gate_try_admit", unsafe {
                    lg_gate_try_admit(g, if *out_null { null_mut() } else { &mut out })
                });
                refuses_null("lg_gate_try_admit", st, g.is_null() || *out_null);
                if st == lg_status::LG_OK {
                    state.permits.push(out);
                } else {
                    assert_eq!(out, dangling(), "permit written on failure");
                }
            }
            Call::Admit { g, wait, out_null } => {
                let g = pick(&state.gates, *g);
                // Wait without limit only when a slot is free and nobody
                // queues (this thread is the only caller), else time out at
                // once: the target never sleeps.
                let free = !g.is_null() && {
                    let s = stats(g);
                    s.closed || (s.running < s.limit && s.queued == 0)
                };
                let timeout = if *wait && free {
                    LG_TIMEOUT_INFINITE
                } else {
                    0
                };
                let mut out: *mut lg_permit = dangling();
                // SAFETY: `g` is NULL or a live gate from `State::gates`; each out-pointer is NULL
                // or points at a local; the timeout is infinite only when a slot is free, so the
                // call cannot block.
                let st = checked("lg_gate_admit", unsafe {
                    lg_gate_admit(g, timeout, if *out_null { null_mut() } else { &mut out })
                });
                refuses_null("lg_gate_admit", st, g.is_null() || *out_null);
                if st == lg_status::LG_OK {
                    state.permits.push(out);
                } else {
                    assert_eq!(out, dangling(), "permit written on failure");
                }
            }
            Call::AdmitAsync {
                g,
                callback_null,
                want_ticket,
            } => {
                let g = pick(&state.gates, *g);
                let mut ticket: *mut lg_ticket = dangling();
                let callback: lg_admit_callback =
                    if *callback_null { None } else { Some(on_admit) };
                // Counted before the call: the callback may run inside it.
                state.owed += 1;
                // SAFETY: `g` is NULL or a live gate from `State::gates`; `user_data` is the
                // input's `CallbackLog`, which outlives every request (gates are closed before it
                // is dropped) and `on_admit` only reads it; the ticket pointer is NULL or a local.
                let st = checked("lg_gate_admit_async", unsafe {
                    lg_gate_admit_async(
                        g,
                        callback,
                        (&*state.log as *const CallbackLog).cast_mut().cast(),
                        if *want_ticket {
                            &mut ticket
                        } else {
                            null_mut()
                        },
                    )
                });
                refuses_null("lg_gate_admit_async", st, g.is_null() || *callback_null);
                if st == lg_status::LG_OK {
                    if *want_ticket {
                        assert_ne!(ticket, dangling(), "no ticket");
                        state.tickets.push(ticket);
                    }
                } else {
                    state.owed -= 1;
                    assert_eq!(ticket, dangling(), "ticket written on failure");
                }
            }
            Call::SetLimit { g, limit } => {
                let g = pick(&state.gates, *g);
                let limit = if *limit > 2_097_151 {
                    *limit
                } else {
                    *limit % 6
                };
                // SAFETY: `g` is NULL or a live gate from `State::gates`.
                let st = checked("lg_gate_set_limit", unsafe { lg_gate_set_limit(g, limit) });
                refuses_null(
                    "lg_gate_set_limit",
                    st,
                    g.is_null() || limit == 0 || limit > 2_097_151,
                );
            }
            Call::Close(g) => {
                let g = pick(&state.gates, *g);
                // SAFETY: `g` is live: it was taken from `State::gates` and checked for NULL.
                let st = checked("lg_gate_close", unsafe { lg_gate_close(g) });
                refuses_null("lg_gate_close", st, g.is_null());
            }
            Call::Expire { g, out_null } => {
                let g = pick(&state.gates, *g);
                let mut out = SENTINEL as usize;
                // SAFETY: `g` is NULL or a live gate from `State::gates`; each out-pointer is NULL
                // or points at a local.
                let st = checked("lg_gate_expire", unsafe {
                    lg_gate_expire(g, if *out_null { null_mut() } else { &mut out })
                });
                refuses_null("lg_gate_expire", st, g.is_null());
            }
            Call::NextDeadline { g, out_null } => {
                let g = pick(&state.gates, *g);
                let mut out = SENTINEL;
                // SAFETY: `g` is NULL or a live gate from `State::gates`; each out-pointer is NULL
                // or points at a local.
                let st = checked("lg_gate_next_deadline", unsafe {
                    lg_gate_next_deadline(g, if *out_null { null_mut() } else { &mut out })
                });
                refuses_null("lg_gate_next_deadline", st, g.is_null() || *out_null);
            }
            Call::Stats { g, out_null } => {
                let g = pick(&state.gates, *g);
                let mut out = std::mem::MaybeUninit::<lg_gate_stats>::uninit();
                // SAFETY: `g` is NULL or a live gate from `State::gates`; each out-pointer is NULL
                // or points at a local.
                let st = checked("lg_gate_get_stats", unsafe {
                    lg_gate_get_stats(
                        g,
                        if *out_null {
                            null_mut()
                        } else {
                            out.as_mut_ptr()
                        },
                    )
                });
                refuses_null("lg_gate_get_stats", st, g.is_null() || *out_null);
                if st == lg_status::LG_OK {
                    // SAFETY: written on LG_OK.
                    let s = unsafe { out.assume_init() };
                    assert!(s.queued <= s.queue_limit, "{s:?}");
                }
            }
            Call::GateMetrics {
                g,
                buf: b,
                out_null,
            } => {
                let g = pick(&state.gates, *g);
                let mut buf = text_buf(*b);
                let (bp, bl) = buf_ptr(*b, &mut buf);
                let mut needed = SENTINEL as usize;
                // SAFETY: `g` is NULL or a live gate from `State::gates`; `(bp, bl)` is NULL or a
                // local buffer of `bl` bytes; each out-pointer is NULL or points at a local.
                let st = checked("lg_gate_metrics", unsafe {
                    lg_gate_metrics(g, bp, bl, if *out_null { null_mut() } else { &mut needed })
                });
                refuses_null(
                    "lg_gate_metrics",
                    st,
                    g.is_null() || *out_null || (bp.is_null() && bl > 0),
                );
                if !*out_null {
                    check_text("lg_gate_metrics", st, &buf, *b, needed);
                }
            }
        }
    }
}
