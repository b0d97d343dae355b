//! A watch's events as the Kubernetes API writes them: each change as `ADDED`,
//! `MODIFIED` or `DELETED` with the object (its text spliced, or as a Table or its
//! metadata alone), bookmarks when asked for (the initial events' end annotated
//! `k8s.io/initial-events-end`), `410 Gone` as an `ERROR` event, and through a router
//! each event's `resourceVersion` the router's position after it.

use bytes::Bytes;
use fleetscope_grpc::Joined;
use fleetscope_model::fleet::WatchEvent;
use fleetscope_model::{EventType, FleetError, Revision};
use futures::StreamExt as _;
use serde_json::{Value, json};

use super::form::{self, Form};
use super::routed::{self, Position};
use super::{line, object_json, object_text, status, table};

/// How a watch's events are written.
pub(super) struct Render {
    /// Through a router: where the client stands (each event's `resourceVersion`).
    pub(super) position: Option<Position>,
    /// Whether an event ended the watch.
    pub(super) ended: bool,
    /// The fleet's view: objects annotated, names qualified.
    pub(super) annotate: bool,
    /// Whether the client asked for bookmarks.
    pub(super) bookmarks: bool,
    pub(super) kind: String,
    pub(super) api: String,
    /// The seam's name of the type (for a Table's columns).
    pub(super) canonical: String,
    pub(super) form: Form,
}

impl Render {
    /// The API's event for one of the seam's, if it has one.
    pub(super) fn event(&mut self, e: Result<WatchEvent, FleetError>) -> Option<Bytes> {
        let e = match (e, &self.position) {
            // Through a router a cluster that cannot continue from the client's
            // position ends the watch: the client lists again.
            (Ok(WatchEvent::Reset { cluster }), Some(_)) => {
                self.ended = true;
                Err(routed::reset(&cluster))
            }
            (e, _) => e,
        };
        let e = match e {
            Ok(e) => e,
            Err(FleetError::OutOfRange { message, .. }) => {
                return Some(line(&json!({"type": "ERROR", "object": gone(&message)})));
            }
            Err(e) => {
                return Some(line(
                    &json!({"type": "ERROR", "object": status::of(&e).status}),
                ));
            }
        };
        let cluster = match &e {
            WatchEvent::Object { object, .. } => Some(object.key.cluster.to_string()),
            _ => None,
        };
        if let Some(p) = &mut self.position {
            p.pass(&e);
        }
        // An object as JSON: its text as held, spliced (the event's form is fixed).
        if let (
            WatchEvent::Object {
                kind,
                object,
                revision,
                ..
            },
            Form::Object | Form::Discovery(_),
        ) = (&e, self.form)
        {
            let rv = match self.position.as_ref().filter(|p| p.known()) {
                Some(p) => p.encode(),
                None => revision.0.to_string(),
            };
            let object = object_text(object, self.annotate, Some(&rv));
            let t = type_name(*kind);
            return Some(Bytes::from(format!(
                "{{\"type\":\"{t}\",\"object\":{object}}}\n"
            )));
        }
        let routed_bookmark = matches!(e, WatchEvent::Bookmark { .. }) && self.bookmarks;
        let mut v = match self.position.as_ref() {
            // A router's bookmarks are its positions: passed on when asked for.
            Some(p) if routed_bookmark => bookmark(&self.kind, &self.api, &p.encode(), json!({})),
            _ => event_json(&e, self.annotate, self.bookmarks, &self.kind, &self.api)?,
        };
        // Through a router, every event's resourceVersion is the position after it;
        // before the initial objects end there is none yet: each object's own
        // revision (a client resuming from it lists again).
        if let Some(p) = self.position.as_ref().filter(|p| p.known()) {
            v["object"]["metadata"]["resourceVersion"] = json!(p.encode());
        }
        match (self.form, cluster) {
            (Form::Table, Some(cluster)) => {
                let object = v["object"].take();
                v["object"] = table::of(
                    &self.canonical,
                    &[(&cluster, object)],
                    self.annotate,
                    json!({}),
                );
            }
            // Bookmarks too, as an API server sends them.
            (Form::Metadata, _) => v["object"] = form::metadata(&v["object"]),
            _ => {}
        }
        Some(line(&v))
    }
}

