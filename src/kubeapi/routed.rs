//! Positions through a router. A server's `resourceVersion` is its durable revision;
//! a router's replicas each number their own, so through a router a
//! `resourceVersion` is a router's position instead: the signed position token of the
//! last bookmark with the member position each cluster reached after it (what a gRPC
//! client passes back as `resume_token` and `resume_positions`), opaque to the client.
//! A watch resumes from one on any router of the ring, exactly. A list through a
//! router is the router's Watch's initial objects (whole: a server may answer more
//! than `limit`, as an API server does from its cache), so that its `resourceVersion`
//! is such a position too and a reflector's list-then-watch loses nothing. A cluster
//! that cannot continue from the position (it moved and its new replica no longer
//! holds it) ends the watch with `410 Gone`: the client lists again.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use bytes::Bytes;
use fleetscope_model::ClusterName;
use fleetscope_model::FleetError;
use fleetscope_model::fleet::{Resume, Watch, WatchEvent};
use futures::StreamExt as _;
use futures::stream::BoxStream;

use super::form::Writing;
use super::status::Refusal;

/// What a `resourceVersion` is on this front end's fleet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Positions {
    /// A server's durable revision (a number).
    Revisions,
    /// A router's position (see the module).
    Tokens,
}

/// What marks a router's position among `resourceVersion`s (a revision is digits).
const PREFIX: &str = "r.";

/// How long a list through a router waits for its Watch's initial objects.
const LIST_PATIENCE: Duration = Duration::from_secs(60);

/// Where a watch through a router stands: its last bookmark's token and each
/// cluster's member position after it.
#[derive(Debug, Default, Clone)]
pub struct Position {
    token: String,
    after: BTreeMap<String, Arc<str>>,
}

impl Position {
    /// The position as a `resourceVersion`.
    pub fn encode(&self) -> String {
        let after: Vec<(&str, &str)> = self
            .after
            .iter()
            .map(|(c, p)| (c.as_str(), p.as_ref()))
            .collect();
        let json = serde_json::to_vec(&(&self.token, after)).unwrap_or_default();
        format!("{PREFIX}{}", URL_SAFE_NO_PAD.encode(json))
    }

    /// The position a `resourceVersion` names, if it is a router's.
    pub fn decode(rv: &str) -> Option<Self> {
        let bytes = URL_SAFE_NO_PAD.decode(rv.strip_prefix(PREFIX)?).ok()?;
        let (token, after): (String, Vec<(String, String)>) =
            serde_json::from_slice(&bytes).ok()?;
        Some(Self {
            token,
            after: after.into_iter().map(|(c, p)| (c, Arc::from(p))).collect(),
        })
    }

    /// Where the router's Watch resumes from.
    pub fn resume(&self) -> Resume {
        Resume {
            token: self.token.clone(),
            after: self
                .after
                .iter()
                .map(|(c, p)| (ClusterName::from(c.as_str()), p.clone()))
                .collect(),
        }
    }

    /// Moves past `e`: a bookmark (or the initial objects' end) starts again from its
    /// token; an object event notes its cluster's position.
    pub fn pass(&mut self, e: &WatchEvent) {
        match e {
            WatchEvent::Bookmark { token } | WatchEvent::InitialEventsEnd { token, .. }
                if !token.is_empty() =>
            {
                self.token.clone_from(token);
                self.after.clear();
            }
            WatchEvent::Object {
                object,
                position: Some(p),
                ..
            } => {
                self.after.insert(object.key.cluster.to_string(), p.clone());
            }
            _ => {}
        }
    }

    /// Whether the router has given a token yet (not before the initial objects end).
    pub fn known(&self) -> bool {
        !self.token.is_empty()
    }
}

/// The refusal of a `resourceVersion` that is no router's position: a revision (a
/// server's, meaningless across a ring's replicas) is `410 Gone`, so a client lists
/// again and gets a position; anything else is a bad request.
pub fn not_a_position(rv: &str) -> Refusal {
    if rv.bytes().all(|b| b.is_ascii_digit()) {
        Refusal::new(
            410,
            "Expired",
            format!(
                "too old resource version: {rv} is a server's revision, and through a router a resourceVersion is the router's position: list again"
            ),
        )
    } else {
        Refusal::bad_request(format!(
            "resourceVersion {rv:?} is not one this ring's routers issued: pass back a list's or an event's metadata.resourceVersion"
        ))
    }
}

/// An error that cuts a response body short.
pub type BodyError = Box<dyn std::error::Error + Send + Sync>;

/// How many bytes of objects a list through a router gathers before it writes them.
const CHUNK: usize = 256 << 10;

