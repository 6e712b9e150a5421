//! The monitor's calls: `lg_monitor_new`/`_free`, `lg_monitor_config_default`,
//! workers, load reports, thresholds, staleness, routing, checks and metrics.

use std::ptr::{null, null_mut};

use libfuzzer_sys::arbitrary::{self, Arbitrary};
use loadgate_ffi::*;

use crate::args::{
    worker_report, worker_spec, Buf, Handle, MonitorConfig, Report, Small, Spec, Str, Update,
};
use crate::state::{
    buf_ptr, check_text, checked, dangling, last_error, pick, refuses_null, sentinel_thresholds,
    take, text_buf, State, SENTINEL,
};

/// A monitor call.
#[derive(Debug, Arbitrary)]
pub enum Call {
    MonitorNew {
        config: Option<MonitorConfig>,
        out_null: bool,
    },
    MonitorFree(Handle),
    MonitorConfigDefault {
        out_null: bool,
    },
    AddWorker {
        m: Handle,
        model: Str,
        id: u8,
        spec: Option<Spec>,
    },
    RemoveWorker {
        m: Handle,
        id: u8,
    },
    Report {
        m: Handle,
        id: u8,
        rank: u8,
        report: Option<Report>,
    },
    SetThresholds {
        m: Handle,
        model: Str,
        update: Option<Update>,
        out_null: bool,
    },
    SetSlo {
        m: Handle,
        model: Str,
        slo: Option<(f64, f64, bool)>,
    },
    SloCounts {
        m: Handle,
        model: Str,
        out_null: bool,
    },
    Predict {
        m: Handle,
        id: u8,
        rank: u8,
        prompt: Small,
        out_null: bool,
    },
    GetThresholds {
        m: Handle,
        model: Str,
        out_null: bool,
    },
    SetStaleness {
        m: Handle,
        model: Str,
        policy: u32,
        stale_after_ms: u16,
    },
    Sweep {
        m: Handle,
        out_null: bool,
    },
    IsBusy {
        m: Handle,
        id: u8,
        leased: bool,
        out_null: bool,
    },
    Select {
        m: Handle,
        model: Str,
        policy: u32,
        out_null: bool,
    },
    SelectMinCost {
        m: Handle,
        model: Str,
        cands: Vec<(u8, f64)>,
        null_arrays: bool,
        out_null: bool,
    },
    Check {
        m: Handle,
        id: u8,
        mark: bool,
    },
    MonitorMetrics {
        m: Handle,
        buf: Buf,
        out_null: bool,
    },
}

