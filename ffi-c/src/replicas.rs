//! `lg_booking_sync`: booking sync between frontend replicas over NATS
//! (core's `loadgate::cluster::replicas`, docs/replicas.md). Each frontend
//! shares its bookings with the others and adds theirs to its monitor.

use std::ffi::c_char;
use std::sync::Arc;
use std::time::Duration;

use loadgate_core::cluster::replicas::{BookingSync, BookingSyncConfig, SyncAttached, SyncMode};
use loadgate_core::cluster::Transport;
use loadgate_core::MonotonicClock;

use crate::cluster::{connect, subjects};
use crate::ffi::{boundary, guard, input, optional, string, Error, Out};
use crate::monitor::lg_monitor;
use crate::nats_options::lg_nats_options;
use crate::status::lg_status;

/// A frontend's booking sync with the other replicas of a NATS namespace.
/// Opaque; create with lg_monitor_sync_bookings(), free (which stops it)
/// with lg_booking_sync_free().
///
/// lg_booking_sync_get_stats() may be called from any number of threads at
/// once.
pub struct lg_booking_sync {
    sync: Arc<BookingSync>,
    _attached: SyncAttached,
}

/// A booking sync's settings; start from lg_booking_sync_config_default().
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct lg_booking_sync_config {
    /// At most one message per interval, in milliseconds (default 2): what
    /// changed goes out at the next tick.
    pub debounce_ms: u64,
    /// With nothing changed, an empty message goes out this often, in
    /// milliseconds (default 1000; at least debounce_ms).
    pub heartbeat_ms: u64,
    /// A frontend silent this long is forgotten, in milliseconds (default
    /// 3000; longer than heartbeat_ms).
    pub expire_after_ms: u64,
    /// Most other frontends tracked (default 64; at most 4096).
    pub max_frontends: u32,
    /// Most rank entries kept over every other frontend (default 262144).
    pub max_entries: u32,
    /// LG_SYNC_SHARED (default): book by the busy rule on the fleet's
    /// total. LG_SYNC_LEASED: book only within a leased share of every
    /// rank's line, so the frontends together never book past it; a booking
    /// past the share fails with LG_WORKER_OVERLOADED.
    pub mode: u32,
    /// Leased mode: how long a share outlives the last echo of this
    /// frontend, in milliseconds (default 1000; at least 4 debounce_ms, at
    /// most half of expire_after_ms). A new frontend books nothing for its
    /// first one and a half leases.
    pub lease_ms: u64,
    /// The whole state goes out this often, in milliseconds (default
    /// 10000; at least heartbeat_ms), besides on a join and when a frontend
    /// that missed a message asks.
    pub snapshot_every_ms: u64,
}

/// lg_booking_sync_config.mode: the frontends see each other's bookings.
pub const LG_SYNC_SHARED: u32 = 0;
/// lg_booking_sync_config.mode: each frontend books within a leased share.
pub const LG_SYNC_LEASED: u32 = 1;

/// Counters of a booking sync.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct lg_booking_sync_stats {
    /// Messages sent.
    pub sent: u64,
    /// Other frontends' messages applied.
    pub received: u64,
    /// Other frontends' messages missed, by their sequence numbers.
    pub gaps: u64,
    /// Messages dropped as not newer.
    pub out_of_order: u64,
    /// Payloads refused (oversized, malformed, spoofed, too many
    /// frontends, entries or queues).
    pub refused: u64,
    /// Frontends forgotten after their silence.
    pub expired: u64,
    /// Other frontends tracked now.
    pub frontends: u64,
    /// Bytes of the last message sent.
    pub last_size: u64,
    /// Leased mode: the share of every rank's line this frontend uses, in
    /// parts per million.
    pub share_ppm: u32,
    /// Leased mode: the share it claims, in parts per million.
    pub claim_ppm: u32,
    /// Leased mode: times its lease ran out while it held a share.
    pub fenced: u64,
    /// Of `sent`, whole states (joins, repairs asked for, snapshot_every).
    pub snapshots_sent: u64,
    /// Bytes sent.
    pub bytes_sent: u64,
    /// Bytes of the other frontends' messages applied.
    pub bytes_received: u64,
    /// Whole states asked of the others after a gap.
    pub resyncs: u64,
    /// Other frontends whose whole state is awaited after a gap.
    pub behind: u64,
}

/// Writes the default settings into `out`.
///
/// Errors: LG_INVALID_ARGUMENT (NULL out).
/// Thread safety: any thread. Blocking: never.
///
/// # Safety
/// `out` is NULL or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn lg_booking_sync_config_default(
    out: *mut lg_booking_sync_config,
) -> lg_status {
    guard(|| {
        let out = Out::new(out, "out")?;
        let d = BookingSyncConfig::new("-");
        let config = lg_booking_sync_config {
            debounce_ms: d.debounce.as_millis() as u64,
            heartbeat_ms: d.heartbeat.as_millis() as u64,
            expire_after_ms: d.expire_after.as_millis() as u64,
            max_frontends: d.max_frontends as u32,
            max_entries: d.max_entries as u32,
            mode: LG_SYNC_SHARED,
            lease_ms: d.lease.as_millis() as u64,
            snapshot_every_ms: d.snapshot_every.as_millis() as u64,
        };
        // SAFETY: writable (contract).
        unsafe { out.write(config) };
        Ok(())
    })
}

