//! Starts a real `etcd` (the Debian package etcd-server) on free loopback
//! ports for one test, with its data in a scratch directory, so it can be
//! stopped and started again on the same data and port.
#![allow(dead_code)] // each including binary uses a different subset

use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::nats_server::{free_port, installed, ScratchDir};

/// A running `etcd`, stopped when dropped.
pub struct EtcdServer {
    child: Option<Child>,
    dir: ScratchDir,
    client_port: u16,
    peer_port: u16,
}

impl EtcdServer {
    /// Starts a single-member cluster on free loopback ports.
    pub fn start() -> Self {
        let mut server = Self {
            child: None,
            dir: ScratchDir::new("etcd"),
            client_port: free_port(),
            peer_port: free_port(),
        };
        server.restart();
        server
    }

    /// `http://127.0.0.1:PORT`.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.client_port)
    }

    /// Stops the server (its data stays).
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts it again on the same data and ports, and waits until it
    /// accepts connections.
    pub fn restart(&mut self) {
        self.stop();
        let client = self.endpoint();
        let peer = format!("http://127.0.0.1:{}", self.peer_port);
        let child = Command::new(installed("etcd", "etcd-server"))
            .arg("--data-dir")
            .arg(self.dir.path().join("data"))
            .args(["--name", "default"])
            .args(["--listen-client-urls", &client])
            .args(["--advertise-client-urls", &client])
            .args(["--listen-peer-urls", &peer])
            .args(["--initial-advertise-peer-urls", &peer])
            .args(["--initial-cluster", &format!("default={peer}")])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("cannot start etcd");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(20);
        while TcpStream::connect(("127.0.0.1", self.client_port)).is_err() {
            assert!(Instant::now() < deadline, "etcd did not start");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for EtcdServer {
    fn drop(&mut self) {
        self.stop();
    }
}
