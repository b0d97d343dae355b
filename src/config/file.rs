//! The configuration file: one YAML document for everything `serve`'s flags set, plus
//! per-resource settings and cluster aliases. Its values become the flags' defaults,
//! so a flag or its environment variable still wins (flag > environment > file >
//! default) and every value is checked by the same parser as its flag. Unknown keys
//! and bad values are errors naming the key's full path (with a close match).

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use serde::Deserialize;

/// A configuration file that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum FileError {
    /// The file cannot be read.
    #[error("reading {}: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// Not YAML.
    #[error("{}: not YAML: {message}", path.display())]
    Yaml {
        /// The file.
        path: PathBuf,
        /// The parser's message, with the line and column.
        message: String,
    },
    /// A key fleetscope does not know.
    #[error("{}: unknown key {key:?}{}", path.display(), suggestion(hint))]
    UnknownKey {
        /// The file.
        path: PathBuf,
        /// The key's full path.
        key: String,
        /// A known key close to it.
        hint: Option<String>,
    },
    /// A value that cannot be used, with its key's full path.
    #[error("{}: {key}: {message}", path.display())]
    Value {
        /// The file.
        path: PathBuf,
        /// The key's full path.
        key: String,
        /// Why.
        message: String,
    },
}

fn suggestion(hint: &Option<String>) -> String {
    hint.as_ref()
        .map(|h| format!(" (did you mean {h:?}?)"))
        .unwrap_or_default()
}

/// The file's document. Every key is optional.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FileConfig {
    /// The gRPC listen address (`--listen`).
    pub listen: Option<String>,
    /// The metrics listen address (`--metrics-listen`).
    pub metrics_listen: Option<String>,
    /// `text` or `json` (`--log-format`); read at start.
    pub log_format: Option<String>,
    /// Kubeconfig files (`--kubeconfig`).
    pub kubeconfigs: Option<Vec<PathBuf>>,
    /// Context names or globs (`--context`).
    pub contexts: Option<Vec<String>>,
    /// The cluster fleetscope runs in.
    pub in_cluster: Option<InCluster>,
    /// Cluster labels and aliases.
    pub clusters: Option<Clusters>,
    /// The resource types to collect, each with its own settings.
    pub resources: Option<Resources>,
    /// JSON paths indexed for field selectors and counts (`--field-index`).
    pub field_indexes: Option<Vec<String>>,
    /// What is pruned from every object.
    pub pruning: Option<PruningFile>,
    /// How the clusters are read.
    pub informer: Option<InformerFile>,
    /// What is kept for resuming watches.
    pub retention: Option<RetentionFile>,
    /// Watch streams.
    pub watch: Option<WatchFile>,
    /// The data directory and its store.
    pub store: Option<StoreFile>,
    /// The gRPC server's limits.
    pub grpc: Option<GrpcFile>,
    /// TLS, authentication and the policy.
    pub security: Option<SecurityFile>,
}

/// `security:`.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SecurityFile {
    /// The serving certificate chain (`--tls-cert`).
    pub tls_cert: Option<PathBuf>,
    /// Its key (`--tls-key`).
    pub tls_key: Option<PathBuf>,
    /// CAs of client certificates (`--client-ca`).
    pub client_ca: Option<PathBuf>,
    /// The bearer tokens (`--tokens-file`).
    pub tokens_file: Option<PathBuf>,
    /// The grants (`--policy`).
    pub policy: Option<PathBuf>,
    /// Plaintext beyond loopback (`--insecure-listen`).
    pub insecure_listen: Option<bool>,
    /// Health checking served to anyone (`--open-health`).
    pub open_health: Option<bool>,
    /// Reflection served to anyone (`--open-reflection`).
    pub open_reflection: Option<bool>,
    /// Delegated authentication: tokens checked with a TokenReview.
    pub token_review: Option<TokenReviewFile>,
    /// Delegated authorization: each cluster's RBAC (`--rbac-authorization`).
    pub rbac_authorization: Option<bool>,
}

/// `security.tokenReview:`.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TokenReviewFile {
    /// The reviewing cluster's context, or `in-cluster` (`--token-review-context`).
    pub context: Option<String>,
    /// How long an accepted token is trusted (`--token-review-ttl`).
    pub ttl: Option<String>,
    /// How long a refused token is refused (`--token-review-negative-ttl`).
    pub negative_ttl: Option<String>,
    /// The longest a review may take (`--token-review-timeout`).
    pub timeout: Option<String>,
    /// The audiences (`--token-review-audience`).
    pub audiences: Option<Vec<String>>,
}

