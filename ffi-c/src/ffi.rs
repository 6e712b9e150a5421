//! The machinery every entry point shares: the panic boundary, the
//! thread-local last error, and checked conversions of C arguments.
//!
//! Every `extern "C"` function body runs inside [`guard`] (or [`boundary`]
//! for functions that return a value rather than a status). Arguments are
//! checked before anything happens, so a NULL out-parameter never leaves a
//! half-done operation behind, and out-parameters are written through
//! [`Out::write`] only once the operation has succeeded.

use std::any::Any;
use std::cell::RefCell;
use std::ffi::c_char;
use std::fmt;
use std::io::Write as _;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::ptr::NonNull;

use crate::status_code::lg_status;

/// Why a call failed: the status to return and the message for
/// `lg_last_error_message()`.
#[derive(Debug)]
pub(crate) struct Error {
    pub(crate) status: lg_status,
    message: Message,
}

/// Static messages (every rejection) cost nothing to record; the rest are
/// formatted on the cold path.
#[derive(Debug)]
enum Message {
    Static(&'static str),
    Owned(String),
}

impl Error {
    /// An error with a fixed message (no allocation).
    pub(crate) const fn fixed(status: lg_status, message: &'static str) -> Self {
        Self {
            status,
            message: Message::Static(message),
        }
    }

    /// An error whose message is formatted.
    pub(crate) fn new(status: lg_status, message: impl fmt::Display) -> Self {
        Self {
            status,
            message: Message::Owned(message.to_string()),
        }
    }

    /// `LG_INVALID_ARGUMENT` with a formatted message.
    pub(crate) fn invalid(message: impl fmt::Display) -> Self {
        Self::new(lg_status::LG_INVALID_ARGUMENT, message)
    }

    fn text(&self) -> &str {
        match &self.message {
            Message::Static(s) => s,
            Message::Owned(s) => s,
        }
    }
}

pub(crate) type Result<T, E = Error> = std::result::Result<T, E>;

thread_local! {
    /// The message of this thread's last failed call, NUL-terminated; empty
    /// until a call fails. Reused, so recording a rejection allocates only
    /// the first time.
    static LAST_ERROR: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// Records `message` as this thread's last error.
pub(crate) fn set_last_error(message: &str) {
    let _ = LAST_ERROR.try_with(|cell| {
        if let Ok(mut buf) = cell.try_borrow_mut() {
            buf.clear();
            // A NUL inside would cut the C string short.
            buf.extend(message.bytes().map(|b| if b == 0 { b'?' } else { b }));
            buf.push(0);
        }
    });
}

/// This thread's last error message as a C string; "" when none. The pointer
/// stays valid until the next failing call on this thread.
pub(crate) fn last_error_ptr() -> *const c_char {
    static EMPTY: &[u8] = b"\0";
    LAST_ERROR
        .try_with(|cell| match cell.try_borrow() {
            Ok(buf) if !buf.is_empty() => buf.as_ptr().cast::<c_char>(),
            _ => EMPTY.as_ptr().cast::<c_char>(),
        })
        .unwrap_or(EMPTY.as_ptr().cast::<c_char>())
}

/// The text of a panic payload.
fn panic_text(payload: &(dyn Any + Send)) -> &str {
    if let Some(s) = payload.downcast_ref::<&'static str>() {
        s
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s
    } else {
        "unknown panic payload"
    }
}

fn record_panic(payload: &(dyn Any + Send)) {
    let mut msg = Vec::with_capacity(64);
    let _ = write!(msg, "internal error (panic): {}", panic_text(payload));
    set_last_error(&String::from_utf8_lossy(&msg));
}

/// The panic boundary of a call that returns a status: `LG_OK`, the error's
/// status (recording its message), or `LG_PANIC` if `f` panicked.
///
/// `AssertUnwindSafe`: after a panic the caller gets `LG_PANIC` and is told
/// (in the header) to stop using the objects involved; core's locks ignore
/// poisoning and keep their data consistent, so nothing worse than a lost
/// operation can follow.
#[inline]
pub(crate) fn guard(f: impl FnOnce() -> Result<()>) -> lg_status {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(())) => lg_status::LG_OK,
        Ok(Err(e)) => {
            set_last_error(e.text());
            e.status
        }
        Err(payload) => {
            record_panic(&*payload);
            lg_status::LG_PANIC
        }
    }
}

