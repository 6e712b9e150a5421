//! `lg_reporter` and `lg_subscription`: load reports across machines over
//! NATS (core's `loadgate::cluster`). Workers publish their load with a
//! reporter; each frontend subscribes its monitor, and every frontend
//! converges on the same busy set. The connection's settings are
//! `lg_nats_options` (`nats_options.rs`).

use std::ffi::c_char;
use std::sync::Arc;

use loadgate_core::cluster::nats::NatsTransport;
use loadgate_core::cluster::{
    dynamo_kv_metrics_subject, AnnounceAttached, Attached, BookingAnnouncer, ClusterError,
    Publisher, PublisherConfig, Subjects, Subscriber, SubscriberConfig, Transport, WireFormat,
    DEFAULT_ANNOUNCE_INTERVAL,
};
use loadgate_core::MonotonicClock;

use crate::ffi::{boundary, guard, input, optional, string, Error, Out, TextBuf};
use crate::monitor::{lg_load_report, lg_monitor, lg_worker_spec};
use crate::nats_options::lg_nats_options;
use crate::status::lg_status;

/// A worker's load publisher: reports are merged per rank and sent by a
/// background thread (changes at once, every rank about once a second as a
/// heartbeat that announces the worker, its model, ranks and capacities).
/// Opaque; create with lg_reporter_new(), free with lg_reporter_free().
///
/// lg_reporter_report() and lg_reporter_get_stats() may be called from any
/// number of threads at once.
pub struct lg_reporter {
    publisher: Publisher,
}

/// A monitor's subscription to the load reports of a NATS namespace.
/// Opaque; create with lg_monitor_subscribe_nats(), free (which detaches)
/// with lg_subscription_free().
///
/// lg_subscription_get_stats() may be called from any number of threads at
/// once.
pub struct lg_subscription {
    // Fields drop in order: detach first, then the subscriber, then the
    // announcer (publishing what is queued), then the connection.
    _attached: Attached,
    subscriber: Arc<Subscriber>,
    announcing: Option<(Arc<BookingAnnouncer>, AnnounceAttached)>,
    _transport: NatsTransport,
}

/// Counters of a reporter.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct lg_reporter_stats {
    /// Messages handed to the connection so far (changes and heartbeats).
    pub messages_sent: u64,
    /// Messages the connection refused so far.
    pub messages_failed: u64,
}

/// Counters of a subscription.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct lg_subscription_stats {
    /// Reports applied to known workers.
    pub applied: u64,
    /// Workers registered in the monitor from their first message.
    pub announced: u64,
    /// Messages dropped because their sequence number was not newer than
    /// the last one applied for the worker.
    pub out_of_order: u64,
    /// Payloads that did not decode (malformed, unknown version, invalid).
    pub malformed: u64,
    /// Reports or registrations the monitor refused.
    pub refused: u64,
    /// Workers removed after going silent (three heartbeats).
    pub expired: u64,
    /// Bookings of Dynamo's routers held now, from their
    /// active_sequences_events (routers run with --router-replica-sync).
    pub router_bookings: u64,
    /// With lg_nats_options_set_announce_bookings(): events of the
    /// monitor's own bookings published to the endpoint's routers.
    pub bookings_announced: u64,
    /// Events of its own bookings dropped: the queue full, or the
    /// publication failed.
    pub announce_lost: u64,
    /// The router id its bookings are announced as; 0 when not announcing.
    pub router_id: u64,
}

/// The subjects of `namespace` under the default prefix.
pub(crate) fn subjects(namespace: &str) -> Result<Subjects, Error> {
    Subjects::new(namespace).map_err(|e| match e {
        ClusterError::InvalidSubject(why) => {
            Error::invalid(format_args!("nats_namespace is invalid: {why}"))
        }
        other => other.into(),
    })
}

