//! `serve`'s, `demo`'s and `sim`'s flags: each setting of `serve` is declared once, on
//! its field (see [`super::settings`]): the flag, its environment variable, its
//! default and its documentation in the `#[arg]` and doc comment, its key in the
//! configuration file and when a change applies in the `[key, kind, applies]` before
//! it. The file reader, `config check`, the unknown-key hints and the reload all read
//! that one declaration.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

use super::settings::Setting;
use crate::engine::{ClusterLabels, EngineConfig, Scope, ScopeError};
use crate::grpc::ServiceConfig;

/// A flag whose value cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ArgsError {
    /// A value that does not make sense, named with its flag.
    #[error("{0}")]
    Invalid(String),
    /// A `--scope` that does not parse.
    #[error("--scope {scope:?}")]
    Scope {
        /// The flag's value.
        scope: String,
        /// Why.
        #[source]
        source: ScopeError,
    },
}

/// A `host:port` address: an IP address or a name (`localhost:50051`, `[::1]:50051`).
pub fn host_port(s: &str) -> Result<String, String> {
    let expected =
        || format!("{s:?} is not HOST:PORT (e.g. 127.0.0.1:50051, localhost:50051, [::1]:50051)");
    let (host, port) = s.rsplit_once(':').ok_or_else(expected)?;
    port.parse::<u16>().map_err(|_| expected())?;
    let bare = host.strip_prefix('[').and_then(|h| h.strip_suffix(']'));
    let valid = match bare {
        Some(v6) => v6.parse::<std::net::Ipv6Addr>().is_ok(),
        None => {
            !host.is_empty()
                && host
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.')
        }
    };
    if valid {
        Ok(s.to_string())
    } else {
        Err(expected())
    }
}

/// `Ok` when `holds`, else the invalid setting `message` describes.
pub(crate) fn ensure(holds: bool, message: &str) -> Result<(), ArgsError> {
    if holds {
        Ok(())
    } else {
        Err(ArgsError::Invalid(message.to_string()))
    }
}

/// MiB as bytes.
pub fn mib(n: u64) -> usize {
    usize::try_from(n.saturating_mul(1 << 20)).unwrap_or(usize::MAX)
}

/// Persistence defaults, with the unwritten backlog bounded like the event log.
pub fn persist_config(event_log_mib: u64) -> crate::persist::PersistConfig {
    crate::persist::PersistConfig {
        max_pending_bytes: mib(event_log_mib),
        ..Default::default()
    }
}

crate::settings! {
/// The flags of every command.
#[derive(Debug, Args)]
pub struct GlobalArgs {
    ["logFormat", Text, Restart]
    /// Log line format.
    #[arg(
        long,
        global = true,
        env = "FLEETSCOPE_LOG_FORMAT",
        value_enum,
        default_value = "text"
    )]
    pub log_format: LogFormat,
}
}

/// Every setting of `serve`, in the order of its flags.
pub fn serve_settings() -> impl Iterator<Item = &'static Setting> {
    [
        GlobalArgs::SETTINGS,
        ServeArgs::SETTINGS,
        EngineArgs::SETTINGS,
        PersistArgs::SETTINGS,
        ListenerArgs::SETTINGS,
        SecurityArgs::SETTINGS,
        ShardArgs::SETTINGS,
        RingArgs::SETTINGS,
    ]
    .into_iter()
    .flatten()
}

/// Every setting of `router`, in the order of its flags.
pub fn router_settings() -> impl Iterator<Item = &'static Setting> {
    [
        GlobalArgs::SETTINGS,
        RouterArgs::SETTINGS,
        RingArgs::SETTINGS,
        ListenerArgs::SETTINGS,
        SecurityArgs::SETTINGS,
    ]
    .into_iter()
    .flatten()
}

/// Every setting of the command named `command` (`serve`, `router`), in the order of
/// its flags; none for another.
pub fn settings_of(command: &str) -> Vec<&'static Setting> {
    match command {
        "serve" => serve_settings().collect(),
        "router" => router_settings().collect(),
        _ => Vec::new(),
    }
}

/// The log line format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// The key the Leases of the ring whose page token key is `key` are sealed with.
pub fn lease_key(key: &crate::grpc::TokenKey) -> fleetscope_ring::seal::LeaseKey {
    fleetscope_ring::seal::LeaseKey::derived(|purpose| key.derive(purpose))
}

/// The configuration file of `serve` and `router`.
#[derive(Debug, Args)]
pub struct ConfigFileArg {
    /// A YAML configuration file for every setting (docs/settings.md names each key);
    /// flags and environment variables override it. Reloaded when it changes and on
    /// SIGHUP.
    #[arg(long, env = "FLEETSCOPE_CONFIG", value_name = "FILE")]
    pub config: Option<PathBuf>,
}

