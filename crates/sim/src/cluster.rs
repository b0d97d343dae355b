//! One simulated cluster: its store, who may use it, the faults it is told to show,
//! and counts of the requests it served.

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Deref;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tokio::sync::{broadcast, watch};

use crate::resource::{self, ResourceDef};
use crate::status::ApiError;
use crate::store::Store;

/// Settings of one simulated cluster.
#[derive(Debug, Clone)]
pub struct ClusterConfig {
    /// The cluster's name (the kubeconfig context written for it).
    pub name: String,
    /// How many changes the history keeps; older resourceVersions answer 410. Default 10,000.
    pub history: usize,
    /// How many changes a watch may fall behind before it is ended. Default 16,384.
    pub watch_buffer: usize,
    /// How often a watch with bookmarks sends one. Default 60 s, as a real apiserver.
    pub bookmark_interval: Duration,
    /// A watch without `timeoutSeconds` is ended after a random time in this range. Default 5 to 10 minutes.
    pub watch_lifetime: (Duration, Duration),
    /// Bearer tokens the cluster accepts.
    pub tokens: Vec<Token>,
    /// The types served at start.
    pub resources: Vec<ResourceDef>,
    /// Serve HTTPS with a generated CA (default), as a real apiserver; plain HTTP when false.
    /// Kubernetes clients send bearer tokens only over HTTPS.
    pub tls: bool,
    /// How many resourceVersions the watch cache trails the store by: a read it serves
    /// (`resourceVersion=0`) may be this much older than a quorum read. Default 0.
    pub cache_lag: u64,
    /// How the cluster answers a streaming list (`sendInitialEvents=true`). Default
    /// [`WatchListSupport::Served`].
    pub watch_list: WatchListSupport,
    /// How long every request waits before it is answered, as a round trip to a
    /// distant API server does (the connection's own handshakes aside). Default none.
    pub latency: Duration,
}

/// How a cluster answers a watch that asks for its initial events (a streaming list,
/// Kubernetes' WatchList).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WatchListSupport {
    /// As an API server with the WatchList feature: the initial state as ADDED events,
    /// then a bookmark annotated `k8s.io/initial-events-end`.
    Served,
    /// As an API server without it: 422, `sendInitialEvents` forbidden.
    Refused,
    /// As a server that does not know the parameters: a plain watch, no end bookmark.
    Ignored,
    /// As an API server from before WatchList (v1.19 to v1.26): it does not know
    /// `sendInitialEvents` and forbids `resourceVersionMatch` on a watch: 422, as
    /// kube-apiserver v1.20 answers.
    Unknown,
}

/// How a LIST was served, as an API server's watch cache decides it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ListKind {
    /// Read from storage (etcd): a consistent read, a paged read, an exact resourceVersion.
    Quorum,
    /// Read from the watch cache (`resourceVersion=0`, or not older than a given one).
    Cache,
    /// A streaming list: a watch with `sendInitialEvents=true`.
    Streaming,
}

impl ListKind {
    /// Lower-case name, as in `/metrics`.
    pub fn as_str(self) -> &'static str {
        match self {
            ListKind::Quorum => "quorum",
            ListKind::Cache => "cache",
            ListKind::Streaming => "streaming",
        }
    }
}

impl ClusterConfig {
    /// Defaults for a cluster of this name, with one token (`<name>-token`, user `<name>-admin`).
    pub fn new(name: &str) -> Self {
        Self {
            name: name.to_string(),
            history: 10_000,
            watch_buffer: 16_384,
            bookmark_interval: Duration::from_secs(60),
            watch_lifetime: (Duration::from_secs(300), Duration::from_secs(600)),
            tokens: vec![Token::new(
                &format!("{name}-token"),
                &format!("{name}-admin"),
            )],
            resources: resource::builtin(),
            tls: true,
            cache_lag: 0,
            watch_list: WatchListSupport::Served,
            latency: Duration::ZERO,
        }
    }
}

/// A bearer token and what it may not touch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Token {
    /// The token text.
    pub token: String,
    /// The user it authenticates as.
    pub user: String,
    /// Resource ids (`pods`, `deployments.apps`) this token is forbidden (403).
    pub denied: BTreeSet<String>,
    /// The user's groups, as a TokenReview reports them (with `system:authenticated`).
    pub groups: Vec<String>,
}