/// The panic boundary of a call that returns a value: `fallback` if `f`
/// panicked (the panic is recorded as the last error).
#[inline]
pub(crate) fn boundary<T>(fallback: T, f: impl FnOnce() -> T) -> T {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(v) => v,
        Err(payload) => {
            record_panic(&*payload);
            fallback
        }
    }
}

fn null(what: &'static str) -> Error {
    Error::invalid(format_args!("{what} must not be NULL"))
}

fn check_ptr<T>(p: *const T, what: &'static str) -> Result<()> {
    if p.is_null() {
        return Err(null(what));
    }
    if !p.is_aligned() {
        return Err(Error::invalid(format_args!("{what} is misaligned")));
    }
    Ok(())
}

/// Borrows a required input.
///
/// # Safety
/// `p` is NULL or points to a valid `T` that nobody mutates for `'a`.
#[inline(always)]
pub(crate) unsafe fn input<'a, T>(p: *const T, what: &'static str) -> Result<&'a T> {
    check_ptr(p, what)?;
    // SAFETY: non-NULL and aligned (checked); valid for 'a by the contract.
    Ok(unsafe { &*p })
}

/// Borrows an optional input: `None` for NULL.
///
/// # Safety
/// As [`input`].
#[inline]
pub(crate) unsafe fn optional<'a, T>(p: *const T, what: &'static str) -> Result<Option<&'a T>> {
    if p.is_null() {
        return Ok(None);
    }
    // SAFETY: forwarded contract.
    unsafe { input(p, what) }.map(Some)
}

/// Borrows `len` elements at `p`; `p` may be NULL only when `len` is 0.
///
/// # Safety
/// `p` is NULL or points to `len` valid, initialised `T`s that nobody
/// mutates for `'a`.
#[inline(always)]
pub(crate) unsafe fn slice<'a, T>(p: *const T, len: usize, what: &'static str) -> Result<&'a [T]> {
    if len == 0 {
        return Ok(&[]);
    }
    check_ptr(p, what)?;
    if len > isize::MAX as usize / std::mem::size_of::<T>().max(1) {
        return Err(Error::invalid(format_args!(
            "{what}: length {len} is out of range"
        )));
    }
    // SAFETY: non-NULL, aligned, length within isize::MAX bytes (checked);
    // `len` valid elements for 'a by the contract.
    Ok(unsafe { std::slice::from_raw_parts(p, len) })
}

/// Borrows a UTF-8 string given as pointer and length (no NUL needed).
///
/// # Safety
/// As [`slice`] for `len` bytes.
#[inline(always)]
pub(crate) unsafe fn string<'a>(
    p: *const c_char,
    len: usize,
    what: &'static str,
) -> Result<&'a str> {
    // SAFETY: forwarded contract.
    let bytes = unsafe { slice(p.cast::<u8>(), len, what) }?;
    // Model names are short and almost always ASCII: OR-ing the bytes is a
    // fraction of the cost of general UTF-8 validation on the routing path.
    let ascii = is_ascii_short(bytes);
    if ascii {
        // SAFETY: ASCII bytes are valid UTF-8.
        return Ok(unsafe { std::str::from_utf8_unchecked(bytes) });
    }
    std::str::from_utf8(bytes)
        .map_err(|e| Error::invalid(format_args!("{what} is not valid UTF-8: {e}")))
}

/// `bytes.is_ascii()`, tuned for short strings: eight bytes at a time, with
/// no alignment prologue.
#[inline(always)]
fn is_ascii_short(bytes: &[u8]) -> bool {
    const HIGH: u64 = 0x8080_8080_8080_8080;
    let mut chunks = bytes.chunks_exact(8);
    let mut wide = 0u64;
    for chunk in &mut chunks {
        let mut word = [0u8; 8];
        word.copy_from_slice(chunk);
        wide |= u64::from_ne_bytes(word);
    }
    let narrow = chunks.remainder().iter().fold(0u8, |acc, b| acc | b);
    wide & HIGH == 0 && narrow < 0x80
}

