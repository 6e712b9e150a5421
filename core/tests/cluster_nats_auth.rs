//! NATS authentication and TLS against a real `nats-server`
//! (docs/behaviour.md#across-machines, docs/nats.md):
//! per-user subject permissions bind a worker to its own reports, a
//! frontend user may only subscribe, tokens, TLS with a CA made here,
//! mutual TLS, and credentials files in operator (JWT) mode. Bad option
//! combinations are refused before connecting; refused credentials and
//! failed TLS handshakes are transport errors that say so, not hangs.
#![cfg(feature = "nats")]

mod support;

use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use loadgate::cluster::nats::{NatsOptions, NatsTransport};
use loadgate::cluster::wire::{LoadMessage, SCHEMA_VERSION};
use loadgate::cluster::{
    Attached, ClusterError, Publisher, PublisherConfig, Subjects, Subscriber, SubscriberConfig,
    Transport,
};
use loadgate::{LoadReport, ManualClock, Monitor, MonotonicClock};
use support::nats_server::{NatsServer, ScratchDir};

const NS: &str = "auth";
/// Nothing listens on port 1 of the loopback interface.
const UNREACHABLE: &str = "nats://127.0.0.1:1";
/// A generous bound for anything to arrive; typical runs take milliseconds.
const WAIT: Duration = Duration::from_secs(10);

fn subjects() -> Subjects {
    Subjects::new(NS).unwrap()
}

/// The connect timeout of the attempts `connect` makes: under [`WAIT`], so
/// that a hang still fails the test, and longer than the 2 s default, so
/// that a loaded machine does not turn a refusal into a timeout.
const CONNECT: Duration = Duration::from_secs(8);

fn user(name: &str, password: &str) -> NatsOptions {
    NatsOptions {
        user: Some(name.into()),
        password: Some(password.into()),
        ..NatsOptions::default()
    }
}