impl Token {
    /// A token with full access.
    pub fn new(token: &str, user: &str) -> Self {
        Self {
            token: token.into(),
            user: user.into(),
            denied: BTreeSet::new(),
            groups: Vec::new(),
        }
    }

    /// The token, its user in `groups`.
    pub fn with_groups(mut self, groups: &[&str]) -> Self {
        self.groups = groups.iter().map(|g| g.to_string()).collect();
        self
    }
}

/// Request verbs, as counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Verb {
    /// GET of one object.
    Get,
    /// LIST.
    List,
    /// WATCH.
    Watch,
    /// POST.
    Create,
    /// PUT.
    Update,
    /// PATCH.
    Patch,
    /// DELETE.
    Delete,
    /// A discovery document (`/version`, `/api`, `/apis/...`).
    Discovery,
}

impl Verb {
    /// Upper-case name, as in `/metrics`.
    pub fn as_str(self) -> &'static str {
        match self {
            Verb::Get => "GET",
            Verb::List => "LIST",
            Verb::Watch => "WATCH",
            Verb::Create => "CREATE",
            Verb::Update => "UPDATE",
            Verb::Patch => "PATCH",
            Verb::Delete => "DELETE",
            Verb::Discovery => "DISCOVERY",
        }
    }

    /// The RBAC verb.
    pub fn rbac(self) -> &'static str {
        match self {
            Verb::Get | Verb::Discovery => "get",
            Verb::List => "list",
            Verb::Watch => "watch",
            Verb::Create => "create",
            Verb::Update => "update",
            Verb::Patch => "patch",
            Verb::Delete => "delete",
        }
    }
}

/// A signal to every live watch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum WatchControl {
    /// Cut the connection without a clean end.
    Drop,
    /// Send a 410 `ERROR` event, then end.
    Expire,
    /// Send this line as it is, on the watches of one resource type (its id).
    Line {
        resource: std::sync::Arc<str>,
        line: std::sync::Arc<str>,
    },
}

/// How long an injected failure lasts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailFor {
    /// The next N requests.
    Requests(usize),
    /// Every request for this long.
    Duration(Duration),
}

#[derive(Debug)]
struct Failure {
    code: u16,
    until: Option<Instant>,
    remaining: Option<usize>,
}

pub(crate) struct Faults {
    pub(crate) control: broadcast::Sender<WatchControl>,
    pub(crate) frozen: watch::Sender<bool>,
    pub(crate) stalls_pending: AtomicUsize,
    pub(crate) stall_release: watch::Sender<u64>,
    failure: Mutex<Option<Failure>>,
    /// A resource (plural) whose lists and watches are answered with a body that is
    /// not JSON.
    garbled: Mutex<Option<String>>,
}

/// A simulated cluster. Cheap to clone; every clone is the same cluster.
#[derive(Clone)]
pub struct Cluster(Arc<Inner>);

/// The shared state behind a [`Cluster`].
pub struct Inner {
    /// Settings.
    pub config: ClusterConfig,
    /// The objects.
    pub store: Store,
    tokens: Mutex<Vec<Token>>,
    pub(crate) faults: Faults,
    counters: Mutex<BTreeMap<(Verb, String), u64>>,
    /// LISTs by (how served, resource id): (requests, response bytes).
    lists: Mutex<BTreeMap<(ListKind, String), (u64, u64)>>,
    /// Response bytes by verb (discovery documents, lists).
    bytes: Mutex<BTreeMap<Verb, u64>>,
    cache_lag: std::sync::atomic::AtomicU64,
    watch_list: Mutex<WatchListSupport>,
    discovery_failing: std::sync::atomic::AtomicBool,
    /// Group versions (`apps/v1`, `v1`) whose discovery document fails.
    failing_group_versions: Mutex<BTreeSet<String>>,
    latency: Mutex<Duration>,
    /// Whether group-version discovery documents are held back until released.
    group_versions_held: watch::Sender<bool>,
    /// Group-version discovery documents being answered (or held) now.
    group_versions_in_flight: AtomicUsize,
    /// The uids of the deployments a [`crate::Workload`] made and keeps itself (with
    /// their replica sets and pods): the controllers leave them alone.
    pub(crate) workload_deployments: Mutex<std::collections::HashSet<String>>,
}

