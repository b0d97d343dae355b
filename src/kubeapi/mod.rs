//! The Kubernetes API over the fleet: a second front end over the [`Fleet`] seam,
//! beside gRPC, so that kubectl, client-go and kube-rs read the whole fleet unchanged
//! (on `serve` and through a `router` alike). Paths follow kcp ([`path`]); discovery
//! lists the collected types with the verbs `get`, `list` and `watch`; a
//! `resourceVersion` is fleetscope's own revision, so a watch resumes across restarts
//! and `410 Gone` means the position is no longer held (list again). Callers are
//! admitted by the same guard as gRPC's (certificates, tokens, the policy) and every
//! answer goes through the seam, so a caller sees only what it is granted. Writes are
//! `405 MethodNotAllowed` ([`status`]). This room turns requests into the seam's and
//! answers into the API's; the listener and its TLS are the server's.

pub mod discovery;
mod events;
pub mod form;
pub mod names;
pub mod path;
pub mod routed;
pub mod splice;
pub mod status;
pub mod table;

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::sync::Arc;

use bytes::Bytes;
use fleetscope_auth::Guard;
use fleetscope_auth::peer::PeerInfo;
use fleetscope_grpc::token::{TokenKey, seal, unseal};
use fleetscope_grpc::{FleetService, Revocation, Subscribers};
use fleetscope_model::fleet::{
    ClustersAnswer, FleetObject, Freshness, GetRequest, ListRequest, Projection, Query,
    ResourceTypeInfo, WatchRequest,
};
use fleetscope_model::{
    Access, ClusterFilter, ClusterName, FieldSelector, Fleet, FleetError, LabelSelector, ObjectKey,
    Revision,
};
use futures::StreamExt as _;
use http::{Method, Response, StatusCode, header};
use http_body_util::{BodyExt as _, Full, StreamBody, combinators::UnsyncBoxBody};
use serde_json::{Value, json};

use events::{Render, gone, until_revoked};
use form::Form;
use path::{Resource, Route, Scope};
use routed::{Position, Positions};
use status::Refusal;

/// The annotation naming an object's cluster in the fleet's answers.
pub const CLUSTER_ANNOTATION: &str = "fleetscope.io/cluster";

/// A response body: whole, or a stream (a watch's, a list's through a router) that an
/// error cuts short.
pub type Body = UnsyncBoxBody<Bytes, routed::BodyError>;

/// The most objects in one page when a client asks for more (or for none).
const MAX_PAGE: usize = 10_000;

/// The most bytes of objects one page holds.
const MAX_PAGE_BYTES: usize = 32 << 20;

/// The Kubernetes API front end over a fleet.
pub struct KubeApi<F> {
    fleet: Arc<F>,
    guard: Arc<Guard>,
    token_key: Arc<TokenKey>,
    /// The Watch streams open, shared with the gRPC front end: one caller's limit
    /// counts both.
    subscribers: Arc<Subscribers>,
    max_watches_per_caller: usize,
    /// What a `resourceVersion` is: a server's revision or a router's position.
    positions: Positions,
}