/// Shares `monitor`'s bookings with the other frontend replicas of
/// `nats_namespace` on the NATS server at `url`, and adds theirs to it:
/// `frontend_id` names this replica (unique among them, one NATS token).
/// Snapshots go on loadgate.<nats_namespace>.bookings.<frontend_id>.
/// `config` NULL takes the defaults; `options` NULL connects without
/// authentication (see lg_nats_options_new()).
///
/// Errors: LG_INVALID_ARGUMENT (NULL monitor or out_sync, a bad string, a
/// frontend id or namespace that is not one NATS token, settings out of
/// range: the message names them); LG_TRANSPORT_ERROR (the server cannot be
/// reached, refuses the credentials or fails the TLS handshake).
/// Ownership: on LG_OK *out_sync owns a new sync; free it with
/// lg_booking_sync_free(). The strings, config and options are copied.
/// Thread safety: any thread. Blocking: connects to the server; starts the
/// sync's thread.
///
/// # Safety
/// `monitor` is NULL or live; the strings are NULL or valid for their
/// lengths; `config` is NULL or a valid lg_booking_sync_config; `options` is
/// NULL or a live lg_nats_options; `out_sync` is NULL or valid for writes.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn lg_monitor_sync_bookings(
    monitor: *const lg_monitor,
    url: *const c_char,
    url_len: usize,
    nats_namespace: *const c_char,
    nats_namespace_len: usize,
    frontend_id: *const c_char,
    frontend_id_len: usize,
    config: *const lg_booking_sync_config,
    options: *const lg_nats_options,
    out_sync: *mut *mut lg_booking_sync,
) -> lg_status {
    guard(|| {
        // SAFETY: NULL or live (contract).
        let m = unsafe { input(monitor, "monitor") }?;
        // SAFETY: each string is NULL or valid for its length (contract).
        let url = unsafe { string(url, url_len, "url") }?;
        // SAFETY: as above.
        let namespace = unsafe { string(nats_namespace, nats_namespace_len, "nats_namespace") }?;
        // SAFETY: as above.
        let id = unsafe { string(frontend_id, frontend_id_len, "frontend_id") }?;
        // SAFETY: NULL or valid (contract).
        let config = unsafe { optional(config, "config") }?;
        // SAFETY: NULL or live (contract).
        let options = unsafe { optional(options, "options") }?;
        let out = Out::new(out_sync, "out_sync")?;
        let mut settings = BookingSyncConfig::new(id);
        if let Some(c) = config {
            settings.debounce = Duration::from_millis(c.debounce_ms);
            settings.heartbeat = Duration::from_millis(c.heartbeat_ms);
            settings.expire_after = Duration::from_millis(c.expire_after_ms);
            settings.max_frontends = c.max_frontends as usize;
            settings.max_entries = c.max_entries as usize;
            settings.mode = match c.mode {
                LG_SYNC_SHARED => SyncMode::Shared,
                LG_SYNC_LEASED => SyncMode::Leased,
                other => {
                    return Err(Error::invalid(format!(
                        "config.mode = {other}: must be LG_SYNC_SHARED or LG_SYNC_LEASED"
                    )))
                }
            };
            settings.lease = Duration::from_millis(c.lease_ms);
            settings.snapshot_every = Duration::from_millis(c.snapshot_every_ms);
        }
        let subjects = subjects(namespace)?;
        let sync = BookingSync::new(
            m.monitor.clone(),
            &subjects,
            settings,
            MonotonicClock::shared(),
        )?;
        let transport: Arc<dyn Transport> = Arc::new(connect(url, options)?);
        let attached = sync.attach(transport, &subjects)?;
        let handle = Box::into_raw(Box::new(lg_booking_sync {
            sync,
            _attached: attached,
        }));
        // SAFETY: writable by the contract.
        unsafe { out.write(handle) };
        Ok(())
    })
}

/// Reads a booking sync's counters.
///
/// Errors: LG_INVALID_ARGUMENT (NULL sync or out_stats).
/// Thread safety: any thread. Blocking: never.
///
/// # Safety
/// `sync` is NULL or live; `out_stats` is NULL or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn lg_booking_sync_get_stats(
    sync: *const lg_booking_sync,
    out_stats: *mut lg_booking_sync_stats,
) -> lg_status {
    guard(|| {
        // SAFETY: NULL or live (contract).
        let s = unsafe { input(sync, "sync") }?;
        let out = Out::new(out_stats, "out_stats")?;
        let st = s.sync.stats();
        let stats = lg_booking_sync_stats {
            sent: st.sent,
            received: st.received,
            gaps: st.gaps,
            out_of_order: st.out_of_order,
            refused: st.refused,
            expired: st.expired,
            frontends: st.frontends as u64,
            last_size: st.last_size as u64,
            share_ppm: st.share,
            claim_ppm: st.claim,
            fenced: st.fenced,
            snapshots_sent: st.snapshots_sent,
            bytes_sent: st.bytes_sent,
            bytes_received: st.bytes_received,
            resyncs: st.resyncs,
            behind: st.behind as u64,
        };
        // SAFETY: writable by the contract.
        unsafe { out.write(stats) };
        Ok(())
    })
}

/// Frees a booking sync: stops sending and receiving and closes its
/// connection (the others forget this frontend after their expiry). The
/// bookings it learned stay in the monitor until then. NULL is a no-op.
///
/// Ownership: takes `sync`.
/// Thread safety: no other thread may be using the sync.
/// Blocking: joins the sync's thread (at most one tick).
///
/// # Safety
/// `sync` is NULL or was returned by lg_monitor_sync_bookings() and not
/// freed yet.
#[no_mangle]
pub unsafe extern "C" fn lg_booking_sync_free(sync: *mut lg_booking_sync) {
    boundary((), || {
        if !sync.is_null() {
            // SAFETY: a live handle, given up by the caller (contract).
            drop(unsafe { Box::from_raw(sync) });
        }
    })
}
