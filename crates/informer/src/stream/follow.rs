//! A stream's watch side: a streaming list (WatchList) taken in as its events
//! arrive, then the watch followed from its resourceVersion, each event applied,
//! bookmarks reported, until it ends and the informer decides what comes next.

use fleetscope_model::is_resource_version;
use kube::core::Request;

use crate::prune::{EventReader, ObjectEvent, PrunedObject, WatchEvent};

use super::api::*;
use super::*;

impl Informer {
    /// A streaming list: the state as ADDED events up to the bookmark that ends them,
    /// on a watch that then goes on. A server that refuses the request, or sends
    /// anything else before that bookmark (it ignored the request), does not serve
    /// streaming lists.
    pub(super) async fn watch_list(
        &self,
        from: &ListFrom,
        parts: Option<u64>,
    ) -> Result<Listed, ListStop> {
        let mut lines = self.open_watch_list(from).await?;
        let mut events = EventReader::new(&self.id.resource, &self.config.pruning);
        let mut objects = Vec::new();
        let mut drops = Drops::default();
        // Objects sent ahead in parts.
        let mut sent = 0;
        loop {
            let line = self.initial_line(&mut lines).await?;
            let Some(event) = self.event(&mut events, line) else {
                drops.too_large += lines.too_long();
                continue;
            };
            match event {
                WatchEvent::Object {
                    kind: ObjectEvent::Added,
                    object,
                } => {
                    objects.extend(self.kept(object, &mut drops));
                    if let Some(list) = parts
                        && objects.len() >= self.config.list_part
                    {
                        sent += self.send_part(list, &mut objects).await?;
                    }
                }
                WatchEvent::Object { kind, .. } => {
                    return Err(ListStop::Unsupported(format!(
                        "the server sent a {} event before the initial events ended",
                        kind.as_str()
                    )));
                }
                WatchEvent::Other { kind, object } if kind == "BOOKMARK" => {
                    let end = bookmark(object.get())
                        .filter(RawBookmarkMeta::initial_events_end)
                        .map(|b| b.resource_version);
                    let Some(resource_version) = end else {
                        return Err(ListStop::Unsupported(
                            "the server sent a bookmark without k8s.io/initial-events-end before the initial events ended".into(),
                        ));
                    };
                    if !resource_version.is_empty() && !is_resource_version(&resource_version) {
                        return Err(Stop::Failed(format!(
                            "the streaming list ended at resourceVersion {resource_version:?}, not a number"
                        ))
                        .into());
                    }
                    if !self.report(&mut drops).await {
                        return Err(Stop::Cancelled.into());
                    }
                    self.outage.recovered(&self.id.name);
                    return Ok(Listed {
                        count: sent + objects.len(),
                        objects,
                        parts: parts.filter(|_| sent > 0),
                        resource_version,
                        method: SyncMethod::WatchList,
                        watch: Some(lines),
                    });
                }
                WatchEvent::Other { kind, object } if kind == "ERROR" => {
                    return Err(watch_error(object.get(), line).into());
                }
                WatchEvent::Other { kind, .. } => {
                    return Err(ListStop::Unsupported(format!(
                        "the server sent a {kind} event before the initial events ended"
                    )));
                }
            }
        }
    }

    /// The watch a streaming list comes on, opened: one that refuses the parameters
    /// (400, 422) is a server without streaming lists.
    async fn open_watch_list(&self, from: &ListFrom) -> Result<WatchLines, ListStop> {
        let mut wp = self.watch_params();
        wp.send_initial_events = true;
        let version = match from {
            ListFrom::NotOlderThan(rv) => rv.as_str(),
            // Unset: the current state, served from the cache once it has caught up.
            ListFrom::Cache | ListFrom::Consistent | ListFrom::Exact(_) => "",
        };
        let req = Request::new(&self.path)
            .watch(&wp, version)
            .map_err(|e| Stop::Failed(e.to_string()))?;
        match self.open(req).await {
            Ok(lines) => Ok(lines),
            Err(Stop::Invalid(m)) => Err(ListStop::Unsupported(m)),
            Err(stop) => Err(stop.into()),
        }
    }

