//! A plain reference for the frontend queue (`loadgate::flow::FlowQueue`):
//! a list of requests and a map of tenants, every rule of
//! docs/flow-control.md written the obvious way (scans, clones, no slabs).
//! Its tenant table is unbounded: forgetting is tested on its own.

use std::collections::HashMap;

/// One waiting request.
#[derive(Debug, Clone)]
struct Waiting {
    id: u32,
    tenant: String,
    band: usize,
    seq: u64,
    prompt: u64,
    output: u64,
    deadline: u64,
}

/// One tenant's counters.
#[derive(Debug, Clone, Default)]
struct Tenant {
    weight: f64,
    counter: f64,
    provisional: f64,
    inflight: u32,
}

/// A dispatched request's reservation, and where it stood in the queue.
#[derive(Debug, Clone)]
pub struct RefReservation {
    tenant: String,
    output: u64,
    reported: u64,
    band: usize,
    seq: u64,
    deadline: u64,
    prompt: u64,
}

/// The reference queue.
#[derive(Debug, Clone)]
pub struct ReferenceFlow {
    limit: usize,
    token_limit: Option<u128>,
    deadline: u64,
    wp: f64,
    wq: f64,
    estimate: u64,
    max_shed: usize,
    bands: usize,
    weights: HashMap<String, f64>,
    waiting: Vec<Waiting>,
    tenants: HashMap<String, Tenant>,
    floor: f64,
    seq: u64,
}

/// The queue's settings, as `FlowConfig` gives them.
#[derive(Debug, Clone)]
pub struct RefConfig {
    /// Most requests waiting.
    pub limit: usize,
    /// Most estimated tokens waiting.
    pub token_limit: Option<u128>,
    /// Default wait, nanoseconds.
    pub deadline: u64,
    /// `w_p`.
    pub wp: f64,
    /// `w_q`.
    pub wq: f64,
    /// Output reserved without `max_tokens`.
    pub estimate: u64,
    /// Most requests one arrival sheds.
    pub max_shed: usize,
    /// Priority bands.
    pub bands: usize,
    /// Tenants' weights.
    pub weights: Vec<(String, f64)>,
}

impl ReferenceFlow {
    /// An empty queue.
    pub fn new(c: RefConfig) -> Self {
        Self {
            limit: c.limit,
            token_limit: c.token_limit,
            deadline: c.deadline,
            wp: c.wp,
            wq: c.wq,
            estimate: c.estimate,
            max_shed: c.max_shed,
            bands: c.bands,
            weights: c.weights.into_iter().collect(),
            waiting: Vec::new(),
            tenants: HashMap::new(),
            floor: 0.0,
            seq: 0,
        }
    }

    /// Requests waiting.
    pub fn len(&self) -> usize {
        self.waiting.len()
    }

    /// Whether nothing waits.
    pub fn is_empty(&self) -> bool {
        self.waiting.is_empty()
    }

    /// Estimated tokens waiting.
    pub fn tokens(&self) -> u128 {
        self.waiting.iter().map(cost).sum()
    }

    /// A tenant's counter.
    pub fn counter(&self, tenant: &str) -> Option<f64> {
        self.tenants.get(tenant).map(|t| t.counter)
    }

    fn backlogged(&self, tenant: &str) -> bool {
        self.waiting.iter().any(|w| w.tenant == tenant)
    }

    /// The lowest counter among backlogged tenants, or the floor.
    fn lowest(&self) -> f64 {
        self.tenants
            .iter()
            .filter(|(name, _)| self.backlogged(name))
            .map(|(_, t)| t.counter)
            .min_by(f64::total_cmp)
            .unwrap_or(self.floor)
    }

    fn tenant(&mut self, name: &str) -> &mut Tenant {
        let weight = self.weights.get(name).copied().unwrap_or(1.0);
        self.tenants.entry(name.to_owned()).or_insert(Tenant {
            weight,
            ..Default::default()
        })
    }

    /// An idle tenant rejoins at `max(own, lowest)`.
    fn rejoin(&mut self, name: &str) {
        if !self.backlogged(name) {
            let lowest = self.lowest();
            let t = self.tenant(name);
            t.counter = t.counter.max(lowest);
        }
    }

    /// Takes waiting request `i` out; the floor keeps the lowest counter
    /// when its tenant's last request leaves.
    fn take(&mut self, i: usize) -> Waiting {
        let tenant = self.waiting[i].tenant.clone();
        let still = self.waiting.iter().filter(|w| w.tenant == tenant).count() > 1;
        if !still {
            self.floor = self.floor.max(self.lowest());
        }
        self.waiting.remove(i)
    }