/// `grpc:`.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GrpcFile {
    /// The longest a request may take to its response (`--grpc-request-timeout`).
    pub request_timeout: Option<String>,
    /// Requests handled at once (`--grpc-max-in-flight`).
    pub max_in_flight: Option<u64>,
    /// Connections open at once (`--grpc-max-connections`).
    pub max_connections: Option<u64>,
    /// How long a connection may take to its handshake (`--grpc-handshake-timeout`).
    pub handshake_timeout: Option<String>,
    /// Connections one address may have open (`--grpc-max-connections-per-address`).
    pub max_connections_per_address: Option<u64>,
    /// How long a connection may have no call open (`--grpc-idle-timeout`).
    pub idle_timeout: Option<String>,
    /// Silence before a keepalive PING (`--grpc-keepalive-interval`).
    pub keepalive_interval: Option<String>,
    /// How long a PING may go unanswered (`--grpc-keepalive-timeout`).
    pub keepalive_timeout: Option<String>,
    /// The longest a List page or Count may take to evaluate (`--query-timeout`).
    pub query_timeout: Option<String>,
    /// Watch streams one caller may have open (`--grpc-max-watches-per-caller`).
    pub max_watches_per_caller: Option<u64>,
}

/// `inCluster:`.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InCluster {
    /// Watch the cluster fleetscope runs in (`--in-cluster`).
    pub enabled: Option<bool>,
    /// Its name (`--in-cluster-name`).
    pub name: Option<String>,
}

/// `clusters:`.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Clusters {
    /// Labels by cluster name glob (`--cluster-label`).
    pub labels: Option<Vec<LabelRule>>,
    /// Names for contexts: context → the cluster's name in fleetscope (`--cluster-alias`).
    pub aliases: Option<BTreeMap<String, String>>,
}

/// One `clusters.labels` entry.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LabelRule {
    /// A glob over cluster names.
    #[serde(rename = "match")]
    pub matches: String,
    /// The labels of the clusters it matches.
    pub labels: BTreeMap<String, String>,
}

/// `resources:`: a list of names, or a map from name to that type's settings.
#[derive(Debug, Default)]
pub struct Resources(pub Vec<(String, ResourceSettings)>);

/// One resource type's settings (all optional).
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ResourceSettings {
    /// Collect only this namespace.
    pub namespace: Option<String>,
    /// A server-side label selector.
    pub label_selector: Option<String>,
    /// A server-side field selector.
    pub field_selector: Option<String>,
    /// `keep` or `drop` this type's `metadata.managedFields`.
    pub managed_fields: Option<String>,
    /// The annotations pruned from this type's objects.
    pub prune_annotations: Option<Vec<String>>,
    /// JSON paths of this type to index (added to the fleet's field indexes).
    pub field_indexes: Option<Vec<String>>,
}

impl<'de> Deserialize<'de> for Resources {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visit;
        impl<'de> serde::de::Visitor<'de> for Visit {
            type Value = Resources;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a list of resource types, or a map from resource type to its settings")
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<Resources, A::Error> {
                let mut out = Vec::new();
                while let Some(name) = seq.next_element::<String>()? {
                    out.push((name, ResourceSettings::default()));
                }
                Ok(Resources(out))
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<Resources, A::Error> {
                let mut out = Vec::new();
                while let Some(name) = map.next_key::<String>()? {
                    let settings = map.next_value::<Option<ResourceSettings>>()?;
                    out.push((name, settings.unwrap_or_default()));
                }
                Ok(Resources(out))
            }
        }
        d.deserialize_any(Visit)
    }
}

/// `pruning:`.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PruningFile {
    /// `keep` or `drop` (default) `metadata.managedFields` (`--keep-managed-fields`).
    pub managed_fields: Option<String>,
    /// Annotations pruned from every object, besides kubectl's last-applied one
    /// (`--prune-annotation`).
    pub annotations: Option<Vec<String>>,
    /// `keep` or `drop` (default) kubectl's last-applied annotation
    /// (`--keep-last-applied`); dropped from Secrets whatever this says.
    pub last_applied: Option<String>,
}