impl<F: Fleet + 'static> KubeApi<F> {
    /// The front end over `fleet` beside the gRPC service `grpc` (whose page token
    /// key signs `continue` tokens, and whose per-caller Watch limit it shares),
    /// admitting callers with `guard`, its `resourceVersion`s the fleet's `positions`.
    pub fn new<G: Fleet>(
        fleet: Arc<F>,
        guard: Arc<Guard>,
        grpc: &FleetService<G>,
        positions: Positions,
    ) -> Self {
        Self {
            fleet,
            guard,
            token_key: Arc::new(grpc.config().token_key.clone()),
            subscribers: grpc.subscribers(),
            max_watches_per_caller: grpc.config().max_watches_per_caller,
            positions,
        }
    }

    /// Answers one request from the caller at `peer`.
    pub async fn handle<B>(
        &self,
        request: http::Request<B>,
        peer: Option<&PeerInfo>,
    ) -> Response<Body> {
        match self.answer(&request, peer).await {
            Ok(r) => r,
            Err(refusal) => refusal_response(&refusal),
        }
    }

    async fn answer<B>(
        &self,
        request: &http::Request<B>,
        peer: Option<&PeerInfo>,
    ) -> Result<Response<Body>, Refusal> {
        let path = request.uri().path();
        let (scope, route) = path::route(path).map_err(|_| {
            Refusal::new(
                404,
                "NotFound",
                format!("the server could not find the requested resource ({path})"),
            )
        })?;
        let admitted = self
            .guard
            .admit(path, request.headers(), peer)
            .await
            .map_err(|s| status::refused(&s))?;
        let Some(admitted) = admitted else {
            return Err(Refusal::new(403, "Forbidden", "not served"));
        };
        // The connection's peer proved who it is: it keeps its place (as gRPC's do).
        if let Some(streams) = peer.and_then(|p| p.streams.as_ref()) {
            streams.authenticated();
        }
        let (access, revocation) = admitted.held_to(&self.guard);
        let cluster = match &scope {
            Scope::Cluster(c) => Some(c.as_str()),
            Scope::Fleet => None,
        };
        if request.method() != Method::GET && request.method() != Method::HEAD {
            return Err(Refusal::read_only(request.method().as_str(), cluster));
        }
        let params = Params::of(request.uri().query().unwrap_or(""));
        let form = form::of(
            request
                .headers()
                .get(header::ACCEPT)
                .and_then(|v| v.to_str().ok()),
        );
        if let Scope::Cluster(c) = &scope {
            self.known(c, &access).await?;
        }
        match route {
            Route::Version
            | Route::CoreVersions
            | Route::Groups
            | Route::Group(_)
            | Route::Resources { .. } => self.discovery(route, &access, form).await,
            Route::OpenApi => Err(Refusal::no_schema(cluster)),
            Route::Subresource { name } => Err(Refusal::new(
                404,
                "NotFound",
                format!("the subresource {name} is not served: fleetscope serves the objects only"),
            )),
            Route::Object {
                resource,
                namespace,
                name,
            } => {
                let (cluster, name) = match cluster {
                    Some(c) => (c.to_string(), name.as_str()),
                    None => self.in_fleet(&resource, &name, &access).await?,
                };
                let at = (cluster.as_str(), namespace.as_deref(), name);
                self.get(&resource, at, &access, (form, fleet_view(&scope)))
                    .await
            }
            Route::Collection {
                resource,
                namespace,
            } => {
                let mut query = query(&resource, &scope, namespace.as_deref(), &params)?;
                if fleet_view(&scope) && !query.fields.is_empty() {
                    let clusters = self
                        .cluster_names(ClusterFilter::default(), &access)
                        .await?;
                    let (fields, cluster) = names::field_selector(&query.fields, &clusters)
                        .map_err(Refusal::bad_request)?;
                    query.fields = fields;
                    if let Some(c) = cluster {
                        query.clusters = query.clusters.only(&[c.to_string()]);
                    }
                }
                let how = How {
                    scope: &scope,
                    access: &access,
                    params: &params,
                    form,
                    revocation: &revocation,
                };
                if params.flag("watch") {
                    self.watch(&resource, query, &how).await
                } else {
                    self.list(&resource, query, &how).await
                }
            }
        }
    }

    /// Discovery: the version, the groups and their versions, a group version's
    /// resources (the collected types the caller may see).
    async fn discovery(
        &self,
        route: Route,
        access: &Access,
        form: Form,
    ) -> Result<Response<Body>, Refusal> {
        if let (Form::Discovery(v), Route::CoreVersions | Route::Groups) = (form, &route) {
            let core = route == Route::CoreVersions;
            let body = discovery::aggregated(&self.types(access).await?, core, v);
            return Ok(typed_response(&body, discovery::aggregated_content_type(v)));
        }
        let body = match route {
            Route::Version => discovery::version(),
            Route::CoreVersions => json!({
                "kind": "APIVersions",
                "versions": ["v1"],
                "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": ""}],
            }),
            Route::Groups => discovery::groups(&self.types(access).await?),
            Route::Group(g) => {
                let all = discovery::groups(&self.types(access).await?);
                let found = all["groups"]
                    .as_array()
                    .and_then(|gs| gs.iter().find(|x| x["name"] == g.as_str()).cloned());
                let Some(mut group) = found else {
                    return Err(Refusal::not_found(
                        "",
                        &g,
                        "",
                        format!("the server could not find the requested resource (group {g})"),
                    ));
                };
                group["kind"] = json!("APIGroup");
                group["apiVersion"] = json!("v1");
                group
            }
            Route::Resources { group, version } => {
                discovery::resources(&self.types(access).await?, &group, &version)
            }
            _ => return Err(Refusal::new(404, "NotFound", "not discovery")),
        };
        Ok(json_response(&body))
    }

    /// Refuses a cluster the fleet does not have, naming it.
    async fn known(&self, cluster: &str, access: &Access) -> Result<(), Refusal> {
        let filter = ClusterFilter::default().only(&[cluster.to_string()]);
        let clusters = self.cluster_names(filter, access).await?;
        if clusters.iter().any(|c| c.as_str() == cluster) {
            Ok(())
        } else {
            Err(Refusal::not_found(
                "clusters",
                "fleetscope.io",
                cluster,
                format!(
                    "cluster {cluster:?} not found: it is not in fleetscope's fleet (GET /clusters/*/api/v1/namespaces lists the fleet)"
                ),
            ))
        }
    }

    /// The cluster and the cluster's own name of the fleet's name `name` of a `resource`.
    async fn in_fleet<'n>(
        &self,
        resource: &Resource,
        name: &'n str,
        access: &Access,
    ) -> Result<(String, &'n str), Refusal> {
        let clusters = self.cluster_names(ClusterFilter::default(), access).await?;
        let Some((c, bare)) = names::split(name, &clusters) else {
            return Err(Refusal::not_found(
                &resource.plural,
                &resource.group,
                name,
                format!(
                    "{} {name:?} not found: in the fleet's view a name carries its cluster, CLUSTER{}NAME (as the fleet's lists show it), or read it at /clusters/CLUSTER",
                    resource.plural,
                    names::SEPARATOR
                ),
            ));
        };
        Ok((c.to_string(), bare))
    }

    /// The names of the clusters `filter` selects that the caller may see.
    async fn cluster_names(
        &self,
        filter: ClusterFilter,
        access: &Access,
    ) -> Result<Vec<ClusterName>, Refusal> {
        let ClustersAnswer { clusters, .. } = self
            .fleet
            .clusters(filter, access)
            .await
            .map_err(|e| status::of(&e))?;
        Ok(clusters.into_iter().map(|c| c.name).collect())
    }

    /// The kind of `resource`, as discovery names it (empty when not collected).
    async fn kind(&self, resource: &Resource, access: &Access) -> String {
        self.types(access)
            .await
            .unwrap_or_default()
            .into_iter()
            .map(|t| t.resource)
            .find(|t| t.group == resource.group && t.plural == resource.plural)
            .map(|t| t.kind)
            .unwrap_or_default()
    }

    /// The collected types the caller may see.
    async fn types(&self, access: &Access) -> Result<Vec<ResourceTypeInfo>, Refusal> {
        self.fleet
            .resource_types(access)
            .await
            .map_err(|e| status::of(&e))
    }

    async fn get(
        &self,
        resource: &Resource,
        (cluster, namespace, name): (&str, Option<&str>, &str),
        access: &Access,
        (form, fleet): (Form, bool),
    ) -> Result<Response<Body>, Refusal> {
        let mut r = GetRequest::for_caller(access.clone());
        r.resource = resource_name(resource);
        r.cluster = cluster.to_string();
        r.namespace = namespace.unwrap_or_default().to_string();
        r.name = name.to_string();
        r.projection = Projection::Full;
        match self.fleet.get(r).await {
            Ok(answer) => {
                let object = object_json(&answer.object, fleet);
                if form == Form::Metadata {
                    Ok(json_response(&form::metadata(&object)))
                } else if form == Form::Table {
                    let metadata = json!({"resourceVersion": answer.revision.0.to_string()});
                    let t = table::of(
                        &resource_name(resource),
                        &[(cluster, object)],
                        fleet,
                        metadata,
                    );
                    Ok(typed_response(&t, table::CONTENT_TYPE))
                } else {
                    Ok(json_response(&object))
                }
            }
            Err(FleetError::NotFound(m)) => Err(Refusal::not_found(
                &resource.plural,
                &resource.group,
                name,
                format!(
                    "{} {name:?} not found in cluster {cluster}: {m}",
                    resource.plural
                ),
            )),
            Err(e) => Err(status::of(&e)),
        }
    }

    async fn list(
        &self,
        resource: &Resource,
        query: Query,
        how: &How<'_>,
    ) -> Result<Response<Body>, Refusal> {
        let How {
            scope,
            access,
            params,
            ..
        } = *how;
        if self.positions == Positions::Tokens {
            let mut r = WatchRequest::for_caller(access.clone());
            r.query = query;
            r.projection = Projection::Full;
            r.initial = true;
            r.report_positions = true;
            let watch = self.fleet.watch(r).await.map_err(|e| status::of(&e))?;
            let (writing, content_type) = self.writing(resource, how, None).await;
            let body = routed::list(watch, writing).await?;
            return Ok(stream_response(body, content_type));
        }
        let caller = access.caller();
        let mut r = ListRequest::for_caller(access.clone());
        let fingerprint = format!("{}|{:?}", params.fingerprint(), scope);
        r.query = query;
        r.projection = Projection::Full;
        r.limit = params
            .get("limit")
            .and_then(|l| l.parse::<usize>().ok())
            .filter(|l| *l > 0)
            .map_or(MAX_PAGE, |l| l.min(MAX_PAGE));
        r.max_bytes = MAX_PAGE_BYTES;
        if let Some(token) = params.get("continue").filter(|t| !t.is_empty()) {
            let c = Continue::open(&self.token_key, &caller, token, &fingerprint)?;
            r.after = Some((Revision(c.revision), c.after));
            r.resume = c.resume;
        }
        let continued = r.after.as_ref().map(|(_, after)| after.clone());
        let first_page = (r.query.clone(), r.access.clone());
        let answer = match self.fleet.list(r).await {
            Ok(answer) => answer,
            Err(e @ FleetError::OutOfRange { reason, .. })
                if reason == fleetscope_model::fleet::reason::PAGE_SNAPSHOT_RELEASED =>
            {
                let mut expired = status::of(&e);
                // As an API server does: a token to go on from the same place in the
                // current snapshot (inconsistently), beside the 410.
                if let Some(after) = continued
                    && let Some(token) = self.go_on(first_page, after, &caller, &fingerprint).await
                {
                    expired.status["metadata"] = json!({"continue": token});
                }
                return Err(expired);
            }
            Err(e) => return Err(status::of(&e)),
        };
        if continued.is_none() {
            at_the_version_asked(params, answer.revision)?;
        }
        let mut metadata = json!({"resourceVersion": answer.revision.0.to_string()});
        if let Some(after) = &answer.next {
            metadata["continue"] = json!(
                Continue {
                    revision: answer.revision.0,
                    after: after.clone(),
                    resume: answer.resume.clone(),
                }
                .seal(&self.token_key, &caller, &fingerprint)
            );
            metadata["remainingItemCount"] = json!(answer.remaining);
        }
        // Clusters left out, as an API server warns (kubectl prints it).
        let partial: Vec<&str> = answer
            .clusters
            .iter()
            .filter(|c| c.freshness != Freshness::Synced)
            .map(|c| c.cluster.as_str())
            .collect();
        let warning = (answer.partial && !partial.is_empty()).then(|| {
            format!(
                "299 - \"fleetscope: not synced, their objects may be missing or stale: {}\"",
                partial.join(", ")
            )
        });
        Ok(self
            .list_response(resource, &answer.items, metadata, how, warning)
            .await)
    }

    /// How a list is written in the form asked for (`kind` when the objects already
    /// named it), and its content type.
    async fn writing(
        &self,
        resource: &Resource,
        how: &How<'_>,
        kind: Option<String>,
    ) -> (form::Writing, &'static str) {
        let annotate = fleet_view(how.scope);
        match how.form {
            Form::Table => {
                let rows = table::Rows::new(&resource_name(resource), annotate);
                let head = rows.head();
                let item = move |o: &FleetObject| {
                    let object = object_json(o, annotate);
                    rows.row(o.key.cluster.as_str(), &object).to_string()
                };
                let item = Box::new(item);
                (form::Writing { head, item }, table::CONTENT_TYPE)
            }
            Form::Metadata => {
                let writing = form::Writing::metadata(move |o| object_json(o, annotate));
                (writing, "application/json")
            }
            Form::Object | Form::Discovery(_) => {
                let kind = match kind {
                    Some(kind) => kind,
                    None => self.kind(resource, how.access).await,
                };
                // The objects' text as held, spliced where the view changes it.
                let item = move |o: &FleetObject| object_text(o, annotate, None);
                let list = format!("{kind}List");
                let writing = form::Writing::items(&list, &api_version(resource), item);
                (writing, "application/json")
            }
        }
    }

    /// A `continue` token that goes on after `after` in the current snapshot (pinned by
    /// a first page of one object, if more than one object matches).
    async fn go_on(
        &self,
        (query, access): (Query, Access),
        after: ObjectKey,
        caller: &str,
        fingerprint: &str,
    ) -> Option<String> {
        let mut r = ListRequest::for_caller(access);
        r.query = query;
        r.projection = Projection::Metadata;
        r.limit = 1;
        r.max_bytes = MAX_PAGE_BYTES;
        let pinned = self.fleet.list(r).await.ok()?;
        pinned.next.as_ref()?;
        let c = Continue {
            revision: pinned.revision.0,
            after,
            resume: Vec::new(),
        };
        Some(c.seal(&self.token_key, caller, fingerprint))
    }

    /// A list's answer of `objects` with the list's `metadata`, in the form asked for,
    /// with a `Warning` header if given.
    async fn list_response(
        &self,
        resource: &Resource,
        objects: &[FleetObject],
        metadata: Value,
        how: &How<'_>,
        warning: Option<String>,
    ) -> Response<Body> {
        let mut response = self.list_body(resource, metadata, how, objects).await;
        if let Some(w) = warning.and_then(|w| header::HeaderValue::from_str(&w).ok()) {
            response.headers_mut().insert(header::WARNING, w);
        }
        response
    }

    async fn list_body(
        &self,
        resource: &Resource,
        metadata: Value,
        how: &How<'_>,
        objects: &[FleetObject],
    ) -> Response<Body> {
        let kind = objects.first().and_then(|o| kind_in(&o.json));
        let (writing, content_type) = self.writing(resource, how, kind).await;
        text_response(writing.whole(objects, &metadata), content_type)
    }

    async fn watch(
        &self,
        resource: &Resource,
        query: Query,
        how: &How<'_>,
    ) -> Result<Response<Body>, Refusal> {
        let How {
            scope,
            access,
            params,
            form,
            revocation,
        } = *how;
        // The caller's place among its Watch streams (gRPC's too), held while it runs.
        let place = self
            .subscribers
            .admit(&access.caller(), self.max_watches_per_caller)
            .await
            .ok_or_else(|| {
                Refusal::new(
                    429,
                    "TooManyRequests",
                    format!(
                        "{} has {} watches open, the most one caller may: end one first",
                        access.subject().user,
                        self.max_watches_per_caller
                    ),
                )
            })?;
        let mut r = WatchRequest::for_caller(access.clone());
        r.query = query;
        r.projection = Projection::Full;
        let routed = self.positions == Positions::Tokens;
        match from_where(&mut r, params, routed) {
            Ok(()) => {}
            // As an API server says a position it no longer holds: inside the watch.
            Err(refusal) if refusal.code == 410 => return Ok(ended_at_once(refusal.status)),
            Err(refusal) => return Err(refusal),
        }
        let watch = match self.fleet.watch(r).await {
            Ok(w) => w,
            // A position no longer held: as an API server says it, inside the watch.
            Err(FleetError::OutOfRange { message, .. }) => {
                return Ok(ended_at_once(gone(&message)));
            }
            Err(e) => return Err(status::of(&e)),
        };
        let mut render = Render {
            position: routed.then(Position::default),
            ended: false,
            annotate: fleet_view(scope),
            bookmarks: params.flag("allowWatchBookmarks"),
            kind: self.kind(resource, access).await,
            api: api_version(resource),
            canonical: resource_name(resource),
            form,
        };
        let timeout = params
            .get("timeoutSeconds")
            .and_then(|t| t.parse::<u64>().ok())
            .map(std::time::Duration::from_secs);
        // An event that ends the watch (a router's reset) is the last.
        let events = watch
            .scan((), move |(), e| {
                let out = (!render.ended).then(|| render.event(e));
                futures::future::ready(out)
            })
            .filter_map(futures::future::ready);
        let events = match timeout {
            Some(t) => events.take_until(tokio::time::sleep(t)).boxed(),
            None => events.boxed(),
        };
        Ok(watch_response(until_revoked(
            events,
            revocation.revoked(),
            place,
        )))
    }
}