/// Creates a reporter for worker `worker_id` of `model` with the ranks and
/// capacities of `spec` (NULL: one rank, 0..1, capacities unknown),
/// connected to the NATS server at `url` (e.g. "nats://127.0.0.1:4222")
/// without authentication, with TLS for a tls:// url; see
/// lg_reporter_new_with() for the server's authentication and TLS.
/// It publishes on subject loadgate.<nats_namespace>.load.<worker_id>; a
/// frontend subscribed to the same namespace with
/// lg_monitor_subscribe_nats() learns the worker from its first message.
/// The connection reconnects by itself after the server restarts.
///
/// Errors: LG_INVALID_ARGUMENT (NULL out_reporter, bad string, malformed
/// url, empty model, namespace that is empty or holds whitespace, '.', '*'
/// or '>', dp_start + dp_size overflowing); LG_TRANSPORT_ERROR (the server
/// cannot be reached within two seconds; the reason is in
/// lg_last_error_message()).
/// Ownership: on LG_OK *out_reporter owns a new reporter; free it with
/// lg_reporter_free(). The strings and the spec are copied.
/// Thread safety: any thread. Blocking: connects to the server (up to two
/// seconds); starts a sending thread and, on the first connection of the
/// process, the library's NATS runtime thread.
///
/// # Safety
/// `url`, `nats_namespace` and `model` are NULL or valid for their lengths;
/// `spec` is NULL or points to a valid lg_worker_spec; `out_reporter` is NULL
/// or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn lg_reporter_new(
    url: *const c_char,
    url_len: usize,
    nats_namespace: *const c_char,
    nats_namespace_len: usize,
    worker_id: u64,
    model: *const c_char,
    model_len: usize,
    spec: *const lg_worker_spec,
    out_reporter: *mut *mut lg_reporter,
) -> lg_status {
    // SAFETY: forwarded contract; NULL options are the defaults.
    unsafe {
        lg_reporter_new_with(
            url,
            url_len,
            nats_namespace,
            nats_namespace_len,
            worker_id,
            model,
            model_len,
            spec,
            std::ptr::null(),
            out_reporter,
        )
    }
}

/// lg_reporter_new() with the server's authentication and TLS settings
/// `options` (NULL: the defaults, as lg_reporter_new()).
///
/// Errors: those of lg_reporter_new(); LG_INVALID_ARGUMENT also for
/// settings that conflict, are empty or incomplete, or name a file that
/// cannot be read or holds no credentials, certificate or key (the message
/// names the setting); LG_TRANSPORT_ERROR also when the server refuses the
/// credentials ("authorization failed") or the TLS handshake fails ("TLS
/// handshake failed", e.g. a server certificate the CA did not sign), each
/// within the connect timeout (two seconds unless
/// lg_nats_options_set_connect_timeout_ms() set it).
/// Ownership: as lg_reporter_new(); `options` is copied.
/// Thread safety: any thread; `options` is only read. Blocking: as
/// lg_reporter_new(); reads the settings' files.
///
/// # Safety
/// As lg_reporter_new(); `options` is NULL or a live lg_nats_options.
#[no_mangle]
pub unsafe extern "C" fn lg_reporter_new_with(
    url: *const c_char,
    url_len: usize,
    nats_namespace: *const c_char,
    nats_namespace_len: usize,
    worker_id: u64,
    model: *const c_char,
    model_len: usize,
    spec: *const lg_worker_spec,
    options: *const lg_nats_options,
    out_reporter: *mut *mut lg_reporter,
) -> lg_status {
    guard(|| {
        // SAFETY: each string is NULL or valid for its length (contract).
        let url = unsafe { string(url, url_len, "url") }?;
        // SAFETY: as above.
        let namespace = unsafe { string(nats_namespace, nats_namespace_len, "nats_namespace") }?;
        // SAFETY: as above.
        let model = unsafe { string(model, model_len, "model") }?;
        // SAFETY: `spec` is NULL or a valid lg_worker_spec (contract).
        let spec = unsafe { optional(spec, "spec") }?;
        // SAFETY: `options` is NULL or live (contract).
        let options = unsafe { optional(options, "options") }?;
        let out = Out::new(out_reporter, "out_reporter")?;
        let subjects = subjects(namespace)?;
        let mut config = PublisherConfig::new(worker_id, model);
        if let Some((component, endpoint)) = options.and_then(|o| o.dynamo.clone()) {
            config.format = WireFormat::Dynamo {
                namespace: namespace.to_owned(),
                component,
                endpoint,
            };
        }
        if let Some(s) = spec {
            let s = s.core_spec();
            config.dp_start = s.dp_start;
            config.dp_size = s.dp_size;
            config.kv_total_blocks = s.kv_total_blocks;
            config.max_num_batched_tokens = s.max_num_batched_tokens;
            config.max_num_seqs = s.max_num_seqs;
        }
        // Checked before connecting, so a bad argument costs no connection
        // and is reported as such whatever the server's state.
        config.validate()?;
        let transport = connect(url, options)?;
        let publisher = Publisher::spawn(config, Arc::new(transport), &subjects)?;
        let handle = Box::into_raw(Box::new(lg_reporter { publisher }));
        // SAFETY: writable by the contract.
        unsafe { out.write(handle) };
        Ok(())
    })
}

