//! Gate configuration: engine limit, queue size, queue deadline, and the
//! environment variables that set them for drop-in use.

use std::fmt;
use std::time::Duration;

use crate::metrics::{valid_prefix, DEFAULT_PREFIX};

/// Environment variable holding the engine request limit `N` (the
/// reference's newest name; [`ENGINE_REQUEST_LIMIT_ALIAS`] is the older one).
pub const ENGINE_REQUEST_LIMIT_ENV: &str = "DYN_BACKEND_ADMISSION_ENGINE_REQUEST_LIMIT";

/// The older name of [`ENGINE_REQUEST_LIMIT_ENV`].
pub const ENGINE_REQUEST_LIMIT_ALIAS: &str = "DYN_ENGINE_REQUEST_LIMIT";

/// Environment variable holding the overflow queue size `Q` (default 16; 0
/// means no queue). The reference's newest name; [`QUEUE_LIMIT_ALIAS`] is
/// the older one.
pub const QUEUE_LIMIT_ENV: &str = "DYN_BACKEND_ADMISSION_REQUEST_QUEUE_LIMIT";

/// The older name of [`QUEUE_LIMIT_ENV`].
pub const QUEUE_LIMIT_ALIAS: &str = "DYN_DYNAMO_REQUEST_QUEUE_LIMIT";

/// Environment variable holding the wait limit `W` (unset: no wait limit).
pub const WAIT_LIMIT_ENV: &str = "DYN_BACKEND_ADMISSION_ENGINE_WAIT_LIMIT";

/// Environment variable holding the queue deadline in milliseconds (unset: off).
pub const QUEUE_TIMEOUT_ENV: &str = "DYN_DYNAMO_REQUEST_QUEUE_TIMEOUT_MS";

/// The queue size used when [`QUEUE_LIMIT_ENV`] is unset.
pub const DEFAULT_QUEUE_LIMIT: u32 = 16;

/// Largest engine limit `N` (the running and limit fields are 21 bits wide).
pub const MAX_LIMIT: u32 = (1 << 21) - 1;

/// Largest queue size `Q` (the queued field is 21 bits wide).
pub const MAX_QUEUE: u32 = (1 << 21) - 1;

/// Most priority classes a gate has.
pub const MAX_CLASSES: usize = 8;

/// One priority class of a gate (see [`GateConfig::classes`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClassConfig {
    /// How many requests of this class may wait, at most the gate's queue
    /// size `Q`. 0: the class never waits (sheddable traffic), it is
    /// admitted only when a slot is free for it and rejected otherwise.
    pub queue: u32,
    /// Queue deadline of this class's waiters (`None`: they wait as long as
    /// it takes). Must not be zero.
    pub queue_timeout: Option<Duration>,
    /// Reserved slots: the last `reserved` of the `N` slots go only to this
    /// class and more important ones. So class `k` may run while fewer than
    /// `N - r` requests run, `r` being the largest reservation of a class
    /// more important than `k`. At most `N` (checked when the gate is built;
    /// a later [`set_limit`](super::AdmissionGate::set_limit) below it leaves
    /// the less important classes no slot until the limit rises again).
    pub reserved: u32,
}

