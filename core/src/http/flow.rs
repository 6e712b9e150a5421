//! The flow-control settings a request names in headers: what a frontend's
//! dispatch middleware reads before it dispatches a request through its
//! model's queue (docs/flow-control.md).
//!
//! * The tenant (`x-loadgate-tenant` by default; the server may read
//!   another header, such as `x-llm-d-inference-fairness-id`): the value,
//!   spaces and tabs around it ignored, as UTF-8.
//! * `x-loadgate-deadline-ms`: how long the request may wait, a positive
//!   integer of milliseconds (a longer one than the queue allows is cut to
//!   it).
//! * `x-loadgate-queue`: `never` (refused at once instead of waiting) or
//!   `wait`, in any case.
//!
//! A malformed value is an error naming the header, which a server answers
//! with 400: a client cannot turn a typo into a default it did not ask for.
//! A proxy the server trusts should set or strip these headers, the tenant
//! above all: clients choose them otherwise.

use std::fmt;
use std::time::Duration;

use super::priority::trim;

/// The tenant's header by default.
pub const TENANT_HEADER: &str = "x-loadgate-tenant";
/// How long a request may wait, in milliseconds.
pub const DEADLINE_HEADER: &str = "x-loadgate-deadline-ms";
/// `never` or `wait`.
pub const QUEUE_HEADER: &str = "x-loadgate-queue";

/// What a request's headers ask of the queue; `None` where it names
/// nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct FlowHeaders<'a> {
    /// Its tenant.
    pub tenant: Option<&'a str>,
    /// How long it may wait.
    pub deadline: Option<Duration>,
    /// Whether it may wait.
    pub queue: Option<bool>,
}

/// A header whose value is malformed; the message names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FlowHeaderError {
    /// The tenant's value is not UTF-8.
    Tenant,
    /// `x-loadgate-deadline-ms` is not a positive integer.
    Deadline,
    /// `x-loadgate-queue` is neither `never` nor `wait`.
    Queue,
}

impl fmt::Display for FlowHeaderError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Tenant => write!(f, "the tenant header must be UTF-8"),
            Self::Deadline => write!(
                f,
                "{DEADLINE_HEADER} must be a positive integer of milliseconds"
            ),
            Self::Queue => write!(f, "{QUEUE_HEADER} must be 'never' or 'wait'"),
        }
    }
}

impl std::error::Error for FlowHeaderError {}

impl<'a> FlowHeaders<'a> {
    /// Reads the raw values of the tenant's, deadline and queue headers
    /// (`None` for a header the request does not carry).
    pub fn parse(
        tenant: Option<&'a [u8]>,
        deadline_ms: Option<&[u8]>,
        queue: Option<&[u8]>,
    ) -> Result<Self, FlowHeaderError> {
        let tenant = tenant
            .map(|v| std::str::from_utf8(trim(v)).map_err(|_| FlowHeaderError::Tenant))
            .transpose()?;
        let deadline = deadline_ms.map(parse_deadline).transpose()?;
        let queue = queue
            .map(|v| match trim(v).to_ascii_lowercase().as_slice() {
                b"never" => Ok(false),
                b"wait" => Ok(true),
                _ => Err(FlowHeaderError::Queue),
            })
            .transpose()?;
        Ok(Self {
            tenant,
            deadline,
            queue,
        })
    }
}

/// A positive integer of milliseconds; past `u64` it saturates (the queue
/// cuts any deadline to its longest).
fn parse_deadline(value: &[u8]) -> Result<Duration, FlowHeaderError> {
    let digits = trim(value);
    if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
        return Err(FlowHeaderError::Deadline);
    }
    let ms = digits
        .iter()
        .try_fold(0u64, |n, d| {
            n.checked_mul(10)?.checked_add(u64::from(d - b'0'))
        })
        .unwrap_or(u64::MAX);
    if ms == 0 {
        return Err(FlowHeaderError::Deadline);
    }
    Ok(Duration::from_millis(ms))
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    fn parse(
        tenant: Option<&'static str>,
        deadline: Option<&'static str>,
        queue: Option<&'static str>,
    ) -> Result<FlowHeaders<'static>, FlowHeaderError> {
        FlowHeaders::parse(
            tenant.map(str::as_bytes),
            deadline.map(str::as_bytes),
            queue.map(str::as_bytes),
        )
    }

    #[test]
    fn no_headers_ask_for_nothing() {
        assert_eq!(parse(None, None, None), Ok(FlowHeaders::default()));
    }

    #[test]
    fn values_are_trimmed_and_read() {
        let h = parse(Some(" acme\t"), Some(" 250 "), Some(" NEVER")).unwrap();
        assert_eq!(h.tenant, Some("acme"));
        assert_eq!(h.deadline, Some(Duration::from_millis(250)));
        assert_eq!(h.queue, Some(false));
        assert_eq!(parse(None, None, Some("Wait")).unwrap().queue, Some(true));
        assert_eq!(parse(Some(""), None, None).unwrap().tenant, Some(""));
    }

    #[test]
    fn a_huge_deadline_saturates() {
        let h = parse(None, Some("99999999999999999999999999"), None).unwrap();
        assert_eq!(h.deadline, Some(Duration::from_millis(u64::MAX)));
    }

    #[test]
    fn malformed_values_name_their_header() {
        for bad in ["0", "", "-5", "1.5", "10ms", "1e3", " "] {
            let e = parse(None, Some(bad), None).unwrap_err();
            assert_eq!(e, FlowHeaderError::Deadline, "{bad:?}");
            assert!(e.to_string().contains(DEADLINE_HEADER));
        }
        for bad in ["", "always", "no", "never!"] {
            let e = parse(None, None, Some(bad)).unwrap_err();
            assert_eq!(e, FlowHeaderError::Queue, "{bad:?}");
            assert!(e.to_string().contains(QUEUE_HEADER));
        }
        let e = FlowHeaders::parse(Some(b"\xff\xfe"), None, None).unwrap_err();
        assert_eq!(e, FlowHeaderError::Tenant);
    }
}
