//! The scraper's HTTP side: one HTTP/1.1 client connection per worker
//! (hyper's `client::conn::http1`), opened on first use, reused for every
//! scrape while it stays open, and reopened only after a failure.

use std::fmt;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty, LengthLimitError, Limited};
use hyper::client::conn::http1::{self, SendRequest};
use hyper::header::{ACCEPT, CONTENT_LENGTH, HOST};
use hyper::{Request, StatusCode, Uri};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

use super::ScrapeError;

/// Where to scrape: `http://host[:port][/path]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Target {
    /// Host name or address, without IPv6 brackets.
    host: String,
    port: u16,
    /// The `Host` header: the URL's authority.
    authority: String,
    /// Path and query; `/metrics` when the URL has none.
    path: String,
}

impl Target {
    pub(super) fn parse(url: &str) -> Result<Self, ScrapeError> {
        let bad = |why: &str| ScrapeError::Url(format!("{url:?}: {why}"));
        let uri: Uri = url.parse().map_err(|e| bad(&format!("{e}")))?;
        match uri.scheme_str() {
            Some("http") => {}
            Some(other) => {
                return Err(bad(&format!("scheme {other:?} is not supported; use http")))
            }
            None => return Err(bad("no scheme; use http://host:port/metrics")),
        }
        let authority = uri.authority().ok_or_else(|| bad("no host"))?;
        if authority.as_str().contains('@') {
            return Err(bad("credentials in the URL are not supported"));
        }
        let host = authority
            .host()
            .trim_start_matches('[')
            .trim_end_matches(']');
        if host.is_empty() {
            return Err(bad("no host"));
        }
        let path = match uri.path_and_query().map(|p| p.as_str()) {
            None | Some("") | Some("/") => "/metrics".to_owned(),
            Some(p) => p.to_owned(),
        };
        Ok(Self {
            host: host.to_owned(),
            port: authority.port_u16().unwrap_or(80),
            authority: authority.as_str().to_owned(),
            path,
        })
    }
}

/// Why fetching a body failed.
#[derive(Debug)]
pub(super) enum FetchError {
    /// Connecting or the exchange itself failed.
    Connect(String),
    /// The answer's status was not 200.
    Status(StatusCode),
    /// The body was larger than the limit.
    TooLarge(usize),
}

impl FetchError {
    pub(super) fn kind(&self) -> &'static str {
        match self {
            FetchError::Connect(_) => "connect",
            FetchError::Status(_) => "http",
            FetchError::TooLarge(_) => "too_large",
        }
    }
}

impl fmt::Display for FetchError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FetchError::Connect(why) => write!(f, "connection failed: {why}"),
            FetchError::Status(s) => write!(f, "answered {s}"),
            FetchError::TooLarge(limit) => write!(f, "body larger than {limit} bytes"),
        }
    }
}

/// One worker's connection, if open.
#[derive(Debug, Default)]
pub(super) struct Connection {
    sender: Option<SendRequest<Empty<Bytes>>>,
    opened: u64,
}

impl Connection {
    /// Connections opened so far.
    pub(super) fn opened(&self) -> u64 {
        self.opened
    }

    /// Drops the connection (its task ends with it).
    pub(super) fn close(&mut self) {
        self.sender = None;
    }

    /// `GET`s the target's path, reading at most `limit` bytes of body.
    pub(super) async fn get(&mut self, t: &Target, limit: usize) -> Result<Bytes, FetchError> {
        let err = |e: &dyn fmt::Display| FetchError::Connect(e.to_string());
        if self.sender.as_ref().is_none_or(|s| s.is_closed()) {
            self.sender = None;
            let stream = TcpStream::connect((t.host.as_str(), t.port))
                .await
                .map_err(|e| err(&e))?;
            let _ = stream.set_nodelay(true);
            let (sender, conn) = http1::handshake(TokioIo::new(stream))
                .await
                .map_err(|e| err(&e))?;
            // Ends when the sender is dropped or the peer closes.
            tokio::spawn(async move {
                let _ = conn.await;
            });
            self.opened += 1;
            self.sender = Some(sender);
        }
        let sender = self.sender.as_mut().expect("opened above");
        sender.ready().await.map_err(|e| err(&e))?;
        let request = Request::get(t.path.as_str())
            .header(HOST, t.authority.as_str())
            .header(ACCEPT, "text/plain; version=0.0.4")
            .body(Empty::<Bytes>::new())
            .map_err(|e| err(&e))?;
        let response = sender.send_request(request).await.map_err(|e| err(&e))?;
        if response.status() != StatusCode::OK {
            return Err(FetchError::Status(response.status()));
        }
        let declared = response
            .headers()
            .get(CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        if declared.is_some_and(|n| n > limit as u64) {
            return Err(FetchError::TooLarge(limit));
        }
        match Limited::new(response.into_body(), limit).collect().await {
            Ok(body) => Ok(body.to_bytes()),
            Err(e) if e.is::<LengthLimitError>() => Err(FetchError::TooLarge(limit)),
            Err(e) => Err(FetchError::Connect(e.to_string())),
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn urls_name_an_http_host_and_default_to_metrics() {
        let t = Target::parse("http://127.0.0.1:8000").unwrap();
        assert_eq!(
            (
                t.host.as_str(),
                t.port,
                t.authority.as_str(),
                t.path.as_str()
            ),
            ("127.0.0.1", 8000, "127.0.0.1:8000", "/metrics")
        );
        let t = Target::parse("http://[::1]:9/m?x=1").unwrap();
        assert_eq!(
            (t.host.as_str(), t.port, t.path.as_str()),
            ("::1", 9, "/m?x=1")
        );
        assert_eq!(Target::parse("http://engine/").unwrap().port, 80);
        for bad in [
            "",
            "engine:8000/metrics",
            "https://engine/metrics",
            "http://user:pw@engine/metrics",
            "http:///metrics",
            "not a url",
        ] {
            assert!(Target::parse(bad).is_err(), "{bad:?}");
        }
    }
}