    /// The next line of a streaming list before its initial events end: silence for
    /// `watch_list_silence`, or the watch ending there, says the server does not
    /// serve streaming lists.
    async fn initial_line<'l>(&self, lines: &'l mut WatchLines) -> Result<&'l str, ListStop> {
        let silence = self.config.watch_list_silence;
        let next = tokio::select! {
            r = tokio::time::timeout(silence, lines.next()) => r,
            _ = self.cancel.cancelled() => return Err(Stop::Cancelled.into()),
        };
        match next {
            Err(_) => Err(ListStop::Unsupported(format!(
                "no initial-events-end bookmark: the server sent nothing for {silence:?} before the initial events ended"
            ))),
            Ok(None) => Err(ListStop::Unsupported(
                "the server ended the watch without the initial-events-end bookmark".into(),
            )),
            Ok(Some(Err(e))) => Err(Stop::Failed(format!("the streaming list broke: {e}")).into()),
            Ok(Some(Ok(line))) => Ok(line),
        }
    }

    /// Sends `objects` ahead as a part of list `list`; how many were sent.
    pub(super) async fn send_part(
        &self,
        list: u64,
        objects: &mut Vec<PrunedObject>,
    ) -> Result<usize, ListStop> {
        let part = std::mem::take(objects);
        let n = part.len();
        let part = Update::ListPart {
            stream: self.id.clone(),
            list,
            objects: part,
        };
        if !self.send(part).await {
            return Err(Stop::Cancelled.into());
        }
        Ok(n)
    }

    /// One watch line read as an event; `None` for a blank line or one that is not a
    /// watch event (logged and skipped).
    pub(super) fn event<'a>(
        &self,
        events: &mut EventReader<'_>,
        line: &'a str,
    ) -> Option<WatchEvent<'a>> {
        if line.trim().is_empty() {
            return None;
        }
        match events.read(line) {
            Ok(e) => Some(e),
            Err(e) => {
                tracing::warn!(cluster = %self.id.cluster, resource = %self.id.resource.name(), error = %e, "skipping a malformed watch event");
                None
            }
        }
    }

    /// An object as kept, or `None` (logged, and counted in `drops` when no API server
    /// sends such) for one that was not: one malformed object is skipped alone,
    /// wherever it arrives.
    pub(super) fn kept(
        &self,
        object: Result<PrunedObject, crate::prune::PruneError>,
        drops: &mut Drops,
    ) -> Option<PrunedObject> {
        let object = object
            .map_err(|e| {
                tracing::warn!(cluster = %self.id.cluster, resource = %self.id.resource.name(), error = %e, "skipping a malformed object");
            })
            .ok()?;
        if object.json.len() > self.config.max_object_bytes {
            drops.too_large += 1;
            tracing::warn!(cluster = %self.id.cluster, resource = %self.id.resource.name(), namespace = %object.namespace, name = %object.name, bytes = object.json.len(), max = self.config.max_object_bytes, "dropping an object larger than the largest object taken (--max-object-bytes)");
            return None;
        }
        if !object.resource_version.is_empty() && !is_resource_version(&object.resource_version) {
            drops.malformed_version += 1;
            tracing::warn!(cluster = %self.id.cluster, resource = %self.id.resource.name(), namespace = %object.namespace, name = %object.name, resource_version = %object.resource_version, "dropping an object whose resourceVersion is not a number");
            return None;
        }
        Some(object)
    }

    /// Whether a watch event at `rv` is behind the stream, which has seen `seen`
    /// (logged and counted): an event's must be past it, a bookmark's at least at it.
    pub(super) fn behind(&self, rv: &str, seen: &str, bookmark: bool, drops: &mut Drops) -> bool {
        let (Ok(rv_n), Ok(seen_n)) = (rv.parse::<u64>(), seen.parse::<u64>()) else {
            return false;
        };
        let behind = if bookmark {
            rv_n < seen_n
        } else {
            rv_n <= seen_n
        };
        if behind {
            drops.backward_version += 1;
            tracing::warn!(cluster = %self.id.cluster, resource = %self.id.resource.name(), resource_version = %rv, seen = %seen, "dropping a watch event behind the stream's resourceVersion");
        }
        behind
    }

    /// Reports what was dropped, if anything; false once the stream is to stop.
    pub(super) async fn report(&self, drops: &mut Drops) -> bool {
        if drops.is_empty() {
            return true;
        }
        let drops = std::mem::take(drops);
        self.send(Update::Dropped {
            stream: self.id.clone(),
            drops,
        })
        .await
    }

    /// Watches from `from` until the stream stops; returns why, and the last
    /// resourceVersion seen (where to resume). With `quiet`, a watch resumed from a
    /// stored resourceVersion: see [`Informer::follow`].
    pub(crate) async fn watch(&self, from: &str, quiet: Option<Duration>) -> (Stop, String) {
        let req = match Request::new(&self.path).watch(&self.watch_params(), from) {
            Ok(r) => r,
            Err(e) => return (Stop::Failed(e.to_string()), from.to_string()),
        };
        match self.open(req).await {
            Ok(lines) => {
                // The watch is accepted: the cluster answers this stream again.
                self.outage.recovered(&self.id.name);
                self.follow(lines, from.to_string(), quiet).await
            }
            Err(stop) => (stop, from.to_string()),
        }
    }

    /// Follows an open watch from `seen` until it stops; returns why, and the last
    /// resourceVersion seen. With `quiet`, a watch resumed from a stored
    /// resourceVersion that sends nothing for that long once its cluster has accepted
    /// it is told as resumed ([`Resumed`]): an API server sends a resourceVersion it
    /// no longer holds back at once (410 Gone) and the changes since it at once, so
    /// a quiet one has neither, and what was restored is the cluster's state. It is
    /// told beside the updates, not through the ingest: it changes nothing held.
    pub(super) async fn follow(
        &self,
        mut lines: WatchLines,
        mut seen: String,
        quiet: Option<Duration>,
    ) -> (Stop, String) {
        let silence = self.config.watch_timeout + self.config.idle_margin;
        let mut quiet = quiet.map(|d| Box::pin(tokio::time::sleep(d)));
        let mut events = EventReader::new(&self.id.resource, &self.config.pruning);
        let mut drops = Drops::default();
        let mut rewatch = self.rewatch.clone();
        if let Some(r) = &mut rewatch {
            r.borrow_and_update();
        }
        loop {
            if !self.report(&mut drops).await {
                return (Stop::Cancelled, seen);
            }
            let next = tokio::select! {
                r = tokio::time::timeout(silence, lines.next()) => r,
                _ = self.cancel.cancelled() => return (Stop::Cancelled, seen),
                _ = asked_to_rewatch(&mut rewatch) => {
                    tracing::debug!(cluster = %self.id.cluster, resource = %self.id.resource.name(), "listing again to confirm the stream current, as asked");
                    return (Stop::Confirm, seen);
                }
                () = until(&mut quiet) => {
                    quiet = None;
                    if let Some(resumed) = &self.resumed {
                        resumed();
                    }
                    continue;
                }
            };
            // Whatever the watch sends settles whether it resumed.
            quiet = None;
            let line = match next {
                Err(_) => {
                    tracing::warn!(cluster = %self.id.cluster, resource = %self.id.resource.name(), "watch silent for {silence:?}: reconnecting");
                    return (Stop::Reconnect, seen);
                }
                Ok(None) => return (Stop::Reconnect, seen),
                Ok(Some(Err(e))) => {
                    return (Stop::Failed(format!("watch stream broke: {e}")), seen);
                }
                Ok(Some(Ok(line))) => line,
            };
            let Some(event) = self.event(&mut events, line) else {
                drops.too_large += lines.too_long();
                continue;
            };
            // Where to resume moves only once the update is handed over.
            let mut next_seen = None;
            let update = match event {
                WatchEvent::Object { kind, object } => match self.kept(object, &mut drops) {
                    Some(object) => {
                        if self.behind(&object.resource_version, &seen, false, &mut drops) {
                            continue;
                        }
                        if !object.resource_version.is_empty() {
                            next_seen = Some(object.resource_version.clone());
                        }
                        if kind == ObjectEvent::Deleted {
                            Update::Deleted {
                                stream: self.id.clone(),
                                object,
                            }
                        } else {
                            Update::Applied {
                                stream: self.id.clone(),
                                object,
                                created: kind == ObjectEvent::Added,
                            }
                        }
                    }
                    None => continue,
                },
                WatchEvent::Other { kind, object } if kind == "BOOKMARK" => {
                    let Some(b) = bookmark(object.get()) else {
                        continue;
                    };
                    if !is_resource_version(&b.resource_version) {
                        drops.malformed_version += 1;
                        tracing::warn!(cluster = %self.id.cluster, resource = %self.id.resource.name(), resource_version = %b.resource_version, "dropping a bookmark whose resourceVersion is not a number");
                        continue;
                    }
                    if self.behind(&b.resource_version, &seen, true, &mut drops) {
                        continue;
                    }
                    next_seen = Some(b.resource_version.clone());
                    Update::Progress {
                        stream: self.id.clone(),
                        resource_version: b.resource_version,
                    }
                }
                WatchEvent::Other { kind, object } if kind == "ERROR" => {
                    return (watch_error(object.get(), line), seen);
                }
                WatchEvent::Other { kind, .. } => {
                    tracing::warn!(cluster = %self.id.cluster, resource = %self.id.resource.name(), kind = %kind, "skipping a watch event of unknown type");
                    continue;
                }
            };
            if !self.send(update).await {
                return (Stop::Cancelled, seen);
            }
            if let Some(rv) = next_seen {
                seen = rv;
            }
        }
    }
}

/// Ends when `quiet` has passed; never when there is none.
async fn until(quiet: &mut Option<std::pin::Pin<Box<tokio::time::Sleep>>>) {
    match quiet {
        Some(sleep) => sleep.as_mut().await,
        None => std::future::pending().await,
    }
}
