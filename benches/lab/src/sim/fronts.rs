//! The frontends of a run: one, or several replicas behind a load balancer
//! that hands each request to one of them in turn. Each replica has its
//! own `Monitor` fed by the same load reports; with booking sync each also
//! runs a `BookingSync`, ticked every debounce interval, whose messages
//! cross the run's transport like the load reports (every replica hears
//! its own come back, as NATS delivers them). The sim also keeps the
//! blocks each admission took per rank, over every replica, to count the
//! admissions that left a rank past its line.

use std::sync::Arc;
use std::time::Duration;

use loadgate::cluster::replicas::{BookingSync, BookingSyncConfig, SyncMode};
use loadgate::cluster::{Subjects, Subscriber, SubscriberConfig};
use loadgate::{Maintenance, Monitor, MonitorConfig, SharedClock};

use super::{ns, Conditions, Ev, Sim, MODEL};
use crate::arm::Arm;

/// Leased mode's lease in the lab: a fifth of the default, so that the
/// join window (one and a half leases, in which a replica admits nothing)
/// takes 0.3 s of each run.
const LAB_LEASE: Duration = Duration::from_millis(200);

/// One frontend replica.
pub(super) struct Front {
    pub(super) monitor: Arc<Monitor>,
    pub(super) subscriber: Arc<Subscriber>,
    pub(super) sync: Option<Arc<BookingSync>>,
}

impl Front {
    /// Replica `i` of a run, with booking sync when the conditions say.
    pub(super) fn new(
        i: u32,
        clock: &SharedClock,
        subjects: &Subjects,
        c: &Conditions,
        arm: &Arm,
    ) -> Result<Self, String> {
        // The simulation owns time: the monitor's maintenance runs after
        // each event (`flow.rs`), not on a thread. The arm's routing policy
        // and reroutes are the monitor's own settings.
        let config = MonitorConfig {
            stale_after: Duration::from_secs(3),
            maintenance: Maintenance::Manual,
            routing: arm.routing(),
            reroutes: arm.reroute,
            ..Default::default()
        };
        let monitor =
            Arc::new(Monitor::with_config(config, clock.clone()).map_err(|e| e.to_string())?);
        let sub_config = SubscriberConfig {
            expire_after: Duration::from_secs(3600),
            ..Default::default()
        };
        let subscriber = Subscriber::new(monitor.clone(), sub_config, clock.clone())
            .map_err(|e| e.to_string())?;
        let sync = match c.sync_debounce_s {
            Some(d) => {
                let mut config = BookingSyncConfig::new(format!("frontend-{i}"));
                config.debounce = Duration::from_secs_f64(d);
                if c.sync_leased {
                    config.mode = SyncMode::Leased;
                    config.lease = LAB_LEASE;
                }
                Some(
                    BookingSync::new(monitor.clone(), subjects, config, clock.clone())
                        .map_err(|e| e.to_string())?,
                )
            }
            None => None,
        };
        Ok(Self {
            monitor,
            subscriber,
            sync,
        })
    }
}

impl Sim<'_> {
    /// The monitor of the replica that request `id` came through.
    pub(super) fn monitor_of(&self, id: u32) -> Option<&Arc<Monitor>> {
        self.fronts
            .get(self.reqs[id as usize].frontend as usize)
            .map(|f| &f.monitor)
    }

    /// A message reaches every replica: booking sync messages their syncs,
    /// load reports their subscribers. A refusal is counted by the
    /// receiver; the lab's own messages are never refused.
    pub(super) fn deliver(&self, subject: &str, payload: &[u8]) {
        let sync = subject.contains(".bookings.");
        for f in &self.fronts {
            match (&f.sync, sync) {
                (Some(s), true) => {
                    let _ = s.handle_on(subject, payload);
                }
                (_, false) => {
                    let _ = f.subscriber.handle_on(subject, payload);
                }
                (None, true) => {}
            }
        }
    }

    /// Every replica's sync ticks, and what they send starts its trip.
    pub(super) fn sync_tick(&mut self) {
        for f in &self.fronts {
            if let Some(s) = &f.sync {
                let _ = s.tick(&*self.bus);
            }
        }
        for (_, payload) in self.bus.outbox.lock().expect("outbox").iter() {
            self.sync_messages.0 += 1;
            self.sync_messages.1 += payload.len() as u64;
            self.sync_messages.2 = self.sync_messages.2.max(payload.len());
        }
        self.send_bus();
        if let Some(d) = self.c.sync_debounce_s {
            self.at(self.now + ns(d), Ev::SyncTick);
        }
    }

    /// Moves what the bus holds onto the transport: delivered after the
    /// transport delay.
    pub(super) fn send_bus(&mut self) {
        let sent = std::mem::take(&mut *self.bus.outbox.lock().expect("outbox"));
        let at = self.now + ns(self.c.transport_delay_s);
        for (subject, payload) in sent {
            self.at(at, Ev::Deliver(subject, payload));
        }
    }

    /// Lets go of what the frontend holds for request `id`: its dispatch
    /// (released) and its place in the queue (left).
    pub(super) fn let_go(&mut self, id: u32) {
        let r = &mut self.reqs[id as usize];
        r.dispatch = None;
        r.waiting = None;
        self.let_go_admitted(id);
    }

    /// Request `id` was admitted to `rank` of worker `w` with `blocks`:
    /// counts it on the rank, and a breach if the rank is then past its
    /// line (`Thresholds::decode_line` of the first replica's monitor).
    pub(super) fn admitted(&mut self, id: u32, w: u32, rank: u32, blocks: u64) {
        self.let_go_admitted(id);
        self.reqs[id as usize].admitted = Some((w, rank, blocks));
        let n = self.inflight.entry((w, rank)).or_default();
        *n += blocks;
        let n = *n;
        let Some(front) = self.fronts.first() else {
            return;
        };
        let t = front
            .monitor
            .thresholds(MODEL)
            .unwrap_or_default()
            .thresholds;
        let line = t.decode_line(u64::from(self.c.engine.num_gpu_blocks));
        if n > line {
            self.line_breaches += 1;
            self.peak_over_line = self.peak_over_line.max(n - line);
        }
    }

    fn let_go_admitted(&mut self, id: u32) {
        if let Some((w, rank, blocks)) = self.reqs[id as usize].admitted.take() {
            if let Some(n) = self.inflight.get_mut(&(w, rank)) {
                *n -= blocks;
            }
        }
    }
}
