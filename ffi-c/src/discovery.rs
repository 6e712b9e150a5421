//! `lg_discovery`: a monitor learning Dynamo's workers from its discovery
//! store, the file backend or etcd (core's `loadgate::discovery`).

use std::ffi::c_char;
use std::time::Duration;

use loadgate_core::discovery::etcd::{
    default_endpoints, parse_endpoints, EtcdDiscovery, EtcdError, EtcdOptions,
};
use loadgate_core::discovery::{default_file_kv_path, Discovery, DiscoveryConfig, FileDiscovery};

use crate::ffi::{boundary, guard, input, optional_string, Error, Out};
use crate::monitor::lg_monitor;
use crate::status::lg_status;

/// `ttl_ms` for lg_monitor_discover_dynamo(): records never go stale; only
/// a deleted record removes its worker.
pub const LG_DISCOVERY_NO_TTL: u64 = u64::MAX;

/// A watched discovery store. Opaque; create with
/// lg_monitor_discover_dynamo() or lg_monitor_discover_dynamo_etcd(), free
/// (which stops it and removes the workers it registered) with
/// lg_discovery_free().
///
/// lg_discovery_get_stats() may be called from any number of threads at
/// once.
pub struct lg_discovery {
    discovery: Discovery,
}

/// Hands `discovery` to C.
fn give(discovery: Discovery, out: Out<*mut lg_discovery>) {
    let handle = Box::into_raw(Box::new(lg_discovery { discovery }));
    // SAFETY: writable by the caller's contract, checked by `Out::new`.
    unsafe { out.write(handle) };
}

/// What a discovery has done so far.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct lg_discovery_stats {
    /// Listings of the store.
    pub scans: u64,
    /// Listings that failed (a missing directory is an empty store).
    pub scan_errors: u64,
    /// Workers registered now by this discovery.
    pub workers: u64,
    /// Workers registered so far.
    pub workers_added: u64,
    /// Workers removed so far (record deleted, stale or changed).
    pub workers_removed: u64,
    /// Records of other namespaces, components or endpoints.
    pub skipped: u64,
    /// Records over the size limit (1 MiB), refused unread.
    pub refused_too_large: u64,
    /// Records that are not model cards.
    pub refused_malformed: u64,
    /// Records whose key and card name different workers.
    pub refused_mismatched: u64,
    /// Records beyond the per-listing limit (16384).
    pub refused_over_limit: u64,
    /// Workers the monitor refused to register (a duplicate id, a limit).
    pub refused_registration: u64,
}