    fn heaviness(&self, name: &str, extra: (u128, u128), gone: &[usize]) -> f64 {
        let t = &self.tenants[name];
        let (mut p, mut o) = extra;
        for (i, w) in self.waiting.iter().enumerate() {
            if w.tenant == name && !gone.contains(&i) {
                p += u128::from(w.prompt);
                o += u128::from(w.output);
            }
        }
        t.counter + (self.wp * p as f64 + self.wq * o as f64) / t.weight
    }

    /// Makes room for a request of `tenant`, `band` and sizes by the fair
    /// rule: the ids shed, in the order they left, or `None` (refused;
    /// nothing changed).
    fn make_room(
        &mut self,
        tenant: &str,
        band: usize,
        prompt: u64,
        output: u64,
    ) -> Option<Vec<u32>> {
        let c = u128::from(prompt) + u128::from(output);
        if self.token_limit.is_some_and(|l| c > l) {
            return None;
        }
        self.tenant(tenant);
        // Plan the victims on indices, then apply.
        let mut gone: Vec<usize> = Vec::new();
        loop {
            let left: Vec<usize> = (0..self.waiting.len())
                .filter(|i| !gone.contains(i))
                .collect();
            let tokens: u128 = left.iter().map(|&i| cost(&self.waiting[i])).sum();
            let fits = left.len() < self.limit && self.token_limit.is_none_or(|l| tokens + c <= l);
            if fits {
                break;
            }
            if gone.len() == self.max_shed {
                return None;
            }
            let vb = left.iter().map(|&i| self.waiting[i].band).max()?;
            if vb < band {
                return None;
            }
            let arrival = if vb == band {
                self.heaviness(tenant, (u128::from(prompt), u128::from(output)), &gone)
            } else {
                f64::NEG_INFINITY
            };
            // Each tenant of the band: its newest request there.
            let mut best: Option<(usize, f64, u64)> = None;
            let mut names: Vec<&str> = left
                .iter()
                .filter(|&&i| self.waiting[i].band == vb)
                .map(|&i| self.waiting[i].tenant.as_str())
                .collect();
            names.sort_unstable();
            names.dedup();
            for name in names {
                let newest = left
                    .iter()
                    .copied()
                    .filter(|&i| self.waiting[i].band == vb && self.waiting[i].tenant == name)
                    .max_by_key(|&i| self.waiting[i].seq)
                    .expect("the tenant has a request in the band");
                let h = self.heaviness(name, (0, 0), &gone);
                let seq = self.waiting[newest].seq;
                if best.is_none_or(|(_, b, s)| h > b || (h == b && seq > s)) {
                    best = Some((newest, h, seq));
                }
            }
            match best {
                Some((i, h, _)) if h > arrival => gone.push(i),
                _ => return None,
            }
        }
        // Apply in the queue's order (it matters to the floor): the flows
        // (tenant and band) in the reverse of their first choice, each
        // flow's victims newest first (the order they were chosen in).
        let mut flows: Vec<(String, usize)> = Vec::new();
        for &i in &gone {
            let key = (self.waiting[i].tenant.clone(), self.waiting[i].band);
            if !flows.contains(&key) {
                flows.push(key);
            }
        }
        let ids: Vec<(u32, String, usize)> = gone
            .iter()
            .map(|&i| {
                let w = &self.waiting[i];
                (w.id, w.tenant.clone(), w.band)
            })
            .collect();
        let mut shed = Vec::new();
        for (name, b) in flows.into_iter().rev() {
            for (id, _, _) in ids.iter().filter(|(_, n, x)| *n == name && *x == b) {
                let i = self.waiting.iter().position(|w| w.id == *id).unwrap();
                self.take(i);
                shed.push(*id);
            }
        }
        Some(shed)
    }

    /// Queues request `id` (the ids shed for it, in the order they left),
    /// or refuses it (`None`).
    #[allow(clippy::too_many_arguments)]
    pub fn push(
        &mut self,
        id: u32,
        tenant: &str,
        priority: u8,
        prompt: u64,
        max_tokens: Option<u64>,
        deadline: Option<u64>,
        now: u64,
    ) -> Option<Vec<u32>> {
        let band = usize::from(priority).min(self.bands - 1);
        let output = max_tokens.unwrap_or(self.estimate);
        let shed = self.make_room(tenant, band, prompt, output)?;
        self.rejoin(tenant);
        self.waiting.push(Waiting {
            id,
            tenant: tenant.to_owned(),
            band,
            seq: self.seq,
            prompt,
            output,
            deadline: now.saturating_add(deadline.unwrap_or(self.deadline)),
        });
        self.seq += 1;
        Some(shed)
    }

