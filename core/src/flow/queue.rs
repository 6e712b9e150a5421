//! One model's frontend queue: who waits, in what order, and who is turned
//! away (module docs of `flow`). A plain data structure: the caller holds
//! it under its lock, reads the clock and finds the worker.
//!
//! Storage is reserved when the queue is built: a slab of `queue_limit`
//! entries (each request's payload and its place in its flow), a slab of
//! flows (one per tenant and band with something waiting, so at most one
//! per entry), the deadline heap and the shedding plan. Pushing, popping,
//! cancelling and expiring allocate nothing; only a tenant not seen before
//! allocates its name (`tenants.rs`).

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::time::Duration;

use super::config::{FlowConfig, FlowConfigError, MAX_BANDS, MAX_FLOW_DEADLINE};

mod shed;
use super::drain::{self, EventRate, Rate};
use super::tenants::{Tenants, NONE};
use super::{FlowRejection, FlowRequest, QueueKey, Reservation};
use crate::clock::nanos;
use crate::limits::DEFAULT_MAX_NAME_LEN;

/// Most requests one arrival may shed; an arrival that would need more is
/// refused instead.
pub const MAX_SHED: usize = 64;

struct Entry<T> {
    payload: Option<T>,
    gen: u32,
    /// Its flow; `NONE` while the entry is free.
    flow: u32,
    /// Older and newer entries of its flow (`next` links the free list).
    prev: u32,
    next: u32,
    seq: u64,
    deadline: u64,
    prompt: u64,
    output: u64,
}

impl<T> Entry<T> {
    fn cost(&self) -> u128 {
        u128::from(self.prompt) + u128::from(self.output)
    }
}

/// One tenant's requests of one band, oldest first.
#[derive(Clone, Copy)]
struct Flow {
    tenant: u32,
    band: u8,
    head: u32,
    tail: u32,
    /// Flows of its band (`next` links the free list).
    prev: u32,
    next: u32,
}

/// A victim flow of a shedding plan: its newest entry not yet planned, and
/// how many are.
#[derive(Clone, Copy)]
struct Planned {
    flow: u32,
    tail: u32,
    taken: u32,
}

/// Where a dispatched request stood, and what it reserved
/// (`Reservation`).
#[derive(Clone, Copy)]
struct Place {
    band: u8,
    seq: u64,
    deadline: u64,
    prompt: u64,
    output: u64,
}

/// What the queue keeps of a tenant's waiting requests beside the table.
#[derive(Clone, Copy, Default)]
struct Waiting {
    prompt: u128,
    output: u128,
}

/// See the module docs.
pub struct FlowQueue<T> {
    limit: u32,
    token_limit: Option<u128>,
    deadline: u64,
    prompt_weight: f64,
    output_weight: f64,
    output_estimate: u64,
    entries: Vec<Entry<T>>,
    free_entry: u32,
    flows: Vec<Flow>,
    free_flow: u32,
    /// Each band's first flow and its waiting requests.
    bands: [(u32, u32); MAX_BANDS],
    tenants: Tenants,
    /// Each tenant slot's waiting tokens (indexed as the table's slots).
    waiting: Vec<Waiting>,
    /// Each waiting request's deadline, arrival order, slot and generation:
    /// earliest deadline first, the older first among equal deadlines.
    deadlines: BinaryHeap<Reverse<(u64, u64, u32, u32)>>,
    plan: Vec<Planned>,
    queued: u32,
    queued_tokens: u128,
    seq: u64,
    drain: EventRate,
    /// Each band's requests taken in (queued or sent at once); on the
    /// heap, as they are large.
    taken: Box<[EventRate]>,
}