/// Whether a list answered at `revision` is what `resourceVersion` and
/// `resourceVersionMatch` ask: any for `""` and `"0"`; for a revision, one not older
/// (`NotOlderThan`, the default) or that one (`Exact`), as an API server answers them.
fn at_the_version_asked(params: &Params, revision: Revision) -> Result<(), Refusal> {
    let rv = params.get("resourceVersion").unwrap_or("");
    if rv.is_empty() || rv == "0" {
        return Ok(());
    }
    let Ok(asked) = rv.parse::<u64>() else {
        return Err(Refusal::bad_request(format!(
            "resourceVersion {rv:?} is not one fleetscope issued: pass back a list's or an event's metadata.resourceVersion"
        )));
    };
    let current = revision.0;
    match params.get("resourceVersionMatch").unwrap_or("NotOlderThan") {
        "NotOlderThan" | "" if asked <= current => Ok(()),
        "NotOlderThan" | "" => {
            let mut r = Refusal::new(
                504,
                "Timeout",
                format!("Too large resource version: {asked}, current: {current}"),
            );
            // What client-go's reflector looks for to list again from "".
            r.status["details"] = json!({"causes": [{"reason": "ResourceVersionTooLarge", "message": "Too large resource version"}], "retryAfterSeconds": 1});
            Err(r)
        }
        "Exact" if asked == current => Ok(()),
        "Exact" => Err(Refusal::new(
            410,
            "Expired",
            format!(
                "too old resource version: {asked} ({current}): fleetscope lists at its current revision; list with resourceVersionMatch=NotOlderThan"
            ),
        )),
        other => Err(Refusal::bad_request(format!(
            "resourceVersionMatch {other:?}: expected Exact or NotOlderThan"
        ))),
    }
}

