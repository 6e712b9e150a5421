//! The scenarios: each a workload shape (rates in units of `C*`) and the
//! conditions it runs under, the matrix's evaluation cells and the
//! calibration scenario the arms are tuned on.

use serde::Serialize;

use crate::shift::Shift;
use crate::sim::Conditions;
use crate::workload::{Arrivals, Client, Retry, WorkloadSpec};

/// One scenario: a workload shape (rates in units of `C*`) and conditions.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Scenario {
    /// Name, unique in the matrix.
    pub name: String,
    /// Group: `steady`, `bursty`, `step`, `spike`, `stale`, `tenants`.
    pub group: &'static str,
    /// Offered load (the highest of the profile) in units of `C*`.
    pub load: f64,
    /// Rate profile in units of `C*`.
    pub profile: Vec<(f64, f64)>,
    /// Arrivals stop here, seconds.
    pub duration_s: f64,
    /// Gap distribution.
    pub arrivals: Arrivals,
    /// Tenants' shares.
    pub tenants: Vec<f64>,
    /// Clients.
    pub client: Client,
    /// Report interval and transport delay, seconds, if not the default.
    pub signal_lag_s: Option<f64>,
    /// The time after which settling or recovery is measured, seconds.
    pub change_at_s: Option<f64>,
    /// Off calibration: how the workload or the fleet moved (`shift.rs`);
    /// its loads are in units of its own `C*`.
    pub shift: Option<Shift>,
}

impl Scenario {
    /// The workload of this scenario at `C*` = `capacity`, seeded.
    pub fn workload(&self, capacity: f64, seed: u64) -> WorkloadSpec {
        let mut w = WorkloadSpec::steady(1.0, self.duration_s, seed);
        w.profile = self
            .profile
            .iter()
            .map(|&(t, x)| (t, x * capacity))
            .collect();
        w.arrivals = self.arrivals;
        w.tenants = self.tenants.clone();
        w.client = self.client;
        if let Some(shift) = self.shift {
            shift.apply_workload(&mut w);
        }
        w
    }

    /// The fleet and signal conditions of this scenario from `base`.
    pub fn conditions(&self, base: &Conditions) -> Conditions {
        let mut c = *base;
        if let Some(lag) = self.signal_lag_s {
            c.report_interval_s = lag;
            c.transport_delay_s = lag / 2.0;
        }
        if let Some(shift) = self.shift {
            shift.apply_conditions(&mut c);
        }
        c
    }
}

/// Every scenario of the matrix.
pub fn scenarios(quick: bool) -> Vec<Scenario> {
    let (steady_s, loads): (f64, &[f64]) = if quick {
        (20.0, &[0.5, 1.0, 2.0, 4.0, 10.0])
    } else {
        (40.0, &[0.5, 0.8, 1.0, 1.2, 1.5, 2.0, 3.0, 4.0, 10.0])
    };
    let base = |name: String, group, load, profile, duration_s| Scenario {
        name,
        group,
        load,
        profile,
        duration_s,
        arrivals: Arrivals::Poisson,
        tenants: vec![1.0],
        client: Client::default(),
        signal_lag_s: None,
        change_at_s: None,
        shift: None,
    };
    let mut out = Vec::new();
    for &x in loads {
        out.push(base(
            format!("steady {x}x"),
            "steady",
            x,
            vec![(0.0, x)],
            steady_s,
        ));
    }
    for x in [1.2, 2.0] {
        out.push(Scenario {
            arrivals: Arrivals::Gamma { burstiness: 0.25 },
            ..base(
                format!("bursty {x}x"),
                "bursty",
                x,
                vec![(0.0, x)],
                steady_s,
            )
        });
    }
    let t = if quick { 15.0 } else { 30.0 };
    out.push(Scenario {
        change_at_s: Some(t),
        ..base(
            "step 1.0x to 1.4x".into(),
            "step",
            1.4,
            vec![(0.0, 1.0), (t, 1.4)],
            3.0 * t,
        )
    });
    let spike = if quick { 10.0 } else { 30.0 };
    for (name, retry) in [
        ("after Retry-After", Retry::AfterRetryAfter),
        ("at once", Retry::Immediate),
        (
            "adaptive throttling",
            Retry::Adaptive {
                k: 2.0,
                window_s: 120.0,
            },
        ),
    ] {
        out.push(Scenario {
            client: Client {
                retry,
                ..Client::default()
            },
            change_at_s: Some(t + spike),
            ..base(
                format!("spike 0.8x to 4x, retry {name}"),
                "spike",
                4.0,
                vec![(0.0, 0.8), (t, 4.0), (t + spike, 0.8)],
                t + spike + 2.0 * t,
            )
        });
    }
    let lags: &[f64] = if quick {
        &[1.0]
    } else {
        &[0.2, 0.5, 1.0, 2.0, 5.0]
    };
    for &lag in lags {
        out.push(Scenario {
            signal_lag_s: Some(lag),
            ..base(
                format!("stale signals {lag} s, 2x"),
                "stale",
                2.0,
                vec![(0.0, 2.0)],
                steady_s,
            )
        });
    }
    out.push(Scenario {
        tenants: vec![10.0, 1.0, 1.0],
        ..base(
            "three tenants (10:1:1), 2x".into(),
            "tenants",
            2.0,
            vec![(0.0, 2.0)],
            steady_s,
        )
    });
    let shifted: &[f64] = if quick { &[4.0] } else { &[2.0, 4.0, 10.0] };
    for shift in Shift::ALL {
        for &x in shifted {
            out.push(Scenario {
                shift: Some(shift),
                ..base(
                    format!("{} {x}x", shift.name()),
                    "shifted",
                    x,
                    vec![(0.0, x)],
                    steady_s,
                )
            });
        }
    }
    out
}

/// The calibration scenario: Poisson load stepping through 1.5, 3 and 6 ×
/// `C*`, a third of the run each (no evaluation cell has that shape).
pub fn calibration(quick: bool) -> Scenario {
    let third = if quick { 7.0 } else { 20.0 };
    Scenario {
        name: "calibration: 1.5x, 3x, 6x".into(),
        group: "calibration",
        load: 6.0,
        profile: vec![(0.0, 1.5), (third, 3.0), (2.0 * third, 6.0)],
        duration_s: 3.0 * third,
        arrivals: Arrivals::Poisson,
        tenants: vec![1.0],
        client: Client::default(),
        signal_lag_s: None,
        change_at_s: None,
        shift: None,
    }
}
