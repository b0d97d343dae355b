//! WATCH: one JSON event per chunk, from a resourceVersion or from the current state,
//! with bookmarks, `sendInitialEvents`, timeouts, selector transitions and faults.

use std::io;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use fleetscope_model::{FieldSelector, LabelSelector};
use http::{HeaderValue, Response, StatusCode, header};
use http_body_util::{BodyExt, StreamBody};
use hyper::body::Frame;
use rand::Rng;
use tokio::sync::{broadcast, mpsc};
use tokio::time::{Instant, MissedTickBehavior};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::cluster::{Cluster, ListKind, WatchControl, WatchListSupport};
use crate::request::{
    Body, MATCH_WITHOUT_RV, Query, Repr, Target, parse_rv_unchecked, partial_metadata,
};
use crate::resource::ResourceDef;
use crate::status::ApiError;
use crate::store::{Change, ChangeKind, StoredObject, Subscription, WatchFrom};

type Chunk = Result<Frame<Bytes>, io::Error>;

/// Which objects a watch is about.
struct Filter {
    namespace: Option<String>,
    labels: LabelSelector,
    fields: FieldSelector,
}

impl Filter {
    fn matches(&self, o: &StoredObject) -> bool {
        self.namespace.as_ref().is_none_or(|ns| *ns == o.namespace)
            && self.labels.matches(o)
            && self.fields.matches(o)
    }

    /// The event a subscriber sees for a change: filters apply to transitions, so an
    /// object that stops matching is DELETED and one that starts matching is ADDED.
    fn transition<'c>(&self, change: &'c Change) -> Option<(&'static str, &'c Arc<StoredObject>)> {
        let now = self.matches(&change.object);
        let before = change.prev.as_ref().is_some_and(|p| self.matches(p));
        let kind = match (change.kind, before, now) {
            (ChangeKind::Added, _, true) => "ADDED",
            (ChangeKind::Modified, true, true) => "MODIFIED",
            (ChangeKind::Modified, false, true) => "ADDED",
            (ChangeKind::Modified, true, false) => "DELETED",
            (ChangeKind::Deleted, b, n) if b || n => "DELETED",
            _ => return None,
        };
        Some((kind, &change.object))
    }
}

struct Options {
    bookmarks: bool,
    send_initial: bool,
    timeout: Duration,
    bookmark_interval: Duration,
    repr: Repr,
}

/// Starts a watch and answers with its stream; a 410 start is a 200 with one ERROR event, as captured.
pub(crate) async fn serve(
    cluster: Cluster,
    conn: CancellationToken,
    t: Target,
    q: Query,
    repr: Repr,
) -> Result<Response<Body>, ApiError> {
    let filter = Filter {
        namespace: t.namespace.clone(),
        labels: q.label_selector()?,
        fields: q.field_selector(&t.def)?,
    };
    let (rv, rv_match) = parse_rv_unchecked(&q)?;
    let bookmarks = q.flag("allowWatchBookmarks");
    let send_initial = initial_events(&cluster, &q, (rv, rv_match), bookmarks)?;
    let timeout = timeout_of(&cluster, &q)?;

    if cluster.take_stall() {
        // Accept, never answer: wait until released, then cut the connection.
        let mut release = cluster.faults.stall_release.subscribe();
        tokio::select! {
            _ = conn.cancelled() => {}
            _ = release.changed() => {}
        }
        // Cutting the connection drops this future; it must never answer first.
        conn.cancel();
        return std::future::pending().await;
    }

    let from = match (send_initial, rv) {
        (Some(true), Some(rv)) if rv > cluster.store.resource_version() => {
            return Err(ApiError::too_large_rv(rv, cluster.store.resource_version()));
        }
        (Some(true), _) | (_, None | Some(0)) => WatchFrom::Now,
        (_, Some(rv)) => WatchFrom::After(rv),
    };
    let id = t.def.id();
    let (tx, rx) = mpsc::channel::<Chunk>(64);
    match cluster.store.subscribe(&id, from) {
        Ok(sub) => {
            if send_initial == Some(true) {
                cluster.count_list(ListKind::Streaming, &id, 1, 0);
            }
            let opts = Options {
                bookmarks,
                send_initial: send_initial == Some(true),
                timeout,
                bookmark_interval: cluster.config.bookmark_interval,
                repr,
            };
            let span = tracing::debug_span!("sim_watch", cluster = cluster.name(), resource = %id);
            tokio::spawn(run(cluster, conn, t.def.clone(), sub, filter, opts, tx).instrument(span));
        }
        Err(e) if e.code == 410 => {
            let _ = tx.try_send(Ok(Frame::data(error_event(&e))));
            drop(tx);
        }
        Err(e) => return Err(e),
    }
    let stream =
        futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|c| (c, rx)) });
    let mut resp = Response::new(StreamBody::new(stream).boxed());
    *resp.status_mut() = StatusCode::OK;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    Ok(resp)
}

