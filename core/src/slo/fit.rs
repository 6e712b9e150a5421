//! [`StepFit`]: one rank's engine step time, fitted online from what a
//! frontend sees.
//!
//! An engine step (one forward pass of a continuous-batching engine) takes
//! about `a + b·P + q·P² + c·R + d·K` seconds, where `P` is the prompt
//! tokens it prefills, `R` the sequences running in it and `K` the context
//! tokens they hold (the shape of Dynamo's planner's iteration model and of
//! the mocker's step time: its prefill is a polynomial of the second degree
//! in the step's prompt tokens, as attention over them is; its decode
//! linearised). The square matters where it is largest: a step that fills
//! the batch budget with prefill, which is what a deep queue of prompts
//! costs per step, would be predicted short by a line through the smaller
//! prefills most steps carry. A frontend observes steps without
//! asking the engine: a streamed answer's gap between two tokens is one
//! step of its rank, under the load the frontend books there; an engine's
//! own iteration metrics are steps too.
//!
//! The fit is recursive least squares with exponential forgetting (each
//! observation's weight decays by `FORGET` per later one, so it follows a
//! workload that shifts within a few hundred steps), in fixed memory (a
//! 5×5 covariance and five coefficients). It is made robust three ways:
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
//! The fit knows how far it has seen ([`StepFit::reach`]: the most running
//! sequences and context tokens of the steps it took, decaying as their
//! weights do), so that its user can tell a prediction within what it saw
//! from an extrapolation past it.
//!
//! The fit is trusted ([`StepFit::trusted`]) once it has [`MIN_SAMPLES`]
//! observations and its running relative error is at most
//! [`MAX_RELATIVE_ERROR`]: its predictions are shown, and timed against
//! what is observed, only then. The monitor's verdict uses it sooner, from
//! its [`GUARD_SAMPLES`]th observation, trusted or not, with headroom that
//! grows with its error, so a rank whose fit fits badly is held back more,
//! not left unheld: until a fit guards it, nothing holds a rank's time per
//! output token, and the answers it admits meanwhile keep the batch they
//! joined (and miss their target) for as long as they stream.

/// Longest step accepted (s): one step of a real engine takes milliseconds
/// to a few seconds.
pub const MAX_STEP: f64 = 60.0;
/// Largest load feature accepted (tokens or sequences).
pub const MAX_LOAD: f64 = 1e9;
/// Observations before the fit is trusted.
pub const MIN_SAMPLES: u64 = 32;
/// Observations before the monitor's verdict uses the fit, trusted or not
/// (with headroom from its error; module docs).
pub const GUARD_SAMPLES: u64 = 16;
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
/// What a change of the rank leaves of the old rank's weight.
const SHIFT_KEEP: f64 = 0.01;
/// Ridge on the normal equations, relative to their trace: keeps the solve
/// defined while a feature has not varied (no excitation).
const RIDGE: f64 = 1e-6;
/// The features: one, prefill tokens, their square, running sequences,
/// context tokens.
const N: usize = 5;
/// Feature scales, so that the coefficients are of like size: a prefill
/// chunk of 1,024 tokens (and its square), 64 sequences, 65,536 context
/// tokens.
const SCALE: [f64; N] = [1.0, 1024.0, 1024.0 * 1024.0, 64.0, 65_536.0];
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
    /// The scaled features, `None` for a load out of bounds (each given
    /// value is checked; the square follows from a checked one).
    fn features(&self) -> Option<[f64; N]> {
        let given = [self.prefill_tokens, self.running, self.kv_tokens];
        let ok = given
            .iter()
            .all(|v| v.is_finite() && (0.0..=MAX_LOAD).contains(v));
        let p = self.prefill_tokens;
        let raw = [1.0, p, p * p, self.running, self.kv_tokens];
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
    /// The fitted coefficients, on the scaled features.
    theta: [f64; N],
    /// The weighted, forgetting sums `Σ w·x·xᵀ` and `Σ w·x·y`.
    xtx: [[f64; N]; N],
    xty: [f64; N],
    scale: f64,
    error: f64,
    samples: u64,
    refused: u64,
    outliers: u64,
    /// The share of recent observations past `REJECT` scales (smoothed).
    outlier_rate: f64,
    /// Observations still to take whole after a change (`FOLLOW`).
    following: u32,
    /// The most running sequences and context tokens of the steps taken,
    /// each decaying as the observations' weights do (`reach`).
    reach: [f64; 2],
}

