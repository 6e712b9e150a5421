//! Leased mode's protocol (docs/replicas.md, "Leased mode"): each
//! frontend's share of every rank's line, claimed and confirmed through the
//! snapshots, so that the shares in use never sum past the line.
//!
//! * **Claims.** A frontend publishes its `claim` (parts per million) and
//!   never books past its `used` share, which is at most its claim. It
//!   lowers its share at once, and its claim only as far as what its
//!   bookings hold (`settle`). It raises in two steps: it publishes the
//!   higher claim in a snapshot stamped `at`, waits until every frontend it
//!   knows has sent a snapshot that echoes a stamp of its at or after
//!   `at`, and uses the raise only if the claims in those snapshots and its
//!   own sum to at most a million; otherwise it drops the raise. Of two
//!   raises that overlap, the later one's check sees the earlier (its echo
//!   was sent after the earlier raise was published, and a claim stays up
//!   while it is used), so the shares in use never sum past a million.
//! * **Leases.** A frontend uses its share only while its lease holds:
//!   until `lease` after the oldest of the latest stamps of its own that
//!   each other frontend echoed, and never longer than `lease` after the
//!   last of its own snapshots that came back through the transport.
//!   Another frontend forgets it only after `expire_after` (at least twice
//!   the lease) of silence, so by then it has stopped booking. A frontend
//!   whose lease ran out stops using its share, brings its claim down to
//!   what its bookings hold, and joins again.
//! * **Joining.** A frontend claims nothing until its own snapshots have
//!   come back without a gap for a join window of one and a half leases,
//!   in which it hears every frontend that still holds a lease (they send
//!   at least every quarter lease). It also learns the frontends the
//!   others hear, and a raise waits for their echoes too. A frontend whose
//!   transport may have lost messages (a disconnection, a slow subscriber)
//!   drops its share and joins again.
//! * **Sharing out.** Each frontend wants twice the share its bookings use
//!   plus one percent (twice its share when a booking found no room);
//!   every frontend computes the same water-filling split of the line from
//!   the wants it hears, lowers to its part, and raises towards it. A raise
//!   waits while a frontend with a lower id is raising, so raises do not
//!   collide forever.

use std::collections::HashMap;

use foldhash::fast::RandomState;

use super::super::transport::check_token;
use super::wire::{Heard, Lease};
use crate::monitor::share::WHOLE;

/// The least share a frontend wants, in parts per million.
const WANT_FLOOR: u32 = 10_000;

/// Another frontend, as its latest snapshot left it.
#[derive(Debug, Default)]
struct Peer {
    instance: u64,
    /// Its snapshots carry a lease section.
    leased: bool,
    stamp: u64,
    claim: u32,
    raising: bool,
    want: u32,
    /// The latest stamp of this frontend's own that it echoed.
    echo: Option<u64>,
    /// The frontends it hears.
    heard: Vec<String>,
}

/// One frontend's side of the protocol (module docs); the sync holds it
/// under its lock.
#[derive(Debug)]
pub(super) struct Leases {
    me: String,
    instance: u64,
    lease: u64,
    /// The stamp of the first of this frontend's own snapshots that have
    /// come back through the transport without a gap since (`None` until
    /// one has, and after a gap, a lapse or an interruption).
    run_from: Option<u64>,
    /// The seq of the last own snapshot that came back.
    own_seq: u64,
    /// The stamp of the last own snapshot that came back.
    own_heard: u64,
    claim: u32,
    used: u32,
    want: u32,
    /// The stamp of the snapshot that published a raise being confirmed.
    raise_at: Option<u64>,
    /// A raise decided, for the next snapshot to publish.
    raise_due: bool,
    /// The stamp of the last snapshot built.
    last_stamp: u64,
    peers: HashMap<String, Peer, RandomState>,
    /// The claim published before this step: a lower claim is kept above
    /// the bookings (`settle`).
    claim_before: u32,
    /// Times the lease ran out, or the transport lost messages, while a
    /// share was held.
    pub(super) fenced: u64,
}

/// What a step decided: the share to use until the deadline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Decision {
    pub(super) used: u32,
    pub(super) deadline: u64,
}

impl Leases {
    pub(super) fn new(me: &str, instance: u64, lease: u64) -> Self {
        Self {
            me: me.to_owned(),
            instance,
            lease,
            run_from: None,
            own_seq: 0,
            own_heard: 0,
            claim: 0,
            used: 0,
            want: WANT_FLOOR,
            raise_at: None,
            raise_due: false,
            last_stamp: 0,
            peers: HashMap::default(),
            claim_before: 0,
            fenced: 0,
        }
    }

    /// How often a snapshot must go out to keep the lease.
    pub(super) fn renew(&self) -> u64 {
        self.lease / 4
    }

