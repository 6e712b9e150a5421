"""NATS authentication and TLS from Python: a `Reporter` and a monitor's
`subscribe_nats` with a user and password over TLS (a CA made here) against
a real `nats-server` whose users may publish only on their own subject or
only subscribe; refused credentials and untrusted servers are
`ConnectionError`s, and bad combinations of the keyword arguments are
`ValueError`s naming them, raised before connecting."""

from __future__ import annotations

import datetime
import ipaddress
from pathlib import Path
from typing import Dict, Iterator, Tuple

import pytest

from loadgate import Monitor, Reporter

from test_nats import running_nats_server, wait_for

NS = "pyauth"
# Nothing listens on port 1 of the loopback interface.
UNREACHABLE = "nats://127.0.0.1:1"


def _pki(directory: Path) -> Tuple[Path, Path, Path]:
    """A CA and a server certificate for 127.0.0.1 that it signs, as PEM
    files: (CA, server certificate, server key)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.timezone.utc)

    def name(cn: str) -> x509.Name:
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = (
        x509.CertificateBuilder()
        .subject_name(name("loadgate python test CA"))
        .issuer_name(name("loadgate python test CA"))
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True, content_commitment=False, key_encipherment=False,
                data_encipherment=False, key_agreement=False, key_cert_sign=True,
                crl_sign=True, encipher_only=False, decipher_only=False,
            ),
            critical=True,
        )
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(name("nats-server"))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]
            ),
            critical=False,
        )
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    pem = serialization.Encoding.PEM
    ca_file, cert_file, key_file = directory / "ca.pem", directory / "server.pem", directory / "server-key.pem"
    ca_file.write_bytes(ca.public_bytes(pem))
    cert_file.write_bytes(cert.public_bytes(pem))
    key_file.write_bytes(
        key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return ca_file, cert_file, key_file


class Server:
    """A running TLS nats-server with the users of the recommended setup."""

    def __init__(self, port: int, ca: Path) -> None:
        self.port = port
        self.ca = ca

    @property
    def tls_url(self) -> str:
        return f"tls://127.0.0.1:{self.port}"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A nats-server with TLS and users: `worker-7` may publish only on its
    own subject, `frontend` may only subscribe."""
    directory = tmp_path_factory.mktemp("nats-auth")
    ca, cert, key = _pki(directory)
    config = directory / "server.conf"
    config.write_text(
        f"""
tls {{
  cert_file: "{cert}"
  key_file: "{key}"
  timeout: 2
}}
authorization {{
  users = [
    {{ user: "worker-7", password: "pw-7",
       permissions: {{ publish: ["loadgate.{NS}.load.7"], subscribe: {{ deny: [">"] }} }} }}
    {{ user: "frontend", password: "pw-frontend",
       permissions: {{ publish: {{ deny: [">"] }}, subscribe: ["loadgate.{NS}.load.*"] }} }}
  ]
}}
"""
    )
    with running_nats_server(["-c", str(config)], directory / "nats-server.log") as port:
        yield Server(port, ca)


def test_user_password_over_tls_round_trip(server: Server) -> None:
    m = Monitor()
    with m.subscribe_nats(
        server.tls_url, NS, user="frontend", password="pw-frontend", tls_ca=server.ca
    ) as sub, Reporter(
        server.tls_url, 7, "m", namespace=NS, kv_total_blocks=100,
        user="worker-7", password="pw-7", tls_ca=str(server.ca),
    ) as r:
        wait_for(lambda: m.workers("m"), lambda w: w == [7])
        m.set_thresholds("m", active_decode_blocks_threshold=0.5)
        r.report(kv_used_blocks=90)
        wait_for(lambda: m.busy_workers("m"), lambda busy: busy == [7])
        assert sub.stats()["malformed"] == 0


def test_worker_cannot_report_as_another_worker(server: Server) -> None:
    m = Monitor()
    with m.subscribe_nats(server.tls_url, NS, user="frontend", password="pw-frontend", tls_ca=server.ca) as sub, \
            Reporter(server.tls_url, 8, "m", namespace=NS, heartbeat=0.1,
                     user="worker-7", password="pw-7", tls_ca=server.ca), \
            Reporter(server.tls_url, 7, "m", namespace=NS, heartbeat=0.1,
                     user="worker-7", password="pw-7", tls_ca=server.ca):
        # Worker 8's heartbeats go out as often as worker 7's; the server
        # refuses them all.
        wait_for(lambda: sub.stats()["applied"], lambda n: n >= 3)
        assert m.workers("m") == [7]