/// How an [`AdmissionGate`](super::AdmissionGate) is shaped.
///
/// Build one with [`GateConfig::new`] and the `with_*` methods, or with
/// [`GateConfig::from_env`] to honour the reference system's environment
/// variables. Values are checked when the gate is built.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GateConfig {
    /// Engine slots `N`: how many requests may run at once. At least 1.
    pub limit: u32,
    /// Wait limit `W`: how many admitted requests may be without their
    /// first response at once (1 to [`MAX_LIMIT`]). A request is admitted
    /// only when a request slot and a wait slot are both free;
    /// [`Permit::first_response`](super::Permit::first_response) frees the
    /// wait slot. `None` (the default): no wait limit.
    pub wait_limit: Option<u32>,
    /// Overflow queue size `Q`: how many requests may wait for a slot. 0 means
    /// no queue: a request that finds no free slot is rejected at once.
    pub queue: u32,
    /// Queue deadline (controlled delay): a waiter queued this long or longer
    /// is rejected with [`AdmitError::QueueTimeout`](super::AdmitError). `None`
    /// (the default) turns it off. Must not be zero.
    pub queue_timeout: Option<Duration>,
    /// After a deadline expiry, hand the next freed slot to the newest waiter
    /// instead of the oldest (once), so that a backlog of stale requests does
    /// not starve fresh ones. Off by default.
    pub adaptive_lifo: bool,
    /// Prefix of every metric name (default `dynamo`).
    pub metrics_prefix: String,
    /// Priority classes, class 0 the most important: 1 to [`MAX_CLASSES`].
    /// Empty (the default) means one class that may fill the whole queue
    /// with the gate's queue deadline: the gate without classes.
    ///
    /// `Q` ([`queue`](Self::queue)) bounds the whole queue; each class has
    /// its own limit within it. A freed slot goes to the oldest waiter of
    /// the most important class that has one (and may use the slot, see
    /// [`ClassConfig::reserved`]). An arrival that finds the whole queue full,
    /// its own class not full, displaces the newest waiter of the least
    /// important class that is less important than its own; that waiter is
    /// rejected with [`AdmitError::Displaced`](super::AdmitError).
    pub classes: Vec<ClassConfig>,
}

impl GateConfig {
    /// `limit` engine slots, a queue of [`DEFAULT_QUEUE_LIMIT`], no deadline.
    pub fn new(limit: u32) -> Self {
        Self {
            limit,
            wait_limit: None,
            queue: DEFAULT_QUEUE_LIMIT,
            queue_timeout: None,
            adaptive_lifo: false,
            metrics_prefix: DEFAULT_PREFIX.to_owned(),
            classes: Vec::new(),
        }
    }

    /// `n` priority classes, each allowed to fill the whole queue, with the
    /// gate's queue deadline and no reserved slots; shape them with
    /// [`with_class`](Self::with_class). Set the queue size and deadline
    /// first: the classes copy them.
    #[must_use]
    pub fn with_classes(mut self, n: usize) -> Self {
        let class = ClassConfig {
            queue: self.queue,
            queue_timeout: self.queue_timeout,
            reserved: 0,
        };
        self.classes = vec![class; n];
        self
    }

    /// Sets class `index`, first adding classes as
    /// [`with_classes`](Self::with_classes) does up to it if there are fewer
    /// (more than [`MAX_CLASSES`] is reported when the gate is built).
    #[must_use]
    pub fn with_class(mut self, index: usize, class: ClassConfig) -> Self {
        if index >= self.classes.len() {
            let n = index.saturating_add(1).min(MAX_CLASSES + 1);
            let default = self.clone().with_classes(1).classes[0];
            self.classes.resize(n, default);
        }
        if let Some(slot) = self.classes.get_mut(index) {
            *slot = class;
        }
        self
    }

    /// The classes as the gate runs them: [`classes`](Self::classes), or the
    /// single class of a gate without classes.
    pub(crate) fn effective_classes(&self) -> Vec<ClassConfig> {
        if self.classes.is_empty() {
            vec![ClassConfig {
                queue: self.queue,
                queue_timeout: self.queue_timeout,
                reserved: 0,
            }]
        } else {
            self.classes.clone()
        }
    }

    /// Sets (or with `None` turns off) the wait limit `W`.
    #[must_use]
    pub fn with_wait_limit(mut self, wait_limit: Option<u32>) -> Self {
        self.wait_limit = wait_limit;
        self
    }

    /// Sets the queue size `Q`.
    #[must_use]
    pub fn with_queue(mut self, queue: u32) -> Self {
        self.queue = queue;
        self
    }

    /// Sets (or with `None` turns off) the queue deadline.
    #[must_use]
    pub fn with_queue_timeout(mut self, timeout: Option<Duration>) -> Self {
        self.queue_timeout = timeout;
        self
    }

    /// Turns adaptive LIFO on or off.
    #[must_use]
    pub fn with_adaptive_lifo(mut self, on: bool) -> Self {
        self.adaptive_lifo = on;
        self
    }

