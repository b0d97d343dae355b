//! Who is asking and what they may read: a tower layer in front of every service
//! establishes the caller's identity (a client certificate verified by the TLS
//! handshake, or a bearer token from the tokens file) and hands the Fleet service an
//! [`Access`]: that identity held to the policy in force, and to every policy that
//! replaces it while a Watch runs. The policy is enforced below the Fleet seam.
//!
//! - With authentication configured (a client CA, a tokens file, or a cluster that
//!   reviews tokens), a request without credentials is `UNAUTHENTICATED`, saying what
//!   was expected; without it, every caller is `system:anonymous` (group
//!   `system:unauthenticated`). A token the tokens file does not know is checked with
//!   a TokenReview when a reviewing cluster is configured (answers cached).
//! - With a policy (the policy file's grants, each cluster's own RBAC, or both:
//!   either grants), whatever is not granted is denied; without one, only callers on
//!   this host (loopback) are served, with everything, and any other is
//!   `PERMISSION_DENIED`.
//! - Health checking is open unless configured otherwise; reflection needs an
//!   authenticated caller (but no grant) unless configured open.

pub mod peer;
pub mod policy;
pub mod rbac;
pub mod review;
pub mod tokens;

use std::path::PathBuf;
use std::sync::Arc;
use std::task::{Context, Poll};

use fleetscope_model::Access;
use fleetscope_model::access::{Everything, Policy, Subject};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

pub use fleetscope_grpc::identity::{
    ANONYMOUS, AUTHENTICATED, REMOTE_GROUP, REMOTE_GROUP_BIN, REMOTE_USER, REMOTE_USER_BIN,
    UNAUTHENTICATED, pass_identity, passed_subject, passed_values,
};
use fleetscope_model::yaml::FileError;
use peer::PeerInfo;
use policy::PolicyGrants;
use tokens::Tokens;

/// What the security of a server is read from.
#[derive(Debug, Clone, Default)]
pub struct SecurityFiles {
    /// The tokens file, when bearer tokens are accepted.
    pub tokens: Option<PathBuf>,
    /// The policy file, when one is in force.
    pub policy: Option<PathBuf>,
    /// Whether client certificates identify callers (mutual TLS).
    pub client_certs: bool,
    /// Whether health checking is served to anyone (the default).
    pub open_health: bool,
    /// Whether reflection is served to anyone (by default it needs an identity).
    pub open_reflection: bool,
    /// The routers' identities (client certificate users): they alone may pass a
    /// caller's identity, and once any is named they alone are served.
    pub routers: Vec<String>,
}

/// The security in force: what the authentication layer checks each request against.
#[derive(Clone)]
pub struct Guard {
    tokens: Option<watch::Receiver<Arc<Tokens>>>,
    reviewer: Option<Arc<review::Reviewer>>,
    client_certs: bool,
    policy: Option<watch::Receiver<Arc<dyn Policy>>>,
    everything: watch::Receiver<Arc<dyn Policy>>,
    open_health: bool,
    open_reflection: bool,
    routers: Arc<[String]>,
}

impl Default for Guard {
    /// No authentication and no policy: loopback callers only, health open.
    fn default() -> Self {
        let (_, everything) = watch::channel(Arc::new(Everything) as Arc<dyn Policy>);
        Self {
            tokens: None,
            reviewer: None,
            client_certs: false,
            policy: None,
            everything,
            open_health: true,
            open_reflection: false,
            routers: Arc::new([]),
        }
    }
}

/// The files of a [`Guard`] could not be read.
pub type LoadError = FileError;

/// The grants in force: the policy file's, each cluster's RBAC, or both (what either
/// grants is granted).
#[derive(Clone, Default)]
pub struct Grants {
    file: Option<Arc<PolicyGrants>>,
    rbac: Option<Arc<rbac::Rbac>>,
}

impl Policy for Grants {
    fn namespaces(
        &self,
        who: &Subject,
        verb: fleetscope_model::Verb,
        resource: &fleetscope_model::ResourceType,
        cluster: fleetscope_model::access::ClusterRef<'_>,
    ) -> fleetscope_model::access::Namespaces {
        let file = self
            .file
            .as_ref()
            .map(|p| p.namespaces(who, verb, resource, cluster))
            .unwrap_or_default();
        let rbac = self
            .rbac
            .as_ref()
            .map(|r| r.namespaces(who, verb.as_str(), resource, cluster))
            .unwrap_or_default();
        file.union(rbac)
    }

