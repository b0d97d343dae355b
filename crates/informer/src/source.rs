//! Cluster sources: kubeconfig files and the contexts chosen from them, checked before
//! any port is bound so a bad kubeconfig is a clear error at start.

use std::path::{Path, PathBuf};

use kube::config::Kubeconfig;

/// A kubeconfig that cannot be used, or a context selection that matches nothing.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    /// The file could not be read.
    #[error("kubeconfig {path}: cannot be read")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The file could not be parsed.
    #[error("kubeconfig {path}")]
    Kubeconfig {
        /// The file.
        path: PathBuf,
        /// Why it failed.
        #[source]
        source: kube::config::KubeconfigError,
    },
    /// No kubeconfig was given and none was found in the usual places.
    #[error(
        "no kubeconfig given: pass --kubeconfig FILE, set KUBECONFIG, or create ~/.kube/config"
    )]
    NoKubeconfig,
    /// The kubeconfigs hold no context at all.
    #[error("the kubeconfig(s) {0} define no contexts")]
    NoContexts(String),
    /// A context's settings could not be turned into a client configuration.
    #[error("cluster {cluster}: its kubeconfig context cannot be used")]
    Config {
        /// The context.
        cluster: String,
        /// Why.
        #[source]
        source: kube::config::KubeconfigError,
    },
    /// The in-cluster service account could not be read.
    #[error("cluster {cluster}: the in-cluster configuration cannot be used")]
    InCluster {
        /// The source's name.
        cluster: String,
        /// Why.
        #[source]
        source: kube::config::InClusterError,
    },
    /// The context's exec credential plugin gave no credential.
    #[error("cluster {cluster}")]
    Exec {
        /// The context.
        cluster: String,
        /// Why (naming the plugin, never carrying its output).
        #[source]
        source: crate::exec::ExecError,
    },
    /// A client could not be built from the context's settings.
    #[error("cluster {cluster}: cannot build a client")]
    Client {
        /// The context.
        cluster: String,
        /// Why.
        #[source]
        source: kube::Error,
    },
    /// A `--context` pattern is not a valid glob.
    #[error("--context {pattern:?} is not a valid glob: {message}")]
    BadPattern {
        /// The pattern.
        pattern: String,
        /// What is wrong with it.
        message: String,
    },
    /// A `--context` pattern matched no context.
    #[error("--context {pattern:?} matches no context; the kubeconfig(s) define: {available}")]
    NoMatch {
        /// The pattern.
        pattern: String,
        /// The contexts that exist.
        available: String,
    },
}

/// One cluster to watch: a context of a kubeconfig, or the cluster fleetscope runs in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterSource {
    /// The cluster's name in fleetscope: the context name (or its alias), or the
    /// in-cluster name.
    pub name: String,
    /// The kubeconfig context it connects through; empty for the in-cluster source.
    pub context: String,
    /// Where its connection settings come from.
    pub origin: Origin,
    /// A digest of its settings as read (the context, its cluster and its user): two
    /// reads of a file differ for this source exactly when its server, TLS settings or
    /// credentials changed.
    pub digest: u64,
}

/// Where a cluster's connection settings come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    /// A context of this kubeconfig file.
    Kubeconfig(PathBuf),
    /// The service account of the pod fleetscope runs in.
    InCluster,
}

impl std::fmt::Display for Origin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Origin::Kubeconfig(p) => write!(f, "kubeconfig {}", p.display()),
            Origin::InCluster => f.write_str("in-cluster service account"),
        }
    }
}

impl ClusterSource {
    /// The cluster fleetscope runs in, under `name`.
    pub fn in_cluster(name: &str) -> Self {
        Self {
            name: name.to_string(),
            context: String::new(),
            origin: Origin::InCluster,
            digest: 0,
        }
    }

    /// The same source under another name (an alias of its context).
    pub fn renamed(mut self, name: &str) -> Self {
        self.name = name.to_string();
        self
    }

    /// A context of the kubeconfig at `path`, whose settings are not compared.
    pub fn context(name: &str, path: &Path) -> Self {
        Self {
            name: name.to_string(),
            context: name.to_string(),
            origin: Origin::Kubeconfig(path.to_path_buf()),
            digest: 0,
        }
    }

