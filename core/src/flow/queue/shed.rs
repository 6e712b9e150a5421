//! Fair shedding (module docs of `flow`, "Fair shedding"): whether an
//! arrival fits, and if not, which waiting requests leave for it: the plan
//! is made first and applied only if the arrival then fits.

use super::{FlowQueue, Planned, MAX_SHED, NONE};
use crate::flow::config::MAX_BANDS;

impl<T> FlowQueue<T> {
    /// Whether a request of `cost` fits once `freed` tokens and the count
    /// of the plan leave.
    pub(super) fn fits(&self, freed: u128, cost: u128) -> bool {
        let count =
            self.queued as usize - self.plan.iter().map(|p| p.taken as usize).sum::<usize>();
        count < self.limit as usize
            && self
                .token_limit
                .is_none_or(|limit| self.queued_tokens - freed + cost <= limit)
    }

    /// Tenant `t`'s counter plus its weighted waiting cost with `extra`
    /// (prompt, output) tokens more, less what the plan takes from it.
    fn heaviness(&self, t: u32, extra: (u128, u128)) -> f64 {
        let x = self.tenants.get(t);
        let w = self.waiting[t as usize];
        let prompt = w.prompt + extra.0;
        let output = w.output + extra.1;
        let planned: (u128, u128) = self
            .plan
            .iter()
            .filter(|p| self.flows[p.flow as usize].tenant == t)
            .fold((0, 0), |acc, p| {
                let mut e = self.flows[p.flow as usize].tail;
                let mut sum = acc;
                for _ in 0..p.taken {
                    let entry = &self.entries[e as usize];
                    sum.0 += u128::from(entry.prompt);
                    sum.1 += u128::from(entry.output);
                    e = entry.prev;
                }
                sum
            });
        x.counter
            + (self.prompt_weight * (prompt - planned.0) as f64
                + self.output_weight * (output - planned.1) as f64)
                / x.weight
    }

    /// Plans which waiting requests leave so that an arrival of `tenant`,
    /// `band` and sizes `(prompt, output)` fits (module docs of `flow`,
    /// "Fair shedding"). Among equally heavy tenants, the one whose
    /// request is newest loses it. False if the arrival is the one refused;
    /// nothing has changed then.
    pub(super) fn plan_shedding(&mut self, tenant: u32, band: usize, sizes: (u64, u64)) -> bool {
        self.plan.clear();
        let cost = u128::from(sizes.0) + u128::from(sizes.1);
        let mut freed = 0u128;
        let mut victims = 0;
        while !self.fits(freed, cost) {
            // The least important band with requests not yet planned, if it
            // is not more important than the arrival's.
            let victim_band = (0..MAX_BANDS).rev().find(|&b| self.unplanned(b) > 0);
            let Some(victim_band) = victim_band.filter(|&b| b >= band && victims < MAX_SHED) else {
                self.plan.clear();
                return false;
            };
            let arrival = if victim_band == band {
                self.heaviness(tenant, (u128::from(sizes.0), u128::from(sizes.1)))
            } else {
                f64::NEG_INFINITY
            };
            let mut best: Option<(u32, f64, u64)> = None;
            let mut f = self.bands[victim_band].0;
            while f != NONE {
                let tail = self.planned_tail(f);
                if tail != NONE {
                    let h = self.heaviness(self.flows[f as usize].tenant, (0, 0));
                    let seq = self.entries[tail as usize].seq;
                    if best.is_none_or(|(_, b, s)| h > b || (h == b && seq > s)) {
                        best = Some((f, h, seq));
                    }
                }
                f = self.flows[f as usize].next;
            }
            let Some((flow, _, _)) = best.filter(|&(_, h, _)| h > arrival) else {
                self.plan.clear();
                return false;
            };
            let tail = self.planned_tail(flow);
            freed += self.entries[tail as usize].cost();
            victims += 1;
            match self.plan.iter_mut().find(|p| p.flow == flow) {
                Some(p) => p.taken += 1,
                None => self.plan.push(Planned {
                    flow,
                    tail: self.flows[flow as usize].tail,
                    taken: 1,
                }),
            }
        }
        true
    }

    /// Band `b`'s requests not in the plan.
    fn unplanned(&self, b: usize) -> u32 {
        let planned: u32 = self
            .plan
            .iter()
            .filter(|p| usize::from(self.flows[p.flow as usize].band) == b)
            .map(|p| p.taken)
            .sum();
        self.bands[b].1 - planned
    }

    /// Flow `f`'s newest entry not in the plan (`NONE` if all are).
    fn planned_tail(&self, f: u32) -> u32 {
        let Some(p) = self.plan.iter().find(|p| p.flow == f) else {
            return self.flows[f as usize].tail;
        };
        let mut e = p.tail;
        for _ in 0..p.taken {
            e = self.entries[e as usize].prev;
        }
        e
    }

    /// Turns away the planned requests, newest of each flow first.
    pub(super) fn shed_planned(&mut self, mut shed: impl FnMut(T)) {
        while let Some(p) = self.plan.pop() {
            for _ in 0..p.taken {
                let e = self.flows[p.flow as usize].tail;
                shed(self.remove(e));
            }
        }
    }
}