/// Like [`string`], but NULL means "absent".
///
/// # Safety
/// As [`slice`] for `len` bytes.
#[inline]
pub(crate) unsafe fn optional_string<'a>(
    p: *const c_char,
    len: usize,
    what: &'static str,
) -> Result<Option<&'a str>> {
    if p.is_null() {
        return if len == 0 {
            Ok(None)
        } else {
            Err(Error::invalid(format_args!(
                "{what} is NULL but its length is {len}"
            )))
        };
    }
    // SAFETY: forwarded contract.
    unsafe { string(p, len, what) }.map(Some)
}

/// A checked out-parameter, written only on success.
pub(crate) struct Out<T>(NonNull<T>);

impl<T> Out<T> {
    /// Checks a required out-parameter.
    #[inline]
    pub(crate) fn new(p: *mut T, what: &'static str) -> Result<Self> {
        check_ptr(p, what)?;
        // Non-NULL: checked just above.
        Ok(Self(NonNull::new(p).ok_or_else(|| null(what))?))
    }

    /// Checks an optional out-parameter: `None` for NULL.
    #[inline]
    pub(crate) fn optional(p: *mut T, what: &'static str) -> Result<Option<Self>> {
        if p.is_null() {
            Ok(None)
        } else {
            Self::new(p, what).map(Some)
        }
    }

    /// Stores the result. The old contents are not dropped (they may be
    /// uninitialised C memory).
    ///
    /// # Safety
    /// The pointer given to [`Out::new`] is valid for writes of a `T`.
    #[inline]
    pub(crate) unsafe fn write(self, value: T) {
        // SAFETY: non-NULL and aligned (checked in `new`); writable by the
        // contract; `write` does not read or drop the old value.
        unsafe { self.0.as_ptr().write(value) }
    }
}

/// A checked caller buffer for text, with snprintf semantics.
pub(crate) struct TextBuf {
    ptr: *mut c_char,
    len: usize,
    needed: Out<usize>,
}

impl TextBuf {
    /// Checks `buf`/`buf_len` (`buf` may be NULL only when `buf_len` is 0)
    /// and the required `out_needed`.
    pub(crate) fn new(buf: *mut c_char, buf_len: usize, out_needed: *mut usize) -> Result<Self> {
        if buf.is_null() && buf_len != 0 {
            return Err(Error::invalid(format_args!(
                "buf is NULL but buf_len is {buf_len}"
            )));
        }
        if buf_len > isize::MAX as usize {
            return Err(Error::invalid(format_args!(
                "buf_len {buf_len} is out of range"
            )));
        }
        Ok(Self {
            ptr: buf,
            len: buf_len,
            needed: Out::new(out_needed, "out_needed")?,
        })
    }