/// Whether a watch sends its initial events first (`sendInitialEvents`; `None` when
/// not asked), checked as the API server checks it: with `resourceVersionMatch` of
/// `NotOlderThan` and bookmarks allowed, and only where the server serves streaming
/// lists (one that refuses them says so; one that does not know the parameters reads
/// them as absent, or forbids `resourceVersionMatch` on a watch).
fn initial_events(
    cluster: &Cluster,
    q: &Query,
    (rv, mut rv_match): (Option<u64>, Option<&str>),
    bookmarks: bool,
) -> Result<Option<bool>, ApiError> {
    let mut send_initial = match q.get("sendInitialEvents") {
        None | Some("") => None,
        Some(v) => Some(matches!(v, "true" | "1")),
    };
    match cluster.watch_list() {
        WatchListSupport::Served => {}
        WatchListSupport::Refused if send_initial.is_some() => {
            return Err(ApiError::invalid_options(&[
                "sendInitialEvents: Forbidden: sendInitialEvents is forbidden for watch unless the WatchList feature gate is enabled",
            ]));
        }
        WatchListSupport::Refused => {}
        // It knows `resourceVersionMatch` and forbids it on a watch; it does not know
        // `sendInitialEvents`, and reads it as absent.
        WatchListSupport::Unknown => {
            if rv_match.is_some() {
                let mut errors = vec![
                    "resourceVersionMatch: Forbidden: resourceVersionMatch is forbidden for watch",
                ];
                if rv.is_none() {
                    errors.push(MATCH_WITHOUT_RV);
                }
                return Err(ApiError::invalid_options(&errors));
            }
            send_initial = None;
        }
        // A server that does not know the parameters reads them as absent.
        WatchListSupport::Ignored => {
            send_initial = None;
            rv_match = None;
        }
    }
    if send_initial.is_none() && rv_match.is_some() {
        return Err(ApiError::invalid_options(&[
            "resourceVersionMatch: Forbidden: resourceVersionMatch is forbidden for watch unless sendInitialEvents is provided",
        ]));
    }
    if send_initial.is_some() {
        if rv_match != Some("NotOlderThan") {
            return Err(ApiError::invalid_options(&[
                "sendInitialEvents: Forbidden: sendInitialEvents is forbidden for watch unless resourceVersionMatch is set to NotOlderThan",
            ]));
        }
        if !bookmarks {
            return Err(ApiError::invalid_options(&[
                "allowWatchBookmarks: Required value: allowWatchBookmarks must be set to true when sendInitialEvents is set",
            ]));
        }
    }
    Ok(send_initial)
}

/// How long a watch runs: `timeoutSeconds`, or a lifetime drawn from the cluster's
/// range, as the API server draws one.
fn timeout_of(cluster: &Cluster, q: &Query) -> Result<Duration, ApiError> {
    Ok(match q.get("timeoutSeconds").filter(|s| !s.is_empty()) {
        Some(s) => Duration::from_secs(
            s.parse()
                .map_err(|_| ApiError::bad_request(format!("invalid timeoutSeconds: {s}")))?,
        ),
        None => {
            let (lo, hi) = cluster.config.watch_lifetime;
            if hi > lo {
                rand::rng().random_range(lo..hi)
            } else {
                lo
            }
        }
    })
}

fn error_event(e: &ApiError) -> Bytes {
    let mut out = br#"{"type":"ERROR","object":"#.to_vec();
    out.extend_from_slice(&serde_json::to_vec(&e.body()).unwrap_or_default());
    out.extend_from_slice(b"}\n");
    Bytes::from(out)
}

fn object_event(kind: &str, def: &ResourceDef, obj: &StoredObject, repr: Repr) -> Bytes {
    let mut out = Vec::with_capacity(obj.body.len() + 96);
    write_object_event(&mut out, kind, def, obj, repr);
    Bytes::from(out)
}

/// Appends one watch event line to `out`.
fn write_object_event(
    out: &mut Vec<u8>,
    kind: &str,
    def: &ResourceDef,
    obj: &StoredObject,
    repr: Repr,
) {
    out.extend_from_slice(b"{\"type\":\"");
    out.extend_from_slice(kind.as_bytes());
    out.extend_from_slice(b"\",\"object\":");
    match repr {
        Repr::Metadata => {
            out.extend_from_slice(&serde_json::to_vec(&partial_metadata(obj)).unwrap_or_default())
        }
        Repr::Full | Repr::Table => obj.write_with_type_meta(def, out),
    }
    out.extend_from_slice(b"}\n");
}

