//! Replica membership through `coordination.k8s.io/v1` Leases in one coordination
//! cluster. Each replica keeps a Lease of its own (`RING-IDENTITY`, labelled with the
//! ring), written with client-go's semantics (`k8s.io/client-go/tools/leaderelection/
//! resourcelock/leaselock.go`): read it, then replace it carrying the
//! `resourceVersion` read, so that etcd's compare-and-swap behind the API server
//! decides a race; a conflict is a lost race, answered by reading again, never by
//! overwriting. Another replica is judged as client-go's `leaderelection.go` judges a
//! leader: alive while its Lease names a holder and this replica saw the Lease change
//! within its duration by this replica's own clock (clocks of different machines are
//! never compared). Releasing clears the holder, so the others see the replica leave
//! at once instead of after the duration. Every Lease is sealed with the ring's key
//! ([`crate::seal`]): one that is not counts for nothing, whoever wrote it.

use std::collections::BTreeMap;
use std::time::Duration;

use futures::StreamExt as _;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::{Api, ListParams, ObjectMeta, PostParams, WatchEvent, WatchParams};
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::seal::{self, LeaseKey, Refused};
pub use crate::vocabulary::Member;
use crate::vocabulary::{INSTANCE, RING_LABEL};

/// Why a Lease could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum LeaseError {
    /// Another writer changed the Lease since it was read (409): a lost race. It is
    /// read again before the next write.
    #[error("lease {name}: changed by another writer since it was read (conflict)")]
    Conflict {
        /// The Lease.
        name: String,
    },
    /// Another process holds this identity's Lease and renews it: two replicas were
    /// given one identity. This one takes nothing until the other stops renewing for
    /// a lease duration.
    #[error(
        "lease {name}: held by another process with identity {identity} (instance {instance}), renewed within its duration: this replica serves nothing until that one stops; give every replica its own --shard-identity"
    )]
    HeldByAnother {
        /// The Lease.
        name: String,
        /// The identity both claim.
        identity: String,
        /// The other process's instance.
        instance: String,
    },
    /// The API server refused or could not be reached.
    #[error("lease {name}")]
    Api {
        /// The Lease.
        name: String,
        /// Why.
        #[source]
        source: kube::Error,
    },
}

/// The name of `identity`'s Lease in `ring`.
pub fn lease_name(ring: &str, identity: &str) -> String {
    format!("{ring}-{identity}")
}

/// This replica's own Lease: renewed every renew period, released on shutdown.
pub struct OwnLease {
    api: Api<Lease>,
    name: String,
    ring: String,
    identity: String,
    duration: Duration,
    /// The Lease as last read or written, with its `resourceVersion`; `None` until
    /// read, and again after a write lost a race.
    last: Option<Lease>,
    /// This process's instance, published on the Lease.
    instance: String,
    /// Another process's hold on the Lease as last seen: its `resourceVersion`, and
    /// when this replica saw it change (client-go's observed record and time).
    foreign: Option<(String, Instant)>,
    /// What this Lease is sealed with.
    key: LeaseKey,
}

impl OwnLease {
    /// `identity`'s Lease in `ring`, in the namespace of `api`.
    pub fn new(
        leases: crate::leases::Leases,
        ring: &str,
        identity: &str,
        duration: Duration,
        key: LeaseKey,
    ) -> Self {
        Self {
            api: leases.api,
            name: lease_name(ring, identity),
            ring: ring.to_string(),
            identity: identity.to_string(),
            duration,
            last: None,
            instance: instance_id(),
            foreign: None,
            key,
        }
    }

