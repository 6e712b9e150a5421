//! What a run measured, with the definitions of vLLM's `bench serve`
//! (`vllm/benchmarks/serve.py`, `calculate_metrics`):
//!
//! * TTFT: first token minus send time; TPOT: (end-to-end latency − TTFT) /
//!   (output tokens − 1); ITL: the gap between successive tokens; E2E: last
//!   token minus send time.
//! * Goodput: requests per second that meet every SLO (TTFT and TPOT),
//!   counted over **offered** requests: a rejected or cancelled request is
//!   a request that did not meet them. For goodput a request's TTFT runs
//!   from its first send, so the time its retries took counts; the admitted
//!   latency percentiles run from the send of the attempt that was admitted,
//!   as a client library would report them.
//! * Only requests sent inside the measurement window count; the run goes
//!   on past it until they end (or the drain limit; then they are "in
//!   flight").
//!
//! Every run checks `offered = completed + rejected + cancelled + in
//! flight`, each counted where it happens, and fails if it does not hold.

use std::collections::BTreeMap;

use hdrhistogram::Histogram;
use serde::Serialize;

/// The service-level objectives a good request meets.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Slo {
    /// Time to first token, seconds.
    pub ttft_s: f64,
    /// Time per output token, seconds.
    pub tpot_s: f64,
}

/// How a request ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    /// Its last token arrived.
    Completed,
    /// It heard 529 or 503 and did not (or could no longer) retry.
    Rejected,
    /// Its client gave up.
    Cancelled,
}

/// Latency percentiles, milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize)]
pub struct Percentiles {
    /// Median.
    pub p50: f64,
    /// 99th percentile.
    pub p99: f64,
    /// 99.9th percentile.
    pub p999: f64,
}

fn percentiles(h: &Histogram<u64>) -> Percentiles {
    if h.is_empty() {
        return Percentiles::default();
    }
    let ms = |q| h.value_at_quantile(q) as f64 / 1000.0;
    Percentiles {
        p50: ms(0.5),
        p99: ms(0.99),
        p999: ms(0.999),
    }
}

/// Microseconds from 1 µs to about three hours, 3 significant figures.
fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 10_000_000_000, 3).expect("valid bounds")
}

/// Per-tenant tallies.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize)]
pub struct TenantTally {
    /// Requests offered.
    pub offered: u64,
    /// Requests that met every SLO.
    pub good: u64,
    /// Tokens asked for (prompt + output), offered requests.
    pub demand_tokens: u64,
    /// Tokens served (prompt + output), completed requests.
    pub served_tokens: u64,
}

/// The counts every run must balance.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
pub struct Accounting {
    /// Requests sent in the window.
    pub offered: u64,
    /// Of them, completed.
    pub completed: u64,
    /// Rejected for good.
    pub rejected: u64,
    /// Given up by their clients.
    pub cancelled: u64,
    /// Still running when the run stopped.
    pub in_flight: u64,
}

/// Collects one run's measurements as the simulation produces them.
#[derive(Debug)]
pub struct Recorder {
    slo: Slo,
    window: (u64, u64),
    bin_ns: u64,
    ttft: Histogram<u64>,
    tpot: Histogram<u64>,
    itl: Histogram<u64>,
    e2e: Histogram<u64>,
    to_reject: Histogram<u64>,
    reject_beyond: Histogram<u64>,
    acc: Accounting,
    good: u64,
    admitted_good: u64,
    attempts: u64,
    inversions: u64,
    admissions: u64,
    last_admit: [u64; 8],
    e2e_sum_s: f64,
    reasons: BTreeMap<&'static str, u64>,
    /// Per bin: good completions, offered, rejections, admitted TTFTs (ms).
    bins: Vec<Bin>,
    tenants: Vec<TenantTally>,
}

#[derive(Debug, Clone, Default)]
struct Bin {
    good: u64,
    offered: u64,
    rejected: u64,
    ttft_ms: Vec<f32>,
}

/// A request's life, as the recorder needs it at its end.
#[derive(Debug, Clone, Copy)]
pub struct Life {
    /// Intended first send.
    pub first_send_ns: u64,
    /// Send of the admitted attempt.
    pub attempt_send_ns: u64,
    /// First token.
    pub first_token_ns: u64,
    /// Last token.
    pub last_token_ns: u64,
    /// Output tokens.
    pub output: u32,
    /// Prompt tokens.
    pub prompt: u32,
    /// Tenant.
    pub tenant: u8,
}