impl<T> FlowQueue<T> {
    /// An empty queue for `config`.
    pub fn new(config: &FlowConfig) -> Result<Self, FlowConfigError> {
        config.validate()?;
        let limit = config.queue_limit;
        Ok(Self {
            limit,
            token_limit: config.queue_tokens.map(u128::from),
            deadline: nanos(config.deadline),
            prompt_weight: config.prompt_weight,
            output_weight: config.output_weight,
            output_estimate: config.output_estimate,
            entries: Vec::with_capacity(limit as usize),
            free_entry: NONE,
            flows: Vec::with_capacity(limit as usize),
            free_flow: NONE,
            bands: [(NONE, 0); MAX_BANDS],
            tenants: Tenants::new(config.max_tenants, &config.tenant_weights),
            waiting: Vec::new(),
            deadlines: BinaryHeap::with_capacity(2 * limit as usize),
            plan: Vec::with_capacity(MAX_SHED),
            queued: 0,
            queued_tokens: 0,
            seq: 0,
            drain: EventRate::new(),
            taken: (0..MAX_BANDS).map(|_| EventRate::new()).collect(),
        })
    }

    /// Requests waiting.
    pub fn len(&self) -> u32 {
        self.queued
    }

    /// Whether nothing waits.
    pub fn is_empty(&self) -> bool {
        self.queued == 0
    }

    /// Estimated tokens waiting (prompt plus reserved output).
    pub fn tokens(&self) -> u128 {
        self.queued_tokens
    }

    /// Requests waiting in band `band`.
    pub fn band_len(&self, band: usize) -> u32 {
        self.bands.get(band).map_or(0, |b| b.1)
    }

    /// Tenants remembered.
    pub fn tenants(&self) -> usize {
        self.tenants.len()
    }

    /// The `k` remembered tenants with the most weighted service: name,
    /// counter and requests waiting, the most served first (for metrics).
    pub fn top_tenants(&self, k: usize) -> Vec<(String, f64, u32)> {
        self.tenants.top(k)
    }

    /// Tenant `name`'s virtual token counter, if it is remembered.
    pub fn counter(&self, name: &str) -> Option<f64> {
        self.tenant_slot(name).map(|t| self.tenants.get(t).counter)
    }

    /// The lowest counter among the backlogged tenants the last time the
    /// last of them stopped waiting: where an idle tenant rejoins when
    /// nobody is backlogged (`tenants.rs`).
    pub fn floor(&self) -> f64 {
        self.tenants.floor()
    }

    fn tenant_slot(&self, name: &str) -> Option<u32> {
        self.tenants.find(name)
    }

    /// Queues `request` with `payload` at time `now` (clock nanoseconds), or
    /// refuses it (with the payload back). A full queue sheds by the fair
    /// rule (module docs of `flow`): the payloads turned away for this
    /// arrival go to `shed`, and the arrival itself may be the one refused.
    pub fn push(
        &mut self,
        request: &FlowRequest<'_>,
        payload: T,
        now: u64,
        shed: impl FnMut(T),
    ) -> Result<QueueKey, (FlowRejection, T)> {
        let band = usize::from(request.priority).min(MAX_BANDS - 1);
        let output = request.max_tokens.unwrap_or(self.output_estimate);
        let cost = u128::from(request.prompt_tokens) + u128::from(output);
        if request.tenant.len() <= DEFAULT_MAX_NAME_LEN
            && self.token_limit.is_some_and(|limit| cost > limit)
        {
            return Err((FlowRejection::QueueFull, payload));
        }
        let tenant = match self.tenant_of(request.tenant) {
            Ok(t) => t,
            Err(e) => return Err((e, payload)),
        };
        let place = Place {
            band: band as u8,
            seq: self.seq,
            deadline: now.saturating_add(self.wait(request)),
            prompt: request.prompt_tokens,
            output,
        };
        let placed = self.place(tenant, place, payload, shed);
        if placed.is_ok() {
            self.seq += 1;
            self.taken[band].record(now);
        }
        placed
    }

    /// Queues `payload` of `tenant` at `place` (its band, arrival order and
    /// deadline), shedding by the fair rule to make room, or refuses it.
    fn place(
        &mut self,
        tenant: u32,
        place: Place,
        payload: T,
        shed: impl FnMut(T),
    ) -> Result<QueueKey, (FlowRejection, T)> {
        let (band, prompt, output) = (usize::from(place.band), place.prompt, place.output);
        let cost = u128::from(prompt) + u128::from(output);
        if self.token_limit.is_some_and(|limit| cost > limit)
            || (!self.fits(0, cost) && !self.plan_shedding(tenant, band, (prompt, output)))
        {
            return Err((FlowRejection::QueueFull, payload));
        }
        self.shed_planned(shed);
        let entry = Entry {
            payload: Some(payload),
            gen: 0,
            flow: NONE,
            prev: NONE,
            next: NONE,
            seq: place.seq,
            deadline: place.deadline,
            prompt,
            output,
        };
        Ok(self.insert(tenant, band, entry))
    }

