//! A Watch subscriber as a client keeps one: the state it rebuilds from its events,
//! the last revision it was given, and a resume from that revision after a restart.

use std::collections::BTreeMap;

use fleetscope::proto::fleet_client::FleetClient;
use fleetscope::proto::{EventType, Query, WatchEvent, WatchRequest};
use tonic::{Code, Status, Streaming};

use super::PATIENCE;

/// Every configmap in the fleet.
pub fn configmaps() -> Query {
    Query {
        resource: "configmaps".into(),
        ..Default::default()
    }
}

/// (cluster, namespace, name).
pub type Key = (String, String, String);

/// What a subscriber knows: the objects it rebuilt (→ resourceVersion) and the last
/// revision it was given.
#[derive(Default)]
pub struct Subscriber {
    pub state: BTreeMap<Key, String>,
    pub last: Option<u64>,
    /// Still receiving initial events (which carry each object's own revision).
    pub initial: bool,
    pub events: usize,
    /// How many times each object was given as DELETED.
    pub deleted: BTreeMap<Key, usize>,
    /// The resource type it watches; configmaps when not given.
    pub resource: Option<String>,
}

impl Subscriber {
    pub fn apply(&mut self, e: &WatchEvent) {
        let kind = e.r#type();
        match kind {
            EventType::Added | EventType::Modified | EventType::Deleted => {
                let o = e.object.as_ref().expect("a change carries its object");
                let key = (o.cluster.clone(), o.namespace.clone(), o.name.clone());
                if !self.initial {
                    let last = self.last.expect("a position before changes");
                    assert!(
                        e.revision > last,
                        "revisions strictly increase: {} after {last}",
                        e.revision
                    );
                    self.last = Some(e.revision);
                }
                if kind == EventType::Deleted {
                    self.state.remove(&key);
                    *self.deleted.entry(key).or_default() += 1;
                } else {
                    self.state.insert(key, o.resource_version.clone());
                }
                self.events += 1;
            }
            EventType::InitialEventsEnd => {
                self.initial = false;
                self.last = Some(e.revision);
            }
            EventType::Bookmark => {
                if let Some(last) = self.last {
                    assert!(e.revision >= last, "a bookmark never goes back");
                }
            }
            _ => {}
        }
    }

    /// Opens its Watch on `url`: from its last revision, or with initial events.
    /// Starting, discovering or unreachable servers are retried; any other refusal
    /// is returned.
    pub async fn watch(&mut self, url: &str) -> Result<Streaming<WatchEvent>, Status> {
        let stream = super::eventually(format!("{url} serves a Watch"), async || {
            let attempt = async {
                let mut client = FleetClient::connect(url.to_string())
                    .await
                    .map_err(|e| Status::unavailable(e.to_string()))?;
                client
                    .watch(WatchRequest {
                        query: Some(match &self.resource {
                            Some(r) => Query {
                                resource: r.clone(),
                                ..Default::default()
                            },
                            None => configmaps(),
                        }),
                        since_revision: self.last.unwrap_or(0),
                        send_initial_events: self.last.is_none(),
                        ..Default::default()
                    })
                    .await
            };
            // Starting, discovering or unreachable: tried again.
            match attempt.await {
                Err(s) if s.code() == Code::Unavailable => Err(s),
                other => Ok(other),
            }
        })
        .await?;
        self.initial = self.last.is_none();
        Ok(stream.into_inner())
    }

    /// Reads events until `until`; then (the server killed) what it had already sent.
    pub async fn read_until(
        &mut self,
        stream: &mut Streaming<WatchEvent>,
        until: tokio::time::Instant,
    ) {
        loop {
            tokio::select! {
                m = stream.message() => match m {
                    Ok(Some(e)) => self.apply(&e),
                    Ok(None) => panic!("the server ended the watch"),
                    Err(s) => panic!("the watch failed: {s}"),
                },
                _ = tokio::time::sleep_until(until) => return,
            }
        }
    }

    /// Takes what the killed server had sent before it died.
    pub async fn drain(&mut self, stream: &mut Streaming<WatchEvent>) {
        while let Ok(Ok(Some(e))) = tokio::time::timeout(PATIENCE, stream.message()).await {
            self.apply(&e);
        }
    }

    /// Reads until its state equals `want` (as [`super::truth`] gives it) and it has a
    /// position: the initial objects end with their marker, and without it a resume
    /// would list again and never hear of what left.
    pub async fn converge(
        &mut self,
        stream: &mut Streaming<WatchEvent>,
        want: &BTreeMap<Key, String>,
    ) {
        let deadline = tokio::time::Instant::now() + PATIENCE;
        while &self.state != want || self.last.is_none() {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            match tokio::time::timeout(left, stream.message()).await {
                Ok(Ok(Some(e))) => self.apply(&e),
                other => panic!(
                    "never converged ({other:?}): {} objects held, {} in the clusters; differing: {:?}",
                    self.state.len(),
                    want.len(),
                    diff(&self.state, want)
                ),
            }
        }
    }
}

/// The first keys on which two states differ.
pub fn diff(a: &BTreeMap<Key, String>, b: &BTreeMap<Key, String>) -> Vec<String> {
    let mut out: Vec<String> = a
        .iter()
        .filter(|(k, v)| b.get(*k) != Some(v))
        .map(|(k, v)| format!("held {k:?}@{v} (cluster: {:?})", b.get(k)))
        .chain(
            b.iter()
                .filter(|(k, _)| !a.contains_key(*k))
                .map(|(k, v)| format!("missing {k:?}@{v}")),
        )
        .collect();
    out.truncate(10);
    out
}
