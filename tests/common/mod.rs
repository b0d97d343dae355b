//! Shared set-up for end-to-end tests: simulated clusters on loopback and a real server.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use fleetscope::grpc::FleetService;
use fleetscope::{server, sources};
use fleetscope_sim::{FleetSpec, SimFleet};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// Generous bound for anything a test waits on.
pub const PATIENCE: Duration = Duration::from_secs(60);

pub struct Harness {
    pub fleet: SimFleet,
    pub kubeconfig: PathBuf,
    pub addr: SocketAddr,
    _dir: tempfile::TempDir,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<Result<(), server::ServerError>>>,
}

impl Harness {
    /// Simulated clusters, their kubeconfig, and the server over them on a free port.
    pub async fn start(clusters: usize, objects: usize) -> Self {
        let fleet = SimFleet::start(&FleetSpec::numbered(clusters, objects, 0.0))
            .await
            .expect("simulated clusters start");
        let dir = tempfile::tempdir().unwrap();
        let kubeconfig = dir.path().join("kubeconfig");
        fleet.write_kubeconfig(&kubeconfig).unwrap();
        let resolved = sources::resolve(std::slice::from_ref(&kubeconfig), &[]).unwrap();
        let listener = server::bind("127.0.0.1:0".parse().unwrap()).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = oneshot::channel::<()>();
        let service = FleetService::new(resolved.into_iter().map(|c| c.name).collect());
        let task = tokio::spawn(server::serve(listener, service, async move {
            let _ = stopped.await;
        }));
        Self {
            fleet,
            kubeconfig,
            addr,
            _dir: dir,
            stop: Some(stop),
            task: Some(task),
        }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// A gRPC channel to the server.
    pub async fn channel(&self) -> tonic::transport::Channel {
        tonic::transport::Channel::from_shared(self.url())
            .unwrap()
            .connect()
            .await
            .expect("server reachable")
    }

    /// Stops the server and waits for it to finish cleanly.
    pub async fn shutdown(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            tokio::time::timeout(PATIENCE, task)
                .await
                .expect("server stops")
                .expect("task")
                .expect("server ran cleanly");
        }
        self.fleet.shutdown().await;
    }
}
