//! The workload: an open-loop, seeded stream of requests, fixed before a
//! run starts, so every arm sees the very same requests at the very same
//! intended send times (no coordinated omission: a slow system never slows
//! the sender).
//!
//! * Arrivals: Poisson, or gamma with a burstiness parameter (shape
//!   `burstiness`, mean gap `1/rate`), as vLLM's `bench serve` draws them;
//!   the rate follows a piecewise-constant profile (steps and spikes).
//! * Lengths: lognormal prompt and output lengths per length class (a
//!   chat-like class and a long-prompt class by default).
//! * Tenants with arrival shares, and priority classes (0 most important).
//! * What a client does on a rejection ([`Retry`]) and when it gives up
//!   ([`Client::timeout_s`]); the simulation carries those out.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rand_distr::{Distribution, Exp, Gamma, LogNormal};
use serde::Serialize;

/// How inter-arrival gaps are drawn.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub enum Arrivals {
    /// Exponential gaps.
    Poisson,
    /// Gamma gaps of shape `burstiness` (below 1: burstier than Poisson).
    Gamma {
        /// vLLM's `--burstiness`.
        burstiness: f64,
    },
}

/// One class of request lengths.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct LengthClass {
    /// Share of requests in this class (relative weight).
    pub weight: f64,
    /// Median prompt tokens.
    pub prompt_median: f64,
    /// Lognormal sigma of the prompt length.
    pub prompt_sigma: f64,
    /// Longest prompt.
    pub prompt_max: u32,
    /// Median output tokens.
    pub output_median: f64,
    /// Lognormal sigma of the output length.
    pub output_sigma: f64,
    /// Longest output.
    pub output_max: u32,
}

impl LengthClass {
    /// Chat-like: prompts around 500 tokens, answers around 200 (ShareGPT-
    /// shaped; docs/overload.md gives the source).
    pub fn chat() -> Self {
        Self {
            weight: 0.9,
            prompt_median: 500.0,
            prompt_sigma: 0.8,
            prompt_max: 4096,
            output_median: 200.0,
            output_sigma: 0.7,
            output_max: 1024,
        }
    }

    /// Reasoning-style answers: the chat class's prompts with outputs five
    /// times as long.
    pub fn long_output() -> Self {
        Self {
            output_median: 1000.0,
            output_max: 8192,
            weight: 1.0,
            ..Self::chat()
        }
    }

    /// Retrieval: prompts of several thousand tokens, chat-sized answers.
    pub fn retrieval() -> Self {
        Self {
            weight: 1.0,
            prompt_median: 3000.0,
            prompt_sigma: 0.5,
            prompt_max: 16_000,
            ..Self::chat()
        }
    }

    /// Long prompts (retrieval, summarization): around 4000 tokens in, 150
    /// out.
    pub fn long_prompt() -> Self {
        Self {
            weight: 0.1,
            prompt_median: 4000.0,
            prompt_sigma: 0.3,
            prompt_max: 12_000,
            output_median: 150.0,
            output_sigma: 0.5,
            output_max: 512,
        }
    }
}

/// What a client does when it hears 529 or 503.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub enum Retry {
    /// Gives up.
    Never,
    /// Sends again at once.
    Immediate,
    /// Sends again after the answer's `Retry-After`, or, without one, after
    /// the `openai` client's default backoff (0.5 s doubling, with jitter).
    AfterRetryAfter,
    /// Google SRE's client-side adaptive throttling: before each send the
    /// client rejects locally with probability
    /// `max(0, (requests - K·accepts) / (requests + 1))` over the last
    /// `window_s`; retries as [`Retry::AfterRetryAfter`].
    Adaptive {
        /// K (the book's 2).
        k: f64,
        /// The window (the book's two minutes).
        window_s: f64,
    },
}

/// The clients' behaviour.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Client {
    /// A client with no first token this long after its send gives up and
    /// cancels.
    pub timeout_s: f64,
    /// Reaction to a rejection.
    pub retry: Retry,
    /// Most retries of one request (the SRE book's 3).
    pub max_retries: u32,
}

impl Default for Client {
    fn default() -> Self {
        Self {
            timeout_s: 10.0,
            retry: Retry::Never,
            max_retries: 3,
        }
    }
}

