//! `lg_nats_options`: the NATS server's authentication and TLS settings
//! (core's `NatsOptions`) and the reference worker endpoint, given to the
//! connecting calls of `cluster.rs`.

use std::ffi::c_char;
use std::path::PathBuf;
use std::time::Duration;

use loadgate_core::cluster::nats::NatsOptions;

use crate::ffi::{boundary, guard, optional_string, Error, Out};
use crate::status::lg_status;

/// Authentication and TLS settings for a NATS connection, given to
/// lg_reporter_new_with() and lg_monitor_subscribe_nats_with(). Opaque;
/// create with lg_nats_options_new() (no authentication, TLS only for a
/// tls:// url), change with the lg_nats_options_set_*() calls, free with
/// lg_nats_options_free(). The connecting calls copy it, so it may be
/// changed or freed right after.
///
/// Set at most one way to authenticate: a user and password, a token, or a
/// credentials file. The combination is checked by the connecting calls,
/// before they connect: conflicting settings, empty values and files that
/// cannot be read or do not hold what they should are LG_INVALID_ARGUMENT
/// with a message naming the setting.
///
/// The setters change the object: no other thread may use it meanwhile.
/// The connecting calls only read it, from any number of threads at once.
pub struct lg_nats_options {
    pub(crate) options: NatsOptions,
    /// The reference worker endpoint `(component, endpoint)` set by
    /// lg_nats_options_set_dynamo_endpoint().
    pub(crate) dynamo: Option<(String, String)>,
    /// Whether a subscription announces the monitor's own bookings to that
    /// endpoint's routers (lg_nats_options_set_announce_bookings()).
    pub(crate) announce: bool,
}

/// Creates NATS settings with no authentication, and TLS only for a
/// tls:// url.
///
/// Errors: LG_INVALID_ARGUMENT (NULL out_options).
/// Ownership: on LG_OK *out_options owns a new object; free it with
/// lg_nats_options_free().
/// Thread safety: any thread. Blocking: never.
///
/// # Safety
/// `out_options` is NULL or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn lg_nats_options_new(out_options: *mut *mut lg_nats_options) -> lg_status {
    guard(|| {
        let out = Out::new(out_options, "out_options")?;
        let handle = Box::into_raw(Box::new(lg_nats_options {
            options: NatsOptions::default(),
            dynamo: None,
            announce: false,
        }));
        // SAFETY: writable by the contract.
        unsafe { out.write(handle) };
        Ok(())
    })
}

/// Frees NATS settings. NULL is a no-op. Reporters and subscriptions
/// created with them keep their own copy.
///
/// Ownership: takes `options`.
/// Thread safety: no other thread may be using the object. Blocking: never.
///
/// # Safety
/// `options` is NULL or was returned by lg_nats_options_new() and not freed
/// yet.
#[no_mangle]
pub unsafe extern "C" fn lg_nats_options_free(options: *mut lg_nats_options) {
    boundary((), || {
        if !options.is_null() {
            // SAFETY: a live handle from lg_nats_options_new(), given up by
            // the caller (contract), so this is the only owner.
            drop(unsafe { Box::from_raw(options) });
        }
    })
}

/// Borrows the settings object to change.
///
/// # Safety
/// `p` is NULL or a live lg_nats_options that no other thread uses for
/// `'a`.
unsafe fn handle_mut<'a>(p: *mut lg_nats_options) -> Result<&'a mut lg_nats_options, Error> {
    if p.is_null() {
        return Err(Error::invalid("options must not be NULL"));
    }
    if !p.is_aligned() {
        return Err(Error::invalid("options is misaligned"));
    }
    // SAFETY: non-NULL and aligned (checked), live and used by this thread
    // alone (contract), so a unique reference is sound.
    Ok(unsafe { &mut *p })
}

/// Borrows the connection settings to change.
///
/// # Safety
/// As `handle_mut`.
unsafe fn options_mut<'a>(p: *mut lg_nats_options) -> Result<&'a mut NatsOptions, Error> {
    // SAFETY: forwarded contract.
    Ok(&mut unsafe { handle_mut(p) }?.options)
}