    /// The Lease's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    fn api_error(&self, source: kube::Error) -> LeaseError {
        match &source {
            kube::Error::Api(s) if s.code == 409 => LeaseError::Conflict {
                name: self.name.clone(),
            },
            _ => LeaseError::Api {
                name: self.name.clone(),
                source,
            },
        }
    }

    /// The Lease as last read or written, else as the API server has it now.
    async fn current(&mut self) -> Result<Option<Lease>, LeaseError> {
        match self.last.take() {
            Some(l) => Ok(Some(l)),
            None => self
                .api
                .get_opt(&self.name)
                .await
                .map_err(|e| self.api_error(e)),
        }
    }

    /// Holds the Lease for another duration, publishing `annotations` on it (this
    /// replica's address, the clusters it serves): created when missing, else
    /// replaced with the `resourceVersion` last read. A lost race is
    /// [`LeaseError::Conflict`]; the next renewal reads first.
    pub async fn renew(
        &mut self,
        annotations: &BTreeMap<String, String>,
    ) -> Result<(), LeaseError> {
        let now = MicroTime(k8s_openapi::jiff::Timestamp::now());
        let current = self.current().await?;
        if let Some(lease) = &current {
            self.check_foreign(lease)?;
        }
        let mut annotations = annotations.clone();
        annotations.insert(INSTANCE.to_string(), self.instance.clone());
        let last_signed = current
            .as_ref()
            .and_then(|l| l.metadata.annotations.as_ref())
            .and_then(seal::signed_at);
        self.key.seal(
            &self.name,
            Some(&self.identity),
            &mut annotations,
            seal::next_signing(last_signed),
        );
        let annotations = &annotations;
        let written = match current {
            None => {
                let lease = Lease {
                    metadata: ObjectMeta {
                        name: Some(self.name.clone()),
                        labels: Some(BTreeMap::from([(
                            RING_LABEL.to_string(),
                            self.ring.clone(),
                        )])),
                        annotations: Some(annotations.clone()),
                        ..ObjectMeta::default()
                    },
                    spec: Some(LeaseSpec {
                        holder_identity: Some(self.identity.clone()),
                        lease_duration_seconds: Some(seconds(self.duration)),
                        acquire_time: Some(now.clone()),
                        renew_time: Some(now),
                        lease_transitions: Some(0),
                        ..LeaseSpec::default()
                    }),
                };
                self.api
                    .create(&PostParams::default(), &lease)
                    .await
                    .map_err(|e| self.api_error(e))?
            }
            Some(mut lease) => {
                let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
                let held = spec.holder_identity.as_deref() == Some(self.identity.as_str());
                if !held {
                    // Taken up again after a release (or first taken from another
                    // holder): a transition, as client-go counts them.
                    spec.acquire_time = Some(now.clone());
                    spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
                }
                spec.holder_identity = Some(self.identity.clone());
                spec.lease_duration_seconds = Some(seconds(self.duration));
                spec.renew_time = Some(now);
                lease.metadata.annotations = Some(annotations.clone());
                lease
                    .metadata
                    .labels
                    .get_or_insert_with(BTreeMap::new)
                    .insert(RING_LABEL.to_string(), self.ring.clone());
                // Carries the resourceVersion read: a replace, not an overwrite.
                self.api
                    .replace(&self.name, &PostParams::default(), &lease)
                    .await
                    .map_err(|e| self.api_error(e))?
            }
        };
        self.last = Some(written);
        Ok(())
    }

    /// Refuses a Lease another process of this identity holds: named as holder by
    /// another instance, sealed with the ring's key, and seen to change within its
    /// duration (by this replica's clock, from when it first saw that hold). A Lease
    /// released, expired, held under another name or not sealed (edited by someone
    /// without the key) is taken, as client-go takes an expired one.
    fn check_foreign(&mut self, lease: &Lease) -> Result<(), LeaseError> {
        let spec = lease.spec.clone().unwrap_or_default();
        let annotations = lease.metadata.annotations.clone().unwrap_or_default();
        let instance = annotations.get(INSTANCE).cloned().unwrap_or_default();
        let held_by_twin = spec.holder_identity.as_deref() == Some(self.identity.as_str())
            && !instance.is_empty()
            && instance != self.instance
            && self
                .key
                .verify(&self.name, Some(&self.identity), &annotations)
                .is_ok();
        if !held_by_twin {
            self.foreign = None;
            return Ok(());
        }
        let rv = lease.metadata.resource_version.clone().unwrap_or_default();
        let now = Instant::now();
        let seen_at = match &self.foreign {
            Some((seen, at)) if *seen == rv => *at,
            _ => {
                self.foreign = Some((rv, now));
                now
            }
        };
        let duration = Duration::from_secs(
            u64::try_from(spec.lease_duration_seconds.unwrap_or(0)).unwrap_or(0),
        );
        if now.saturating_duration_since(seen_at) >= duration {
            // Not renewed for its duration: the other process is gone.
            self.foreign = None;
            return Ok(());
        }
        Err(LeaseError::HeldByAnother {
            name: self.name.clone(),
            identity: self.identity.clone(),
            instance,
        })
    }

    /// Gives the Lease up: the holder cleared (with the `resourceVersion` read, like
    /// every write), so the others count this replica gone at once.
    pub async fn release(&mut self) -> Result<(), LeaseError> {
        let current = self.current().await?;
        let Some(mut lease) = current else {
            return Ok(());
        };
        let ours = lease
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(INSTANCE))
            .is_none_or(|i| *i == self.instance);
        let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
        if spec.holder_identity.as_deref() != Some(self.identity.as_str()) || !ours {
            return Ok(());
        }
        spec.holder_identity = None;
        spec.renew_time = Some(MicroTime(k8s_openapi::jiff::Timestamp::now()));
        let annotations = lease.metadata.annotations.get_or_insert_with(BTreeMap::new);
        let last_signed = seal::signed_at(annotations);
        self.key.seal(
            &self.name,
            None,
            annotations,
            seal::next_signing(last_signed),
        );
        let written = self
            .api
            .replace(&self.name, &PostParams::default(), &lease)
            .await
            .map_err(|e| self.api_error(e))?;
        self.last = Some(written);
        Ok(())
    }
}