    /// Checks another frontend's lease section before anything is applied.
    pub(super) fn check(lease: &Lease, max_frontends: usize) -> Result<(), String> {
        if lease.claim > WHOLE || lease.want > WHOLE || lease.used > lease.claim {
            return Err(format!(
                "lease claim {}, used {}, want {}: each at most {WHOLE}, used at most claim",
                lease.claim, lease.used, lease.want
            ));
        }
        if lease.heard.len() > max_frontends {
            return Err(format!(
                "lease hears {} frontends: at most {max_frontends}",
                lease.heard.len()
            ));
        }
        for h in &lease.heard {
            check_token(&h.frontend, "a lease's frontend heard").map_err(|e| e.to_string())?;
        }
        Ok(())
    }

    /// Takes in a checked snapshot from `frontend`; whether it asks for an
    /// answer at once (it is raising, and waits for the echoes).
    pub(super) fn heard(&mut self, frontend: &str, instance: u64, lease: Option<&Lease>) -> bool {
        let peer = self.peers.entry(frontend.to_owned()).or_default();
        if peer.instance != instance {
            *peer = Peer {
                instance,
                ..Peer::default()
            };
        }
        let Some(lease) = lease else {
            peer.leased = false;
            return false;
        };
        peer.leased = true;
        peer.stamp = peer.stamp.max(lease.stamp);
        (peer.claim, peer.raising, peer.want) = (lease.claim, lease.raising, lease.want);
        peer.heard.clear();
        let mut echo = None;
        for h in &lease.heard {
            if h.frontend == self.me {
                if h.instance == self.instance {
                    // A stamp not sent yet is not believed.
                    echo = Some(h.stamp.min(self.last_stamp));
                }
            } else {
                peer.heard.push(h.frontend.clone());
            }
        }
        if let Some(e) = echo {
            peer.echo = Some(peer.echo.map_or(e, |old| old.max(e)));
        }
        lease.raising
    }

    /// One of this frontend's own snapshots came back through the
    /// transport: the run goes on if it is the next one, else starts again.
    pub(super) fn came_back(&mut self, seq: u64, stamp: u64) {
        match self.run_from {
            Some(_) if seq == self.own_seq + 1 => {}
            _ if seq <= self.own_seq => return,
            _ => self.run_from = Some(stamp),
        }
        self.own_seq = seq;
        self.own_heard = self.own_heard.max(stamp.min(self.last_stamp));
    }

    /// Stops using the share and ends the run, so that it joins again; the
    /// claim comes down to what the bookings hold (`settle`).
    fn fence(&mut self) {
        if self.used > 0 {
            self.fenced += 1;
        }
        self.run_from = None;
        (self.claim, self.used, self.raise_at, self.raise_due) = (0, 0, None, false);
    }

    /// Whether this frontend's own snapshots have come back without a gap
    /// for a join window, one and a half leases: every frontend that holds
    /// a lease sent within it, and was heard.
    fn joined(&self) -> bool {
        self.run_from
            .is_some_and(|from| self.own_heard >= from.saturating_add(self.lease + self.lease / 2))
    }

    /// Forgets a frontend that went silent.
    pub(super) fn forget(&mut self, frontend: &str) {
        self.peers.remove(frontend);
    }

    /// When the lease runs out: `lease` after the last of its own
    /// snapshots that came back, and after the oldest latest echo.
    fn deadline(&self) -> u64 {
        self.peers
            .values()
            .filter_map(|p| p.echo)
            .fold(self.own_heard, u64::min)
            .saturating_add(self.lease)
    }

    /// Whether every frontend this one knows, or hears of, echoed `at`.
    fn confirmed(&self, at: u64) -> bool {
        let all_echoed = self
            .peers
            .values()
            .all(|p| p.leased && p.echo.is_some_and(|e| e >= at));
        let none_unheard = self
            .peers
            .values()
            .flat_map(|p| &p.heard)
            .all(|f| self.peers.contains_key(f));
        all_echoed && none_unheard
    }

    fn others_claim(&self) -> u64 {
        self.peers.values().map(|p| u64::from(p.claim)).sum()
    }

