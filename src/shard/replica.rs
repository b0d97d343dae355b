//! `serve` as a replica of a ring: its membership (`fleetscope_ring::member`), the clusters
//! it holds ([`super::owner`]) given to the engine in place of every configured one,
//! the fence in front of its answers, and its handover on shutdown.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::sync::Arc;

use fleetscope_model::fleet::Gate;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use fleetscope_ring::leases::Leases;
use fleetscope_ring::member::{self, MembershipConfig, View};
use fleetscope_ring::vocabulary::{ADDRESS, READY};

use super::owner::{self, Owner, ShardStatus};
use crate::engine::SourceSet;

/// A running replica's parts.
pub struct Replica {
    /// The clusters the engine runs: those this replica holds.
    pub held: watch::Receiver<SourceSet>,
    /// Closed while this replica is fenced.
    pub gate: Arc<dyn Gate>,
    /// The shard as this replica sees it.
    pub status: watch::Receiver<ShardStatus>,
    view: watch::Receiver<View>,
    leaving: CancellationToken,
    config: MembershipConfig,
}

impl Replica {
    /// Joins the ring through `leases` (the ring's Lease namespace in the
    /// coordination cluster), publishing `advertise`, sharing the clusters of `desired`; `synced`
    /// tells which held clusters the engine holds synced (and current since a
    /// moment, when given one); `rewatch` makes the engine's streams resume their
    /// watches (after a gap). Runs until `stop` (then releases the Lease).
    pub fn start(
        leases: Leases,
        config: MembershipConfig,
        advertise: String,
        desired: watch::Receiver<SourceSet>,
        synced: Box<dyn Fn(Option<std::time::Instant>) -> BTreeSet<String> + Send + Sync>,
        rewatch: Box<dyn Fn() + Send + Sync>,
        stop: CancellationToken,
    ) -> Self {
        let (published_tx, published) = watch::channel(BTreeMap::from([
            (ADDRESS.to_string(), advertise.clone()),
            (READY.to_string(), String::new()),
        ]));
        let (view_tx, view) = watch::channel(View::default());
        let (held_tx, held) = watch::channel(SourceSet::default());
        let (status_tx, status) = watch::channel(ShardStatus {
            ring: config.ring.clone(),
            identity: config.identity.clone(),
            fenced: true,
            ..ShardStatus::default()
        });
        let leaving = CancellationToken::new();
        tracing::info!(ring = %config.ring, identity = %config.identity, address = %advertise, "joining the ring");
        crate::tasks::spawn(
            "shard-membership",
            member::run(leases, config.clone(), published, view_tx, stop.clone()),
        );
        crate::tasks::spawn(
            "shard-owner",
            Owner {
                config: config.clone(),
                advertise,
                view: view.clone(),
                desired,
                held: held_tx,
                published: published_tx,
                synced,
                rewatch,
                status: status_tx,
                leaving: leaving.clone(),
            }
            .run(stop),
        );
        Self {
            gate: owner::fence(view.clone(), &config),
            held,
            status,
            view,
            leaving,
            config,
        }
    }

    /// Resolves once this replica has decided what it holds for the first time (it
    /// holds its Lease and has seen the ring's): the engine starts then, so that it
    /// keeps from its store exactly the clusters it still holds.
    pub fn decided(&self) -> impl Future<Output = ()> + Send + 'static {
        let mut held = self.held.clone();
        async move {
            let _ = held.changed().await;
        }
    }

    /// Hands this replica's clusters over before it stops: publishes that it is
    /// leaving, so that the others take them up, and waits until they hold them ready
    /// (at most a lease duration: after that they would have taken them anyway).
    pub fn handover(&self) -> impl Future<Output = ()> + Send + 'static {
        let leaving = self.leaving.clone();
        let status = self.status.clone();
        let view = self.view.clone();
        let wait = self.config.lease_duration;
        let ring = self.config.ring.clone();
        async move {
            leaving.cancel();
            tracing::info!(%ring, "shutting down: handing the clusters over");
            if tokio::time::timeout(wait, owner::handed_over(status, view))
                .await
                .is_err()
            {
                tracing::warn!(%ring, waited = ?wait, "the clusters were not all taken up by others in time: stopping anyway");
            }
        }
    }
}