    fn secret_data(
        &self,
        who: &Subject,
        cluster: fleetscope_model::access::ClusterRef<'_>,
        namespace: &str,
    ) -> bool {
        self.file
            .as_ref()
            .is_some_and(|p| p.secret_data(who, cluster, namespace))
            || self
                .rbac
                .as_ref()
                .is_some_and(|r| r.secret_data(who, cluster, namespace))
    }

    fn sees_cluster(
        &self,
        who: &Subject,
        cluster: fleetscope_model::access::ClusterRef<'_>,
    ) -> bool {
        self.file
            .as_ref()
            .is_some_and(|p| p.sees_cluster(who, cluster))
            || self
                .rbac
                .as_ref()
                .is_some_and(|r| r.sees_cluster(who, cluster))
    }

    fn endpoint(&self, who: &Subject, path: &str) -> bool {
        // Only the policy file grants fleetscope's own endpoints: a cluster's RBAC
        // speaks of that cluster.
        self.file.as_ref().is_some_and(|p| p.endpoint(who, path))
    }
}

/// The grants in force and where running requests follow them: each part replaced
/// on its own (a policy file reloaded, a cluster's RBAC changed).
struct GrantsInForce {
    current: std::sync::Mutex<Grants>,
    tx: watch::Sender<Arc<dyn Policy>>,
}

impl GrantsInForce {
    fn update(&self, change: impl FnOnce(&mut Grants)) {
        let mut current = self.current.lock().unwrap_or_else(|e| e.into_inner());
        change(&mut current);
        self.tx.send_replace(Arc::new(current.clone()));
    }
}