impl Recorder {
    /// A recorder for requests first sent in `window` (nanoseconds), with
    /// time series in bins of `bin_ns`.
    pub fn new(slo: Slo, window: (u64, u64), bin_ns: u64, run_end_ns: u64, tenants: usize) -> Self {
        Self {
            slo,
            window,
            bin_ns,
            ttft: histogram(),
            tpot: histogram(),
            itl: histogram(),
            e2e: histogram(),
            to_reject: histogram(),
            reject_beyond: histogram(),
            acc: Accounting::default(),
            good: 0,
            admitted_good: 0,
            attempts: 0,
            inversions: 0,
            admissions: 0,
            last_admit: [0; 8],
            e2e_sum_s: 0.0,
            reasons: BTreeMap::new(),
            bins: vec![Bin::default(); (run_end_ns / bin_ns + 2) as usize],
            tenants: vec![TenantTally::default(); tenants.max(1)],
        }
    }

    /// Whether a request first sent at `t` is measured.
    pub fn counts(&self, first_send_ns: u64) -> bool {
        (self.window.0..self.window.1).contains(&first_send_ns)
    }

    fn bin(&mut self, t: u64) -> &mut Bin {
        let i = ((t / self.bin_ns) as usize).min(self.bins.len() - 1);
        &mut self.bins[i]
    }

    /// A request was offered (its first send).
    pub fn offered(&mut self, at_ns: u64, prompt: u32, output: u32, tenant: u8) {
        self.bin(at_ns).offered += 1;
        if self.counts(at_ns) {
            self.acc.offered += 1;
            let t = &mut self.tenants[tenant as usize];
            t.offered += 1;
            t.demand_tokens += u64::from(prompt) + u64::from(output);
        }
    }

    /// An attempt of a request first sent at `first_send_ns` was sent
    /// (first sends and retries).
    pub fn attempt(&mut self, first_send_ns: u64) {
        if self.counts(first_send_ns) {
            self.attempts += 1;
        }
    }

    /// An attempt heard a rejection `waited_ns` after it was sent, at `now`,
    /// `beyond_network_ns` of it more than its trips between frontend and
    /// workers took; `priority` is its class, `why` where and why it was
    /// refused.
    #[allow(clippy::too_many_arguments)]
    pub fn rejection(
        &mut self,
        first_send_ns: u64,
        now: u64,
        waited_ns: u64,
        beyond_network_ns: u64,
        priority: u8,
        why: &'static str,
    ) {
        self.bin(now).rejected += 1;
        if self.counts(first_send_ns) {
            self.to_reject.saturating_record(waited_ns / 1000);
            self.reject_beyond
                .saturating_record(beyond_network_ns / 1000);
            *self.reasons.entry(why).or_default() += 1;
        }
        // A rejection while a less important request was admitted in the last
        // 100 ms is a priority inversion (a client's own local throttling is
        // not the system's rejection).
        let recent = now.saturating_sub(100_000_000);
        if !why.starts_with("client:")
            && self.last_admit[priority as usize + 1..]
                .iter()
                .any(|&t| t > 0 && t >= recent)
        {
            self.inversions += 1;
        }
    }

    /// A request of class `priority`, first sent at `first_send_ns`,
    /// entered an engine at `now`.
    pub fn admitted(&mut self, now: u64, priority: u8, first_send_ns: u64) {
        if self.counts(first_send_ns) {
            self.admissions += 1;
        }
        self.last_admit[(priority as usize).min(7)] = now.max(1);
    }

    /// The gap between two successive tokens of a measured request.
    pub fn token_gap(&mut self, first_send_ns: u64, gap_ns: u64) {
        if self.counts(first_send_ns) {
            self.itl.saturating_record(gap_ns / 1000);
        }
    }