fn bookmark_event(def: &ResourceDef, rv: u64, initial_end: bool) -> Bytes {
    let annotations = if initial_end {
        r#","annotations":{"k8s.io/initial-events-end":"true"}"#
    } else {
        ""
    };
    Bytes::from(format!(
        "{{\"type\":\"BOOKMARK\",\"object\":{{\"kind\":\"{}\",\"apiVersion\":\"{}\",\"metadata\":{{\"resourceVersion\":\"{rv}\",\"creationTimestamp\":null{annotations}}}}}}}\n",
        def.kind,
        def.api_version()
    ))
}

/// Why a watch stream stopped sending.
enum End {
    /// A clean end of the response.
    Clean,
    /// The connection is to be cut mid-stream.
    Abort,
}

struct Stream {
    def: Arc<ResourceDef>,
    filter: Filter,
    repr: Repr,
    tx: mpsc::Sender<Chunk>,
    /// The newest resourceVersion of this type seen, matching or not: what bookmarks carry.
    seen_rv: u64,
    /// Whether the type has had an event newer than the watch's start: bookmarks wait for it.
    progressed: bool,
}

impl Stream {
    async fn send(&self, bytes: Bytes) -> Result<(), End> {
        // A send fails when the client went away.
        self.tx
            .send(Ok(Frame::data(bytes)))
            .await
            .map_err(|_| End::Clean)
    }

    async fn change(&mut self, change: &Change) -> Result<(), End> {
        if change.def.id() != self.def.id() {
            return Ok(());
        }
        self.seen_rv = self.seen_rv.max(change.rv);
        self.progressed = true;
        if let Some((kind, obj)) = self.filter.transition(change) {
            self.send(object_event(kind, &self.def, obj, self.repr))
                .await?;
        }
        Ok(())
    }

    async fn bookmark(&self, initial_end: bool) -> Result<(), End> {
        self.send(bookmark_event(&self.def, self.seen_rv, initial_end))
            .await
    }
}

async fn run(
    cluster: Cluster,
    conn: CancellationToken,
    def: Arc<ResourceDef>,
    sub: Subscription,
    filter: Filter,
    opts: Options,
    tx: mpsc::Sender<Chunk>,
) {
    // Subscribed before anything is sent: a fault injected meanwhile is not missed.
    let mut faults = (
        cluster.faults.control.subscribe(),
        cluster.faults.frozen.subscribe(),
    );
    let mut stream = Stream {
        def,
        filter,
        repr: opts.repr,
        tx,
        seen_rv: sub.start_rv,
        progressed: false,
    };
    let Subscription {
        initial,
        backlog,
        mut live,
        ..
    } = sub;
    let end = async {
        stream
            .initial(&cluster, &initial, opts.send_initial)
            .await?;
        for change in &backlog {
            stream.change(change).await?;
        }
        stream
            .follow(&cluster, &conn, (&mut live, &mut faults), &opts)
            .await
    };
    let result: Result<(), End> = end.await;
    if let Err(End::Abort) = result {
        let _ = stream
            .tx
            .send(Err(io::Error::other("watch connection dropped")))
            .await;
    }
}

/// What a watch hears of the cluster's faults: commands (drop, expire, a line to
/// send) and whether its connections are frozen.
type Faults = (
    broadcast::Receiver<WatchControl>,
    tokio::sync::watch::Receiver<bool>,
);

impl Stream {
    /// Sends the `initial` objects that match, as ADDED events in frames of up to
    /// 64 KiB, as the apiserver's writer gathers events while more are waiting;
    /// with `end_bookmark` (a streaming list), the bookmark that ends them, and the
    /// list counted.
    async fn initial(
        &mut self,
        cluster: &Cluster,
        initial: &[Arc<StoredObject>],
        end_bookmark: bool,
    ) -> Result<(), End> {
        // The initial events go out in frames of up to 64 KiB, as the apiserver's
        // writer gathers events while more are waiting.
        const FRAME: usize = 64 << 10;
        let mut frame: Vec<u8> = Vec::with_capacity(FRAME + (8 << 10));
        let mut initial_bytes = 0u64;
        for obj in initial.iter().filter(|o| self.filter.matches(o)) {
            write_object_event(&mut frame, "ADDED", &self.def, obj, self.repr);
            if frame.len() >= FRAME {
                initial_bytes += frame.len() as u64;
                let next = Vec::with_capacity(FRAME + (8 << 10));
                self.send(Bytes::from(std::mem::replace(&mut frame, next)))
                    .await?;
            }
        }
        if end_bookmark {
            frame.extend_from_slice(&bookmark_event(&self.def, self.seen_rv, true));
        }
        if !frame.is_empty() {
            initial_bytes += frame.len() as u64;
            self.send(Bytes::from(frame)).await?;
        }
        if end_bookmark {
            cluster.count_list(ListKind::Streaming, &self.def.id(), 0, initial_bytes);
        }
        Ok(())
    }

