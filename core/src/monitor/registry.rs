//! The registry: which workers and models a monitor knows, and the cold
//! paths that add and remove them.
//!
//! # Algorithm
//!
//! Read-copy-update over `ArcSwap`: the hot path loads the current
//! [`Registry`] snapshot without a lock (`ArcSwap::load`), while writers
//! serialize on the monitor's `writer` mutex, clone the snapshot, change the
//! clone and store it. A reader may keep an old snapshot for the length of
//! one call; a worker it still finds there is either live or marked
//! `removed` and publishes nothing.
//!
//! Adding a worker makes it visible in this order: its slot's data (id,
//! load, no lease), the model's `words_in_use`, the new snapshot (lookups by
//! id), the membership bit and epoch (routers), and finally its first
//! busy-state publication. Removing it runs the same steps backwards and
//! frees the slot last, so a slot is never reused while it is still a
//! member or still busy. The orderings are given where each step happens.
//!
//! Worker ids and model names come from the network, so the maps are keyed
//! with foldhash's per-process random seed (fast, and not predictable by a
//! publisher choosing ids that collide).

use std::collections::HashMap;
use std::sync::Arc;

use super::combine::Combiner;
use super::model::Model;
use super::rank::{Rank, Worker};
use super::Monitor;
use crate::clock::nanos;
use crate::error::WorkerError;
use crate::load::WorkerSpec;
use crate::sync::{lock, AtomicBool, Ordering};

type FastMap<K, V> = HashMap<K, V, foldhash::fast::RandomState>;

/// An immutable snapshot of the monitor's workers and models.
#[derive(Debug, Default, Clone)]
pub(super) struct Registry {
    pub(super) workers: FastMap<u64, Arc<Worker>>,
    pub(super) models: FastMap<Box<str>, Arc<Model>>,
    /// Ranks over all workers (bounded by `Limits::max_ranks`).
    pub(super) ranks: usize,
    /// One more with every snapshot stored.
    pub(super) generation: u64,
}

impl Monitor {
    /// Registers a worker of `model` with ranks `dp_start..dp_start + dp_size`.
    /// The model is created on its first worker and keeps its thresholds
    /// when its workers come and go.
    ///
    /// Every size is checked against the configured [`Limits`] before
    /// anything is allocated. When `max_models` is reached, a model with no
    /// workers, no settings of its own (thresholds never set, staleness as
    /// configured) and no [`Route`] handle is dropped to make room; if there
    /// is none, the new model is refused.
    ///
    /// Refusals are counted by reason (`frontend_worker_registrations_refused_total`).
    ///
    /// [`Limits`]: crate::Limits
    /// [`Route`]: super::Route
    pub fn add_worker(
        &self,
        model: &str,
        worker_id: u64,
        spec: WorkerSpec,
    ) -> Result<(), WorkerError> {
        let result = self.try_add_worker(model, worker_id, spec);
        if let Err(e) = &result {
            if let Some(i) = WorkerError::ADD_KINDS.iter().position(|k| *k == e.kind()) {
                // Relaxed: a counter for metrics.
                self.refused_workers[i].fetch_add(1, Ordering::Relaxed);
            }
        }
        result
    }

    fn try_add_worker(
        &self,
        model: &str,
        worker_id: u64,
        spec: WorkerSpec,
    ) -> Result<(), WorkerError> {
        let limits = &self.config.limits;
        limits.check_declaration(model, spec.dp_start, spec.dp_size)?;
        let _writer = lock(&self.writer);
        let current = self.registry.load_full();
        if current.workers.contains_key(&worker_id) {
            return Err(WorkerError::Duplicate(worker_id));
        }
        if current.workers.len() >= limits.max_workers {
            return Err(WorkerError::TooManyWorkers {
                limit: limits.max_workers,
            });
        }
        let ranks_after = current.ranks + spec.dp_size as usize;
        if ranks_after > limits.max_ranks {
            return Err(WorkerError::RankBudget {
                dp_size: spec.dp_size,
                limit: limits.max_ranks,
            });
        }
        let mut evict = None;
        let (model, new_model) = match current.models.get(model) {
            Some(m) => (m.clone(), false),
            None => {
                if current.models.len() >= limits.max_models {
                    evict = Some(self.evictable_model(&current).ok_or(
                        WorkerError::TooManyModels {
                            limit: limits.max_models,
                        },
                    )?);
                }
                (self.create_model(model), true)
            }
        };
        let slot = {
            let mut cold = lock(&model.cold);
            if let Some(slot) = cold.free.pop_first() {
                slot
            } else if cold.next < model.capacity() {
                cold.next += 1;
                cold.next - 1
            } else {
                return Err(WorkerError::ModelFull {
                    model: model.name.to_string(),
                    capacity: model.capacity(),
                });
            }
        };
        let now = self.clock.now_nanos();
        let worker = Arc::new(Worker {
            id: worker_id,
            model: model.clone(),
            slot,
            dp_start: spec.dp_start,
            ranks: (0..spec.dp_size).map(|_| Rank::new(&spec, now)).collect(),
            combiner: Combiner::new(),
            busy: AtomicBool::new(false),
            removed: AtomicBool::new(false),
            own_changed: AtomicBool::new(false),
        });
        // The slot is fresh or was fully released by `remove_worker`.
        // Relaxed: published to routers by the member bit set below (AcqRel).
        model.ids[slot].store(worker_id, Ordering::Relaxed);
        model.load[slot].store(0, Ordering::Relaxed);
        model.end_lease(slot);
        // AcqRel: pairs with the Acquire in `Model::words_in_use`, and keeps
        // the count ordered with other writers raising it.
        model
            .words_in_use
            .fetch_max(slot / 64 + 1, Ordering::AcqRel);
        let mut next = (*current).clone();
        next.generation += 1;
        next.workers.insert(worker_id, worker.clone());
        next.ranks = ranks_after;
        if let Some(name) = evict {
            next.models.remove(&name);
            self.drop_default_queue(&name);
        }
        if new_model {
            next.models.insert(model.name.clone(), model.clone());
        }
        self.registry.store(Arc::new(next));
        // AcqRel in `set`: a router that sees the bit sees the id stored above.
        model.members.set(slot);
        // Release: pairs with the Acquire in `Model::stamp`.
        model.members_epoch.fetch_add(1, Ordering::Release);
        // Relaxed: a count for metrics and `routable`, which treats it as a hint.
        model.workers.fetch_add(1, Ordering::Relaxed);
        // A busy-when-stale model or preset capacities can already decide.
        worker.reevaluate_and_wait();
        model.kick_flow();
        Ok(())
    }