/// Learns `monitor`'s workers from Dynamo's file discovery backend at
/// `path` (NULL with length 0: DYN_FILE_KV, else $TMPDIR/dynamo_store_kv):
/// every model card of `namespace` (NULL with length 0: "dynamo"), and of
/// `component` and `endpoint` when given (NULL with length 0: any),
/// registers its worker under the card's model name with its instance id,
/// data-parallel ranks, KV blocks and prefill batch size; a card that is
/// deleted, or that its worker has not refreshed for `ttl_ms` milliseconds
/// (0: 10000; LG_DISCOVERY_NO_TTL: never), removes its worker. The store is
/// listed every `interval_ms` milliseconds (0: 500). The store's workers
/// are registered when this returns.
///
/// Errors: LG_INVALID_ARGUMENT (NULL monitor or out_discovery, a bad
/// string, an empty namespace), LG_TRANSPORT_ERROR (the watcher's thread
/// could not start).
/// Ownership: on LG_OK *out_discovery owns a new discovery; free it with
/// lg_discovery_free(). It shares the monitor's state: freeing the monitor
/// first is allowed. The strings are copied.
/// Thread safety: any thread. Blocking: reads the store once; starts one
/// thread, which reads it afterwards.
///
/// # Safety
/// `monitor` is NULL or a live monitor; each string is NULL or valid for
/// its length; `out_discovery` is NULL or valid for writes.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn lg_monitor_discover_dynamo(
    monitor: *const lg_monitor,
    namespace: *const c_char,
    namespace_len: usize,
    path: *const c_char,
    path_len: usize,
    component: *const c_char,
    component_len: usize,
    endpoint: *const c_char,
    endpoint_len: usize,
    interval_ms: u64,
    ttl_ms: u64,
    out_discovery: *mut *mut lg_discovery,
) -> lg_status {
    guard(|| {
        // SAFETY: `monitor` is NULL or live (contract).
        let m = unsafe { input(monitor, "monitor") }?;
        // SAFETY: each string is NULL or valid for its length (contract).
        let namespace = unsafe { optional_string(namespace, namespace_len, "namespace") }?;
        // SAFETY: as above.
        let path = unsafe { optional_string(path, path_len, "path") }?;
        // SAFETY: as above.
        let component = unsafe { optional_string(component, component_len, "component") }?;
        // SAFETY: as above.
        let endpoint = unsafe { optional_string(endpoint, endpoint_len, "endpoint") }?;
        let out = Out::new(out_discovery, "out_discovery")?;
        let mut config = DiscoveryConfig::for_endpoints(namespace, component, endpoint)
            .map_err(Error::invalid)?;
        if interval_ms > 0 {
            config.interval = Duration::from_millis(interval_ms);
        }
        config.ttl = match ttl_ms {
            0 => config.ttl,
            LG_DISCOVERY_NO_TTL => None,
            ms => Some(Duration::from_millis(ms)),
        };
        let path = path.map_or_else(default_file_kv_path, Into::into);
        let discovery = FileDiscovery::start(m.monitor.clone(), &path, config).map_err(|e| {
            Error::new(
                lg_status::LG_TRANSPORT_ERROR,
                format_args!("starting discovery of {}: {e}", path.display()),
            )
        })?;
        give(Discovery::File(discovery), out);
        Ok(())
    })
}

/// Learns `monitor`'s workers from Dynamo's model cards in etcd at
/// `endpoints` (comma-separated URLs; NULL with length 0: ETCD_ENDPOINTS,
/// else http://localhost:2379), as lg_monitor_discover_dynamo() does from
/// the file backend: the cards of `namespace` (NULL: "dynamo") and of
/// `component` and `endpoint` (NULL: any) register their workers, and a
/// card that goes (deleted, or its worker's lease expired) removes its
/// worker. `user` and `password` (both or neither) authenticate;
/// `timeout_ms` (0: 2000) bounds connecting and each request. The cards are
/// listed once before this returns, then watched; a lost connection is
/// restored and the cards listed afresh.
///
/// Errors: LG_INVALID_ARGUMENT (NULL monitor or out_discovery, a bad
/// string, an empty namespace or endpoint, user without password),
/// LG_TRANSPORT_ERROR (etcd could not be reached, refused the credentials,
/// or failed the first listing).
/// Ownership: as lg_monitor_discover_dynamo().
/// Thread safety: any thread. Blocking: connects and lists once, up to
/// about `timeout_ms`; then watches on the library's I/O runtime thread.
///
/// # Safety
/// `monitor` is NULL or a live monitor; each string is NULL or valid for
/// its length; `out_discovery` is NULL or valid for writes.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn lg_monitor_discover_dynamo_etcd(
    monitor: *const lg_monitor,
    namespace: *const c_char,
    namespace_len: usize,
    endpoints: *const c_char,
    endpoints_len: usize,
    user: *const c_char,
    user_len: usize,
    password: *const c_char,
    password_len: usize,
    component: *const c_char,
    component_len: usize,
    endpoint: *const c_char,
    endpoint_len: usize,
    timeout_ms: u64,
    out_discovery: *mut *mut lg_discovery,
) -> lg_status {
    guard(|| {
        // SAFETY: `monitor` is NULL or live (contract).
        let m = unsafe { input(monitor, "monitor") }?;
        // SAFETY: each string is NULL or valid for its length (contract).
        let namespace = unsafe { optional_string(namespace, namespace_len, "namespace") }?;
        // SAFETY: as above.
        let endpoints = unsafe { optional_string(endpoints, endpoints_len, "endpoints") }?;
        // SAFETY: as above.
        let user = unsafe { optional_string(user, user_len, "user") }?;
        // SAFETY: as above.
        let password = unsafe { optional_string(password, password_len, "password") }?;
        // SAFETY: as above.
        let component = unsafe { optional_string(component, component_len, "component") }?;
        // SAFETY: as above.
        let endpoint = unsafe { optional_string(endpoint, endpoint_len, "endpoint") }?;
        let out = Out::new(out_discovery, "out_discovery")?;
        let config = DiscoveryConfig::for_endpoints(namespace, component, endpoint)
            .map_err(Error::invalid)?;
        let endpoints = endpoints.map_or_else(default_endpoints, parse_endpoints);
        let mut options = EtcdOptions::default()
            .with_credentials(user, password)
            .map_err(Error::invalid)?;
        if timeout_ms > 0 {
            options.timeout = Duration::from_millis(timeout_ms);
        }
        let discovery = EtcdDiscovery::start(m.monitor.clone(), &endpoints, config, options)
            .map_err(|e| match e {
                EtcdError::Connect(_) => Error::new(lg_status::LG_TRANSPORT_ERROR, e),
                EtcdError::NoEndpoints | EtcdError::HalfCredentials => Error::invalid(e),
            })?;
        give(Discovery::Etcd(discovery), out);
        Ok(())
    })
}