crate::settings! {
/// `serve`'s flags.
#[derive(Debug, Args)]
pub struct ServeArgs {
    #[allow(missing_docs)]
    #[command(flatten)]
    pub file: ConfigFileArg,
    ["kubeconfigs", Texts, Sources]
    /// A kubeconfig file; repeat for several. Default: $KUBECONFIG (a path list), else ~/.kube/config.
    #[arg(long = "kubeconfig", value_name = "FILE")]
    pub kubeconfigs: Vec<PathBuf>,
    ["contexts", Texts, Sources]
    /// Contexts to watch, by name or glob (`prod-*`); repeat for several. Default: every context.
    #[arg(long = "context", value_name = "PATTERN")]
    pub contexts: Vec<String>,
    ["inCluster.enabled", Bool, Sources]
    /// Also watch the cluster fleetscope runs in, through its service account.
    #[arg(long, env = "FLEETSCOPE_IN_CLUSTER")]
    pub in_cluster: bool,
    ["inCluster.name", Text, Sources]
    /// The name of the in-cluster source.
    #[arg(long, default_value = "in-cluster")]
    pub in_cluster_name: String,
    ["clusters.aliases", Pairs, Sources]
    /// Another name for a context's cluster: `CONTEXT=NAME`; repeatable.
    #[arg(long = "cluster-alias", value_name = "CONTEXT=NAME")]
    pub cluster_aliases: Vec<String>,
    #[allow(missing_docs)]
    #[command(flatten)]
    pub engine: EngineArgs,
    #[allow(missing_docs)]
    #[command(flatten)]
    pub persist: PersistArgs,
    #[allow(missing_docs)]
    #[command(flatten)]
    pub security: SecurityArgs,
    #[allow(missing_docs)]
    #[command(flatten)]
    pub shard: Box<ShardArgs>,
}
}

crate::settings! {
/// The ring, as its replicas and routers both are given it.
#[derive(Debug, Args)]
pub struct RingArgs {
    ["sharding.ring", Text, Restart]
    /// The ring: a `serve` runs as one of its replicas (the clusters shared among the
    /// ring's live replicas through Leases in the coordination cluster, each cluster
    /// watched by its owners only; unset, it watches every cluster); a `router` serves
    /// the fleet its replicas hold (required).
    #[arg(long, env = "FLEETSCOPE_SHARD_RING", value_name = "NAME", value_parser = ring_name)]
    pub shard_ring: Option<String>,
    ["sharding.coordination", Text, Restart]
    /// The cluster holding the ring's Leases: a context of the kubeconfigs, or
    /// `in-cluster`.
    #[arg(long, env = "FLEETSCOPE_SHARD_COORDINATION", default_value = "in-cluster", value_name = "CONTEXT")]
    pub shard_coordination: String,
    ["sharding.leaseNamespace", Text, Restart]
    /// The namespace of the ring's Leases.
    #[arg(long, env = "FLEETSCOPE_SHARD_LEASE_NAMESPACE", default_value = "default", value_name = "NAMESPACE")]
    pub shard_lease_namespace: String,
    ["sharding.leaseDuration", Duration, Restart]
    /// How long a Lease holds without renewal: a replica silent this long is counted
    /// gone by the others and the routers, whatever its Lease says, and stops
    /// answering for its clusters itself. The same for every replica and router.
    #[arg(long, env = "FLEETSCOPE_SHARD_LEASE_DURATION", default_value = "15s", value_parser = crate::config::parse_timeout)]
    pub shard_lease_duration: Duration,
    ["sharding.pageTokenKeyFile", Text, Restart]
    /// A file of at least 32 random bytes shared by the ring's replicas and routers:
    /// page tokens are signed with it, so a router continues a replica's list and
    /// any router continues another's, and each replica seals its Lease with it, so
    /// that a Lease anyone else writes counts for nothing. Required with a ring;
    /// without one, the data directory's own key.
    #[arg(long, env = "FLEETSCOPE_SHARD_PAGE_TOKEN_KEY_FILE", value_name = "FILE")]
    pub shard_page_token_key_file: Option<PathBuf>,
}
}

crate::settings! {
/// How a replica shares the fleet's clusters with the others of its ring (off unless
/// a ring is named).
#[derive(Debug, Args)]
pub struct ShardArgs {
    #[allow(missing_docs)]
    #[command(flatten)]
    pub ring: RingArgs,
    ["sharding.identity", Text, Restart]
    /// This replica's identity in the ring, unique and kept across restarts (with its
    /// data directory). Default: the host name (a StatefulSet pod's name).
    #[arg(long, env = "FLEETSCOPE_SHARD_IDENTITY", value_name = "NAME")]
    pub shard_identity: Option<String>,
    ["sharding.advertise", Text, Restart]
    /// The address routers reach this replica's gRPC listener at, published on its
    /// Lease. Default: the host name and the listen port.
    #[arg(long, env = "FLEETSCOPE_SHARD_ADVERTISE", value_name = "HOST:PORT", value_parser = host_port)]
    pub shard_advertise: Option<String>,
    ["sharding.renewPeriod", Duration, Restart]
    /// How often a replica renews its Lease (well under the lease duration).
    #[arg(long, env = "FLEETSCOPE_SHARD_RENEW_PERIOD", default_value = "2s", value_parser = crate::config::parse_timeout)]
    pub shard_renew_period: Duration,
    ["sharding.replication", Count, Restart]
    /// Owners per cluster: 1, or 2 so that losing one replica loses no cluster.
    #[arg(long, env = "FLEETSCOPE_SHARD_REPLICATION", default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=2))]
    pub shard_replication: u64,
}
}