/// Follows (subscriptions) or publishes as (reporters) the reference
/// system's worker endpoint `component`/`endpoint` in the namespace the
/// call names: a subscription also reads the reference's load events on
/// `namespace.{ns}.component.{component}.endpoint.{endpoint}.kv_metrics`
/// ("*" for any component or endpoint), its forward-pass-metrics (liveness
/// and queue depth) and its routers' bookings (active_sequences_events, from
/// routers run with --router-replica-sync); those workers must be declared
/// with lg_monitor_add_worker() or lg_monitor_discover_dynamo*(), and
/// reports for others are refused and counted. A reporter publishes the
/// reference's envelope there instead of loadgate's messages, so a
/// reference frontend reads it. NULL and 0 for both: clears it.
///
/// Errors: LG_INVALID_ARGUMENT (NULL options, a string NULL with a non-zero
/// length or not UTF-8, only one of the two given). A failed call changes
/// nothing. Empty or over-long names and a reporter with a wildcard are
/// refused by the connecting calls.
/// Ownership: the strings are copied.
/// Thread safety: no other thread may be using `options`. Blocking: never.
///
/// # Safety
/// `options` is NULL or a live lg_nats_options; `component` and `endpoint`
/// are NULL or valid for their lengths.
#[no_mangle]
pub unsafe extern "C" fn lg_nats_options_set_dynamo_endpoint(
    options: *mut lg_nats_options,
    component: *const c_char,
    component_len: usize,
    endpoint: *const c_char,
    endpoint_len: usize,
) -> lg_status {
    guard(|| {
        // SAFETY: each string is NULL or valid for its length (contract).
        let component = unsafe { setting(component, component_len, "component") }?;
        // SAFETY: as above.
        let endpoint = unsafe { setting(endpoint, endpoint_len, "endpoint") }?;
        let dynamo = match (component, endpoint) {
            (Some(c), Some(e)) => Some((c, e)),
            (None, None) => None,
            _ => {
                return Err(Error::invalid(
                    "component and endpoint are given together (or both NULL to clear)",
                ))
            }
        };
        // SAFETY: NULL or live, used by no other thread (contract).
        unsafe { handle_mut(options) }?.dynamo = dynamo;
        Ok(())
    })
}

/// Makes a subscription announce its monitor's own bookings to the routers
/// of the reference endpoint set with lg_nats_options_set_dynamo_endpoint()
/// (which must name one component and one endpoint, no wildcard): each
/// booking made while the subscription lives is published on the
/// endpoint's active_sequences_events subject as a Dynamo 1.6.1 router
/// publishes its own (added, prefill done, freed), so a Dynamo frontend run
/// with --router-replica-sync counts it in its busy decision
/// (docs/dynamo.md). The booking calls only push a small event into a
/// bounded lock-free queue; a thread of the subscription publishes it. One
/// announcing subscription per monitor at a time. false (the default):
/// nothing is announced.
///
/// Errors: LG_INVALID_ARGUMENT (NULL options). The connecting call refuses
/// it (LG_INVALID_ARGUMENT) without an endpoint, with a wildcard, or while
/// another subscription announces the monitor's bookings.
/// Thread safety: no other thread may be using `options`. Blocking: never.
///
/// # Safety
/// `options` is NULL or a live lg_nats_options.
#[no_mangle]
pub unsafe extern "C" fn lg_nats_options_set_announce_bookings(
    options: *mut lg_nats_options,
    announce: bool,
) -> lg_status {
    guard(|| {
        // SAFETY: NULL or live, used by no other thread (contract).
        unsafe { handle_mut(options) }?.announce = announce;
        Ok(())
    })
}

/// A setting's string: NULL with length 0 is absent (clears the setting).
///
/// # Safety
/// As `optional_string`.
unsafe fn setting(
    p: *const c_char,
    len: usize,
    what: &'static str,
) -> Result<Option<String>, Error> {
    // SAFETY: forwarded contract.
    Ok(unsafe { optional_string(p, len, what) }?.map(str::to_owned))
}

/// Authenticates with `user` and `password` (NULL and 0 for both: clears
/// them). A password without a user, or a user with a token or a
/// credentials file too, is refused by the connecting calls.
///
/// Errors: LG_INVALID_ARGUMENT (NULL options, a string NULL with a
/// non-zero length or not UTF-8). A failed call changes nothing.
/// Ownership: the strings are copied.
/// Thread safety: no other thread may be using `options`. Blocking: never.
///
/// # Safety
/// `options` is NULL or a live lg_nats_options; `user` and `password` are
/// NULL or valid for their lengths.
#[no_mangle]
pub unsafe extern "C" fn lg_nats_options_set_user_password(
    options: *mut lg_nats_options,
    user: *const c_char,
    user_len: usize,
    password: *const c_char,
    password_len: usize,
) -> lg_status {
    guard(|| {
        // SAFETY: each string is NULL or valid for its length (contract).
        let user = unsafe { setting(user, user_len, "user") }?;
        // SAFETY: as above.
        let password = unsafe { setting(password, password_len, "password") }?;
        // SAFETY: NULL or live, used by no other thread (contract).
        let o = unsafe { options_mut(options) }?;
        o.user = user;
        o.password = password;
        Ok(())
    })
}

/// Authenticates with `token` (NULL and 0: clears it).
///
/// Errors: LG_INVALID_ARGUMENT (NULL options, a string NULL with a
/// non-zero length or not UTF-8). A failed call changes nothing.
/// Ownership: the string is copied.
/// Thread safety: no other thread may be using `options`. Blocking: never.
///
/// # Safety
/// `options` is NULL or a live lg_nats_options; `token` is NULL or valid
/// for `token_len` bytes.
#[no_mangle]
pub unsafe extern "C" fn lg_nats_options_set_token(
    options: *mut lg_nats_options,
    token: *const c_char,
    token_len: usize,
) -> lg_status {
    guard(|| {
        // SAFETY: NULL or valid for its length (contract).
        let token = unsafe { setting(token, token_len, "token") }?;
        // SAFETY: NULL or live, used by no other thread (contract).
        let o = unsafe { options_mut(options) }?;
        o.token = token;
        Ok(())
    })
}