/// Where a watch `r` starts, from the request's `resourceVersion` and
/// `sendInitialEvents`: a server's revision, or (`routed`) a router's position.
fn from_where(r: &mut WatchRequest, params: &Params, routed: bool) -> Result<(), Refusal> {
    r.report_positions = routed;
    match params.get("resourceVersion").unwrap_or("") {
        "" | "0" => r.initial = true,
        rv if routed => {
            let p = Position::decode(rv).ok_or_else(|| routed::not_a_position(rv))?;
            r.resume = Some(p.resume());
        }
        rv => {
            let revision = rv.parse::<u64>().map_err(|_| {
                Refusal::bad_request(format!(
                    "resourceVersion {rv:?} is not one fleetscope issued: pass back a list's or an event's metadata.resourceVersion"
                ))
            })?;
            r.since = Some(Revision(revision));
            r.initial = params.flag("sendInitialEvents");
        }
    }
    Ok(())
}

/// How a collection is read: where, by whom, with which parameters, as a Table or not.
#[derive(Clone, Copy)]
struct How<'a> {
    scope: &'a Scope,
    access: &'a Access,
    params: &'a Params,
    form: Form,
    /// What ends a watch once the caller's credential is no longer valid.
    revocation: &'a Revocation,
}

/// A `continue` token: where the list goes on, signed for its caller and its query.
struct Continue {
    revision: u64,
    after: ObjectKey,
    resume: Vec<u8>,
}

