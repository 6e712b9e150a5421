//! The step-time fit against known step functions: it converges, follows
//! a shift, shrugs off outliers and refuses what no engine reports; and
//! the SLO's bounds.

use super::*;

/// A deterministic stream of varied loads (xorshift), so a test needs no
/// random crate and always sees the same sequence.
struct Loads(u64);

impl Loads {
    fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    fn next(&mut self) -> StepLoad {
        let prefill = if self.unit() < 0.3 {
            (self.unit() * 8192.0).floor()
        } else {
            0.0
        };
        let running = (1.0 + self.unit() * 255.0).floor();
        StepLoad {
            prefill_tokens: prefill,
            running,
            kv_tokens: running * (200.0 + self.unit() * 1800.0).floor(),
        }
    }
}

/// A step of an 8B model on one GPU, linearised: 6 ms, 15 µs a prompt
/// token, 20 µs a sequence, 0.1 µs a context token.
fn engine(load: &StepLoad, speed: f64) -> f64 {
    (0.006 + 15e-6 * load.prefill_tokens + 20e-6 * load.running + 1e-7 * load.kv_tokens) / speed
}

fn close(got: f64, want: f64, tolerance: f64) -> bool {
    (got - want).abs() <= tolerance * want.abs()
}

#[test]
fn the_fit_converges_on_a_known_step_function_and_predicts_it() {
    let mut fit = StepFit::new();
    let mut loads = Loads(7);
    for i in 0..2_000 {
        let load = loads.next();
        // ±2 % noise.
        let noise = 1.0 + 0.04 * (loads.unit() - 0.5);
        fit.observe(&load, engine(&load, 1.0) * noise).unwrap();
        assert_eq!(
            fit.trusted(),
            i + 1 >= MIN_SAMPLES as usize && fit.relative_error() <= MAX_RELATIVE_ERROR
        );
    }
    assert!(fit.trusted(), "error {}", fit.relative_error());
    assert!(
        fit.relative_error() < 0.05,
        "error {}",
        fit.relative_error()
    );
    // The engine is linear: the square adds at most the noise (2 % of a
    // step with a full budget of 8,192 prompt tokens, about 0.13 s).
    let c = fit.coefficients();
    assert!(c[2] * 8192.0 * 8192.0 < 2.6e-3, "{c:?}");
    let want = [0.006, 15e-6, 20e-6, 1e-7];
    for (got, want) in [c[0], c[1], c[3], c[4]].iter().zip(want) {
        assert!(close(*got, want, 0.1), "{c:?}");
    }
    for _ in 0..100 {
        let load = loads.next();
        let p = fit.predict(&load).unwrap();
        assert!(close(p, engine(&load, 1.0), 0.05), "{p} for {load:?}");
    }
}

#[test]
fn a_prefill_of_the_second_degree_is_fitted_so_a_step_full_of_prompts_is_predicted() {
    // Attention over the prompt: the mocker's prefill is of the second
    // degree in the step's prompt tokens. Here the steps carry up to 2,048;
    // a step that fills the budget of 8,192 (a deep queue's) is predicted
    // from them, and a line through them predicts it over a third short.
    let quadratic = |l: &StepLoad| engine(l, 1.0) + 2e-9 * l.prefill_tokens * l.prefill_tokens;
    let mut fit = StepFit::new();
    let mut loads = Loads(5);
    for _ in 0..2_000 {
        let mut load = loads.next();
        load.prefill_tokens = (load.prefill_tokens / 4.0).floor();
        fit.observe(&load, quadratic(&load)).unwrap();
    }
    assert!(
        close(fit.coefficients()[2], 2e-9, 0.1),
        "{:?}",
        fit.coefficients()
    );
    for _ in 0..50 {
        let load = StepLoad {
            prefill_tokens: 8192.0,
            ..loads.next()
        };
        let p = fit.predict(&load).unwrap();
        assert!(close(p, quadratic(&load), 0.02), "{p} for {load:?}");
    }
}

#[test]
fn a_slower_engine_is_followed_within_tens_of_steps() {
    let mut fit = StepFit::new();
    let mut loads = Loads(11);
    for _ in 0..1_000 {
        let load = loads.next();
        fit.observe(&load, engine(&load, 1.0)).unwrap();
    }
    // The same rank, now at half speed: within 40 steps the predictions
    // are the new engine's (a few set aside as outliers first).
    for _ in 0..40 {
        let load = loads.next();
        fit.observe(&load, engine(&load, 0.5)).unwrap();
    }
    for _ in 0..50 {
        let load = loads.next();
        let p = fit.predict(&load).unwrap();
        assert!(close(p, engine(&load, 0.5), 0.1), "{p} for {load:?}");
    }
    assert!(fit.trusted());
}