/// A list through a router, written as the router's Watch (opened with `initial` and
/// `report_positions`) sends its initial objects: `writing.head`, the objects, then
/// `],"metadata":{"resourceVersion":POSITION}}` (members in any order are JSON's, and
/// every client's), so the router holds a chunk at a time, not the list. Refused,
/// nothing written, if the Watch fails before its first event; a failure after that
/// cuts the body short, and the client lists again.
pub async fn list(
    mut watch: Watch,
    writing: Writing,
) -> Result<BoxStream<'static, Result<Bytes, BodyError>>, Refusal> {
    let first = match tokio::time::timeout(LIST_PATIENCE, watch.next()).await {
        Ok(Some(Ok(e))) => e,
        Ok(Some(Err(e))) => return Err(super::status::of(&e)),
        Ok(None) => return Err(unavailable(ENDED.to_string())),
        Err(_) => return Err(unavailable(too_slow())),
    };
    if let WatchEvent::Reset { cluster } = &first {
        return Err(unavailable(moved(cluster)));
    }
    let head = Bytes::from(writing.head.clone());
    let state = Listing {
        watch,
        first: Some(first),
        position: Position::default(),
        wrote: false,
        writing,
        done: false,
    };
    let body = futures::stream::unfold(state, |mut s| async move {
        if s.done {
            return None;
        }
        let chunk = s.chunk().await;
        s.done |= chunk.is_err();
        Some((chunk, s))
    });
    Ok(futures::stream::once(async move { Ok(head) })
        .chain(body)
        .boxed())
}

/// A list through a router being written.
struct Listing {
    watch: Watch,
    /// The event taken to see that the Watch began.
    first: Option<WatchEvent>,
    position: Position,
    /// Whether an object was written (the next one follows a comma).
    wrote: bool,
    writing: Writing,
    /// Whether the list was closed (or cut short).
    done: bool,
}

impl Listing {
    /// The next chunk: objects up to [`CHUNK`] bytes, and the list's end once the
    /// initial objects have all come.
    async fn chunk(&mut self) -> Result<Bytes, BodyError> {
        let mut out = String::new();
        while out.len() < CHUNK {
            let e = match self.first.take() {
                Some(e) => e,
                None => match tokio::time::timeout(LIST_PATIENCE, self.watch.next()).await {
                    Ok(Some(Ok(e))) => e,
                    Ok(Some(Err(e))) => return Err(e.to_string().into()),
                    Ok(None) => return Err(ENDED.into()),
                    Err(_) => return Err(too_slow().into()),
                },
            };
            self.position.pass(&e);
            match e {
                WatchEvent::Object { object, .. } => {
                    if self.wrote {
                        out.push(',');
                    }
                    self.wrote = true;
                    out.push_str(&(self.writing.item)(&object));
                }
                WatchEvent::InitialEventsEnd { .. } => {
                    let metadata = serde_json::json!({"resourceVersion": self.position.encode()});
                    out.push_str(&Writing::close(&metadata));
                    self.done = true;
                    break;
                }
                WatchEvent::Reset { cluster } => return Err(moved(&cluster).into()),
                _ => {}
            }
        }
        Ok(Bytes::from(out))
    }
}

/// Why a list through a router ended before its objects did.
const ENDED: &str = "the router's Watch ended before its initial objects: list again";

fn too_slow() -> String {
    format!(
        "the replicas did not send the fleet's objects within {} s: list again",
        LIST_PATIENCE.as_secs()
    )
}

fn moved(cluster: &ClusterName) -> String {
    format!("cluster {cluster} moved between replicas while the list was read: list again")
}

/// A retryable refusal (`503` with `Retry-After`).
fn unavailable(message: String) -> Refusal {
    super::status::of(&FleetError::Unavailable(message))
}

/// The `410 Gone` that ends a watch through a router when `cluster` could not
/// continue from the client's position.
pub fn reset(cluster: &ClusterName) -> FleetError {
    FleetError::OutOfRange {
        message: format!(
            "cluster {cluster} could not continue from this position (it moved between replicas): list again"
        ),
        reason: fleetscope_model::fleet::reason::REVISION_COMPACTED,
        oldest: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fleetscope_model::fleet::FleetObject;
    use fleetscope_model::{EventType, ObjectKey, Revision};

    fn object(cluster: &str, position: Option<&str>) -> WatchEvent {
        WatchEvent::Object {
            kind: EventType::Added,
            object: FleetObject {
                key: ObjectKey::new("configmaps", &ClusterName::from(cluster), "ns", "a"),
                revision: Revision(1),
                uid: String::new(),
                resource_version: String::new(),
                json: "{}".into(),
            },
            revision: Revision(1),
            position: position.map(Arc::from),
        }
    }

    #[test]
    fn a_position_reads_back_and_moves_with_bookmarks_and_events() {
        let mut p = Position::default();
        assert!(!p.known());
        p.pass(&WatchEvent::InitialEventsEnd {
            revision: Revision(3),
            token: "t1".into(),
        });
        p.pass(&object("a", Some("17")));
        p.pass(&object("b", None));
        let rv = p.encode();
        assert!(rv.starts_with(PREFIX));
        let back = Position::decode(&rv).unwrap();
        let resume = back.resume();
        assert_eq!(resume.token, "t1");
        assert_eq!(
            resume
                .after
                .iter()
                .map(|(c, p)| (c.as_str(), p.as_ref()))
                .collect::<Vec<_>>(),
            [("a", "17")]
        );
        // A bookmark starts again from its token.
        p.pass(&WatchEvent::Bookmark { token: "t2".into() });
        let back = Position::decode(&p.encode()).unwrap();
        assert_eq!((back.token.as_str(), back.after.len()), ("t2", 0));
        // Not a position: a revision is Gone (list again), anything else a bad request.
        assert!(Position::decode("42").is_none());
        assert!(Position::decode("r.!!").is_none());
        assert_eq!(not_a_position("42").code, 410);
        assert_eq!(not_a_position("r.x").code, 400);
    }
}