    /// Makes sure the per-tenant waiting tokens cover slot `t`.
    fn waiting_of(&mut self, t: u32) {
        if self.waiting.len() <= t as usize {
            self.waiting.resize(t as usize + 1, Waiting::default());
        }
    }

    fn insert(&mut self, tenant: u32, band: usize, mut entry: Entry<T>) -> QueueKey {
        let flow = match self.tenants.get(tenant).flows[band] {
            NONE => self.new_flow(tenant, band),
            f => f,
        };
        entry.flow = flow;
        // After the newest entry older than it: the tail for an arrival,
        // further forward for a request put back (`requeue`).
        let mut prev = self.flows[flow as usize].tail;
        while prev != NONE && self.entries[prev as usize].seq > entry.seq {
            prev = self.entries[prev as usize].prev;
        }
        entry.prev = prev;
        let (prompt, output, deadline, seq) =
            (entry.prompt, entry.output, entry.deadline, entry.seq);
        self.queued_tokens += entry.cost();
        let index = match self.free_entry {
            NONE => {
                self.entries.push(entry);
                (self.entries.len() - 1) as u32
            }
            i => {
                let slot = &mut self.entries[i as usize];
                self.free_entry = slot.next;
                entry.gen = slot.gen;
                *slot = entry;
                i
            }
        };
        let next = if prev == NONE {
            std::mem::replace(&mut self.flows[flow as usize].head, index)
        } else {
            std::mem::replace(&mut self.entries[prev as usize].next, index)
        };
        self.entries[index as usize].next = next;
        if next == NONE {
            self.flows[flow as usize].tail = index;
        } else {
            self.entries[next as usize].prev = index;
        }
        self.bands[band].1 += 1;
        self.queued += 1;
        let w = &mut self.waiting[tenant as usize];
        w.prompt += u128::from(prompt);
        w.output += u128::from(output);
        self.tenants.queued_one(tenant);
        let gen = self.entries[index as usize].gen;
        if self.deadlines.len() == self.deadlines.capacity() {
            let entries = &self.entries;
            self.deadlines.retain(|Reverse((_, _, i, g))| {
                entries[*i as usize].gen == *g && entries[*i as usize].flow != NONE
            });
        }
        self.deadlines.push(Reverse((deadline, seq, index, gen)));
        QueueKey { index, gen }
    }

    fn new_flow(&mut self, tenant: u32, band: usize) -> u32 {
        let head = self.bands[band].0;
        let flow = Flow {
            tenant,
            band: band as u8,
            head: NONE,
            tail: NONE,
            prev: NONE,
            next: head,
        };
        let f = match self.free_flow {
            NONE => {
                self.flows.push(flow);
                (self.flows.len() - 1) as u32
            }
            f => {
                self.free_flow = self.flows[f as usize].next;
                self.flows[f as usize] = flow;
                f
            }
        };
        if head != NONE {
            self.flows[head as usize].prev = f;
        }
        self.bands[band].0 = f;
        self.tenants.get_mut(tenant).flows[band] = f;
        f
    }

    /// Takes entry `e` out of its flow and the queue: its payload.
    fn remove(&mut self, e: u32) -> T {
        let entry = &mut self.entries[e as usize];
        let (flow, prev, next) = (entry.flow, entry.prev, entry.next);
        let payload = entry
            .payload
            .take()
            .expect("a queued entry has its payload");
        let (prompt, output) = (entry.prompt, entry.output);
        self.queued_tokens -= entry.cost();
        entry.flow = NONE;
        entry.gen = entry.gen.wrapping_add(1);
        entry.next = self.free_entry;
        self.free_entry = e;
        let f = self.flows[flow as usize];
        if prev == NONE {
            self.flows[flow as usize].head = next;
        } else {
            self.entries[prev as usize].next = next;
        }
        if next == NONE {
            self.flows[flow as usize].tail = prev;
        } else {
            self.entries[next as usize].prev = prev;
        }
        let band = usize::from(f.band);
        self.bands[band].1 -= 1;
        self.queued -= 1;
        let w = &mut self.waiting[f.tenant as usize];
        w.prompt -= u128::from(prompt);
        w.output -= u128::from(output);
        if self.flows[flow as usize].head == NONE {
            self.drop_flow(flow);
        }
        self.tenants.unqueued_one(f.tenant);
        payload
    }

