//! One cluster: its client, its discovery, and one stream per collected type, kept in
//! step with what the cluster serves and with its source's settings.
//!
//! [`run`] follows a `watch` of the cluster's [`ClusterSource`]: new settings (a
//! changed server or credential) reconnect the cluster and resume every stream from
//! the resourceVersion it had reached, without a LIST; the sender dropped means the
//! cluster left the fleet, and its streams stop before [`Update::ClusterGone`] is sent.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use fleetscope_model::{ClusterName, ResourceType};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::Instrument;

use crate::discovery::{self, Served};
use crate::requests::RequestCounts;
use crate::source::{self, ClusterSource};
use crate::stream::{self, Backoff, StreamConfig, StreamId, Update};

/// What of one resource type to collect, narrower than the default.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Scope {
    /// The resource type, kubectl-style.
    pub resource: String,
    /// Only this namespace.
    pub namespace: Option<String>,
    /// Server-side label selector.
    pub labels: Option<String>,
    /// Server-side field selector.
    pub fields: Option<String>,
    /// Keep (`Some(false)`) or drop (`Some(true)`) `metadata.managedFields` for this
    /// type, instead of the fleet-wide setting.
    pub prune_managed_fields: Option<bool>,
    /// The annotations pruned from this type's objects, instead of the fleet-wide list.
    pub prune_annotations: Option<Vec<String>>,
}

/// A `--scope` that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ScopeError {
    /// Not `RESOURCE:OPTIONS`.
    #[error(
        "{0:?}: expected RESOURCE:namespace=NS;labels=SELECTOR;fields=SELECTOR;managedFields=keep|drop;pruneAnnotations=KEY,KEY"
    )]
    Shape(String),
    /// No resource type before the colon.
    #[error("{0:?}: the resource type is missing")]
    NoResource(String),
    /// An option is not `key=value`.
    #[error("{text:?}: {part:?} is not key=value")]
    NotKeyValue {
        /// The scope.
        text: String,
        /// The option.
        part: String,
    },
    /// An unknown option.
    #[error(
        "{text:?}: unknown option {option:?} (namespace, labels, fields, managedFields, pruneAnnotations)"
    )]
    UnknownOption {
        /// The scope.
        text: String,
        /// The option.
        option: String,
    },
    /// `managedFields=` other than `keep` or `drop`.
    #[error("{text:?}: managedFields={value:?}: expected keep or drop")]
    ManagedFields {
        /// The scope.
        text: String,
        /// The value.
        value: String,
    },
    /// A selector that does not parse.
    #[error("{text:?}")]
    Selector {
        /// The scope.
        text: String,
        /// Why.
        #[source]
        source: fleetscope_model::SelectorError,
    },
}

impl Scope {
    /// Parses `RESOURCE:namespace=NS;labels=SELECTOR;fields=SELECTOR;managedFields=keep|drop;pruneAnnotations=KEY,KEY`
    /// (each part optional), checking the selectors' syntax.
    pub fn parse(text: &str) -> Result<Self, ScopeError> {
        let (resource, options) = text
            .split_once(':')
            .ok_or_else(|| ScopeError::Shape(text.to_string()))?;
        let mut scope = Scope {
            resource: resource.trim().to_string(),
            ..Scope::default()
        };
        if scope.resource.is_empty() {
            return Err(ScopeError::NoResource(text.to_string()));
        }
        let selector = |source| ScopeError::Selector {
            text: text.to_string(),
            source,
        };
        for part in options.split(';').map(str::trim).filter(|p| !p.is_empty()) {
            let (key, value) = part
                .split_once('=')
                .ok_or_else(|| ScopeError::NotKeyValue {
                    text: text.to_string(),
                    part: part.to_string(),
                })?;
            let value = value.trim().to_string();
            match key.trim() {
                "namespace" => scope.namespace = Some(value),
                "labels" => {
                    fleetscope_model::LabelSelector::parse(&value).map_err(selector)?;
                    scope.labels = Some(value);
                }
                "fields" => {
                    fleetscope_model::FieldSelector::parse(&value).map_err(selector)?;
                    scope.fields = Some(value);
                }
                "managedFields" => {
                    scope.prune_managed_fields = Some(match value.as_str() {
                        "keep" => false,
                        "drop" => true,
                        _ => {
                            return Err(ScopeError::ManagedFields {
                                text: text.to_string(),
                                value,
                            });
                        }
                    });
                }
                "pruneAnnotations" => {
                    scope.prune_annotations = Some(
                        value
                            .split(',')
                            .map(str::trim)
                            .filter(|a| !a.is_empty())
                            .map(String::from)
                            .collect(),
                    );
                }
                other => {
                    return Err(ScopeError::UnknownOption {
                        text: text.to_string(),
                        option: other.to_string(),
                    });
                }
            }
        }
        Ok(scope)
    }
}