impl Deref for Cluster {
    type Target = Inner;
    fn deref(&self) -> &Inner {
        &self.0
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Cluster {
    /// A new, empty cluster (no namespaces yet).
    pub fn new(config: ClusterConfig) -> Self {
        let store = Store::new(
            &config.name,
            config.resources.clone(),
            config.history,
            config.watch_buffer,
        );
        let (control, _) = broadcast::channel(16);
        let (frozen, _) = watch::channel(false);
        let (stall_release, _) = watch::channel(0);
        let (cache_lag, watch_list, latency) =
            (config.cache_lag, config.watch_list, config.latency);
        let (group_versions_held, _) = watch::channel(false);
        Cluster(Arc::new(Inner {
            tokens: Mutex::new(config.tokens.clone()),
            config,
            store,
            faults: Faults {
                control,
                frozen,
                stalls_pending: AtomicUsize::new(0),
                stall_release,
                failure: Mutex::new(None),
                garbled: Mutex::new(None),
            },
            counters: Mutex::new(BTreeMap::new()),
            lists: Mutex::new(BTreeMap::new()),
            bytes: Mutex::new(BTreeMap::new()),
            cache_lag: std::sync::atomic::AtomicU64::new(cache_lag),
            watch_list: Mutex::new(watch_list),
            discovery_failing: std::sync::atomic::AtomicBool::new(false),
            failing_group_versions: Mutex::new(BTreeSet::new()),
            latency: Mutex::new(latency),
            group_versions_held,
            group_versions_in_flight: AtomicUsize::new(0),
            workload_deployments: Mutex::new(Default::default()),
        }))
    }

    /// How long every request waits before it is answered.
    pub fn latency(&self) -> Duration {
        *lock(&self.latency)
    }

    /// Sets how long every request waits before it is answered (a round trip to a
    /// distant API server); zero answers at once.
    pub fn set_latency(&self, latency: Duration) {
        *lock(&self.latency) = latency;
    }

    /// Holds every group-version discovery document (`/api/v1`, `/apis/apps/v1`) back
    /// until released (false), so a test sees how many a client asks for at once.
    pub fn hold_group_versions(&self, held: bool) {
        self.group_versions_held.send_replace(held);
    }

    /// How many group-version discovery documents are being answered (or held) now.
    pub fn group_versions_in_flight(&self) -> usize {
        self.group_versions_in_flight.load(Ordering::SeqCst)
    }

    /// Answers one group-version document with `answer` once nothing holds it back,
    /// counted in flight meanwhile.
    pub(crate) async fn group_version_document<T>(&self, answer: impl FnOnce() -> T) -> T {
        struct InFlight<'a>(&'a AtomicUsize);
        impl Drop for InFlight<'_> {
            fn drop(&mut self) {
                self.0.fetch_sub(1, Ordering::SeqCst);
            }
        }
        self.group_versions_in_flight.fetch_add(1, Ordering::SeqCst);
        let _in_flight = InFlight(&self.group_versions_in_flight);
        let mut held = self.group_versions_held.subscribe();
        // The sender lives as long as the cluster, so this wait ends when released.
        let _ = held.wait_for(|h| !*h).await;
        answer()
    }

    /// Makes one group version's discovery document (`apps/v1`, or `v1` for the core
    /// group) answer 503 (true), as an aggregated API whose server is down does, or be
    /// served again (false); its resources themselves are unaffected.
    pub fn fail_group_version(&self, group_version: &str, failing: bool) {
        let mut set = lock(&self.failing_group_versions);
        if failing {
            set.insert(group_version.to_string());
        } else {
            set.remove(group_version);
        }
    }

    /// Whether a group version's discovery document fails.
    pub(crate) fn group_version_failing(&self, group: &str, version: &str) -> bool {
        let gv = if group.is_empty() {
            version.to_string()
        } else {
            format!("{group}/{version}")
        };
        lock(&self.failing_group_versions).contains(&gv)
    }

    /// Makes the root discovery documents (`/version`, `/api`, `/apis`), where a full
    /// discovery starts, answer 500 (true) or be served again (false); one group
    /// version's document and every other request are unaffected.
    pub fn fail_discovery(&self, failing: bool) {
        self.discovery_failing.store(failing, Ordering::SeqCst);
    }

    /// Whether discovery documents are failing.
    pub(crate) fn discovery_failing(&self) -> bool {
        self.discovery_failing.load(Ordering::SeqCst)
    }

