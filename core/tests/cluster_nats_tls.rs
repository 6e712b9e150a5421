//! NATS over TLS against a real `nats-server` (docs/nats.md): TLS with a
//! CA made here, mutual TLS, and credentials files in operator (JWT)
//! mode. A failed handshake is a transport error that says so, not a hang.
#![cfg(feature = "nats")]

mod support;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use loadgate::cluster::nats::NatsOptions;
use support::nats_auth::{
    connect, frontend, permissions_config, publisher, round_trip, subjects, transport_error, user,
    wait_until, with_ca, Pki,
};
use support::nats_server::{NatsServer, ScratchDir};

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