crate::settings! {
/// `router`'s flags: the ring it serves, how it reaches the replicas, and how its
/// callers are secured.
#[derive(Debug, Args)]
pub struct RouterArgs {
    #[allow(missing_docs)]
    #[command(flatten)]
    pub file: ConfigFileArg,
    ["kubeconfigs", Texts, Restart]
    /// A kubeconfig file holding the coordination cluster's context; repeat for
    /// several. Default: $KUBECONFIG (a path list), else ~/.kube/config.
    #[arg(long = "kubeconfig", value_name = "FILE")]
    pub kubeconfigs: Vec<PathBuf>,
    #[allow(missing_docs)]
    #[command(flatten)]
    pub ring: RingArgs,
    ["router.replicaTimeout", Duration, Restart]
    /// How long the router waits for a replica (to connect, and for its answer or a
    /// Watch's start) before asking each of its clusters' next holder: a replica that
    /// stopped (before its Lease expires) costs a request this long, not more.
    #[arg(long, env = "FLEETSCOPE_REPLICA_TIMEOUT", default_value = "5s", value_parser = crate::config::parse_timeout)]
    pub replica_timeout: Duration,
    ["router.replicaCa", Text, Restart]
    /// The CA certificates (PEM) the replicas' server certificates are verified with;
    /// without it the replicas are reached in plaintext (loopback only).
    #[arg(long, env = "FLEETSCOPE_REPLICA_CA", value_name = "FILE")]
    pub replica_ca: Option<PathBuf>,
    ["router.replicaCert", Text, Restart]
    /// The router's client certificate (PEM) for the replicas, which name its user
    /// with --router-name: the router then passes its callers' identities.
    #[arg(long, env = "FLEETSCOPE_REPLICA_CERT", value_name = "FILE", requires = "replica_key")]
    pub replica_cert: Option<PathBuf>,
    ["router.replicaKey", Text, Restart]
    /// The key of --replica-cert.
    #[arg(long, env = "FLEETSCOPE_REPLICA_KEY", value_name = "FILE", requires = "replica_cert")]
    pub replica_key: Option<PathBuf>,
    #[allow(missing_docs)]
    #[command(flatten)]
    pub listener: ListenerArgs,
    #[allow(missing_docs)]
    #[command(flatten)]
    pub security: SecurityArgs,
}
}

impl RouterArgs {
    /// The ring the router serves and the ring's key, read from
    /// `--shard-page-token-key-file`: both required.
    pub fn ring_and_key(&self) -> Result<(String, crate::grpc::TokenKey), ArgsError> {
        let ring = self.ring.shard_ring.clone().ok_or_else(|| {
            ArgsError::Invalid(
                "--shard-ring (sharding.ring) is required: the ring whose replicas the router serves"
                    .into(),
            )
        })?;
        let file = self.ring.shard_page_token_key_file.as_ref().ok_or_else(|| {
            ArgsError::Invalid(
                "--shard-page-token-key-file (sharding.pageTokenKeyFile) is required: the ring's key, which its replicas seal their Leases and sign page tokens with".into(),
            )
        })?;
        let key = crate::grpc::TokenKey::from_file(file)
            .map_err(|e| ArgsError::Invalid(format!("--shard-page-token-key-file {e}")))?;
        Ok((ring, key))
    }

    /// TLS to the replicas, and whether it presents a client certificate; `None`
    /// for plaintext.
    pub fn upstream_tls(
        &self,
    ) -> Result<Option<(tonic::transport::ClientTlsConfig, bool)>, ArgsError> {
        let read = |flag: &str, p: &PathBuf| {
            fleetscope_model::file::read_capped(p)
                .map_err(|e| ArgsError::Invalid(format!("{flag} {}: {e}", p.display())))
        };
        let Some(ca) = &self.replica_ca else {
            if self.replica_cert.is_some() {
                return Err(ArgsError::Invalid(
                    "--replica-cert needs --replica-ca: the replicas are reached over TLS".into(),
                ));
            }
            return Ok(None);
        };
        let mut tls = tonic::transport::ClientTlsConfig::new().ca_certificate(
            tonic::transport::Certificate::from_pem(read("--replica-ca", ca)?),
        );
        let mut cert = false;
        if let (Some(c), Some(k)) = (&self.replica_cert, &self.replica_key) {
            tls = tls.identity(tonic::transport::Identity::from_pem(
                read("--replica-cert", c)?,
                read("--replica-key", k)?,
            ));
            cert = true;
        }
        Ok(Some((tls, cert)))
    }
}

/// A ring's name: a DNS label, as it names Leases and labels them.
fn ring_name(s: &str) -> Result<String, String> {
    let valid = !s.is_empty()
        && s.len() <= 40
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-');
    if valid {
        Ok(s.to_string())
    } else {
        Err(format!(
            "{s:?} is not a ring name: lowercase letters, digits and '-', at most 40, starting and ending with a letter or digit"
        ))
    }
}

