//! The tenants' virtual token counters (VTC), in a bounded table.
//!
//! Each tenant's `counter` is the weighted service it has received: `w_p`
//! per prompt token when a request is dispatched and `w_q` per output token
//! as the request reports them, each divided by the tenant's weight. It
//! only grows. Beside it, `provisional` holds the weighted output reserved
//! for the tenant's requests in flight and not reported yet; the queue
//! orders tenants by the sum (`key`), so a tenant that just dispatched long
//! requests waits its turn before their output shows, and an estimate
//! leaves nothing behind once its request settles.
//!
//! # Rejoining
//!
//! A tenant whose first request queues (it was *idle*) rejoins at
//! `max(own, L)`: `L` is the lowest counter among the backlogged tenants,
//! or, with none backlogged, the lowest counter at the moment the last of
//! them stopped waiting (the *floor*). So an idle tenant cannot bank
//! credit. Counters only grow and a tenant joins at or above `L`, so `L`
//! never falls, and the floor is always at most `L`.
//!
//! # Forgetting
//!
//! The table holds at most `max_tenants`. A new tenant that finds it full
//! makes room by forgetting the idle tenant (nothing queued or in flight)
//! with the lowest counter. A forgotten tenant comes back as a new one,
//! which joins at `L` too, so forgetting a tenant whose counter is at or
//! below the floor changes nothing it will ever be charged: the rejoin
//! rule stays exact. If every idle tenant is above the floor, the one
//! forgotten raises `forgotten`, and every new tenant joins at no less
//! than it until the floor passes it: a returning tenant may lose what it
//! was owed below its old counter, never gain credit. With every tenant
//! queued or in flight, a new tenant's request is refused (`QueueFull`).

use std::collections::HashMap;

use foldhash::fast::RandomState;

use super::config::MAX_BANDS;

/// No flow, no slot.
pub(super) const NONE: u32 = u32::MAX;

/// One tenant (module docs).
#[derive(Debug)]
pub(super) struct Tenant {
    pub(super) name: Box<str>,
    pub(super) weight: f64,
    /// Weighted service received; only grows.
    pub(super) counter: f64,
    /// Weighted output reserved in flight and not reported yet.
    pub(super) provisional: f64,
    /// Its flow in each band (`NONE` where nothing of it waits).
    pub(super) flows: [u32; MAX_BANDS],
    /// Its requests waiting, in every band.
    pub(super) queued: u32,
    /// Its requests dispatched and not settled yet.
    pub(super) inflight: u32,
    /// Where it sits in `Tenants::backlogged` while `queued > 0`.
    backlog_pos: u32,
}

impl Tenant {
    /// What the queue orders tenants by: service plus what is reserved.
    #[inline]
    pub(super) fn key(&self) -> f64 {
        self.counter + self.provisional
    }

    fn idle(&self) -> bool {
        self.queued == 0 && self.inflight == 0
    }
}

/// The table (module docs).
pub(super) struct Tenants {
    index: HashMap<Box<str>, u32, RandomState>,
    slots: Vec<Tenant>,
    /// Slots whose tenant was forgotten to make room, ready for reuse.
    free: Vec<u32>,
    /// The tenants with something queued, in no order.
    backlogged: Vec<u32>,
    weights: HashMap<Box<str>, f64, RandomState>,
    max: usize,
    floor: f64,
    forgotten: f64,
}

impl Tenants {
    pub(super) fn new(max: usize, weights: &[(String, f64)]) -> Self {
        Self {
            index: HashMap::with_capacity_and_hasher(max.min(4096), RandomState::default()),
            slots: Vec::new(),
            free: Vec::new(),
            backlogged: Vec::with_capacity(max.min(4096)),
            weights: weights
                .iter()
                .map(|(n, w)| (n.as_str().into(), *w))
                .collect(),
            max,
            floor: 0.0,
            forgotten: 0.0,
        }
    }

    #[inline]
    pub(super) fn get(&self, t: u32) -> &Tenant {
        &self.slots[t as usize]
    }

    #[inline]
    pub(super) fn get_mut(&mut self, t: u32) -> &mut Tenant {
        &mut self.slots[t as usize]
    }

    /// Tenant `name`'s slot, if it is remembered.
    pub(super) fn find(&self, name: &str) -> Option<u32> {
        self.index.get(name).copied()
    }