/// Reads a discovery's counters.
///
/// Errors: LG_INVALID_ARGUMENT (NULL discovery or out_stats).
/// Ownership: borrows its arguments for the call only; keeps none of them.
/// Thread safety: any thread. Blocking: never.
///
/// # Safety
/// `discovery` is NULL or a live discovery; `out_stats` is NULL or valid
/// for writes.
#[no_mangle]
pub unsafe extern "C" fn lg_discovery_get_stats(
    discovery: *const lg_discovery,
    out_stats: *mut lg_discovery_stats,
) -> lg_status {
    guard(|| {
        // SAFETY: `discovery` is NULL or live (contract).
        let d = unsafe { input(discovery, "discovery") }?;
        let out = Out::new(out_stats, "out_stats")?;
        let s = d.discovery.stats();
        let stats = lg_discovery_stats {
            scans: s.scans,
            scan_errors: s.scan_errors,
            workers: s.workers,
            workers_added: s.workers_added,
            workers_removed: s.workers_removed,
            skipped: s.skipped,
            refused_too_large: s.refused_too_large,
            refused_malformed: s.refused_malformed,
            refused_mismatched: s.refused_mismatched,
            refused_over_limit: s.refused_over_limit,
            refused_registration: s.refused_registration,
        };
        // SAFETY: writable by the contract.
        unsafe { out.write(stats) };
        Ok(())
    })
}

/// Frees a discovery: stops watching and removes the workers it registered
/// from the monitor. NULL is a no-op.
///
/// Ownership: takes `discovery`.
/// Thread safety: no other thread may be using the discovery.
/// Blocking: waits for the watcher to stop (at most one listing).
///
/// # Safety
/// `discovery` is NULL or was returned by lg_monitor_discover_dynamo() or
/// lg_monitor_discover_dynamo_etcd() and not freed yet.
#[no_mangle]
pub unsafe extern "C" fn lg_discovery_free(discovery: *mut lg_discovery) {
    boundary((), || {
        if !discovery.is_null() {
            // SAFETY: a live handle from lg_monitor_discover_dynamo(), given
            // up by the caller (contract), so this is the only owner.
            drop(unsafe { Box::from_raw(discovery) });
        }
    })
}