/// What every cluster collects, and how. A running cluster follows changes to it
/// (see [`run`]).
#[derive(Debug, Clone, PartialEq)]
pub struct ClusterConfig {
    /// Resource types to collect, kubectl-style; `*` for every watchable type.
    pub resources: Vec<String>,
    /// Per resource type: namespace scope and server-side selectors.
    pub scopes: Vec<Scope>,
    /// Informer settings.
    pub stream: StreamConfig,
    /// How often discovery is refreshed (new CRDs, vanished types).
    pub rediscovery: Duration,
    /// The longest an exec credential plugin may run.
    pub exec_timeout: Duration,
}

impl Default for ClusterConfig {
    fn default() -> Self {
        Self {
            resources: vec!["pods".into()],
            scopes: Vec::new(),
            stream: StreamConfig::default(),
            rediscovery: Duration::from_secs(60),
            exec_timeout: Duration::from_secs(30),
        }
    }
}

/// Where a stream resumes: its type, the resourceVersion reached and the selection
/// it was collected with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResumePoint {
    /// The type.
    pub resource: ResourceType,
    /// The resourceVersion reached.
    pub resource_version: String,
    /// What the stream selected (see [`StreamConfig::selection`]).
    pub selection: String,
}

/// A cluster's resume points, by resource type name.
pub type Resume = HashMap<String, ResumePoint>;

/// What a cluster starts from: where its stored streams resume, and what its
/// discovery last answered (kept in the store, as kubectl keeps its discovery cache).
/// Streams whose type these make known start before discovery is asked again.
#[derive(Debug, Clone, Default)]
pub struct Seed {
    /// Where stored streams resume.
    pub resume: Resume,
    /// The last discovery answer; empty if none was kept.
    pub served: Vec<Served>,
    /// Changed to make each stream of the cluster list again, consistently, diffed
    /// against what it holds: confirmed current (after this process did not run for
    /// a while, say).
    pub rewatch: Option<watch::Receiver<u64>>,
}

/// What a cluster's loop reports besides its streams' updates. Called from the loop's
/// task, in order; implementations must not block.
pub trait Report: Send + Sync + 'static {
    /// A client was built for `server`; discovery comes next.
    fn connected(&self, cluster: &ClusterName, server: &str);
    /// Discovery succeeded: the cluster's version, and the configured names it does
    /// not serve with why.
    fn discovered(
        &self,
        cluster: &ClusterName,
        version: Option<&str>,
        missing: &[(String, String)],
    );
    /// Connecting or discovery failed (retried with backoff); `error` is for a person.
    fn failed(&self, cluster: &ClusterName, error: &str);
    /// A stream started; `resumed` when it watches from a stored resourceVersion.
    fn stream_started(&self, cluster: &ClusterName, resource: &ResourceType, resumed: bool);
    /// A stream's watch resumed from its stored resourceVersion was accepted and stayed
    /// quiet: what was restored for it is its cluster's state.
    fn watch_resumed(&self, _cluster: &ClusterName, _resource: &ResourceType) {}
    /// A stream stopped for good: its type is no longer served or collected.
    fn stream_stopped(&self, cluster: &ClusterName, resource: &ResourceType);
    /// Everything the cluster serves, with short and singular names, after each
    /// successful discovery (for resolving names as kubectl does).
    fn served(&self, _cluster: &ClusterName, _served: &[Served]) {}
    /// A stream's history reader while the stream runs (`Some`, again with each new
    /// client), and `None` once it stopped: for carrying a subscriber from a position
    /// the stream is past ([`crate::history::History::read`]).
    fn history(
        &self,
        _cluster: &ClusterName,
        _resource: &str,
        _history: Option<crate::history::History>,
    ) {
    }
    /// Where to count the cluster's requests to its API server, if anywhere.
    fn request_counts(&self, _cluster: &ClusterName) -> Option<Arc<RequestCounts>> {
        None
    }
}

