//! The NATS authentication tests' shared setup (`cluster_nats_auth.rs`,
//! `cluster_nats_tls.rs`): connections that fail instead of hanging,
//! frontends and publishers over given options.
#![allow(dead_code)] // each including binary uses a different subset

use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use loadgate::cluster::nats::{NatsOptions, NatsTransport};
use loadgate::cluster::wire::{LoadMessage, SCHEMA_VERSION};
use loadgate::cluster::{
    Attached, ClusterError, Publisher, PublisherConfig, Subjects, Subscriber, SubscriberConfig,
    Transport,
};
use loadgate::{LoadReport, ManualClock, Monitor, MonotonicClock};

use super::nats_server::ScratchDir;

pub const NS: &str = "auth";
/// Nothing listens on port 1 of the loopback interface.
pub const UNREACHABLE: &str = "nats://127.0.0.1:1";
/// A generous bound for anything to arrive; typical runs take milliseconds.
pub const WAIT: Duration = Duration::from_secs(10);

pub fn subjects() -> Subjects {
    Subjects::new(NS).unwrap()
}

/// The connect timeout of the attempts `connect` makes: under [`WAIT`], so
/// that a hang still fails the test, and longer than the 2 s default, so
/// that a loaded machine does not turn a refusal into a timeout.
pub const CONNECT: Duration = Duration::from_secs(8);

pub fn user(name: &str, password: &str) -> NatsOptions {
    NatsOptions {
        user: Some(name.into()),
        password: Some(password.into()),
        ..NatsOptions::default()
    }
}

/// Connects on another thread and waits at most [`WAIT`] for the answer,
/// so that a connection attempt that hangs fails the test instead. Unless
/// the options set one, the attempt gets [`CONNECT`] to finish.
pub fn connect(url: &str, options: &NatsOptions) -> Result<NatsTransport, ClusterError> {
    let (tx, rx) = mpsc::channel();
    let mut options = options.clone();
    options.connect_timeout = options.connect_timeout.or(Some(CONNECT));
    let url = url.to_owned();
    std::thread::spawn(move || {
        let _ = tx.send(NatsTransport::connect_with(&url, &options));
    });
    rx.recv_timeout(WAIT)
        .expect("the connection attempt neither succeeded nor gave up")
}

/// The message of a transport error; panics on anything else.
pub fn transport_error(r: Result<NatsTransport, ClusterError>) -> String {
    match r {
        Err(ClusterError::Transport(why)) => why,
        other => panic!("expected a transport error, got {other:?}"),
    }
}

/// The message of an invalid-setting error; panics on anything else.
pub fn config_error(r: Result<NatsTransport, ClusterError>) -> String {
    match r {
        Err(ClusterError::InvalidConfig(why)) => why,
        other => panic!("expected an invalid setting, got {other:?}"),
    }
}

pub fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + WAIT;
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// A frontend: a monitor fed by a subscriber over its own connection.
pub struct Frontend {
    pub monitor: Arc<Monitor>,
    pub subscriber: Arc<Subscriber>,
    pub transport: NatsTransport,
    _attached: Attached,
}

pub fn frontend(url: &str, options: &NatsOptions) -> Frontend {
    let monitor = Arc::new(Monitor::new());
    // A clock that stands still: these tests publish by hand, without
    // heartbeats, so on a slow machine a real clock could expire a worker
    // between two of their steps.
    let subscriber = Subscriber::new(
        monitor.clone(),
        SubscriberConfig::default(),
        ManualClock::new(),
    )
    .unwrap();
    let transport = connect(url, options).unwrap();
    let attached = subscriber.attach(&transport, &subjects()).unwrap();
    // The subscription is registered at the server once a round trip
    // completes.
    transport.flush().unwrap();
    Frontend {
        monitor,
        subscriber,
        transport,
        _attached: attached,
    }
}

impl Frontend {
    pub fn workers(&self) -> Vec<u64> {
        self.monitor.workers("llama")
    }

    pub fn refused(&self, reason: &str) -> u64 {
        self.subscriber
            .refusals()
            .iter()
            .find(|(r, _)| *r == reason)
            .map(|(_, n)| *n)
            .unwrap()
    }
}