    fn drop_flow(&mut self, flow: u32) {
        let f = self.flows[flow as usize];
        let band = usize::from(f.band);
        if f.prev == NONE {
            self.bands[band].0 = f.next;
        } else {
            self.flows[f.prev as usize].next = f.next;
        }
        if f.next != NONE {
            self.flows[f.next as usize].prev = f.prev;
        }
        self.tenants.get_mut(f.tenant).flows[band] = NONE;
        self.flows[flow as usize].next = self.free_flow;
        self.free_flow = flow;
    }

    /// The next request to dispatch, at time `now`: the most important band
    /// first, then the tenant with the lowest key (ties: the older head),
    /// then the tenant's oldest. Charges the prompt and reserves the
    /// output; the reservation must come back through
    /// [`settle`](Self::settle).
    pub fn pop(&mut self, now: u64) -> Option<(T, Reservation)> {
        let flow = self.next_flow()?;
        let head = self.flows[flow as usize].head;
        let place = {
            let e = &self.entries[head as usize];
            Place {
                band: self.flows[flow as usize].band,
                seq: e.seq,
                deadline: e.deadline,
                prompt: e.prompt,
                output: e.output,
            }
        };
        let tenant = self.flows[flow as usize].tenant;
        // Charged before it leaves the queue: if it was the last waiter,
        // the floor is the counter with this dispatch in it.
        let reservation = self.charge(tenant, place);
        let payload = self.remove(head);
        self.drain.record(now);
        Some((payload, reservation))
    }

    /// The payload [`pop`](Self::pop) would take next.
    pub fn peek(&self) -> Option<&T> {
        let flow = self.next_flow()?;
        let head = self.flows[flow as usize].head;
        self.entries[head as usize].payload.as_ref()
    }

    /// The flow whose head goes next: the most important band's flow with
    /// the lowest key (ties: the older head).
    fn next_flow(&self) -> Option<u32> {
        let band = self.bands.iter().position(|b| b.0 != NONE)?;
        let mut best: Option<(u32, f64, u64)> = None;
        let mut f = self.bands[band].0;
        while f != NONE {
            let flow = &self.flows[f as usize];
            let key = self.tenants.get(flow.tenant).key();
            let seq = self.entries[flow.head as usize].seq;
            if best.is_none_or(|(_, k, s)| key < k || (key == k && seq < s)) {
                best = Some((f, key, seq));
            }
            f = flow.next;
        }
        best.map(|(f, _, _)| f)
    }

    /// Checks that `tenant` may be served (a name of at most 256 bytes, and
    /// room in the tenant table), remembering it: after this,
    /// [`admit_direct`](Self::admit_direct) of the tenant cannot fail
    /// until the queue changes.
    pub fn check_tenant(&mut self, tenant: &str) -> Result<(), FlowRejection> {
        self.tenant_of(tenant).map(drop)
    }

    fn tenant_of(&mut self, tenant: &str) -> Result<u32, FlowRejection> {
        if tenant.len() > DEFAULT_MAX_NAME_LEN {
            return Err(FlowRejection::InvalidTenant);
        }
        let t = self
            .tenants
            .find_or_add(tenant)
            .ok_or(FlowRejection::QueueFull)?;
        self.waiting_of(t);
        Ok(t)
    }