#[test]
fn outliers_move_the_fit_little_and_bad_observations_change_nothing() {
    let mut fit = StepFit::new();
    let mut loads = Loads(3);
    for i in 0..3_000 {
        let load = loads.next();
        // One step in 20 is a stall a hundred times as long (a preemption,
        // a host hiccup, a clock jump).
        let stall = if i % 20 == 19 { 100.0 } else { 1.0 };
        fit.observe(&load, (engine(&load, 1.0) * stall).min(MAX_STEP))
            .unwrap();
    }
    for _ in 0..100 {
        let load = loads.next();
        let p = fit.predict(&load).unwrap();
        assert!(close(p, engine(&load, 1.0), 0.02), "{p} for {load:?}");
    }
    assert!(fit.trusted(), "error {}", fit.relative_error());
    // Each stall after the fit settled was set aside.
    assert!((145..=150).contains(&fit.outliers()), "{}", fit.outliers());
    let before = fit.clone();
    let good = loads.next();
    for bad in [f64::NAN, f64::INFINITY, -0.01, 0.0, MAX_STEP * 2.0, 3600.0] {
        assert_eq!(fit.observe(&good, bad), Err(Refused::StepTime), "{bad}");
    }
    for load in [
        StepLoad {
            prefill_tokens: f64::NAN,
            ..good
        },
        StepLoad {
            running: -1.0,
            ..good
        },
        StepLoad {
            kv_tokens: f64::INFINITY,
            ..good
        },
        StepLoad {
            kv_tokens: MAX_LOAD * 2.0,
            ..good
        },
    ] {
        assert_eq!(fit.observe(&load, 0.01), Err(Refused::Load));
        assert_eq!(fit.predict(&load), None);
    }
    assert_eq!(fit.refused(), before.refused() + 10);
    assert_eq!(fit.coefficients(), before.coefficients());
    assert_eq!(fit.samples(), before.samples());
}

#[test]
fn a_rank_whose_times_make_no_sense_is_not_trusted() {
    let mut fit = StepFit::new();
    let mut loads = Loads(5);
    // Times unrelated to the load: a publisher reporting noise.
    for _ in 0..500 {
        let load = loads.next();
        fit.observe(&load, 0.001 + loads.unit() * 2.0).unwrap();
    }
    assert!(!fit.trusted(), "error {}", fit.relative_error());
    // Fewer than MIN_SAMPLES good ones are not enough either.
    let mut young = StepFit::new();
    for _ in 0..MIN_SAMPLES - 1 {
        let load = loads.next();
        young.observe(&load, engine(&load, 1.0)).unwrap();
    }
    assert!(!young.trusted());
}

#[test]
fn the_fit_stays_finite_and_non_negative_under_any_observations() {
    // Extreme but accepted values, in every order.
    let mut fit = StepFit::new();
    let mut loads = Loads(9);
    let extremes = [f64::MIN_POSITIVE, 1e-9, MAX_STEP, 0.5];
    for i in 0..5_000u64 {
        let load = if i % 7 == 0 {
            StepLoad {
                prefill_tokens: MAX_LOAD,
                running: 0.0,
                kv_tokens: MAX_LOAD,
            }
        } else if i % 11 == 0 {
            StepLoad::default()
        } else {
            loads.next()
        };
        let seconds = extremes[(loads.next_u64() % 4) as usize];
        fit.observe(&load, seconds).unwrap();
        let c = fit.coefficients();
        assert!(
            c.iter().all(|v| v.is_finite() && *v >= 0.0),
            "{c:?} after {i}"
        );
        let p = fit.predict(&loads.next()).unwrap();
        assert!(p.is_finite() && p >= 0.0);
        assert!(fit.relative_error().is_finite());
    }
}

#[test]
fn an_slo_is_checked_field_by_field() {
    let slo = Slo::from_secs(2.0, 0.1).unwrap();
    assert_eq!((slo.ttft.as_secs_f64(), slo.tpot.as_secs_f64()), (2.0, 0.1));
    for (ttft, tpot, field) in [
        (f64::NAN, 0.1, "ttft"),
        (0.0, 0.1, "ttft"),
        (-1.0, 0.1, "ttft"),
        (3601.0, 0.1, "ttft"),
        (2.0, f64::INFINITY, "tpot"),
        (2.0, 0.0, "tpot"),
        (2.0, 1e12, "tpot"),
    ] {
        let e = Slo::from_secs(ttft, tpot).unwrap_err();
        assert!(
            matches!(e, SloError::OutOfRange { field: f, .. } if f == field),
            "{e}"
        );
        assert!(e.to_string().starts_with(field), "{e}");
    }
}

#[test]
fn the_reach_is_the_most_load_the_fit_took_lately_and_not_its_outliers() {
    let mut fit = StepFit::new();
    let at = |running: f64| StepLoad {
        prefill_tokens: 0.0,
        running,
        kv_tokens: running * 1000.0,
    };
    // Up to 39 sequences, the last step at 39.
    for i in 0..210 {
        let load = at(10.0 + (i % 30) as f64);
        fit.observe(&load, engine(&load, 1.0)).unwrap();
    }
    assert_eq!(fit.reach(), [39.0, 39_000.0]);
    // A stall at a load past it is set aside, and teaches no reach.
    let far = at(100.0);
    fit.observe(&far, 5.0).unwrap();
    assert_eq!(fit.outliers(), 1);
    assert_eq!(fit.reach(), [39.0, 39_000.0]);
    // A load that falls is followed down as the fit forgets the old one
    // (by 1 % an observation): 39 × 0.99⁵⁰ ≈ 23.6 after 50 more, and the
    // load itself once that falls under it.
    let low = at(10.0);
    for _ in 0..50 {
        fit.observe(&low, engine(&low, 1.0)).unwrap();
    }
    let [running, kv] = fit.reach();
    assert!((23.0..24.0).contains(&running), "{running}");
    assert!((23_000.0..24_000.0).contains(&kv), "{kv}");
    for _ in 0..100 {
        fit.observe(&low, engine(&low, 1.0)).unwrap();
    }
    assert_eq!(fit.reach(), [10.0, 10_000.0]);
}