/// The stream settings for one type: the base, narrowed by the first scope naming it.
fn stream_config(config: &ClusterConfig, rt: &ResourceType, served: &[Served]) -> StreamConfig {
    let mut stream = config.stream.clone();
    let scope = config.scopes.iter().find(|s| {
        discovery::resolve(std::slice::from_ref(&s.resource), served)
            .resources
            .first()
            == Some(rt)
    });
    if let Some(s) = scope {
        stream.namespace = s.namespace.clone();
        stream.label_selector = s.labels.clone();
        stream.field_selector = s.fields.clone();
        if let Some(drop) = s.prune_managed_fields {
            stream.pruning.managed_fields = drop;
        }
        if let Some(annotations) = &s.prune_annotations {
            for a in annotations {
                if !stream.pruning.annotations.contains(a) {
                    stream.pruning.annotations.push(a.clone());
                }
            }
        }
    }
    // A Secret's last-applied annotation holds its values: never kept, whatever the
    // settings, so redaction has one copy of them to hide.
    if rt.group.is_empty()
        && rt.plural == "secrets"
        && !stream
            .pruning
            .annotations
            .iter()
            .any(|a| a == crate::prune::LAST_APPLIED)
    {
        stream
            .pruning
            .annotations
            .push(crate::prune::LAST_APPLIED.into());
    }
    stream
}

/// One running stream.
struct Running {
    token: CancellationToken,
    handle: JoinHandle<Option<String>>,
    selection: String,
}

/// Why the loop left a connection.
enum Leave {
    /// The engine stops: streams end, nothing more is said.
    Shutdown,
    /// The source's settings changed, or its credential is about to expire.
    Reconnect,
    /// The cluster left the fleet.
    Removed,
}

impl Leave {
    /// What a change of the source's `watch` means: new settings, or (its sender
    /// dropped) the cluster left the fleet.
    fn on_change(changed: Result<(), watch::error::RecvError>) -> Self {
        match changed {
            Ok(()) => Leave::Reconnect,
            Err(_) => Leave::Removed,
        }
    }
}

/// What ended a wait.
enum Waited {
    /// The time ran out.
    Elapsed,
    /// The fleet's settings changed: apply them.
    Reconfigured,
    /// The loop must leave its connection.
    Leave(Leave),
}

/// The loop of one cluster.
struct Cluster {
    name: ClusterName,
    /// The settings in force, as last taken from `settings`.
    config: Arc<ClusterConfig>,
    settings: watch::Receiver<Arc<ClusterConfig>>,
    tx: mpsc::Sender<Update>,
    report: Arc<dyn Report>,
    tasks: TaskTracker,
    cancel: CancellationToken,
    streams: HashMap<ResourceType, Running>,
    resume: Resume,
    /// The last discovery answer, kept or current.
    served: Vec<Served>,
    outage: Arc<crate::outage::Outage>,
    /// Asks each stream to resume its watch at once (see [`Seed::rewatch`]).
    rewatch: Option<watch::Receiver<u64>>,
}