def test_refused_credentials_and_untrusted_servers_are_connection_errors(server: Server) -> None:
    # A generous connect timeout: a loaded machine must not turn a refusal
    # into a timeout.
    slow_ok = {"connect_timeout": 30}
    with pytest.raises(ConnectionError, match="authorization failed"):
        Reporter(
            server.tls_url, 7, "m", namespace=NS, user="worker-7", password="wrong", tls_ca=server.ca, **slow_ok
        )
    with pytest.raises(ConnectionError, match="authorization failed"):
        Monitor().subscribe_nats(server.tls_url, NS, tls_ca=server.ca, connect_timeout=30.0)
    with pytest.raises(ConnectionError, match="TLS handshake failed.*tls_ca"):
        Monitor().subscribe_nats(server.tls_url, NS, user="frontend", password="pw-frontend", **slow_ok)
    with pytest.raises(ConnectionError, match="TLS handshake failed"):
        Reporter(server.tls_url, 7, "m", namespace=NS, user="worker-7", password="pw-7", **slow_ok)


def test_a_server_that_never_answers_fails_within_the_connect_timeout() -> None:
    import socket

    with socket.socket() as silent:  # accepts (backlog), never speaks NATS
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        url = "nats://127.0.0.1:%d" % silent.getsockname()[1]
        with pytest.raises(ConnectionError, match="no answer within 200ms"):
            Reporter(url, 1, "m", connect_timeout=0.2)
        with pytest.raises(ConnectionError, match="no answer within 250ms"):
            Monitor().subscribe_nats(url, connect_timeout=0.25)


@pytest.mark.parametrize(
    ("value", "exc"), [(0, ValueError), (-1, ValueError), (float("nan"), ValueError), ("2", TypeError)]
)
def test_bad_connect_timeouts_are_refused_before_connecting(value: object, exc: type) -> None:
    with pytest.raises(exc, match="connect_timeout"):
        Reporter(UNREACHABLE, 1, "m", connect_timeout=value)  # type: ignore[arg-type]
    with pytest.raises(exc, match="connect_timeout"):
        Monitor().subscribe_nats(UNREACHABLE, connect_timeout=value)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"password": "p"}, "password is set without user"),
        ({"user": "u"}, "user is set without password"),
        ({"user": "u", "password": "p", "token": "t"}, "user/password and token"),
        ({"token": "t", "credentials": "x.creds"}, "token and credentials"),
        ({"token": ""}, "token is empty"),
        ({"credentials": "/nonexistent/x.creds"}, "credentials file .* cannot be read"),
        ({"tls_ca": "/nonexistent/ca.pem"}, "tls_ca file .* cannot be read"),
        ({"tls_cert": "/nonexistent/c.pem"}, "tls_cert is set without tls_key"),
        ({"tls_key": "/nonexistent/k.pem"}, "tls_key is set without tls_cert"),
    ],
)
def test_bad_combinations_are_value_errors_before_connecting(kwargs: Dict[str, str], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        Reporter(UNREACHABLE, 1, "m", **kwargs)
    with pytest.raises(ValueError, match=match):
        Monitor().subscribe_nats(UNREACHABLE, **kwargs)


def test_files_that_are_not_what_they_should_be(tmp_path: Path) -> None:
    junk = tmp_path / "junk.pem"
    junk.write_text("hello\n")
    with pytest.raises(ValueError, match="not a NATS credentials file"):
        Reporter(UNREACHABLE, 1, "m", credentials=junk)
    with pytest.raises(ValueError, match="tls_ca file .* holds no PEM certificate"):
        Monitor().subscribe_nats(UNREACHABLE, tls_ca=junk)


def test_wrong_types_are_type_errors_naming_the_argument() -> None:
    with pytest.raises(TypeError, match="user must be a str"):
        Reporter(UNREACHABLE, 1, "m", user=1, password="p")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="tls_ca must be a str or os.PathLike"):
        Monitor().subscribe_nats(UNREACHABLE, tls_ca=3)  # type: ignore[arg-type]