/// Loads the security files: an error names the file and key, and nothing is served.
/// Returns the guard and what reads its files again (see [`Reloadable`]).
pub fn guard(
    files: &SecurityFiles,
    reviewer: Option<review::Reviewer>,
    cluster_rbac: Option<Arc<fleetscope_model::fleet::Deferred<fleetscope_engine::Engine>>>,
    stop: CancellationToken,
) -> Result<(Guard, Reloadable), LoadError> {
    let tokens = files.tokens.as_ref().map(|p| Tokens::load(p)).transpose()?;
    let policy = files
        .policy
        .as_ref()
        .map(|p| PolicyGrants::load(p))
        .transpose()?;
    if let (Some(p), Some(g)) = (&files.policy, &policy) {
        tracing::info!(file = %p.display(), grants = g.len(), "policy loaded");
    }
    if let (Some(p), Some(t)) = (&files.tokens, &tokens) {
        tracing::info!(file = %p.display(), tokens = t.len(), "tokens loaded");
    }
    let (tokens_tx, tokens_rx) = tokens.map(|t| watch::channel(Arc::new(t))).unzip();
    let grants = (policy.is_some() || cluster_rbac.is_some()).then(|| {
        let first = Grants {
            file: policy.map(Arc::new),
            rbac: cluster_rbac.is_some().then(Arc::default),
        };
        let (tx, rx) = watch::channel(Arc::new(first.clone()) as Arc<dyn Policy>);
        (
            Arc::new(GrantsInForce {
                current: std::sync::Mutex::new(first),
                tx,
            }),
            rx,
        )
    });
    let (in_force, policy_rx) = grants.unzip();
    let mut rbac = None;
    if let (Some(fleet), Some(in_force)) = (cluster_rbac, &in_force) {
        let in_force = in_force.clone();
        let publish = move |r: Arc<rbac::Rbac>| in_force.update(|g| g.rbac = Some(r));
        rbac = Some(Box::pin(rbac::follow(
            fleet,
            publish,
            std::time::Duration::from_millis(100),
            stop.clone(),
        )) as futures::future::BoxFuture<'static, ()>);
        tracing::info!("each cluster's RBAC grants what it grants there");
    }
    let reloadable = Reloadable {
        tokens: files
            .tokens
            .clone()
            .zip(tokens_tx)
            .map(|(path, tx)| TokensReload { path, tx }),
        policy: files
            .policy
            .clone()
            .zip(in_force)
            .map(|(path, in_force)| PolicyReload { path, in_force }),
        rbac,
    };
    let guard = Guard {
        tokens: tokens_rx,
        reviewer: reviewer.map(Arc::new),
        client_certs: files.client_certs,
        policy: policy_rx,
        open_health: files.open_health,
        open_reflection: files.open_reflection,
        routers: files.routers.clone().into(),
        ..Guard::default()
    };
    Ok((guard, reloadable))
}

/// What reads the security files of a [`Guard`] again: a file that fails keeps the
/// last good version in force.
pub struct Reloadable {
    /// The tokens file, when there is one.
    pub tokens: Option<TokensReload>,
    /// The policy file, when there is one.
    pub policy: Option<PolicyReload>,
    /// With each cluster's RBAC in force: what follows it into the grants, for the
    /// caller to run as a task (it ends at the guard's `stop`).
    pub rbac: Option<futures::future::BoxFuture<'static, ()>>,
}

/// Reads the tokens file again into the tokens in force.
pub struct TokensReload {
    path: PathBuf,
    tx: watch::Sender<Arc<Tokens>>,
}

impl TokensReload {
    /// The file.
    pub fn path(&self) -> &std::path::Path {
        &self.path
    }

    /// Reads it again: what is in force now, or why it cannot be used.
    pub fn reload(&self) -> Result<String, String> {
        let tokens = Tokens::load(&self.path).map_err(|e| e.to_string())?;
        let n = tokens.len();
        self.tx.send_replace(Arc::new(tokens));
        Ok(format!(
            "tokens reloaded from {}: {n} token(s)",
            self.path.display()
        ))
    }
}

/// Reads the policy file again into the grants in force; running Watch streams
/// follow them.
pub struct PolicyReload {
    path: PathBuf,
    in_force: Arc<GrantsInForce>,
}

impl PolicyReload {
    /// The file.
    pub fn path(&self) -> &std::path::Path {
        &self.path
    }

    /// Reads it again: what is in force now, or why it cannot be used.
    pub fn reload(&self) -> Result<String, String> {
        let policy = PolicyGrants::load(&self.path).map_err(|e| e.to_string())?;
        let n = policy.len();
        self.in_force.update(|g| g.file = Some(Arc::new(policy)));
        Ok(format!(
            "policy reloaded from {}: {n} grant(s); running Watch streams follow it",
            self.path.display()
        ))
    }
}

/// How long a caller whose token could not be reviewed is told to wait before
/// retrying (google.rpc.RetryInfo).
const REVIEW_RETRY: std::time::Duration = std::time::Duration::from_secs(2);

/// How often a running stream's credentials are checked again.
pub const REVALIDATE_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

/// How a caller's identity was established, kept so a stream that outlives the
/// moment of its admission can be held to it.
#[derive(Clone)]
enum Credential {
    /// Nothing was presented (no authentication is configured).
    None,
    /// A bearer token.
    Token(Arc<str>),
    /// A verified client certificate, valid until its `notAfter` if it could be read.
    Certificate(Option<std::time::SystemTime>),
}

/// An admitted caller: its access, and the credential it was admitted by.
#[derive(Debug)]
pub struct Admitted {
    /// What the caller may read.
    pub access: Access,
    subject: Subject,
    credential: Credential,
}

impl Admitted {
    /// Its access, and what ends a stream of its once its credential no longer
    /// establishes its identity (checked by `guard`).
    pub fn held_to(self, guard: &Arc<Guard>) -> (Access, fleetscope_grpc::Revocation) {
        let Admitted {
            access,
            subject,
            credential,
        } = self;
        let guard = guard.clone();
        let revocation = fleetscope_grpc::Revocation::new(move || {
            Box::pin(guard.clone().revoked(credential.clone(), subject.clone()))
        });
        (access, revocation)
    }
}

/// The token of an `Authorization` header's value: the scheme is case-insensitive
/// (RFC 7235), the token not empty.
fn bearer_token(value: &str) -> Option<&str> {
    let (scheme, token) = value.trim_start().split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

impl Credential {
    /// How it authenticates, as callers' identities are keyed.
    fn kind(&self) -> &'static str {
        match self {
            Credential::None => "none",
            Credential::Token(_) => "token",
            Credential::Certificate(_) => "certificate",
        }
    }
}

impl std::fmt::Debug for Credential {
    // A token is never written out.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Credential::None => f.write_str("None"),
            Credential::Token(_) => f.write_str("Token(..)"),
            Credential::Certificate(at) => f.debug_tuple("Certificate").field(at).finish(),
        }
    }
}