    /// Writes `text` with snprintf semantics: `*out_needed` = `text.len()`
    /// (without the NUL) in every case; the whole text and a NUL when
    /// `buf_len > text.len()` (then `Ok`), else as much as fits plus a NUL
    /// (when `buf_len > 0`) and `LG_BUFFER_TOO_SMALL`.
    ///
    /// # Safety
    /// `buf` (when not NULL) is valid for writes of `buf_len` bytes and does
    /// not overlap `text`; `out_needed` is valid for writes.
    pub(crate) unsafe fn write(self, text: &[u8]) -> Result<()> {
        let needed = text.len();
        let copy = needed.min(self.len.saturating_sub(1));
        if self.len > 0 {
            // SAFETY: `copy + 1 <= len` bytes fit in the caller's buffer
            // (contract); `text` is a Rust allocation distinct from it.
            unsafe {
                std::ptr::copy_nonoverlapping(text.as_ptr(), self.ptr.cast::<u8>(), copy);
                self.ptr.add(copy).write(0);
            }
        }
        // SAFETY: checked in `new`; writable by the contract.
        unsafe { self.needed.write(needed) };
        if self.len > needed {
            Ok(())
        } else {
            Err(Error::new(
                lg_status::LG_BUFFER_TOO_SMALL,
                format_args!(
                    "buffer of {} bytes is too small: the text needs {} bytes plus the NUL",
                    self.len, needed
                ),
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::CStr;

    fn last() -> String {
        // SAFETY: last_error_ptr returns a NUL-terminated string.
        unsafe { CStr::from_ptr(last_error_ptr()) }
            .to_string_lossy()
            .into_owned()
    }

    #[test]
    fn panics_become_lg_panic_with_a_message() {
        let status = guard(|| panic!("boom {}", 7));
        assert_eq!(status, lg_status::LG_PANIC);
        assert_eq!(last(), "internal error (panic): boom 7");
        assert_eq!(boundary(42u32, || panic!("static")), 42);
        assert_eq!(last(), "internal error (panic): static");
    }

    #[test]
    fn errors_are_recorded_per_thread() {
        assert_eq!(
            guard(|| Err(Error::fixed(lg_status::LG_NOT_FOUND, "nope\0x"))),
            lg_status::LG_NOT_FOUND
        );
        assert_eq!(last(), "nope?x");
        std::thread::spawn(|| assert_eq!(last(), ""))
            .join()
            .unwrap();
        assert_eq!(guard(|| Ok(())), lg_status::LG_OK);
        assert_eq!(last(), "nope?x", "success leaves the last error alone");
    }

    #[test]
    fn text_buffers_follow_snprintf() {
        let mut buf = [0x55 as c_char; 4];
        let mut needed = 0usize;
        let tb = TextBuf::new(buf.as_mut_ptr(), 4, &mut needed).unwrap();
        // SAFETY: buf has 4 bytes; needed is a live usize.
        let r = unsafe { tb.write(b"abcdef") };
        assert_eq!(r.unwrap_err().status, lg_status::LG_BUFFER_TOO_SMALL);
        assert_eq!(needed, 6);
        assert_eq!(buf.map(|c| c as u8), *b"abc\0");
        let tb = TextBuf::new(buf.as_mut_ptr(), 4, &mut needed).unwrap();
        // SAFETY: as above.
        unsafe { tb.write(b"xyz") }.unwrap();
        assert_eq!(buf.map(|c| c as u8), *b"xyz\0");
        let tb = TextBuf::new(std::ptr::null_mut(), 0, &mut needed).unwrap();
        // SAFETY: NULL buffer of length 0 is never written.
        assert!(unsafe { tb.write(b"hello") }.is_err());
        assert_eq!(needed, 5);
        assert!(TextBuf::new(std::ptr::null_mut(), 3, &mut needed).is_err());
        assert!(TextBuf::new(buf.as_mut_ptr(), 4, std::ptr::null_mut()).is_err());
    }

    #[test]
    fn strings_and_slices_are_checked() {
        let words = [0u64; 2];
        let misaligned = words.as_ptr().cast::<u8>().wrapping_add(1).cast::<u64>();
        // SAFETY: the valid cases point to live data of the given length; the
        // invalid ones are refused before anything is read.
        unsafe {
            assert_eq!(string(b"ab".as_ptr().cast(), 2, "s").unwrap(), "ab");
            assert!(string(std::ptr::null(), 1, "s").is_err());
            assert_eq!(string(std::ptr::null(), 0, "s").unwrap(), "");
            assert!(string(b"\xff".as_ptr().cast(), 1, "s").is_err());
            let long = "model-name-longer-than-eight-bytes-é";
            assert_eq!(string(long.as_ptr().cast(), long.len(), "s").unwrap(), long);
            let bad = b"abcdefghij\xc3";
            assert!(string(bad.as_ptr().cast(), bad.len(), "s").is_err());
            assert!(slice(words.as_ptr(), usize::MAX, "s").is_err());
            assert!(slice(misaligned, 1, "s").is_err(), "misaligned");
            assert_eq!(slice(words.as_ptr(), 2, "s").unwrap(), &[0, 0]);
            assert_eq!(optional_string(std::ptr::null(), 0, "s").unwrap(), None);
            assert!(optional_string(std::ptr::null(), 2, "s").is_err());
        }
    }
}