crate::settings! {
/// How the server is secured: shared by `serve` and `demo`.
#[derive(Debug, Args, Clone, Default)]
pub struct SecurityArgs {
    ["security.tlsCert", Text, Restart]
    /// Serve TLS with this certificate chain (PEM); reloaded when it changes.
    #[arg(
        long,
        env = "FLEETSCOPE_TLS_CERT",
        value_name = "FILE",
        requires = "tls_key"
    )]
    pub tls_cert: Option<PathBuf>,
    ["security.tlsKey", Text, Restart]
    /// The TLS certificate's private key (PEM); reloaded when it changes.
    #[arg(
        long,
        env = "FLEETSCOPE_TLS_KEY",
        value_name = "FILE",
        requires = "tls_cert"
    )]
    pub tls_key: Option<PathBuf>,
    ["security.clientCa", Text, Restart]
    /// Mutual TLS: client certificates signed by these CAs (PEM) identify callers (the
    /// URI SAN, else the CN; groups from O). Needs --tls-cert.
    #[arg(
        long,
        env = "FLEETSCOPE_CLIENT_CA",
        value_name = "FILE",
        requires = "tls_cert"
    )]
    pub client_ca: Option<PathBuf>,
    ["security.tokensFile", Text, Restart]
    /// Bearer tokens, by SHA-256, each with a name and groups (YAML); reloaded when it changes.
    #[arg(long, env = "FLEETSCOPE_TOKENS_FILE", value_name = "FILE")]
    pub tokens_file: Option<PathBuf>,
    ["security.policy", Text, Restart]
    /// The grants (YAML); reloaded when it changes and on SIGHUP. Without one, only
    /// callers on this host are served.
    #[arg(long, env = "FLEETSCOPE_POLICY", value_name = "FILE")]
    pub policy: Option<PathBuf>,
    ["security.insecureListen", Bool, Restart]
    /// Allow plaintext on an address other than loopback (the gRPC and metrics listeners).
    #[arg(long, env = "FLEETSCOPE_INSECURE_LISTEN")]
    pub insecure_listen: bool,
    ["security.openHealth", Bool, Restart]
    /// Serve gRPC health checking to anyone (true) or to authenticated callers only.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set, value_name = "BOOL")]
    pub open_health: bool,
    ["security.openReflection", Bool, Restart]
    /// Serve gRPC reflection to anyone (true) or to authenticated callers only.
    #[arg(long, default_value_t = false, action = clap::ArgAction::Set, value_name = "BOOL")]
    pub open_reflection: bool,
    ["security.tokenReview.context", Text, Restart]
    /// Check bearer tokens the tokens file does not know with a TokenReview at this
    /// cluster: a context of the kubeconfigs, or `in-cluster`. Its credentials need
    /// `create` on `tokenreviews.authentication.k8s.io`.
    #[arg(long, env = "FLEETSCOPE_TOKEN_REVIEW_CONTEXT", value_name = "CONTEXT")]
    pub token_review_context: Option<String>,
    ["security.tokenReview.ttl", Duration, Restart]
    /// How long a token the reviewing cluster accepted is trusted without asking again.
    #[arg(long, default_value = "2m", value_parser = crate::config::parse_duration)]
    pub token_review_ttl: Duration,
    ["security.tokenReview.negativeTtl", Duration, Restart]
    /// How long a token the reviewing cluster refused is refused without asking again.
    #[arg(long, default_value = "10s", value_parser = crate::config::parse_duration)]
    pub token_review_negative_ttl: Duration,
    ["security.tokenReview.timeout", Duration, Restart]
    /// The longest a TokenReview may take: a reviewing cluster that does not answer
    /// in time makes the call UNAVAILABLE (retryable), and tokens it reviewed before
    /// are still served from the cache.
    #[arg(long, default_value = "5s", value_parser = crate::config::parse_timeout)]
    pub token_review_timeout: Duration,
    ["security.tokenReview.audiences", Texts, Restart]
    /// The audiences a reviewed token must be for (repeatable; default: the API server's).
    #[arg(long = "token-review-audience", value_name = "AUDIENCE")]
    pub token_review_audiences: Vec<String>,
    ["security.rbacAuthorization", Bool, Restart]
    /// Grant what each cluster's own RBAC grants the caller there (its Roles,
    /// ClusterRoles and bindings are collected), beside the policy file's grants.
    #[arg(long, env = "FLEETSCOPE_RBAC_AUTHORIZATION")]
    pub rbac_authorization: bool,
    ["security.routerNames", Texts, Restart]
    /// A router's identity (the user its client certificate names): its requests may
    /// carry the caller's identity in `x-remote-user` and `x-remote-group`, as
    /// kube-apiserver's front proxy passes it, and are authorized as that caller.
    /// Repeat for several. Once any is named, only routers are served (health checks
    /// excepted). Needs --client-ca.
    #[arg(long = "router-name", env = "FLEETSCOPE_ROUTER_NAMES", value_delimiter = ',', value_name = "NAME")]
    pub router_names: Vec<String>,
}

}

impl SecurityArgs {
    /// The files these settings name for authentication and the policy.
    pub fn files(&self) -> fleetscope_auth::SecurityFiles {
        fleetscope_auth::SecurityFiles {
            tokens: self.tokens_file.clone(),
            policy: self.policy.clone(),
            client_certs: self.client_ca.is_some(),
            open_health: self.open_health,
            open_reflection: self.open_reflection,
            routers: self.router_names.clone(),
        }
    }