/// Connects on another thread and waits at most [`WAIT`] for the answer,
/// so that a connection attempt that hangs fails the test instead. Unless
/// the options set one, the attempt gets [`CONNECT`] to finish.
fn connect(url: &str, options: &NatsOptions) -> Result<NatsTransport, ClusterError> {
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
fn transport_error(r: Result<NatsTransport, ClusterError>) -> String {
    match r {
        Err(ClusterError::Transport(why)) => why,
        other => panic!("expected a transport error, got {other:?}"),
    }
}

/// The message of an invalid-setting error; panics on anything else.
fn config_error(r: Result<NatsTransport, ClusterError>) -> String {
    match r {
        Err(ClusterError::InvalidConfig(why)) => why,
        other => panic!("expected an invalid setting, got {other:?}"),
    }
}

fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + WAIT;
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// A frontend: a monitor fed by a subscriber over its own connection.
struct Frontend {
    monitor: Arc<Monitor>,
    subscriber: Arc<Subscriber>,
    transport: NatsTransport,
    _attached: Attached,
}

fn frontend(url: &str, options: &NatsOptions) -> Frontend {
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
    fn workers(&self) -> Vec<u64> {
        self.monitor.workers("llama")
    }

    fn refused(&self, reason: &str) -> u64 {
        self.subscriber
            .refusals()
            .iter()
            .find(|(r, _)| *r == reason)
            .map(|(_, n)| *n)
            .unwrap()
    }
}

/// A publisher for `worker_id` on `transport`, sent by hand with `flush`.
fn publisher(worker_id: u64, transport: Arc<dyn Transport>) -> Publisher {
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
fn round_trip(url: &str, options: &NatsOptions, frontend_options: &NatsOptions) {
    let f = frontend(url, frontend_options);
    let transport = Arc::new(connect(url, options).unwrap());
    let p = publisher(7, transport);
    assert_eq!(p.flush(), 1);
    wait_until("worker 7's report", || f.workers() == [7]);
}

fn message(worker_id: u64) -> LoadMessage {
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
    }
}

/// Users of the recommended setup: `worker-<id>` may publish only on its
/// own subject, `frontend` may only subscribe.
fn permissions_config() -> String {
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

#[test]
fn per_user_permissions_bind_a_worker_to_its_own_subject() {
    let dir = ScratchDir::new("nats-perms");
    let server = NatsServer::start_with_config(&dir, &permissions_config());
    let url = server.url();
    let f = frontend(&url, &user("frontend", "pw-frontend"));
    let w7 = Arc::new(connect(&url, &user("worker-7", "pw-7")).unwrap());

    // Worker 7's user reporting as worker 8 publishes on worker 8's
    // subject: the server refuses it. Worker 7's own report, sent after it
    // on the same connection, arrives; so the spoofed one would have
    // arrived first had the server let it through.
    let spoof = publisher(8, w7.clone());
    let honest = publisher(7, w7.clone());
    assert_eq!(spoof.flush(), 1);
    assert_eq!(honest.flush(), 1);
    wait_until("worker 7's report", || f.workers().contains(&7));
    assert_eq!(f.workers(), [7], "worker 8's subject was refused");
    assert_eq!(
        f.refused("spoofed"),
        0,
        "nothing spoofed reached the frontend"
    );

    // On its own subject with worker id 8 in the payload, the server lets
    // it through and the frontend refuses it as spoofed.
    w7.publish(&subjects().load(7), message(8).to_msgpack())
        .unwrap();
    w7.flush().unwrap();
    wait_until("the spoofed report's refusal", || f.refused("spoofed") == 1);
    assert_eq!(f.workers(), [7]);

    // The frontend's user may not publish: a report it sends for worker 9
    // never arrives, while worker 9's own report, sent after the server
    // answered the frontend's flush, does.
    f.transport
        .publish(&subjects().load(9), message(9).to_msgpack())
        .unwrap();
    f.transport.flush().unwrap();
    let w9 = Arc::new(connect(&url, &user("worker-9", "pw-9")).unwrap());
    let mut own = message(9);
    own.instance = 2;
    own.kv_used_blocks = Some(55);
    w9.publish(&subjects().load(9), own.to_msgpack()).unwrap();
    w9.flush().unwrap();
    wait_until("worker 9's report", || f.workers().contains(&9));
    assert_eq!(
        f.monitor.rank_load(9, 0).unwrap().kv_used_blocks,
        55,
        "only worker 9's own report was applied"
    );
    assert_eq!(f.subscriber.stats().announced, 2);

    // A worker's user may not subscribe: its subscription sees nothing.
    let spy = Arc::new(Monitor::new());
    let spy_sub = Subscriber::new(
        spy.clone(),
        SubscriberConfig::default(),
        MonotonicClock::shared(),
    )
    .unwrap();
    let spying = spy_sub.attach(&*w9, &subjects()).unwrap();
    w9.flush().unwrap();
    // Through worker 7's own publisher: a hand-made message would carry
    // another instance, which the frontend takes for a restart of worker 7
    // (and the publisher's heartbeats for another), removing and
    // registering it again each time.
    honest
        .report(
            0,
            &LoadReport {
                kv_used_blocks: Some(77),
                ..Default::default()
            },
        )
        .unwrap();
    assert_eq!(honest.flush(), 1);
    wait_until("worker 7's second report", || {
        f.monitor
            .rank_load(7, 0)
            .is_ok_and(|load| load.kv_used_blocks == 77)
    });
    // Anything the server had sent the spy arrived before this round trip.
    w9.flush().unwrap();
    spying.settle();
    assert!(spy.workers("llama").is_empty());
}

#[test]
fn a_wrong_password_is_an_authorization_failure() {
    let dir = ScratchDir::new("nats-password");
    let server = NatsServer::start_with_config(&dir, &permissions_config());
    let url = server.url();
    let why = transport_error(connect(&url, &user("worker-7", "wrong")));
    assert!(why.contains("authorization failed"), "{why}");
    assert!(why.contains("user and password"), "{why}");
    let why = transport_error(connect(&url, &user("nobody", "pw-7")));
    assert!(why.contains("authorization failed"), "{why}");
    let why = transport_error(connect(&url, &NatsOptions::default()));
    assert!(
        why.contains("authorization failed") && why.contains("without credentials"),
        "{why}"
    );
    // Credentials in the URL work like the options (percent-encoded).
    let inline = url.replace("nats://", "nats://worker%2D7:pw-7@");
    NatsTransport::connect(&inline).unwrap();
    let why = transport_error(connect(
        &url.replace("nats://", "nats://worker-7:x@"),
        &NatsOptions::default(),
    ));
    assert!(
        why.contains("authorization failed") && why.contains("in the url"),
        "{why}"
    );
}

#[test]
fn token_authentication() {
    let dir = ScratchDir::new("nats-token");
    let server = NatsServer::start_with_config(&dir, "authorization { token: \"s3cr3t-t0ken\" }\n");
    let url = server.url();
    let token = |t: &str| NatsOptions {
        token: Some(t.into()),
        ..NatsOptions::default()
    };
    round_trip(&url, &token("s3cr3t-t0ken"), &token("s3cr3t-t0ken"));
    let why = transport_error(connect(&url, &token("guess")));
    assert!(
        why.contains("authorization failed") && why.contains("token"),
        "{why}"
    );
    let why = transport_error(connect(&url, &NatsOptions::default()));
    assert!(why.contains("authorization failed"), "{why}");
    // `token@` in the URL is the token.
    NatsTransport::connect(&url.replace("nats://", "nats://s3cr3t-t0ken@")).unwrap();
}

/// A CA, and certificates it signs, written as PEM files into a scratch
/// directory.
struct Pki {
    dir: ScratchDir,
    ca: rcgen::Certificate,
    ca_key: rcgen::KeyPair,
}

impl Pki {
    fn new(name: &str) -> Self {
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

    fn ca_file(&self) -> PathBuf {
        self.dir.path().join("ca.pem")
    }

    /// A certificate for `names` signed by the CA, for a server or a
    /// client; returns the certificate and key files.
    fn issue(
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
    fn server_tls(&self, verify: bool) -> String {
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

fn with_ca(mut options: NatsOptions, ca: &Path) -> NatsOptions {
    options.tls_ca = Some(ca.to_owned());
    options
}

#[test]
fn tls_with_the_test_ca() {
    let pki = Pki::new("nats-tls");
    let config = format!("{}{}", pki.server_tls(false), permissions_config());
    let server = NatsServer::start_with_config(&pki.dir, &config);
    let ca = pki.ca_file();
    let worker = with_ca(user("worker-7", "pw-7"), &ca);
    let front = with_ca(user("frontend", "pw-frontend"), &ca);
    round_trip(&server.tls_url(), &worker, &front);
    // A nats:// URL works too: the server asks for TLS.
    connect(&server.url(), &worker).unwrap();
    // tls_ca makes TLS required: a server without TLS is refused rather
    // than used in plain text.
    let plain = NatsServer::start();
    let why = transport_error(connect(&plain.url(), &with_ca(NatsOptions::default(), &ca)));
    assert!(why.contains("does not speak TLS"), "{why}");

    // Without the CA the server's certificate is not trusted.
    let why = transport_error(connect(&server.tls_url(), &user("worker-7", "pw-7")));
    assert!(
        why.contains("TLS handshake failed") && why.contains("tls_ca"),
        "{why}"
    );
    // Nor with another CA.
    let other = Pki::new("nats-tls-other");
    let why = transport_error(connect(
        &server.tls_url(),
        &with_ca(user("worker-7", "pw-7"), &other.ca_file()),
    ));
    assert!(why.contains("TLS handshake failed"), "{why}");
    // A wrong password over TLS is still an authorization failure.
    let why = transport_error(connect(
        &server.tls_url(),
        &with_ca(user("worker-7", "nope"), &ca),
    ));
    assert!(why.contains("authorization failed"), "{why}");
}

#[test]
fn mutual_tls_with_a_client_certificate() {
    let pki = Pki::new("nats-mtls");
    let server = NatsServer::start_with_config(&pki.dir, &pki.server_tls(true));
    let (cert, key) = pki.issue(
        "client",
        &["worker-7"],
        rcgen::ExtendedKeyUsagePurpose::ClientAuth,
    );
    let client = NatsOptions {
        tls_ca: Some(pki.ca_file()),
        tls_cert: Some(cert),
        tls_key: Some(key),
        ..NatsOptions::default()
    };
    round_trip(&server.tls_url(), &client, &client);
    // Without a client certificate the server ends the handshake.
    let why = transport_error(connect(
        &server.tls_url(),
        &with_ca(NatsOptions::default(), &pki.ca_file()),
    ));
    assert!(
        why.contains("TLS handshake failed") && why.contains("client certificate"),
        "{why}"
    );
}

/// URL-safe base64 without padding, as JWTs use it.
fn b64url(bytes: &[u8]) -> String {
    const ABC: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, b)| n | (u32::from(*b) << (16 - 8 * i)));
        for i in 0..=chunk.len() {
            out.push(ABC[((n >> (18 - 6 * i)) & 63) as usize] as char);
        }
    }
    out
}

/// A NATS JWT with `claims` (the `nats` part) for `subject`, signed by
/// `issuer`.
fn jwt(issuer: &nkeys::KeyPair, subject: &str, name: &str, nats: serde_json::Value) -> String {
    let iat = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let claims = serde_json::json!({
        "jti": format!("{name}-{subject}"),
        "iat": iat,
        "iss": issuer.public_key(),
        "sub": subject,
        "name": name,
        "nats": nats,
    });
    let header = b64url(br#"{"typ":"JWT","alg":"ed25519-nkey"}"#);
    let body = format!("{header}.{}", b64url(claims.to_string().as_bytes()));
    let signature = issuer.sign(body.as_bytes()).unwrap();
    format!("{body}.{}", b64url(&signature))
}

fn creds_file(jwt: &str, seed: &str) -> String {
    format!(
        "-----BEGIN NATS USER JWT-----\n{jwt}\n------END NATS USER JWT------\n\n\
         ************************* IMPORTANT *************************\n\
         NKEY Seed printed below can be used to sign and prove identity.\n\n\
         -----BEGIN USER NKEY SEED-----\n{seed}\n------END USER NKEY SEED------\n"
    )
}

#[test]
fn credentials_files_in_operator_mode() {
    let dir = ScratchDir::new("nats-creds");
    let operator = nkeys::KeyPair::new_operator();
    let account = nkeys::KeyPair::new_account();
    let no_limit = serde_json::json!({
        "subs": -1, "data": -1, "payload": -1, "imports": -1, "exports": -1,
        "wildcards": true, "conn": -1, "leaf": -1,
    });
    let operator_jwt = jwt(
        &operator,
        &operator.public_key(),
        "loadgate-test-operator",
        serde_json::json!({ "type": "operator", "version": 2 }),
    );
    let account_jwt = jwt(
        &operator,
        &account.public_key(),
        "loadgate",
        serde_json::json!({ "type": "account", "version": 2, "limits": no_limit }),
    );
    let user_creds = |name: &str, publish: &[String], subscribe: &[String]| {
        let key = nkeys::KeyPair::new_user();
        let user_jwt = jwt(
            &account,
            &key.public_key(),
            name,
            serde_json::json!({
                "type": "user", "version": 2,
                "pub": { "allow": publish }, "sub": { "allow": subscribe },
                "subs": -1, "data": -1, "payload": -1,
            }),
        );
        let file = dir.write(
            &format!("{name}.creds"),
            &creds_file(&user_jwt, &key.seed().unwrap()),
        );
        (file, user_jwt)
    };
    let (worker, worker_jwt) = user_creds("worker-7", &[subjects().load(7)], &[]);
    let (front, _) = user_creds("frontend", &[], &[subjects().load_all()]);
    let config = format!(
        "operator: {operator_jwt}\nresolver: MEMORY\nresolver_preload: {{\n  {}: {account_jwt}\n}}\n",
        account.public_key()
    );
    let server = NatsServer::start_with_config(&dir, &config);
    let creds = |file: PathBuf| NatsOptions {
        credentials: Some(file),
        ..NatsOptions::default()
    };
    round_trip(&server.url(), &creds(worker.clone()), &creds(front));

    // The JWT's publish permissions hold: worker 7 cannot report as 8.
    let f = frontend(&server.url(), &creds(dir.path().join("frontend.creds")));
    let w7 = Arc::new(connect(&server.url(), &creds(worker)).unwrap());
    let (spoof, honest) = (publisher(8, w7.clone()), publisher(7, w7.clone()));
    assert_eq!((spoof.flush(), honest.flush()), (1, 1));
    wait_until("worker 7's report", || f.workers().contains(&7));
    assert_eq!(f.workers(), [7]);

    // The JWT with a seed that is not its key fails the server's challenge.
    let stolen = dir.write(
        "stolen.creds",
        &creds_file(&worker_jwt, &nkeys::KeyPair::new_user().seed().unwrap()),
    );
    let why = transport_error(connect(&server.url(), &creds(stolen)));
    assert!(
        why.contains("authorization failed") && why.contains("credentials file"),
        "{why}"
    );
    // No credentials at all.
    let why = transport_error(connect(&server.url(), &NatsOptions::default()));
    assert!(why.contains("authorization failed"), "{why}");
}

#[test]
fn bad_options_are_refused_before_connecting() {
    let dir = ScratchDir::new("nats-options");
    let missing = dir.path().join("missing.pem");
    let not_pem = dir.write("not.pem", "hello\n");
    let pki = Pki::new("nats-options-pki");
    let (cert, key) = pki.issue("client", &["c"], rcgen::ExtendedKeyUsagePurpose::ClientAuth);
    let cases: Vec<(NatsOptions, &[&str])> = vec![
        (
            NatsOptions {
                password: Some("p".into()),
                ..NatsOptions::default()
            },
            &["password is set without user"],
        ),
        (
            NatsOptions {
                user: Some("u".into()),
                ..NatsOptions::default()
            },
            &["user is set without password"],
        ),
        (
            NatsOptions {
                token: Some("t".into()),
                ..user("u", "p")
            },
            &["user/password and token"],
        ),
        (
            NatsOptions {
                token: Some("t".into()),
                credentials: Some(not_pem.clone()),
                ..NatsOptions::default()
            },
            &["token and credentials"],
        ),
        (
            NatsOptions {
                token: Some(String::new()),
                ..NatsOptions::default()
            },
            &["token is empty"],
        ),
        (user("", "p"), &["user is empty"]),
        (
            NatsOptions {
                connect_timeout: Some(Duration::ZERO),
                ..NatsOptions::default()
            },
            &["connect_timeout must be longer than zero"],
        ),
        (
            NatsOptions {
                credentials: Some(missing.clone()),
                ..NatsOptions::default()
            },
            &["credentials file", "missing.pem", "cannot be read"],
        ),
        (
            NatsOptions {
                credentials: Some(not_pem.clone()),
                ..NatsOptions::default()
            },
            &["credentials file", "not a NATS credentials file"],
        ),
        (
            with_ca(NatsOptions::default(), &missing),
            &["tls_ca file", "cannot be read"],
        ),
        (
            with_ca(NatsOptions::default(), &not_pem),
            &["tls_ca file", "holds no PEM certificate"],
        ),
        (
            NatsOptions {
                tls_cert: Some(cert.clone()),
                ..NatsOptions::default()
            },
            &["tls_cert is set without tls_key"],
        ),
        (
            NatsOptions {
                tls_key: Some(key.clone()),
                ..NatsOptions::default()
            },
            &["tls_key is set without tls_cert"],
        ),
        (
            NatsOptions {
                tls_cert: Some(cert.clone()),
                tls_key: Some(cert.clone()),
                ..NatsOptions::default()
            },
            &["tls_key file", "holds no PEM private key"],
        ),
    ];
    for (options, wants) in cases {
        assert!(options.validate().is_err(), "{options:?}");
        let why = config_error(NatsTransport::connect_with(UNREACHABLE, &options));
        for want in wants {
            assert!(why.contains(want), "{options:?}: {why:?} lacks {want:?}");
        }
    }
    // A user in the URL and in the options.
    let why = config_error(NatsTransport::connect_with(
        "nats://a:b@127.0.0.1:1",
        &NatsOptions {
            token: Some("t".into()),
            ..NatsOptions::default()
        },
    ));
    assert!(why.contains("url carries a user name"), "{why}");
    // Good options pass the checks and fail only at the connection.
    let good = NatsOptions {
        tls_cert: Some(cert),
        tls_key: Some(key),
        ..with_ca(user("u", "p"), &pki.ca_file())
    };
    good.validate().unwrap();
    transport_error(NatsTransport::connect_with(UNREACHABLE, &good));
    // Secrets stay out of debug output.
    let shown = format!(
        "{:?}",
        NatsOptions {
            token: Some("tok-secret".into()),
            ..user("u", "pw-secret")
        }
    );
    assert!(
        !shown.contains("secret") && shown.contains("<hidden>"),
        "{shown}"
    );
}

#[test]
fn a_server_that_never_answers_fails_within_the_connect_timeout() {
    // Accepts connections and never speaks NATS (no INFO).
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("nats://{}", listener.local_addr().unwrap());
    // Holds every connection open for the life of the test process.
    std::thread::spawn(move || {
        let mut held = Vec::new();
        while let Ok((c, _)) = listener.accept() {
            held.push(c);
        }
    });
    let options = |ms| NatsOptions {
        connect_timeout: Some(Duration::from_millis(ms)),
        ..NatsOptions::default()
    };
    let why = transport_error(NatsTransport::connect_with(&url, &options(150)));
    assert!(why.contains("no answer within 150ms"), "{why}");
    let why = transport_error(NatsTransport::connect_with(&url, &options(300)));
    assert!(why.contains("no answer within 300ms"), "{why}");
}