    /// Puts dispatched request `r` back as `id` (a worker refused it): its
    /// charge undone, at its place with its deadline; the ids shed, or
    /// `None` when refused (its deadline passed, or no room).
    pub fn requeue(&mut self, id: u32, r: RefReservation, now: u64) -> Option<Vec<u32>> {
        let (tenant, band, seq, deadline, prompt, output, reported) = (
            r.tenant.clone(),
            r.band,
            r.seq,
            r.deadline,
            r.prompt,
            r.output,
            r.reported,
        );
        self.settle(r, reported);
        let wp = self.wp;
        let t = self.tenant(&tenant);
        t.counter = (t.counter - wp * prompt as f64 / t.weight).max(0.0);
        if deadline <= now {
            return None;
        }
        let shed = self.make_room(&tenant, band, prompt, output)?;
        self.rejoin(&tenant);
        self.waiting.push(Waiting {
            id,
            tenant,
            band,
            seq,
            prompt,
            output,
            deadline,
        });
        Some(shed)
    }

    fn charge(&mut self, name: &str, w: &Waiting) -> RefReservation {
        let (wp, wq) = (self.wp, self.wq);
        let t = self.tenant(name);
        t.counter += wp * w.prompt as f64 / t.weight;
        t.provisional += wq * w.output as f64 / t.weight;
        t.inflight += 1;
        RefReservation {
            tenant: name.to_owned(),
            output: w.output,
            reported: 0,
            band: w.band,
            seq: w.seq,
            deadline: w.deadline,
            prompt: w.prompt,
        }
    }

    /// The next request: the most important band, the lowest key (ties:
    /// the older head), the tenant's oldest.
    pub fn pop(&mut self) -> Option<(u32, RefReservation)> {
        let band = self.waiting.iter().map(|w| w.band).min()?;
        let i = (0..self.waiting.len())
            .filter(|&i| self.waiting[i].band == band)
            .filter(|&i| {
                // The head of its tenant in the band.
                let w = &self.waiting[i];
                !self
                    .waiting
                    .iter()
                    .any(|x| x.band == band && x.tenant == w.tenant && x.seq < w.seq)
            })
            .min_by(|&a, &b| {
                let key = |i: usize| {
                    let t = &self.tenants[&self.waiting[i].tenant];
                    t.counter + t.provisional
                };
                key(a)
                    .total_cmp(&key(b))
                    .then(self.waiting[a].seq.cmp(&self.waiting[b].seq))
            })?;
        let w = self.waiting[i].clone();
        let r = self.charge(&w.tenant, &w);
        self.take(i);
        Some((w.id, r))
    }

    /// A dispatch without queueing.
    pub fn admit_direct(
        &mut self,
        tenant: &str,
        priority: u8,
        prompt: u64,
        max_tokens: Option<u64>,
        now: u64,
    ) -> RefReservation {
        self.tenant(tenant);
        self.rejoin(tenant);
        let w = Waiting {
            id: 0,
            tenant: tenant.to_owned(),
            band: usize::from(priority).min(self.bands - 1),
            seq: self.seq,
            prompt,
            output: max_tokens.unwrap_or(self.estimate),
            deadline: now.saturating_add(self.deadline),
        };
        self.seq += 1;
        self.charge(tenant, &w)
    }

    /// Output reported.
    pub fn report_output(&mut self, r: &mut RefReservation, tokens: u64) {
        let covered = tokens.min(r.output.saturating_sub(r.reported));
        r.reported = r.reported.saturating_add(tokens);
        let wq = self.wq;
        let t = self.tenants.get_mut(&r.tenant).unwrap();
        t.counter += wq * tokens as f64 / t.weight;
        t.provisional = (t.provisional - wq * covered as f64 / t.weight).max(0.0);
    }

    /// A dispatched request finished.
    pub fn settle(&mut self, mut r: RefReservation, output_tokens: u64) {
        let unreported = output_tokens.saturating_sub(r.reported);
        if unreported > 0 {
            self.report_output(&mut r, unreported);
        }
        let left = r.output.saturating_sub(r.reported);
        let wq = self.wq;
        let t = self.tenants.get_mut(&r.tenant).unwrap();
        t.inflight -= 1;
        t.provisional = if t.inflight == 0 {
            0.0
        } else {
            (t.provisional - wq * left as f64 / t.weight).max(0.0)
        };
    }

    /// A waiting request leaves; whether it was waiting.
    pub fn cancel(&mut self, id: u32) -> bool {
        match self.waiting.iter().position(|w| w.id == id) {
            Some(i) => {
                self.take(i);
                true
            }
            None => false,
        }
    }

    /// Due requests leave, earliest deadline first (ties: the older).
    pub fn expire(&mut self, now: u64) -> Vec<u32> {
        let mut out = Vec::new();
        while let Some(i) = (0..self.waiting.len())
            .filter(|&i| self.waiting[i].deadline <= now)
            .min_by_key(|&i| (self.waiting[i].deadline, self.waiting[i].seq))
        {
            out.push(self.take(i).id);
        }
        out
    }
}

fn cost(w: &Waiting) -> u128 {
    u128::from(w.prompt) + u128::from(w.output)
}
