//! Reference routing: an immutable snapshot swapped whole on every change.
//!
//! This models the reference system's routing state as its frontend keeps
//! it: an `ArcSwap` holding the discovered and routable ids, the busy
//! (overloaded) `HashSet<u64>` and a precomputed free-id `Vec`. Every change
//! of the busy set goes through [`RefRouter::set_overloaded`], which turns the
//! monitor's id list back into a `HashSet`, takes the update `Mutex`, compares
//! it with the current set and, if it differs, rebuilds the whole snapshot
//! (cloning the id vectors and re-deriving the free ids) and stores it.
//!
//! Routing reads the snapshot lock-free: round-robin and random index into
//! the free ids; power-of-two picks two free ids and compares their in-flight
//! counts in a `DashMap<u64, AtomicU64>` (the reference's occupancy map). The
//! KV path clones the busy set per decision (`overloaded_ids()` returns an
//! owned `HashSet`, or `None` while it is empty) and filters the candidate
//! costs with it.
//!
//! Random numbers come from the same per-thread xorshift the benches use for
//! loadgate's inputs, which is cheaper than the reference's `rand` generator:
//! the baseline is never made slower than the design it models.

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use arc_swap::ArcSwap;
use dashmap::DashMap;

use crate::rng;

/// Why the reference router could not route.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RefRouteError {
    /// No instance registered (HTTP 503).
    Unavailable,
    /// Instances registered, all busy (HTTP 529).
    Overloaded,
}

/// The routing snapshot.
#[derive(Debug, Clone)]
struct RoutingInstances {
    discovered_ids: Vec<u64>,
    routable_ids: Vec<u64>,
    overloaded_ids: HashSet<u64>,
    free_ids: Vec<u64>,
}

impl RoutingInstances {
    fn from_parts(
        discovered_ids: Vec<u64>,
        routable_ids: Vec<u64>,
        overloaded_ids: HashSet<u64>,
    ) -> Self {
        let free_ids = if overloaded_ids.is_empty() {
            routable_ids.to_vec()
        } else {
            routable_ids
                .iter()
                .copied()
                .filter(|id| !overloaded_ids.contains(id))
                .collect()
        };
        Self {
            discovered_ids,
            routable_ids,
            overloaded_ids,
            free_ids,
        }
    }

    fn set_overloaded(&self, overloaded_ids: HashSet<u64>) -> Self {
        Self::from_parts(
            self.discovered_ids.clone(),
            self.routable_ids.clone(),
            overloaded_ids,
        )
    }

    /// An owned copy of the busy set, `None` while it is empty.
    fn overloaded_ids(&self) -> Option<HashSet<u64>> {
        if self.overloaded_ids.is_empty() {
            None
        } else {
            Some(self.overloaded_ids.clone())
        }
    }
}

/// The reference router. See the module docs.
#[derive(Debug)]
pub struct RefRouter {
    snapshot: ArcSwap<RoutingInstances>,
    update_lock: Mutex<()>,
    round_robin: AtomicUsize,
    occupancy: DashMap<u64, AtomicU64>,
}

impl RefRouter {
    /// A router over `ids`, none busy.
    pub fn new(ids: &[u64]) -> Self {
        let ids = ids.to_vec();
        let occupancy = DashMap::new();
        for &id in &ids {
            occupancy.insert(id, AtomicU64::new(0));
        }
        Self {
            snapshot: ArcSwap::from_pointee(RoutingInstances::from_parts(
                ids.clone(),
                ids,
                HashSet::new(),
            )),
            update_lock: Mutex::new(()),
            round_robin: AtomicUsize::new(0),
            occupancy,
        }
    }

    /// Publishes a new busy set (the monitor's id list); rebuilds the snapshot
    /// if it changed. Returns whether it changed.
    pub fn set_overloaded(&self, overloaded: &[u64]) -> bool {
        let overloaded: HashSet<u64> = overloaded.iter().copied().collect();
        let _guard = self.update_lock.lock().unwrap_or_else(|e| e.into_inner());
        let current = self.snapshot.load();
        if current.overloaded_ids == overloaded {
            return false;
        }
        let next = Arc::new(current.set_overloaded(overloaded));
        self.snapshot.store(next);
        true
    }