    /// How many resourceVersions the watch cache trails the store by.
    pub fn cache_lag(&self) -> u64 {
        self.cache_lag.load(Ordering::SeqCst)
    }

    /// Sets how far the watch cache trails the store.
    pub fn set_cache_lag(&self, lag: u64) {
        self.cache_lag.store(lag, Ordering::SeqCst);
    }

    /// How the cluster answers streaming lists.
    pub fn watch_list(&self) -> WatchListSupport {
        *lock(&self.watch_list)
    }

    /// Sets how the cluster answers streaming lists.
    pub fn set_watch_list(&self, support: WatchListSupport) {
        *lock(&self.watch_list) = support;
    }

    /// The resourceVersion the watch cache is at: the store's, less the lag, never
    /// older than the oldest one still readable.
    pub fn cache_resource_version(&self) -> u64 {
        self.store
            .resource_version()
            .saturating_sub(self.cache_lag())
            .max(self.store.oldest_resource_version())
    }

    /// Counts `requests` LISTs served as `kind` and `bytes` of their responses (a
    /// streaming list is counted when it starts, its bytes once its initial events
    /// are sent).
    pub(crate) fn count_list(&self, kind: ListKind, resource: &str, requests: u64, bytes: u64) {
        let mut lists = lock(&self.lists);
        let entry = lists.entry((kind, resource.to_string())).or_default();
        entry.0 += requests;
        entry.1 += bytes;
    }

    /// Counts response bytes of a verb.
    pub(crate) fn count_bytes(&self, verb: Verb, bytes: u64) {
        *lock(&self.bytes).entry(verb).or_default() += bytes;
    }

    /// How many LISTs of any resource were served as `kind`.
    pub fn lists_of(&self, kind: ListKind) -> u64 {
        lock(&self.lists)
            .iter()
            .filter(|((k, _), _)| *k == kind)
            .map(|(_, (n, _))| n)
            .sum()
    }

    /// The bytes of the LISTs of any resource served as `kind` (for streaming lists,
    /// their initial events and end bookmark).
    pub fn list_bytes_of(&self, kind: ListKind) -> u64 {
        lock(&self.lists)
            .iter()
            .filter(|((k, _), _)| *k == kind)
            .map(|(_, (_, b))| b)
            .sum()
    }

    /// How many LISTs of one resource id were served as `kind`.
    pub fn lists(&self, kind: ListKind, resource: &str) -> u64 {
        lock(&self.lists)
            .get(&(kind, resource.to_string()))
            .map_or(0, |(n, _)| *n)
    }

    /// Response bytes of a verb (discovery documents and lists are counted).
    pub fn response_bytes(&self, verb: Verb) -> u64 {
        lock(&self.bytes).get(&verb).copied().unwrap_or(0)
    }

    /// The cluster's name.
    pub fn name(&self) -> &str {
        &self.config.name
    }

    /// The first configured token, the one a written kubeconfig uses.
    pub fn admin_token(&self) -> String {
        lock(&self.tokens)
            .first()
            .map(|t| t.token.clone())
            .unwrap_or_default()
    }

    /// Accepts a further token.
    pub fn add_token(&self, token: Token) {
        lock(&self.tokens).push(token);
    }

    /// Stops accepting a token: its requests get 401.
    pub fn revoke_token(&self, token: &str) {
        lock(&self.tokens).retain(|t| t.token != token);
    }

    /// Forbids (403) or allows again one resource id for one token.
    pub fn set_denied(&self, token: &str, resource_id: &str, denied: bool) {
        for t in lock(&self.tokens).iter_mut().filter(|t| t.token == token) {
            if denied {
                t.denied.insert(resource_id.to_string());
            } else {
                t.denied.remove(resource_id);
            }
        }
    }

    /// The user a bearer token authenticates as, and the resource ids it is denied.
    pub(crate) fn authenticate(
        &self,
        token: Option<&str>,
    ) -> Result<(String, BTreeSet<String>), ApiError> {
        let token = token.ok_or_else(ApiError::unauthorized)?;
        lock(&self.tokens)
            .iter()
            .find(|t| t.token == token)
            .map(|t| (t.user.clone(), t.denied.clone()))
            .ok_or_else(ApiError::unauthorized)
    }