    /// Sets the metric name prefix.
    #[must_use]
    pub fn with_metrics_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.metrics_prefix = prefix.into();
        self
    }

    /// The configuration for an engine limit of `limit`, with the queue size
    /// and deadline read from [`QUEUE_LIMIT_ENV`] (or its older name
    /// [`QUEUE_LIMIT_ALIAS`]) and [`QUEUE_TIMEOUT_ENV`], and the wait limit
    /// from [`WAIT_LIMIT_ENV`] (an integer from 1 to [`MAX_LIMIT`]; unset:
    /// no wait limit).
    ///
    /// Call it only when an engine limit is configured (the reference reads
    /// the queue variable only then). Values are trimmed; the queue size is
    /// an integer from 0 to [`MAX_QUEUE`] (default 16 when unset, 0 = no
    /// queue); the deadline is a positive integer of milliseconds (off when
    /// unset). When both names of a setting are set, the newer one wins, and
    /// each must be valid. A variable that is set but empty or malformed is
    /// an error naming the variable and its value, never a silent fallback.
    pub fn from_env(limit: u32) -> Result<Self, ConfigError> {
        Self::from_lookup(limit, env_lookup)
    }

    /// Everything from the environment, the engine request limit included:
    /// [`ENGINE_REQUEST_LIMIT_ENV`] (or its older name
    /// [`ENGINE_REQUEST_LIMIT_ALIAS`]), an integer from 1 to [`MAX_LIMIT`],
    /// then as [`from_env`](Self::from_env). With neither name set there is
    /// no limit to enforce: [`ConfigError::MissingEnv`].
    pub fn from_env_all() -> Result<Self, ConfigError> {
        Self::from_lookup_all(env_lookup)
    }

    /// [`GateConfig::from_env_all`] over any variable lookup.
    pub fn from_lookup_all(lookup: impl Fn(&str) -> Option<String>) -> Result<Self, ConfigError> {
        let limit = read_pair(
            &lookup,
            [ENGINE_REQUEST_LIMIT_ENV, ENGINE_REQUEST_LIMIT_ALIAS],
            1,
            u64::from(MAX_LIMIT),
            "an integer from 1 to 2097151",
        )?
        .ok_or(ConfigError::MissingEnv {
            var: ENGINE_REQUEST_LIMIT_ENV,
            alias: ENGINE_REQUEST_LIMIT_ALIAS,
        })?;
        Self::from_lookup(limit as u32, lookup)
    }

    /// [`GateConfig::from_env`] over any variable lookup (for tests and for
    /// hosts that keep their settings elsewhere).
    pub fn from_lookup(
        limit: u32,
        lookup: impl Fn(&str) -> Option<String>,
    ) -> Result<Self, ConfigError> {
        let mut config = Self::new(limit);
        if let Some(queue) = read_pair(
            &lookup,
            [QUEUE_LIMIT_ENV, QUEUE_LIMIT_ALIAS],
            0,
            u64::from(MAX_QUEUE),
            "an integer from 0 to 2097151",
        )? {
            config.queue = queue as u32;
        }
        if let Some(raw) = lookup(WAIT_LIMIT_ENV) {
            let w = parse_env(&raw, 1, u64::from(MAX_LIMIT)).ok_or_else(|| {
                ConfigError::InvalidEnv {
                    var: WAIT_LIMIT_ENV,
                    value: raw.clone(),
                    expected: "an integer from 1 to 2097151",
                }
            })?;
            config.wait_limit = Some(w as u32);
        }
        if let Some(raw) = lookup(QUEUE_TIMEOUT_ENV) {
            let ms = parse_env(&raw, 1, u64::MAX).ok_or_else(|| ConfigError::InvalidEnv {
                var: QUEUE_TIMEOUT_ENV,
                value: raw.clone(),
                expected: "a positive integer of milliseconds",
            })?;
            config.queue_timeout = Some(Duration::from_millis(ms));
        }
        config.validate()?;
        Ok(config)
    }

    /// Checks every field; the gate constructors call this.
    pub fn validate(&self) -> Result<(), ConfigError> {
        check_limit(self.limit)?;
        if self.queue > MAX_QUEUE {
            return Err(ConfigError::OutOfRange {
                field: "queue",
                value: u64::from(self.queue),
                max: u64::from(MAX_QUEUE),
            });
        }
        match self.wait_limit {
            Some(0) => return Err(ConfigError::ZeroWaitLimit),
            Some(w) if w > MAX_LIMIT => {
                return Err(ConfigError::OutOfRange {
                    field: "wait_limit",
                    value: u64::from(w),
                    max: u64::from(MAX_LIMIT),
                })
            }
            _ => {}
        }
        if self.queue_timeout == Some(Duration::ZERO) {
            return Err(ConfigError::ZeroTimeout);
        }
        if self.classes.len() > MAX_CLASSES {
            return Err(ConfigError::OutOfRange {
                field: "classes",
                value: self.classes.len() as u64,
                max: MAX_CLASSES as u64,
            });
        }
        for (index, class) in self.classes.iter().enumerate() {
            let bad = |field, value: u32, max: u32| {
                Err(ConfigError::InvalidClass {
                    index,
                    field,
                    value: u64::from(value),
                    max: u64::from(max),
                })
            };
            if class.queue > self.queue {
                return bad("queue", class.queue, self.queue);
            }
            if class.reserved > self.limit {
                return bad("reserved", class.reserved, self.limit);
            }
            if class.queue_timeout == Some(Duration::ZERO) {
                return Err(ConfigError::ZeroTimeout);
            }
        }
        if !valid_prefix(&self.metrics_prefix) {
            return Err(ConfigError::InvalidPrefix(self.metrics_prefix.clone()));
        }
        Ok(())
    }
}

