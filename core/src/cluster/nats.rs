//! NATS core pub/sub transport (feature `nats`), with the server's
//! authentication (user and password, token, credentials file) and TLS
//! (a custom CA, client certificates) as [`NatsOptions`].

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use tokio::sync::mpsc;

use super::{ClusterError, Handler, Subscription, Transport};
use crate::fork::ForkGuard;
use crate::runtime::{block_on, runtime};

/// A connection to a NATS server. Publishing is non-blocking and keeps
/// order; the connection reconnects by itself after the server restarts
/// and restores its subscriptions.
#[derive(Debug, Clone)]
pub struct NatsTransport {
    client: async_nats::Client,
    outbox: mpsc::UnboundedSender<(String, bytes::Bytes)>,
    /// Disconnections and slow-subscriber drops so far.
    interruptions: Arc<AtomicU64>,
    /// The process that connected: a forked child cannot use the parent's
    /// connection (its tasks ran on the parent's runtime threads).
    made_in: ForkGuard,
}

/// How long a connection attempt may take in all (TCP, TLS handshake,
/// authentication) before it gives up, unless
/// [`NatsOptions::connect_timeout`] says otherwise.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// How to authenticate to the NATS server and protect the connection.
///
/// The default is no authentication, and TLS only when the URL says
/// `tls://`. At most one way to authenticate may be set: `user` with
/// `password`, `token`, or `credentials`. Setting `tls_ca` or a client
/// certificate makes TLS required whatever the URL's scheme.
///
/// [`NatsTransport::connect_with`] checks the options before connecting: a
/// conflicting or incomplete combination, an empty value, or a file that
/// cannot be read or does not hold what it should is
/// [`ClusterError::InvalidConfig`] naming the option.
///
/// ```
/// use loadgate::cluster::nats::NatsOptions;
///
/// let options = NatsOptions {
///     user: Some("worker-7".into()),
///     password: Some("s3cret".into()),
///     tls_ca: Some("/etc/loadgate/nats-ca.pem".into()),
///     ..NatsOptions::default()
/// };
/// # let _ = options;
/// ```
#[derive(Clone, Default, PartialEq, Eq)]
pub struct NatsOptions {
    /// User name; needs `password`.
    pub user: Option<String>,
    /// Password of `user`.
    pub password: Option<String>,
    /// Authentication token.
    pub token: Option<String>,
    /// A credentials file (`.creds`: a user JWT and its NKey seed, as `nsc`
    /// writes them) for servers in operator (decentralised JWT) mode.
    pub credentials: Option<PathBuf>,
    /// A PEM file of the CA certificates that sign the server's
    /// certificate, trusted instead of the system's roots.
    pub tls_ca: Option<PathBuf>,
    /// A PEM file of the client certificate chain (mutual TLS); needs
    /// `tls_key`.
    pub tls_cert: Option<PathBuf>,
    /// A PEM file of the client certificate's private key; needs
    /// `tls_cert`.
    pub tls_key: Option<PathBuf>,
    /// How long connecting may take in all (TCP, TLS handshake,
    /// authentication) before it fails; `None` is
    /// [`DEFAULT_CONNECT_TIMEOUT`] (2 s). Longer than zero.
    pub connect_timeout: Option<Duration>,
    /// How many received messages one subscription holds while its
    /// handler is busy; past it the client drops the newest (a slow
    /// consumer, counted in [`Transport::interruptions`]: load reports
    /// are replaced by the next, and booking sync asks for whole states
    /// after the gap). `None` is [`DEFAULT_SUBSCRIPTION_CAPACITY`]. At
    /// least 1.
    pub subscription_capacity: Option<usize>,
}

/// Default [`NatsOptions::subscription_capacity`]: what async-nats holds.
pub const DEFAULT_SUBSCRIPTION_CAPACITY: usize = 65_536;

impl fmt::Debug for NatsOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Secrets are never printed.
        let hidden = |v: &Option<String>| v.as_ref().map(|_| "<hidden>");
        f.debug_struct("NatsOptions")
            .field("user", &self.user)
            .field("password", &hidden(&self.password))
            .field("token", &hidden(&self.token))
            .field("credentials", &self.credentials)
            .field("tls_ca", &self.tls_ca)
            .field("tls_cert", &self.tls_cert)
            .field("tls_key", &self.tls_key)
            .field("connect_timeout", &self.connect_timeout)
            .field("subscription_capacity", &self.subscription_capacity)
            .finish()
    }
}