/// `informer:`.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InformerFile {
    /// LIST page size (`--page-size`).
    pub page_size: Option<u32>,
    /// Ask for streaming lists (`--watch-list`).
    pub watch_list: Option<bool>,
    /// Objects per part of a first streaming list (`--list-part`).
    pub list_part: Option<usize>,
    /// The longest an exec credential plugin may run (`--exec-timeout`).
    pub exec_timeout: Option<String>,
}

/// `retention:`.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RetentionFile {
    /// Events kept for resuming watches (`--event-log`).
    pub events: Option<u64>,
    /// Their most size in MiB (`--event-log-mib`).
    pub events_mib: Option<u64>,
    /// The persisted log's share of the objects' size (`--event-log-disk-share`).
    pub disk_share: Option<f64>,
}

/// `watch:`.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WatchFile {
    /// Events a subscriber may fall behind (`--subscriber-buffer`).
    pub subscriber_buffer: Option<u64>,
    /// Time between bookmarks (`--bookmark-seconds`), a duration (`30s`).
    pub bookmark_interval: Option<String>,
    /// How long a Watch may leave its events unread (`--watch-stall-timeout`).
    pub stall_timeout: Option<String>,
}

/// `store:`.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StoreFile {
    /// The data directory (`--data-dir`).
    pub data_dir: Option<PathBuf>,
    /// `false` runs in memory only (`--no-persist`).
    pub persist: Option<bool>,
    /// Keep the objects of clusters no longer configured (`--keep-removed-clusters`).
    pub keep_removed_clusters: Option<bool>,
    /// Compaction threshold (`--compact-share`).
    pub compact_share: Option<f64>,
    /// Never compact below this size (`--compact-min-mib`).
    pub compact_min_mib: Option<u64>,
}

/// Every key the file knows, for close-match suggestions.
const KEYS: &[&str] = &[
    "listen",
    "metricsListen",
    "logFormat",
    "kubeconfigs",
    "contexts",
    "inCluster",
    "enabled",
    "name",
    "clusters",
    "labels",
    "match",
    "aliases",
    "resources",
    "namespace",
    "labelSelector",
    "fieldSelector",
    "managedFields",
    "pruneAnnotations",
    "fieldIndexes",
    "pruning",
    "annotations",
    "lastApplied",
    "informer",
    "pageSize",
    "watchList",
    "listPart",
    "execTimeout",
    "retention",
    "events",
    "eventsMib",
    "diskShare",
    "watch",
    "subscriberBuffer",
    "bookmarkInterval",
    "store",
    "dataDir",
    "persist",
    "keepRemovedClusters",
    "compactShare",
    "compactMinMib",
    "grpc",
    "requestTimeout",
    "maxInFlight",
    "maxConnections",
    "handshakeTimeout",
    "maxConnectionsPerAddress",
    "idleTimeout",
    "keepaliveInterval",
    "keepaliveTimeout",
    "queryTimeout",
    "maxWatchesPerCaller",
    "stallTimeout",
    "security",
    "tlsCert",
    "tlsKey",
    "clientCa",
    "tokensFile",
    "policy",
    "insecureListen",
    "openHealth",
    "openReflection",
    "tokenReview",
    "context",
    "ttl",
    "negativeTtl",
    "timeout",
    "audiences",
    "rbacAuthorization",
];

