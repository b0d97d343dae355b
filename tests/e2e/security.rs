//! Security from the outside: `fleetscope serve` as a process with TLS, mutual TLS,
//! a tokens file and a policy, over simulated clusters; real gRPC clients (and the
//! CLI binary) with certificates and tokens; the files rewritten while it runs.

#![allow(clippy::unwrap_used)]

use crate::common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::process::{BIN, Server, free_port};
use common::{PATIENCE, replace, tokens_file};
use fleetscope::cli::args::ServerArg;
use fleetscope::cli::{Client, connect};
use fleetscope::proto::{self, EventType};
use fleetscope_sim::{FleetSpec, SimFleet};
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, SanType};

/// A CA and the certificates it signs, written as PEM files in `dir`.
struct Ca {
    issuer: Issuer<'static, KeyPair>,
    dir: PathBuf,
    name: String,
}

impl Ca {
    fn new(dir: &Path, name: &str) -> Self {
        let key = KeyPair::generate().unwrap();
        let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
        p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        p.distinguished_name = rcgen::DistinguishedName::new();
        p.distinguished_name
            .push(DnType::CommonName, format!("{name} CA"));
        let cert = p.self_signed(&key).unwrap();
        std::fs::write(dir.join(format!("{name}-ca.pem")), cert.pem()).unwrap();
        Self {
            issuer: Issuer::new(p, key),
            dir: dir.to_path_buf(),
            name: name.to_string(),
        }
    }

    fn ca(&self) -> PathBuf {
        self.dir.join(format!("{}-ca.pem", self.name))
    }

    /// A certificate for `file`: (cert, key) paths.
    fn issue(&self, file: &str, params: impl FnOnce(&mut CertificateParams)) -> (PathBuf, PathBuf) {
        let key = KeyPair::generate().unwrap();
        let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
        p.distinguished_name = rcgen::DistinguishedName::new();
        params(&mut p);
        let cert = p.signed_by(&key, &self.issuer).unwrap();
        let (c, k) = (
            self.dir.join(format!("{file}.pem")),
            self.dir.join(format!("{file}.key")),
        );
        std::fs::write(&c, cert.pem()).unwrap();
        std::fs::write(&k, key.serialize_pem()).unwrap();
        (c, k)
    }

    fn server(&self, file: &str) -> (PathBuf, PathBuf) {
        self.issue(file, |p| {
            p.subject_alt_names = vec![
                SanType::IpAddress("127.0.0.1".parse().unwrap()),
                SanType::DnsName("localhost".try_into().unwrap()),
            ];
        })
    }

    fn client(&self, file: &str, cn: &str, org: &str) -> (PathBuf, PathBuf) {
        self.issue(file, |p| {
            p.distinguished_name.push(DnType::CommonName, cn);
            p.distinguished_name.push(DnType::OrganizationName, org);
        })
    }
}

/// team-a (by certificate) reads `namespace` of sim-1; bob (by token) reads everything,
/// Secrets' values included; carol (by token) is granted nothing.
fn policy(namespace: &str) -> String {
    format!(
        r#"grants:
  - subjects: [{{group: team-a}}]
    clusters: [sim-1]
    namespaces: [{namespace}]
    resources: [configmaps, secrets, pods]
    verbs: [get, list, watch]
  - subjects: [{{user: bob}}]
    clusters: ["*"]
    namespaces: ["*"]
    clusterScoped: true
    resources: ["*"]
    verbs: ["*"]
    secretData: true
  - subjects: [{{user: bob}}]
    nonResourceURLs: ["/metrics", "/store"]
    verbs: [get]
"#
    )
}

struct Setup {
    _fleet: SimFleet,
    metrics_port: u16,
    kubeconfig: PathBuf,
    dir: tempfile::TempDir,
    ca: Ca,
    server: Server,
    log: PathBuf,
}

impl Setup {
    async fn start() -> Self {
        Self::start_with(&[]).await
    }

    /// [`Setup::start`] with more arguments for `serve`.
    async fn start_with(more: &[&str]) -> Self {
        let s = Self::start_unready(more).await;
        // Ready once bob sees both clusters synced.
        s.until_ready(async || {
            let mut bob = s.client(Who::Token("bob")).await.ok()?;
            bob.list_clusters(proto::ListClustersRequest::default())
                .await
                .ok()
                .map(tonic::Response::into_inner)
        })
        .await;
        s
    }

    /// Waits until `clusters` answers with both clusters synced.
    async fn until_ready(&self, clusters: impl AsyncFn() -> Option<proto::ListClustersResponse>) {
        common::eventually(
            common::with_log("both clusters synced", &self.log),
            async || {
                matches!(clusters().await, Some(r) if r.clusters.len() == 2
                && r.clusters.iter().all(|c| c.freshness == proto::Freshness::Synced as i32))
            },
        )
        .await
    }