/// Runs one cluster until `cancel` (shutdown) or until `source`'s sender is dropped
/// (the cluster left the fleet: its streams stop, then [`Update::ClusterGone`]).
/// Streams are spawned on `tasks`. `seed` holds where stored streams resume and the
/// kept discovery answer: streams whose type is known (from it, from the resume
/// points, or as a built-in type) start as soon as the cluster is connected, and
/// discovery, asked meanwhile, then starts, replaces or stops streams as it answers.
///
/// A change of `settings` applies without reconnecting: types no longer collected
/// stop (their objects dropped), new ones start, and a stream whose selection changed
/// (namespace, selectors, pruning) lists again, its objects diffed against what is
/// held; other streams run on undisturbed.
pub async fn run(
    mut source: watch::Receiver<ClusterSource>,
    mut settings: watch::Receiver<Arc<ClusterConfig>>,
    seed: Seed,
    tx: mpsc::Sender<Update>,
    report: Arc<dyn Report>,
    tasks: TaskTracker,
    cancel: CancellationToken,
) {
    let current = source.borrow_and_update().clone();
    let config = settings.borrow_and_update().clone();
    let mut cluster = Cluster {
        name: ClusterName::from(current.name.as_str()),
        config,
        settings,
        tx,
        report,
        tasks,
        cancel,
        streams: HashMap::new(),
        resume: seed.resume,
        served: seed.served,
        rewatch: seed.rewatch,
        outage: Arc::new(crate::outage::Outage::new(ClusterName::from(
            current.name.as_str(),
        ))),
    };
    let mut backoff = Backoff::new(
        cluster.config.stream.backoff_start,
        cluster.config.stream.backoff_cap,
    );
    loop {
        let current = source.borrow_and_update().clone();
        let leave = match cluster.connect(&current, &mut source).await {
            Ok(Ok(conn)) => {
                backoff.reset();
                cluster.serve(conn, &mut source).await
            }
            Ok(Err(e)) => {
                let why = source::chain(&e);
                cluster.outage.failed("connect", &why);
                cluster.report.failed(&cluster.name, &why);
                match cluster.wait(backoff.next_delay(), None, &mut source).await {
                    // Waited out, or new settings (an exec timeout, say): connect again.
                    Waited::Elapsed | Waited::Reconfigured => continue,
                    Waited::Leave(leave) => leave,
                }
            }
            Err(leave) => leave,
        };
        // A stopping engine cancels and then drops every source: a loop that sees the
        // drop first is stopping too, and must not report its cluster as gone (that
        // would delete its stored objects and resume points).
        let leave = match leave {
            Leave::Removed if cluster.cancel.is_cancelled() => Leave::Shutdown,
            other => other,
        };
        match leave {
            Leave::Shutdown => return,
            Leave::Reconnect => {
                tracing::info!(
                    "the cluster's settings changed: reconnecting, resuming every stream"
                );
                cluster.stop_streams().await;
            }
            Leave::Removed => {
                cluster.stop_streams().await;
                let _ = cluster
                    .tx
                    .send(Update::ClusterGone {
                        cluster: cluster.name.clone(),
                    })
                    .await;
                return;
            }
        }
    }
}

impl Cluster {
    /// Connects, unless the source changes or the engine stops first.
    async fn connect(
        &self,
        current: &ClusterSource,
        source: &mut watch::Receiver<ClusterSource>,
    ) -> Result<Result<source::Connection, source::SourceError>, Leave> {
        let timeout = self.config.exec_timeout;
        let counts = self.report.request_counts(&self.name);
        tokio::select! {
            c = source::connect(current, timeout, counts.as_ref()) => Ok(c),
            _ = self.cancel.cancelled() => Err(Leave::Shutdown),
            changed = source.changed() => Err(Leave::on_change(changed)),
        }
    }

