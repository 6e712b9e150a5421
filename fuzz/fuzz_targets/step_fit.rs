//! The SLO step-time fit (`loadgate::slo::StepFit`) under hostile
//! observations: a sequence of steps whose times and loads are anything a
//! broken engine or a hostile publisher could send (NaN, infinities,
//! negatives, zero, an hour, loads past any engine, sudden jumps), mixed
//! with plausible ones.
//!
//! After every observation: an invalid one is refused with the reason it
//! calls for and changes nothing else; the coefficients and every
//! prediction within bounds stay finite and non-negative; the running
//! error stays within [0, 1]; a trusted fit has its minimum of samples and
//! an error within the limit.
#![no_main]

use libfuzzer_sys::arbitrary::{self, Unstructured};
use libfuzzer_sys::fuzz_target;
use loadgate::slo::{
    Refused, StepFit, StepLoad, MAX_LOAD, MAX_RELATIVE_ERROR, MAX_STEP, MIN_SAMPLES,
};

/// A value biased towards the fit's boundaries and the hostile ones.
fn value(u: &mut Unstructured<'_>, plausible: f64) -> arbitrary::Result<f64> {
    Ok(match u.arbitrary::<u8>()? {
        0..=159 => plausible * (0.5 + f64::from(u.arbitrary::<u16>()?) / 65_536.0),
        160..=169 => f64::NAN,
        170..=174 => f64::INFINITY,
        175..=179 => f64::NEG_INFINITY,
        180..=189 => -plausible,
        190..=199 => 0.0,
        200..=209 => MAX_STEP.max(MAX_LOAD) * 2.0,
        210..=219 => f64::MIN_POSITIVE,
        _ => f64::from_bits(u.arbitrary()?),
    })
}

fuzz_target!(|data: &[u8]| {
    let mut u = Unstructured::new(data);
    let mut fit = StepFit::new();
    let mut speed = 1.0;
    while !u.is_empty() {
        let Ok(kind) = u.arbitrary::<u8>() else {
            return;
        };
        if kind < 8 {
            // The rank changes speed.
            speed = [0.25, 0.5, 1.0, 2.0, 4.0][usize::from(kind % 5)];
            continue;
        }
        let (Ok(prefill), Ok(running), Ok(kv)) = (
            value(&mut u, 2048.0),
            value(&mut u, 64.0),
            value(&mut u, 60_000.0),
        ) else {
            return;
        };
        let load = StepLoad {
            prefill_tokens: prefill,
            running,
            kv_tokens: kv,
        };
        let honest = (0.006 + 15e-6 * prefill + 20e-6 * running + 1e-7 * kv) / speed;
        let Ok(seconds) = value(
            &mut u,
            if honest.is_finite() {
                honest.max(1e-4)
            } else {
                0.01
            },
        ) else {
            return;
        };
        let before = fit.clone();
        let valid_time = seconds.is_finite() && seconds > 0.0 && seconds <= MAX_STEP;
        let valid_load = [prefill, running, kv]
            .iter()
            .all(|v| v.is_finite() && (0.0..=MAX_LOAD).contains(v));
        match fit.observe(&load, seconds) {
            Ok(()) => assert!(valid_time && valid_load),
            Err(reason) => {
                assert_eq!(
                    reason,
                    if valid_time {
                        Refused::Load
                    } else {
                        Refused::StepTime
                    }
                );
                assert_eq!(fit.refused(), before.refused() + 1);
                assert_eq!(fit.samples(), before.samples());
                assert_eq!(fit.coefficients(), before.coefficients());
                assert_eq!(fit.reach(), before.reach());
            }
        }
        // The reach is loads the fit took: within what it accepts.
        assert!(fit
            .reach()
            .iter()
            .all(|r| r.is_finite() && (0.0..=MAX_LOAD).contains(r)));
        assert!(fit
            .coefficients()
            .iter()
            .all(|c| c.is_finite() && *c >= 0.0));
        match fit.predict(&load) {
            Some(p) => assert!(valid_load && p.is_finite() && p >= 0.0),
            None => assert!(!valid_load),
        }
        let e = fit.relative_error();
        assert!((0.0..=1.0).contains(&e), "{e}");
        if fit.trusted() {
            assert!(fit.samples() >= MIN_SAMPLES && e <= MAX_RELATIVE_ERROR);
        }
    }
});