/// Checks an engine limit `N`: 1 to [`MAX_LIMIT`].
pub(crate) fn check_limit(limit: u32) -> Result<(), ConfigError> {
    if limit == 0 {
        return Err(ConfigError::ZeroLimit);
    }
    if limit > MAX_LIMIT {
        return Err(ConfigError::OutOfRange {
            field: "limit",
            value: u64::from(limit),
            max: u64::from(MAX_LIMIT),
        });
    }
    Ok(())
}

/// The process environment, for the `from_env*` constructors.
fn env_lookup(name: &str) -> Option<String> {
    std::env::var_os(name).map(|v| v.to_string_lossy().into_owned())
}

/// Reads a setting that has a newer name and an older one: each that is set
/// must be an integer in `min..=max` (or it is an error naming it); the
/// newer one wins.
fn read_pair(
    lookup: &impl Fn(&str) -> Option<String>,
    [newer, older]: [&'static str; 2],
    min: u64,
    max: u64,
    expected: &'static str,
) -> Result<Option<u64>, ConfigError> {
    let read = |var: &'static str| {
        lookup(var)
            .map(|raw| {
                parse_env(&raw, min, max).ok_or(ConfigError::InvalidEnv {
                    var,
                    value: raw,
                    expected,
                })
            })
            .transpose()
    };
    let (newer, older) = (read(newer)?, read(older)?);
    Ok(newer.or(older))
}

/// Parses a trimmed decimal integer in `min..=max`; `None` when it is not one.
fn parse_env(raw: &str, min: u64, max: u64) -> Option<u64> {
    let text = raw.trim();
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    text.parse::<u64>().ok().filter(|v| (min..=max).contains(v))
}