/// A random name for this process's hold on its Lease.
fn instance_id() -> String {
    let mut bytes = [0u8; 8];
    // Without randomness, the time and the process id still tell two starts apart.
    if ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut bytes).is_err() {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        bytes = (u64::from(std::process::id()) ^ (nanos as u64)).to_be_bytes();
    }
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn seconds(d: Duration) -> i32 {
    i32::try_from(d.as_secs().max(1)).unwrap_or(i32::MAX)
}

/// One Lease as this replica has seen it.
#[derive(Debug, Clone)]
struct Seen {
    holder: Option<String>,
    duration: Duration,
    annotations: BTreeMap<String, String>,
    /// When this replica saw it renewed (signed anew), by its own clock.
    changed_at: Instant,
}

/// The Leases of a ring as this replica sees them, and who is alive by them (by
/// default, of no ring: nobody).
#[derive(Debug, Clone, Default)]
pub struct Observed {
    leases: BTreeMap<String, Seen>,
    /// Whether the ring's Leases have been listed once (until then, who is alive is
    /// not known).
    pub listed: bool,
    /// The ring, whose Leases are named `RING-IDENTITY`.
    ring: String,
    /// How long a Lease seen unchanged still counts, by the ring's own setting: a
    /// Lease's own `leaseDurationSeconds` is its writer's claim, and only shortens it.
    lease_duration: Duration,
    /// The key the ring's Leases are sealed with (none: no Lease counts).
    key: Option<LeaseKey>,
    /// The Leases last refused, and why.
    refused: BTreeMap<String, Refused>,
    /// The latest signing taken of each Lease name, kept when the Lease is deleted: a
    /// Lease deleted and written again from an older copy is no renewal either.
    signed: BTreeMap<String, u64>,
    /// The ring's configured clusters, as the replica whose Lease was signed last
    /// publishes them, with that moment: kept when every Lease expires, so that a
    /// cluster nobody serves is never taken for one the ring does not have.
    clusters: Option<(u64, std::collections::BTreeSet<String>)>,
}

impl Observed {
    /// The Leases of `ring`, none seen yet, judged alive for `lease_duration` after
    /// each change seen.
    pub fn new(ring: &str, lease_duration: Duration, key: LeaseKey) -> Self {
        Self {
            leases: BTreeMap::new(),
            listed: false,
            ring: ring.to_string(),
            lease_duration,
            key: Some(key),
            refused: BTreeMap::new(),
            signed: BTreeMap::new(),
            clusters: None,
        }
    }