impl Continue {
    fn seal(&self, key: &TokenKey, caller: &str, fingerprint: &str) -> String {
        let payload = json!({
            "r": self.revision,
            "a": [self.after.resource.to_string(), self.after.cluster.to_string(), self.after.namespace.to_string(), self.after.name.to_string()],
            "p": self.resume,
            "q": fingerprint,
        });
        seal(key, caller, payload.to_string().as_bytes())
    }

    fn open(key: &TokenKey, caller: &str, token: &str, fingerprint: &str) -> Result<Self, Refusal> {
        let bad = || {
            Refusal::bad_request(
                "continue: not a token this server issued to this caller for this list: pass back metadata.continue unchanged, with the same selectors",
            )
        };
        let payload = unseal(key, caller, token).ok_or_else(bad)?;
        let v: Value = serde_json::from_slice(&payload).map_err(|_| bad())?;
        if v["q"] != fingerprint {
            return Err(bad());
        }
        let a: Vec<String> = serde_json::from_value(v["a"].clone()).map_err(|_| bad())?;
        let [resource, cluster, namespace, name] = <[String; 4]>::try_from(a).map_err(|_| bad())?;
        Ok(Self {
            revision: v["r"].as_u64().ok_or_else(bad)?,
            after: ObjectKey::new(
                &resource,
                &fleetscope_model::ClusterName::from(cluster.as_str()),
                &namespace,
                &name,
            ),
            resume: serde_json::from_value(v["p"].clone()).map_err(|_| bad())?,
        })
    }
}