/// Which service a request is for, as far as security goes.
enum Service {
    Health,
    Reflection,
    Fleet,
}

fn service_of(path: &str) -> Service {
    if path.starts_with("/grpc.health.v1.Health/") {
        Service::Health
    } else if path.starts_with("/grpc.reflection.") {
        Service::Reflection
    } else {
        Service::Fleet
    }
}

impl Guard {
    /// Whether bearer tokens are taken.
    fn takes_tokens(&self) -> bool {
        self.tokens.is_some() || self.reviewer.is_some()
    }

    /// Whether callers must present credentials.
    fn authenticates(&self) -> bool {
        self.takes_tokens() || self.client_certs
    }

    /// What a caller presented would need to be, for a person.
    fn expected(&self) -> &'static str {
        match (self.client_certs, self.takes_tokens()) {
            (true, true) => "a client certificate from the server's client CA, or a bearer token",
            (true, false) => "a client certificate from the server's client CA",
            _ => "a bearer token (authorization: Bearer TOKEN)",
        }
    }

    /// Who a bearer token stands for: the tokens file's entry, else the reviewing
    /// cluster's answer.
    async fn bearer(&self, token: &str) -> Result<Subject, tonic::Status> {
        if !self.takes_tokens() {
            return Err(tonic::Status::unauthenticated(format!(
                "this server takes no bearer tokens; expected {}",
                self.expected()
            )));
        }
        let listed = self
            .tokens
            .as_ref()
            .and_then(|t| t.borrow().subject(token).cloned());
        let found = match (listed, &self.reviewer) {
            (Some(s), _) => Some(s),
            (None, Some(r)) => r.subject(token).await.map_err(|e| {
                use tonic_types::StatusExt as _;
                tonic::Status::with_error_details(
                    tonic::Code::Unavailable,
                    e.to_string(),
                    tonic_types::ErrorDetails::with_retry_info(Some(REVIEW_RETRY)),
                )
            })?,
            (None, None) => None,
        };
        let mut s = found.ok_or_else(|| {
            tonic::Status::unauthenticated("the bearer token is not valid (unknown or revoked)")
        })?;
        if !s.groups.iter().any(|g| g == AUTHENTICATED) {
            s.groups.push(AUTHENTICATED.into());
        }
        Ok(s)
    }

    /// Who the caller is, and by which credential.
    async fn subject(
        &self,
        headers: &http::HeaderMap,
        peer: Option<&PeerInfo>,
    ) -> Result<(Subject, Credential), tonic::Status> {
        if let Some(value) = headers.get(http::header::AUTHORIZATION) {
            let token = value.to_str().ok().and_then(bearer_token).ok_or_else(|| {
                tonic::Status::unauthenticated("the authorization header is not `Bearer TOKEN`")
            })?;
            let subject = self.bearer(token).await?;
            return Ok((subject, Credential::Token(token.into())));
        }
        match peer.and_then(|p| p.certificate.as_ref().map(|c| (c, p.certificate_expires))) {
            Some((Ok(s), expires)) if self.client_certs => {
                let mut s = s.clone();
                s.groups.push(AUTHENTICATED.into());
                Ok((s, Credential::Certificate(expires)))
            }
            Some((Err(why), _)) if self.client_certs => {
                Err(tonic::Status::unauthenticated(why.clone()))
            }
            _ if self.authenticates() => Err(tonic::Status::unauthenticated(format!(
                "no credentials: expected {}",
                self.expected()
            ))),
            _ => Ok((
                Subject {
                    user: ANONYMOUS.into(),
                    groups: vec![UNAUTHENTICATED.into()],
                },
                Credential::None,
            )),
        }
    }

    /// Whether `credential` still establishes `subject`: a token still listed (or
    /// still reviewed) as the same identity, a certificate not expired. A review
    /// that cannot be made now is not a revocation: the stream goes on.
    async fn still_valid(
        &self,
        credential: &Credential,
        subject: &Subject,
    ) -> Result<(), tonic::Status> {
        match credential {
            Credential::None => Ok(()),
            Credential::Certificate(expires) => match expires {
                Some(at) if std::time::SystemTime::now() >= *at => {
                    Err(tonic::Status::unauthenticated(format!(
                        "the client certificate expired at {}: reconnect with a valid one",
                        jiff::Timestamp::try_from(*at)
                            .map(|t| t.to_string())
                            .unwrap_or_default()
                    )))
                }
                _ => Ok(()),
            },
            Credential::Token(token) => match self.bearer(token).await {
                Ok(now) if &now == subject => Ok(()),
                Ok(_) => Err(tonic::Status::unauthenticated(
                    "the bearer token now stands for another identity: reconnect",
                )),
                Err(e) if e.code() == tonic::Code::Unavailable => Ok(()),
                Err(_) => Err(tonic::Status::unauthenticated(
                    "the bearer token was revoked while the stream ran",
                )),
            },
        }
    }

    /// Resolves, with the status to end on, once `credential` no longer establishes
    /// `subject`; checked every [`REVALIDATE_EVERY`].
    async fn revoked(self: Arc<Self>, credential: Credential, subject: Subject) -> tonic::Status {
        let mut ticks = tokio::time::interval(REVALIDATE_EVERY);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticks.tick().await;
            if let Err(why) = self.still_valid(&credential, &subject).await {
                tracing::info!(subject = %subject, reason = why.message(), "a stream's credentials are no longer valid: ended");
                return why;
            }
        }
    }

    /// The identity a request is served as: a router's caller when a router (named by
    /// `--router-name`, known by its client certificate) passes one in
    /// [`REMOTE_USER`] and [`REMOTE_GROUP`], else the caller's own. Identity headers
    /// from anyone else are refused, and once routers are named nobody else is served.
    fn through_router(
        &self,
        subject: Subject,
        credential: &Credential,
        headers: &http::HeaderMap,
    ) -> Result<Subject, tonic::Status> {
        let router = matches!(credential, Credential::Certificate(_))
            && self.routers.contains(&subject.user);
        let users = passed_values(headers, REMOTE_USER, REMOTE_USER_BIN);
        let groups = passed_values(headers, REMOTE_GROUP, REMOTE_GROUP_BIN);
        let any_passed = [REMOTE_USER, REMOTE_USER_BIN, REMOTE_GROUP, REMOTE_GROUP_BIN]
            .iter()
            .any(|h| headers.contains_key(*h));
        if !router {
            if any_passed {
                return Err(tonic::Status::unauthenticated(format!(
                    "identity headers ({REMOTE_USER}, {REMOTE_GROUP}) are taken only from a router named by --router-name, known by its client certificate"
                )));
            }
            if !self.routers.is_empty() {
                return Err(tonic::Status::permission_denied(format!(
                    "{} is not a router of this server (--router-name): query the fleet through a router",
                    subject.user
                )));
            }
            return Ok(subject);
        }
        let mut users = users?;
        let groups = groups?;
        let user = match users.len() {
            0 if groups.is_empty() => return Ok(subject),
            1 => users.remove(0),
            n => {
                return Err(tonic::Status::unauthenticated(format!(
                    "the router passed {n} user names ({REMOTE_USER}, {REMOTE_USER_BIN}): exactly one is taken"
                )));
            }
        };
        Ok(passed_subject(user, groups))
    }

    /// Admits a request or says why not: the caller's access for the Fleet service,
    /// `None` for health and reflection when they are open to anyone.
    pub async fn admit(
        &self,
        path: &str,
        headers: &http::HeaderMap,
        peer: Option<&PeerInfo>,
    ) -> Result<Option<Admitted>, tonic::Status> {
        let service = service_of(path);
        match service {
            Service::Health if self.open_health => return Ok(None),
            Service::Reflection if self.open_reflection => return Ok(None),
            _ => {}
        }
        let (subject, credential) = self.subject(headers, peer).await?;
        let subject = self.through_router(subject, &credential, headers)?;
        let admitted = |policy: &watch::Receiver<Arc<dyn Policy>>| {
            Some(Admitted {
                access: Access::new(subject.clone(), policy.clone())
                    .authenticated_by(credential.kind()),
                subject: subject.clone(),
                credential: credential.clone(),
            })
        };
        if let Some(policy) = &self.policy {
            return Ok(admitted(policy));
        }
        if peer.is_some_and(PeerInfo::is_loopback) {
            return Ok(admitted(&self.everything));
        }
        Err(tonic::Status::permission_denied(
            "no policy is configured (--policy): only callers on the server's own host are served",
        ))
    }
}

