//! [`StepFit`]: one rank's engine step time, fitted online from what a
//! frontend sees.
//!
//! An engine step (one forward pass of a continuous-batching engine) takes
//! about `a + b·P + c·R + d·K` seconds, where `P` is the prompt tokens it
//! prefills, `R` the sequences running in it and `K` the context tokens
//! they hold (the shape of Dynamo's planner's iteration model and of the
//! mocker's step time, linearised). A frontend observes steps without
//! asking the engine: a streamed answer's gap between two tokens is one
//! step of its rank, under the load the frontend books there; an engine's
//! own iteration metrics are steps too.
//!
//! The fit is recursive least squares with exponential forgetting (each
//! observation's weight decays by `FORGET` per later one, so it follows a
//! workload that shifts within a few hundred steps), in fixed memory (a
//! 4×4 covariance and four coefficients). It is made robust three ways:
//!
//! * **Bounded input.** A step time that is not finite, not positive or
//!   longer than [`MAX_STEP`], or a load that is not finite, negative or
//!   past [`MAX_LOAD`], is refused and counted; nothing changes.
//! * **Outliers set aside, changes followed.** Once settled, an
//!   observation whose residual passes `REJECT` (8) times the running scale
//!   of residuals is set aside and counted (a stall, a preemption, a bad
//!   report). When a quarter of the recent observations are such (smoothed
//!   over about 20), the rank itself changed (a slower engine, another
//!   workload, or a part of the load the fit had wrong, such as prefill
//!   when most steps only decode): the fit restarts its covariance from the
//!   current coefficients and takes the next `FOLLOW` (20) observations
//!   whole, so it re-converges within tens of steps. A stall in twenty
//!   never passes the quarter. Between `HUBER` (3) and `REJECT` scales a
//!   residual counts with Huber's weight `HUBER·scale/|r|`.
//! * **Physical coefficients.** Each coefficient is kept non-negative (a
//!   step never gets faster with more work), and the covariance's diagonal
//!   is capped at its initial value, so a long spell of identical loads
//!   (no excitation) cannot wind it up into a jump at the next change.
//!
//! The fit is trusted ([`StepFit::trusted`]) once it has [`MIN_SAMPLES`]
//! observations and its running relative error is at most
//! [`MAX_RELATIVE_ERROR`]; until then, and whenever it stops fitting, a
//! caller keeps its static limits.

/// Longest step accepted (s): one step of a real engine takes milliseconds
/// to a few seconds.
pub const MAX_STEP: f64 = 60.0;
/// Largest load feature accepted (tokens or sequences).
pub const MAX_LOAD: f64 = 1e9;
/// Observations before the fit is trusted.
pub const MIN_SAMPLES: u64 = 32;
/// Largest running relative error of a trusted fit.
pub const MAX_RELATIVE_ERROR: f64 = 0.35;

/// Forgetting per observation: an observation 230 steps old weighs a
/// tenth of a new one.
const FORGET: f64 = 0.99;
/// Huber's threshold, in running residual scales.
const HUBER: f64 = 3.0;
/// Past this many running residual scales, an observation of a settled fit
/// is set aside as an outlier...
const REJECT: f64 = 8.0;
/// ...unless this share of the recent ones (smoothed over about 20) were:
/// then the rank changed, and the fit follows it afresh...
const SHIFT_RATE: f64 = 0.25;
/// ...taking this many observations whole (Huber-weighted) before it sets
/// outliers aside again.
const FOLLOW: u32 = 20;
/// The covariance's initial diagonal: a weak prior.
const PRIOR: f64 = 1e3;
/// Feature scales, so that the four coefficients are of like size: a
/// prefill chunk of 1,024 tokens, 64 sequences, 65,536 context tokens.
const SCALE: [f64; 4] = [1.0, 1024.0, 64.0, 65_536.0];
/// Smoothing of the running residual scale and relative error.
const SMOOTH: f64 = 0.05;

/// What one step carried.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct StepLoad {
    /// Prompt tokens prefilled in the step.
    pub prefill_tokens: f64,
    /// Sequences running (decoding) in it.
    pub running: f64,
    /// Context tokens those sequences hold.
    pub kv_tokens: f64,
}

impl StepLoad {
    fn features(&self) -> Option<[f64; 4]> {
        let raw = [1.0, self.prefill_tokens, self.running, self.kv_tokens];
        let ok = raw
            .iter()
            .all(|v| v.is_finite() && (0.0..=MAX_LOAD).contains(v));
        ok.then(|| std::array::from_fn(|i| raw[i] / SCALE[i]))
    }
}

/// Why an observation was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// The step time was not finite, not positive, or past [`MAX_STEP`].
    StepTime,
    /// A load feature was not finite, negative, or past [`MAX_LOAD`].
    Load,
}

/// One rank's online step-time model (module docs).
#[derive(Debug, Clone, PartialEq)]
pub struct StepFit {
    theta: [f64; 4],
    p: [[f64; 4]; 4],
    scale: f64,
    error: f64,
    samples: u64,
    refused: u64,
    outliers: u64,
    /// The share of recent observations past `REJECT` scales (smoothed).
    outlier_rate: f64,
    /// Observations still to take whole after a change (`FOLLOW`).
    following: u32,
}