/// The load: a rate profile, how arrivals and lengths are drawn, who sends.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct WorkloadSpec {
    /// Offered rate over time: `(from_s, requests per second)`, sorted,
    /// first at 0.
    pub profile: Vec<(f64, f64)>,
    /// Arrivals stop here.
    pub duration_s: f64,
    /// Gap distribution.
    pub arrivals: Arrivals,
    /// Length classes.
    pub lengths: Vec<LengthClass>,
    /// Tenants' shares of the arrivals (relative weights).
    pub tenants: Vec<f64>,
    /// Priority classes' shares of the arrivals, class 0 first.
    pub priorities: Vec<f64>,
    /// Client behaviour.
    pub client: Client,
    /// Seed of every draw.
    pub seed: u64,
    /// Arrivals stop after this many requests, if they have not stopped
    /// at `duration_s` first.
    pub max_requests: Option<usize>,
    /// From this time (seconds) on, lengths are drawn from these classes
    /// instead (a workload that changes mid-run).
    pub lengths_after: Option<(f64, Vec<LengthClass>)>,
}

impl WorkloadSpec {
    /// Steady load at `rate`, chat and long prompts, one tenant, two
    /// priority classes (a quarter of requests interactive: class 0).
    pub fn steady(rate: f64, duration_s: f64, seed: u64) -> Self {
        Self {
            profile: vec![(0.0, rate)],
            duration_s,
            arrivals: Arrivals::Poisson,
            lengths: vec![LengthClass::chat(), LengthClass::long_prompt()],
            tenants: vec![1.0],
            priorities: vec![0.25, 0.75],
            client: Client::default(),
            seed,
            max_requests: None,
            lengths_after: None,
        }
    }

    /// The offered rate at `t` seconds.
    pub fn rate_at(&self, t: f64) -> f64 {
        self.profile
            .iter()
            .rev()
            .find(|(from, _)| *from <= t)
            .map_or(0.0, |(_, r)| *r)
    }

    /// Draws every request of the run, ordered by intended send time.
    pub fn generate(&self) -> Vec<RequestSpec> {
        let mut rng = StdRng::seed_from_u64(self.seed);
        let mut out = Vec::new();
        let mut t = 0.0f64;
        let unit = Exp::new(1.0).expect("rate 1");
        loop {
            let rate = self.rate_at(t);
            if rate <= 0.0 {
                // Jump to the next segment with a positive rate, if any.
                match self.profile.iter().find(|(from, r)| *from > t && *r > 0.0) {
                    Some((from, _)) => t = *from,
                    None => break,
                }
                continue;
            }
            let gap = match self.arrivals {
                Arrivals::Poisson => unit.sample(&mut rng) / rate,
                Arrivals::Gamma { burstiness } => Gamma::new(burstiness, 1.0 / (rate * burstiness))
                    .expect("a positive shape and scale")
                    .sample(&mut rng),
            };
            t += gap;
            if t >= self.duration_s || self.max_requests.is_some_and(|n| out.len() >= n) {
                break;
            }
            let lengths = match &self.lengths_after {
                Some((from, after)) if t >= *from => after,
                _ => &self.lengths,
            };
            let class = pick(&mut rng, lengths.iter().map(|c| c.weight));
            let c = &lengths[class];
            let prompt = lognormal(&mut rng, c.prompt_median, c.prompt_sigma, c.prompt_max);
            let output = lognormal(&mut rng, c.output_median, c.output_sigma, c.output_max);
            out.push(RequestSpec {
                at_ns: (t * 1e9) as u64,
                prompt,
                output,
                tenant: pick(&mut rng, self.tenants.iter().copied()) as u8,
                priority: pick(&mut rng, self.priorities.iter().copied()) as u8,
                jitter: rng.gen(),
            });
        }
        out
    }
}

/// One request of the workload.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RequestSpec {
    /// Intended send time.
    pub at_ns: u64,
    /// Prompt tokens.
    pub prompt: u32,
    /// Output tokens the answer will have.
    pub output: u32,
    /// Tenant index.
    pub tenant: u8,
    /// Priority class (0 most important).
    pub priority: u8,
    /// A uniform draw in [0, 1) for the client's backoff jitter.
    pub jitter: f64,
}

fn pick(rng: &mut StdRng, weights: impl Iterator<Item = f64> + Clone) -> usize {
    let total: f64 = weights.clone().sum();
    let mut x = rng.gen::<f64>() * total;
    let mut last = 0;
    for (i, w) in weights.enumerate() {
        last = i;
        if x < w {
            return i;
        }
        x -= w;
    }
    last
}

fn lognormal(rng: &mut StdRng, median: f64, sigma: f64, max: u32) -> u32 {
    let d = LogNormal::new(median.ln(), sigma).expect("a finite median and sigma");
    (d.sample(rng).round() as u32).clamp(1, max)
}