/// How a connection authenticates, once the options are checked.
enum Auth {
    None,
    UserPassword(String, String),
    Token(String),
    /// The credentials file's text.
    Credentials(String),
}

impl Auth {
    /// What the server refused, for an authorization failure's message.
    fn what(&self) -> &'static str {
        match self {
            Auth::None => "connection without credentials",
            Auth::UserPassword(..) => "user and password",
            Auth::Token(_) => "token",
            Auth::Credentials(_) => "credentials file",
        }
    }
}

/// Checked options, ready to connect with.
struct Checked {
    auth: Auth,
    tls_ca: Option<PathBuf>,
    client_cert: Option<(PathBuf, PathBuf)>,
    timeout: Duration,
    capacity: usize,
}

fn invalid(why: String) -> ClusterError {
    ClusterError::InvalidConfig(why)
}

/// Reads `path` (option `name`) as text.
fn read_file(name: &str, path: &Path) -> Result<String, ClusterError> {
    std::fs::read_to_string(path)
        .map_err(|e| invalid(format!("{name} file {path:?} cannot be read: {e}")))
}

/// Reads `path` (option `name`) and checks that it holds a PEM block whose
/// label ends with `label`.
fn check_pem(name: &str, path: &Path, label: &str, what: &str) -> Result<(), ClusterError> {
    let text = read_file(name, path)?;
    let found = text.lines().any(|l| {
        l.strip_prefix("-----BEGIN ")
            .and_then(|l| l.strip_suffix("-----"))
            .is_some_and(|l| l.ends_with(label))
    });
    if found {
        Ok(())
    } else {
        Err(invalid(format!("{name} file {path:?} holds no PEM {what}")))
    }
}

fn non_empty<'a>(name: &str, v: &'a Option<String>) -> Result<Option<&'a str>, ClusterError> {
    match v.as_deref() {
        Some("") => Err(invalid(format!("{name} is empty"))),
        other => Ok(other),
    }
}

impl NatsOptions {
    /// Checks the options as [`NatsTransport::connect_with`] does before
    /// connecting: one way to authenticate at most, complete pairs, no
    /// empty values, files readable and holding what they should.
    pub fn validate(&self) -> Result<(), ClusterError> {
        self.check().map(|_| ())
    }

    fn check(&self) -> Result<Checked, ClusterError> {
        let user = non_empty("user", &self.user)?;
        let token = non_empty("token", &self.token)?;
        let auth = match (user, &self.password, token, &self.credentials) {
            (None, None, None, None) => Auth::None,
            (Some(u), Some(p), None, None) => Auth::UserPassword(u.to_owned(), p.clone()),
            (None, None, Some(t), None) => Auth::Token(t.to_owned()),
            (None, None, None, Some(path)) => {
                let text = read_file("credentials", path)?;
                // Parsed now, so that a broken file is found before
                // connecting.
                async_nats::ConnectOptions::new()
                    .credentials(&text)
                    .map_err(|e| {
                        invalid(format!(
                            "credentials file {path:?} is not a NATS credentials file \
                             (a user JWT and an NKey seed): {e}"
                        ))
                    })?;
                Auth::Credentials(text)
            }
            (None, Some(_), _, _) => return Err(invalid("password is set without user".into())),
            (Some(_), None, _, _) => return Err(invalid("user is set without password".into())),
            _ => {
                let set: Vec<&str> = [
                    (user.is_some(), "user/password"),
                    (token.is_some(), "token"),
                    (self.credentials.is_some(), "credentials"),
                ]
                .into_iter()
                .filter_map(|(on, name)| on.then_some(name))
                .collect();
                return Err(invalid(format!(
                    "{} are set together: choose one way to authenticate",
                    set.join(" and ")
                )));
            }
        };
        if let Some(ca) = &self.tls_ca {
            check_pem("tls_ca", ca, "CERTIFICATE", "certificate")?;
        }
        let client_cert = match (&self.tls_cert, &self.tls_key) {
            (None, None) => None,
            (Some(cert), Some(key)) => {
                check_pem("tls_cert", cert, "CERTIFICATE", "certificate")?;
                check_pem("tls_key", key, "PRIVATE KEY", "private key")?;
                Some((cert.clone(), key.clone()))
            }
            (Some(_), None) => return Err(invalid("tls_cert is set without tls_key".into())),
            (None, Some(_)) => return Err(invalid("tls_key is set without tls_cert".into())),
        };
        let timeout = self.connect_timeout.unwrap_or(DEFAULT_CONNECT_TIMEOUT);
        if timeout.is_zero() {
            return Err(invalid("connect_timeout must be longer than zero".into()));
        }
        let capacity = self
            .subscription_capacity
            .unwrap_or(DEFAULT_SUBSCRIPTION_CAPACITY);
        if capacity == 0 {
            return Err(invalid("subscription_capacity must be at least 1".into()));
        }
        Ok(Checked {
            auth,
            tls_ca: self.tls_ca.clone(),
            client_cert,
            timeout,
            capacity,
        })
    }
}