    /// Follows the live changes until the watch's timeout (a bookmark first, when
    /// allowed and anything changed) or the connection's end, obeying the cluster's
    /// faults: a frozen connection sends nothing, a dropped one is cut, an expired one
    /// ends with 410, an injected line is sent as it is.
    async fn follow(
        &mut self,
        cluster: &Cluster,
        conn: &CancellationToken,
        (live, (control, frozen)): (&mut broadcast::Receiver<Arc<Change>>, &mut Faults),
        opts: &Options,
    ) -> Result<(), End> {
        let deadline = Instant::now() + opts.timeout;
        let mut ticks = tokio::time::interval_at(
            Instant::now() + opts.bookmark_interval,
            opts.bookmark_interval,
        );
        ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
        loop {
            if *frozen.borrow_and_update() {
                // A frozen connection sends nothing at all, not even its timeout end.
                tokio::select! {
                    _ = conn.cancelled() => return Err(End::Abort),
                    c = control.recv() => if matches!(c, Ok(WatchControl::Drop)) { return Err(End::Abort) },
                    _ = frozen.changed() => {}
                }
                continue;
            }
            tokio::select! {
                // Faults first: a change made after drop_watches() must not reach an old watch.
                biased;
                _ = conn.cancelled() => return Err(End::Abort),
                c = control.recv() => match c {
                    Ok(WatchControl::Drop) => return Err(End::Abort),
                    Ok(WatchControl::Expire) => {
                        let e = ApiError::too_old_rv(self.seen_rv, cluster.store.oldest_resource_version().max(self.seen_rv + 1));
                        self.send(error_event(&e)).await?;
                        return Ok(());
                    }
                    Ok(WatchControl::Line { resource, line }) => {
                        if *resource == self.def.id() {
                            self.send(Bytes::from(format!("{line}\n"))).await?;
                        }
                    }
                    Err(broadcast::error::RecvError::Lagged(_)) => {}
                    Err(broadcast::error::RecvError::Closed) => return Ok(()),
                },
                _ = frozen.changed() => {}
                r = live.recv() => match r {
                    Ok(change) => self.change(&change).await?,
                    // Fell further behind than the cluster buffers: ended, as the apiserver ends a slow watcher.
                    Err(_) => return Ok(()),
                },
                _ = ticks.tick() => if opts.bookmarks && self.progressed { self.bookmark(false).await? },
                _ = tokio::time::sleep_until(deadline) => {
                    if opts.bookmarks && self.progressed {
                        self.bookmark(false).await?;
                    }
                    return Ok(());
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resource::builtin;
    use crate::store::Store;
    use serde_json::json;

    #[test]
    fn transitions_turn_selector_changes_into_adds_and_deletes() {
        let store = Store::new("t", builtin(), 100, 64);
        store
            .create("namespaces", None, json!({"metadata": {"name": "ns"}}))
            .unwrap();
        let mut sub = store.subscribe("configmaps", WatchFrom::Now).unwrap();
        store
            .create(
                "configmaps",
                Some("ns"),
                json!({"metadata": {"name": "a", "labels": {"x": "1"}}}),
            )
            .unwrap();
        store
            .patch(
                "configmaps",
                "ns",
                "a",
                &json!({"metadata": {"labels": {"x": "2"}}}),
            )
            .unwrap();
        store
            .patch(
                "configmaps",
                "ns",
                "a",
                &json!({"metadata": {"labels": {"x": "1"}}}),
            )
            .unwrap();
        store.delete("configmaps", "ns", "a").unwrap();
        let filter = Filter {
            namespace: None,
            labels: LabelSelector::parse("x=1").unwrap(),
            fields: FieldSelector::everything(),
        };
        let mut kinds = Vec::new();
        while let Ok(c) = sub.live.try_recv() {
            kinds.push(filter.transition(&c).map(|(k, _)| k));
        }
        assert_eq!(
            kinds,
            [
                Some("ADDED"),
                Some("DELETED"),
                Some("ADDED"),
                Some("DELETED")
            ]
        );
    }

    #[test]
    fn bookmarks_carry_only_type_and_resource_version() {
        let def = builtin()
            .into_iter()
            .find(|d| d.plural == "configmaps")
            .unwrap();
        let b: serde_json::Value = serde_json::from_slice(&bookmark_event(&def, 7, false)).unwrap();
        assert_eq!(
            b,
            json!({"type": "BOOKMARK", "object": {"kind": "ConfigMap", "apiVersion": "v1", "metadata": {"resourceVersion": "7", "creationTimestamp": null}}})
        );
        let b: serde_json::Value = serde_json::from_slice(&bookmark_event(&def, 7, true)).unwrap();
        assert_eq!(
            b["object"]["metadata"]["annotations"]["k8s.io/initial-events-end"],
            "true"
        );
    }
}