/// Each flag's key in the file, by the flag's clap id.
const KEY_OF: &[(&str, &str)] = &[
    ("listen", "listen"),
    ("metrics_listen", "metricsListen"),
    ("log_format", "logFormat"),
    ("kubeconfigs", "kubeconfigs"),
    ("contexts", "contexts"),
    ("in_cluster", "inCluster.enabled"),
    ("in_cluster_name", "inCluster.name"),
    ("cluster_labels", "clusters.labels"),
    ("cluster_aliases", "clusters.aliases"),
    ("resources", "resources"),
    ("scopes", "resources.*"),
    ("field_indexes", "fieldIndexes"),
    ("keep_managed_fields", "pruning.managedFields"),
    ("prune_annotations", "pruning.annotations"),
    ("keep_last_applied", "pruning.lastApplied"),
    ("page_size", "informer.pageSize"),
    ("watch_list", "informer.watchList"),
    ("list_part", "informer.listPart"),
    ("exec_timeout", "informer.execTimeout"),
    ("event_log", "retention.events"),
    ("event_log_mib", "retention.eventsMib"),
    ("event_log_disk_share", "retention.diskShare"),
    ("subscriber_buffer", "watch.subscriberBuffer"),
    ("bookmark_seconds", "watch.bookmarkInterval"),
    ("data_dir", "store.dataDir"),
    ("no_persist", "store.persist"),
    ("keep_removed_clusters", "store.keepRemovedClusters"),
    ("compact_share", "store.compactShare"),
    ("compact_min_mib", "store.compactMinMib"),
    ("grpc_request_timeout", "grpc.requestTimeout"),
    ("grpc_max_in_flight", "grpc.maxInFlight"),
    ("grpc_max_connections", "grpc.maxConnections"),
    ("grpc_handshake_timeout", "grpc.handshakeTimeout"),
    (
        "grpc_max_connections_per_address",
        "grpc.maxConnectionsPerAddress",
    ),
    ("grpc_idle_timeout", "grpc.idleTimeout"),
    ("grpc_keepalive_interval", "grpc.keepaliveInterval"),
    ("grpc_keepalive_timeout", "grpc.keepaliveTimeout"),
    ("query_timeout", "grpc.queryTimeout"),
    ("grpc_max_watches_per_caller", "grpc.maxWatchesPerCaller"),
    ("watch_stall_timeout", "watch.stallTimeout"),
    ("tls_cert", "security.tlsCert"),
    ("tls_key", "security.tlsKey"),
    ("client_ca", "security.clientCa"),
    ("tokens_file", "security.tokensFile"),
    ("policy", "security.policy"),
    ("insecure_listen", "security.insecureListen"),
    ("open_health", "security.openHealth"),
    ("open_reflection", "security.openReflection"),
    ("token_review_context", "security.tokenReview.context"),
    ("token_review_ttl", "security.tokenReview.ttl"),
    ("token_review_timeout", "security.tokenReview.timeout"),
    (
        "token_review_negative_ttl",
        "security.tokenReview.negativeTtl",
    ),
    ("token_review_audiences", "security.tokenReview.audiences"),
    ("rbac_authorization", "security.rbacAuthorization"),
];

/// The file key of a flag (by clap id); `-` for a flag the file does not set.
pub fn key_of(arg: &str) -> &'static str {
    KEY_OF
        .iter()
        .find(|(a, _)| *a == arg)
        .map_or("-", |(_, k)| k)
}

/// The known key closest to `key`, when one is close.
fn close_match(keys: &[&str], key: &str) -> Option<String> {
    keys.iter()
        .map(|k| {
            (
                strsim::jaro_winkler(&key.to_lowercase(), &k.to_lowercase()),
                k,
            )
        })
        .filter(|(score, _)| *score > 0.8)
        .max_by(|a, b| a.0.total_cmp(&b.0))
        .map(|(_, k)| k.to_string())
}

/// Reads and checks the shape of a configuration file.
pub fn read(path: &Path) -> Result<FileConfig, FileError> {
    parse(path, &text_of(path)?)
}

/// A file's text, or an error naming it.
pub(crate) fn text_of(path: &Path) -> Result<String, FileError> {
    std::fs::read_to_string(path).map_err(|source| FileError::Read {
        path: path.to_path_buf(),
        source,
    })
}

/// Parses a configuration document; `path` names it in errors.
pub fn parse(path: &Path, text: &str) -> Result<FileConfig, FileError> {
    Ok(document(path, text, KEYS)?.unwrap_or_default())
}