/// A request's query parameters.
struct Params(BTreeMap<String, String>);

impl Params {
    fn of(query: &str) -> Self {
        Self(
            form_urlencoded::parse(query.as_bytes())
                .into_owned()
                .collect(),
        )
    }

    fn get(&self, name: &str) -> Option<&str> {
        self.0.get(name).map(String::as_str)
    }

    fn flag(&self, name: &str) -> bool {
        matches!(self.get(name), Some("true" | "1"))
    }

    /// What selects a list's objects, so that a `continue` token is taken back only
    /// with the same.
    fn fingerprint(&self) -> String {
        ["labelSelector", "fieldSelector"]
            .iter()
            .map(|k| self.get(k).unwrap_or(""))
            .collect::<Vec<_>>()
            .join("|")
    }
}

/// The seam's query for a collection of `resource` in `scope`.
fn query(
    resource: &Resource,
    scope: &Scope,
    namespace: Option<&str>,
    params: &Params,
) -> Result<Query, Refusal> {
    let mut q = Query {
        resource: resource_name(resource),
        ..Query::default()
    };
    if let Scope::Cluster(c) = scope {
        q.clusters = ClusterFilter::default().only(std::slice::from_ref(c));
    }
    if let Some(ns) = namespace {
        q.namespaces = vec![ns.to_string()];
    }
    if let Some(s) = params.get("labelSelector") {
        q.labels = LabelSelector::parse(s).map_err(|e| {
            Refusal::bad_request(format!(
                "unable to parse requirement: labelSelector {s:?}: {e}"
            ))
        })?;
    }
    if let Some(s) = params.get("fieldSelector") {
        q.fields = FieldSelector::parse(s)
            .map_err(|e| Refusal::bad_request(format!("fieldSelector {s:?}: {e}")))?;
    }
    Ok(q)
}

