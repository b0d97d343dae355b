//! `fleetscope serve` as a process of its own, for tests where crashes matter: killed
//! with SIGKILL, restarted over the same data directory.

use std::path::Path;
use std::process::{Child, Command, Stdio};

/// The fleetscope binary cargo built for these tests.
pub const BIN: &str = env!("CARGO_BIN_EXE_fleetscope");

/// A running `fleetscope serve`, killed (SIGKILL) when dropped.
pub struct Server {
    pub child: Child,
    pub port: u16,
}

impl Server {
    /// `fleetscope serve` over `kubeconfig` on a free loopback port, with `args`
    /// added, logging to `log` (appended).
    pub fn start(kubeconfig: &Path, args: &[&str], log: &Path) -> Self {
        Self::start_with_env(kubeconfig, args, log, &[])
    }

    /// [`Server::start`] with environment variables set.
    pub fn start_with_env(
        kubeconfig: &Path,
        args: &[&str],
        log: &Path,
        env: &[(&str, &str)],
    ) -> Self {
        Self::start_at(free_port(), kubeconfig, args, log, env)
    }

    /// [`Server::start_with_env`] listening on `port`.
    pub fn start_at(
        port: u16,
        kubeconfig: &Path,
        args: &[&str],
        log: &Path,
        env: &[(&str, &str)],
    ) -> Self {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .expect("log file opens");
        let child = Command::new(BIN)
            .arg("serve")
            .args(args)
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .env(
                "RUST_LOG",
                std::env::var("E2E_RUST_LOG")
                    .unwrap_or_else(|_| "info,fleetscope_engine::persist=debug".into()),
            )
            .envs(env.iter().copied())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("fleetscope serve starts");
        Self { child, port }
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Kills the process with SIGKILL and reaps it.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Panics with the log if the process has exited.
    pub fn assert_running(&mut self, log: &Path) {
        if let Ok(Some(status)) = self.child.try_wait() {
            panic!(
                "serve exited with {status}: {}",
                std::fs::read_to_string(log).unwrap_or_default()
            );
        }
    }

    /// The resident memory of the process, in bytes (Linux).
    pub fn resident_bytes(&self) -> Option<u64> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).ok()?;
        let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
        let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
        Some(kib * 1024)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A loopback port nothing listens on now.
///
/// Below the kernel's ephemeral range (32768 and up), in 10000–19999: a port the kernel
/// handed out for `bind(0)` is free only until it gives the same one to some other
/// test's outgoing connection, before the process meant to listen on it has started
/// (seen with four tests at a time: `Address already in use`). Each call of this
/// process gets a port of its own; one something else on the machine holds is skipped.
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(u32::MAX);
    const FIRST: u32 = 10_000;
    const PORTS: u32 = 10_000;
    // A start of this run's own, so runs one after another do not meet a port in TIME_WAIT.
    let _ = NEXT.compare_exchange(
        u32::MAX,
        std::process::id().wrapping_mul(7919) % PORTS,
        Ordering::Relaxed,
        Ordering::Relaxed,
    );
    for _ in 0..PORTS {
        let port = (FIRST + NEXT.fetch_add(1, Ordering::Relaxed) % PORTS) as u16;
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free loopback port in {FIRST}–{}", FIRST + PORTS - 1)
}
