//! NATS authentication against a real `nats-server`
//! (docs/behaviour.md#across-machines, docs/nats.md): per-user subject
//! permissions bind a worker to its own reports, a frontend user may only
//! subscribe, and tokens. Bad option combinations are refused before
//! connecting; refused credentials are transport errors that say so, not
//! hangs. TLS and credentials files: `cluster_nats_tls.rs`.
#![cfg(feature = "nats")]

mod support;

use std::sync::Arc;
use std::time::Duration;

use loadgate::cluster::nats::{NatsOptions, NatsTransport};
use loadgate::cluster::{Subscriber, SubscriberConfig, Transport};
use loadgate::{LoadReport, Monitor, MonotonicClock};
use support::nats_auth::{
    config_error, connect, frontend, message, permissions_config, publisher, round_trip, subjects,
    transport_error, user, wait_until, with_ca, Pki, UNREACHABLE,
};
use support::nats_server::{NatsServer, ScratchDir};

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