/// `%XX` escapes decoded (a URL's user name and password); anything else
/// kept as it is.
fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = |c: u8| (c as char).to_digit(16);
        match (
            b[i],
            b.get(i + 1).copied().and_then(hex),
            b.get(i + 2).copied().and_then(hex),
        ) {
            (b'%', Some(h), Some(l)) => {
                out.push((h * 16 + l) as u8);
                i += 3;
            }
            (c, _, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The message of a failed connection: what went wrong, in the terms of
/// the options that caused it.
fn connect_error(e: &async_nats::ConnectError, auth: &str, tls: bool) -> ClusterError {
    use async_nats::ConnectErrorKind as Kind;
    let why = match e.kind() {
        Kind::AuthorizationViolation => {
            format!("authorization failed: the server refused the {auth} ({e})")
        }
        Kind::Authentication => format!(
            "authentication failed: cannot sign the server's challenge with the \
             credentials file's seed ({e})"
        ),
        Kind::Tls => format!("TLS setup failed ({e})"),
        _ if tls => {
            // rustls's failures arrive as I/O errors; tell them apart by
            // their text.
            let text = e.to_string();
            const HINTS: [(&str, &str); 4] = [
                (
                    "invalid peer certificate",
                    "the server's certificate is not trusted: tls_ca must name the CA that \
                     signed it",
                ),
                (
                    "alert",
                    "the server refused the handshake; it may require a client certificate \
                     (tls_cert and tls_key) signed by a CA it trusts",
                ),
                ("corrupt message", "the server does not speak TLS"),
                ("certificate", "check tls_ca, tls_cert and tls_key"),
            ];
            match HINTS.iter().find(|(needle, _)| text.contains(needle)) {
                Some((_, hint)) => format!("TLS handshake failed ({text}): {hint}"),
                None => text,
            }
        }
        _ => e.to_string(),
    };
    ClusterError::Transport(format!("cannot connect to NATS: {why}"))
}

impl NatsTransport {
    /// Connects to `url` (e.g. `nats://127.0.0.1:4222`; scheme and port
    /// default to `nats://` and 4222) without credentials, with TLS when
    /// the URL says `tls://`: [`connect_with`](Self::connect_with) and the
    /// default [`NatsOptions`].
    pub fn connect(url: &str) -> Result<Self, ClusterError> {
        Self::connect_with(url, &NatsOptions::default())
    }

    /// Connects to `url` with `options`. A malformed URL and bad options
    /// ([`NatsOptions::validate`]) are [`ClusterError::InvalidConfig`],
    /// found before connecting. A server that cannot be reached, refuses
    /// the credentials or fails the TLS handshake within two seconds is
    /// [`ClusterError::Transport`], saying which.
    pub fn connect_with(url: &str, options: &NatsOptions) -> Result<Self, ClusterError> {
        let invalid_url = |why: &dyn std::fmt::Display| {
            ClusterError::InvalidConfig(format!("{url:?} is not a NATS server URL ({why})"))
        };
        let url: async_nats::ServerAddr = url.parse().map_err(|e| invalid_url(&e))?;
        if url.host().is_empty() {
            return Err(invalid_url(&"no host"));
        }
        let mut checked = options.check()?;
        // async-nats ignores a URL's user information; it is applied here
        // as the NATS URL convention says: `user:password@` or `token@`.
        let mut what = checked.auth.what();
        if let Some(name) = url.username() {
            if !matches!(checked.auth, Auth::None) {
                return Err(invalid(format!(
                    "the url carries a user name and the options set the {what} too: choose one"
                )));
            }
            let name = percent_decode(name);
            checked.auth = match url.password() {
                Some(password) => {
                    what = "user and password in the url";
                    Auth::UserPassword(name, percent_decode(password))
                }
                None => {
                    what = "token in the url";
                    Auth::Token(name)
                }
            };
        }
        let tls = url.tls_required() || checked.tls_ca.is_some() || checked.client_cert.is_some();
        let Checked {
            auth,
            tls_ca,
            client_cert,
            timeout,
            capacity,
        } = checked;
        let interruptions = Arc::new(AtomicU64::new(0));
        let counted = interruptions.clone();
        let attempt = async move {
            let mut o = async_nats::ConnectOptions::new()
                .event_callback(move |event| {
                    if matches!(
                        event,
                        async_nats::Event::Disconnected | async_nats::Event::SlowConsumer(_)
                    ) {
                        // Relaxed: a count, read now and then.
                        counted.fetch_add(1, Ordering::Relaxed);
                    }
                    async {}
                })
                .name("loadgate")
                .subscription_capacity(capacity)
                .connection_timeout(timeout)
                .max_reconnects(None)
                .reconnect_delay_callback(|attempts| {
                    Duration::from_millis((50 * attempts as u64).clamp(50, 1000))
                });
            match &auth {
                Auth::None => {}
                Auth::UserPassword(u, p) => o = o.user_and_password(u.clone(), p.clone()),
                Auth::Token(t) => o = o.token(t.clone()),
                Auth::Credentials(text) => {
                    // Parsed once already by `check`.
                    o = o.credentials(text).map_err(|e| {
                        ClusterError::InvalidConfig(format!("credentials file: {e}"))
                    })?
                }
            }
            if let Some(ca) = tls_ca {
                o = o.add_root_certificates(ca);
            }
            if let Some((cert, key)) = client_cert {
                o = o.add_client_certificate(cert, key);
            }
            if tls {
                o = o.require_tls(true);
            }
            // The connection timeout bounds the TCP connect only; the TLS
            // handshake and the authentication exchange are bounded here.
            match tokio::time::timeout(timeout, o.connect(url)).await {
                Ok(Ok(client)) => Ok(client),
                Ok(Err(e)) => Err(connect_error(&e, what, tls)),
                Err(_) => Err(ClusterError::Transport(format!(
                    "cannot connect to NATS: no answer within {timeout:?}"
                ))),
            }
        };
        let client = block_on(attempt)?;
        let (outbox, mut rx) = mpsc::unbounded_channel::<(String, bytes::Bytes)>();
        let publisher = client.clone();
        runtime().spawn(async move {
            while let Some((subject, payload)) = rx.recv().await {
                // A failed publish (server away) is dropped: heartbeats
                // re-send the state once the connection is back.
                let _ = publisher.publish(subject, payload).await;
            }
        });
        Ok(Self {
            client,
            outbox,
            interruptions,
            made_in: ForkGuard::new(),
        })
    }

    /// An error if this connection was made by the parent of a forked
    /// child: its tasks never run here, so using it would wait forever.
    fn check_process(&self) -> Result<(), ClusterError> {
        if self.made_in.same_process() {
            Ok(())
        } else {
            Err(ClusterError::Transport(
                "this NATS connection was made before the process forked; connect again in this \
                 process"
                    .into(),
            ))
        }
    }

    /// Waits until everything published so far reached the server.
    pub fn flush(&self) -> Result<(), ClusterError> {
        self.check_process()?;
        let client = self.client.clone();
        block_on(async move { client.flush().await })
            .map_err(|e| ClusterError::Transport(format!("flush failed: {e}")))
    }
}

impl Transport for NatsTransport {
    fn interruptions(&self) -> u64 {
        if self.client.connection_state() != async_nats::connection::State::Connected {
            return u64::MAX;
        }
        self.interruptions.load(Ordering::Relaxed)
    }

    fn publish(&self, subject: &str, payload: Vec<u8>) -> Result<(), ClusterError> {
        self.check_process()?;
        self.outbox
            .send((subject.to_owned(), payload.into()))
            .map_err(|_| ClusterError::Transport("the NATS runtime has stopped".into()))
    }

    fn subscribe(&self, subject: &str, handler: Handler) -> Result<Subscription, ClusterError> {
        self.check_process()?;
        let client = self.client.clone();
        let subject = subject.to_owned();
        let mut stream = block_on(async move { client.subscribe(subject).await })
            .map_err(|e| ClusterError::Transport(format!("cannot subscribe: {e}")))?;
        let task = runtime().spawn(async move {
            while let Some(msg) = stream.next().await {
                handler(&msg.subject, &msg.payload);
            }
        });
        let made_in = ForkGuard::new();
        Ok(Subscription::new(move || {
            if made_in.same_process() {
                task.abort();
            } else {
                // A forked child: the task is on the parent's runtime, whose
                // scheduler locks the fork may have copied held; it never
                // runs here, so let it go.
                std::mem::forget(task);
            }
        }))
    }
}
