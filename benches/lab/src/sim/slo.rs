//! Arm (i)'s own figures: how far SLO admission's predictions were from
//! what each admitted request then saw, and how often its verdicts
//! changed.

use super::{ns, Ev, Sim};
use crate::record::{median_p90, LineFigures, SloFigures, BUSY_TERMS};

impl Sim<'_> {
    /// Request `id`'s first token came: its time to first token against
    /// the one predicted when it was booked (at its dispatch).
    pub(super) fn slo_first_token(&mut self, id: u32) {
        let now = self.now;
        let r = &mut self.reqs[id as usize];
        let Some(p) = r.dispatch.as_ref().and_then(|d| d.prediction()) else {
            return;
        };
        if !self.rec.counts(r.spec.at_ns) {
            return;
        }
        let observed_ms = (now - r.attempt_send) as f64 * 1e-6;
        self.slo_errors[0].push((p.ttft * 1e3 - observed_ms).abs());
        r.predicted_tpot = Some(p.tpot);
    }

    /// Request `id` completed: its time per output token against the one
    /// predicted, and one more admitted request measured.
    pub(super) fn slo_completed(&mut self, id: u32) {
        let r = &self.reqs[id as usize];
        if !self.rec.counts(r.spec.at_ns) {
            return;
        }
        self.slo_admitted += 1;
        if let Some(p) = r.predicted_tpot.filter(|_| r.spec.output > 1) {
            let tpot_ms =
                (r.last_token - r.first_token) as f64 * 1e-6 / f64::from(r.spec.output - 1);
            self.slo_errors[1].push((p * 1e3 - tpot_ms).abs());
        }
    }

    /// Samples each rank's line (the requests booked when its verdict
    /// last turned busy) from the first frontend's metrics, and comes back
    /// in a second.
    pub(super) fn slo_sample(&mut self) {
        if let Some(f) = self.fronts.first() {
            let lines = f
                .monitor
                .metrics_text()
                .lines()
                .filter(|l| l.contains("frontend_slo_line_requests{"))
                .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                .collect();
            self.slo_lines.push((self.now, lines));
        }
        self.at(self.now + ns(1.0), Ev::SloSample);
    }

    /// The run's figures: the errors' median and p90, and the verdict
    /// changes the first frontend's monitor counted.
    pub(super) fn slo_figures(&mut self) -> SloFigures {
        let text = self
            .fronts
            .first()
            .map(|f| f.monitor.metrics_text())
            .unwrap_or_default();
        let sum = |prefix: &str| -> f64 {
            text.lines()
                .filter(|l| l.contains(prefix))
                .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                .sum()
        };
        let flips = sum("frontend_slo_verdict_changes_total{");
        let turned_busy = BUSY_TERMS
            .map(|term| sum(&format!("frontend_slo_turned_busy_total{{by=\"{term}\"")) as u64);
        let minutes = self.workload.duration_s / 60.0;
        let predicted = self.slo_errors[0].len() as f64;
        SloFigures {
            ttft_error_ms: median_p90(&mut self.slo_errors[0]),
            tpot_error_ms: median_p90(&mut self.slo_errors[1]),
            predicted_share: predicted / self.slo_admitted.max(1) as f64,
            flips_per_worker_minute: flips / f64::from(self.c.workers.max(1)) / minutes,
            turned_busy,
            line: self.line_figures(),
        }
    }

    /// How the ranks' lines moved (`LineFigures`): each rank's level is
    /// its mean over the last quarter of the arrivals.
    fn line_figures(&self) -> LineFigures {
        let end = self.workload.duration_s;
        let since = self
            .workload
            .lengths_after
            .as_ref()
            .map_or(0.0, |(t, _)| *t);
        let samples: Vec<(f64, &[f64])> = self
            .slo_lines
            .iter()
            .map(|(t, l)| (*t as f64 * 1e-9, l.as_slice()))
            .filter(|(t, _)| *t <= end)
            .collect();
        let ranks = samples.last().map_or(0, |(_, l)| l.len());
        let mut out = LineFigures::default();
        for r in 0..ranks {
            let last: Vec<f64> = samples
                .iter()
                .filter(|(t, _)| *t >= 0.75 * end)
                .filter_map(|(_, l)| l.get(r).copied())
                .collect();
            if last.is_empty() {
                continue;
            }
            let n = last.len() as f64;
            let level = last.iter().sum::<f64>() / n;
            let sd = (last.iter().map(|x| (x - level).powi(2)).sum::<f64>() / n).sqrt();
            out.cv = out.cv.max(sd / level.max(1.0));
            out.level = out.level.max(level);
            // The first sample of the run within the band that lasts to
            // the end.
            let settled = samples
                .iter()
                .rev()
                .take_while(|(_, l)| l.get(r).is_some_and(|x| (x - level).abs() <= 0.1 * level))
                .last()
                .map_or(end, |(t, _)| *t);
            out.settle_s = out.settle_s.max(settled - since);
        }
        out
    }
}