    /// Discovers and runs streams over one connection until the loop must leave it.
    async fn serve(
        &mut self,
        conn: source::Connection,
        source: &mut watch::Receiver<ClusterSource>,
    ) -> Leave {
        self.report.connected(&self.name, &conn.server);
        self.outage.server(&conn.server);
        self.outage.recovered("connect");
        // Renew an expiring credential ahead of its expiry.
        let renew = conn
            .expires
            .map(|at| tokio::time::Instant::now() + source::renew_in(at));
        let mut backoff = Backoff::new(
            self.config.stream.backoff_start,
            self.config.stream.backoff_cap,
        );
        // What was last said about configured names the cluster does not serve.
        let mut missing_said: Vec<(String, String)> = Vec::new();
        // What was last said about group versions discovery could not read.
        let mut failed_said: Vec<(String, String)> = Vec::new();
        // The last discovery's answer and the server's version: new settings are
        // applied to them without asking again.
        let mut known: Option<(Vec<Served>, Option<String>)> = None;
        let mut rediscover = true;
        let mut waited_on = match self.start_known(&conn).await {
            Ok(waited_on) => waited_on,
            Err(leave) => return leave,
        };
        loop {
            if rediscover {
                let discovered = match self.discover(&conn, waited_on, &mut failed_said).await {
                    Ok(d) => d,
                    Err(leave) => return leave,
                };
                if discovered.is_some() {
                    waited_on = false;
                    backoff.reset();
                }
                known = discovered;
            }
            let wait = match &known {
                Some((served, version)) => {
                    self.apply_discovered(&conn, served, version.as_deref(), &mut missing_said)
                        .await;
                    self.config.rediscovery
                }
                None => backoff.next_delay(),
            };
            let started = tokio::time::Instant::now();
            match self.wait(wait, renew, source).await {
                Waited::Elapsed => rediscover = true,
                Waited::Reconfigured => {
                    // Applied to what is known; discovery runs again when it is due.
                    rediscover = known.is_none() || started.elapsed() >= wait;
                }
                Waited::Leave(leave) => return leave,
            }
        }
    }

    /// Starts the streams of the types known without discovery, off its critical
    /// path: named in the catalogue, or named as group/version/resource (known after
    /// one request for each such group version, asked for together). Whether
    /// discovery is waited on (configured names it alone resolves, or `*` without a
    /// kept answer): then it asks for several group versions at once; otherwise it
    /// runs beside the streams, one request at a time.
    async fn start_known(&mut self, conn: &source::Connection) -> Result<bool, Leave> {
        let (mut early_served, mut early, mut unresolved) = self.known_types(&[]);
        let mut group_versions: Vec<(String, String)> = Vec::new();
        for spec in &unresolved {
            if let Some((group, version, _)) = fleetscope_model::catalogue::versioned(spec.trim())
                && !version.is_empty()
                && !group_versions
                    .iter()
                    .any(|(g, v)| g == group && v == version)
            {
                group_versions.push((group.to_string(), version.to_string()));
            }
        }
        if !group_versions.is_empty() {
            // Streams wait on these: asked for together.
            let answers = tokio::select! {
                a = discovery::group_versions(&conn.client, group_versions, discovery::DISCOVERY_CONCURRENCY) => a,
                _ = self.cancel.cancelled() => return Err(Leave::Shutdown),
            };
            let mut extra = Vec::new();
            for (group, version, answer) in answers {
                match answer {
                    Ok(served) => extra.extend(served),
                    Err(e) => {
                        tracing::debug!(group = %group, version = %version, error = %crate::source::chain(&e), "the group version is not known yet: its types wait for discovery");
                    }
                }
            }
            (early_served, early, unresolved) = self.known_types(&extra);
        }
        self.start_streams(&conn.client, &early_served, &early)
            .await;
        let every_type = self.config.resources.iter().any(|r| r.trim() == "*");
        Ok(!unresolved.is_empty() || (every_type && self.served.is_empty()))
    }