/// Connects to `url` with `options` (NULL: the defaults); core checks the
/// options before connecting.
pub(crate) fn connect(
    url: &str,
    options: Option<&lg_nats_options>,
) -> Result<NatsTransport, Error> {
    let transport = match options {
        Some(o) => NatsTransport::connect_with(url, &o.options)?,
        None => NatsTransport::connect(url)?,
    };
    Ok(transport)
}

/// Merges one load report into rank `dp_rank` of the reporter's worker
/// (absent fields keep their value; a present 0 overwrites) and returns at
/// once: the sending thread publishes the rank's merged load shortly after,
/// coalescing reports that arrive while it sends. A message the server
/// cannot take (server away) is dropped; the next heartbeat re-sends the
/// state.
///
/// Errors: LG_INVALID_ARGUMENT (NULL reporter or report,
/// active_prefill_tokens of UINT64_MAX), LG_NOT_FOUND (dp_rank outside the
/// declared ranks). A refused report changes nothing.
/// Ownership: borrows its arguments for the call only; keeps none of them.
/// Thread safety: any thread. Blocking: never waits for the network; takes
/// the reporter's lock briefly.
///
/// # Safety
/// `reporter` is NULL or a live reporter; `report` is NULL or points to a
/// valid lg_load_report.
#[no_mangle]
pub unsafe extern "C" fn lg_reporter_report(
    reporter: *const lg_reporter,
    dp_rank: u32,
    report: *const lg_load_report,
) -> lg_status {
    guard(|| {
        // SAFETY: `reporter` is NULL or live (contract).
        let r = unsafe { input(reporter, "reporter") }?;
        // SAFETY: `report` is NULL or a valid lg_load_report (contract).
        let report = unsafe { input(report, "report") }?;
        r.publisher.report(dp_rank, &report.core_report())?;
        Ok(())
    })
}

/// Reads a reporter's counters.
///
/// Errors: LG_INVALID_ARGUMENT (NULL reporter or out_stats).
/// Ownership: borrows its arguments for the call only; keeps none of them.
/// Thread safety: any thread. Blocking: never.
///
/// # Safety
/// `reporter` is NULL or a live reporter; `out_stats` is NULL or valid for
/// writes.
#[no_mangle]
pub unsafe extern "C" fn lg_reporter_get_stats(
    reporter: *const lg_reporter,
    out_stats: *mut lg_reporter_stats,
) -> lg_status {
    guard(|| {
        // SAFETY: `reporter` is NULL or live (contract).
        let r = unsafe { input(reporter, "reporter") }?;
        let out = Out::new(out_stats, "out_stats")?;
        let stats = lg_reporter_stats {
            messages_sent: r.publisher.messages_sent(),
            messages_failed: r.publisher.messages_failed(),
        };
        // SAFETY: writable by the contract.
        unsafe { out.write(stats) };
        Ok(())
    })
}

/// Frees a reporter: stops its sending thread and closes its connection
/// once the messages already handed to it are sent. Frontends remove the
/// worker after three heartbeats of silence. NULL is a no-op.
///
/// Ownership: takes `reporter`.
/// Thread safety: no other thread may be using the reporter.
/// Blocking: joins the sending thread (at most one batch being sent).
///
/// # Safety
/// `reporter` is NULL or was returned by lg_reporter_new() and not freed
/// yet.
#[no_mangle]
pub unsafe extern "C" fn lg_reporter_free(reporter: *mut lg_reporter) {
    boundary((), || {
        if !reporter.is_null() {
            // SAFETY: a live handle from lg_reporter_new(), given up by the
            // caller (contract), so this is the only owner.
            drop(unsafe { Box::from_raw(reporter) });
        }
    })
}

