//! Starts a real `nats-server` on a free loopback port for one test, plain
//! or with a configuration file (authorization, TLS, operator mode).
#![allow(dead_code)] // each including binary uses a different subset

use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A running `nats-server`, stopped when dropped.
pub struct NatsServer {
    child: Option<Child>,
    port: u16,
}

/// A scratch directory for one test's files (configuration, certificates,
/// credentials), removed when dropped.
pub struct ScratchDir {
    path: PathBuf,
}

impl ScratchDir {
    /// A new, empty directory under the system's temporary directory.
    pub fn new(name: &str) -> Self {
        let path = std::env::temp_dir().join(format!(
            "loadgate-{name}-{}-{}",
            std::process::id(),
            free_port()
        ));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).unwrap();
        Self { path }
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Writes `contents` to the file `name` in the directory; returns its
    /// path.
    pub fn write(&self, name: &str, contents: &str) -> PathBuf {
        let file = self.path.join(name);
        std::fs::write(&file, contents).unwrap();
        file
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

fn binary() -> PathBuf {
    if let Ok(p) = std::env::var("NATS_SERVER") {
        return p.into();
    }
    installed("nats-server", "nats-server")
}

/// The path of program `name`, from `PATH` or the usual system folders;
/// panics naming the Debian `package` that installs it.
pub fn installed(name: &str, package: &str) -> PathBuf {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain([
            "/usr/sbin".into(),
            "/usr/bin".into(),
            "/usr/local/bin".into(),
        ])
        .map(|d| d.join(name))
        .find(|p| p.is_file())
        .unwrap_or_else(|| {
            panic!("{name} not found: install the Debian package {package} (ci/test.sh does)")
        })
}

/// A loopback port free now.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

impl NatsServer {
    /// Starts a server on a free loopback port.
    pub fn start() -> Self {
        Self::start_on(free_port())
    }

    /// Starts a server on `port` and waits until it accepts connections.
    pub fn start_on(port: u16) -> Self {
        Self::spawn(port, None)
    }

    /// Starts a server on a free loopback port with the configuration
    /// `config` (nats-server's format: `authorization { ... }`, `tls { ... }`,
    /// `operator: ...`), written to `server.conf` in `dir`. The address and
    /// port come from the command line and override the file's.
    pub fn start_with_config(dir: &ScratchDir, config: &str) -> Self {
        let file = dir.write("server.conf", config);
        // Fails early with the server's own message on a bad file.
        let check = Command::new(binary())
            .args(["-t", "-c"])
            .arg(&file)
            .output()
            .expect("cannot start nats-server");
        assert!(
            check.status.success(),
            "nats-server refuses the configuration:\n{config}\n{}{}",
            String::from_utf8_lossy(&check.stdout),
            String::from_utf8_lossy(&check.stderr)
        );
        Self::spawn(free_port(), Some(&file))
    }

    fn spawn(port: u16, config: Option<&Path>) -> Self {
        let mut command = Command::new(binary());
        if let Some(file) = config {
            command.arg("-c").arg(file);
        }
        let child = command
            .args(["-a", "127.0.0.1", "-p", &port.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("cannot start nats-server");
        let deadline = Instant::now() + Duration::from_secs(10);
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                Instant::now() < deadline,
                "nats-server did not start on port {port}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        Self {
            child: Some(child),
            port,
        }
    }

    /// The port it listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `nats://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// `tls://127.0.0.1:PORT`.
    pub fn tls_url(&self) -> String {
        format!("tls://127.0.0.1:{}", self.port)
    }

    /// Stops the server and waits for it to exit.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for NatsServer {
    fn drop(&mut self) {
        self.stop();
    }
}