    /// A TokenReview of `token`: its user and groups, if it is one of this cluster's.
    pub(crate) fn review(&self, token: &str) -> Option<(String, Vec<String>)> {
        lock(&self.tokens)
            .iter()
            .find(|t| t.token == token)
            .map(|t| {
                let mut groups = t.groups.clone();
                groups.push("system:authenticated".into());
                (t.user.clone(), groups)
            })
    }

    /// Counts a request.
    pub(crate) fn count(&self, verb: Verb, resource: &str) {
        *lock(&self.counters)
            .entry((verb, resource.to_string()))
            .or_default() += 1;
    }

    /// How many requests of a verb reached a resource id (`""` for discovery).
    pub fn requests(&self, verb: Verb, resource: &str) -> u64 {
        lock(&self.counters)
            .get(&(verb, resource.to_string()))
            .copied()
            .unwrap_or(0)
    }

    /// How many requests of a verb reached any resource.
    pub fn requests_of(&self, verb: Verb) -> u64 {
        lock(&self.counters)
            .iter()
            .filter(|((v, _), _)| *v == verb)
            .map(|(_, n)| n)
            .sum()
    }

    /// Every counter.
    pub fn request_counts(&self) -> BTreeMap<(Verb, String), u64> {
        lock(&self.counters).clone()
    }

    /// Sets every counter back to zero.
    pub fn reset_counters(&self) {
        lock(&self.counters).clear();
        lock(&self.lists).clear();
        lock(&self.bytes).clear();
    }

    /// The counters in Prometheus text format, as served at `/metrics`.
    pub fn metrics_text(&self) -> String {
        let mut out = String::from(
            "# HELP sim_requests_total Requests served, by verb and resource.\n# TYPE sim_requests_total counter\n",
        );
        for ((verb, resource), n) in lock(&self.counters).iter() {
            out.push_str(&format!(
                "sim_requests_total{{verb=\"{}\",resource=\"{resource}\"}} {n}\n",
                verb.as_str()
            ));
        }
        out.push_str(
            "# HELP sim_list_requests_total LISTs served, by how (quorum: from storage; cache: from the watch cache; streaming: a watch with sendInitialEvents) and resource.\n# TYPE sim_list_requests_total counter\n",
        );
        let lists = lock(&self.lists).clone();
        for ((kind, resource), (n, _)) in &lists {
            out.push_str(&format!(
                "sim_list_requests_total{{kind=\"{}\",resource=\"{resource}\"}} {n}\n",
                kind.as_str()
            ));
        }
        out.push_str(
            "# HELP sim_list_response_bytes_total Bytes of LIST responses (for streaming lists, the initial events), by how served and resource.\n# TYPE sim_list_response_bytes_total counter\n",
        );
        for ((kind, resource), (_, b)) in &lists {
            out.push_str(&format!(
                "sim_list_response_bytes_total{{kind=\"{}\",resource=\"{resource}\"}} {b}\n",
                kind.as_str()
            ));
        }
        out.push_str(
            "# HELP sim_response_bytes_total Response bytes, by verb (discovery documents and lists).\n# TYPE sim_response_bytes_total counter\n",
        );
        for (verb, b) in lock(&self.bytes).iter() {
            out.push_str(&format!(
                "sim_response_bytes_total{{verb=\"{}\"}} {b}\n",
                verb.as_str()
            ));
        }
        out.push_str(&format!(
            "# HELP sim_resource_version The cluster's current resourceVersion.\n# TYPE sim_resource_version gauge\nsim_resource_version {}\n",
            self.store.resource_version()
        ));
        out.push_str("# HELP sim_objects Objects held, by resource.\n# TYPE sim_objects gauge\n");
        for def in self.store.defs() {
            out.push_str(&format!(
                "sim_objects{{resource=\"{}\"}} {}\n",
                def.id(),
                self.store.count(&def.id())
            ));
        }
        out
    }

    // ---- fault injection ----

    /// Cuts every live watch connection at once, without a clean end.
    pub fn drop_watches(&self) {
        let _ = self.faults.control.send(WatchControl::Drop);
    }

    /// Sends every live watch a 410 `ERROR` event and ends it, as an apiserver does to
    /// a watcher that fell behind its cache.
    pub fn expire_watches(&self) {
        let _ = self.faults.control.send(WatchControl::Expire);
    }