    /// Where it comes from, for a person: `kubeconfig FILE, context NAME`.
    pub fn describe(&self) -> String {
        match &self.origin {
            Origin::Kubeconfig(p) => {
                format!("kubeconfig {}, context {}", p.display(), self.context)
            }
            Origin::InCluster => self.origin.to_string(),
        }
    }
}

/// An error with every cause after it, on one line: for status fields and logs.
pub fn chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        let more = c.to_string();
        if !text.contains(&more) {
            text.push_str(": ");
            text.push_str(&more);
        }
        cause = c.source();
    }
    text
}

/// The kubeconfig files to read: those given, else `$KUBECONFIG` (a path list), else `~/.kube/config`.
pub fn kubeconfig_paths(given: &[PathBuf]) -> Result<Vec<PathBuf>, SourceError> {
    if !given.is_empty() {
        return Ok(given.to_vec());
    }
    if let Some(list) = std::env::var_os("KUBECONFIG").filter(|v| !v.is_empty()) {
        return Ok(std::env::split_paths(&list)
            .filter(|p| !p.as_os_str().is_empty())
            .collect());
    }
    let home = std::env::var_os("HOME")
        .map(PathBuf::from)
        .ok_or(SourceError::NoKubeconfig)?;
    let default = home.join(".kube").join("config");
    if default.exists() {
        Ok(vec![default])
    } else {
        Err(SourceError::NoKubeconfig)
    }
}

/// A `--context` pattern: a name or a shell glob (`prod-*`, `sim-?`).
fn pattern(text: &str) -> Result<glob::Pattern, SourceError> {
    glob::Pattern::new(text).map_err(|e| SourceError::BadPattern {
        pattern: text.to_string(),
        message: e.to_string(),
    })
}