    /// The `k` remembered tenants with the highest counters: name,
    /// counter and requests waiting.
    pub(super) fn top(&self, k: usize) -> Vec<(String, f64, u32)> {
        let mut all: Vec<&Tenant> = self
            .index
            .values()
            .map(|&t| &self.slots[t as usize])
            .collect();
        all.sort_unstable_by(|a, b| b.counter.total_cmp(&a.counter).then(a.name.cmp(&b.name)));
        all.into_iter()
            .take(k)
            .map(|t| (t.name.to_string(), t.counter, t.queued))
            .collect()
    }

    /// Tenants remembered.
    pub(super) fn len(&self) -> usize {
        self.index.len()
    }

    /// The floor (module docs).
    pub(super) fn floor(&self) -> f64 {
        self.floor
    }

    /// The slot of tenant `name`, remembering it if new; `None` if the
    /// table is full of tenants with requests queued or in flight.
    pub(super) fn find_or_add(&mut self, name: &str) -> Option<u32> {
        if let Some(&t) = self.index.get(name) {
            return Some(t);
        }
        if self.index.len() >= self.max {
            self.forget_one()?;
        }
        let tenant = Tenant {
            name: name.into(),
            weight: self.weights.get(name).copied().unwrap_or(1.0),
            counter: self.forgotten,
            provisional: 0.0,
            flows: [NONE; MAX_BANDS],
            queued: 0,
            inflight: 0,
            backlog_pos: NONE,
        };
        let t = match self.free.pop() {
            Some(t) => {
                self.slots[t as usize] = tenant;
                t
            }
            None => {
                self.slots.push(tenant);
                (self.slots.len() - 1) as u32
            }
        };
        self.index.insert(name.into(), t);
        Some(t)
    }

    /// Forgets the idle tenant with the lowest counter (module docs).
    fn forget_one(&mut self) -> Option<()> {
        let (t, counter) = self
            .index
            .values()
            .map(|&t| (t, &self.slots[t as usize]))
            .filter(|(_, x)| x.idle())
            .min_by(|a, b| a.1.counter.total_cmp(&b.1.counter))
            .map(|(t, x)| (t, x.counter))?;
        if counter > self.floor {
            self.forgotten = self.forgotten.max(counter);
        }
        let name = std::mem::take(&mut self.slots[t as usize].name);
        self.index.remove(&name);
        self.free.push(t);
        Some(())
    }

    /// `L`: the lowest counter among the backlogged tenants, or the floor.
    fn lowest(&self) -> f64 {
        self.backlogged
            .iter()
            .map(|&t| self.slots[t as usize].counter)
            .min_by(f64::total_cmp)
            .unwrap_or(self.floor)
    }

    /// Tenant `t` is served or queues: if it was not backlogged, it
    /// rejoins at `max(own, L)` (module docs).
    pub(super) fn rejoin(&mut self, t: u32) {
        if self.slots[t as usize].queued == 0 {
            let lowest = self.lowest();
            let x = &mut self.slots[t as usize];
            x.counter = x.counter.max(lowest);
        }
    }

    /// Tenant `t` has a request queued, rejoining first if it was idle.
    pub(super) fn queued_one(&mut self, t: u32) {
        if self.slots[t as usize].queued == 0 {
            self.rejoin(t);
            self.slots[t as usize].backlog_pos = self.backlogged.len() as u32;
            self.backlogged.push(t);
        }
        self.slots[t as usize].queued += 1;
    }

    /// One of tenant `t`'s requests left the queue (dispatched, cancelled,
    /// expired or shed). When it was its last, the tenant stops being
    /// backlogged, and the floor keeps the lowest counter of the moment.
    pub(super) fn unqueued_one(&mut self, t: u32) {
        let x = &mut self.slots[t as usize];
        x.queued -= 1;
        if x.queued > 0 {
            return;
        }
        self.floor = self.floor.max(self.lowest());
        let pos = std::mem::replace(&mut self.slots[t as usize].backlog_pos, NONE);
        self.backlogged.swap_remove(pos as usize);
        if let Some(&moved) = self.backlogged.get(pos as usize) {
            self.slots[moved as usize].backlog_pos = pos;
        }
    }
}