/// Authenticates with the credentials file at `path` (a `.creds` file: a
/// user JWT and its NKey seed, for servers in operator mode; NULL and 0:
/// clears it). The file is read by the connecting calls.
///
/// Errors: LG_INVALID_ARGUMENT (NULL options, a path NULL with a non-zero
/// length or not UTF-8). A failed call changes nothing.
/// Ownership: the path is copied.
/// Thread safety: no other thread may be using `options`. Blocking: never.
///
/// # Safety
/// `options` is NULL or a live lg_nats_options; `path` is NULL or valid for
/// `path_len` bytes.
#[no_mangle]
pub unsafe extern "C" fn lg_nats_options_set_credentials_file(
    options: *mut lg_nats_options,
    path: *const c_char,
    path_len: usize,
) -> lg_status {
    guard(|| {
        // SAFETY: NULL or valid for its length (contract).
        let path = unsafe { setting(path, path_len, "credentials") }?;
        // SAFETY: NULL or live, used by no other thread (contract).
        let o = unsafe { options_mut(options) }?;
        o.credentials = path.map(PathBuf::from);
        Ok(())
    })
}

/// Trusts the CA certificates in the PEM file at `path` (instead of the
/// system's roots) for the server's certificate, and requires TLS whatever
/// the url's scheme (NULL and 0: clears it). The file is read by the
/// connecting calls.
///
/// Errors: LG_INVALID_ARGUMENT (NULL options, a path NULL with a non-zero
/// length or not UTF-8). A failed call changes nothing.
/// Ownership: the path is copied.
/// Thread safety: no other thread may be using `options`. Blocking: never.
///
/// # Safety
/// `options` is NULL or a live lg_nats_options; `path` is NULL or valid for
/// `path_len` bytes.
#[no_mangle]
pub unsafe extern "C" fn lg_nats_options_set_tls_ca(
    options: *mut lg_nats_options,
    path: *const c_char,
    path_len: usize,
) -> lg_status {
    guard(|| {
        // SAFETY: NULL or valid for its length (contract).
        let path = unsafe { setting(path, path_len, "tls_ca") }?;
        // SAFETY: NULL or live, used by no other thread (contract).
        let o = unsafe { options_mut(options) }?;
        o.tls_ca = path.map(PathBuf::from);
        Ok(())
    })
}

/// Sets how long connecting may take in all (TCP connect, TLS handshake,
/// authentication), in milliseconds; 0 restores the default, two seconds.
///
/// Errors: LG_INVALID_ARGUMENT (NULL options). A failed call changes
/// nothing.
/// Ownership: nothing is kept but the value.
/// Thread safety: no other thread may be using `options`. Blocking: never.
///
/// # Safety
/// `options` is NULL or a live lg_nats_options.
#[no_mangle]
pub unsafe extern "C" fn lg_nats_options_set_connect_timeout_ms(
    options: *mut lg_nats_options,
    timeout_ms: u64,
) -> lg_status {
    guard(|| {
        // SAFETY: NULL or live, used by no other thread (contract).
        let o = unsafe { options_mut(options) }?;
        o.connect_timeout = (timeout_ms != 0).then(|| Duration::from_millis(timeout_ms));
        Ok(())
    })
}

/// Presents the client certificate chain in the PEM file `cert_path`, with
/// the private key in the PEM file `key_path` (mutual TLS), and requires
/// TLS (NULL and 0 for both: clears them; one without the other is refused
/// by the connecting calls). The files are read by the connecting calls.
///
/// Errors: LG_INVALID_ARGUMENT (NULL options, a path NULL with a non-zero
/// length or not UTF-8). A failed call changes nothing.
/// Ownership: the paths are copied.
/// Thread safety: no other thread may be using `options`. Blocking: never.
///
/// # Safety
/// `options` is NULL or a live lg_nats_options; `cert_path` and `key_path`
/// are NULL or valid for their lengths.
#[no_mangle]
pub unsafe extern "C" fn lg_nats_options_set_client_cert(
    options: *mut lg_nats_options,
    cert_path: *const c_char,
    cert_path_len: usize,
    key_path: *const c_char,
    key_path_len: usize,
) -> lg_status {
    guard(|| {
        // SAFETY: each path is NULL or valid for its length (contract).
        let cert = unsafe { setting(cert_path, cert_path_len, "tls_cert") }?;
        // SAFETY: as above.
        let key = unsafe { setting(key_path, key_path_len, "tls_key") }?;
        // SAFETY: NULL or live, used by no other thread (contract).
        let o = unsafe { options_mut(options) }?;
        o.tls_cert = cert.map(PathBuf::from);
        o.tls_key = key.map(PathBuf::from);
        Ok(())
    })
}