/// Subscribes `monitor` to the load reports of `nats_namespace` on the NATS
/// server at `url` (without authentication, with TLS for a tls:// url; see
/// lg_monitor_subscribe_nats_with()): each worker is registered in the
/// monitor on its first message (a worker already added with
/// lg_monitor_add_worker() under the same id is adopted), its reports are
/// applied as they arrive (out-of-order ones dropped), and a worker silent
/// for three heartbeats (3 s) is removed.
/// Thresholds stay local to this monitor. Set a model's thresholds once its
/// first worker is known (lg_monitor_set_thresholds() answers LG_NOT_FOUND
/// before).
///
/// Errors: LG_INVALID_ARGUMENT (NULL monitor or out_subscription, bad
/// string, malformed url, namespace that is empty or holds whitespace, '.',
/// '*' or '>'); LG_TRANSPORT_ERROR (the server cannot be reached within two
/// seconds, the subscription or its expiry thread cannot start; the reason
/// is in lg_last_error_message()).
/// Ownership: on LG_OK *out_subscription owns a new subscription; free it
/// with lg_subscription_free(). It shares the monitor's state: freeing the
/// monitor first is allowed (the subscription then feeds a monitor nobody
/// can read). The strings are copied.
/// Thread safety: any thread. Blocking: connects and subscribes (up to two
/// seconds); starts an expiry thread and, on the first connection of the
/// process, the library's NATS runtime thread, which applies the reports.
///
/// # Safety
/// `monitor` is NULL or a live monitor; `url` and `nats_namespace` are NULL
/// or valid for their lengths; `out_subscription` is NULL or valid for
/// writes.
#[no_mangle]
pub unsafe extern "C" fn lg_monitor_subscribe_nats(
    monitor: *const lg_monitor,
    url: *const c_char,
    url_len: usize,
    nats_namespace: *const c_char,
    nats_namespace_len: usize,
    out_subscription: *mut *mut lg_subscription,
) -> lg_status {
    // SAFETY: forwarded contract; NULL options are the defaults.
    unsafe {
        lg_monitor_subscribe_nats_with(
            monitor,
            url,
            url_len,
            nats_namespace,
            nats_namespace_len,
            std::ptr::null(),
            out_subscription,
        )
    }
}

/// lg_monitor_subscribe_nats() with the server's authentication and TLS
/// settings `options` (NULL: the defaults, as lg_monitor_subscribe_nats()).
/// With per-subject permissions, the frontend's user needs only to
/// subscribe to loadgate.<nats_namespace>.load.* (a subscription the
/// server refuses receives nothing; the server logs the refusal).
///
/// Errors: those of lg_monitor_subscribe_nats(); LG_INVALID_ARGUMENT also
/// for settings that conflict, are empty or incomplete, or name a file that
/// cannot be read or holds no credentials, certificate or key (the message
/// names the setting); LG_TRANSPORT_ERROR also when the server refuses the
/// credentials ("authorization failed") or the TLS handshake fails ("TLS
/// handshake failed"), each within the connect timeout (two seconds unless
/// lg_nats_options_set_connect_timeout_ms() set it).
/// Ownership: as lg_monitor_subscribe_nats(); `options` is copied.
/// Thread safety: any thread; `options` is only read. Blocking: as
/// lg_monitor_subscribe_nats(); reads the settings' files.
///
/// # Safety
/// As lg_monitor_subscribe_nats(); `options` is NULL or a live
/// lg_nats_options.
#[no_mangle]
pub unsafe extern "C" fn lg_monitor_subscribe_nats_with(
    monitor: *const lg_monitor,
    url: *const c_char,
    url_len: usize,
    nats_namespace: *const c_char,
    nats_namespace_len: usize,
    options: *const lg_nats_options,
    out_subscription: *mut *mut lg_subscription,
) -> lg_status {
    guard(|| {
        // SAFETY: `monitor` is NULL or live (contract).
        let m = unsafe { input(monitor, "monitor") }?;
        // SAFETY: each string is NULL or valid for its length (contract).
        let url = unsafe { string(url, url_len, "url") }?;
        // SAFETY: as above.
        let namespace = unsafe { string(nats_namespace, nats_namespace_len, "nats_namespace") }?;
        // SAFETY: `options` is NULL or live (contract).
        let options = unsafe { optional(options, "options") }?;
        let out = Out::new(out_subscription, "out_subscription")?;
        let subjects = subjects(namespace)?;
        let mut config = SubscriberConfig::default();
        if let Some((component, endpoint)) = options.and_then(|o| o.dynamo.as_ref()) {
            config.active_load_subject =
                Some(dynamo_kv_metrics_subject(namespace, component, endpoint)?);
        }
        let announcer = match (&config.active_load_subject, options.is_some_and(|o| o.announce)) {
            (_, false) => None,
            (None, true) => {
                return Err(Error::invalid(
                    "announcing bookings needs lg_nats_options_set_dynamo_endpoint(): the endpoint whose routers count them",
                ))
            }
            (Some(subject), true) => Some(BookingAnnouncer::new(m.monitor.clone(), subject)?),
        };
        let subscriber = Subscriber::new(m.monitor.clone(), config, MonotonicClock::shared())?;
        let transport = connect(url, options)?;
        let attached = subscriber.attach(&transport, &subjects)?;
        let announcing = match announcer {
            Some(a) => {
                let on: Arc<dyn Transport> = Arc::new(transport.clone());
                let thread = a.attach(on, DEFAULT_ANNOUNCE_INTERVAL)?;
                Some((a, thread))
            }
            None => None,
        };
        let handle = Box::into_raw(Box::new(lg_subscription {
            _attached: attached,
            subscriber,
            announcing,
            _transport: transport,
        }));
        // SAFETY: writable by the contract.
        unsafe { out.write(handle) };
        Ok(())
    })
}