/// The seam's name of `resource`: `plural` or `plural.group`.
fn resource_name(resource: &Resource) -> String {
    if resource.group.is_empty() {
        resource.plural.clone()
    } else {
        format!("{}.{}", resource.plural, resource.group)
    }
}

/// `group/version`, or `v1` for the core group.
fn api_version(resource: &Resource) -> String {
    if resource.group.is_empty() {
        resource.version.clone()
    } else {
        format!("{}/{}", resource.group, resource.version)
    }
}

/// The kind an object's JSON names.
fn kind_in(json: &str) -> Option<String> {
    let v: Value = serde_json::from_str(json).ok()?;
    v["kind"].as_str().map(str::to_string)
}

/// An object's text as the API returns it (see [`object_json`]), with
/// `resource_version` as its `metadata.resourceVersion` when given: spliced, not
/// parsed ([`splice`]).
fn object_text(o: &FleetObject, annotate: bool, resource_version: Option<&str>) -> String {
    let name = annotate.then(|| names::qualified(o.key.cluster.as_str(), &o.key.name));
    let edit = splice::Edit {
        name: name.as_deref(),
        resource_version,
        annotation: annotate.then(|| (CLUSTER_ANNOTATION, o.key.cluster.as_str())),
    };
    if edit.name.is_none() && edit.resource_version.is_none() {
        return o.json.to_string();
    }
    splice::edit(&o.json, &edit).unwrap_or_else(|| {
        let mut v = object_json(o, annotate);
        if let Some(rv) = resource_version {
            v["metadata"]["resourceVersion"] = json!(rv);
        }
        v.to_string()
    })
}

/// Whether `scope` is the fleet's view (objects annotated, names qualified).
fn fleet_view(scope: &Scope) -> bool {
    *scope == Scope::Fleet
}