    /// Discovery of every group version (several at once when `waited_on`), and the
    /// server's version: what the cluster serves, or `None` when discovery failed
    /// (said, and reported). A group version that could not be read is warned of once
    /// per change (`failed_said`).
    async fn discover(
        &mut self,
        conn: &source::Connection,
        waited_on: bool,
        failed_said: &mut Vec<(String, String)>,
    ) -> Result<Option<(Vec<Served>, Option<String>)>, Leave> {
        let concurrency = if waited_on {
            discovery::DISCOVERY_CONCURRENCY
        } else {
            1
        };
        let discovered = tokio::select! {
            d = discovery::discover_all(&conn.client, concurrency) => d,
            _ = self.cancel.cancelled() => return Err(Leave::Shutdown),
        };
        match discovered {
            Ok(d) => {
                if d.failed != *failed_said {
                    for (gv, why) in &d.failed {
                        tracing::warn!(group_version = %gv, "discovery could not read a group version; its types are kept as they were: {why}");
                    }
                    failed_said.clone_from(&d.failed);
                }
                let served = self.with_unanswered(d);
                let version = tokio::select! {
                    v = conn.client.apiserver_version() => v.ok().map(|v| v.git_version),
                    _ = self.cancel.cancelled() => return Err(Leave::Shutdown),
                };
                self.report.served(&self.name, &served);
                self.served.clone_from(&served);
                self.outage.recovered("discovery");
                Ok(Some((served, version)))
            }
            Err(e) => {
                let why = format!(
                    "discovery failed: {}",
                    crate::cause::describe(&e, &conn.server)
                );
                self.outage.failed("discovery", &why);
                self.report.failed(&self.name, &why);
                Ok(None)
            }
        }
    }

    /// Runs the streams the settings name among what the cluster serves, then
    /// reports the cluster discovered (streams are known first, so a query never
    /// finds a discovered cluster without its types). Configured names it does not
    /// serve are warned of once per change (`missing_said`).
    async fn apply_discovered(
        &mut self,
        conn: &source::Connection,
        served: &[Served],
        version: Option<&str>,
        missing_said: &mut Vec<(String, String)>,
    ) {
        let resolved = discovery::resolve(&self.config.resources, served);
        if resolved.missing != *missing_said {
            for (name, why) in &resolved.missing {
                tracing::warn!(resource = %name, "configured resource type not collected: {why}");
            }
            missing_said.clone_from(&resolved.missing);
        }
        self.reconcile(&conn.client, served, &resolved.resources)
            .await;
        self.report
            .discovered(&self.name, version, &resolved.missing);
    }