    /// Records a Lease as read or watched `now`. Only a Lease sealed with the ring's
    /// key is taken, and only a signing later than the one taken before renews it: a
    /// Lease read again unchanged, edited by someone else, or written back from an
    /// older copy leaves the member as it was (alive until its duration runs out). A
    /// refused Lease is remembered with why.
    pub fn saw(&mut self, lease: &Lease, now: Instant) -> Result<(), Refused> {
        let Some(name) = lease.metadata.name.clone() else {
            return Ok(());
        };
        let spec = lease.spec.clone().unwrap_or_default();
        let holder = spec.holder_identity.filter(|h| !h.is_empty());
        let annotations = lease.metadata.annotations.clone().unwrap_or_default();
        let previous = self.leases.get(&name);
        let verified = match &self.key {
            None => Err(Refused::BadSignature),
            Some(k) => k.verify(&name, holder.as_deref(), &annotations),
        };
        // The same signing seen again is the Lease read again, unless it was deleted
        // since: then it is a copy written back.
        let latest = self.signed.get(&name).copied();
        let signed_at = match verified {
            Ok(at) if latest.is_some_and(|l| at < l || (at == l && previous.is_none())) => {
                Err(Refused::Replayed)
            }
            result => result,
        };
        let signed_at = match signed_at {
            Ok(at) => at,
            Err(why) => {
                self.refused.insert(name, why.clone());
                return Err(why);
            }
        };
        self.refused.remove(&name);
        self.signed.insert(name.clone(), signed_at);
        let changed_at = match previous {
            Some(p) if latest == Some(signed_at) => p.changed_at,
            _ => now,
        };
        if let Some(c) = annotations.get(crate::vocabulary::CLUSTERS)
            && self
                .clusters
                .as_ref()
                .is_none_or(|(at, _)| *at <= signed_at)
        {
            let set = c
                .split(',')
                .filter(|c| !c.is_empty())
                .map(str::to_string)
                .collect();
            self.clusters = Some((signed_at, set));
        }
        self.leases.insert(
            name,
            Seen {
                holder,
                duration: Duration::from_secs(
                    u64::try_from(spec.lease_duration_seconds.unwrap_or(0)).unwrap_or(0),
                ),
                annotations,
                changed_at,
            },
        );
        Ok(())
    }

    /// Records that a Lease was deleted.
    pub fn deleted(&mut self, name: &str) {
        self.leases.remove(name);
        self.refused.remove(name);
    }

    /// The ring's configured clusters, as the replicas last published them; `None`
    /// until a replica's Lease was taken.
    pub fn ring_clusters(&self) -> Option<&std::collections::BTreeSet<String>> {
        self.clusters.as_ref().map(|(_, c)| c)
    }

    /// The Leases of the ring refused (by name), and why.
    pub fn refused(&self) -> &BTreeMap<String, Refused> {
        &self.refused
    }

    /// The Leases refused, said for a person (how many, one of them and why); `None`
    /// when none is.
    pub fn refusals(&self) -> Option<String> {
        let (name, reason) = self.refused.iter().next()?;
        Some(format!(
            "{} Lease(s) of the ring not taken, e.g. {name}: {reason}",
            self.refused.len()
        ))
    }

    /// The first moment after `now` at which a Lease alive `now` stops counting,
    /// unless it is seen renewed first (a renewal is a change of the `Observed`):
    /// until then, [`Observed::alive`] answers the same.
    pub fn alive_until(&self, now: Instant) -> Option<Instant> {
        self.leases
            .values()
            .map(|s| s.changed_at + s.duration.min(self.lease_duration))
            .filter(|expiry| *expiry > now)
            .min()
    }