    /// A request ended.
    pub fn end(&mut self, end: End, life: &Life, now: u64) {
        if !self.counts(life.first_send_ns) {
            return;
        }
        match end {
            End::Rejected => self.acc.rejected += 1,
            End::Cancelled => self.acc.cancelled += 1,
            End::Completed => {
                self.acc.completed += 1;
                let ttft = life.first_token_ns - life.attempt_send_ns;
                let e2e = life.last_token_ns - life.attempt_send_ns;
                let tpot = if life.output > 1 {
                    (life.last_token_ns - life.first_token_ns) / u64::from(life.output - 1)
                } else {
                    0
                };
                self.ttft.saturating_record(ttft / 1000);
                self.e2e.saturating_record(e2e / 1000);
                self.e2e_sum_s += e2e as f64 / 1e9;
                if life.output > 1 {
                    self.tpot.saturating_record(tpot / 1000);
                }
                let tenant = &mut self.tenants[life.tenant as usize];
                tenant.served_tokens += u64::from(life.prompt) + u64::from(life.output);
                let tpot_ok = tpot as f64 <= self.slo.tpot_s * 1e9;
                let ttft_ok_from_first =
                    (life.first_token_ns - life.first_send_ns) as f64 <= self.slo.ttft_s * 1e9;
                let ttft_ok = ttft as f64 <= self.slo.ttft_s * 1e9;
                if ttft_ok && tpot_ok {
                    self.admitted_good += 1;
                }
                let bin = self.bin(now);
                bin.ttft_ms.push((ttft as f64 / 1e6) as f32);
                if ttft_ok_from_first && tpot_ok {
                    self.good += 1;
                    self.tenants[life.tenant as usize].good += 1;
                    self.bin(now).good += 1;
                }
            }
        }
    }

    /// Sets the requests still running when the run stopped.
    pub fn in_flight(&mut self, n: u64) {
        self.acc.in_flight = n;
    }

    /// The counts; the caller checks they balance.
    pub fn accounting(&self) -> Accounting {
        self.acc
    }

    /// Good requests per second over the window.
    pub fn goodput(&self) -> f64 {
        self.good as f64 / ((self.window.1 - self.window.0) as f64 / 1e9)
    }

    /// Sums the run up; `capacity` is `C*` in requests per second.
    pub fn summary(&self, capacity: f64) -> Measured {
        let window_s = (self.window.1 - self.window.0) as f64 / 1e9;
        let offered = self.acc.offered.max(1) as f64;
        let admitted = (self.acc.completed.max(1)) as f64;
        let bin_s = self.bin_ns as f64 / 1e9;
        Measured {
            offered_rps: self.acc.offered as f64 / window_s,
            goodput_rps: self.goodput(),
            goodput_frac: self.goodput() / capacity,
            attainment_offered: self.good as f64 / offered,
            attainment_admitted: self.admitted_good as f64 / admitted,
            ttft_ms: percentiles(&self.ttft),
            tpot_ms: percentiles(&self.tpot),
            itl_ms: percentiles(&self.itl),
            e2e_ms: percentiles(&self.e2e),
            reject_rate: self.acc.rejected as f64 / offered,
            cancel_rate: self.acc.cancelled as f64 / offered,
            attempts_per_request: self.attempts as f64 / offered,
            time_to_reject_ms: percentiles(&self.to_reject),
            reject_beyond_network_ms: percentiles(&self.reject_beyond),
            mean_duration_s: self.e2e_sum_s / admitted,
            inversions: self.inversions,
            admissions: self.admissions,
            rejections_by: self
                .reasons
                .iter()
                .map(|(k, v)| ((*k).to_owned(), *v))
                .collect(),
            tenants: self.tenants.clone(),
            accounting: self.acc,
            series_goodput: self.bins.iter().map(|b| b.good as f64 / bin_s).collect(),
            series_offered: self.bins.iter().map(|b| b.offered as f64 / bin_s).collect(),
            series_ttft_p99_ms: self
                .bins
                .iter()
                .map(|b| {
                    let mut v = b.ttft_ms.clone();
                    if v.is_empty() {
                        return 0.0;
                    }
                    v.sort_by(f32::total_cmp);
                    f64::from(v[((v.len() as f64 * 0.99) as usize).min(v.len() - 1)])
                })
                .collect(),
            bin_s,
            preemptions: 0,
            wasted_tokens: 0,
            computed_tokens: 0,
            slo: None,
        }
    }
}