/// An object as the API returns it: its JSON; in the fleet's answers annotated with
/// its cluster and named `CLUSTER:NAME` ([`names`]).
fn object_json(o: &FleetObject, annotate: bool) -> Value {
    let mut v: Value = serde_json::from_str(&o.json).unwrap_or(Value::Null);
    if annotate && let Some(meta) = v.get_mut("metadata").and_then(Value::as_object_mut) {
        let name = names::qualified(o.key.cluster.as_str(), &o.key.name);
        meta.insert("name".into(), json!(name));
        let annotations = meta.entry("annotations").or_insert_with(|| json!({}));
        if let Some(a) = annotations.as_object_mut() {
            a.insert(CLUSTER_ANNOTATION.into(), json!(o.key.cluster.as_str()));
        }
    }
    v
}

fn line(v: &Value) -> Bytes {
    let mut text = v.to_string();
    text.push('\n');
    Bytes::from(text)
}

fn json_response(v: &Value) -> Response<Body> {
    typed_response(v, "application/json")
}

fn typed_response(v: &Value, content_type: &'static str) -> Response<Body> {
    text_response(v.to_string(), content_type)
}

fn text_response(text: String, content_type: &'static str) -> Response<Body> {
    let body = Full::new(Bytes::from(text)).map_err(|never: Infallible| match never {});
    let mut r = Response::new(body.boxed_unsync());
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static(content_type),
    );
    r
}

/// A watch that ends at once with `status` as an `ERROR` event, as an API server says
/// a position it does not hold.
fn ended_at_once(status: Value) -> Response<Body> {
    let error = line(&json!({"type": "ERROR", "object": status}));
    watch_response(futures::stream::once(async move { error }).boxed())
}

fn watch_response(events: futures::stream::BoxStream<'static, Bytes>) -> Response<Body> {
    stream_response(events.map(Ok).boxed(), "application/json")
}

/// A response whose body is written as `chunks` come; an error among them cuts it
/// short (the client sees the answer end early).
fn stream_response(
    chunks: futures::stream::BoxStream<'static, Result<Bytes, routed::BodyError>>,
    content_type: &'static str,
) -> Response<Body> {
    let body = StreamBody::new(chunks.map(|c| c.map(http_body::Frame::data)));
    let mut r = Response::new(http_body_util::BodyExt::boxed_unsync(body));
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static(content_type),
    );
    r
}

fn refusal_response(refusal: &Refusal) -> Response<Body> {
    let mut r = json_response(&refusal.status);
    *r.status_mut() =
        StatusCode::from_u16(refusal.code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    if let Some(after) = refusal.retry_after
        && let Ok(v) = header::HeaderValue::from_str(&after.to_string())
    {
        r.headers_mut().insert(header::RETRY_AFTER, v);
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;
    use fleetscope_model::ClusterName;

    #[test]
    fn a_list_s_resource_version_is_read_as_an_api_server_reads_it() {
        let at = |q: &str| at_the_version_asked(&Params::of(q), Revision(10)).map_err(|r| r.code);
        assert_eq!(at(""), Ok(()));
        assert_eq!(at("resourceVersion=0"), Ok(()));
        assert_eq!(at("resourceVersion=7"), Ok(()));
        assert_eq!(at("resourceVersion=10&resourceVersionMatch=Exact"), Ok(()));
        assert_eq!(at("resourceVersion=7&resourceVersionMatch=Exact"), Err(410));
        assert_eq!(at("resourceVersion=11"), Err(504));
        assert_eq!(at("resourceVersion=x"), Err(400));
        assert_eq!(
            at("resourceVersion=7&resourceVersionMatch=Sometime"),
            Err(400)
        );
    }

    #[test]
    fn a_continue_token_goes_on_only_for_its_caller_and_its_selectors() {
        let key = TokenKey::new(&[9; 32]);
        let c = Continue {
            revision: 42,
            after: ObjectKey::new("pods", &ClusterName::from("a"), "ns", "p"),
            resume: vec![1, 2],
        };
        let token = c.seal(&key, "me", "app=web|");
        let back = Continue::open(&key, "me", &token, "app=web|").unwrap();
        assert_eq!(
            (back.revision, back.after, back.resume),
            (42, c.after.clone(), vec![1, 2])
        );
        for (caller, fingerprint, token) in [
            ("you", "app=web|", token.as_str()),
            ("me", "app=api|", token.as_str()),
            ("me", "app=web|", "garbage"),
        ] {
            let refused = Continue::open(&key, caller, token, fingerprint)
                .err()
                .unwrap();
            assert_eq!(refused.code, 400);
        }
    }
}