    /// One step at `now`, with `usage` the most of any rank's line this
    /// frontend has booked (parts per million, rounded up), `refused`
    /// whether a booking found no room in its share since the last step,
    /// and `interrupted` whether the transport may have lost messages since
    /// (`Transport::interruptions`: a frontend this one could not hear may
    /// have claimed meanwhile). Runs out the lease, settles a raise, and
    /// moves the claim towards this frontend's part.
    pub(super) fn step(
        &mut self,
        now: u64,
        usage: u32,
        refused: bool,
        interrupted: bool,
    ) -> Decision {
        self.claim_before = self.claim;
        if interrupted || (self.run_from.is_some() && self.deadline() <= now) {
            self.fence();
        }
        if let Some(at) = self.raise_at {
            if self.confirmed(at) {
                if self.others_claim() + u64::from(self.claim) <= u64::from(WHOLE) {
                    self.used = self.claim;
                } else {
                    self.claim = self.used;
                }
                self.raise_at = None;
            }
        }
        let base = if refused { usage.max(self.used) } else { usage };
        self.want = base.saturating_mul(2).saturating_add(WANT_FLOOR).min(WHOLE);
        let idle = self.raise_at.is_none() && !self.raise_due;
        if self.joined() {
            let part = self.part();
            if part < self.used {
                (self.claim, self.used, self.raise_at) = (part, part, None);
                self.raise_due = false;
            } else if part > self.claim && idle && !self.lower_raising() {
                let free = u64::from(WHOLE).saturating_sub(self.others_claim());
                let next = u64::from(part).min(free) as u32;
                if next > self.claim {
                    self.claim = next;
                    self.raise_due = true;
                }
            }
        }
        Decision {
            used: self.used,
            deadline: if self.used == 0 {
                u64::MAX
            } else {
                self.deadline()
            },
        }
    }

    /// After the share was set: `usage` is what the bookings held once it
    /// was (`Monitor::apply_share`). A claim lowered in this step stays at
    /// or above it (up to the claim before), so the published claim always
    /// covers the bookings, and nothing the others take was still booked
    /// here.
    pub(super) fn settle(&mut self, usage: u32) {
        self.claim = self.claim.max(usage.min(self.claim_before));
    }

    /// A raise by a frontend with a lower id is being confirmed.
    fn lower_raising(&self) -> bool {
        self.peers
            .iter()
            .any(|(id, p)| p.raising && id.as_str() < self.me.as_str())
    }

    /// This frontend's part of the line: the water-filling split of a
    /// million among the wants of every frontend in leased mode.
    fn part(&self) -> u32 {
        let mut wants: Vec<u32> = self
            .peers
            .values()
            .filter(|p| p.leased)
            .map(|p| p.want)
            .collect();
        wants.push(self.want);
        water_fill(self.want, &mut wants)
    }

    /// The lease section of the snapshot about to go out at `now`, with a
    /// new stamp; a raise just decided is stamped with it.
    pub(super) fn section(&mut self, now: u64) -> Lease {
        let stamp = now.max(self.last_stamp + 1);
        self.last_stamp = stamp;
        if std::mem::take(&mut self.raise_due) {
            self.raise_at = Some(stamp);
        }
        let mut heard: Vec<Heard> = self
            .peers
            .iter()
            .map(|(id, p)| Heard {
                frontend: id.clone(),
                instance: p.instance,
                stamp: p.stamp,
            })
            .collect();
        heard.sort_by(|a, b| a.frontend.cmp(&b.frontend));
        Lease {
            stamp,
            claim: self.claim,
            used: self.used,
            raising: self.raise_at.is_some(),
            want: self.want,
            heard,
        }
    }

    /// Whether a decided change waits to be published.
    pub(super) fn due(&self) -> bool {
        self.raise_due
    }

    /// The share used and claimed, in parts per million.
    pub(super) fn shares(&self) -> (u32, u32) {
        (self.used, self.claim)
    }
}

/// `mine`'s part of a million split among `wants` (which include it):
/// everyone gets their want when the wants fit, plus an equal part of what
/// is left; otherwise everyone gets at most the level at which the capped
/// wants sum to a million.
fn water_fill(mine: u32, wants: &mut [u32]) -> u32 {
    let n = wants.len() as u64;
    let total: u64 = wants.iter().map(|&w| u64::from(w)).sum();
    if total <= u64::from(WHOLE) {
        return (u64::from(mine) + (u64::from(WHOLE) - total) / n) as u32;
    }
    wants.sort_unstable();
    let mut left = u64::from(WHOLE);
    for (i, &w) in wants.iter().enumerate() {
        let level = left / (n - i as u64);
        if u64::from(w) > level {
            return mine.min(level as u32);
        }
        left -= u64::from(w);
    }
    mine
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn water_filling_gives_wants_that_fit_and_levels_the_rest() {
        assert_eq!(water_fill(100_000, &mut [100_000, 100_000]), 500_000);
        let mut w = [WHOLE, WHOLE, WHOLE, WHOLE];
        assert_eq!(water_fill(WHOLE, &mut w), 250_000);
        let mut w = [10_000, WHOLE, WHOLE];
        assert_eq!(water_fill(10_000, &mut w), 10_000);
        let mut w = [10_000, WHOLE, WHOLE];
        assert_eq!(water_fill(WHOLE, &mut w), 495_000);
        // Parts never sum past a million.
        let wants = [300_000u32, 450_000, 999_999, 20_000];
        let sum: u64 = wants
            .iter()
            .map(|&m| u64::from(water_fill(m, &mut wants.clone())))
            .sum();
        assert!(sum <= u64::from(WHOLE), "{sum}");
    }
}