/// Reads a YAML document (`None` when the file is empty): YAML 1.2's booleans only
/// (`namespace: no` is the string "no"), every key known (an unknown one is an error
/// naming its full path and the closest of `keys`), every value's error naming its key.
pub(crate) fn document<T: serde::de::DeserializeOwned>(
    path: &Path,
    text: &str,
    keys: &[&str],
) -> Result<Option<T>, FileError> {
    let value: serde_json::Value = if text.trim().is_empty() {
        serde_json::Value::Null
    } else {
        let mut options = serde_saphyr::Options::default();
        options.strict_booleans = true;
        serde_saphyr::from_str_with_options(text, options).map_err(|e| FileError::Yaml {
            path: path.to_path_buf(),
            message: e.to_string(),
        })?
    };
    if value.is_null() {
        return Ok(None);
    }
    let mut unknown = Vec::new();
    let mut note = |p: serde_ignored::Path<'_>| unknown.push(p.to_string());
    let de = serde_ignored::Deserializer::new(value, &mut note);
    let document: T = serde_path_to_error::deserialize(de).map_err(|e| {
        let key = e.path().to_string();
        FileError::Value {
            path: path.to_path_buf(),
            key: if key == "." {
                "(top level)".into()
            } else {
                key
            },
            message: e.into_inner().to_string(),
        }
    })?;
    if let Some(key) = unknown.into_iter().next() {
        // Optional values add a `?` step to the path; the file has none.
        let key = key
            .split('.')
            .filter(|step| *step != "?")
            .collect::<Vec<_>>()
            .join(".");
        let last = key.rsplit('.').next().unwrap_or(&key).to_string();
        return Err(FileError::UnknownKey {
            path: path.to_path_buf(),
            hint: close_match(keys, &last),
            key,
        });
    }
    Ok(Some(document))
}

/// One setting the file gives: the flag it stands for (by clap id), its values as the
/// flag would take them, and its key in the file.
#[derive(Debug, Clone, PartialEq)]
pub struct Given {
    /// The key's path in the file.
    pub key: &'static str,
    /// The flag's clap id.
    pub arg: &'static str,
    /// The values, as on the command line.
    pub values: Vec<String>,
}