/// Every figure of one run.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Measured {
    /// Offered requests per second (first sends in the window).
    pub offered_rps: f64,
    /// Good requests per second.
    pub goodput_rps: f64,
    /// Goodput as a fraction of `C*`.
    pub goodput_frac: f64,
    /// Good / offered.
    pub attainment_offered: f64,
    /// Admitted requests meeting the SLOs from their admitted send / completed.
    pub attainment_admitted: f64,
    /// Admitted TTFT.
    pub ttft_ms: Percentiles,
    /// Admitted TPOT.
    pub tpot_ms: Percentiles,
    /// Inter-token latency.
    pub itl_ms: Percentiles,
    /// End-to-end latency of completed requests.
    pub e2e_ms: Percentiles,
    /// Rejected / offered.
    pub reject_rate: f64,
    /// Cancelled / offered.
    pub cancel_rate: f64,
    /// Sends per offered request (retries included).
    pub attempts_per_request: f64,
    /// Time from an attempt's send to hearing 529 or 503.
    pub time_to_reject_ms: Percentiles,
    /// The same, less the time the attempt spent crossing the network
    /// between frontend and workers.
    pub reject_beyond_network_ms: Percentiles,
    /// Mean end-to-end latency of completed requests, seconds.
    pub mean_duration_s: f64,
    /// Rejections while a less important request was admitted in the last
    /// 100 ms.
    pub inversions: u64,
    /// Measured requests that entered an engine.
    pub admissions: u64,
    /// Rejected attempts of measured requests, by where and why.
    pub rejections_by: BTreeMap<String, u64>,
    /// Per tenant.
    pub tenants: Vec<TenantTally>,
    /// The balance.
    pub accounting: Accounting,
    /// Good completions per second, per bin of `bin_s`.
    pub series_goodput: Vec<f64>,
    /// Offered requests per second, per bin.
    pub series_offered: Vec<f64>,
    /// p99 admitted TTFT of the requests completing in each bin, ms.
    pub series_ttft_p99_ms: Vec<f64>,
    /// Width of a bin, seconds.
    pub bin_s: f64,
    /// Engine preemptions.
    pub preemptions: u64,
    /// Engine tokens thrown away (preemption, abort).
    pub wasted_tokens: u64,
    /// Engine tokens computed.
    pub computed_tokens: u64,
    /// SLO admission's predictions and verdicts (arm (i) only).
    pub slo: Option<SloFigures>,
}

/// The terms of SLO admission's verdict, as `frontend_slo_turned_busy_total`
/// labels them.
pub const BUSY_TERMS: [&str; 4] = ["kv", "time", "seats", "waiting"];

/// What SLO admission predicted and decided in a run.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize)]
pub struct SloFigures {
    /// |predicted − observed| time to first token of the admitted requests
    /// with a trusted prediction, ms: median and p90.
    pub ttft_error_ms: (f64, f64),
    /// The same of time per output token, ms.
    pub tpot_error_ms: (f64, f64),
    /// Admitted requests with a trusted prediction, share.
    pub predicted_share: f64,
    /// Verdict changes per worker per minute of arrivals.
    pub flips_per_worker_minute: f64,
    /// Turns to busy over every rank, by the term that weighed most:
    /// [`BUSY_TERMS`] order.
    pub turned_busy: [u64; 4],
    /// The lines the verdicts held.
    pub line: LineFigures,
}

/// The line of each rank: the requests booked on it when its verdict last
/// turned busy, sampled once a second while requests arrive. Its level is
/// the mean over the last quarter of the arrivals.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize)]
pub struct LineFigures {
    /// The highest level of a rank, requests.
    pub level: f64,
    /// The largest coefficient of variation of a rank's line about its
    /// level over that quarter.
    pub cv: f64,
    /// Seconds from the start of the arrivals, or from the workload's
    /// switch, until every rank's line stayed within 10 % of its level.
    pub settle_s: f64,
}

/// The median and 90th percentile of `v` (sorted here); zeros if empty.
pub fn median_p90(v: &mut [f64]) -> (f64, f64) {
    if v.is_empty() {
        return (0.0, 0.0);
    }
    v.sort_by(f64::total_cmp);
    let at = |q: f64| v[((v.len() - 1) as f64 * q).round() as usize];
    (at(0.5), at(0.9))
}

impl Measured {
    /// Tenant `t`'s goodput, requests per second (0 for a tenant the run
    /// does not have).
    pub fn tenant_goodput_rps(&self, t: usize) -> f64 {
        let window_s = self.accounting.offered as f64 / self.offered_rps.max(1e-9);
        self.tenants
            .get(t)
            .map_or(0.0, |x| x.good as f64 / window_s.max(1e-9))
    }
}