    /// Sets the in-flight count the power-of-two policy compares.
    pub fn set_occupancy(&self, id: u64, load: u64) {
        if let Some(c) = self.occupancy.get(&id) {
            c.store(load, Ordering::Relaxed);
        }
    }

    /// Round-robin over the free ids.
    #[inline]
    pub fn select_round_robin(&self) -> Result<u64, RefRouteError> {
        let counter = self.round_robin.fetch_add(1, Ordering::Relaxed);
        let snap = self.snapshot.load();
        let free = Self::free(&snap)?;
        Ok(free[counter % free.len()])
    }

    /// Uniformly random among the free ids.
    #[inline]
    pub fn select_random(&self) -> Result<u64, RefRouteError> {
        let snap = self.snapshot.load();
        let free = Self::free(&snap)?;
        Ok(free[(rng::next() % free.len() as u64) as usize])
    }

    /// Two random free ids; the one with fewer in-flight requests wins.
    #[inline]
    pub fn select_power_of_two(&self) -> Result<u64, RefRouteError> {
        let snap = self.snapshot.load();
        let free = Self::free(&snap)?;
        let a = free[(rng::next() % free.len() as u64) as usize];
        let b = free[(rng::next() % free.len() as u64) as usize];
        let load = |id: u64| {
            self.occupancy
                .get(&id)
                .map_or(0, |c| c.load(Ordering::Relaxed))
        };
        Ok(if load(b) < load(a) { b } else { a })
    }

    /// The KV path: the lowest-cost candidate that is not busy.
    #[inline]
    pub fn select_min_cost(&self, costs: &[(u64, f64)]) -> Result<u64, RefRouteError> {
        let snap = self.snapshot.load();
        if snap.routable_ids.is_empty() {
            return Err(RefRouteError::Unavailable);
        }
        let overloaded = snap.overloaded_ids();
        let mut best: Option<(u64, f64)> = None;
        for &(id, cost) in costs {
            if overloaded.as_ref().is_some_and(|o| o.contains(&id)) {
                continue;
            }
            if best.is_none_or(|(_, b)| cost < b) {
                best = Some((id, cost));
            }
        }
        best.map(|(id, _)| id).ok_or(RefRouteError::Overloaded)
    }

    /// Whether `id` is in the busy set (a pinned-worker check).
    #[inline]
    pub fn is_overloaded(&self, id: u64) -> bool {
        self.snapshot.load().overloaded_ids.contains(&id)
    }

    /// Number of free ids in the current snapshot.
    pub fn free_count(&self) -> usize {
        self.snapshot.load().free_ids.len()
    }

    #[inline]
    fn free(snap: &RoutingInstances) -> Result<&[u64], RefRouteError> {
        if snap.routable_ids.is_empty() {
            return Err(RefRouteError::Unavailable);
        }
        if snap.free_ids.is_empty() {
            return Err(RefRouteError::Overloaded);
        }
        Ok(&snap.free_ids)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_around_the_busy_set() {
        let r = RefRouter::new(&[1, 2, 3]);
        assert!(r.set_overloaded(&[2]));
        assert!(!r.set_overloaded(&[2]));
        for _ in 0..10 {
            assert_ne!(r.select_round_robin(), Ok(2));
            assert_ne!(r.select_random(), Ok(2));
            assert_ne!(r.select_power_of_two(), Ok(2));
        }
        assert_eq!(r.select_min_cost(&[(2, 0.0), (3, 1.0), (1, 2.0)]), Ok(3));
        assert!(r.set_overloaded(&[1, 2, 3]));
        assert_eq!(r.select_round_robin(), Err(RefRouteError::Overloaded));
        assert_eq!(
            r.select_min_cost(&[(1, 0.0)]),
            Err(RefRouteError::Overloaded)
        );
        assert_eq!(
            RefRouter::new(&[]).select_random(),
            Err(RefRouteError::Unavailable)
        );
    }
}