    /// Dispatches `request` without queueing it (nothing waits and a worker
    /// is free): charged and reserved as [`pop`](Self::pop) does, its
    /// tenant rejoining first if it was idle.
    pub fn admit_direct(
        &mut self,
        request: &FlowRequest<'_>,
        now: u64,
    ) -> Result<Reservation, FlowRejection> {
        let tenant = self.tenant_of(request.tenant)?;
        self.tenants.rejoin(tenant);
        self.drain.record(now);
        self.taken[usize::from(request.priority).min(MAX_BANDS - 1)].record(now);
        let place = Place {
            band: request.priority.min(MAX_BANDS as u8 - 1),
            seq: self.seq,
            deadline: now.saturating_add(self.wait(request)),
            prompt: request.prompt_tokens,
            output: request.max_tokens.unwrap_or(self.output_estimate),
        };
        self.seq += 1;
        Ok(self.charge(tenant, place))
    }

    /// How long `request` may wait, in nanoseconds.
    fn wait(&self, request: &FlowRequest<'_>) -> u64 {
        request
            .deadline
            .map_or(self.deadline, |d| nanos(d.min(MAX_FLOW_DEADLINE)))
    }

    /// How long `request` may wait: its own deadline (at most
    /// [`MAX_FLOW_DEADLINE`]) or the queue's.
    pub fn deadline_of(&self, request: &FlowRequest<'_>) -> Duration {
        Duration::from_nanos(self.wait(request))
    }

    /// Requests waiting that a new request of `priority` would wait
    /// behind: those of its band and the more important ones.
    pub fn ahead_of(&self, priority: u8) -> u32 {
        let band = usize::from(priority).min(MAX_BANDS - 1);
        (0..=band).map(|b| self.band_len(b)).sum()
    }

    /// How long a request of `priority` queued at `now` (clock
    /// nanoseconds) is predicted to wait: the requests [`ahead_of`] it,
    /// and itself, over the drain rate (every dispatch, queued or direct,
    /// counts), or over `freed` if that is less (a drain measured outside
    /// the queue: the monitor's, the rate its bookings end), less the rate
    /// at which more important requests are taken in, which go ahead of it
    /// as they come ([`Duration::MAX`] when they take it all). Each rate is
    /// measured over the `horizon` before `now` (the wait the prediction
    /// is for: a drain that comes in bursts is seen whole), and the
    /// difference is taken `RATE_SPREADS` (`drain.rs`) standard deviations
    /// low (counts taken as Poisson): a small share left by large rates is
    /// uncertain, and a wait predicted from it long. It is never shorter
    /// than what remains of the drain's longest pause over four horizons
    /// before `now`: a drain in bursts sends the next only after one.
    /// `None` before two dispatches.
    ///
    /// [`ahead_of`]: Self::ahead_of
    pub fn predicted_wait(
        &self,
        priority: u8,
        now: u64,
        horizon: Duration,
        freed: Option<Rate>,
    ) -> Option<Duration> {
        let band = usize::from(priority).min(MAX_BANDS - 1);
        let ahead = self.ahead_of(priority);
        let taken = &self.taken[..band];
        drain::wait(ahead, &self.drain, taken, freed, now, nanos(horizon))
    }

    /// Charges tenant `t` a dispatch of `place.prompt` tokens and reserves
    /// `place.output`.
    fn charge(&mut self, tenant: u32, place: Place) -> Reservation {
        let (wp, wq) = (self.prompt_weight, self.output_weight);
        let x = self.tenants.get_mut(tenant);
        x.counter += wp * place.prompt as f64 / x.weight;
        x.provisional += wq * place.output as f64 / x.weight;
        x.inflight += 1;
        Reservation {
            tenant,
            output: place.output,
            reported: 0,
            band: place.band,
            seq: place.seq,
            deadline: place.deadline,
            prompt: place.prompt,
        }
    }