    /// Sends `line` as it is (a watch event no API server sends, say) on every live
    /// watch of `resource` (its plural, with `.group` for a grouped type).
    pub fn send_watch_line(&self, resource: &str, line: &str) {
        let _ = self.faults.control.send(WatchControl::Line {
            resource: resource.into(),
            line: line.into(),
        });
    }

    /// The next `n` watch requests are accepted and never answered (no headers), until
    /// [`Cluster::release_stalls`] or the connection is cut.
    pub fn stall_next_watches(&self, n: usize) {
        self.faults.stalls_pending.store(n, Ordering::SeqCst);
    }

    /// Ends every stalled watch request (the connection closes) and cancels pending stalls.
    pub fn release_stalls(&self) {
        self.faults.stalls_pending.store(0, Ordering::SeqCst);
        self.faults.stall_release.send_modify(|g| *g += 1);
    }

    /// Takes one pending stall, if any.
    pub(crate) fn take_stall(&self) -> bool {
        self.faults
            .stalls_pending
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
    }

    /// Freezes (true) or thaws (false) every live watch: a frozen watch keeps its
    /// connection open and sends nothing, not even bookmarks or its timeout end.
    pub fn freeze_watches(&self, frozen: bool) {
        self.faults.frozen.send_replace(frozen);
    }

    /// Answers every API request with `code` (429 or 500) for a while.
    pub fn fail_requests(&self, code: u16, fail_for: FailFor) {
        let (until, remaining) = match fail_for {
            FailFor::Requests(n) => (None, Some(n)),
            FailFor::Duration(d) => (Some(Instant::now() + d), None),
        };
        *lock(&self.faults.failure) = Some(Failure {
            code,
            until,
            remaining,
        });
    }

    /// Answers every list and watch of `resource` (a plural, `None` to stop) with
    /// 200 and a body that is not JSON, as a broken API server or proxy might.
    pub fn garble(&self, resource: Option<&str>) {
        *lock(&self.faults.garbled) = resource.map(str::to_string);
    }

    /// Whether a request of `path` is answered garbled.
    pub(crate) fn garbles(&self, path: &str) -> bool {
        lock(&self.faults.garbled)
            .as_deref()
            .is_some_and(|r| path.rsplit('/').next() == Some(r))
    }

    /// Stops injected failures.
    pub fn clear_failures(&self) {
        *lock(&self.faults.failure) = None;
    }

    /// The injected failure this request gets, if any.
    pub(crate) fn injected_failure(&self) -> Option<ApiError> {
        let mut failure = lock(&self.faults.failure);
        let f = failure.as_mut()?;
        if f.until.is_some_and(|u| Instant::now() >= u) || f.remaining == Some(0) {
            *failure = None;
            return None;
        }
        if let Some(r) = f.remaining.as_mut() {
            *r -= 1;
        }
        Some(match f.code {
            429 => ApiError::too_many_requests(),
            _ => ApiError::internal("injected failure"),
        })
    }

    /// Forgets all history (as etcd compaction): older resourceVersions and continue tokens answer 410.
    pub fn compact(&self) {
        self.store.compact();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failures_end_after_their_count() {
        let c = Cluster::new(ClusterConfig::new("a"));
        c.fail_requests(429, FailFor::Requests(2));
        assert_eq!(c.injected_failure().unwrap().code, 429);
        assert_eq!(c.injected_failure().unwrap().code, 429);
        assert!(c.injected_failure().is_none());
    }

    #[test]
    fn tokens_authenticate_and_can_be_denied_or_revoked() {
        let c = Cluster::new(ClusterConfig::new("a"));
        let t = c.admin_token();
        assert_eq!(c.authenticate(Some(&t)).unwrap().0, "a-admin");
        assert_eq!(c.authenticate(Some("nope")).unwrap_err().code, 401);
        assert_eq!(c.authenticate(None).unwrap_err().code, 401);
        c.set_denied(&t, "pods", true);
        assert!(c.authenticate(Some(&t)).unwrap().1.contains("pods"));
        c.revoke_token(&t);
        assert_eq!(c.authenticate(Some(&t)).unwrap_err().code, 401);
    }

    #[test]
    fn stalls_are_taken_one_at_a_time() {
        let c = Cluster::new(ClusterConfig::new("a"));
        c.stall_next_watches(1);
        assert!(c.take_stall());
        assert!(!c.take_stall());
    }
}