impl Default for StepFit {
    fn default() -> Self {
        Self::new()
    }
}

/// The initial covariance: the prior on each coefficient, no correlation.
fn prior() -> [[f64; 4]; 4] {
    std::array::from_fn(|i| std::array::from_fn(|j| if i == j { PRIOR } else { 0.0 }))
}

impl StepFit {
    /// A fit with no observations.
    pub fn new() -> Self {
        Self {
            theta: [0.0; 4],
            p: prior(),
            scale: 0.0,
            error: 1.0,
            samples: 0,
            refused: 0,
            outliers: 0,
            outlier_rate: 0.0,
            following: 0,
        }
    }

    /// Adds one observed step of `seconds` carrying `load`. A refused
    /// observation changes nothing but the refusal count.
    pub fn observe(&mut self, load: &StepLoad, seconds: f64) -> Result<(), Refused> {
        if !(seconds.is_finite() && seconds > 0.0 && seconds <= MAX_STEP) {
            self.refused += 1;
            return Err(Refused::StepTime);
        }
        let Some(x) = load.features() else {
            self.refused += 1;
            return Err(Refused::Load);
        };
        let predicted = dot(&self.theta, &x);
        let residual = seconds - predicted;
        // The running scale of residuals, floored at 1 % of the step.
        let scale = self.scale.max(0.01 * seconds);
        let settled = self.samples >= MIN_SAMPLES && self.following == 0;
        let far = residual.abs() > REJECT * scale;
        self.outlier_rate += SMOOTH * (f64::from(u8::from(far)) - self.outlier_rate);
        if settled && far {
            if self.outlier_rate < SHIFT_RATE {
                // A stall or a bad report: set aside, counted.
                self.outliers += 1;
                return Ok(());
            }
            // Too many of them: the rank changed. Start the covariance
            // afresh from the current coefficients, and take the next
            // observations whole while the fit and its scale follow.
            self.p = prior();
            self.following = FOLLOW;
            self.outlier_rate = 0.0;
        }
        self.following = self.following.saturating_sub(1);
        // Huber's weight (the first observations count whole while the
        // scale forms).
        let weight = if self.samples >= 4 && residual.abs() > HUBER * scale {
            HUBER * scale / residual.abs()
        } else {
            1.0
        };
        // Weighted RLS with forgetting.
        let px: [f64; 4] = std::array::from_fn(|i| dot(&self.p[i], &x));
        let denominator = FORGET + weight * dot(&x, &px);
        let gain: [f64; 4] = std::array::from_fn(|i| weight * px[i] / denominator);
        for (t, g) in self.theta.iter_mut().zip(gain) {
            *t = (*t + g * residual).max(0.0);
        }
        for (row, g) in self.p.iter_mut().zip(gain) {
            for (v, pxj) in row.iter_mut().zip(px) {
                *v = (*v - g * pxj) / FORGET;
            }
        }
        // Symmetric, and the diagonal never past the prior (no windup).
        for i in 0..4 {
            for j in 0..i {
                let v = 0.5 * (self.p[i][j] + self.p[j][i]);
                (self.p[i][j], self.p[j][i]) = (v, v);
            }
            if self.p[i][i] > PRIOR {
                let shrink = (PRIOR / self.p[i][i]).sqrt();
                for k in 0..4 {
                    self.p[i][k] *= shrink;
                    self.p[k][i] *= shrink;
                }
            }
        }
        // The relative error of the prediction made before this step.
        let relative = (residual.abs() / seconds).min(1.0);
        if self.samples == 0 {
            (self.scale, self.error) = (residual.abs(), relative);
        } else {
            self.scale += SMOOTH * (residual.abs().min(HUBER * scale) - self.scale);
            self.error += SMOOTH * (relative - self.error);
        }
        self.samples += 1;
        Ok(())
    }

    /// The predicted time (s) of a step carrying `load`, or `None` for a
    /// load out of bounds.
    pub fn predict(&self, load: &StepLoad) -> Option<f64> {
        load.features().map(|x| dot(&self.theta, &x))
    }

    /// Whether the fit may be used: enough observations, and its running
    /// relative error within [`MAX_RELATIVE_ERROR`].
    pub fn trusted(&self) -> bool {
        self.samples >= MIN_SAMPLES && self.error <= MAX_RELATIVE_ERROR
    }

    /// The running relative error of its predictions (|predicted −
    /// observed| / observed, smoothed over about 20 observations).
    pub fn relative_error(&self) -> f64 {
        self.error
    }

    /// The coefficients: seconds per step, per prefill token, per running
    /// sequence and per context token.
    pub fn coefficients(&self) -> [f64; 4] {
        std::array::from_fn(|i| self.theta[i] / SCALE[i])
    }

    /// Observations used so far.
    pub fn samples(&self) -> u64 {
        self.samples
    }

    /// Observations refused so far.
    pub fn refused(&self) -> u64 {
        self.refused
    }

    /// Observations set aside as outliers so far.
    pub fn outliers(&self) -> u64 {
        self.outliers
    }
}

fn dot(a: &[f64; 4], b: &[f64; 4]) -> f64 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}