    /// The members alive `now`, by identity: each Lease named for the identity it
    /// holds (`RING-IDENTITY`; anyone may write a Lease, but a name is one Lease) and
    /// seen to change within the ring's lease duration (or its own, if shorter).
    pub fn alive(&self, now: Instant) -> Vec<Member> {
        let mut members: Vec<Member> = self
            .leases
            .iter()
            .filter(|(_, s)| {
                now.saturating_duration_since(s.changed_at) < s.duration.min(self.lease_duration)
            })
            .filter_map(|(name, s)| {
                let identity = s.holder.clone()?;
                if *name != lease_name(&self.ring, &identity) {
                    return None;
                }
                Some(Member {
                    identity,
                    annotations: s.annotations.clone(),
                })
            })
            .collect();
        members.sort_by(|a, b| a.identity.cmp(&b.identity));
        members.dedup_by(|a, b| a.identity == b.identity);
        members
    }
}

/// Follows the Leases of `ring`: a list, then a watch from its `resourceVersion`
/// (again from where it stopped when it ends, from a fresh list when its history is
/// gone or the API server fails), each change published to `observed` as it is seen,
/// until `stop`. Membership is watched, never polled.
pub async fn follow(
    leases: crate::leases::Leases,
    ring: String,
    observed: watch::Sender<Observed>,
    stop: CancellationToken,
) {
    let api = leases.api;
    let ring = ring.as_str();
    let selector = format!("{RING_LABEL}={ring}");
    let retry = Duration::from_secs(1);
    let list_params = ListParams::default().labels(&selector);
    'list: loop {
        let listed = tokio::select! {
            l = api.list(&list_params) => l,
            _ = stop.cancelled() => return,
        };
        let list = match listed {
            Ok(l) => l,
            Err(e) => {
                tracing::warn!(ring, error = %e, "cannot list the ring's leases; retrying");
                tokio::select! {
                    _ = tokio::time::sleep(retry) => continue 'list,
                    _ = stop.cancelled() => return,
                }
            }
        };
        let now = Instant::now();
        observed.send_modify(|o| {
            let names: Vec<String> = list
                .items
                .iter()
                .filter_map(|l| l.metadata.name.clone())
                .collect();
            o.leases.retain(|name, _| names.contains(name));
            o.refused.retain(|name, _| names.contains(name));
            for lease in &list.items {
                see(o, ring, lease, now);
            }
            o.listed = true;
        });
        let mut version = list.metadata.resource_version.unwrap_or_default();
        loop {
            let params = WatchParams::default().labels(&selector).timeout(290);
            let watched = tokio::select! {
                w = api.watch(&params, &version) => w,
                _ = stop.cancelled() => return,
            };
            let mut events = match watched {
                Ok(events) => events.boxed(),
                Err(e) => {
                    tracing::warn!(ring, error = %e, "cannot watch the ring's leases; listing again");
                    tokio::select! {
                        _ = tokio::time::sleep(retry) => continue 'list,
                        _ = stop.cancelled() => return,
                    }
                }
            };
            loop {
                let event = tokio::select! {
                    e = events.next() => e,
                    _ = stop.cancelled() => return,
                };
                let now = Instant::now();
                match event {
                    // The watch ended (its timeout): go on from where it stopped.
                    None => break,
                    Some(Ok(WatchEvent::Added(l) | WatchEvent::Modified(l))) => {
                        version = l.metadata.resource_version.clone().unwrap_or(version);
                        observed.send_modify(|o| see(o, ring, &l, now));
                    }
                    Some(Ok(WatchEvent::Deleted(l))) => {
                        version = l.metadata.resource_version.clone().unwrap_or(version);
                        if let Some(name) = &l.metadata.name {
                            observed.send_modify(|o| o.deleted(name));
                        }
                    }
                    Some(Ok(WatchEvent::Bookmark(b))) => version = b.metadata.resource_version,
                    // 410 Gone (history compacted) or another failure: list again.
                    Some(Ok(WatchEvent::Error(e))) => {
                        tracing::debug!(
                            ring,
                            code = e.code,
                            "the leases' watch ended; listing again"
                        );
                        continue 'list;
                    }
                    Some(Err(e)) => {
                        tracing::warn!(ring, error = %e, "the leases' watch failed; listing again");
                        continue 'list;
                    }
                }
            }
        }
    }
}