    /// Waits `wait`, or less if the source or the settings change, the credential is
    /// due for renewal or the engine stops. New settings are taken into `config`.
    async fn wait(
        &mut self,
        wait: Duration,
        renew: Option<tokio::time::Instant>,
        source: &mut watch::Receiver<ClusterSource>,
    ) -> Waited {
        let renewal = async {
            match renew {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        let settings_rx = &mut self.settings;
        let settings = async {
            // A dropped sender means settings never change again.
            if settings_rx.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
        };
        let waited = tokio::select! {
            _ = tokio::time::sleep(wait) => Waited::Elapsed,
            _ = renewal => {
                tracing::info!("the exec credential is about to expire: renewing it");
                Waited::Leave(Leave::Reconnect)
            }
            _ = self.cancel.cancelled() => Waited::Leave(Leave::Shutdown),
            changed = source.changed() => Waited::Leave(Leave::on_change(changed)),
            () = settings => Waited::Reconfigured,
        };
        if let Waited::Reconfigured = waited {
            self.config = self.settings.borrow_and_update().clone();
        }
        waited
    }

    /// The types `config.resources` names that are known before discovery answers,
    /// with what they were resolved against, and the names (not `*`) still unresolved.
    /// `*` is resolved against the kept discovery answer, else the resume points'
    /// types; names also against the built-in types (when no answer was kept) and
    /// `extra` (group versions asked for one by one).
    fn known_types(&self, extra: &[Served]) -> (Vec<Served>, Vec<ResourceType>, Vec<String>) {
        let mut served: Vec<Served> = self.served.clone();
        if served.is_empty() {
            for p in self.resume.values() {
                if !served.iter().any(|s| s.resource == p.resource) {
                    served.push(Served::of(p.resource.clone(), true));
                }
            }
        }
        let mut resources = discovery::resolve(&self.config.resources, &served).resources;
        if self.served.is_empty() {
            served.extend(discovery::builtin());
        }
        served.extend(extra.iter().cloned());
        let named: Vec<String> = self
            .config
            .resources
            .iter()
            .filter(|r| r.trim() != "*")
            .cloned()
            .collect();
        let resolved = discovery::resolve(&named, &served);
        for rt in resolved.resources {
            if !resources.contains(&rt) {
                resources.push(rt);
            }
        }
        resources.sort();
        let unresolved = resolved.missing.into_iter().map(|(name, _)| name).collect();
        (served, resources, unresolved)
    }

    /// A discovery's answer with the types of the group versions that did not answer
    /// taken as they were (from the last answer, the running streams and the resume
    /// points): unknown is not gone, so an aggregated API server that is down never
    /// has its types' objects dropped.
    fn with_unanswered(&self, d: discovery::Discovered) -> Vec<Served> {
        let mut served = d.served;
        if d.failed.is_empty() {
            return served;
        }
        let unanswered = |rt: &ResourceType| d.failed.iter().any(|(gv, _)| *gv == rt.api_version());
        let before = self
            .served
            .iter()
            .cloned()
            .chain(self.streams.keys().map(|rt| Served::of(rt.clone(), true)))
            .chain(
                self.resume
                    .values()
                    .map(|p| Served::of(p.resource.clone(), true)),
            );
        for s in before {
            if unanswered(&s.resource) && !served.iter().any(|o| o.resource == s.resource) {
                served.push(s);
            }
        }
        served.sort_by(|a, b| a.resource.cmp(&b.resource));
        served
    }

    /// Starts streams for newly served types and stops those whose type vanished.
    async fn reconcile(
        &mut self,
        client: &kube::Client,
        served: &[Served],
        wanted: &[ResourceType],
    ) {
        // A running stream that now selects differently lists again.
        let reselected: Vec<ResourceType> = self
            .streams
            .iter()
            .filter(|(rt, running)| {
                wanted.contains(rt)
                    && stream_config(&self.config, rt, served).selection() != running.selection
            })
            .map(|(rt, _)| rt.clone())
            .collect();
        for rt in reselected {
            if let Some(running) = self.streams.remove(&rt) {
                tracing::info!(resource = %rt.name(), "the type's selection changed: listing it again");
                running.token.cancel();
                let _ = running.handle.await;
            }
        }
        // Streams of types no longer wanted stop, and their objects are dropped, before
        // any stream starts: a type served at another version keeps its name, and its
        // new stream's objects must come after the drop.
        let mut gone: Vec<ResourceType> = self
            .streams
            .keys()
            .filter(|rt| !wanted.contains(rt))
            .cloned()
            .collect();
        // Stored streams this cluster no longer serves (or that are no longer collected).
        let stale: Vec<String> = self
            .resume
            .iter()
            .filter(|(name, _)| !wanted.iter().any(|w| w.name() == **name))
            .map(|(name, _)| name.clone())
            .collect();
        for name in stale {
            if let Some(p) = self.resume.remove(&name) {
                gone.push(p.resource);
            }
        }
        for rt in gone {
            // Served at another version now: the new stream lists, and its list is
            // diffed against what this one held.
            if wanted.iter().any(|w| w.name() == rt.name())
                && let Some(running) = self.streams.remove(&rt)
            {
                tracing::info!(resource = %rt.name(), version = %rt.version, "the type is served at another version: listing it there");
                running.token.cancel();
                let reached = running.handle.await.ok().flatten();
                self.keep_reached(rt, running.selection, reached);
                continue;
            }
            tracing::info!(resource = %rt.name(), "resource type no longer served: dropping its objects");
            if let Some(running) = self.streams.remove(&rt) {
                running.token.cancel();
                let _ = running.handle.await;
            }
            self.report.stream_stopped(&self.name, &rt);
            self.report.history(&self.name, &rt.name(), None);
            let id = Arc::new(StreamId::new(self.name.clone(), rt));
            let _ = self
                .tx
                .send(Update::Listed {
                    stream: id,
                    objects: Vec::new(),
                    parts: None,
                    resource_version: String::new(),
                    reason: crate::stream::ListReason::Dropped,
                    method: None,
                    fallback: None,
                })
                .await;
        }
        self.start_streams(client, served, wanted).await;
    }

    /// Starts a stream for each type in `wanted` that has none; stops nothing.
    async fn start_streams(
        &mut self,
        client: &kube::Client,
        served: &[Served],
        wanted: &[ResourceType],
    ) {
        for rt in wanted {
            if self.streams.contains_key(rt) {
                continue;
            }
            let stream = stream_config(&self.config, rt, served);
            let selection = stream.selection();
            // A stored stream of the same type and selection resumes its watch;
            // anything else lists, and the list is diffed against what is held.
            // A stored stream of another selection lists, never older than what it
            // stored.
            let start = match self.resume.remove(&rt.name()) {
                Some(p) if p.resource == *rt && p.selection == selection => stream::Start {
                    watch_from: Some(p.resource_version),
                    floor: None,
                },
                Some(p) if p.resource == *rt => {
                    tracing::info!(resource = %rt.name(), was = %p.selection, now = %selection, "the stream selects differently than when its objects were stored: listing again");
                    stream::Start {
                        watch_from: None,
                        floor: Some(p.resource_version),
                    }
                }
                // Stored at another version: listed there, never older than it was.
                Some(p) => stream::Start {
                    watch_from: None,
                    floor: Some(p.resource_version),
                },
                None => stream::Start::default(),
            };
            self.report
                .stream_started(&self.name, rt, start.watch_from.is_some());
            let token = self.cancel.child_token();
            let id =
                Arc::new(StreamId::new(self.name.clone(), rt.clone()).selecting(selection.clone()));
            let span = tracing::info_span!("informer", cluster = %self.name, resource = %rt.name());
            let history = crate::history::History::new(client.clone(), id.clone(), stream.clone());
            self.report.history(&self.name, &rt.name(), Some(history));
            let handle = self.tasks.spawn(
                stream::run(
                    client.clone(),
                    id,
                    self.outage.clone(),
                    stream,
                    start,
                    self.tx.clone(),
                    stream::Steering {
                        cancel: token.clone(),
                        rewatch: self.rewatch.clone(),
                        resumed: Some({
                            let (report, name, rt) =
                                (self.report.clone(), self.name.clone(), rt.clone());
                            Arc::new(move || report.watch_resumed(&name, &rt))
                        }),
                    },
                )
                .instrument(span),
            );
            self.streams.insert(
                rt.clone(),
                Running {
                    token,
                    handle,
                    selection,
                },
            );
        }
    }

    /// Stops every stream and keeps where each reached, so the next connection
    /// resumes them.
    async fn stop_streams(&mut self) {
        for running in self.streams.values() {
            running.token.cancel();
        }
        let streams: Vec<_> = self.streams.drain().collect();
        for (rt, running) in streams {
            self.report.history(&self.name, &rt.name(), None);
            let reached = running.handle.await.ok().flatten();
            self.keep_reached(rt, running.selection, reached);
        }
    }

    /// Keeps where a stopped stream reached (if it listed), so the next stream of its
    /// type resumes there.
    fn keep_reached(&mut self, rt: ResourceType, selection: String, reached: Option<String>) {
        if let Some(rv) = reached {
            self.resume.insert(
                rt.name(),
                ResumePoint {
                    resource: rt,
                    resource_version: rv,
                    selection,
                },
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scopes_parse_and_reject_bad_selectors() {
        let s = Scope::parse(
            "pods:namespace=team-0;labels=app in (web,api);fields=status.phase=Running",
        )
        .unwrap();
        assert_eq!(s.resource, "pods");
        assert_eq!(s.namespace.as_deref(), Some("team-0"));
        assert_eq!(s.labels.as_deref(), Some("app in (web,api)"));
        assert_eq!(s.fields.as_deref(), Some("status.phase=Running"));
        assert!(Scope::parse("pods").is_err());
        assert!(Scope::parse(":namespace=x").is_err());
        let e = Scope::parse("pods:labels=app in web").unwrap_err();
        assert!(
            source::chain(&e).contains("position"),
            "{}",
            source::chain(&e)
        );
        assert!(Scope::parse("pods:colour=blue").is_err());
    }
}
