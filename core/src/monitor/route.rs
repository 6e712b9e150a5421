//! [`Route`]: a routing handle bound to one model, so that a frontend that
//! routes to a known model skips the registry lookup on every request. The
//! handle holds the model itself; picks go through the same lock-free path
//! as [`Monitor::select`] (see `pick.rs`).

use std::fmt;
use std::sync::Arc;

use super::config::{Policy, DEFAULT_ENDPOINT};
use super::model::Model;
use super::Monitor;
use crate::clock::SharedClock;
use crate::error::{RouteError, WorkerError};
use crate::sync::lock;

/// A routing handle for one model, from [`Monitor::route`]: `select` reads
/// the model's bitsets directly, with no registry guard and no name lookup.
/// Cheap to clone; `Send + Sync`.
#[derive(Clone)]
pub struct Route {
    model: Arc<Model>,
    clock: SharedClock,
}

impl fmt::Debug for Route {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Route")
            .field("model", &self.model.name)
            .finish_non_exhaustive()
    }
}

impl Route {
    /// The model this handle routes to.
    pub fn model(&self) -> &str {
        &self.model.name
    }

    /// [`Monitor::select`] for this handle's model.
    #[inline]
    pub fn select(&self, policy: Policy) -> Result<u64, RouteError> {
        self.model.select(policy, &self.clock, DEFAULT_ENDPOINT)
    }

    /// [`Monitor::select_at`] for this handle's model.
    #[inline]
    pub fn select_at(&self, policy: Policy, endpoint: &str) -> Result<u64, RouteError> {
        self.model.select(policy, &self.clock, endpoint)
    }
}

impl Monitor {
    /// A routing handle for `model`: [`select`](Self::select) without the
    /// model lookup, for frontends that route to a known model on every
    /// request. Creates the model (with no workers, so `select` answers
    /// Unavailable) if it is new; a model with a handle is never dropped, so
    /// the handle stays valid while workers come and go.
    ///
    /// A new model counts against [`Limits`](crate::Limits) like one a
    /// worker brings: its name must fit `max_name_len`, and when
    /// `max_models` is reached an idle model is dropped to make room (see
    /// [`add_worker`](Self::add_worker)) or the handle is refused with
    /// [`WorkerError::TooManyModels`]. So handles made from names in
    /// requests cannot grow the monitor without bound.
    pub fn route(&self, model: &str) -> Result<Route, WorkerError> {
        let limits = &self.config.limits;
        limits.check_model_name(model)?;
        let found = self.registry.load().models.get(model).cloned();
        let model = match found {
            Some(m) => m,
            None => {
                let _writer = lock(&self.writer);
                let current = self.registry.load_full();
                match current.models.get(model) {
                    Some(m) => m.clone(),
                    None => {
                        let evict = if current.models.len() >= limits.max_models {
                            Some(self.evictable_model(&current).ok_or(
                                WorkerError::TooManyModels {
                                    limit: limits.max_models,
                                },
                            )?)
                        } else {
                            None
                        };
                        let m = self.create_model(model);
                        let mut next = (*current).clone();
                        next.generation += 1;
                        if let Some(name) = evict {
                            next.models.remove(&name);
                            self.drop_default_queue(&name);
                        }
                        next.models.insert(m.name.clone(), m.clone());
                        self.registry.store(Arc::new(next));
                        m
                    }
                }
            }
        };
        Ok(Route {
            model,
            clock: self.clock.clone(),
        })
    }
}
