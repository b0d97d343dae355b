//! A replica's membership in its ring: its own Lease renewed every renew period, the
//! ring's Leases followed by watch, and from them who is alive and which clusters this
//! replica owns. Fencing is judged when asked, by this replica's clock: a replica whose
//! last successful renewal is older than the lease duration (its process stopped, its
//! coordination cluster unreachable) is fenced and must not answer as an owner until a
//! renewal succeeds again, however long it was away. A renewal counts from the moment
//! its request was sent, as client-go counts it, so a slow answer never extends it.

use std::collections::BTreeMap;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::lease::{self, Member, Observed, OwnLease};
use crate::leases::Leases;

/// How a replica takes part in its ring.
#[derive(Debug, Clone)]
pub struct MembershipConfig {
    /// The ring's name.
    pub ring: String,
    /// This replica's identity (its pod's name, so a restart keeps it).
    pub identity: String,
    /// How long a Lease holds without renewal.
    pub lease_duration: Duration,
    /// How often this replica renews its Lease.
    pub renew_period: Duration,
    /// Owners per cluster (1 or 2).
    pub replication: usize,
    /// What the ring's Leases are sealed with (derived from the ring's key).
    pub key: crate::seal::LeaseKey,
}

/// The ring as this replica sees it.
#[derive(Debug, Clone, Default)]
pub struct View {
    /// When the last successful renewal was sent; `None` before the first.
    pub renewed_at: Option<Instant>,
    /// Renewals that failed since start.
    pub renew_failures: u64,
    /// Why the last renewal failed, while renewals fail.
    pub renew_error: Option<String>,
    /// The ring's Leases as seen.
    pub observed: Observed,
}

impl View {
    /// Whether this replica must not answer as an owner `now`: its last renewal is
    /// older than `lease_duration` (or there was none).
    pub fn fenced(&self, now: Instant, lease_duration: Duration) -> bool {
        self.renewed_at
            .is_none_or(|at| now.saturating_duration_since(at) >= lease_duration)
    }

    /// The live members `now`.
    pub fn members(&self, now: Instant) -> Vec<Member> {
        self.observed.alive(now)
    }
}

/// Keeps this replica in its ring until `stop`: renews its Lease every renew period
/// with what `published` holds (its address, the clusters it serves), follows the
/// ring's Leases, and publishes the view to `view`; then releases the Lease.
pub async fn run(
    leases: Leases,
    config: MembershipConfig,
    published: watch::Receiver<BTreeMap<String, String>>,
    view: watch::Sender<View>,
    stop: CancellationToken,
) {
    let (observed_tx, observed) = watch::channel(Observed::new(
        &config.ring,
        config.lease_duration,
        config.key.clone(),
    ));
    let follower = lease::follow(
        leases.clone(),
        config.ring.clone(),
        observed_tx,
        stop.clone(),
    );
    let own = OwnLease::new(
        leases,
        &config.ring,
        &config.identity,
        config.lease_duration,
        config.key.clone(),
    );
    // The Leases are followed while this replica's own is renewed, in this task.
    tokio::join!(follower, keep(own, config, published, view, observed, stop));
}

/// Renews this replica's own Lease every renew period until `stop`, publishing the
/// ring as `observed` shows it to `view`; then releases the Lease.
async fn keep(
    mut own: OwnLease,
    config: MembershipConfig,
    published: watch::Receiver<BTreeMap<String, String>>,
    view: watch::Sender<View>,
    mut observed: watch::Receiver<Observed>,
    stop: CancellationToken,
) {
    let mut tick = tokio::time::interval(config.renew_period);
    // The last failure logged: the same failure again is not logged every period.
    let mut failing: Option<String> = None;
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {
                let sent = Instant::now();
                let mut annotations = published.borrow().clone();
                if view.borrow().fenced(sent, config.lease_duration) {
                    // After a gap (this replica fenced, or not running) it claims no
                    // cluster ready until its owner has decided again what is current.
                    annotations.insert(crate::vocabulary::READY.to_string(), String::new());
                }
                match own.renew(&annotations).await {
                    Ok(()) => {
                        if failing.take().is_some() {
                            tracing::info!(ring = %config.ring, lease = own.name(), "lease renewed again");
                        }
                        view.send_modify(|v| {
                            v.renewed_at = Some(sent);
                            v.renew_error = None;
                        });
                    }
                    Err(e) => {
                        let text = fleetscope_informer::source::chain(&e);
                        if failing.as_deref() != Some(text.as_str()) {
                            tracing::warn!(ring = %config.ring, lease = own.name(), error = %text, "lease renewal failed");
                            failing = Some(text.clone());
                        }
                        view.send_modify(|v| {
                            v.renew_failures += 1;
                            v.renew_error = Some(text);
                        });
                    }
                }
            }
            changed = observed.changed() => {
                if changed.is_err() {
                    break;
                }
                let seen = observed.borrow_and_update().clone();
                view.send_modify(|v| v.observed = seen);
            }
            _ = stop.cancelled() => break,
        }
    }
    if let Err(e) = own.release().await {
        tracing::warn!(ring = %config.ring, lease = own.name(), error = %e, "lease release failed: the others count this replica gone after the lease duration");
    }
}