    /// Whether callers prove who they are (client certificates, bearer tokens, or
    /// tokens reviewed by a cluster): then some connection places are kept for them.
    pub fn authenticates(&self) -> bool {
        self.client_ca.is_some()
            || self.tokens_file.is_some()
            || self.token_review_context.is_some()
    }
}

crate::settings! {
/// How the gRPC and metrics listeners serve their callers: shared by `serve`, `demo`
/// and `router`.
#[derive(Debug, Args)]
pub struct ListenerArgs {
    ["listen", Text, Restart]
    /// The gRPC listen address.
    #[arg(long, env = "FLEETSCOPE_LISTEN", default_value = fleetscope_proto::DEFAULT_ADDRESS, value_parser = host_port)]
    pub listen: String,
    ["metricsListen", Text, Restart]
    /// Serve Prometheus metrics at /metrics (with /healthz and /readyz) on this
    /// `host:port`; off unless set.
    #[arg(long, env = "FLEETSCOPE_METRICS_LISTEN", value_name = "HOST:PORT", value_parser = host_port)]
    pub metrics_listen: Option<String>,
    ["kubeApi.listen", Text, Restart]
    /// Serve the Kubernetes API over the fleet (kubectl, client-go, kube-rs) on this
    /// `host:port`, with the gRPC listener's TLS and security; off unless set.
    #[arg(long, env = "FLEETSCOPE_KUBE_API_LISTEN", value_name = "HOST:PORT", value_parser = host_port)]
    pub kube_api_listen: Option<String>,
    ["watch.bookmarkInterval", Seconds, Restart]
    /// Seconds between Watch bookmarks.
    #[arg(long, default_value_t = 30)]
    pub bookmark_seconds: u64,
    ["grpc.requestTimeout", Duration, Restart]
    /// The longest a gRPC request may take to its response (a Watch: to its first
    /// message); a client's own deadline may be shorter.
    #[arg(long, default_value = "30s", value_parser = crate::config::parse_timeout)]
    pub grpc_request_timeout: Duration,
    ["grpc.maxInFlight", Count, Restart]
    /// gRPC requests handled at once, across all connections; more are refused at once
    /// with UNAVAILABLE (retryable). Health checks are never refused.
    #[arg(long, default_value_t = 1024, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub grpc_max_in_flight: u64,
    ["grpc.maxConnections", Count, Restart]
    /// Connections open at once (gRPC and metrics each); a connection beyond is closed
    /// at once, with a log line. Where callers authenticate (client certificates or
    /// bearer tokens), an eighth of them is kept for connections that did, and when
    /// the rest are full, the oldest connection that has not is closed for a new one.
    #[arg(long, default_value_t = 4096, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub grpc_max_connections: u64,
    ["grpc.maxConnectionsPerAddress", Count, Restart]
    /// Connections one peer address may have open at once (gRPC and metrics each).
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub grpc_max_connections_per_address: u64,
    ["grpc.handshakeTimeout", Duration, Restart]
    /// How long a new connection may take to complete its TLS handshake and begin
    /// speaking HTTP/2 before it is closed; and then, where callers authenticate and
    /// it presented no client certificate, to make its first authenticated call
    /// before it is closed with a GOAWAY.
    #[arg(long, default_value = "10s", value_parser = crate::config::parse_timeout)]
    pub grpc_handshake_timeout: Duration,
    ["grpc.idleTimeout", Duration, Restart]
    /// How long a gRPC connection may have no call open before it is closed with an
    /// HTTP/2 GOAWAY (clients open a new connection for their next call).
    #[arg(long, default_value = "5m", value_parser = crate::config::parse_timeout)]
    pub grpc_idle_timeout: Duration,
    ["grpc.keepaliveInterval", Duration, Restart]
    /// An HTTP/2 PING after this much silence on a gRPC connection; one not answered
    /// within --grpc-keepalive-timeout closes the connection and ends its streams (a
    /// client that vanished leaves the Watch count).
    #[arg(long, default_value = "30s", value_parser = crate::config::parse_timeout)]
    pub grpc_keepalive_interval: Duration,
    ["grpc.keepaliveTimeout", Duration, Restart]
    /// See --grpc-keepalive-interval.
    #[arg(long, default_value = "20s", value_parser = crate::config::parse_timeout)]
    pub grpc_keepalive_timeout: Duration,
    ["grpc.maxWatchesPerCaller", Count, Restart]
    /// Watch streams one caller (identity) may have open at once; one more is
    /// RESOURCE_EXHAUSTED.
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub grpc_max_watches_per_caller: u64,
}
}

impl ListenerArgs {
    /// The Fleet service's settings, page tokens signed with `token_key`.
    pub fn service(&self, token_key: crate::grpc::TokenKey) -> ServiceConfig {
        ServiceConfig {
            bookmark_interval: Duration::from_secs(self.bookmark_seconds.max(1)),
            max_watches_per_caller: usize::try_from(self.grpc_max_watches_per_caller)
                .unwrap_or(usize::MAX),
            version: crate::version().parse().ok(),
            ..ServiceConfig::new(token_key)
        }
    }
}