/// `observed` with `lease` seen `now`; a refusal logged when its reason is new for
/// the Lease (a Lease written again and again is not logged each time).
fn see(observed: &mut Observed, ring: &str, lease: &Lease, now: Instant) {
    let name = lease.metadata.name.as_deref().unwrap_or_default();
    let before = observed.refused.get(name).cloned();
    if let Err(why) = observed.saw(lease, now)
        && before.as_ref() != Some(&why)
    {
        tracing::warn!(ring, lease = name, why = %why, "a Lease of the ring is not taken");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> LeaseKey {
        LeaseKey::derived(|_| ring::hmac::Key::new(ring::hmac::HMAC_SHA256, &[3; 32]))
    }

    /// A Lease sealed with [`key`], signed at `rv` (each test's versions rise).
    fn lease(name: &str, holder: Option<&str>, rv: &str, seconds: i32) -> Lease {
        let mut annotations = BTreeMap::new();
        key().seal(name, holder, &mut annotations, rv.parse().unwrap());
        Lease {
            metadata: ObjectMeta {
                name: Some(name.into()),
                resource_version: Some(rv.into()),
                annotations: Some(annotations),
                ..ObjectMeta::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: holder.map(str::to_string),
                lease_duration_seconds: Some(seconds),
                ..LeaseSpec::default()
            }),
        }
    }

    #[test]
    fn a_lease_counts_under_its_own_name_and_for_the_ring_s_duration_at_most() {
        let t0 = Instant::now();
        let mut seen = Observed::new("ring", Duration::from_secs(15), key());
        let ids = |m: Vec<Member>| m.into_iter().map(|m| m.identity).collect::<Vec<_>>();
        // A ghost claiming two billion seconds, and a copy of another's identity.
        let _ = seen.saw(&lease("ring-ghost", Some("ghost"), "1", 2_000_000_000), t0);
        let _ = seen.saw(&lease("ring-a", Some("a"), "1", 15), t0);
        let _ = seen.saw(&lease("ring-aaa", Some("a"), "1", 15), t0);
        let _ = seen.saw(&lease("ring-b", Some("replica-1"), "1", 15), t0);
        assert_eq!(ids(seen.alive(t0)), ["a", "ghost"]);
        let t16 = t0 + Duration::from_secs(16);
        let _ = seen.saw(&lease("ring-a", Some("a"), "2", 15), t16);
        assert_eq!(
            ids(seen.alive(t16)),
            ["a"],
            "the ghost is dead after the ring's duration"
        );
    }

    #[test]
    fn only_a_lease_sealed_with_the_ring_s_key_and_signed_anew_counts() {
        let t0 = Instant::now();
        let mut seen = Observed::new("ring", Duration::from_secs(15), key());
        let ids = |m: Vec<Member>| m.into_iter().map(|m| m.identity).collect::<Vec<_>>();
        // A Lease written by hand: no signature.
        let mut ghost = lease("ring-ghost", Some("ghost"), "1", 2_000_000_000);
        ghost.metadata.annotations = None;
        assert_eq!(seen.saw(&ghost, t0), Err(Refused::Unsigned));
        // A replica's Lease edited by someone else: its readiness claim changed.
        let mut edited = lease("ring-a", Some("a"), "5", 15);
        edited
            .metadata
            .annotations
            .as_mut()
            .unwrap()
            .insert(crate::vocabulary::READY.into(), "every,cluster".into());
        assert_eq!(seen.saw(&edited, t0), Err(Refused::BadSignature));
        // Sealed with another ring's key.
        let mut other = BTreeMap::new();
        LeaseKey::derived(|_| ring::hmac::Key::new(ring::hmac::HMAC_SHA256, &[4; 32])).seal(
            "ring-b",
            Some("b"),
            &mut other,
            1,
        );
        let mut foreign = lease("ring-b", Some("b"), "1", 15);
        foreign.metadata.annotations = Some(other);
        assert_eq!(seen.saw(&foreign, t0), Err(Refused::BadSignature));
        assert!(seen.alive(t0).is_empty());
        assert_eq!(seen.refused().len(), 3);
        // The real one, then an older copy of it written back: not a renewal.
        assert_eq!(seen.saw(&lease("ring-a", Some("a"), "5", 15), t0), Ok(()));
        let t10 = t0 + Duration::from_secs(10);
        assert_eq!(
            seen.saw(&lease("ring-a", Some("a"), "4", 15), t10),
            Err(Refused::Replayed)
        );
        let t16 = t0 + Duration::from_secs(16);
        assert!(
            seen.alive(t16).is_empty(),
            "a written-back copy renews nothing"
        );
        // Signed anew: alive again; the refusal of its name is forgotten.
        assert_eq!(seen.saw(&lease("ring-a", Some("a"), "6", 15), t16), Ok(()));
        assert_eq!(ids(seen.alive(t16)), ["a"]);
        assert!(!seen.refused().contains_key("ring-a"));
        // Deleted, then written again from a copy taken before: refused too.
        seen.deleted("ring-a");
        assert_eq!(
            seen.saw(&lease("ring-a", Some("a"), "6", 15), t16),
            Err(Refused::Replayed)
        );
        assert!(seen.alive(t16).is_empty());
        assert_eq!(seen.saw(&lease("ring-a", Some("a"), "7", 15), t16), Ok(()));
    }

    #[test]
    fn the_ring_s_clusters_are_the_last_signed_and_outlive_every_lease() {
        let t0 = Instant::now();
        let mut seen = Observed::new("ring", Duration::from_secs(15), key());
        assert_eq!(seen.ring_clusters(), None);
        let with = |name: &str, id: &str, at: &str, clusters: &str| {
            let mut annotations = BTreeMap::from([(
                crate::vocabulary::CLUSTERS.to_string(),
                clusters.to_string(),
            )]);
            key().seal(name, Some(id), &mut annotations, at.parse().unwrap());
            let mut l = lease(name, Some(id), at, 15);
            l.metadata.annotations = Some(annotations);
            l
        };
        seen.saw(&with("ring-a", "a", "10", "x,y"), t0).unwrap();
        seen.saw(&with("ring-b", "b", "9", "x"), t0).unwrap();
        let set = |s: &[&str]| {
            s.iter()
                .map(|c| c.to_string())
                .collect::<std::collections::BTreeSet<_>>()
        };
        assert_eq!(seen.ring_clusters(), Some(&set(&["x", "y"])));
        seen.saw(&with("ring-b", "b", "11", "x,y,z"), t0).unwrap();
        assert_eq!(seen.ring_clusters(), Some(&set(&["x", "y", "z"])));
        seen.deleted("ring-a");
        seen.deleted("ring-b");
        assert_eq!(seen.ring_clusters(), Some(&set(&["x", "y", "z"])));
    }

    #[test]
    fn a_member_is_alive_while_its_lease_changes_within_its_duration() {
        let t0 = Instant::now();
        let mut seen = Observed::new("ring", Duration::from_secs(60), key());
        let _ = seen.saw(&lease("ring-a", Some("a"), "1", 15), t0);
        let _ = seen.saw(&lease("ring-b", Some("b"), "1", 15), t0);
        let ids = |m: Vec<Member>| m.into_iter().map(|m| m.identity).collect::<Vec<_>>();
        assert_eq!(ids(seen.alive(t0)), ["a", "b"]);
        // a renews at 10 s; b is read again unchanged: that is no renewal.
        let t10 = t0 + Duration::from_secs(10);
        let _ = seen.saw(&lease("ring-a", Some("a"), "2", 15), t10);
        let _ = seen.saw(&lease("ring-b", Some("b"), "1", 15), t10);
        let t16 = t0 + Duration::from_secs(16);
        assert_eq!(ids(seen.alive(t16)), ["a"]);
        // A released Lease (no holder) is gone at once, whatever its age.
        let _ = seen.saw(&lease("ring-a", None, "3", 15), t16);
        assert!(seen.alive(t16).is_empty());
        // Taken up again.
        let _ = seen.saw(&lease("ring-a", Some("a"), "4", 15), t16);
        assert_eq!(ids(seen.alive(t16)), ["a"]);
        seen.deleted("ring-a");
        assert!(seen.alive(t16).is_empty());
    }
}