fn read(path: &Path) -> Result<Kubeconfig, SourceError> {
    // Bounded first: a path naming a device or a runaway file is refused by name.
    fleetscope_model::file::read_capped(path).map_err(|source| SourceError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    Kubeconfig::read_from(path).map_err(|source| match source {
        // kube's message repeats the cause it chains, and quotes the path twice.
        kube::config::KubeconfigError::ReadConfig(source, _) => SourceError::Read {
            path: path.to_path_buf(),
            source,
        },
        source => SourceError::Kubeconfig {
            path: path.to_path_buf(),
            source,
        },
    })
}

/// A client for one source, ready to use.
pub(crate) struct Connection {
    /// The client, with every auth method kube supports (tokens, token files, client
    /// certificates, auth providers, proxies); exec plugins are run by fleetscope.
    pub client: kube::Client,
    /// The API server's address.
    pub server: String,
    /// When its credential expires, if an exec plugin said so.
    pub expires: Option<std::time::SystemTime>,
}

/// Connects to one source: reads its settings, runs its exec credential plugin (if
/// any) within `exec_timeout`, and builds the client. Nothing here blocks a thread.
pub(crate) async fn connect(
    source: &ClusterSource,
    exec_timeout: std::time::Duration,
    counts: Option<&std::sync::Arc<crate::requests::RequestCounts>>,
) -> Result<Connection, SourceError> {
    let mut config = config(source).await?;
    let server = config.cluster_url.to_string();
    let mut expires = None;
    if let Some(exec) = config.auth_info.exec.take() {
        let credential = crate::exec::credential(&exec, exec_timeout)
            .await
            .map_err(|source_| SourceError::Exec {
                cluster: source.name.clone(),
                source: source_,
            })?;
        expires = credential.expires;
        if let Some(token) = credential.token {
            config.auth_info.token = Some(token.into());
        }
        if let Some((cert, key)) = credential.client_cert {
            use base64::Engine as _;
            let b64 = base64::engine::general_purpose::STANDARD;
            config.auth_info.client_certificate_data = Some(b64.encode(cert));
            config.auth_info.client_key_data = Some(b64.encode(key).into());
        }
    }
    // Failures reach the informers, which back off with jitter and report them; kube's
    // own retrying of 429, 503 and 504 (up to 15 times, minutes apart) would hide a
    // throttling or unavailable server, and retry a "too large resource version" the
    // informer answers by listing again.
    config.default_retry = false;
    let builder = client_builder(config).map_err(|e| SourceError::Client {
        cluster: source.name.clone(),
        source: e,
    })?;
    let client = match counts {
        Some(counts) => builder
            .with_layer(&crate::requests::CountLayer(counts.clone()))
            .build(),
        None => builder.build(),
    };
    Ok(Connection {
        client,
        server,
        expires,
    })
}

/// The HTTP stack of a client, as kube boxes it.
type Service = tower::util::BoxService<
    http::Request<kube::client::Body>,
    http::Response<Box<kube::client::DynBody>>,
    tower::BoxError,
>;

/// The most a connection's read buffer grows to. hyper grows it while reads fill it,
/// up to 408 KiB by default, and a connection keeps what it grew to: a watch whose
/// first list arrived on it would hold that much for as long as it runs, for every
/// cluster and type. Reads of 64 KiB (four TLS records) keep a first list as fast.
const READ_BUFFER_MOST: usize = 64 << 10;

/// The client stack kube builds from a configuration (its TLS, timeouts, base URI,
/// authentication and extra headers, in kube's order), with the connection's read
/// buffer bounded by [`READ_BUFFER_MOST`]. A proxy is left to kube, which names the
/// feature it lacks.
fn client_builder(
    config: kube::Config,
) -> Result<kube::client::ClientBuilder<Service>, kube::Error> {
    use kube::client::ConfigExt;
    use tower::{ServiceBuilder, ServiceExt};
    if config.proxy_url.is_some() {
        return kube::client::ClientBuilder::try_from(config);
    }
    let mut connector = hyper_timeout::TimeoutConnector::new(config.rustls_https_connector()?);
    connector.set_connect_timeout(config.connect_timeout);
    connector.set_read_timeout(config.read_timeout);
    connector.set_write_timeout(config.write_timeout);
    connector.set_reset_reader_on_write(config.reset_reader_on_write);
    let http: hyper_util::client::legacy::Client<_, kube::client::Body> =
        hyper_util::client::legacy::Builder::new(hyper_util::rt::TokioExecutor::new())
            .http1_max_buf_size(READ_BUFFER_MOST)
            .build(connector);
    let service = ServiceBuilder::new()
        .layer(config.base_uri_layer())
        .option_layer(config.auth_layer()?)
        .layer(config.extra_headers_layer()?)
        .map_err(tower::BoxError::from)
        .service(http);
    Ok(kube::client::ClientBuilder::new(
        tower::util::BoxService::new(service.map_response(|r| {
            r.map(|b| {
                Box::new(http_body_util::BodyExt::map_err(b, tower::BoxError::from))
                    as Box<kube::client::DynBody>
            })
        })),
        config.default_namespace,
    ))
}

/// A client for `source` (its exec credential plugin, if any, run within
/// `exec_timeout`), and when its credential expires, if the plugin said so.
pub async fn client(
    source: &ClusterSource,
    exec_timeout: std::time::Duration,
) -> Result<(kube::Client, Option<std::time::SystemTime>), SourceError> {
    let conn = connect(source, exec_timeout, None).await?;
    Ok((conn.client, conn.expires))
}

/// How long before its expiry an exec credential is fetched again.
const RENEW_AHEAD: std::time::Duration = std::time::Duration::from_secs(60);
/// The soonest an exec credential is fetched again after the last fetch.
const RENEW_SOONEST: std::time::Duration = std::time::Duration::from_secs(10);

/// How long from now a credential that expires `at` is renewed: a minute ahead of
/// its expiry, as client-go's exec authenticator does, and never sooner than 10 s.
pub fn renew_in(at: std::time::SystemTime) -> std::time::Duration {
    at.duration_since(std::time::SystemTime::now())
        .unwrap_or_default()
        .saturating_sub(RENEW_AHEAD)
        .max(RENEW_SOONEST)
}

/// The work that keeps a [`renewing_client`]'s credential fresh, for the caller to
/// run as a task of its own.
pub type Renewal = std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>;

/// A client for `source` that always sends the newest credential: when its exec
/// plugin gives one that expires (EKS, GKE and most cloud logins do, within minutes
/// to an hour), the [`Renewal`] returned with it fetches one again ahead of the
/// expiry ([`renew_in`]) until `stop`, retrying a failed fetch with backoff while
/// the credential in hand still works. No renewal when the credential does not
/// expire.
pub async fn renewing_client(
    source: &ClusterSource,
    exec_timeout: std::time::Duration,
    stop: tokio_util::sync::CancellationToken,
) -> Result<(kube::Client, Option<Renewal>), SourceError> {
    use std::sync::{Arc, RwLock};
    let (first, expires) = client(source, exec_timeout).await?;
    let Some(expires) = expires else {
        return Ok((first, None));
    };
    let namespace = first.default_namespace().to_string();
    let current = Arc::new(RwLock::new(first));
    let renewed = current.clone();
    let source = source.clone();
    let renewal = async move {
        let mut expires = expires;
        let mut retry = RENEW_SOONEST;
        loop {
            tokio::select! {
                _ = tokio::time::sleep(renew_in(expires)) => {}
                _ = stop.cancelled() => return,
            }
            match client(&source, exec_timeout).await {
                Ok((fresh, next)) => {
                    *renewed.write().unwrap_or_else(|e| e.into_inner()) = fresh;
                    tracing::debug!(cluster = %source.name, "the credential was renewed");
                    retry = RENEW_SOONEST;
                    match next {
                        Some(next) => expires = next,
                        // No longer expiring: the one in hand serves from now on.
                        None => return,
                    }
                }
                Err(e) => {
                    tracing::warn!(cluster = %source.name, error = %chain(&e), "renewing the credential failed: retrying");
                    retry = (retry * 2).min(RENEW_AHEAD);
                    // Retried after `retry`, however close the expiry.
                    expires = std::time::SystemTime::now() + RENEW_AHEAD + retry;
                }
            }
        }
    };
    let service = tower::service_fn(move |request: http::Request<kube::client::Body>| {
        let newest = current.read().unwrap_or_else(|e| e.into_inner()).clone();
        async move { newest.send(request).await }
    });
    Ok((
        kube::Client::new(service, namespace),
        Some(Box::pin(renewal)),
    ))
}

/// The kube client configuration of one source (its server URL, credentials, TLS).
async fn config(source: &ClusterSource) -> Result<kube::Config, SourceError> {
    let path = match &source.origin {
        Origin::InCluster => {
            return kube::Config::incluster().map_err(|e| SourceError::InCluster {
                cluster: source.name.clone(),
                source: e,
            });
        }
        Origin::Kubeconfig(path) => path,
    };
    let kc = read(path)?;
    let options = kube::config::KubeConfigOptions {
        context: Some(source.context.clone()),
        ..Default::default()
    };
    kube::Config::from_custom_kubeconfig(kc, &options)
        .await
        .map_err(|e| SourceError::Config {
            cluster: source.name.clone(),
            source: e,
        })
}

/// A GET of `path` on the source's API server, as text (for diagnostics, and for
/// reading a simulated cluster's `/metrics`).
pub async fn get_text(
    source: &ClusterSource,
    path: &str,
    exec_timeout: std::time::Duration,
) -> Result<String, SourceError> {
    let conn = connect(source, exec_timeout, None).await?;
    let request = http::Request::get(path)
        .body(Vec::new())
        .map_err(|e| SourceError::Client {
            cluster: source.name.clone(),
            source: kube::Error::HttpError(e),
        })?;
    conn.client
        .request_text(request)
        .await
        .map_err(|e| SourceError::Client {
            cluster: source.name.clone(),
            source: e,
        })
}

/// A digest of one context's settings: the context, its cluster and its user.
fn digest(kc: &Kubeconfig, context: &kube::config::NamedContext) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    fn text<T: serde::Serialize>(v: &T) -> String {
        serde_json::to_string(v).unwrap_or_default()
    }
    text(context).hash(&mut h);
    if let Some(ctx) = &context.context {
        if let Some(c) = kc.clusters.iter().find(|c| c.name == ctx.cluster) {
            text(c).hash(&mut h);
        }
        if let Some(user) = &ctx.user
            && let Some(u) = kc.auth_infos.iter().find(|u| u.name == *user)
        {
            text(u).hash(&mut h);
        }
    }
    h.finish()
}