crate::settings! {
/// What to collect and how: shared by `serve` and `demo`.
#[derive(Debug, Args)]
pub struct EngineArgs {
    #[allow(missing_docs)]
    #[command(flatten)]
    pub listener: ListenerArgs,
    ["resources", Resources, Collection]
    /// Resource types to collect, kubectl-style (`pods`, `deployments.apps`, `apps/v1/deployments`), comma-separated; `*` for every watchable type.
    #[arg(
        long,
        env = "FLEETSCOPE_RESOURCES",
        value_delimiter = ',',
        default_value = "pods,configmaps,services,nodes,namespaces,deployments.apps,replicasets.apps"
    )]
    pub resources: Vec<String>,
    ["clusters.labels", LabelRules, Collection]
    /// Labels for clusters, for cluster selectors: `GLOB:key=value,key=value`; repeatable.
    #[arg(long = "cluster-label", value_name = "GLOB:LABELS")]
    pub cluster_labels: Vec<String>,
    ["resources.*", Derived, Collection]
    /// Narrow one type: `RESOURCE:namespace=NS;labels=SELECTOR;fields=SELECTOR;managedFields=keep|drop;pruneAnnotations=KEY,KEY` (parts optional); repeatable.
    #[arg(long = "scope", value_name = "RESOURCE:OPTIONS")]
    pub scopes: Vec<String>,
    ["pruning.managedFields", Keep, Collection]
    /// Keep metadata.managedFields (pruned by default).
    #[arg(long)]
    pub keep_managed_fields: bool,
    ["pruning.annotations", Texts, Collection]
    /// Annotations to prune from every object, added to kubectl's
    /// last-applied-configuration (pruned unless --keep-last-applied); repeatable.
    #[arg(long = "prune-annotation", value_name = "KEY")]
    pub prune_annotations: Vec<String>,
    ["pruning.lastApplied", Keep, Collection]
    /// Keep kubectl's last-applied-configuration annotation (pruned by default; on
    /// Secrets it is always pruned: it holds their values).
    #[arg(long)]
    pub keep_last_applied: bool,
    ["fieldIndexes", Texts, Restart]
    /// A JSON path to index for field selectors and counts (e.g. `spec.nodeName`); repeatable.
    #[arg(long = "field-index", value_name = "PATH")]
    pub field_indexes: Vec<String>,
    ["informer.pageSize", Count, Collection]
    /// LIST page size towards the clusters (for consistent lists from storage; lists
    /// from the watch cache are not paged).
    #[arg(long, default_value_t = 500)]
    pub page_size: u32,
    ["informer.maxObjectBytes", Count, Collection]
    /// The largest object taken from a cluster, in bytes of its JSON: a larger one is
    /// dropped, with a warning and fleetscope_stream_dropped_total. The default is well
    /// above what an API server stores (etcd takes requests of 1.5 MiB by default).
    #[arg(long, default_value_t = 16 << 20, value_parser = clap::value_parser!(u64).range(1024..=1 << 30))]
    pub max_object_bytes: u64,
    ["informer.watchList", Bool, Collection]
    /// Ask API servers for streaming lists (WatchList) and list only where they refuse
    /// or ignore them (true), or always list (false).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set, value_name = "BOOL")]
    pub watch_list: bool,
    ["informer.listPart", Count, Collection]
    /// A first list (streaming, or a LIST) reaches the index in parts of this many
    /// objects as they arrive (0: whole, at its end).
    #[arg(long, default_value_t = 4096)]
    pub list_part: usize,
    ["retention.events", Count, Restart]
    /// Events kept for resuming watches.
    #[arg(long, default_value_t = 100_000)]
    pub event_log: usize,
    ["retention.eventsMib", Count, Restart]
    /// The most the kept events may hold, in MiB of JSON (an object and, for a
    /// modification, its previous state), in memory; also what the store may gather
    /// unwritten before the ingest waits for it.
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u64).range(1..=1_048_576))]
    pub event_log_mib: u64,
    ["index.compressObjects", Bool, Restart]
    /// Hold each object's JSON compressed against a dictionary of its resource type
    /// once it has settled (true), or always as text (false): a third to a fifth of
    /// the memory for the JSON, for CPU once per settled state and on every object
    /// read (see docs/notes/performance-log.md).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true", value_name = "BOOL")]
    pub compress_objects: bool,
    ["index.compressAfter", Duration, Restart]
    /// How long an object's state stays unchanged before it is held compressed, a
    /// tenth of it for states read by a list (a first sync, a relist): a state that
    /// changes sooner is never compressed, and a first sync is not slowed within that
    /// tenth.
    #[arg(long, default_value = "10s", value_parser = crate::config::parse_duration)]
    pub compress_after: Duration,
    ["watch.subscriberBuffer", Count, Restart]
    /// Events a Watch subscriber may fall behind before it is ended.
    #[arg(long, default_value_t = 10_000)]
    pub subscriber_buffer: usize,
    ["informer.execTimeout", Duration, Collection]
    /// The longest an exec credential plugin may run (`30s`, `2m`); it is then killed
    /// with the processes it started, and its cluster reported as failing.
    #[arg(long, default_value = "30s", value_parser = crate::config::parse_timeout)]
    pub exec_timeout: Duration,
    ["grpc.queryTimeout", Duration, Restart]
    /// The longest one List page or Count may take to evaluate; past it the request
    /// is DEADLINE_EXCEEDED.
    #[arg(long, default_value = "10s", value_parser = crate::config::parse_timeout)]
    pub query_timeout: Duration,
    ["watch.stallTimeout", Duration, Restart]
    /// How long a Watch may leave its events unread before the server ends it
    /// (RESOURCE_EXHAUSTED, with the revision to resume from).
    #[arg(long, default_value = "60s", value_parser = crate::config::parse_timeout)]
    pub watch_stall_timeout: Duration,
}
}