impl Guard {
    /// Admits a scrape of `/metrics`: the caller authenticated as for gRPC and granted
    /// the endpoint by the policy; without a policy, only from this host.
    pub async fn admit_metrics(
        &self,
        headers: &http::HeaderMap,
        peer: Option<&PeerInfo>,
    ) -> Result<(), tonic::Status> {
        let (subject, _) = self.subject(headers, peer).await?;
        let path = fleetscope_model::access::METRICS_ENDPOINT;
        match &self.policy {
            Some(policy) if !policy.borrow().endpoint(&subject, path) => {
                Err(tonic::Status::permission_denied(format!(
                    "{subject} may not read {path}: a grant of nonResourceURLs [{path:?}] is needed"
                )))
            }
            Some(_) => Ok(()),
            None if peer.is_some_and(PeerInfo::is_loopback) => Ok(()),
            None => Err(tonic::Status::permission_denied(
                "no policy is configured (--policy): metrics are served to this host only",
            )),
        }
    }
}

/// The layer that admits every request (see [`Guard::admit`]) and hands the caller's
/// [`Access`] on in the request's extensions.
#[derive(Clone)]
pub struct AuthLayer {
    guard: Arc<Guard>,
}

impl AuthLayer {
    /// A layer checking requests against `guard`.
    pub fn new(guard: Guard) -> Self {
        Self {
            guard: Arc::new(guard),
        }
    }
}