/// Reads every kubeconfig and returns the contexts chosen by `patterns` (all when empty).
/// A context name that appears in two files is taken from the first, as kubectl merges.
pub fn resolve(paths: &[PathBuf], patterns: &[String]) -> Result<Vec<ClusterSource>, SourceError> {
    let mut all: Vec<ClusterSource> = Vec::new();
    for path in paths {
        let kc = read(path)?;
        for ctx in &kc.contexts {
            if !all.iter().any(|c| c.name == ctx.name) {
                all.push(ClusterSource {
                    name: ctx.name.clone(),
                    context: ctx.name.clone(),
                    origin: Origin::Kubeconfig(path.clone()),
                    digest: digest(&kc, ctx),
                });
            }
        }
    }
    let shown = || {
        paths
            .iter()
            .map(|p| p.display().to_string())
            .collect::<Vec<_>>()
            .join(", ")
    };
    if all.is_empty() {
        return Err(SourceError::NoContexts(shown()));
    }
    if patterns.is_empty() {
        return Ok(all);
    }
    let compiled = patterns
        .iter()
        .map(|p| pattern(p))
        .collect::<Result<Vec<_>, _>>()?;
    for (text, p) in patterns.iter().zip(&compiled) {
        if !all.iter().any(|c| p.matches(&c.name)) {
            let available = all
                .iter()
                .map(|c| c.name.as_str())
                .collect::<Vec<_>>()
                .join(", ");
            return Err(SourceError::NoMatch {
                pattern: text.clone(),
                available,
            });
        }
    }
    Ok(all
        .into_iter()
        .filter(|c| compiled.iter().any(|p| p.matches(&c.name)))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn invalid_globs_are_rejected_by_name() {
        let e = pattern("prod-[").unwrap_err();
        assert!(e.to_string().contains("prod-["), "{e}");
    }

    #[test]
    fn bad_kubeconfigs_are_named_in_the_error() {
        let dir = tempfile::tempdir().unwrap();
        let bad = dir.path().join("bad");
        std::fs::write(&bad, "clusters: [this is not: a kubeconfig").unwrap();
        let e = resolve(std::slice::from_ref(&bad), &[]).unwrap_err();
        assert!(e.to_string().contains(&bad.display().to_string()), "{e}");
        assert!(
            chain(&e).len() > e.to_string().len(),
            "the cause follows: {}",
            chain(&e)
        );
        let missing = dir.path().join("missing");
        assert!(
            resolve(&[missing], &[])
                .unwrap_err()
                .to_string()
                .contains("missing")
        );
        let empty = dir.path().join("empty");
        std::fs::write(&empty, "apiVersion: v1\nkind: Config\n").unwrap();
        assert!(matches!(
            resolve(&[empty], &[]).unwrap_err(),
            SourceError::NoContexts(_)
        ));
    }

    #[test]
    fn context_patterns_select_and_unknown_ones_fail() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("kc");
        let contexts: Vec<_> = ["sim-1", "sim-2", "prod"]
            .iter()
            .map(|n| fleetscope_sim::Context {
                name: n.to_string(),
                server: "https://127.0.0.1:1".into(),
                token: "t".into(),
                ca_pem: None,
            })
            .collect();
        fleetscope_sim::write_kubeconfig(&path, &contexts).unwrap();
        let chosen = resolve(std::slice::from_ref(&path), &["sim-*".into()]).unwrap();
        assert_eq!(
            chosen.iter().map(|c| c.name.as_str()).collect::<Vec<_>>(),
            ["sim-1", "sim-2"]
        );
        let one = resolve(
            std::slice::from_ref(&path),
            &["sim-?".into(), "prod".into()],
        )
        .unwrap();
        assert_eq!(one.len(), 3);
        let e = resolve(&[path], &["nope-*".into()]).unwrap_err();
        assert!(e.to_string().contains("sim-1, sim-2, prod"), "{e}");
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]
        /// A kubeconfig is operator input: any file is sources or an error naming it,
        /// never a panic.
        #[test]
        fn any_kubeconfig_text_resolves_or_names_the_file(
            text in "(apiVersion: v1\n)?(kind: Config\n)?((clusters|contexts|users|current-context): [a-z0-9\\[\\]{}:, -]{0,60}\n){0,5}\\PC{0,30}",
        ) {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("kubeconfig");
            std::fs::write(&path, &text).unwrap();
            if let Err(e) = resolve(std::slice::from_ref(&path), &[]) {
                proptest::prop_assert!(!e.to_string().is_empty());
            }
        }
    }
}