/// A publisher for `worker_id` on `transport`, sent by hand with `flush`.
pub fn publisher(worker_id: u64, transport: Arc<dyn Transport>) -> Publisher {
    let config = PublisherConfig {
        kv_total_blocks: Some(100),
        ..PublisherConfig::new(worker_id, "llama")
    };
    let p = Publisher::new(config, transport, &subjects(), MonotonicClock::shared()).unwrap();
    p.report(
        0,
        &LoadReport {
            kv_used_blocks: Some(10),
            ..Default::default()
        },
    )
    .unwrap();
    p
}

/// A worker's report over `options` reaches a frontend over
/// `frontend_options`.
pub fn round_trip(url: &str, options: &NatsOptions, frontend_options: &NatsOptions) {
    let f = frontend(url, frontend_options);
    let transport = Arc::new(connect(url, options).unwrap());
    let p = publisher(7, transport);
    assert_eq!(p.flush(), 1);
    wait_until("worker 7's report", || f.workers() == [7]);
}

pub fn message(worker_id: u64) -> LoadMessage {
    LoadMessage {
        v: SCHEMA_VERSION,
        instance: 1,
        seq: 1,
        worker_id,
        model: "llama".into(),
        dp_start: 0,
        dp_size: 1,
        dp_rank: 0,
        kv_total_blocks: Some(100),
        max_num_batched_tokens: None,
        active_decode_blocks: None,
        kv_used_blocks: Some(10),
        active_prefill_tokens: None,
        waiting_requests: None,
        max_num_seqs: None,
    }
}

/// Users of the recommended setup: `worker-<id>` may publish only on its
/// own subject, `frontend` may only subscribe.
pub fn permissions_config() -> String {
    let worker = |id: u64| {
        format!(
            r#"{{ user: "worker-{id}", password: "pw-{id}",
                 permissions: {{ publish: ["loadgate.{NS}.load.{id}"], subscribe: {{ deny: [">"] }} }} }}"#
        )
    };
    format!(
        r#"authorization {{
  users = [
    {}
    {}
    {{ user: "frontend", password: "pw-frontend",
       permissions: {{ publish: {{ deny: [">"] }}, subscribe: ["loadgate.{NS}.load.*"] }} }}
  ]
}}
"#,
        worker(7),
        worker(9)
    )
}

/// A CA, and certificates it signs, written as PEM files into a scratch
/// directory.
pub struct Pki {
    pub dir: ScratchDir,
    ca: rcgen::Certificate,
    ca_key: rcgen::KeyPair,
}

impl Pki {
    pub fn new(name: &str) -> Self {
        let dir = ScratchDir::new(name);
        let ca_key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "loadgate test CA");
        params.key_usages = vec![
            rcgen::KeyUsagePurpose::KeyCertSign,
            rcgen::KeyUsagePurpose::CrlSign,
            rcgen::KeyUsagePurpose::DigitalSignature,
        ];
        let ca = params.self_signed(&ca_key).unwrap();
        dir.write("ca.pem", &ca.pem());
        Self { dir, ca, ca_key }
    }

    pub fn ca_file(&self) -> PathBuf {
        self.dir.path().join("ca.pem")
    }

    /// A certificate for `names` signed by the CA, for a server or a
    /// client; returns the certificate and key files.
    pub fn issue(
        &self,
        file: &str,
        names: &[&str],
        usage: rcgen::ExtendedKeyUsagePurpose,
    ) -> (PathBuf, PathBuf) {
        let key = rcgen::KeyPair::generate().unwrap();
        let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
        let mut params = rcgen::CertificateParams::new(names).unwrap();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, file);
        params.extended_key_usages = vec![usage];
        let cert = params.signed_by(&key, &self.ca, &self.ca_key).unwrap();
        (
            self.dir.write(&format!("{file}.pem"), &cert.pem()),
            self.dir
                .write(&format!("{file}-key.pem"), &key.serialize_pem()),
        )
    }

    /// A `tls { ... }` block for a server certificate for 127.0.0.1;
    /// `verify` requires client certificates signed by the CA.
    pub fn server_tls(&self, verify: bool) -> String {
        let (cert, key) = self.issue(
            "server",
            &["127.0.0.1", "localhost"],
            rcgen::ExtendedKeyUsagePurpose::ServerAuth,
        );
        format!(
            "tls {{\n  cert_file: {cert:?}\n  key_file: {key:?}\n  ca_file: {:?}\n  verify: {verify}\n  timeout: 2\n}}\n",
            self.ca_file()
        )
    }
}

pub fn with_ca(mut options: NatsOptions, ca: &Path) -> NatsOptions {
    options.tls_ca = Some(ca.to_owned());
    options
}