impl<S> tower::Layer<S> for AuthLayer {
    type Service = Authenticated<S>;
    fn layer(&self, inner: S) -> Authenticated<S> {
        Authenticated {
            inner,
            guard: self.guard.clone(),
        }
    }
}

/// The service of [`AuthLayer`].
#[derive(Clone)]
pub struct Authenticated<S> {
    inner: S,
    guard: Arc<Guard>,
}

impl<S, B> tower::Service<http::Request<B>> for Authenticated<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<tonic::body::Body>>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    B: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = futures::future::BoxFuture<'static, Result<S::Response, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: http::Request<B>) -> Self::Future {
        // The service made ready is the one called; a clone takes its place.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let guard = self.guard.clone();
        Box::pin(async move {
            let admitted = guard
                .admit(
                    request.uri().path(),
                    request.headers(),
                    request.extensions().get::<PeerInfo>(),
                )
                .await;
            match admitted {
                Ok(admitted) => {
                    if let Some(a) = admitted {
                        // The connection's peer proved who it is: it keeps its place.
                        if let Some(streams) = request
                            .extensions()
                            .get::<PeerInfo>()
                            .and_then(|p| p.streams.as_ref())
                        {
                            streams.authenticated();
                        }
                        let (access, revocation) = a.held_to(&guard);
                        request.extensions_mut().insert(access);
                        request.extensions_mut().insert(revocation);
                    }
                    inner.call(request).await
                }
                Err(status) => {
                    tracing::debug!(path = request.uri().path(), code = ?status.code(), message = status.message(), "request refused");
                    Ok(status.into_http())
                }
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peer(addr: &str, certificate: Option<Result<Subject, String>>) -> PeerInfo {
        PeerInfo {
            remote: Some(addr.parse().unwrap()),
            tls: true,
            certificate,
            certificate_expires: None,
            streams: None,
        }
    }

    const FLEET: &str = "/fleetscope.v1.Fleet/List";

    #[tokio::test]
    async fn without_a_policy_only_loopback_callers_are_served() {
        let g = Guard::default();
        let h = http::HeaderMap::new();
        let a = g
            .admit(FLEET, &h, Some(&peer("127.0.0.1:5", None)))
            .await
            .unwrap()
            .unwrap()
            .access;
        assert_eq!(a.subject().user, ANONYMOUS);
        let e = g
            .admit(FLEET, &h, Some(&peer("10.0.0.1:5", None)))
            .await
            .unwrap_err();
        assert_eq!(e.code(), tonic::Code::PermissionDenied);
        assert!(e.message().contains("--policy"), "{}", e.message());
        assert!(
            g.admit(
                "/grpc.health.v1.Health/Check",
                &h,
                Some(&peer("10.0.0.1:5", None))
            )
            .await
            .unwrap()
            .is_none()
        );
    }

    #[tokio::test]
    async fn with_authentication_a_caller_without_credentials_is_told_what_was_expected() {
        let alice = Subject {
            user: "alice".into(),
            groups: vec!["ops".into()],
        };
        let g = Guard {
            client_certs: true,
            ..Guard::default()
        };
        let h = http::HeaderMap::new();
        let e = g
            .admit(FLEET, &h, Some(&peer("127.0.0.1:5", None)))
            .await
            .unwrap_err();
        assert_eq!(e.code(), tonic::Code::Unauthenticated);
        assert!(
            e.message().contains("client certificate"),
            "{}",
            e.message()
        );
        let a = g
            .admit(FLEET, &h, Some(&peer("127.0.0.1:5", Some(Ok(alice)))))
            .await
            .unwrap()
            .unwrap()
            .access;
        assert_eq!(a.subject().user, "alice");
        assert_eq!(a.subject().groups, ["ops", AUTHENTICATED]);
        // Reflection needs an identity unless open; health does not.
        let e = g
            .admit(
                "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
                &h,
                None,
            )
            .await
            .unwrap_err();
        assert_eq!(e.code(), tonic::Code::Unauthenticated);
        let mut bearer = http::HeaderMap::new();
        bearer.insert(http::header::AUTHORIZATION, "Bearer x".parse().unwrap());
        let e = g.admit(FLEET, &bearer, None).await.unwrap_err();
        assert!(e.message().contains("no bearer tokens"), "{}", e.message());
        let mut basic = http::HeaderMap::new();
        basic.insert(http::header::AUTHORIZATION, "Basic eDp5".parse().unwrap());
        let e = g.admit(FLEET, &basic, None).await.unwrap_err();
        assert!(e.message().contains("Bearer TOKEN"), "{}", e.message());
    }

    #[test]
    fn the_bearer_scheme_is_case_insensitive_and_needs_a_token() {
        assert_eq!(bearer_token("Bearer abc"), Some("abc"));
        assert_eq!(bearer_token("bearer abc "), Some("abc"));
        assert_eq!(bearer_token("BEARER abc"), Some("abc"));
        assert_eq!(bearer_token("Bearer "), None);
        assert_eq!(bearer_token("Bearer"), None);
        assert_eq!(bearer_token("Basic abc"), None);
    }

    #[tokio::test(start_paused = true)]
    async fn a_stream_of_an_expired_certificate_is_revoked_when_it_expires() {
        let g = Arc::new(Guard {
            client_certs: true,
            ..Guard::default()
        });
        let alice = Subject {
            user: "alice".into(),
            groups: vec![],
        };
        let soon = std::time::SystemTime::now() - std::time::Duration::from_secs(1);
        let status = g
            .clone()
            .revoked(Credential::Certificate(Some(soon)), alice.clone())
            .await;
        assert_eq!(status.code(), tonic::Code::Unauthenticated);
        assert!(status.message().contains("expired"), "{}", status.message());
        let later = std::time::SystemTime::now() + std::time::Duration::from_secs(3600);
        assert!(
            g.still_valid(&Credential::Certificate(Some(later)), &alice)
                .await
                .is_ok()
        );
    }
}