impl Call {
    /// Makes the call on the input's handles and checks its status,
    /// out-parameters and error message.
    pub fn apply(&self, state: &mut State) {
        match self {
            Call::MonitorNew { config, out_null } => {
                let mut keep = Vec::new();
                let cfg = config.as_ref().map(|c| {
                    let (prefix, prefix_len) =
                        c.prefix.as_ref().map_or((null(), 0), |s| s.raw(&mut keep));
                    lg_monitor_config {
                        lease_ms: u64::from(c.lease_ms),
                        stale_after_ms: u64::from(c.stale_after_ms),
                        staleness: c.staleness % 4,
                        max_workers_per_model: usize::from(c.max_workers % 16),
                        metrics_prefix: prefix.cast(),
                        metrics_prefix_len: prefix_len,
                        max_models: usize::from(c.max_workers % 5),
                        max_workers: usize::from(c.max_workers % 32),
                        max_ranks_per_worker: u32::from(c.max_workers % 9),
                        max_ranks: usize::from(c.max_workers % 64),
                        max_name_len: usize::from(c.max_workers % 24),
                        dynamo_env: c.dynamo_env,
                        routing: u32::from(c.routing % 4),
                        reroutes: u32::from(c.reroutes % 20),
                    }
                });
                let mut out: *mut lg_monitor = dangling();
                // SAFETY: the config is NULL or a local whose prefix comes from `Str::raw`; the
                // out-pointer is NULL or a local.
                let st = checked("lg_monitor_new", unsafe {
                    lg_monitor_new(
                        cfg.as_ref().map_or(null(), |c| c as *const _),
                        if *out_null { null_mut() } else { &mut out },
                    )
                });
                refuses_null("lg_monitor_new", st, *out_null);
                if st == lg_status::LG_OK {
                    assert!(!out.is_null());
                    state.monitors.push(out);
                } else {
                    assert_eq!(out, dangling(), "out_monitor written on failure");
                }
            }
            // SAFETY: `take` removes the handle from `State::monitors` (or gives NULL), so it is
            // freed once and never used again.
            Call::MonitorFree(h) => unsafe { lg_monitor_free(take(&mut state.monitors, *h)) },
            Call::MonitorConfigDefault { out_null } => {
                let mut out = std::mem::MaybeUninit::<lg_monitor_config>::uninit();
                // SAFETY: each out-pointer is NULL or points at a local.
                let st = checked("lg_monitor_config_default", unsafe {
                    lg_monitor_config_default(if *out_null {
                        null_mut()
                    } else {
                        out.as_mut_ptr()
                    })
                });
                refuses_null("lg_monitor_config_default", st, *out_null);
                if st == lg_status::LG_OK {
                    // SAFETY: written on LG_OK; the defaults must be accepted.
                    let config = unsafe { out.assume_init() };
                    let mut m: *mut lg_monitor = null_mut();
                    // SAFETY: `config` was written by `lg_monitor_config_default` and `m` is a
                    // local.
                    let st = checked("lg_monitor_new", unsafe { lg_monitor_new(&config, &mut m) });
                    assert_eq!(st, lg_status::LG_OK, "the default config is refused");
                    state.monitors.push(m);
                }
            }
            Call::AddWorker { m, model, id, spec } => {
                let m = pick(&state.monitors, *m);
                let mut keep = Vec::new();
                let (p, len) = model.raw(&mut keep);
                let spec = spec.as_ref().map(worker_spec);
                // SAFETY: `m` is NULL or a live monitor from `State::monitors`; `(p, len)` comes
                // from `Str::raw`: NULL or valid for `len` bytes; the spec is NULL or a local.
                let st = checked("lg_monitor_add_worker", unsafe {
                    lg_monitor_add_worker(
                        m,
                        p.cast(),
                        len,
                        u64::from(*id % 8),
                        spec.as_ref().map_or(null(), |s| s as *const _),
                    )
                });
                refuses_null("lg_monitor_add_worker", st, m.is_null() || model.invalid());
            }
            Call::RemoveWorker { m, id } => {
                let m = pick(&state.monitors, *m);
                // SAFETY: `m` is NULL or a live monitor from `State::monitors`.
                let st = checked("lg_monitor_remove_worker", unsafe {
                    lg_monitor_remove_worker(m, u64::from(*id % 8))
                });
                refuses_null("lg_monitor_remove_worker", st, m.is_null());
            }
            Call::Report {
                m,
                id,
                rank,
                report,
            } => {
                let m = pick(&state.monitors, *m);
                let r = report.as_ref().map(worker_report);
                // SAFETY: `m` is NULL or a live monitor from `State::monitors`; the report is NULL
                // or a local.
                let st = checked("lg_monitor_report", unsafe {
                    lg_monitor_report(
                        m,
                        u64::from(*id % 8),
                        u32::from(*rank % 5),
                        r.as_ref().map_or(null(), |r| r as *const _),
                    )
                });
                refuses_null("lg_monitor_report", st, m.is_null() || r.is_none());
            }
            Call::SetThresholds {
                m,
                model,
                update,
                out_null,
            } => {
                let m = pick(&state.monitors, *m);
                let mut keep = Vec::new();
                let (p, len) = model.raw(&mut keep);
                let u = update.as_ref().map(|u| lg_threshold_update {
                    has_active_decode_blocks_threshold: u.decode.is_some(),
                    active_decode_blocks_threshold: u.decode.unwrap_or(0.0),
                    has_active_prefill_tokens_threshold: u.abs.is_some(),
                    active_prefill_tokens_threshold: u.abs.map_or(0, |v| v.0),
                    has_active_prefill_tokens_threshold_frac: u.frac.is_some(),
                    active_prefill_tokens_threshold_frac: u.frac.unwrap_or(0.0),
                    clear: u32::from(u.clear % 32),
                    has_waiting_requests_threshold: u.waiting.is_some(),
                    waiting_requests_threshold: u.waiting.map_or(0, |v| v.0),
                });
                let mut out = sentinel_thresholds();
                // SAFETY: `m` is NULL or a live monitor from `State::monitors`; `(p, len)` comes
                // from `Str::raw`: NULL or valid for `len` bytes; the update is NULL or a local;
                // each out-pointer is NULL or points at a local.
                let st = checked("lg_monitor_set_thresholds", unsafe {
                    lg_monitor_set_thresholds(
                        m,
                        p.cast(),
                        len,
                        u.as_ref().map_or(null(), |u| u as *const _),
                        if *out_null { null_mut() } else { &mut out },
                    )
                });
                refuses_null(
                    "lg_monitor_set_thresholds",
                    st,
                    m.is_null() || u.is_none() || model.invalid(),
                );
                if st != lg_status::LG_OK {
                    assert_eq!(out.version, SENTINEL, "thresholds written on failure");
                }
            }
            Call::SetSlo { m, model, slo } => {
                let m = pick(&state.monitors, *m);
                let mut keep = Vec::new();
                let (p, len) = model.raw(&mut keep);
                let raw = slo.map(|(ttft_seconds, tpot_seconds, advisory)| lg_slo {
                    ttft_seconds,
                    tpot_seconds,
                    advisory,
                });
                // SAFETY: `m` is NULL or a live monitor from `State::monitors`; `(p, len)` comes
                // from `Str::raw`: NULL or valid for `len` bytes; the SLO is NULL or a local.
                let st = checked("lg_monitor_set_slo", unsafe {
                    lg_monitor_set_slo(
                        m,
                        p.cast(),
                        len,
                        raw.as_ref().map_or(null(), |s| s as *const _),
                    )
                });
                let fits = |v: f64| v.is_finite() && v > 0.0 && v <= 3600.0;
                let bad = slo.is_some_and(|(a, b, _)| !fits(a) || !fits(b));
                refuses_null(
                    "lg_monitor_set_slo",
                    st,
                    m.is_null() || model.invalid() || bad,
                );
                if st != lg_status::LG_OK && !m.is_null() && !model.invalid() && !bad {
                    assert_eq!(st, lg_status::LG_NOT_FOUND, "{}", last_error());
                }
            }
            Call::Predict {
                m,
                id,
                rank,
                prompt,
                out_null,
            } => {
                let m = pick(&state.monitors, *m);
                let mut out = lg_prediction {
                    ttft_seconds: -1.0,
                    tpot_seconds: -1.0,
                    trusted: false,
                    fit_error: -1.0,
                    ttft_error: -1.0,
                };
                // SAFETY: `m` is NULL or a live monitor from `State::monitors`; the out-pointer is
                // NULL or points at a local.
                let st = checked("lg_monitor_predict", unsafe {
                    lg_monitor_predict(
                        m,
                        u64::from(*id % 8),
                        u32::from(*rank % 5),
                        prompt.0,
                        if *out_null { null_mut() } else { &mut out },
                    )
                });
                refuses_null("lg_monitor_predict", st, m.is_null() || *out_null);
                if st == lg_status::LG_OK {
                    for v in [out.ttft_seconds, out.tpot_seconds] {
                        assert!(v.is_finite() && v >= 0.0, "{out:?}");
                    }
                    for e in [out.fit_error, out.ttft_error] {
                        assert!((0.0..=1.0).contains(&e), "{out:?}");
                    }
                } else {
                    assert_eq!(out.ttft_seconds, -1.0, "prediction written on failure");
                }
            }
            Call::SloCounts { m, model, out_null } => {
                let m = pick(&state.monitors, *m);
                let mut keep = Vec::new();
                let (p, len) = model.raw(&mut keep);
                let mut out = lg_slo_counts {
                    would_admit: u64::MAX,
                    ..Default::default()
                };
                // SAFETY: `m` is NULL or a live monitor from `State::monitors`; `(p, len)` comes
                // from `Str::raw`: NULL or valid for `len` bytes; the out-pointer is NULL or
                // points at a local.
                let st = checked("lg_monitor_slo_counts", unsafe {
                    lg_monitor_slo_counts(
                        m,
                        p.cast(),
                        len,
                        if *out_null { null_mut() } else { &mut out },
                    )
                });
                refuses_null(
                    "lg_monitor_slo_counts",
                    st,
                    m.is_null() || *out_null || model.invalid(),
                );
                if st != lg_status::LG_OK {
                    assert_eq!(out.would_admit, u64::MAX, "counts written on failure");
                }
            }
            Call::GetThresholds { m, model, out_null } => {
                let m = pick(&state.monitors, *m);
                let mut keep = Vec::new();
                let (p, len) = model.raw(&mut keep);
                let mut out = sentinel_thresholds();
                // SAFETY: `m` is NULL or a live monitor from `State::monitors`; `(p, len)` comes
                // from `Str::raw`: NULL or valid for `len` bytes; each out-pointer is NULL or
                // points at a local.
                let st = checked("lg_monitor_get_thresholds", unsafe {
                    lg_monitor_get_thresholds(
                        m,
                        p.cast(),
                        len,
                        if *out_null { null_mut() } else { &mut out },
                    )
                });
                refuses_null(
                    "lg_monitor_get_thresholds",
                    st,
                    m.is_null() || *out_null || model.invalid(),
                );
                if st != lg_status::LG_OK {
                    assert_eq!(out.version, SENTINEL, "thresholds written on failure");
                }
            }
            Call::SetStaleness {
                m,
                model,
                policy,
                stale_after_ms,
            } => {
                let m = pick(&state.monitors, *m);
                let mut keep = Vec::new();
                let (p, len) = model.raw(&mut keep);
                // SAFETY: `m` is NULL or a live monitor from `State::monitors`; `(p, len)` comes
                // from `Str::raw`: NULL or valid for `len` bytes.
                let st = checked("lg_monitor_set_staleness", unsafe {
                    lg_monitor_set_staleness(m, p.cast(), len, *policy, u64::from(*stale_after_ms))
                });
                refuses_null(
                    "lg_monitor_set_staleness",
                    st,
                    m.is_null() || model.invalid() || *policy > 2 || *stale_after_ms == 0,
                );
            }
            Call::Sweep { m, out_null } => {
                let m = pick(&state.monitors, *m);
                let mut out = SENTINEL as usize;
                // SAFETY: `m` is NULL or a live monitor from `State::monitors`; each out-pointer is
                // NULL or points at a local.
                let st = checked("lg_monitor_sweep", unsafe {
                    lg_monitor_sweep(m, if *out_null { null_mut() } else { &mut out })
                });
                refuses_null("lg_monitor_sweep", st, m.is_null());
            }
            Call::IsBusy {
                m,
                id,
                leased,
                out_null,
            } => {
                let m = pick(&state.monitors, *m);
                let mut out = false;
                let out_ptr: *mut bool = if *out_null { null_mut() } else { &mut out };
                let st = if *leased {
                    // SAFETY: `m` is NULL or a live monitor from `State::monitors`; `out_ptr` is
                    // NULL or points at a local.
                    checked("lg_monitor_is_leased", unsafe {
                        lg_monitor_is_leased(m, u64::from(*id % 8), out_ptr)
                    })
                } else {
                    // SAFETY: `m` is NULL or a live monitor from `State::monitors`; `out_ptr` is
                    // NULL or points at a local.
                    checked("lg_monitor_is_busy", unsafe {
                        lg_monitor_is_busy(m, u64::from(*id % 8), out_ptr)
                    })
                };
                refuses_null("lg_monitor_is_busy/leased", st, m.is_null() || *out_null);
            }
            Call::Select {
                m,
                model,
                policy,
                out_null,
            } => {
                let m = pick(&state.monitors, *m);
                let mut keep = Vec::new();
                let (p, len) = model.raw(&mut keep);
                let mut out = SENTINEL;
                // SAFETY: `m` is NULL or a live monitor from `State::monitors`; `(p, len)` comes
                // from `Str::raw`: NULL or valid for `len` bytes; each out-pointer is NULL or
                // points at a local.
                let st = checked("lg_monitor_select", unsafe {
                    lg_monitor_select(
                        m,
                        p.cast(),
                        len,
                        *policy,
                        if *out_null { null_mut() } else { &mut out },
                    )
                });
                refuses_null(
                    "lg_monitor_select",
                    st,
                    m.is_null() || *out_null || model.invalid() || *policy > 2,
                );
                if st != lg_status::LG_OK {
                    assert_eq!(out, SENTINEL, "worker id written on failure");
                }
            }
            Call::SelectMinCost {
                m,
                model,
                cands,
                null_arrays,
                out_null,
            } => {
                let m = pick(&state.monitors, *m);
                let mut keep = Vec::new();
                let (p, len) = model.raw(&mut keep);
                let ids: Vec<u64> = cands.iter().take(16).map(|c| u64::from(c.0 % 10)).collect();
                let costs: Vec<f64> = cands.iter().take(16).map(|c| c.1).collect();
                let (ids_ptr, costs_ptr) = if *null_arrays {
                    (null(), null())
                } else {
                    (ids.as_ptr(), costs.as_ptr())
                };
                let mut out = SENTINEL;
                // SAFETY: `m` is NULL or a live monitor from `State::monitors`; `(p, len)` comes
                // from `Str::raw`: NULL or valid for `len` bytes; `ids` and `costs` are NULL or
                // locals of `ids.len()` elements; each out-pointer is NULL or points at a local.
                let st = checked("lg_monitor_select_min_cost", unsafe {
                    lg_monitor_select_min_cost(
                        m,
                        p.cast(),
                        len,
                        ids_ptr,
                        costs_ptr,
                        ids.len(),
                        if *out_null { null_mut() } else { &mut out },
                    )
                });
                refuses_null(
                    "lg_monitor_select_min_cost",
                    st,
                    m.is_null()
                        || *out_null
                        || model.invalid()
                        || (*null_arrays && !ids.is_empty()),
                );
                if st == lg_status::LG_OK {
                    assert!(ids.contains(&out), "picked {out}, not a candidate");
                } else {
                    assert_eq!(out, SENTINEL, "worker id written on failure");
                }
            }
            Call::Check { m, id, mark } => {
                let m = pick(&state.monitors, *m);
                let st = if *mark {
                    // SAFETY: `m` is NULL or a live monitor from `State::monitors`.
                    checked("lg_monitor_mark_overloaded", unsafe {
                        lg_monitor_mark_overloaded(m, u64::from(*id % 8))
                    })
                } else {
                    // SAFETY: `m` is NULL or a live monitor from `State::monitors`.
                    checked("lg_monitor_check", unsafe {
                        lg_monitor_check(m, u64::from(*id % 8))
                    })
                };
                refuses_null("lg_monitor_check/mark", st, m.is_null());
            }
            Call::MonitorMetrics {
                m,
                buf: b,
                out_null,
            } => {
                let m = pick(&state.monitors, *m);
                let mut buf = text_buf(*b);
                let (bp, bl) = buf_ptr(*b, &mut buf);
                let mut needed = SENTINEL as usize;
                // SAFETY: `m` is NULL or a live monitor from `State::monitors`; `(bp, bl)` is NULL
                // or a local buffer of `bl` bytes; each out-pointer is NULL or points at a local.
                let st = checked("lg_monitor_metrics", unsafe {
                    lg_monitor_metrics(m, bp, bl, if *out_null { null_mut() } else { &mut needed })
                });
                refuses_null(
                    "lg_monitor_metrics",
                    st,
                    m.is_null() || *out_null || (bp.is_null() && bl > 0),
                );
                if !*out_null {
                    check_text("lg_monitor_metrics", st, &buf, *b, needed);
                }
            }
        }
    }
}