crate::settings! {
/// Where and how `serve` keeps its state across restarts.
#[derive(Debug, Args)]
pub struct PersistArgs {
    ["store.dataDir", Text, Restart]
    /// The data directory. Default: the platform's user data directory + /fleetscope
    /// (~/.local/share/fleetscope on Linux).
    #[arg(long, env = "FLEETSCOPE_DATA_DIR", value_name = "DIR")]
    pub data_dir: Option<PathBuf>,
    ["store.persist", Not, Restart]
    /// Run in memory only: nothing is written, every start lists every cluster.
    #[arg(long, env = "FLEETSCOPE_NO_PERSIST", conflicts_with = "data_dir")]
    pub no_persist: bool,
    ["store.keepRemovedClusters", Bool, Restart]
    /// Keep the objects of clusters no longer configured (at start, and when a context
    /// leaves a kubeconfig while running), instead of deleting them.
    #[arg(long)]
    pub keep_removed_clusters: bool,
    /// No longer used: each store write starts as soon as the previous one ends, and
    /// a change is visible once its write is durable. Accepted so that existing
    /// command lines keep working.
    #[arg(long, hide = true)]
    pub flush_ms: Option<u64>,
    ["retention.diskShare", Number, Restart]
    /// The persisted event log's size limit, as a share of the held objects' JSON size.
    #[arg(long, default_value_t = 0.5)]
    pub event_log_disk_share: f64,
    ["store.compactShare", Number, Restart]
    /// Compact the store (copy its live records to a fresh file) once its size on disk
    /// passes this share of the held objects' JSON size (and 1.5 × its size after the
    /// last compaction; a store that started empty counts its size once filled as
    /// such). The copy briefly takes its own space beside the store.
    #[arg(long, default_value_t = 1.0)]
    pub compact_share: f64,
    ["store.compactMinMib", Count, Restart]
    /// The size on disk, in MiB, below which the store is never compacted.
    #[arg(long, default_value_t = 4)]
    pub compact_min_mib: u64,
    ["store.snapshotLogMib", Count, Restart]
    /// The change log, in MiB, that a restart should find at most (it replays the log
    /// onto the last snapshot of the objects): past it, a snapshot is written a second
    /// after changes stop, or while they go on as soon as `--snapshot-cpu-share`
    /// allows. The log never passes half the held objects' JSON size either way.
    #[arg(long, default_value_t = 64)]
    pub snapshot_log_mib: u64,
    ["store.snapshotCpuShare", Number, Restart]
    /// The share of one core that snapshots written for `--snapshot-log-mib` may take:
    /// after one that took d, the next waits d ÷ this share (a million pods take about
    /// 3.5 s, so one every 35 s at 0.1). 0: never for that bound.
    #[arg(long, default_value_t = 0.1)]
    pub snapshot_cpu_share: f64,
}
}

impl ShardArgs {
    /// How this replica takes part in its ring, and the address it publishes there;
    /// `None` when no ring is named. The identity defaults to the host name, the
    /// address to the host name and `listen`'s port.
    pub fn membership(
        &self,
        listen: &str,
    ) -> Result<Option<(fleetscope_ring::member::MembershipConfig, String)>, ArgsError> {
        let Some(ring) = &self.ring.shard_ring else {
            return Ok(None);
        };
        let host = rustix::system::uname()
            .nodename()
            .to_string_lossy()
            .into_owned();
        let identity = self.shard_identity.clone().unwrap_or_else(|| host.clone());
        let valid = !identity.is_empty()
            && ring.len() + 1 + identity.len() <= 253
            && identity
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
            && identity.starts_with(|c: char| c.is_ascii_alphanumeric())
            && identity.ends_with(|c: char| c.is_ascii_alphanumeric());
        ensure(
            valid,
            &format!(
                "--shard-identity {identity:?}: not usable in a Lease's name (lowercase letters, digits, '-' and '.', starting and ending with a letter or digit)"
            ),
        )?;
        ensure(
            self.ring.shard_lease_duration >= Duration::from_secs(2),
            "--shard-lease-duration (sharding.leaseDuration) must be at least 2s",
        )?;
        ensure(
            self.shard_renew_period > Duration::ZERO
                && self.shard_renew_period * 2 <= self.ring.shard_lease_duration,
            "--shard-renew-period (sharding.renewPeriod) must be at most half of --shard-lease-duration (sharding.leaseDuration)",
        )?;
        let Some(key_file) = &self.ring.shard_page_token_key_file else {
            return Err(ArgsError::Invalid(
                "--shard-page-token-key-file (sharding.pageTokenKeyFile) is required with --shard-ring: a replica seals its Lease with the ring's key, and the others count no Lease that is not".into(),
            ));
        };
        let key = crate::grpc::TokenKey::from_file(key_file)
            .map_err(|e| ArgsError::Invalid(format!("--shard-page-token-key-file {e}")))?;
        let advertise = match &self.shard_advertise {
            Some(a) => a.clone(),
            None => {
                let port = listen.rsplit_once(':').map_or("50051", |(_, p)| p);
                format!("{host}:{port}")
            }
        };
        Ok(Some((
            fleetscope_ring::member::MembershipConfig {
                ring: ring.clone(),
                identity,
                lease_duration: self.ring.shard_lease_duration,
                renew_period: self.shard_renew_period,
                replication: usize::try_from(self.shard_replication).unwrap_or(1),
                key: lease_key(&key),
            },
            advertise,
        )))
    }
}