impl FileConfig {
    /// The file's values as flag values, checked where a flag's text form needs it
    /// (no `;` inside scope parts, durations, `keep`/`drop`).
    pub fn given(&self, path: &Path) -> Result<Vec<Given>, FileError> {
        let bad = |key: &str, message: String| FileError::Value {
            path: path.to_path_buf(),
            key: key.to_string(),
            message,
        };
        let mut out = Vec::new();
        let mut give = |key: &'static str, arg: &'static str, values: Vec<String>| {
            out.push(Given { key, arg, values });
        };
        let one = |v: &dyn fmt::Display| vec![v.to_string()];
        if let Some(v) = &self.listen {
            give("listen", "listen", one(v));
        }
        if let Some(v) = &self.metrics_listen {
            give("metricsListen", "metrics_listen", one(v));
        }
        if let Some(v) = &self.log_format {
            give("logFormat", "log_format", one(v));
        }
        if let Some(v) = &self.kubeconfigs {
            give(
                "kubeconfigs",
                "kubeconfigs",
                v.iter().map(|p| p.display().to_string()).collect(),
            );
        }
        if let Some(v) = &self.contexts {
            give("contexts", "contexts", v.clone());
        }
        if let Some(c) = &self.in_cluster {
            if let Some(v) = c.enabled {
                give("inCluster.enabled", "in_cluster", one(&v));
            }
            if let Some(v) = &c.name {
                give("inCluster.name", "in_cluster_name", one(v));
            }
        }
        if let Some(c) = &self.clusters {
            if let Some(rules) = &c.labels {
                let mut specs = Vec::new();
                for (i, r) in rules.iter().enumerate() {
                    if r.matches.contains(':') {
                        return Err(bad(
                            &format!("clusters.labels[{i}].match"),
                            format!("{:?}: a cluster name glob has no ':'", r.matches),
                        ));
                    }
                    for (k, v) in &r.labels {
                        if k.contains([',', '=']) || v.contains([',', '=']) {
                            return Err(bad(
                                &format!("clusters.labels[{i}].labels.{k}"),
                                "label keys and values have no ',' or '='".into(),
                            ));
                        }
                    }
                    let labels: Vec<String> =
                        r.labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
                    specs.push(format!("{}:{}", r.matches, labels.join(",")));
                }
                give("clusters.labels", "cluster_labels", specs);
            }
            if let Some(aliases) = &c.aliases {
                give(
                    "clusters.aliases",
                    "cluster_aliases",
                    aliases.iter().map(|(k, v)| format!("{k}={v}")).collect(),
                );
            }
        }
        let mut field_indexes: Option<Vec<String>> = self.field_indexes.clone();
        if let Some(Resources(list)) = &self.resources {
            give(
                "resources",
                "resources",
                list.iter().map(|(n, _)| n.clone()).collect(),
            );
            let mut scopes = Vec::new();
            for (name, s) in list {
                let mut parts = Vec::new();
                let mut part = |key: &str, option: &str, value: &str| -> Result<(), FileError> {
                    if value.contains(';') {
                        return Err(bad(
                            &format!("resources.{name}.{key}"),
                            format!("{value:?} has a ';'"),
                        ));
                    }
                    parts.push(format!("{option}={value}"));
                    Ok(())
                };
                if let Some(v) = &s.namespace {
                    part("namespace", "namespace", v)?;
                }
                if let Some(v) = &s.label_selector {
                    fleetscope_model::LabelSelector::parse(v).map_err(|e| {
                        bad(&format!("resources.{name}.labelSelector"), e.to_string())
                    })?;
                    part("labelSelector", "labels", v)?;
                }
                if let Some(v) = &s.field_selector {
                    fleetscope_model::FieldSelector::parse(v).map_err(|e| {
                        bad(&format!("resources.{name}.fieldSelector"), e.to_string())
                    })?;
                    part("fieldSelector", "fields", v)?;
                }
                if let Some(v) = &s.managed_fields {
                    keep_or_drop(v)
                        .map_err(|m| bad(&format!("resources.{name}.managedFields"), m))?;
                    part("managedFields", "managedFields", v)?;
                }
                if let Some(v) = &s.prune_annotations {
                    part("pruneAnnotations", "pruneAnnotations", &v.join(","))?;
                }
                if let Some(paths) = &s.field_indexes {
                    let all = field_indexes.get_or_insert_with(Vec::new);
                    for p in paths {
                        if !all.contains(p) {
                            all.push(p.clone());
                        }
                    }
                }
                if !parts.is_empty() {
                    scopes.push(format!("{name}:{}", parts.join(";")));
                }
            }
            if !scopes.is_empty() {
                give("resources.*", "scopes", scopes);
            }
        }
        if let Some(v) = field_indexes {
            give("fieldIndexes", "field_indexes", v);
        }
        if let Some(p) = &self.pruning {
            if let Some(v) = &p.managed_fields {
                let drop = keep_or_drop(v).map_err(|m| bad("pruning.managedFields", m))?;
                give("pruning.managedFields", "keep_managed_fields", one(&!drop));
            }
            if let Some(v) = &p.annotations {
                give("pruning.annotations", "prune_annotations", v.clone());
            }
            if let Some(v) = &p.last_applied {
                let drop = keep_or_drop(v).map_err(|m| bad("pruning.lastApplied", m))?;
                give("pruning.lastApplied", "keep_last_applied", one(&!drop));
            }
        }
        if let Some(i) = &self.informer {
            if let Some(v) = i.page_size {
                give("informer.pageSize", "page_size", one(&v));
            }
            if let Some(v) = i.watch_list {
                give("informer.watchList", "watch_list", one(&v));
            }
            if let Some(v) = i.list_part {
                give("informer.listPart", "list_part", one(&v));
            }
            if let Some(v) = &i.exec_timeout {
                give("informer.execTimeout", "exec_timeout", one(v));
            }
        }
        if let Some(r) = &self.retention {
            if let Some(v) = r.events {
                give("retention.events", "event_log", one(&v));
            }
            if let Some(v) = r.events_mib {
                give("retention.eventsMib", "event_log_mib", one(&v));
            }
            if let Some(v) = r.disk_share {
                give("retention.diskShare", "event_log_disk_share", one(&v));
            }
        }
        if let Some(w) = &self.watch {
            if let Some(v) = w.subscriber_buffer {
                give("watch.subscriberBuffer", "subscriber_buffer", one(&v));
            }
            if let Some(v) = &w.bookmark_interval {
                let d = super::parse_duration(v).map_err(|m| bad("watch.bookmarkInterval", m))?;
                give(
                    "watch.bookmarkInterval",
                    "bookmark_seconds",
                    one(&d.as_secs().max(1)),
                );
            }
            if let Some(v) = &w.stall_timeout {
                give("watch.stallTimeout", "watch_stall_timeout", one(v));
            }
        }
        if let Some(s) = &self.store {
            if let Some(v) = &s.data_dir {
                give("store.dataDir", "data_dir", one(&v.display()));
            }
            if let Some(v) = s.persist {
                give("store.persist", "no_persist", one(&!v));
            }
            if let Some(v) = s.keep_removed_clusters {
                give(
                    "store.keepRemovedClusters",
                    "keep_removed_clusters",
                    one(&v),
                );
            }
            if let Some(v) = s.compact_share {
                give("store.compactShare", "compact_share", one(&v));
            }
            if let Some(v) = s.compact_min_mib {
                give("store.compactMinMib", "compact_min_mib", one(&v));
            }
        }
        if let Some(g) = &self.grpc {
            if let Some(v) = &g.request_timeout {
                give("grpc.requestTimeout", "grpc_request_timeout", one(v));
            }
            if let Some(v) = g.max_in_flight {
                give("grpc.maxInFlight", "grpc_max_in_flight", one(&v));
            }
            if let Some(v) = g.max_connections {
                give("grpc.maxConnections", "grpc_max_connections", one(&v));
            }
            if let Some(v) = &g.handshake_timeout {
                give("grpc.handshakeTimeout", "grpc_handshake_timeout", one(v));
            }
            if let Some(v) = g.max_connections_per_address {
                give(
                    "grpc.maxConnectionsPerAddress",
                    "grpc_max_connections_per_address",
                    one(&v),
                );
            }
            if let Some(v) = &g.idle_timeout {
                give("grpc.idleTimeout", "grpc_idle_timeout", one(v));
            }
            if let Some(v) = &g.keepalive_interval {
                give("grpc.keepaliveInterval", "grpc_keepalive_interval", one(v));
            }
            if let Some(v) = &g.keepalive_timeout {
                give("grpc.keepaliveTimeout", "grpc_keepalive_timeout", one(v));
            }
            if let Some(v) = &g.query_timeout {
                give("grpc.queryTimeout", "query_timeout", one(v));
            }
            if let Some(v) = g.max_watches_per_caller {
                give(
                    "grpc.maxWatchesPerCaller",
                    "grpc_max_watches_per_caller",
                    one(&v),
                );
            }
        }
        if let Some(x) = &self.security {
            let path = |p: &PathBuf| vec![p.display().to_string()];
            if let Some(v) = &x.tls_cert {
                give("security.tlsCert", "tls_cert", path(v));
            }
            if let Some(v) = &x.tls_key {
                give("security.tlsKey", "tls_key", path(v));
            }
            if let Some(v) = &x.client_ca {
                give("security.clientCa", "client_ca", path(v));
            }
            if let Some(v) = &x.tokens_file {
                give("security.tokensFile", "tokens_file", path(v));
            }
            if let Some(v) = &x.policy {
                give("security.policy", "policy", path(v));
            }
            if let Some(v) = x.insecure_listen {
                give("security.insecureListen", "insecure_listen", one(&v));
            }
            if let Some(v) = x.open_health {
                give("security.openHealth", "open_health", one(&v));
            }
            if let Some(v) = x.open_reflection {
                give("security.openReflection", "open_reflection", one(&v));
            }
            if let Some(v) = x.rbac_authorization {
                give("security.rbacAuthorization", "rbac_authorization", one(&v));
            }
            if let Some(r) = &x.token_review {
                if let Some(v) = &r.context {
                    give(
                        "security.tokenReview.context",
                        "token_review_context",
                        one(v),
                    );
                }
                if let Some(v) = &r.ttl {
                    give("security.tokenReview.ttl", "token_review_ttl", one(v));
                }
                if let Some(v) = &r.timeout {
                    give(
                        "security.tokenReview.timeout",
                        "token_review_timeout",
                        one(v),
                    );
                }
                if let Some(v) = &r.negative_ttl {
                    give(
                        "security.tokenReview.negativeTtl",
                        "token_review_negative_ttl",
                        one(v),
                    );
                }
                if let Some(v) = &r.audiences {
                    give(
                        "security.tokenReview.audiences",
                        "token_review_audiences",
                        v.clone(),
                    );
                }
            }
        }
        Ok(out)
    }
}