impl Default for StepFit {
    fn default() -> Self {
        Self::new()
    }
}

impl StepFit {
    /// A fit with no observations.
    pub fn new() -> Self {
        Self {
            theta: [0.0; N],
            xtx: [[0.0; N]; N],
            xty: [0.0; N],
            scale: 0.0,
            error: 1.0,
            samples: 0,
            refused: 0,
            outliers: 0,
            outlier_rate: 0.0,
            following: 0,
            reach: [0.0; 2],
        }
    }

    /// Adds one observed step of `seconds` carrying `load`. A refused
    /// observation changes nothing but the refusal count.
    pub fn observe(&mut self, load: &StepLoad, seconds: f64) -> Result<(), Refused> {
        self.observe_share(load, seconds, 1.0)
    }

    /// Adds `share` (in (0, 1]) of an observed step: each of the `R`
    /// requests streaming from one engine step sees that same step, so
    /// each observes `1/R` of it, and a step weighs (and ages the older
    /// ones) the same however many requests saw it. A share out of range
    /// counts whole.
    pub fn observe_share(
        &mut self,
        load: &StepLoad,
        seconds: f64,
        share: f64,
    ) -> Result<(), Refused> {
        let share = if share > 0.0 && share <= 1.0 {
            share
        } else {
            1.0
        };
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
        let smooth = SMOOTH * share;
        self.outlier_rate += smooth * (f64::from(u8::from(far)) - self.outlier_rate);
        if settled && far {
            if self.outlier_rate < SHIFT_RATE {
                // A stall or a bad report: set aside, counted.
                self.outliers += 1;
                return Ok(());
            }
            // Too many of them: the rank changed. What was learned of the
            // old rank keeps a hundredth of its weight, and the next
            // observations count whole while the fit and its scale follow.
            for (row, b) in self.xtx.iter_mut().zip(self.xty.iter_mut()) {
                row.iter_mut().for_each(|v| *v *= SHIFT_KEEP);
                *b *= SHIFT_KEEP;
            }
            self.following = FOLLOW;
            self.outlier_rate = 0.0;
        }
        let following = self.following > 0;
        self.following = self.following.saturating_sub(1);
        // Huber's weight (whole while the scale forms, and while the fit
        // follows a change: a scale of the old rank would hold it back).
        let huber = if self.samples >= 4 && !following && residual.abs() > HUBER * scale {
            HUBER * scale / residual.abs()
        } else {
            1.0
        };
        let weight = huber * share;
        let forget = FORGET.powf(share);
        for i in 0..N {
            for j in 0..N {
                self.xtx[i][j] = forget * self.xtx[i][j] + weight * x[i] * x[j];
            }
            self.xty[i] = forget * self.xty[i] + weight * x[i] * seconds;
        }
        for (reach, v) in self.reach.iter_mut().zip([load.running, load.kv_tokens]) {
            *reach = v.max(*reach * forget);
        }
        self.theta = nnls(&self.xtx, &self.xty);
        // The relative error of the prediction made before this step.
        let relative = (residual.abs() / seconds).min(1.0);
        if self.samples == 0 {
            (self.scale, self.error) = (residual.abs(), relative);
        } else {
            let cap = if following {
                residual.abs()
            } else {
                HUBER * scale
            };
            self.scale += smooth * (residual.abs().min(cap) - self.scale);
            self.error += smooth * (relative - self.error);
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

    /// The coefficients: seconds per step, per prefill token, per prefill
    /// token squared, per running sequence and per context token.
    pub fn coefficients(&self) -> [f64; N] {
        std::array::from_fn(|i| self.theta[i] / SCALE[i])
    }

    /// The load the fit has seen: the most running sequences and context
    /// tokens of the steps it took (outliers set aside are not), each
    /// decaying as those steps' weights do, so that it follows a load that
    /// falls as the fit forgets it. Past it, the fit extrapolates: a
    /// coefficient the steps seen did not pin down (a step time that the
    /// context tokens raise more steeply than the fit's range showed) may be
    /// far off there.
    pub fn reach(&self) -> [f64; 2] {
        self.reach
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

fn dot(a: &[f64; N], b: &[f64; N]) -> f64 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// The non-negative least-squares solution of the normal equations
/// `a·θ = b` (with a small ridge): every subset of free coefficients is
/// solved, and the best one that is non-negative wins. Five coefficients:
/// thirty-one solves of at most five unknowns, exactly the constrained
/// optimum. When the solve with all five free is already non-negative it is
/// that optimum (the ridge makes the objective strictly convex), and the
/// other thirty are skipped.
fn nnls(a: &[[f64; N]; N], b: &[f64; N]) -> [f64; N] {
    let trace: f64 = (0..N).map(|i| a[i][i]).sum();
    let ridge = RIDGE * trace.max(f64::MIN_POSITIVE);
    let feasible = |t: &[f64; N]| t.iter().all(|v| v.is_finite() && *v >= 0.0);
    if let Some(t) = solve(a, b, (1 << N) - 1, ridge).filter(feasible) {
        return t.map(|v| v.min(MAX_STEP));
    }
    // Half the quadratic form minus the linear term: what least squares
    // minimises, up to a constant.
    let objective = |t: &[f64; N]| -> f64 {
        (0..N)
            .map(|i| {
                let at: f64 = (0..N).map(|j| a[i][j] * t[j]).sum();
                t[i] * (0.5 * (at + ridge * t[i]) - b[i])
            })
            .sum()
    };
    let mut best = ([0.0; N], 0.0);
    for free in 1u8..(1 << N) {
        let Some(t) = solve(a, b, free, ridge) else {
            continue;
        };
        if !feasible(&t) {
            continue;
        }
        let o = objective(&t);
        if o < best.1 {
            best = (t, o);
        }
    }
    best.0.map(|v| v.min(MAX_STEP))
}

/// Solves `(a + ridge·I)·t = b` over the coefficients whose bits are set
/// in `free` (the others 0), by Gaussian elimination with partial
/// pivoting; `None` if singular.
fn solve(a: &[[f64; N]; N], b: &[f64; N], free: u8, ridge: f64) -> Option<[f64; N]> {
    let mut idx = [0usize; N];
    let mut n = 0;
    for i in 0..N {
        if free >> i & 1 == 1 {
            idx[n] = i;
            n += 1;
        }
    }
    let mut m = [[0.0f64; N + 1]; N];
    for r in 0..n {
        for c in 0..n {
            let (i, j) = (idx[r], idx[c]);
            m[r][c] = a[i][j] + if i == j { ridge } else { 0.0 };
        }
        m[r][N] = b[idx[r]];
    }
    for col in 0..n {
        let pivot = (col..n).max_by(|&x, &y| m[x][col].abs().total_cmp(&m[y][col].abs()))?;
        let size = m[pivot][col].abs();
        if size.is_nan() || size <= 1e-300 {
            return None;
        }
        m.swap(col, pivot);
        let row = m[col];
        for (r, other) in m.iter_mut().enumerate().take(n) {
            if r != col {
                let f = other[col] / row[col];
                for (v, p) in other.iter_mut().zip(row).skip(col) {
                    *v -= f * p;
                }
            }
        }
    }
    let mut out = [0.0; N];
    for r in 0..n {
        out[idx[r]] = m[r][N] / m[r][r];
    }
    Some(out)
}