impl ServeArgs {
    /// The `--cluster-alias` flags as context → name.
    pub fn aliases(&self) -> Result<BTreeMap<String, String>, ArgsError> {
        let mut aliases = BTreeMap::new();
        for spec in &self.cluster_aliases {
            let (context, name) = spec
                .split_once('=')
                .map(|(c, n)| (c.trim(), n.trim()))
                .filter(|(c, n)| !c.is_empty() && !n.is_empty())
                .ok_or_else(|| {
                    ArgsError::Invalid(format!("--cluster-alias {spec:?}: expected CONTEXT=NAME"))
                })?;
            ensure(
                !name.contains(['/', '*', '?', '[', ',']),
                &format!(
                    "--cluster-alias {spec:?}: {name:?} is not a usable cluster name (no '/', ',' or glob characters)"
                ),
            )?;
            if aliases.values().any(|n| n == name) {
                return Err(ArgsError::Invalid(format!(
                    "--cluster-alias {spec:?}: two contexts cannot both be named {name:?}"
                )));
            }
            aliases.insert(context.to_string(), name.to_string());
        }
        Ok(aliases)
    }
}

impl EngineArgs {
    /// The engine's settings, checked.
    pub fn config(&self) -> Result<EngineConfig, ArgsError> {
        let mut cluster_labels = Vec::new();
        for spec in &self.cluster_labels {
            let (pattern, labels) = spec.split_once(':').ok_or_else(|| {
                ArgsError::Invalid(format!(
                    "--cluster-label {spec:?}: expected GLOB:key=value[,key=value]"
                ))
            })?;
            let pattern = glob::Pattern::new(pattern).map_err(|e| {
                ArgsError::Invalid(format!(
                    "--cluster-label {spec:?}: {pattern:?} is not a glob: {e}"
                ))
            })?;
            let mut parsed = BTreeMap::new();
            for pair in labels.split(',').filter(|p| !p.is_empty()) {
                let (k, v) = pair.split_once('=').ok_or_else(|| {
                    ArgsError::Invalid(format!(
                        "--cluster-label {spec:?}: {pair:?} is not key=value"
                    ))
                })?;
                parsed.insert(k.trim().to_string(), v.trim().to_string());
            }
            cluster_labels.push(ClusterLabels {
                pattern,
                labels: parsed,
            });
        }
        ensure(
            self.resources.iter().any(|r| !r.trim().is_empty()),
            "--resources names no resource type",
        )?;
        for r in self.resources.iter().map(|r| r.trim()) {
            if !r.is_empty() && r != "*" {
                fleetscope_model::check_resource_name(r)
                    .map_err(|e| ArgsError::Invalid(format!("--resources: {e}")))?;
            }
        }
        ensure(self.page_size > 0, "--page-size must be at least 1")?;
        Ok(EngineConfig {
            resources: self.resources.clone(),
            cluster_labels,
            stream: fleetscope_informer::StreamConfig {
                page_size: self.page_size,
                max_object_bytes: usize::try_from(self.max_object_bytes).unwrap_or(usize::MAX),
                watch_list: self.watch_list,
                list_part: self.list_part,
                pruning: fleetscope_informer::Pruning {
                    managed_fields: !self.keep_managed_fields,
                    annotations: fleetscope_informer::Pruning::annotations_with(
                        !self.keep_last_applied,
                        &self.prune_annotations,
                    ),
                    ..Default::default()
                },
                ..Default::default()
            },
            scopes: self
                .scopes
                .iter()
                .map(|s| {
                    Scope::parse(s).map_err(|source| ArgsError::Scope {
                        scope: s.clone(),
                        source,
                    })
                })
                .collect::<Result<_, _>>()?,
            exec_timeout: self.exec_timeout,
            persist: persist_config(self.event_log_mib),
            index: fleetscope_index::Config {
                log_bytes: mib(self.event_log_mib),
                log_retention: self.event_log.max(1),
                subscriber_buffer: self.subscriber_buffer.max(1),
                field_indexes: self.field_indexes.clone(),
                compress_objects: self.compress_objects,
                compress_after: self.compress_after,
                ..Default::default()
            },
            query_timeout: self.query_timeout,
            subscriber_stall: self.watch_stall_timeout,
            ..Default::default()
        })
    }
}

#[cfg(test)]
mod tests;