    /// `serve` started with more arguments, not waited for.
    async fn start_unready(more: &[&str]) -> Self {
        let fleet = SimFleet::start(&FleetSpec::numbered(2, 80, 0.0))
            .await
            .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let kubeconfig = dir.path().join("kubeconfig");
        fleet.write_kubeconfig(&kubeconfig).unwrap();
        let ca = Ca::new(dir.path(), "one");
        let (cert, key) = ca.server("server");
        ca.client("alice", "alice", "team-a");
        let tokens = dir.path().join("tokens.yaml");
        std::fs::write(
            &tokens,
            tokens_file(&[
                ("bob-token", "bob", &["ops"]),
                ("carol-token", "carol", &[]),
                // Named as alice's certificate, in her group: another identity.
                ("alice-token", "alice", &["team-a"]),
            ]),
        )
        .unwrap();
        std::fs::write(dir.path().join("alice.token"), "alice-token").unwrap();
        std::fs::write(dir.path().join("bob.token"), "bob-token\n").unwrap();
        std::fs::write(dir.path().join("carol.token"), "carol-token").unwrap();
        std::fs::write(dir.path().join("wrong.token"), "guess").unwrap();
        let policy_file = dir.path().join("policy.yaml");
        std::fs::write(&policy_file, policy("team-0")).unwrap();
        let config = dir.path().join("config.yaml");
        std::fs::write(&config, "informer:\n  pageSize: 500\n").unwrap();
        let log = dir.path().join("serve.log");
        let p = |p: &Path| p.display().to_string();
        let metrics_port = free_port();
        let metrics_listen = format!("127.0.0.1:{metrics_port}");
        let server = Server::start(
            &kubeconfig,
            &[
                "--config",
                &p(&config),
                "--metrics-listen",
                &metrics_listen,
                "--no-persist",
                "--resources",
                "configmaps,secrets,pods,namespaces",
                "--tls-cert",
                &p(&cert),
                "--tls-key",
                &p(&key),
                "--client-ca",
                &p(&ca.ca()),
                "--tokens-file",
                &p(&tokens),
                "--policy",
                &p(&policy_file),
            ]
            .into_iter()
            .chain(more.iter().copied())
            .collect::<Vec<_>>(),
            &log,
        );
        Self {
            _fleet: fleet,
            metrics_port,
            kubeconfig,
            dir,
            ca,
            server,
            log,
        }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn server_arg(&self, who: &Who) -> ServerArg {
        let mut arg = ServerArg {
            server: format!("https://127.0.0.1:{}", self.server.port),
            ca: Some(self.ca.ca()),
            cert: None,
            key: None,
            token_file: None,
            tls_server_name: None,
        };
        match who {
            Who::Nobody => {}
            Who::Cert(name) => {
                arg.cert = Some(self.path(&format!("{name}.pem")));
                arg.key = Some(self.path(&format!("{name}.key")));
            }
            Who::Token(name) => arg.token_file = Some(self.path(&format!("{name}.token"))),
            Who::Plaintext => {
                arg.server = format!("http://127.0.0.1:{}", self.server.port);
                arg.ca = None;
            }
        }
        arg
    }

    async fn client(&self, who: Who) -> Result<Client, fleetscope::cli::ClientError> {
        connect(&self.server_arg(&who)).await
    }

    /// The configmaps of a namespace of a simulated cluster, by name, read with kube-rs.
    async fn truth(&self, context: &str, namespace: &str) -> Vec<String> {
        let client = common::kube_client(&self.kubeconfig, context).await;
        let mut names: Vec<String> = kube::Api::<ConfigMap>::namespaced(client, namespace)
            .list(&Default::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .filter_map(|c| c.metadata.name)
            .collect();
        names.sort();
        names
    }

    async fn create_configmap(&self, context: &str, namespace: &str, name: &str) {
        let client = common::kube_client(&self.kubeconfig, context).await;
        kube::Api::<ConfigMap>::namespaced(client, namespace)
            .create(
                &Default::default(),
                &serde_json::from_value(serde_json::json!({"metadata": {"name": name}})).unwrap(),
            )
            .await
            .unwrap();
    }
}

/// A TLS client configuration trusting the CA in `ca`, presenting no certificate.
fn trusting(ca: &Path) -> rustls::ClientConfig {
    use rustls::pki_types::pem::PemObject as _;
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls::pki_types::CertificateDer::pem_file_iter(ca).unwrap() {
        roots.add(cert.unwrap()).unwrap();
    }
    rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth()
}

/// The status of an HTTPS GET of `path` on `port`, verified with `ca`, with a bearer
/// token if given.
async fn https_get(port: u16, ca: &Path, path: &str, token: Option<&str>) -> u16 {
    https_fetch(port, ca, path, token).await.0
}

/// The status and body of an HTTPS GET (see [`https_get`]).
async fn https_fetch(port: u16, ca: &Path, path: &str, token: Option<&str>) -> (u16, String) {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let config = trusting(ca);
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    let mut tls = tokio_rustls::TlsConnector::from(std::sync::Arc::new(config))
        .connect(name, tcp)
        .await
        .unwrap();
    let auth = token.map_or(String::new(), |t| format!("Authorization: Bearer {t}\r\n"));
    let request =
        format!("GET {path} HTTP/1.1\r\nHost: localhost\r\n{auth}Connection: close\r\n\r\n");
    tls.write_all(request.as_bytes()).await.unwrap();
    let mut response = Vec::new();
    let _ = tls.read_to_end(&mut response).await;
    let text = String::from_utf8_lossy(&response);
    let code = text
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or_else(|| panic!("not an HTTP response: {text}"));
    let body = text.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    (code, body.to_string())
}

enum Who {
    Nobody,
    Plaintext,
    Cert(&'static str),
    Token(&'static str),
}

fn configmaps(namespaces: &[&str]) -> proto::Query {
    proto::Query {
        resource: "configmaps".into(),
        namespaces: namespaces.iter().map(|n| n.to_string()).collect(),
        ..Default::default()
    }
}

/// Every configmap a caller may count.
async fn count_configmaps(
    c: &mut Client,
) -> Result<tonic::Response<proto::CountResponse>, tonic::Status> {
    c.count(proto::CountRequest {
        query: Some(configmaps(&[])),
        ..Default::default()
    })
    .await
}

/// (cluster, namespace, name) of every configmap a caller lists, page by page.
async fn list_all(c: &mut Client, query: proto::Query) -> Vec<(String, String, String)> {
    let mut out = Vec::new();
    let mut token = String::new();
    loop {
        let page = c
            .list(proto::ListRequest {
                query: Some(query.clone()),
                limit: 7,
                page_token: token,
                keep_snapshot: false,
            })
            .await
            .unwrap()
            .into_inner();
        for o in page.items {
            out.push((o.cluster, o.namespace, o.name));
        }
        if page.next_page_token.is_empty() {
            return out;
        }
        token = page.next_page_token;
    }
}

fn code<T: std::fmt::Debug>(r: Result<T, tonic::Status>) -> tonic::Code {
    r.expect_err("refused").code()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_identities_and_grants_hold_on_every_rpc() {
    let s = Setup::start().await;
    let ca2 = Ca::new(s.dir.path(), "other");
    ca2.client("mallory", "alice", "team-a");

    // Transport: plaintext to a TLS port fails; TLS without credentials is told what
    // was expected; a certificate from another CA is refused.
    let plain = s.client(Who::Plaintext).await;
    if let Ok(mut c) = plain {
        c.list_clusters(proto::ListClustersRequest::default())
            .await
            .expect_err("plaintext to a TLS server fails");
    }
    let mut nobody = s.client(Who::Nobody).await.unwrap();
    let e = nobody
        .list_clusters(proto::ListClustersRequest::default())
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::Unauthenticated);
    assert!(
        e.message().contains("client certificate"),
        "{}",
        e.message()
    );
    // Health is open; reflection is not.
    let channel = tls_channel(&s).await;
    tonic_health::pb::health_client::HealthClient::new(channel.clone())
        .check(tonic_health::pb::HealthCheckRequest::default())
        .await
        .expect("health is open");
    let mallory = ServerArg {
        cert: Some(s.path("mallory.pem")),
        key: Some(s.path("mallory.key")),
        ..s.server_arg(&Who::Nobody)
    };
    if let Ok(mut c) = connect(&mallory).await {
        c.list_clusters(proto::ListClustersRequest::default())
            .await
            .expect_err("a certificate from another CA is refused");
    }
    // Each of these connection mistakes is told what is wrong and what to try.
    // Run off the async workers, and bounded: a CLI that hangs fails the test.
    let cli_error = |args: Vec<String>| async move {
        let mut child = tokio::process::Command::new(BIN)
            .args(&args)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let mut err = String::new();
        use tokio::io::AsyncReadExt as _;
        let mut stderr = child.stderr.take().unwrap();
        let status = tokio::time::timeout(PATIENCE, async {
            let _ = stderr.read_to_string(&mut err).await;
            child.wait().await.unwrap()
        })
        .await
        .unwrap_or_else(|_| panic!("{args:?} hung"));
        assert!(!status.success(), "{args:?}");
        err
    };
    let p = |p: PathBuf| p.display().to_string();
    let tls_url = format!("https://127.0.0.1:{}", s.server.port);
    // A plaintext HTTP server, as a proxy or another service would be: a thread of
    // its own, so nothing here waits on the test's runtime.
    let plain = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let plain_url = format!("https://{}", plain.local_addr().unwrap());
    std::thread::spawn(move || {
        use std::io::Write as _;
        for mut c in plain.incoming().flatten() {
            let _ = c.write_all(b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\n");
        }
    });
    for (args, says) in [
        (
            vec![
                "clusters".to_string(),
                "--server".into(),
                format!("http://127.0.0.1:{}", s.server.port),
            ],
            "use https://",
        ),
        (
            vec!["clusters".into(), "--server".into(), tls_url.clone()],
            "--ca",
        ),
        (
            vec![
                "clusters".into(),
                "--server".into(),
                plain_url,
                "--ca".into(),
                p(s.ca.ca()),
            ],
            "does not speak TLS",
        ),
        (
            vec![
                "clusters".into(),
                "--server".into(),
                format!("http://127.0.0.1:{}", free_port()),
            ],
            "nothing listens there",
        ),
        (
            vec![
                "clusters".into(),
                "--server".into(),
                tls_url,
                "--ca".into(),
                p(s.ca.ca()),
                "--cert".into(),
                p(s.path("mallory.pem")),
                "--key".into(),
                p(s.path("mallory.key")),
            ],
            "client CA",
        ),
    ] {
        let err = cli_error(args.clone()).await;
        assert!(err.contains(says), "{args:?}: {err}");
    }

    // The metrics listener: the same TLS; probes open, metrics for identities only.
    let ca = s.ca.ca();
    let started = std::fs::read_to_string(&s.log).unwrap();
    assert!(
        started.contains(&format!(
            "metrics on https://127.0.0.1:{}/metrics",
            s.metrics_port
        )),
        "the start-up line names the scheme served"
    );
    assert_eq!(https_get(s.metrics_port, &ca, "/readyz", None).await, 200);
    assert_eq!(https_get(s.metrics_port, &ca, "/livez", None).await, 200);
    assert_eq!(https_get(s.metrics_port, &ca, "/metrics", None).await, 401);
    assert_eq!(
        https_get(s.metrics_port, &ca, "/metrics", Some("guess")).await,
        401
    );
    assert_eq!(
        https_get(s.metrics_port, &ca, "/metrics", Some("bob-token")).await,
        200
    );
    // Metrics and the store's figures name every cluster: they need a grant of their
    // own, which carol (granted nothing) and alice (granted objects) lack.
    assert_eq!(
        https_get(s.metrics_port, &ca, "/metrics", Some("carol-token")).await,
        403
    );
    for who in [Who::Token("carol"), Who::Cert("alice")] {
        let e = s
            .client(who)
            .await
            .unwrap()
            .get_store(proto::GetStoreRequest::default())
            .await
            .unwrap_err();
        assert_eq!(e.code(), tonic::Code::PermissionDenied, "{e:?}");
        assert!(e.message().contains("/store"), "{}", e.message());
    }
    s.client(Who::Token("bob"))
        .await
        .unwrap()
        .get_store(proto::GetStoreRequest::default())
        .await
        .unwrap();

    // The bearer scheme is case-insensitive (RFC 7235).
    let mut nobody = s.client(Who::Nobody).await.unwrap();
    let mut request = tonic::Request::new(proto::ListClustersRequest::default());
    request
        .metadata_mut()
        .insert("authorization", "bearer bob-token".parse().unwrap());
    let r = nobody.list_clusters(request).await.unwrap().into_inner();
    assert_eq!(r.clusters.len(), 2, "bob sees both clusters");

    // Tokens: a wrong one is refused.
    let mut wrong = s.client(Who::Token("wrong")).await.unwrap();
    let e = count_configmaps(&mut wrong).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::Unauthenticated);
    assert!(e.message().contains("not valid"), "{}", e.message());

    // The matrix: alice (certificate, team-a) reads sim-1/team-0 only.
    let mut alice = s.client(Who::Cert("alice")).await.unwrap();
    let mut bob = s.client(Who::Token("bob")).await.unwrap();
    let mut carol = s.client(Who::Token("carol")).await.unwrap();
    let truth = s.truth("sim-1", "team-0").await;
    assert!(truth.len() >= 2, "the workload has configmaps in team-0");
    let seen = list_all(&mut alice, configmaps(&[])).await;
    let mut names: Vec<String> = seen
        .iter()
        .map(|(c, n, name)| {
            assert_eq!((c.as_str(), n.as_str()), ("sim-1", "team-0"));
            name.clone()
        })
        .collect();
    names.sort();
    assert_eq!(names, truth);
    let everything = list_all(&mut bob, configmaps(&[])).await;
    assert!(everything.len() > truth.len());
    assert!(everything.iter().any(|(c, _, _)| c == "sim-2"));
    // Totals count only what is granted.
    let first = alice
        .list(proto::ListRequest {
            query: Some(configmaps(&[])),
            limit: 1,
            page_token: String::new(),
            keep_snapshot: false,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(first.remaining_item_count as usize + 1, truth.len());
    assert_eq!(first.clusters.len(), 1, "only sim-1 is drawn on");
    let count = alice
        .count(proto::CountRequest {
            query: Some(configmaps(&[])),
            group_by: vec!["cluster".into(), "namespace".into()],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(count.total as usize, truth.len());
    assert_eq!(count.groups.len(), 1);
    assert_eq!(count.groups[0].key, ["sim-1", "team-0"]);
    // A page token is bound to whoever got it.
    let e = bob
        .list(proto::ListRequest {
            page_token: first.next_page_token.clone(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
    // Bound to the whole identity: the same user and groups by a token are another.
    let e = s
        .client(Who::Token("alice"))
        .await
        .unwrap()
        .list(proto::ListRequest {
            page_token: first.next_page_token.clone(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
    assert!(
        alice
            .list(proto::ListRequest {
                page_token: first.next_page_token.clone(),
                ..Default::default()
            })
            .await
            .is_ok()
    );
    // Get: not granted reads as not there.
    let get = |cluster: &str, namespace: &str, name: &str| proto::GetRequest {
        resource: "configmaps".into(),
        cluster: cluster.into(),
        namespace: namespace.into(),
        name: name.into(),
        ..Default::default()
    };
    let mine = &truth[0];
    assert!(alice.get(get("sim-1", "team-0", mine)).await.is_ok());
    let theirs = s.truth("sim-1", "team-1").await;
    let hidden = alice
        .get(get("sim-1", "team-1", &theirs[0]))
        .await
        .unwrap_err();
    let missing = alice
        .get(get("sim-1", "team-1", "no-such"))
        .await
        .unwrap_err();
    assert_eq!(hidden.code(), tonic::Code::NotFound);
    assert_eq!(
        hidden.message().replace(&theirs[0], "X"),
        missing.message().replace("no-such", "X")
    );
    assert_eq!(
        code(alice.get(get("sim-2", "team-0", mine)).await),
        tonic::Code::NotFound
    );
    assert!(bob.get(get("sim-1", "team-1", &theirs[0])).await.is_ok());
    // ListClusters and ListResourceTypes show only what is granted.
    let clusters = alice
        .list_clusters(proto::ListClustersRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(clusters.clusters.len(), 1);
    let sim1 = &clusters.clusters[0];
    assert_eq!(sim1.name, "sim-1");
    let mut streams: Vec<&str> = sim1.streams.iter().map(|s| s.resource.as_str()).collect();
    streams.sort();
    assert_eq!(streams, ["configmaps", "pods", "secrets"]);
    let cm = sim1
        .streams
        .iter()
        .find(|s| s.resource == "configmaps")
        .unwrap();
    assert_eq!(cm.object_count as usize, truth.len());
    let types = alice
        .list_resource_types(proto::ListResourceTypesRequest::default())
        .await
        .unwrap()
        .into_inner();
    let mut names: Vec<&str> = types
        .resource_types
        .iter()
        .map(|t| t.name.as_str())
        .collect();
    names.sort();
    assert_eq!(names, ["configmaps", "pods", "secrets"]);
    let cm = types
        .resource_types
        .iter()
        .find(|t| t.name == "configmaps")
        .unwrap();
    assert_eq!(cm.total as usize, truth.len());
    // Carol is granted nothing: to her, no type is collected and no cluster exists.
    let e = count_configmaps(&mut carol).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::NotFound);
    assert!(e.message().contains("not collected"), "{}", e.message());
    assert!(
        !e.message().contains("pods"),
        "no type is named to her: {}",
        e.message()
    );
    let e = carol
        .list(proto::ListRequest {
            query: Some(configmaps(&[])),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::NotFound);
    // Alice is granted no namespaces: the type exists for her only where granted.
    let e = alice
        .count(proto::CountRequest {
            query: Some(proto::Query {
                resource: "namespaces".into(),
                ..Default::default()
            }),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::NotFound);
    let none = carol
        .list_clusters(proto::ListClustersRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert!(none.clusters.is_empty());

    // Secrets: redacted unless a grant reveals them.
    let kube = common::kube_client(&s.kubeconfig, "sim-1").await;
    kube::Api::<Secret>::namespaced(kube, "team-0")
        .create(
            &Default::default(),
            &serde_json::from_value(serde_json::json!({
                "metadata": {"name": "db"},
                "data": {"password": "aHVudGVyMg=="}
            }))
            .unwrap(),
        )
        .await
        .unwrap();
    let secret = |c: &mut Client| {
        let mut c = c.clone();
        async move {
            common::eventually("the Secret arrives", async || {
                match c
                    .get(proto::GetRequest {
                        resource: "secrets".into(),
                        cluster: "sim-1".into(),
                        namespace: "team-0".into(),
                        name: "db".into(),
                        ..Default::default()
                    })
                    .await
                {
                    Ok(r) => {
                        let json = r.into_inner().object.unwrap().json;
                        Ok(serde_json::from_str::<serde_json::Value>(&json).unwrap())
                    }
                    Err(e) if e.code() == tonic::Code::NotFound => Err(e),
                    Err(e) => panic!("{e}"),
                }
            })
            .await
        }
    };
    let redacted = secret(&mut alice).await;
    assert_eq!(redacted["data"]["password"], "");
    assert_eq!(
        redacted["metadata"]["annotations"]["fleetscope.io/redacted"],
        "data"
    );
    assert_eq!(secret(&mut bob).await["data"]["password"], "aHVudGVyMg==");

    // The CLI over TLS, with a client certificate and with a token.
    let p = |p: PathBuf| p.display().to_string();
    let server = format!("https://127.0.0.1:{}", s.server.port);
    let out = std::process::Command::new(BIN)
        .args([
            "get",
            "configmaps",
            "-o",
            "name",
            "--server",
            &server,
            "--ca",
        ])
        .arg(p(s.ca.ca()))
        .args([
            "--cert",
            &p(s.path("alice.pem")),
            "--key",
            &p(s.path("alice.key")),
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let printed = String::from_utf8_lossy(&out.stdout);
    assert_eq!(printed.lines().count(), truth.len(), "{printed}");
    assert!(
        printed.lines().all(|l| l.starts_with("sim-1/")),
        "{printed}"
    );
    let out = std::process::Command::new(BIN)
        .args([
            "count",
            "configmaps",
            "-o",
            "json",
            "--server",
            &server,
            "--ca",
        ])
        .arg(p(s.ca.ca()))
        .args(["--token-file", &p(s.path("bob.token"))])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let counted: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        counted["total"].as_str().unwrap().parse::<usize>().unwrap(),
        everything.len()
    );
    // https:// never falls back to plaintext, and http:// never carries TLS flags.
    let out = std::process::Command::new(BIN)
        .args([
            "clusters",
            "--server",
            &format!("http://127.0.0.1:{}", s.server.port),
            "--ca",
        ])
        .arg(p(s.ca.ca()))
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("https://"));

    // A token revoked by a reload is refused from then on.
    replace(
        &s.path("tokens.yaml"),
        &tokens_file(&[("carol-token", "carol", &[])]),
    );
    common::eventually("bob's token is revoked", async || {
        matches!(
            bob.list_clusters(proto::ListClustersRequest::default()).await,
            Err(e) if e.code() == tonic::Code::Unauthenticated
        )
    })
    .await;
}

/// The next object event (skipping bookmarks and cluster status): type, namespace/name.
async fn next_object(
    w: &mut tonic::Streaming<proto::WatchEvent>,
    bookmarks: &mut Vec<u64>,
) -> (EventType, String, u64) {
    loop {
        let e = tokio::time::timeout(PATIENCE, w.message())
            .await
            .expect("an event in time")
            .unwrap()
            .expect("the watch goes on");
        let t = EventType::try_from(e.r#type).unwrap();
        if t == EventType::Bookmark {
            bookmarks.push(e.revision);
        }
        if let Some(o) = e.object {
            return (
                t,
                format!("{}/{}/{}", o.cluster, o.namespace, o.name),
                e.revision,
            );
        }
        if t == EventType::InitialEventsEnd {
            return (t, String::new(), e.revision);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_watch_event_is_checked_against_the_policy_in_force() {
    let s = Setup::start().await;
    let mut alice = s.client(Who::Cert("alice")).await.unwrap();
    let mut w = alice
        .watch(proto::WatchRequest {
            query: Some(configmaps(&[])),
            send_initial_events: true,
            bookmark_interval: Some(prost_types::Duration {
                seconds: 0,
                nanos: 100_000_000,
            }),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let mut bookmarks = Vec::new();
    let team0 = s.truth("sim-1", "team-0").await;
    let mut initial = Vec::new();
    loop {
        let (t, name, _) = next_object(&mut w, &mut bookmarks).await;
        if t == EventType::InitialEventsEnd {
            break;
        }
        initial.push(name);
    }
    initial.sort();
    let expected: Vec<String> = team0.iter().map(|n| format!("sim-1/team-0/{n}")).collect();
    assert_eq!(initial, expected, "the initial events are the grant's");
    // Outside the grant first, then inside: only the second is delivered.
    s.create_configmap("sim-1", "team-1", "outside").await;
    s.create_configmap("sim-2", "team-0", "outside").await;
    s.create_configmap("sim-1", "team-0", "inside").await;
    let (t, name, at) = next_object(&mut w, &mut bookmarks).await;
    assert_eq!(
        (t, name.as_str()),
        (EventType::Added, "sim-1/team-0/inside")
    );
    // Bookmarks still advance past what was not delivered.
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while bookmarks.last().is_none_or(|b| *b < at) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "a bookmark past {at}"
        );
        let e = tokio::time::timeout(PATIENCE, w.message())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        assert!(e.object.is_none(), "nothing else is delivered: {e:?}");
        if e.r#type == EventType::Bookmark as i32 {
            bookmarks.push(e.revision);
        }
    }

    // The policy now grants team-1 instead of team-0: what leaves is DELETED, what
    // enters ADDED, at once, on the running stream.
    let team1 = s.truth("sim-1", "team-1").await;
    replace(&s.path("policy.yaml"), &policy("team-1"));
    let mut expected: Vec<(EventType, String)> = team0
        .iter()
        .chain(["inside".to_string()].iter())
        .map(|n| (EventType::Deleted, format!("sim-1/team-0/{n}")))
        .chain(
            team1
                .iter()
                .map(|n| (EventType::Added, format!("sim-1/team-1/{n}"))),
        )
        .collect();
    expected.sort_by(|a, b| a.1.cmp(&b.1));
    let mut got = Vec::new();
    for _ in 0..expected.len() {
        let (t, name, _) = next_object(&mut w, &mut bookmarks).await;
        got.push((t, name));
    }
    got.sort_by(|a, b| a.1.cmp(&b.1));
    assert_eq!(got, expected);
    // From then on, the new grant decides.
    s.create_configmap("sim-1", "team-0", "gone-now").await;
    s.create_configmap("sim-1", "team-1", "granted-now").await;
    let (t, name, _) = next_object(&mut w, &mut bookmarks).await;
    assert_eq!(
        (t, name.as_str()),
        (EventType::Added, "sim-1/team-1/granted-now")
    );

    // A policy that fails to load keeps the last good one in force, and says so.
    replace(
        &s.path("policy.yaml"),
        "grants:\n  - subjects: [{user: x}]\n    verbs: [read]\n",
    );
    let failed = common::eventually("the bad policy is reported", async || {
        let r = alice
            .list_clusters(proto::ListClustersRequest::default())
            .await
            .unwrap()
            .into_inner();
        let policy = r.inputs.into_iter().find(|i| i.name == "policy").unwrap();
        if policy.error.is_empty() {
            Err(policy)
        } else {
            Ok(policy)
        }
    })
    .await;
    assert!(
        failed.error.contains("policy.yaml") && failed.error_time.is_some(),
        "{failed:?}"
    );
    assert!(
        std::fs::read_to_string(&s.log)
            .unwrap_or_default()
            .contains("the policy cannot be reloaded"),
        "and the log says so"
    );
    s.create_configmap("sim-1", "team-1", "still-granted").await;
    let (t, name, _) = next_object(&mut w, &mut bookmarks).await;
    assert_eq!(
        (t, name.as_str()),
        (EventType::Added, "sim-1/team-1/still-granted")
    );

    // The server's certificate rotates: the running Watch goes on, and new
    // connections are served with the new certificate.
    let ca2 = Ca::new(s.dir.path(), "rotated");
    let (cert, key) = ca2.server("server-next");
    std::fs::copy(&key, s.path("server.key.next")).unwrap();
    std::fs::copy(&cert, s.path("server.pem.next")).unwrap();
    std::fs::rename(s.path("server.key.next"), s.path("server.key")).unwrap();
    std::fs::rename(s.path("server.pem.next"), s.path("server.pem")).unwrap();
    let with_ca = |ca: PathBuf| ServerArg {
        ca: Some(ca),
        ..s.server_arg(&Who::Cert("alice"))
    };
    common::eventually("the new certificate is served", async || {
        match connect(&with_ca(ca2.ca())).await {
            Ok(mut c) => c
                .list_clusters(proto::ListClustersRequest::default())
                .await
                .is_ok(),
            Err(_) => false,
        }
    })
    .await;
    let old = match connect(&with_ca(s.ca.ca())).await {
        Ok(mut c) => c
            .list_clusters(proto::ListClustersRequest::default())
            .await
            .is_ok(),
        Err(_) => false,
    };
    assert!(!old, "the old certificate is no longer served");
    s.create_configmap("sim-1", "team-1", "after-rotation")
        .await;
    let (t, name, _) = next_object(&mut w, &mut bookmarks).await;
    assert_eq!(
        (t, name.as_str()),
        (EventType::Added, "sim-1/team-1/after-rotation")
    );
}

#[tokio::test]
async fn bad_security_input_stops_serve_naming_the_file_and_key() {
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    // One cluster, never reached: the security files are checked before anything is served.
    std::fs::write(
        &kubeconfig,
        "apiVersion: v1\nkind: Config\nclusters: [{name: c, cluster: {server: 'https://127.0.0.1:1'}}]\n\
         contexts: [{name: c, context: {cluster: c, user: u}}]\nusers: [{name: u, user: {token: t}}]\ncurrent-context: c\n",
    )
    .unwrap();
    // The address to serve on is taken: an error naming a file, not the address, shows
    // the files were read before any port was bound.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let listen = taken.local_addr().unwrap().to_string();
    let run = |args: &[&str]| {
        let out = std::process::Command::new(BIN)
            .arg("serve")
            .args(["--no-persist", "--listen", &listen, "--kubeconfig"])
            .arg(&kubeconfig)
            .args(args)
            .output()
            .unwrap();
        assert!(!out.status.success(), "{args:?} is refused");
        String::from_utf8_lossy(&out.stderr).to_string()
    };
    let policy = dir.path().join("policy.yaml");
    std::fs::write(&policy, "grants:\n  - subjects: [{user: a}]\n    clusters: [x]\n    namespaces: [y]\n    resources: [pods]\n    verbs: [get, delete]\n").unwrap();
    let e = run(&["--policy", &policy.display().to_string()]);
    assert!(
        e.contains("policy.yaml") && e.contains("grants[0].verbs[1]"),
        "{e}"
    );
    let tokens = dir.path().join("tokens.yaml");
    std::fs::write(&tokens, "tokens:\n  - name: a\n    sha256: nothex\n").unwrap();
    let e = run(&["--tokens-file", &tokens.display().to_string()]);
    assert!(
        e.contains("tokens.yaml") && e.contains("tokens[0].sha256"),
        "{e}"
    );
    let cert = dir.path().join("cert.pem");
    std::fs::write(&cert, "not a certificate").unwrap();
    let e = run(&[
        "--tls-cert",
        &cert.display().to_string(),
        "--tls-key",
        &cert.display().to_string(),
    ]);
    assert!(e.contains("cert.pem") && e.contains("certificate"), "{e}");
    // Plaintext beyond loopback needs saying so.
    let out = std::process::Command::new(BIN)
        .arg("serve")
        .args(["--no-persist", "--listen", "0.0.0.0:0", "--kubeconfig"])
        .arg(&kubeconfig)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(
        e.contains("--insecure-listen") && e.contains("--tls-cert"),
        "{e}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_the_server_does_not_list_is_checked_with_a_token_review_and_cached() {
    use fleetscope_sim::{Token, Verb};
    let (fleet, dir, kubeconfig) = common::fleet_with_kubeconfig(1, 60).await;
    let cluster = fleet.servers()[0].cluster();
    cluster.add_token(Token::new("dora-token", "dora").with_groups(&["team-a"]));
    cluster.add_token(Token::new("ella-token", "ella").with_groups(&["team-a"]));
    std::fs::write(dir.path().join("dora.token"), "dora-token").unwrap();
    std::fs::write(dir.path().join("ella.token"), "ella-token").unwrap();
    std::fs::write(dir.path().join("nobody.token"), "nobody-token").unwrap();
    let policy_file = dir.path().join("policy.yaml");
    std::fs::write(&policy_file, policy("team-0")).unwrap();
    let log = dir.path().join("serve.log");
    let server = Server::start(
        &kubeconfig,
        &[
            "--no-persist",
            "--resources",
            "configmaps",
            "--policy",
            policy_file.to_str().unwrap(),
            "--token-review-context",
            "sim-1",
            "--token-review-ttl",
            "1s",
            "--token-review-negative-ttl",
            "1s",
        ],
        &log,
    );
    let arg = |who: &str| ServerArg {
        server: server.url(),
        ca: None,
        cert: None,
        key: None,
        token_file: Some(dir.path().join(format!("{who}.token"))),
        tls_server_name: None,
    };
    common::wait_serving(&server.url()).await;
    let reviews = || cluster.requests(Verb::Create, "tokenreviews.authentication.k8s.io");
    let truth = {
        let client = common::kube_client(&kubeconfig, "sim-1").await;
        kube::Api::<ConfigMap>::namespaced(client, "team-0")
            .list(&Default::default())
            .await
            .unwrap()
            .items
            .len() as u64
    };
    // Dora's token is reviewed by sim-1: she is in team-a, granted team-0 of sim-1.
    let mut dora = connect(&arg("dora")).await.unwrap();
    let count = |c: &mut Client| {
        let mut c = c.clone();
        async move {
            c.count(proto::CountRequest {
                query: Some(configmaps(&[])),
                ..Default::default()
            })
            .await
        }
    };
    common::eventually("dora is served", async || match count(&mut dora).await {
        Ok(r) => r.get_ref().total == truth,
        Err(e) if e.code() == tonic::Code::Unavailable => false,
        Err(e) => panic!("{e}"),
    })
    .await;
    // Within the TTL, her calls cost no further review.
    let before = reviews();
    for _ in 0..5 {
        count(&mut dora).await.unwrap();
    }
    assert!(reviews() - before <= 1, "answers are cached");
    // Many calls of one token not yet reviewed cost one review, not one each.
    let ella = connect(&arg("ella")).await.unwrap();
    let before = reviews();
    let calls: Vec<_> = (0..20)
        .map(|_| tokio::spawn(count(&mut ella.clone())))
        .collect();
    for call in calls {
        call.await.unwrap().unwrap();
    }
    assert_eq!(reviews() - before, 1, "one review for twenty calls at once");
    // A token the cluster does not know is refused, and the refusal cached too.
    let mut nobody = connect(&arg("nobody")).await.unwrap();
    let before = reviews();
    for _ in 0..3 {
        let e = count(&mut nobody).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::Unauthenticated);
    }
    assert!(reviews() - before <= 1, "refusals are cached");
    // Revoked at the cluster: refused once the cached answer expires, and a Watch
    // she opened before is ended.
    let mut dora_w = watching(&mut dora).await;
    let revoked = tokio::time::Instant::now();
    cluster.revoke_token("dora-token");
    let (status, took) = ended(&mut dora_w, revoked).await;
    assert_eq!(status.code(), tonic::Code::Unauthenticated, "{status:?}");
    eprintln!("a Watch whose token a review no longer accepts ended {took:?} after the revocation");
    common::eventually("the revocation is seen", async || {
        matches!(count(&mut dora).await, Err(e) if e.code() == tonic::Code::Unauthenticated)
    })
    .await;
    drop(server);
    fleet.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_cluster_s_own_rbac_grants_what_it_grants_there_and_a_change_reaches_a_running_watch()
{
    use fleetscope_sim::Token;
    use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, RoleBinding};
    let (fleet, dir, kubeconfig) = common::fleet_with_kubeconfig(2, 80).await;
    // One identity known to both clusters (as with OIDC).
    for s in fleet.servers() {
        s.cluster().add_token(Token::new("erin-token", "erin"));
        s.cluster().add_token(Token::new("fred-token", "fred"));
    }
    std::fs::write(dir.path().join("erin.token"), "erin-token").unwrap();
    std::fs::write(dir.path().join("fred.token"), "fred-token").unwrap();
    fn json<T: serde::de::DeserializeOwned>(v: serde_json::Value) -> T {
        serde_json::from_value(v).unwrap()
    }
    let reader = serde_json::json!({"metadata": {"name": "cm-reader"}, "rules": [
        {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list", "watch"]}]});
    let role_ref = serde_json::json!({"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cm-reader"});
    let erin = serde_json::json!([{"kind": "User", "name": "erin", "apiGroup": "rbac.authorization.k8s.io"}]);
    let sim1 = common::kube_client(&kubeconfig, "sim-1").await;
    let sim2 = common::kube_client(&kubeconfig, "sim-2").await;
    for c in [&sim1, &sim2] {
        kube::Api::<ClusterRole>::all(c.clone())
            .create(&Default::default(), &json(reader.clone()))
            .await
            .unwrap();
    }
    // What a real cluster binds every authenticated user to: discovery, self-reviews.
    kube::Api::<ClusterRole>::all(sim1.clone())
        .create(
            &Default::default(),
            &json(serde_json::json!({"metadata": {"name": "system:discovery"}, "rules": [
                {"nonResourceURLs": ["/api", "/apis", "/version"], "verbs": ["get"]},
                {"apiGroups": ["authorization.k8s.io"], "resources": ["selfsubjectaccessreviews"], "verbs": ["create"]}]})),
        )
        .await
        .unwrap();
    kube::Api::<ClusterRoleBinding>::all(sim1.clone())
        .create(
            &Default::default(),
            &json(serde_json::json!({"metadata": {"name": "system:discovery"},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "system:discovery"},
                "subjects": [{"kind": "Group", "name": "system:authenticated", "apiGroup": "rbac.authorization.k8s.io"}]})),
        )
        .await
        .unwrap();
    // sim-1: configmaps of team-0 only; sim-2: every configmap.
    kube::Api::<RoleBinding>::namespaced(sim1.clone(), "team-0")
        .create(
            &Default::default(),
            &json(serde_json::json!({"metadata": {"name": "erin"}, "roleRef": role_ref, "subjects": erin})),
        )
        .await
        .unwrap();
    kube::Api::<ClusterRoleBinding>::all(sim2.clone())
        .create(
            &Default::default(),
            &json(serde_json::json!({"metadata": {"name": "erin"}, "roleRef": role_ref, "subjects": erin})),
        )
        .await
        .unwrap();
    // fred reads every type of every group in sim-2, through `*`.
    kube::Api::<ClusterRole>::all(sim2.clone())
        .create(
            &Default::default(),
            &json(
                serde_json::json!({"metadata": {"name": "reads-everything"}, "rules": [
                {"apiGroups": ["*"], "resources": ["*"], "verbs": ["get", "list", "watch"]}]}),
            ),
        )
        .await
        .unwrap();
    kube::Api::<ClusterRoleBinding>::all(sim2.clone())
        .create(
            &Default::default(),
            &json(serde_json::json!({"metadata": {"name": "fred"},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "reads-everything"},
                "subjects": [{"kind": "User", "name": "fred", "apiGroup": "rbac.authorization.k8s.io"}]})),
        )
        .await
        .unwrap();
    let log = dir.path().join("serve.log");
    let kube_api = format!("127.0.0.1:{}", free_port());
    let server = Server::start(
        &kubeconfig,
        &[
            "--no-persist",
            "--resources",
            "configmaps",
            "--rbac-authorization",
            "--token-review-context",
            "sim-1",
            "--kube-api-listen",
            &kube_api,
        ],
        &log,
    );
    common::wait_serving(&server.url()).await;
    let count_in = |client: &kube::Client, ns: Option<&str>| {
        let client = client.clone();
        let ns = ns.map(str::to_string);
        async move {
            let api = match ns {
                Some(ns) => kube::Api::<ConfigMap>::namespaced(client, &ns),
                None => kube::Api::<ConfigMap>::all(client),
            };
            api.list(&Default::default()).await.unwrap().items.len() as u64
        }
    };
    let want = vec![
        (
            vec!["sim-1".to_string()],
            count_in(&sim1, Some("team-0")).await,
        ),
        (vec!["sim-2".to_string()], count_in(&sim2, None).await),
    ];
    let mut c = connect(&ServerArg {
        server: server.url(),
        ca: None,
        cert: None,
        key: None,
        token_file: Some(dir.path().join("erin.token")),
        tls_server_name: None,
    })
    .await
    .unwrap();
    common::eventually(
        format!("erin sees what RBAC grants: {want:?}"),
        async || {
            let got = c
                .count(proto::CountRequest {
                    query: Some(configmaps(&[])),
                    group_by: vec!["cluster".into()],
                })
                .await
                .map(|r| {
                    r.into_inner()
                        .groups
                        .into_iter()
                        .map(|g| (g.key, g.count))
                        .collect::<Vec<_>>()
                });
            if got.as_ref().is_ok_and(|g| *g == want) {
                Ok(())
            } else {
                Err(got)
            }
        },
    )
    .await;
    // The Kubernetes API grants the same, each token reviewed as for gRPC: erin's
    // list of the fleet counts what each cluster's RBAC grants her.
    let by_cluster = |token: &'static str| {
        let kube_api = kube_api.clone();
        async move {
            let auth = format!("Bearer {token}");
            let headers = [("authorization", auth.as_str())];
            let (code, body) =
                common::http_get_with(&kube_api, "/clusters/*/api/v1/configmaps", &headers)
                    .await
                    .unwrap();
            let list: serde_json::Value = serde_json::from_str(&body).unwrap();
            let mut counts = std::collections::BTreeMap::<String, u64>::new();
            for o in list["items"].as_array().into_iter().flatten() {
                let c = o["metadata"]["annotations"]["fleetscope.io/cluster"].as_str();
                *counts.entry(c.unwrap_or("?").to_string()).or_default() += 1;
            }
            (
                code,
                counts
                    .into_iter()
                    .map(|(c, n)| (vec![c], n))
                    .collect::<Vec<_>>(),
            )
        }
    };
    assert_eq!(by_cluster("erin-token").await, (200, want.clone()));
    assert_eq!(by_cluster("fred-token").await, (200, vec![want[1].clone()]));
    assert_eq!(by_cluster("nobody-token").await.0, 401);
    // A `*` rule grants every type there, and nothing elsewhere.
    let mut fred = connect(&ServerArg {
        server: server.url(),
        ca: None,
        cert: None,
        key: None,
        token_file: Some(dir.path().join("fred.token")),
        tls_server_name: None,
    })
    .await
    .unwrap();
    let groups = fred
        .count(proto::CountRequest {
            query: Some(configmaps(&[])),
            group_by: vec!["cluster".into()],
        })
        .await
        .unwrap()
        .into_inner()
        .groups
        .into_iter()
        .map(|g| (g.key, g.count))
        .collect::<Vec<_>>();
    assert_eq!(groups, [want[1].clone()]);
    // A running Watch follows a change of a cluster's RBAC.
    let mut w = c
        .watch(proto::WatchRequest {
            query: Some(configmaps(&[])),
            send_initial_events: true,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let mut bookmarks = Vec::new();
    let mut sim1_seen = Vec::new();
    loop {
        let (t, name, _) = next_object(&mut w, &mut bookmarks).await;
        if t == EventType::InitialEventsEnd {
            break;
        }
        if name.starts_with("sim-1/") {
            assert!(name.starts_with("sim-1/team-0/"), "{name}");
            sim1_seen.push(name);
        }
    }
    assert_eq!(sim1_seen.len() as u64, want[0].1);
    kube::Api::<RoleBinding>::namespaced(sim1.clone(), "team-0")
        .delete("erin", &Default::default())
        .await
        .unwrap();
    let mut deleted = Vec::new();
    while deleted.len() < sim1_seen.len() {
        let (t, name, _) = next_object(&mut w, &mut bookmarks).await;
        assert_eq!(t, EventType::Deleted, "{name}");
        deleted.push(name);
    }
    deleted.sort();
    sim1_seen.sort();
    assert_eq!(deleted, sim1_seen);
    // Left with only what every authenticated user is bound to there, sim-1 does not
    // exist for her: not listed, and a Get in it names no cluster.
    let listed: Vec<String> = c
        .list_clusters(proto::ListClustersRequest::default())
        .await
        .unwrap()
        .into_inner()
        .clusters
        .into_iter()
        .map(|c| c.name)
        .collect();
    assert_eq!(listed, ["sim-2"]);
    let gone = sim1_seen[0].split('/').collect::<Vec<_>>();
    let e = c
        .get(proto::GetRequest {
            resource: "configmaps".into(),
            cluster: "sim-1".into(),
            namespace: gone[1].into(),
            name: gone[2].into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::NotFound);
    assert!(e.message().contains("no cluster named"), "{}", e.message());
    drop(server);
    fleet.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscriber_held_to_a_grant_resumes_across_a_sigkill_seeing_only_its_grant() {
    use common::subscriber::Subscriber;
    let (fleet, dir, kubeconfig) = common::fleet_with_kubeconfig(2, 80).await;
    std::fs::write(
        dir.path().join("tokens.yaml"),
        tokens_file(&[("alice-token", "alice", &["team-a"])]),
    )
    .unwrap();
    std::fs::write(dir.path().join("alice.token"), "alice-token").unwrap();
    std::fs::write(dir.path().join("policy.yaml"), policy("team-0")).unwrap();
    let (data, tokens, policy_file) = (
        dir.path().join("data"),
        dir.path().join("tokens.yaml"),
        dir.path().join("policy.yaml"),
    );
    let args = [
        "--resources",
        "configmaps",
        "--data-dir",
        data.to_str().unwrap(),
        "--tokens-file",
        tokens.to_str().unwrap(),
        "--policy",
        policy_file.to_str().unwrap(),
    ];
    let log = dir.path().join("serve.log");
    // What alice is granted of the clusters: configmaps of sim-1/team-0.
    let granted = || {
        common::truth(&fleet, "configmaps")
            .into_iter()
            .filter(|((c, ns, _), _)| c == "sim-1" && ns == "team-0")
            .collect::<std::collections::BTreeMap<_, _>>()
    };
    let watch = |url: String, sub: &Subscriber| {
        let arg = ServerArg {
            server: url,
            ca: None,
            cert: None,
            key: None,
            token_file: Some(dir.path().join("alice.token")),
            tls_server_name: None,
        };
        let (since, initial) = (sub.last.unwrap_or(0), sub.last.is_none());
        async move {
            let stream = common::eventually("the server serves the Watch", async || {
                let attempt = match connect(&arg).await {
                    Ok(mut c) => {
                        c.watch(proto::WatchRequest {
                            query: Some(configmaps(&[])),
                            since_revision: since,
                            send_initial_events: initial,
                            ..Default::default()
                        })
                        .await
                    }
                    Err(e) => Err(tonic::Status::unavailable(e.to_string())),
                };
                match attempt {
                    Ok(s) => Ok(s),
                    Err(e) if e.code() == tonic::Code::Unavailable => Err(e),
                    Err(e) => panic!("the watch was refused: {e}"),
                }
            })
            .await;
            stream.into_inner()
        }
    };
    let mut server = Server::start(&kubeconfig, &args, &log);
    let mut sub = Subscriber {
        initial: true,
        ..Default::default()
    };
    let mut stream = watch(server.url(), &sub).await;
    sub.converge(&mut stream, &granted()).await;

    // Killed; changes inside and outside the grant while it is down; resumed from the
    // subscriber's last revision.
    server.kill();
    sub.drain(&mut stream).await;
    let sim1 = common::kube_client(&kubeconfig, "sim-1").await;
    let sim2 = common::kube_client(&kubeconfig, "sim-2").await;
    for (client, ns, name) in [
        (&sim1, "team-0", "during-inside"),
        (&sim1, "team-1", "during-outside"),
        (&sim2, "team-0", "during-elsewhere"),
    ] {
        kube::Api::<ConfigMap>::namespaced(client.clone(), ns)
            .create(
                &Default::default(),
                &serde_json::from_value(serde_json::json!({"metadata": {"name": name}})).unwrap(),
            )
            .await
            .unwrap();
    }
    let existing = granted().into_keys().next().unwrap();
    kube::Api::<ConfigMap>::namespaced(sim1.clone(), "team-0")
        .delete(&existing.2, &Default::default())
        .await
        .unwrap();
    let server = Server::start(&kubeconfig, &args, &log);
    let mut stream = watch(server.url(), &sub).await;
    sub.converge(&mut stream, &granted()).await;
    assert!(sub.state.keys().any(|(_, _, n)| n == "during-inside"));
    assert_eq!(sub.deleted.get(&existing), Some(&1));
    // Nothing outside the grant was ever delivered, before or after the kill.
    assert!(
        sub.deleted
            .keys()
            .chain(sub.state.keys())
            .all(|(c, ns, _)| c == "sim-1" && ns == "team-0"),
        "{:?}",
        sub.deleted.keys().collect::<Vec<_>>()
    );
    drop(server);
    fleet.shutdown().await;
}

/// How a stream ends: the status it ends with and how long after `since` it came.
async fn ended(
    w: &mut tonic::Streaming<proto::WatchEvent>,
    since: tokio::time::Instant,
) -> (tonic::Status, Duration) {
    loop {
        match tokio::time::timeout(PATIENCE, w.message())
            .await
            .expect("the stream ends in time")
        {
            Ok(Some(_)) => continue,
            Ok(None) => panic!("the stream ended without a status"),
            Err(status) => return (status, since.elapsed()),
        }
    }
}

/// A Watch of configmaps with frequent bookmarks, read up to its initial state's end.
async fn watching(c: &mut Client) -> tonic::Streaming<proto::WatchEvent> {
    let mut w = c
        .watch(proto::WatchRequest {
            query: Some(configmaps(&[])),
            send_initial_events: true,
            bookmark_interval: Some(prost_types::Duration {
                seconds: 0,
                nanos: 200_000_000,
            }),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    while next_object(&mut w, &mut Vec::new()).await.0 != EventType::InitialEventsEnd {}
    w
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_watch_ends_when_its_identity_is_revoked_or_left_with_no_grant() {
    let s = Setup::start().await;
    // A certificate that expires while its stream runs.
    // Long enough for four clients to connect on a busy machine before it expires.
    let lifetime = Duration::from_secs(12);
    let expires = time::OffsetDateTime::now_utc() + lifetime;
    s.ca.issue("eve", |p| {
        p.distinguished_name.push(DnType::CommonName, "eve");
        p.distinguished_name
            .push(DnType::OrganizationName, "team-a");
        p.not_after = expires;
    });
    let started = tokio::time::Instant::now();
    let mut eve = s.client(Who::Cert("eve")).await.unwrap();
    let mut eve_w = watching(&mut eve).await;
    let mut bob = s.client(Who::Token("bob")).await.unwrap();
    let mut bob_w = watching(&mut bob).await;
    let mut alice = s.client(Who::Cert("alice")).await.unwrap();
    let mut alice_w = watching(&mut alice).await;
    let mut carol = s.client(Who::Token("carol")).await.unwrap();

    // Bob's token is taken out of the tokens file: his running Watch ends.
    replace(
        &s.path("tokens.yaml"),
        &tokens_file(&[("carol-token", "carol", &[])]),
    );
    let (status, took) = ended(&mut bob_w, tokio::time::Instant::now()).await;
    assert_eq!(status.code(), tonic::Code::Unauthenticated, "{status:?}");
    assert!(status.message().contains("revoked"), "{}", status.message());
    eprintln!("a revoked token's Watch ended {took:?} after the tokens file changed");

    // Eve's certificate expires: her Watch ends.
    let (status, took) = ended(&mut eve_w, started).await;
    assert_eq!(status.code(), tonic::Code::Unauthenticated, "{status:?}");
    assert!(status.message().contains("expired"), "{}", status.message());
    assert!(
        took >= lifetime - Duration::from_secs(1),
        "not before it expires: {took:?}"
    );
    eprintln!(
        "an expiring certificate's Watch ended {:?} after it expired",
        took.saturating_sub(lifetime)
    );

    // A policy that grants team-a nothing: alice's Watch is denied, not kept on
    // bookmarks; carol, granted nothing, cannot start one.
    std::fs::write(
        s.path("policy.yaml"),
        "grants:\n  - subjects: [{user: bob}]\n    clusters: [\"*\"]\n    namespaces: [\"*\"]\n    resources: [\"*\"]\n    verbs: [\"*\"]\n",
    )
    .unwrap();
    let (status, took) = ended(&mut alice_w, tokio::time::Instant::now()).await;
    assert_eq!(status.code(), tonic::Code::PermissionDenied, "{status:?}");
    eprintln!("a Watch left with no grant ended {took:?} after the policy changed");
    let refused = carol
        .watch(proto::WatchRequest {
            query: Some(configmaps(&[])),
            ..Default::default()
        })
        .await;
    assert_eq!(code(refused), tonic::Code::NotFound);
}

/// A Secret applied with kubectl: its values in `data` and again in the last-applied
/// annotation.
fn applied_secret(name: &str) -> Secret {
    let applied = serde_json::json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": name, "namespace": "team-0"},
        "data": {"password": "aHVudGVyMg=="}
    });
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "annotations": {
            "kubectl.kubernetes.io/last-applied-configuration": applied.to_string(),
            "example.com/foo": "pruned"
        }},
        "data": {"password": "aHVudGVyMg=="}
    }))
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_secret_s_values_reach_no_one_without_secret_data_by_any_rpc_or_projection() {
    // Pruning one more annotation must not bring kubectl's last-applied one back.
    let s = Setup::start_with(&["--prune-annotation", "example.com/foo"]).await;
    let kube = kube::Api::<Secret>::namespaced(
        common::kube_client(&s.kubeconfig, "sim-1").await,
        "team-0",
    );
    kube.create(&Default::default(), &applied_secret("before"))
        .await
        .unwrap();
    let mut alice = s.client(Who::Cert("alice")).await.unwrap();
    let mut bob = s.client(Who::Token("bob")).await.unwrap();
    let secrets = |projection: proto::Projection| proto::Query {
        resource: "secrets".into(),
        namespaces: vec!["team-0".into()],
        projection: projection as i32,
        ..Default::default()
    };
    let mut seen: Vec<String> = Vec::new();
    let mut watches = Vec::new();
    for projection in [proto::Projection::Full, proto::Projection::Metadata] {
        // The initial events carry `before` (once it is synced), the live ones `after`.
        let w = common::eventually("the secret is synced", async || {
            let mut w = alice
                .watch(proto::WatchRequest {
                    query: Some(secrets(projection)),
                    send_initial_events: true,
                    ..Default::default()
                })
                .await
                .unwrap()
                .into_inner();
            let mut names = Vec::new();
            loop {
                let e = w.message().await.unwrap().unwrap();
                if let Some(o) = &e.object {
                    names.push(o.name.clone());
                    seen.push(o.json.to_string());
                }
                if e.r#type == EventType::InitialEventsEnd as i32 {
                    break;
                }
            }
            names.contains(&"before".to_string()).then_some(w)
        })
        .await;
        watches.push(w);
        let list = alice
            .list(proto::ListRequest {
                query: Some(secrets(projection)),
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        assert!(list.items.iter().any(|o| o.name == "before"));
        seen.extend(list.items.into_iter().map(|o| o.json.to_string()));
    }
    kube.create(&Default::default(), &applied_secret("after"))
        .await
        .unwrap();
    for w in &mut watches {
        loop {
            let e = tokio::time::timeout(PATIENCE, w.message())
                .await
                .unwrap()
                .unwrap()
                .unwrap();
            if let Some(o) = e.object {
                seen.push(o.json.to_string());
                if o.name == "after" {
                    break;
                }
            }
        }
    }
    for name in ["before", "after"] {
        let got = alice
            .get(proto::GetRequest {
                resource: "secrets".into(),
                cluster: "sim-1".into(),
                namespace: "team-0".into(),
                name: name.into(),
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        seen.push(got.object.unwrap().json.to_string());
    }
    // Watch (initial and live) and List in both projections, and Get.
    assert!(seen.len() >= 2 * 4, "every answer was read: {}", seen.len());
    for json in &seen {
        assert!(
            !json.contains("aHVudGVyMg"),
            "a value reached team-a: {json}"
        );
        assert!(
            !json.contains("example.com/foo"),
            "the annotation asked for is pruned: {json}"
        );
        let v: serde_json::Value = serde_json::from_str(json).unwrap();
        assert!(
            v["metadata"]["annotations"]
                .get("kubectl.kubernetes.io/last-applied-configuration")
                .is_none(),
            "{json}"
        );
    }
    // No selector, group key or Watch filter reads a value hidden from her: each
    // answers as if the Secrets had no values (the same for the value and for another).
    let selected = |fields: &str| proto::Query {
        field_selector: fields.into(),
        ..secrets(proto::Projection::Full)
    };
    let value = "aHVudGVyMg==";
    // As a field selector writes it: `=` escaped.
    let selected_value = value.replace('=', "\\=");
    let last_applied = "metadata.annotations.kubectl.kubernetes.io/last-applied-configuration";
    for (mut c, reveals) in [(alice.clone(), false), (bob.clone(), true)] {
        let shown = c
            .count(proto::CountRequest {
                query: Some(selected("")),
                group_by: vec![
                    "field:data.password".into(),
                    format!("field:{last_applied}"),
                ],
            })
            .await
            .unwrap()
            .into_inner();
        let keys: Vec<String> = shown.groups.iter().flat_map(|g| g.key.clone()).collect();
        let values_seen = keys.iter().any(|k| k.contains(value));
        assert_eq!(values_seen, reveals, "group keys {keys:?}");
    }
    let names = async |c: &mut Client, fields: &str| -> (Vec<String>, u64) {
        let listed = c
            .list(proto::ListRequest {
                query: Some(selected(fields)),
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        let counted = c
            .count(proto::CountRequest {
                query: Some(selected(fields)),
                group_by: Vec::new(),
            })
            .await
            .unwrap()
            .into_inner();
        let mut names: Vec<String> = listed.items.into_iter().map(|o| o.name).collect();
        names.sort();
        (names, counted.total)
    };
    let both = (vec!["after".to_string(), "before".to_string()], 2);
    let none = (Vec::new(), 0);
    for (fields, for_alice, for_bob) in [
        (format!("data.password={selected_value}"), &none, &both),
        ("data.password=guess".to_string(), &none, &none),
        ("data.password=".to_string(), &both, &none),
        (format!("data.password!={selected_value}"), &both, &none),
        ("data.password!=guess".to_string(), &both, &both),
        // Collected without it (pruned by default): absent for everyone.
        (format!("{last_applied}="), &both, &both),
        (format!("{last_applied}!="), &none, &none),
    ] {
        assert_eq!(
            &names(&mut alice, &fields).await,
            for_alice,
            "alice, {fields}"
        );
        assert_eq!(&names(&mut bob, &fields).await, for_bob, "bob, {fields}");
    }
    // A Watch's initial events and live ones: a filter on the value passes nothing of
    // hers, one against it passes every Secret, whatever the value.
    let watched = async |c: &mut Client, fields: &str| -> Vec<String> {
        let mut w = c
            .watch(proto::WatchRequest {
                query: Some(selected(fields)),
                send_initial_events: true,
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        let mut names = Vec::new();
        loop {
            let e = w.message().await.unwrap().unwrap();
            if let Some(o) = &e.object {
                names.push(o.name.clone());
            }
            if e.r#type == EventType::InitialEventsEnd as i32 {
                break names;
            }
        }
    };
    assert!(
        watched(&mut alice, &format!("data.password={selected_value}"))
            .await
            .is_empty()
    );
    assert_eq!(
        watched(&mut alice, &format!("data.password!={selected_value}"))
            .await
            .len(),
        2
    );
    assert_eq!(
        watched(&mut bob, &format!("data.password={selected_value}"))
            .await
            .len(),
        2
    );
    let live_watch = |fields: String| {
        let mut c = alice.clone();
        async move {
            c.watch(proto::WatchRequest {
                query: Some(selected(&fields)),
                bookmark_interval: Some(prost_types::Duration {
                    seconds: 1,
                    nanos: 0,
                }),
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner()
        }
    };
    let mut live = live_watch(format!("data.password={selected_value}")).await;
    let mut opposite = live_watch(format!("data.password!={selected_value}")).await;
    kube.create(&Default::default(), &applied_secret("third"))
        .await
        .unwrap();
    // The filter against the value passes the new Secret; the one on it has passed
    // nothing by the time its bookmarks reach the same revision.
    let at = loop {
        let e = tokio::time::timeout(PATIENCE, opposite.message())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        if e.object.as_ref().is_some_and(|o| o.name == "third") {
            break e.revision;
        }
    };
    loop {
        let e = tokio::time::timeout(PATIENCE, live.message())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        assert!(
            e.object.is_none(),
            "a filter on a hidden value passed {e:?}"
        );
        if e.r#type == EventType::Bookmark as i32 && e.revision >= at {
            break;
        }
    }

    // Bob may read the values: he does, where they belong.
    let got = bob
        .get(proto::GetRequest {
            resource: "secrets".into(),
            cluster: "sim-1".into(),
            namespace: "team-0".into(),
            name: "after".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let v: serde_json::Value = serde_json::from_str(&got.object.unwrap().json).unwrap();
    assert_eq!(v["data"]["password"], "aHVudGVyMg==");
}

/// Reloads of each input so far, as `/metrics` counts them.
async fn reloads(s: &Setup) -> Vec<(String, u64)> {
    let (code, body) = https_fetch(s.metrics_port, &s.ca.ca(), "/metrics", Some("bob-token")).await;
    assert_eq!(code, 200, "{body}");
    let counts: Vec<(String, u64)> = body
        .lines()
        .filter_map(|l| {
            let rest = l.strip_prefix("fleetscope_config_reloads_total{input=\"")?;
            let (input, value) = rest.split_once("\"} ")?;
            Some((input.to_string(), value.trim().parse().ok()?))
        })
        .collect();
    assert_eq!(
        counts.len(),
        5,
        "config, sources, tokens, policy, tls: {body}"
    );
    counts
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn followed_files_reload_only_when_their_content_changes() {
    let s = Setup::start().await;
    let before = reloads(&s).await;
    // Every followed file read, one rewritten with the same content, then 10 idle
    // seconds: no input reloads.
    for f in [
        "config.yaml",
        "kubeconfig",
        "tokens.yaml",
        "policy.yaml",
        "server.pem",
        "server.key",
        "one-ca.pem",
    ] {
        std::fs::read(s.path(f)).unwrap();
    }
    let same = std::fs::read_to_string(s.path("tokens.yaml")).unwrap();
    std::fs::write(s.path("tokens.yaml"), &same).unwrap();
    // Another file of the same directory changes: none of its followers reloads.
    std::fs::write(s.path("unrelated.txt"), "x").unwrap();
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert_eq!(
        reloads(&s).await,
        before,
        "nothing changed, nothing reloads"
    );
    // A real change reloads the one input it belongs to, once.
    let mut text = std::fs::read_to_string(s.path("policy.yaml")).unwrap();
    text.push_str("# changed\n");
    replace(&s.path("policy.yaml"), &text);
    let after = common::eventually("the policy reloads", async || {
        let now = reloads(&s).await;
        (now != before).then_some(now)
    })
    .await;
    let changed: Vec<_> = before
        .iter()
        .zip(&after)
        .filter(|(a, b)| a != b)
        .map(|(_, (input, n))| (input.as_str(), *n))
        .collect();
    let policy_before = before.iter().find(|(i, _)| i == "policy").unwrap().1;
    assert_eq!(
        changed,
        [("policy", policy_before + 1)],
        "{before:?} → {after:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reviewing_cluster_that_stops_answering_makes_new_tokens_unavailable_and_keeps_reviewed_ones()
 {
    use fleetscope_sim::Token;
    use tonic_types::StatusExt as _;
    let (fleet, dir, kubeconfig) = common::fleet_with_kubeconfig(2, 40).await;
    let reviewer = fleet.servers()[1].cluster();
    for (token, user) in [("dora-token", "dora"), ("erin-token", "erin")] {
        reviewer.add_token(Token::new(token, user).with_groups(&["team-a"]));
        std::fs::write(dir.path().join(format!("{user}.token")), token).unwrap();
    }
    let policy_file = dir.path().join("policy.yaml");
    std::fs::write(&policy_file, policy("team-0")).unwrap();
    let log = dir.path().join("serve.log");
    let server = Server::start(
        &kubeconfig,
        &[
            "--no-persist",
            "--resources",
            "configmaps",
            "--policy",
            policy_file.to_str().unwrap(),
            "--token-review-context",
            "sim-2",
            "--token-review-ttl",
            "1h",
            "--token-review-timeout",
            "2s",
        ],
        &log,
    );
    common::wait_serving(&server.url()).await;
    let url = server.url();
    let arg = |who: &str| ServerArg {
        server: url.clone(),
        ca: None,
        cert: None,
        key: None,
        token_file: Some(dir.path().join(format!("{who}.token"))),
        tls_server_name: None,
    };
    let count = |mut c: Client| async move {
        c.count(proto::CountRequest {
            query: Some(configmaps(&[])),
            ..Default::default()
        })
        .await
    };
    let dora = connect(&arg("dora")).await.unwrap();
    common::eventually("dora is served", async || count(dora.clone()).await.is_ok()).await;
    // The reviewing cluster accepts connections but answers nothing any more.
    reviewer.set_latency(Duration::from_secs(3600));
    let erin = connect(&arg("erin")).await.unwrap();
    let asked = tokio::time::Instant::now();
    let e = tokio::time::timeout(Duration::from_secs(30), count(erin))
        .await
        .expect("answered before a 30 s client deadline")
        .unwrap_err();
    let took = asked.elapsed();
    assert_eq!(e.code(), tonic::Code::Unavailable, "{e:?}");
    assert!(e.message().contains("sim-2"), "{}", e.message());
    let retry = e.get_details_retry_info().expect("a retry hint");
    assert!(retry.retry_delay.is_some_and(|d| !d.is_zero()), "{retry:?}");
    eprintln!("a review the cluster never answers is UNAVAILABLE after {took:?}");
    // Dora, reviewed before, is still served from the cache.
    count(dora).await.unwrap();
    drop(server);
    // With a review allowed longer than a request: the request's bound answers first.
    let server = Server::start(
        &kubeconfig,
        &[
            "--no-persist",
            "--resources",
            "configmaps",
            "--policy",
            policy_file.to_str().unwrap(),
            "--token-review-context",
            "sim-2",
            "--token-review-timeout",
            "30s",
            "--grpc-request-timeout",
            "1s",
        ],
        &log,
    );
    // Not ready while sim-2 never answers its discovery: wait for the listener only.
    let erin = common::eventually("the server listens", async || {
        connect(&ServerArg {
            server: server.url(),
            ..arg("erin")
        })
        .await
    })
    .await;
    let asked = tokio::time::Instant::now();
    let e = tokio::time::timeout(Duration::from_secs(30), count(erin))
        .await
        .expect("answered before a 30 s client deadline")
        .unwrap_err();
    assert!(
        matches!(
            e.code(),
            tonic::Code::Cancelled | tonic::Code::DeadlineExceeded
        ),
        "{e:?}"
    );
    assert!(
        asked.elapsed() < Duration::from_secs(20),
        "{:?}",
        asked.elapsed()
    );
    drop(server);
    fleet.shutdown().await;
}

/// A TLS connection from `from` (a loopback address) without a client certificate,
/// which sends the HTTP/2 preface and an empty SETTINGS frame when `speak`, and
/// nothing more.
async fn raw_tls(
    port: u16,
    ca: &Path,
    from: &str,
    speak: bool,
) -> std::io::Result<tokio_rustls::client::TlsStream<tokio::net::TcpStream>> {
    use tokio::io::AsyncWriteExt as _;
    let mut config = trusting(ca);
    config.alpn_protocols = vec![b"h2".to_vec()];
    let socket = tokio::net::TcpSocket::new_v4()?;
    socket.bind(format!("{from}:0").parse().unwrap())?;
    let tcp = socket
        .connect(format!("127.0.0.1:{port}").parse().unwrap())
        .await?;
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    let mut tls = tokio_rustls::TlsConnector::from(std::sync::Arc::new(config))
        .connect(name, tcp)
        .await?;
    if speak {
        tls.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\0\0\0\x04\0\0\0\0\0")
            .await?;
        tls.flush().await?;
    }
    Ok(tls)
}

/// Reads a connection to its end: the types of the HTTP/2 frames the server sent
/// (empty when it was closed before sending any, or refused at once).
async fn frames_until_closed(
    mut s: tokio_rustls::client::TlsStream<tokio::net::TcpStream>,
    read: Vec<u8>,
) -> Vec<u8> {
    use tokio::io::AsyncReadExt as _;
    let mut bytes = read;
    let _ = tokio::time::timeout(PATIENCE, s.read_to_end(&mut bytes))
        .await
        .expect("the server closes the connection");
    let mut types = Vec::new();
    let mut at = 0;
    while at + 9 <= bytes.len() {
        let len = (usize::from(bytes[at]) << 16)
            | (usize::from(bytes[at + 1]) << 8)
            | usize::from(bytes[at + 2]);
        types.push(bytes[at + 3]);
        at += 9 + len;
    }
    types
}

/// A counter of `/metrics`, by its exposed name and labels.
async fn counter(s: &Setup, series: &str) -> u64 {
    let (_, body) = https_fetch(s.metrics_port, &s.ca.ca(), "/metrics", Some("bob-token")).await;
    body.lines()
        .find_map(|l| {
            l.strip_prefix(series)?
                .strip_prefix(' ')?
                .trim()
                .parse()
                .ok()
        })
        .unwrap_or_else(|| panic!("{series} not in {body}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_that_never_call_are_closed_and_cannot_keep_any_credential_out() {
    const GOAWAY: u8 = 0x7;
    let s = Setup::start_with(&[
        "--grpc-max-connections",
        "16",
        "--grpc-max-connections-per-address",
        "8",
        "--grpc-handshake-timeout",
        "3s",
        "--grpc-idle-timeout",
        "6s",
    ])
    .await;
    let (port, ca) = (s.server.port, s.ca.ca());
    // Silent after the TLS handshake: closed when the handshake time is up.
    let silent = raw_tls(port, &ca, "127.0.0.2", false).await.unwrap();
    let asked = tokio::time::Instant::now();
    assert!(frames_until_closed(silent, Vec::new()).await.is_empty());
    eprintln!(
        "a connection silent after its TLS handshake was closed after {:?}",
        asked.elapsed()
    );
    // One address holds at most 8; two more hold 6: the 14 places of connections
    // that have not authenticated (the other two are kept for those that have).
    let mut idlers = Vec::new();
    let mut from_first = 0;
    for (from, n) in [("127.0.0.2", 10), ("127.0.0.3", 6)] {
        for _ in 0..n {
            if let Ok(c) = raw_tls(port, &ca, from, true).await {
                idlers.push(c);
                from_first += usize::from(from == "127.0.0.2");
            }
        }
    }
    assert!(from_first <= 8, "the address cap holds: {from_first}");
    // The two past the address cap were closed at once.
    let mut held = Vec::new();
    for c in idlers {
        use tokio::io::AsyncReadExt as _;
        let mut c = c;
        let mut first = vec![0u8; 9];
        if let Ok(Ok(_)) = tokio::time::timeout(PATIENCE, c.read_exact(&mut first)).await {
            held.push((c, first));
        }
    }
    assert!((12..=14).contains(&held.len()), "{}", held.len());
    let refused_address = counter(
        &s,
        "fleetscope_grpc_connections_refused_total{reason=\"address_cap\"}",
    )
    .await;
    assert!(
        refused_address >= 2,
        "the address cap refused {refused_address}"
    );
    // Well within the handshake time of every one of them, a caller with a bearer
    // token gets in, several times over: the oldest connection that never made an
    // authenticated call gives its place to each newcomer.
    let mut bobs = Vec::new();
    for _ in 0..4 {
        let mut bob = s.client(Who::Token("bob")).await.unwrap_or_else(|e| {
            panic!(
                "{e}: {}",
                std::fs::read_to_string(&s.log).unwrap_or_default()
            )
        });
        bob.list_clusters(proto::ListClustersRequest::default())
            .await
            .expect("a token holder is served while connections that never call fill the places");
        bobs.push(bob);
    }
    let mut alice = s.client(Who::Cert("alice")).await.unwrap();
    alice
        .list_clusters(proto::ListClustersRequest::default())
        .await
        .unwrap();
    // A Watch keeps its connection: idle is a connection without a call.
    let mut w = watching(&mut alice).await;
    // Every connection that never called is closed with a GOAWAY: for a newcomer, or
    // once its handshake time is up with no authenticated call.
    let since = tokio::time::Instant::now();
    for (c, read) in held {
        let frames = frames_until_closed(c, read).await;
        assert!(frames.contains(&GOAWAY), "a GOAWAY first: {frames:?}");
    }
    eprintln!(
        "connections that never called were closed with a GOAWAY within {:?}",
        since.elapsed()
    );
    assert!(
        counter(
            &s,
            "fleetscope_grpc_connections_closed_unauthenticated_total"
        )
        .await
            >= 12
    );
    // The token holders' connections, authenticated, were closed only once idle.
    common::eventually("idle connections are closed", async || {
        counter(&s, "fleetscope_grpc_connections_closed_idle_total").await >= 4
    })
    .await;
    // The Watch opened before goes on.
    let mut bookmarks = Vec::new();
    s.create_configmap("sim-1", "team-0", "after-idle").await;
    loop {
        let (_, name, _) = next_object(&mut w, &mut bookmarks).await;
        if name.ends_with("after-idle") {
            break;
        }
    }
}

/// A channel to the server over TLS, presenting no certificate.
async fn tls_channel(s: &Setup) -> tonic::transport::Channel {
    tonic::transport::Channel::from_shared(format!("https://127.0.0.1:{}", s.server.port))
        .unwrap()
        .tls_config(tonic::transport::ClientTlsConfig::new().ca_certificate(
            tonic::transport::Certificate::from_pem(std::fs::read(s.ca.ca()).unwrap()),
        ))
        .unwrap()
        .connect()
        .await
        .unwrap()
}

/// A request carrying the identity a router passes: `x-remote-user` and each of the
/// groups in `x-remote-group`.
/// A request carrying `user` as a router passes its caller (the router's own code).
fn passing<T>(message: T, user: Option<(&str, &[&str])>) -> tonic::Request<T> {
    let mut r = tonic::Request::new(message);
    if let Some((user, groups)) = user {
        let subject = fleetscope_model::access::Subject {
            user: user.into(),
            groups: groups.iter().map(|g| g.to_string()).collect(),
        };
        fleetscope::auth::pass_identity(r.metadata_mut(), &subject);
    }
    r
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_router_passes_its_caller_s_identity_and_nobody_else_is_served() {
    let s = Setup::start_unready(&["--router-name", "fleetscope-router"]).await;
    s.ca.client("router", "fleetscope-router", "routers");
    let router = || s.client(Who::Cert("router"));
    let bob = Some(("bob", &[][..]));
    s.until_ready(async || {
        let mut r = router().await.ok()?;
        r.list_clusters(passing(proto::ListClustersRequest::default(), bob))
            .await
            .ok()
            .map(tonic::Response::into_inner)
    })
    .await;
    let count = async |user: Option<(&str, &[&str])>| {
        let mut r = router().await.unwrap();
        r.count(passing(
            proto::CountRequest {
                query: Some(configmaps(&[])),
                ..Default::default()
            },
            user,
        ))
        .await
    };
    // Each passed identity is held to its own grants: bob reads every configmap,
    // team-a only team-0's of sim-1, carol and the router itself nothing.
    let everything = common::truth(&s._fleet, "configmaps").len();
    assert_eq!(
        count(bob).await.unwrap().into_inner().total as usize,
        everything
    );
    let team_a = count(Some(("dave", &["team-a"][..])))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        team_a.total as usize,
        s.truth("sim-1", "team-0").await.len()
    );
    // Any identity passes whole: a name a text header cannot carry goes in its -bin
    // twin, and is held to its own grants.
    let jose = count(Some(("josé", &["team-a", "équipe-b"][..])))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(jose.total, team_a.total);
    assert_eq!(
        code(count(Some(("josé", &["équipe-b"][..]))).await),
        tonic::Code::NotFound
    );
    for nobody in [Some(("carol", &[][..])), None] {
        assert_eq!(code(count(nobody).await), tonic::Code::NotFound);
    }
    // A Secret's value reaches a passed identity without secretData by no group key
    // or selector either: the replica sees the object as that caller is shown it.
    kube::Api::<Secret>::namespaced(common::kube_client(&s.kubeconfig, "sim-1").await, "team-0")
        .create(&Default::default(), &applied_secret("routed"))
        .await
        .unwrap();
    let by_value = async |user: Option<(&str, &[&str])>, fields: &str| {
        let mut r = router().await.unwrap();
        r.count(passing(
            proto::CountRequest {
                query: Some(proto::Query {
                    resource: "secrets".into(),
                    clusters: vec!["sim-1".into()],
                    namespaces: vec!["team-0".into()],
                    field_selector: fields.into(),
                    ..Default::default()
                }),
                group_by: vec!["field:data.password".into()],
            },
            user,
        ))
        .await
        .unwrap()
        .into_inner()
    };
    common::eventually("the Secret arrives", async || {
        by_value(bob, "").await.total > 0
    })
    .await;
    let selected = r"data.password=aHVudGVyMg\=\=";
    let dave = Some(("dave", &["team-a"][..]));
    let hidden = by_value(dave, "").await;
    assert!(
        hidden.groups.iter().all(|g| g.key == [""]),
        "{:?}",
        hidden.groups
    );
    assert_eq!(by_value(dave, selected).await.total, 0);
    let shown = by_value(bob, selected).await;
    assert_eq!(shown.total, 1);
    assert_eq!(shown.groups[0].key, ["aHVudGVyMg=="]);

    // A caller that is not a router is refused, whatever it presents; identity
    // headers from it are refused as unauthenticated.
    let mut bob_direct = s.client(Who::Token("bob")).await.unwrap();
    let refused = count_configmaps(&mut bob_direct).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::PermissionDenied);
    assert!(
        refused.message().contains("router"),
        "{}",
        refused.message()
    );
    let mut alice = s.client(Who::Cert("alice")).await.unwrap();
    let forged = alice
        .count(passing(
            proto::CountRequest {
                query: Some(configmaps(&[])),
                ..Default::default()
            },
            bob,
        ))
        .await
        .unwrap_err();
    assert_eq!(forged.code(), tonic::Code::Unauthenticated);
    assert!(
        forged.message().contains("x-remote-user"),
        "{}",
        forged.message()
    );
    // Health checks stay open to anyone.
    let channel = tls_channel(&s).await;
    tonic_health::pb::health_client::HealthClient::new(channel)
        .check(tonic_health::pb::HealthCheckRequest::default())
        .await
        .expect("health is open");
}

/// A kube-rs client of the fleet's Kubernetes API at `api` as `who`, from the
/// kubeconfig `fleetscope kubeconfig` writes with that identity's own files.
async fn kube_api_client(s: &Setup, who: &Who, api: &str) -> kube::Client {
    let arg = s.server_arg(who);
    let p = |p: &Option<PathBuf>| p.as_ref().map(|p| p.display().to_string());
    let mut args = vec![
        "kubeconfig".to_string(),
        "--server".into(),
        arg.server.clone(),
    ];
    for (flag, value) in [
        ("--ca", p(&arg.ca)),
        ("--cert", p(&arg.cert)),
        ("--key", p(&arg.key)),
        ("--token-file", p(&arg.token_file)),
    ] {
        if let Some(v) = value {
            args.extend([flag.to_string(), v]);
        }
    }
    args.extend(["--kube-api".to_string(), format!("https://{api}")]);
    let out = tokio::process::Command::new(BIN)
        .args(&args)
        .output()
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let kubeconfig: kube::config::Kubeconfig = serde_json::from_slice(&out.stdout).unwrap();
    let options = kube::config::KubeConfigOptions {
        context: Some("fleet".into()),
        ..Default::default()
    };
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &options)
        .await
        .unwrap();
    kube::Client::try_from(config).unwrap()
}

/// The API's refusal of `r`: its HTTP code.
fn api_code<T: std::fmt::Debug>(r: Result<T, kube::Error>) -> u16 {
    match r {
        Err(kube::Error::Api(s)) => s.code,
        other => panic!("not an API refusal: {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_kubernetes_api_holds_each_identity_to_its_grant_in_lists_watches_and_discovery() {
    use futures::StreamExt as _;
    use kube::api::{ListParams, WatchEvent, WatchParams};
    let kube_port = free_port();
    let api = format!("127.0.0.1:{kube_port}");
    let mut s = Setup::start_with(&["--kube-api-listen", &api]).await;
    // kube-rs sends a token file's bytes as they are: written without a newline.
    std::fs::write(s.path("bob.token"), "bob-token").unwrap();
    let alice = kube_api_client(&s, &Who::Cert("alice"), &api).await;
    let bob = kube_api_client(&s, &Who::Token("bob"), &api).await;
    let carol = kube_api_client(&s, &Who::Token("carol"), &api).await;
    let configmaps = |c: &kube::Client| kube::Api::<ConfigMap>::all(c.clone());
    let names = |l: Vec<ConfigMap>| -> Vec<String> {
        let mut n: Vec<String> = l.into_iter().filter_map(|c| c.metadata.name).collect();
        n.sort();
        n
    };
    let team0: Vec<String> = s
        .truth("sim-1", "team-0")
        .await
        .into_iter()
        .map(|n| format!("sim-1:{n}"))
        .collect();
    assert!(!team0.is_empty());

    // Lists: alice (team-a, by certificate) sees sim-1's team-0 and nothing else, in
    // pages too; bob sees both clusters; carol, granted nothing, is told no such type.
    let listed = configmaps(&alice)
        .list(&ListParams::default())
        .await
        .unwrap();
    assert_eq!(names(listed.items), team0);
    let mut paged = Vec::new();
    let mut params = ListParams::default().limit(3);
    loop {
        let page = configmaps(&alice).list(&params).await.unwrap();
        paged.extend(page.items);
        match page.metadata.continue_ {
            Some(c) if !c.is_empty() => params = params.continue_token(&c),
            _ => break,
        }
    }
    assert_eq!(names(paged), team0);
    let all = configmaps(&bob).list(&ListParams::default()).await.unwrap();
    assert!(all.items.len() > team0.len());
    assert!(all.items.iter().any(|c| {
        c.metadata
            .name
            .as_deref()
            .is_some_and(|n| n.starts_with("sim-2:"))
    }));
    assert_eq!(
        api_code(configmaps(&carol).list(&ListParams::default()).await),
        404
    );
    // A type outside the grant, another cluster's path: not there for alice.
    let namespaces = kube::Api::<k8s_openapi::api::core::v1::Namespace>::all(alice.clone());
    assert_eq!(api_code(namespaces.list(&ListParams::default()).await), 404);
    let ca = s.ca.ca();
    let token = std::fs::read_to_string(s.path("alice.token")).unwrap();
    for (path, code) in [
        ("/clusters/sim-2/api/v1/configmaps", 404),
        ("/clusters/sim-1/api/v1/namespaces/team-1/configmaps", 200),
        ("/clusters/*/api/v1/configmaps", 200),
    ] {
        let (got, body) = https_fetch(kube_port, &ca, path, Some(&token)).await;
        assert_eq!(got, code, "{path}: {body}");
        if path.contains("team-1") {
            let list: serde_json::Value = serde_json::from_str(&body).unwrap();
            assert_eq!(list["items"], serde_json::json!([]), "{path}: {body}");
        }
    }
    // Discovery: only what the grant reaches.
    let (_, body) = https_fetch(kube_port, &ca, "/clusters/*/api/v1", Some(&token)).await;
    let served: serde_json::Value = serde_json::from_str(&body).unwrap();
    let mut kinds: Vec<&str> = served["resources"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|r| r["name"].as_str())
        .collect();
    kinds.sort();
    assert_eq!(kinds, ["configmaps", "pods", "secrets"], "{body}");
    // No credential, a wrong one: 401, as an API server says it.
    for token in [None, Some("guess")] {
        let (code, body) =
            https_fetch(kube_port, &ca, "/clusters/*/api/v1/configmaps", token).await;
        let status: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(
            (code, &status["reason"]),
            (401, &serde_json::json!("Unauthorized")),
            "{body}"
        );
    }
    // Secrets: redacted for alice, whole for bob (granted their values).
    let kube = common::kube_client(&s.kubeconfig, "sim-1").await;
    kube::Api::<Secret>::namespaced(kube, "team-0")
        .create(
            &Default::default(),
            &serde_json::from_value(serde_json::json!({
                "metadata": {"name": "db"}, "data": {"password": "aHVudGVyMg=="}
            }))
            .unwrap(),
        )
        .await
        .unwrap();
    let secret = async |c: &kube::Client| -> Secret {
        let secrets = kube::Api::<Secret>::namespaced(c.clone(), "team-0");
        common::eventually("the Secret arrives", async || {
            secrets.get_opt("sim-1:db").await.unwrap().ok_or("not yet")
        })
        .await
    };
    let redacted = secret(&alice).await;
    let password = |s: &Secret| {
        s.data
            .as_ref()
            .and_then(|d| d.get("password"))
            .map(|v| v.0.clone())
    };
    assert_eq!(password(&redacted), Some(Vec::new()));
    assert_eq!(
        redacted.metadata.annotations.as_ref().unwrap()["fleetscope.io/redacted"],
        "data"
    );
    assert_eq!(password(&secret(&bob).await), Some(b"hunter2".to_vec()));

    // A watch from the list's resourceVersion: only what the grant reaches.
    let listed = configmaps(&alice)
        .list(&ListParams::default())
        .await
        .unwrap();
    let from = listed.metadata.resource_version.unwrap();
    let mut w = configmaps(&alice)
        .watch(&WatchParams::default(), &from)
        .await
        .unwrap()
        .boxed();
    let mut next = async || -> (&'static str, String) {
        let e = tokio::time::timeout(PATIENCE, w.next())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        match e {
            WatchEvent::Added(c) => ("ADDED", c.metadata.name.unwrap()),
            WatchEvent::Modified(c) => ("MODIFIED", c.metadata.name.unwrap()),
            WatchEvent::Deleted(c) => ("DELETED", c.metadata.name.unwrap()),
            other => panic!("{other:?}"),
        }
    };
    s.create_configmap("sim-1", "team-1", "outside").await;
    s.create_configmap("sim-2", "team-0", "outside").await;
    s.create_configmap("sim-1", "team-0", "inside").await;
    assert_eq!(next().await, ("ADDED", "sim-1:inside".to_string()));
    // The policy now grants team-1 instead: what leaves is DELETED, what enters ADDED,
    // on the running watch; then the new grant decides.
    let team1 = s.truth("sim-1", "team-1").await;
    replace(&s.path("policy.yaml"), &policy("team-1"));
    let mut expected: Vec<(&str, String)> = team0
        .iter()
        .cloned()
        .chain(["sim-1:inside".to_string()])
        .map(|n| ("DELETED", n))
        .chain(team1.iter().map(|n| ("ADDED", format!("sim-1:{n}"))))
        .collect();
    expected.sort_by(|a, b| a.1.cmp(&b.1));
    let mut got = Vec::new();
    for _ in 0..expected.len() {
        got.push(next().await);
    }
    got.sort_by(|a, b| a.1.cmp(&b.1));
    assert_eq!(got, expected);
    s.create_configmap("sim-1", "team-0", "gone-now").await;
    s.create_configmap("sim-1", "team-1", "granted-now").await;
    assert_eq!(next().await, ("ADDED", "sim-1:granted-now".to_string()));
    s.server.assert_running(&s.log);
}