/// A watch event as the API writes it; `None` for what the API has no event for.
fn event_json(
    e: &WatchEvent,
    annotate: bool,
    bookmarks: bool,
    kind: &str,
    api: &str,
) -> Option<Value> {
    let bookmark =
        |revision: Revision, annotations| bookmark(kind, api, &revision.0.to_string(), annotations);
    match e {
        WatchEvent::Object {
            kind: t,
            object,
            revision,
            ..
        } => {
            let t = type_name(*t);
            let mut o = object_json(object, annotate);
            // A client resumes from its last event's resourceVersion: fleetscope's.
            if let Some(meta) = o.get_mut("metadata").and_then(Value::as_object_mut) {
                meta.insert("resourceVersion".into(), json!(revision.0.to_string()));
            }
            Some(json!({"type": t, "object": o}))
        }
        WatchEvent::InitialEventsEnd { revision, .. } => {
            bookmarks.then(|| bookmark(*revision, json!({"k8s.io/initial-events-end": "true"})))
        }
        WatchEvent::Bookmark { .. } => None,
        WatchEvent::Positions { revision, .. } => bookmarks.then(|| bookmark(*revision, json!({}))),
        WatchEvent::ClusterStatus { .. }
        | WatchEvent::Reset { .. }
        | WatchEvent::ResetEnd { .. } => None,
    }
}

/// A watch event's `type` for a change.
fn type_name(kind: EventType) -> &'static str {
    match kind {
        EventType::Added => "ADDED",
        EventType::Modified => "MODIFIED",
        EventType::Deleted => "DELETED",
    }
}

/// A `BOOKMARK` event at `rv`, with `annotations`.
fn bookmark(kind: &str, api: &str, rv: &str, annotations: Value) -> Value {
    json!({"type": "BOOKMARK", "object": {
        "kind": kind, "apiVersion": api,
        "metadata": {"resourceVersion": rv, "annotations": annotations},
    }})
}

/// `events`, until the caller's credential is revoked (then the reason, as an `ERROR`
/// event, ends it), holding `place` while it runs.
pub(super) fn until_revoked(
    events: futures::stream::BoxStream<'static, Bytes>,
    revoked: futures::future::BoxFuture<'static, tonic::Status>,
    place: Joined,
) -> futures::stream::BoxStream<'static, Bytes> {
    futures::stream::unfold(
        (events, Some(revoked), place),
        |(mut events, revoked, place)| async move {
            let mut revoked = revoked?;
            tokio::select! {
                e = events.next() => e.map(|e| (e, (events, Some(revoked), place))),
                why = &mut revoked => {
                    let refusal = status::refused(&why);
                    let end = line(&json!({"type": "ERROR", "object": refusal.status}));
                    Some((end, (events, None, place)))
                }
            }
        },
    )
    .boxed()
}

/// The status of a position no longer held, as an API server sends it in a watch.
pub(super) fn gone(message: &str) -> Value {
    json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": format!("too old resource version: {message}"),
        "reason": "Expired", "code": 410,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kubeapi::CLUSTER_ANNOTATION;
    use fleetscope_model::fleet::FleetObject;
    use fleetscope_model::{ClusterName, ObjectKey};

    #[test]
    fn watch_events_carry_fleetscope_s_revision_and_the_initial_end_bookmark() {
        let object = FleetObject {
            key: ObjectKey::new("pods", &ClusterName::from("a"), "ns", "p"),
            revision: Revision(7),
            uid: String::new(),
            resource_version: "123".into(),
            json: r#"{"kind":"Pod","metadata":{"name":"p","resourceVersion":"123"}}"#.into(),
        };
        let e = WatchEvent::Object {
            kind: EventType::Added,
            object,
            revision: Revision(7),
            position: None,
        };
        let v = event_json(&e, true, false, "Pod", "v1").unwrap();
        assert_eq!(v["type"], "ADDED");
        assert_eq!(v["object"]["metadata"]["resourceVersion"], "7");
        assert_eq!(
            v["object"]["metadata"]["annotations"][CLUSTER_ANNOTATION],
            "a"
        );
        let end = WatchEvent::InitialEventsEnd {
            revision: Revision(9),
            token: String::new(),
        };
        assert!(event_json(&end, false, false, "Pod", "v1").is_none());
        let v = event_json(&end, false, true, "Pod", "v1").unwrap();
        assert_eq!(v["type"], "BOOKMARK");
        assert_eq!(
            v["object"]["metadata"]["annotations"]["k8s.io/initial-events-end"],
            "true"
        );
        assert_eq!(v["object"]["metadata"]["resourceVersion"], "9");
    }
}