/// Reads a subscription's counters.
///
/// Errors: LG_INVALID_ARGUMENT (NULL subscription or out_stats).
/// Ownership: borrows its arguments for the call only; keeps none of them.
/// Thread safety: any thread. Blocking: never.
///
/// # Safety
/// `subscription` is NULL or a live subscription; `out_stats` is NULL or
/// valid for writes.
#[no_mangle]
pub unsafe extern "C" fn lg_subscription_get_stats(
    subscription: *const lg_subscription,
    out_stats: *mut lg_subscription_stats,
) -> lg_status {
    guard(|| {
        // SAFETY: `subscription` is NULL or live (contract).
        let s = unsafe { input(subscription, "subscription") }?;
        let out = Out::new(out_stats, "out_stats")?;
        let st = s.subscriber.stats();
        let announced = s
            .announcing
            .as_ref()
            .map(|(a, _)| a.stats())
            .unwrap_or_default();
        let stats = lg_subscription_stats {
            applied: st.applied,
            announced: st.announced,
            out_of_order: st.out_of_order,
            malformed: st.malformed,
            refused: st.refused,
            expired: st.expired,
            router_bookings: s.subscriber.router_bookings() as u64,
            bookings_announced: announced.published,
            announce_lost: announced.lost,
            router_id: s.announcing.as_ref().map_or(0, |(a, _)| a.router_id()),
        };
        // SAFETY: writable by the contract.
        unsafe { out.write(stats) };
        Ok(())
    })
}

/// Writes the subscription's counters (Prometheus text format, under the
/// monitor's metrics prefix: messages by outcome, refusals by reason) into
/// `buf`, with the snprintf semantics of lg_monitor_metrics().
///
/// Errors: LG_INVALID_ARGUMENT (NULL subscription or out_needed, NULL buf
/// with buf_len > 0), LG_BUFFER_TOO_SMALL.
/// Ownership: borrows its arguments for the call only; keeps none of them.
/// Thread safety: any thread. Blocking: never (allocates).
///
/// # Safety
/// `subscription` is NULL or a live subscription; `buf` is NULL or valid
/// for writes of `buf_len` bytes; `out_needed` is NULL or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn lg_subscription_metrics(
    subscription: *const lg_subscription,
    buf: *mut c_char,
    buf_len: usize,
    out_needed: *mut usize,
) -> lg_status {
    guard(|| {
        // SAFETY: `subscription` is NULL or live (contract).
        let s = unsafe { input(subscription, "subscription") }?;
        let text = TextBuf::new(buf, buf_len, out_needed)?;
        let metrics = s.subscriber.metrics_text();
        // SAFETY: buf and out_needed writable by the contract.
        unsafe { text.write(metrics.as_bytes()) }
    })
}

/// Frees a subscription: unsubscribes, stops its expiry thread and closes
/// its connection. Workers it registered stay in the monitor (remove them
/// with lg_monitor_remove_worker() if needed). A message the NATS runtime
/// thread is applying at that moment may still complete just after the
/// call returns. NULL is a no-op.
///
/// Ownership: takes `subscription`.
/// Thread safety: no other thread may be using the subscription.
/// Blocking: joins the expiry thread (at most one sweep).
///
/// # Safety
/// `subscription` is NULL or was returned by lg_monitor_subscribe_nats() and
/// not freed yet.
#[no_mangle]
pub unsafe extern "C" fn lg_subscription_free(subscription: *mut lg_subscription) {
    boundary((), || {
        if !subscription.is_null() {
            // SAFETY: a live handle from lg_monitor_subscribe_nats(), given
            // up by the caller (contract), so this is the only owner.
            drop(unsafe { Box::from_raw(subscription) });
        }
    })
}
