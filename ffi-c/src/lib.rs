//! The C ABI of loadgate: `libloadgate.so`, `libloadgate.a` and
//! `include/loadgate.h` (generated from this crate by cbindgen).
//!
//! A thin shell over the core crate: each exported object has its own
//! module, and no behaviour lives here that core does not already have.
//! Conventions (the header's opening comment repeats them for C users):
//!
//! * prefix `lg_`; opaque handles; functions `lg_<object>_<verb>`;
//!   `_new`/`_free`, where freeing NULL is a no-op;
//! * inputs before outputs; every buffer followed by its length; strings
//!   are UTF-8 pointer + length, not NUL-terminated;
//! * fallible calls return [`lg_status`]; out-parameters are written only on
//!   success (the snprintf-style text calls also report the needed length
//!   on `LG_BUFFER_TOO_SMALL`); the message of a thread's last failure is
//!   `lg_last_error_message()`;
//! * every entry point runs inside a panic boundary: a panic becomes
//!   `LG_PANIC`, never an unwind into C.

#![allow(non_camel_case_types)]

mod booking;
mod cluster;
mod discovery;
mod ffi;
mod flow;
mod gate;
mod http;
mod monitor;
mod nats_options;
mod permit;
mod replicas;
mod scrape;
mod status;
mod status_code;
mod ticket;

use std::ffi::c_char;

pub use booking::*;
pub use cluster::*;
pub use discovery::*;
pub use flow::*;
pub use gate::*;
pub use http::*;
pub use monitor::*;
pub use nats_options::*;
pub use permit::*;
pub use replicas::*;
pub use scrape::*;
pub use status::*;
pub use ticket::*;

/// Major version of the library this header belongs to (ABI-breaking
/// changes bump it; while it is 0, the minor version does).
pub const LOADGATE_VERSION_MAJOR: u32 = 0;
/// Minor version (additions; while the major version is 0, ABI-breaking
/// changes too, such as fields appended to a struct passed by pointer).
pub const LOADGATE_VERSION_MINOR: u32 = 4;
/// Patch version (fixes).
pub const LOADGATE_VERSION_PATCH: u32 = 0;

/// The library's version, "MAJOR.MINOR.PATCH". Compare with the
/// LOADGATE_VERSION_* macros to detect a header/library mismatch.
///
/// Ownership: the string is static; do not free it.
/// Thread safety: any thread. Blocking: never.
#[no_mangle]
pub extern "C" fn lg_version() -> *const c_char {
    const VERSION: &str = concat!(env!("CARGO_PKG_VERSION"), "\0");
    ffi::boundary(VERSION.as_ptr().cast(), || VERSION.as_ptr().cast())
}

/// The message of the last call on this thread that failed (returned a
/// status other than LG_OK, or panicked inside a call returning no status);
/// "" when none has. Successful calls leave it unchanged, like errno.
///
/// Ownership: the string belongs to the library; it stays valid until the
/// next loadgate call on this thread that fails. Copy it to keep it.
/// Thread safety: per thread. Blocking: never.
#[no_mangle]
pub extern "C" fn lg_last_error_message() -> *const c_char {
    ffi::boundary(c"".as_ptr(), ffi::last_error_ptr)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_macros_match_the_package() {
        let major: u32 = env!("CARGO_PKG_VERSION_MAJOR").parse().unwrap();
        let minor: u32 = env!("CARGO_PKG_VERSION_MINOR").parse().unwrap();
        let patch: u32 = env!("CARGO_PKG_VERSION_PATCH").parse().unwrap();
        assert_eq!(
            (
                LOADGATE_VERSION_MAJOR,
                LOADGATE_VERSION_MINOR,
                LOADGATE_VERSION_PATCH
            ),
            (major, minor, patch),
            "update the LOADGATE_VERSION_* constants and regenerate the header"
        );
        // SAFETY: lg_version returns a static C string.
        let v = unsafe { std::ffi::CStr::from_ptr(lg_version()) };
        assert_eq!(v.to_str().unwrap(), env!("CARGO_PKG_VERSION"));
    }
}