    /// A model that can be dropped to make room for a new one: no workers,
    /// thresholds never set, the configured staleness, and no reference
    /// outside the registry (no worker, no [`Route`](super::Route)). Called
    /// with the writer lock held, so no worker can join it meanwhile; a
    /// reader that holds a registry snapshot only makes the count higher, so
    /// the check errs on the side of keeping a model.
    pub(super) fn evictable_model(&self, reg: &Registry) -> Option<Box<str>> {
        let flows = self.flows.load();
        reg.models
            .iter()
            .find(|(name, m)| {
                // A queue from the defaults, with nothing waiting, is no
                // setting of the model's own; it holds one handle to it.
                let queue = flows.get(*name);
                let default_queue = queue.is_some_and(|q| q.from_defaults);
                // Relaxed: `workers` changes only under the writer lock we
                // hold; the settings are plain values compared, ordering nothing.
                Arc::strong_count(m) == 1 + usize::from(default_queue)
                    && m.workers.load(Ordering::Relaxed) == 0
                    && m.staleness() == self.config.staleness
                    && m.stale_after.load(Ordering::Relaxed) == nanos(self.config.stale_after)
                    && lock(&m.cold).thresholds.version == 0
                    && (queue.is_none()
                        || default_queue && m.flow_waiting.load(Ordering::Relaxed) == 0)
            })
            .map(|(name, _)| name.clone())
    }

    /// Unregisters a worker: it leaves the busy set and the metrics at once.
    /// Outstanding [`Booking`](super::Booking)s on it become no-ops.
    pub fn remove_worker(&self, worker_id: u64) -> Result<(), WorkerError> {
        let _writer = lock(&self.writer);
        let current = self.registry.load_full();
        let Some(worker) = current.workers.get(&worker_id).cloned() else {
            return Err(WorkerError::Unknown(worker_id));
        };
        let model = &worker.model;
        model.members.clear(worker.slot);
        // Release: pairs with the Acquire in `Model::stamp`.
        model.members_epoch.fetch_add(1, Ordering::Release);
        // Relaxed: a count, as in `try_add_worker`.
        model.workers.fetch_sub(1, Ordering::Relaxed);
        // Relaxed: released to the publisher by the combiner registration
        // in `reevaluate_and_wait` just below.
        worker.removed.store(true, Ordering::Relaxed);
        // Publishes "not busy" and clears the bit before the slot is reused.
        worker.reevaluate_and_wait();
        model.end_lease(worker.slot);
        let mut next = (*current).clone();
        next.generation += 1;
        next.workers.remove(&worker_id);
        next.ranks -= worker.ranks.len();
        self.registry.store(Arc::new(next));
        lock(&model.cold).free.insert(worker.slot);
        // Its last worker gone, the model's waiting requests are refused.
        model.kick_flow();
        Ok(())
    }

    /// Ids of `model`'s workers, in slot order (empty for an unknown model).
    pub fn workers(&self, model: &str) -> Vec<u64> {
        let reg = self.registry.load();
        let Some(m) = reg.models.get(model) else {
            return Vec::new();
        };
        let mut ids: Vec<(usize, u64)> = reg
            .workers
            .values()
            .filter(|w| Arc::ptr_eq(&w.model, m))
            .map(|w| (w.slot, w.id))
            .collect();
        ids.sort_unstable();
        ids.into_iter().map(|(_, id)| id).collect()
    }

    /// Every model this monitor knows, sorted.
    pub fn models(&self) -> Vec<String> {
        let mut names: Vec<String> = self
            .registry
            .load()
            .models
            .keys()
            .map(|k| k.to_string())
            .collect();
        names.sort_unstable();
        names
    }
}