/// `keep` or `drop`, as "drop it".
fn keep_or_drop(v: &str) -> Result<bool, String> {
    match v {
        "keep" => Ok(false),
        "drop" => Ok(true),
        other => Err(format!("{other:?}: expected keep or drop")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parsed(text: &str) -> Result<FileConfig, String> {
        parse(Path::new("fleetscope.yaml"), text).map_err(|e| e.to_string())
    }

    #[test]
    fn each_value_is_given_under_its_flags_key() {
        let c = parsed(
            "listen: a:1\nclusters: {labels: [{match: x, labels: {a: b}}], aliases: {c: d}}\nresources: {pods: {namespace: n}}\nstore: {persist: false}\n",
        )
        .unwrap();
        for g in c.given(Path::new("f")).unwrap() {
            assert_eq!(key_of(g.arg), g.key, "{g:?}");
        }
    }

    #[test]
    fn the_shipped_example_is_valid_and_sets_every_key() {
        let path =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/kubernetes/base/fleetscope.yaml");
        let given = read(&path).unwrap().given(&path).unwrap();
        for (arg, key) in KEY_OF {
            assert!(
                given.iter().any(|g| g.arg == *arg),
                "the example lacks {key}"
            );
        }
    }

    #[test]
    fn an_empty_file_sets_nothing() {
        let c = parsed("").unwrap();
        assert!(c.given(Path::new("f")).unwrap().is_empty());
        let c = parsed("# only a comment\n").unwrap();
        assert!(c.given(Path::new("f")).unwrap().is_empty());
    }

    #[test]
    fn unknown_keys_are_named_by_their_full_path_with_a_close_match() {
        let e = parsed("retention:\n  evnts: 10\n").unwrap_err();
        assert!(e.contains("\"retention.evnts\""), "{e}");
        assert!(e.contains("did you mean \"events\""), "{e}");
        let e = parsed("resources:\n  pods:\n    nmespace: x\n").unwrap_err();
        assert!(e.contains("resources.pods.nmespace"), "{e}");
        assert!(e.contains("\"namespace\""), "{e}");
        let e = parsed("resources: {pods: {namespace: no}}\nstore: {persist: yes}\n").unwrap_err();
        assert!(
            e.contains("store.persist"),
            "YAML 1.1 booleans are strings: {e}"
        );
        let e = parsed("colour: blue\n").unwrap_err();
        assert!(e.contains("unknown key \"colour\""), "{e}");
        assert!(!e.contains("did you mean"), "{e}");
    }

    #[test]
    fn bad_values_are_named_by_their_full_path() {
        let e = parsed("informer:\n  pageSize: lots\n").unwrap_err();
        assert!(e.contains("informer.pageSize"), "{e}");
        let e =
            parsed("clusters:\n  labels:\n    - match: prod-*\n      labels: [a]\n").unwrap_err();
        assert!(e.contains("clusters.labels[0].labels"), "{e}");
        let e = parsed("pruning:\n  managedFields: sometimes\n")
            .unwrap()
            .given(Path::new("f"))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("pruning.managedFields") && e.contains("keep or drop"),
            "{e}"
        );
        let e = parsed("watch:\n  bookmarkInterval: soon\n")
            .unwrap()
            .given(Path::new("f"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("watch.bookmarkInterval"), "{e}");
        let e = parsed("listen: [1, 2\n").unwrap_err();
        assert!(e.contains("not YAML"), "{e}");
        let e = parsed("- a\n- b\n").unwrap_err();
        assert!(e.contains("(top level)"), "{e}");
    }

    #[test]
    fn resources_are_a_list_or_a_map_of_settings() {
        let list = parsed("resources: [pods, deployments.apps]\n").unwrap();
        let given = list.given(Path::new("f")).unwrap();
        assert_eq!(given[0].arg, "resources");
        assert_eq!(given[0].values, ["pods", "deployments.apps"]);
        let map = parsed(
            "resources:\n  pods:\n    fieldIndexes: [spec.nodeName]\n  configmaps:\n    namespace: team-0\n    labelSelector: app in (web,api)\n    managedFields: keep\n    pruneAnnotations: [a, b]\n  nodes:\nfieldIndexes: [status.phase]\n",
        )
        .unwrap();
        let given = map.given(Path::new("f")).unwrap();
        let of = |arg: &str| given.iter().find(|g| g.arg == arg).unwrap().values.clone();
        assert_eq!(of("resources"), ["pods", "configmaps", "nodes"]);
        assert_eq!(
            of("scopes"),
            [
                "configmaps:namespace=team-0;labels=app in (web,api);managedFields=keep;pruneAnnotations=a,b"
            ]
        );
        assert_eq!(of("field_indexes"), ["status.phase", "spec.nodeName"]);
        let scope = fleetscope_informer::cluster::Scope::parse(&of("scopes")[0]).unwrap();
        assert_eq!(scope.prune_managed_fields, Some(false));
        assert_eq!(scope.prune_annotations, Some(vec!["a".into(), "b".into()]));
    }
}