/// A gate configuration that was refused; no gate was built or changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConfigError {
    /// The engine limit `N` is 0; a gate needs at least one slot.
    ZeroLimit,
    /// A field is larger than the packed state word can hold.
    OutOfRange {
        /// The field name (`limit`, `queue` or `wait_limit`).
        field: &'static str,
        /// The value given.
        value: u64,
        /// The largest allowed value.
        max: u64,
    },
    /// An environment variable is set to something that is not allowed.
    InvalidEnv {
        /// The variable name.
        var: &'static str,
        /// Its value, as found.
        value: String,
        /// What it must be.
        expected: &'static str,
    },
    /// No engine request limit is set in the environment.
    MissingEnv {
        /// The variable's name.
        var: &'static str,
        /// Its older name.
        alias: &'static str,
    },
    /// The queue deadline is zero (use `None` to turn it off).
    ZeroTimeout,
    /// The wait limit `W` is 0 (use `None` for no wait limit).
    ZeroWaitLimit,
    /// The metric prefix is not a valid Prometheus metric name.
    InvalidPrefix(String),
    /// A priority class's setting is larger than the gate allows: its
    /// queue larger than the whole queue `Q`, or its reservation larger than
    /// the engine limit `N`.
    InvalidClass {
        /// The class (0 the most important).
        index: usize,
        /// The field name (`queue` or `reserved`).
        field: &'static str,
        /// The value given.
        value: u64,
        /// The largest allowed value.
        max: u64,
    },
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConfigError::ZeroLimit => {
                f.write_str("engine request limit = 0 is invalid: must be at least 1")
            }
            ConfigError::OutOfRange { field, value, max } => {
                write!(
                    f,
                    "{field} = {value} is out of range: must be at most {max}"
                )
            }
            ConfigError::InvalidEnv {
                var,
                value,
                expected,
            } => {
                write!(f, "{var} = {value:?} is invalid: expected {expected}")
            }
            ConfigError::InvalidClass {
                index,
                field,
                value,
                max,
            } => write!(
                f,
                "class {index}: {field} = {value} is out of range: must be at most {max}"
            ),
            ConfigError::MissingEnv { var, alias } => write!(
                f,
                "no engine request limit: set {var} (or {alias}) to an integer from 1 to 2097151"
            ),
            ConfigError::ZeroTimeout => f.write_str(
                "queue_timeout = 0 is invalid: must be positive (use None to turn it off)",
            ),
            ConfigError::ZeroWaitLimit => f.write_str(
                "wait_limit = 0 is invalid: must be at least 1 (use None for no wait limit)",
            ),
            ConfigError::InvalidPrefix(p) => write!(
                f,
                "metrics_prefix = {p:?} is invalid: must match [a-zA-Z_:][a-zA-Z0-9_:]*"
            ),
        }
    }
}

impl std::error::Error for ConfigError {}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    fn lookup<'a>(vars: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |name| {
            vars.iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| (*v).to_owned())
        }
    }

    #[test]
    fn the_newest_names_win_and_the_older_ones_still_work() {
        let c = GateConfig::from_lookup_all(lookup(&[
            (ENGINE_REQUEST_LIMIT_ENV, "8"),
            (ENGINE_REQUEST_LIMIT_ALIAS, "4"),
            (QUEUE_LIMIT_ENV, "0"),
            (QUEUE_LIMIT_ALIAS, "9"),
        ]))
        .unwrap();
        assert_eq!((c.limit, c.queue), (8, 0), "newer names win; 0 = no queue");
        let c = GateConfig::from_lookup_all(lookup(&[
            (ENGINE_REQUEST_LIMIT_ALIAS, " 4 "),
            (QUEUE_LIMIT_ALIAS, "9"),
        ]))
        .unwrap();
        assert_eq!((c.limit, c.queue), (4, 9), "older names alone");
        let c = GateConfig::from_lookup_all(lookup(&[(ENGINE_REQUEST_LIMIT_ENV, "2")])).unwrap();
        assert_eq!((c.limit, c.queue), (2, DEFAULT_QUEUE_LIMIT));
    }

    #[test]
    fn an_invalid_value_of_either_name_is_an_error_naming_it() {
        for (var, value) in [
            (ENGINE_REQUEST_LIMIT_ALIAS, "0"),
            (ENGINE_REQUEST_LIMIT_ALIAS, "lots"),
            (ENGINE_REQUEST_LIMIT_ENV, "2097152"),
            (QUEUE_LIMIT_ALIAS, "-1"),
            (QUEUE_LIMIT_ENV, ""),
        ] {
            let mut vars = vec![(ENGINE_REQUEST_LIMIT_ENV, "4"), (QUEUE_LIMIT_ENV, "3")];
            vars.retain(|(k, _)| *k != var);
            vars.push((var, value));
            let e = GateConfig::from_lookup_all(lookup(&vars)).unwrap_err();
            assert_eq!(
                e,
                ConfigError::InvalidEnv {
                    var,
                    value: value.to_owned(),
                    expected: if var.contains("QUEUE") {
                        "an integer from 0 to 2097151"
                    } else {
                        "an integer from 1 to 2097151"
                    },
                },
                "{var}={value:?}"
            );
            assert!(e.to_string().contains(var));
        }
        let e = GateConfig::from_lookup_all(lookup(&[])).unwrap_err();
        assert!(matches!(e, ConfigError::MissingEnv { .. }));
        assert!(e.to_string().contains(ENGINE_REQUEST_LIMIT_ENV), "{e}");
    }
}