    /// Puts a dispatched request back (a worker refused it before it
    /// started) with `payload`, at time `now`: its tenant's charge is
    /// undone, as if it had never left, and it rejoins its band and tenant
    /// at its original place (its arrival order) with its original
    /// deadline. Refused with [`FlowRejection::QueueDeadline`] when that
    /// deadline has passed, or shed by the fair rule as an arrival would
    /// be (`shed` as in [`push`](Self::push)); a refused request costs its
    /// tenant nothing.
    pub fn requeue(
        &mut self,
        r: Reservation,
        payload: T,
        now: u64,
        shed: impl FnMut(T),
    ) -> Result<QueueKey, (FlowRejection, T)> {
        let tenant = r.tenant;
        let place = Place {
            band: r.band,
            seq: r.seq,
            deadline: r.deadline,
            prompt: r.prompt,
            output: r.output,
        };
        let reported = r.reported;
        self.settle(r, reported);
        let wp = self.prompt_weight;
        let x = self.tenants.get_mut(tenant);
        // Never below zero, whatever the rounding of the charges between.
        x.counter = (x.counter - wp * place.prompt as f64 / x.weight).max(0.0);
        if place.deadline <= now {
            return Err((FlowRejection::QueueDeadline, payload));
        }
        self.place(tenant, place, payload, shed)
    }

    /// Output tokens a dispatched request has produced so far (`tokens`
    /// more): charged at once, and taken off its reservation.
    pub fn report_output(&mut self, r: &mut Reservation, tokens: u64) {
        let covered = tokens.min(r.output.saturating_sub(r.reported));
        r.reported = r.reported.saturating_add(tokens);
        let wq = self.output_weight;
        let x = self.tenants.get_mut(r.tenant);
        x.counter += wq * tokens as f64 / x.weight;
        x.provisional = (x.provisional - wq * covered as f64 / x.weight).max(0.0);
    }

    /// A dispatched request finished (or was cancelled) with
    /// `output_tokens` in all: what was not reported yet is charged, and
    /// the rest of its reservation released.
    pub fn settle(&mut self, mut r: Reservation, output_tokens: u64) {
        let unreported = output_tokens.saturating_sub(r.reported);
        if unreported > 0 {
            self.report_output(&mut r, unreported);
        }
        let left = r.output.saturating_sub(r.reported);
        let wq = self.output_weight;
        let x = self.tenants.get_mut(r.tenant);
        x.inflight -= 1;
        x.provisional = if x.inflight == 0 {
            0.0
        } else {
            (x.provisional - wq * left as f64 / x.weight).max(0.0)
        };
    }

    /// Takes the request `key` out of the queue (its client left): its
    /// payload, or `None` if it is no longer queued.
    pub fn cancel(&mut self, key: QueueKey) -> Option<T> {
        let e = self.entries.get(key.index as usize)?;
        (e.gen == key.gen && e.flow != NONE).then(|| self.remove(key.index))
    }

    /// Takes every request whose deadline is `now` or earlier out of the
    /// queue, handing each payload to `expired`; how many.
    pub fn expire(&mut self, now: u64, mut expired: impl FnMut(T)) -> usize {
        let mut n = 0;
        while let Some(&Reverse((deadline, _, index, gen))) = self.deadlines.peek() {
            if deadline > now {
                break;
            }
            self.deadlines.pop();
            let e = &self.entries[index as usize];
            if e.gen == gen && e.flow != NONE {
                expired(self.remove(index));
                n += 1;
            }
        }
        n
    }

    /// Takes one request whose deadline is `now` or earlier out of the
    /// queue: its payload, or `None` if none is due.
    pub fn expire_one(&mut self, now: u64) -> Option<T> {
        let deadline = self.next_deadline()?;
        if deadline > now {
            return None;
        }
        let Reverse((_, _, index, _)) = self.deadlines.pop()?;
        Some(self.remove(index))
    }

    /// The earliest deadline of a waiting request (clock nanoseconds).
    pub fn next_deadline(&mut self) -> Option<u64> {
        while let Some(&Reverse((deadline, _, index, gen))) = self.deadlines.peek() {
            let e = &self.entries[index as usize];
            if e.gen == gen && e.flow != NONE {
                return Some(deadline);
            }
            self.deadlines.pop();
        }
        None
    }

    /// How long a refused client should wait before trying again: the
    /// queue's length over its measured drain rate, from 1 s up to the
    /// default deadline (the deadline when nothing has drained yet).
    pub fn retry_after(&self) -> Duration {
        let most = Duration::from_nanos(self.deadline);
        self.drain
            .per_second()
            .map_or(most, |rate| {
                Duration::from_secs_f64((f64::from(self.queued) / rate).ceil())
            })
            .clamp(Duration::from_secs(1), most.max(Duration::from_secs(1)))
    }
}
