//! The `fleetscope get | count | watch | clusters` commands: a gRPC client with
//! kubectl-like output.

// clap turns doc comments into help text: the flag structs are documented by `--help`.
#[allow(missing_docs)]
pub mod args;
pub mod columns;
mod describe;
pub mod jsonpath;
pub mod output;

use std::fmt::Write as _;
use std::io::Write as _;
use std::time::{Duration, SystemTime};

pub use describe::describe;
use output::{Format, Item, Table};
use tokio_stream::StreamExt;
use tonic::service::Interceptor;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;

use crate::proto::fleet_client::FleetClient;
use crate::proto::{
    self, CountRequest, GetStoreRequest, ListClustersRequest, ListRequest, Query, WatchRequest,
};

/// A failure of a client command.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The server could not be reached.
    #[error(
        "cannot reach the fleetscope server at {server}{}",
        connect_hint(server, source)
    )]
    Connect {
        /// The address.
        server: String,
        /// Why.
        #[source]
        source: tonic::transport::Error,
    },
    /// The server refused the request.
    #[error("{:?}: {}{}", .0.code(), .0.message(), rpc_hint(.0))]
    Rpc(Box<tonic::Status>),
    /// A failure worded for a person, as kubectl words it.
    #[error("{0}")]
    Message(String),
}

/// Every cause of `e`, on one line.
fn causes(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        text.push_str(": ");
        text.push_str(&c.to_string());
        cause = c.source();
    }
    text
}

/// What to try when a connection to `server` failed as `e` says.
fn connect_hint(server: &str, e: &tonic::transport::Error) -> String {
    let why = causes(e);
    let tls = server.starts_with("https://");
    let hint = if why.contains("Connection refused") {
        "nothing listens there: is `fleetscope serve` (or `demo`) running at that address? (--server, FLEETSCOPE_SERVER)"
    } else if tls && (why.contains("InvalidContentType") || why.contains("corrupt message")) {
        "the server does not speak TLS there: try http://"
    } else if why.contains("UnknownIssuer") || why.contains("invalid peer certificate") {
        "the server's certificate is not signed by a CA this client trusts: pass the CA that signed it with --ca"
    } else if why.contains("NoApplicationProtocol") {
        "the server there does not speak HTTP/2 (gRPC): is it fleetscope's gRPC address, not another service's?"
    } else if why.contains("NotValidForName") {
        "the server's certificate does not name that host: connect by a name it holds, or set --tls-server-name"
    } else if why.contains("UnknownCA")
        || why.contains("BadCertificate")
        || why.contains("CertificateRequired")
    {
        "the server refused the client certificate: use one signed by the server's client CA (--cert, --key)"
    } else {
        return String::new();
    };
    format!(" ({hint})")
}

/// What to try after a call failed as `s` says, when the connection, not the server,
/// failed: a plaintext client reaching a TLS server, or a TLS client whose certificate
/// the server refused mid-handshake, sees only a transport error.
fn rpc_hint(s: &tonic::Status) -> &'static str {
    use tonic::Code;
    let m = s.message();
    // How tonic words a connection that broke under a call, with one of these codes.
    let transport = matches!(
        s.code(),
        Code::Unknown | Code::Internal | Code::Cancelled | Code::Unavailable
    ) && [
        "transport error",
        "h2 protocol error",
        "operation was canceled",
    ]
    .iter()
    .any(|w| m.contains(w));
    if transport {
        " (the connection failed: if the server serves TLS, use https:// with --ca; if it asks for a client certificate, pass one signed by its client CA with --cert and --key)"
    } else {
        ""
    }
}

impl From<tonic::Status> for ClientError {
    fn from(s: tonic::Status) -> Self {
        ClientError::Rpc(Box::new(s))
    }
}

/// A client of the Fleet service, sending the caller's credentials with every call.
pub type Client = FleetClient<InterceptedService<Channel, Credentials>>;

/// A bearer token to send, if any.
#[derive(Clone, Default)]
pub struct Credentials(Option<tonic::metadata::MetadataValue<tonic::metadata::Ascii>>);

impl Interceptor for Credentials {
    fn call(
        &mut self,
        mut request: tonic::Request<()>,
    ) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(token) = &self.0 {
            request
                .metadata_mut()
                .insert("authorization", token.clone());
        }
        Ok(request)
    }
}

/// The URL of a server: as given when it has a scheme; `host:port` is `https://` when
/// `tls` (a TLS flag was given), else `http://`, the way grpcurl takes it.
pub fn server_url(server: &str, tls: bool) -> String {
    if server.contains("://") {
        server.to_string()
    } else if tls {
        format!("https://{server}")
    } else {
        format!("http://{server}")
    }
}

fn message(m: String) -> ClientError {
    ClientError::Message(m)
}

fn read(path: &std::path::Path, what: &str) -> Result<Vec<u8>, ClientError> {
    fleetscope_model::file::read_capped(path)
        .map_err(|e| message(format!("reading the {what} {}: {e}", path.display())))
}

/// Whether a URL's host is this host.
fn is_local(uri: &http::Uri) -> bool {
    match uri.host() {
        Some("localhost") => true,
        Some(h) => h
            .trim_start_matches('[')
            .trim_end_matches(']')
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback()),
        None => false,
    }
}

/// Connects to a server as `server` says: TLS for `https://` (verified with `--ca`, or
/// the public roots; with `--cert`/`--key` for mutual TLS), plaintext for `http://`,
/// never one for the other; a bearer token from `--token-file` only over TLS or to
/// this host.
pub async fn connect(server: &args::ServerArg) -> Result<Client, ClientError> {
    let tls_asked =
        server.ca.is_some() || server.cert.is_some() || server.tls_server_name.is_some();
    let url = server_url(&server.server, tls_asked);
    let uri: http::Uri = url
        .parse()
        .map_err(|_| message(format!("--server {url:?} is not a URL")))?;
    let tls = match uri.scheme_str() {
        Some("https") => true,
        Some("http") => false,
        _ => {
            return Err(message(format!(
                "--server {url:?}: expected https:// or http://"
            )));
        }
    };
    if !tls && tls_asked {
        return Err(message(format!(
            "--server {url} is plaintext (http://) but TLS flags were given: use https://"
        )));
    }
    let token = match &server.token_file {
        None => None,
        Some(path) => {
            let raw = read(path, "token file")?;
            let token = String::from_utf8(raw)
                .map_err(|_| message(format!("the token file {} is not text", path.display())))?;
            let token = token.trim();
            if token.is_empty() {
                return Err(message(format!(
                    "the token file {} is empty",
                    path.display()
                )));
            }
            if !tls && !is_local(&uri) {
                return Err(message(format!(
                    "a bearer token is sent only over TLS or to this host: use https:// for {url}"
                )));
            }
            Some(format!("Bearer {token}").parse().map_err(|_| {
                message(format!(
                    "the token in {} is not printable ASCII",
                    path.display()
                ))
            })?)
        }
    };
    let mut endpoint = Channel::from_shared(url.clone())
        .map_err(|_| message(format!("--server {url:?} is not a URL")))?;
    if tls {
        let mut config = tonic::transport::ClientTlsConfig::new();
        config = match &server.ca {
            Some(ca) => config.ca_certificate(tonic::transport::Certificate::from_pem(read(
                ca, "CA file",
            )?)),
            None => config.with_webpki_roots(),
        };
        if let (Some(cert), Some(key)) = (&server.cert, &server.key) {
            config = config.identity(tonic::transport::Identity::from_pem(
                read(cert, "client certificate")?,
                read(key, "client key")?,
            ));
        }
        if let Some(name) = &server.tls_server_name {
            config = config.domain_name(name.clone());
        }
        endpoint = endpoint
            .tls_config(config)
            .map_err(|source| ClientError::Connect {
                server: url.clone(),
                source,
            })?;
    }
    let channel = endpoint
        .connect()
        .await
        .map_err(|source| ClientError::Connect {
            server: url.clone(),
            source,
        })?;
    Ok(FleetClient::with_interceptor(channel, Credentials(token))
        .max_decoding_message_size(256 * 1024 * 1024))
}

fn print(text: &str) {
    let _ = std::io::stdout().write_all(text.as_bytes());
}

fn println_flush(text: &str) {
    let mut out = std::io::stdout().lock();
    let _ = out.write_all(text.as_bytes());
    let _ = out.flush();
}

/// Every object a list gave.
struct Listed {
    items: Vec<Item>,
}

/// Every page of a query (up to `limit` objects), warning on stderr about clusters
/// that are not synced.
async fn list_all(
    client: &mut Client,
    query: &Query,
    limit: Option<u64>,
) -> Result<Listed, ClientError> {
    let mut items = Vec::new();
    let mut token = String::new();
    let mut first = true;
    loop {
        let want = limit.map_or(500, |l| l.saturating_sub(items.len() as u64).min(500));
        if want == 0 {
            break;
        }
        let page = client
            .list(ListRequest {
                query: Some(query.clone()),
                limit: u32::try_from(want).unwrap_or(500),
                page_token: token,
                keep_snapshot: false,
            })
            .await
            .map_err(|s| resource_error(&query.resource, s))?
            .into_inner();
        if first {
            first = false;
            warn_not_current(&page.clusters);
        }
        items.extend(page.items.iter().map(Item::from_proto));
        if page.next_page_token.is_empty() {
            break;
        }
        token = page.next_page_token;
    }
    Ok(Listed { items })
}

/// A refusal naming the resource type, as kubectl words an unknown one.
fn resource_error(resource: &str, s: tonic::Status) -> ClientError {
    if s.code() == tonic::Code::NotFound {
        ClientError::Message(format!(
            "the server doesn't have a resource type {resource:?}: {}",
            s.message()
        ))
    } else {
        ClientError::from(s)
    }
}

/// The columns of the items' type: built in, the CRD's printer columns when the CRD
/// is collected, else NAME and AGE.
async fn columns_of(client: &mut Client, items: &[Item]) -> Vec<columns::Column> {
    let Some(first) = items.first() else {
        return Vec::new();
    };
    if let Some(builtin) = columns::builtin(&first.resource) {
        return builtin;
    }
    let version = first.object["apiVersion"]
        .as_str()
        .and_then(|v| v.rsplit('/').next())
        .unwrap_or_default()
        .to_string();
    let crd = client
        .list(ListRequest {
            query: Some(Query {
                resource: "customresourcedefinitions.apiextensions.k8s.io".into(),
                clusters: vec![first.cluster.clone()],
                field_selector: format!("metadata.name={}", first.resource),
                ..Default::default()
            }),
            limit: 1,
            page_token: String::new(),
            keep_snapshot: false,
        })
        .await
        .ok()
        .and_then(|r| r.into_inner().items.into_iter().next())
        .and_then(|o| serde_json::from_str::<serde_json::Value>(&o.json).ok());
    output::columns_for(&first.resource, crd.as_ref().map(|c| (c, version.as_str())))
}

/// The table for `items` under the print flags.
async fn table_for(
    client: &mut Client,
    items: &[Item],
    print: &args::PrintArgs,
    one_namespace: bool,
    event: bool,
) -> Table {
    let custom = match &print.output {
        Format::CustomColumns(c) => Some(c.clone()),
        _ => None,
    };
    Table {
        columns: if custom.is_some() {
            Vec::new()
        } else {
            columns_of(client, items).await
        },
        custom,
        wide: print.output == Format::Wide,
        namespace: !one_namespace && items.iter().any(|i| !i.namespace.is_empty()),
        show_labels: print.show_labels,
        label_columns: print.label_columns.clone(),
        event,
        typed_names: false,
    }
}

/// Prints items in a non-table format: one object alone when `single`, else a List.
fn print_items(items: &[Item], format: &Format, single: bool) {
    match format {
        Format::Name => {
            let names: String = items.iter().map(|i| i.qualified_name() + "\n").collect();
            print(&names);
        }
        Format::Json | Format::Yaml | Format::JsonPath(_) => {
            let value = if single && items.len() == 1 {
                items[0].annotated()
            } else {
                output::list(items)
            };
            match format {
                Format::Json => print(&output::to_json(&value)),
                Format::Yaml => print(&output::to_yaml(&value)),
                Format::JsonPath(t) => print(&t.render(&value)),
                _ => {}
            }
        }
        _ => {}
    }
}

/// What `get` and `describe` name, as kubectl reads it: `TYPE[,TYPE...] [NAME...]`
/// or `TYPE/NAME...`; each type with the name asked of it (none: every object).
fn targets(resource: &str, names: &[String]) -> Result<Vec<Target>, ClientError> {
    let slashed = |s: &str| s.contains('/') && s.matches('/').count() == 1;
    if slashed(resource) {
        let mut out = Vec::new();
        for arg in std::iter::once(resource).chain(names.iter().map(String::as_str)) {
            match arg.split_once('/') {
                Some((kind, name))
                    if !kind.is_empty() && !name.is_empty() && !kind.contains(',') =>
                {
                    out.push(Target {
                        resource: kind.to_string(),
                        name: Some(name.to_string()),
                    });
                }
                _ => {
                    return Err(ClientError::Message(format!(
                        "error: arguments in resource/name form must have a single resource and name: {arg:?}"
                    )));
                }
            }
        }
        return Ok(out);
    }
    if names.iter().any(|n| n.contains('/')) {
        return Err(ClientError::Message(
            "error: there is no need to specify a resource type as a separate argument when passing arguments in resource/name form (e.g. 'fleetscope get pod/web' instead of 'fleetscope get pod pod/web')".into(),
        ));
    }
    let mut out = Vec::new();
    for kind in resource.split(',') {
        if kind.is_empty() {
            return Err(ClientError::Message(format!(
                "error: {resource:?} names an empty resource type: give TYPE[,TYPE...]"
            )));
        }
        if names.is_empty() {
            out.push(Target {
                resource: kind.to_string(),
                name: None,
            });
        }
        for name in names {
            out.push(Target {
                resource: kind.to_string(),
                name: Some(name.clone()),
            });
        }
    }
    Ok(out)
}

/// One type, and one name of it or every object.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Target {
    resource: String,
    name: Option<String>,
}

impl Target {
    /// The query: the command's, for this type and name.
    fn query(&self, q: &args::QueryArgs) -> Query {
        let mut query = q.query();
        query.resource = self.resource.clone();
        if let Some(name) = &self.name {
            let by_name = format!("metadata.name={name}");
            query.field_selector = if query.field_selector.is_empty() {
                by_name
            } else {
                format!("{},{by_name}", query.field_selector)
            };
        }
        query
    }

    /// kubectl's refusal of a name nothing holds.
    fn not_found(&self, q: &args::QueryArgs) -> Option<String> {
        self.name.as_ref().map(|name| {
            format!(
                "Error from server (NotFound): {} {name:?} not found{}",
                self.resource,
                where_looked(q)
            )
        })
    }
}

/// kubectl's habit for a context that does not exist: `--cluster NAME` that no cluster
/// of the fleet (as the caller may see it) is named is an error; a glob that matches
/// none, a warning.
pub(crate) async fn check_clusters(
    client: &mut Client,
    q: &args::QueryArgs,
) -> Result<(), ClientError> {
    if q.clusters.is_empty() {
        return Ok(());
    }
    let known: Vec<fleetscope_model::ClusterName> = client
        .list_clusters(ListClustersRequest::default())
        .await?
        .into_inner()
        .clusters
        .into_iter()
        .map(|c| fleetscope_model::ClusterName::from(c.name))
        .collect();
    let mut unknown = Vec::new();
    for pattern in &q.clusters {
        let filter = fleetscope_model::ClusterFilter::parse(std::slice::from_ref(pattern), "")
            .map_err(|e| message(format!("--cluster: {e}")))?;
        for warning in filter.unmatched(known.iter()) {
            if pattern.contains(['*', '?', '[']) {
                eprintln!("Warning: {warning}");
            } else {
                unknown.push(format!("{pattern:?}"));
            }
        }
    }
    if unknown.is_empty() {
        return Ok(());
    }
    let names: Vec<&str> = known.iter().map(|c| c.as_str()).collect();
    Err(message(format!(
        "error: no cluster named {} in the fleet (clusters: {})",
        unknown.join(", "),
        if names.is_empty() {
            "none".to_string()
        } else {
            names.join(", ")
        }
    )))
}

/// `get`: a list (every page), or objects by name across the selected clusters and
/// namespaces; then, with `-w`, changes as they arrive. Several types (or TYPE/NAME
/// arguments) print a table per type, each name prefixed with its type.
pub async fn get(client: &mut Client, args: args::GetArgs) -> Result<(), ClientError> {
    check_clusters(client, &args.query).await?;
    let targets = targets(&args.query.resource, &args.names)?;
    let sort_by = args
        .sort_by
        .as_deref()
        .map(jsonpath::Template::parse)
        .transpose()
        .map_err(|e| ClientError::Message(format!("--sort-by: {e}")))?;
    if let [target] = &targets[..] {
        return get_one(client, &args, target, sort_by.as_ref()).await;
    }
    if args.watch {
        return Err(ClientError::Message(format!(
            "error: watch is only supported on individual resources and resource collections, but {} resources were found",
            targets.len()
        )));
    }
    // Items by type, in the order the types were named.
    let mut groups: Vec<(String, Vec<Item>)> = Vec::new();
    let mut missing = Vec::new();
    for target in &targets {
        let Listed { items, .. } = list_all(client, &target.query(&args.query), args.limit).await?;
        if items.is_empty()
            && let Some(m) = target.not_found(&args.query)
        {
            missing.push(m);
        }
        match groups.iter_mut().find(|(r, _)| *r == target.resource) {
            Some((_, held)) => held.extend(items),
            None => groups.push((target.resource.clone(), items)),
        }
    }
    for (_, items) in &mut groups {
        if let Some(by) = &sort_by {
            output::sort(items, by);
        }
    }
    groups.retain(|(_, items)| !items.is_empty());
    if groups.is_empty() && missing.is_empty() {
        eprintln!("No resources found{}.", where_looked(&args.query));
        return Ok(());
    }
    let format = &args.print.output;
    if format.is_table() {
        let one_namespace = args.query.namespaces.len() == 1;
        let now = SystemTime::now();
        for (i, (_, items)) in groups.iter().enumerate() {
            let mut table = table_for(client, items, &args.print, one_namespace, false).await;
            table.typed_names = true;
            let rows: Vec<Vec<String>> = items.iter().map(|i| table.row(i, now, None)).collect();
            let header = table.header();
            if i > 0 {
                print("\n");
            }
            print(&output::align(
                (!args.print.no_headers).then_some(&header[..]),
                &rows,
            ));
        }
    } else {
        let all: Vec<Item> = groups.into_iter().flat_map(|(_, items)| items).collect();
        if !all.is_empty() || missing.is_empty() {
            print_items(&all, format, false);
        }
    }
    if !missing.is_empty() {
        return Err(ClientError::Message(missing.join("\n")));
    }
    Ok(())
}

/// `get` of one type (and one name, or all).
async fn get_one(
    client: &mut Client,
    args: &args::GetArgs,
    target: &Target,
    sort_by: Option<&jsonpath::Template>,
) -> Result<(), ClientError> {
    let query = target.query(&args.query);
    // With --watch, the initial objects come on the Watch itself (a router resumes a
    // Watch by positions, never from a List's revision); without, a paged List.
    let (mut items, mut follower) = if args.watch {
        let mut follower = Follower::new(client.clone(), query.clone(), 0, true);
        let items = follower.initial_objects().await?;
        (items, Some(follower))
    } else {
        (list_all(client, &query, args.limit).await?.items, None)
    };
    if let Some(by) = sort_by {
        output::sort(&mut items, by);
    }
    let resource = &target.resource;
    if let Some(name) = &target.name {
        if items.is_empty() {
            return Err(ClientError::Message(
                target.not_found(&args.query).unwrap_or_default(),
            ));
        }
        let places = output::places(&items);
        if items.len() > 1 {
            let listed: Vec<String> = places.keys().cloned().collect();
            eprintln!(
                "{resource} {name:?} is ambiguous: it names {} objects ({}); narrow with --cluster and -n",
                items.len(),
                listed.join(", ")
            );
        }
    } else if items.is_empty() && !args.watch {
        eprintln!("No resources found{}.", where_looked(&args.query));
        return Ok(());
    }
    let one_namespace = args.query.namespaces.len() == 1;
    let format = &args.print.output;
    let table = if format.is_table() {
        let table = table_for(client, &items, &args.print, one_namespace, false).await;
        let now = SystemTime::now();
        let rows: Vec<Vec<String>> = items.iter().map(|i| table.row(i, now, None)).collect();
        let header = table.header();
        print(&output::align(
            (!args.print.no_headers && !items.is_empty()).then_some(&header[..]),
            &rows,
        ));
        Some(table)
    } else {
        print_items(&items, format, target.name.is_some());
        None
    };
    let Some(mut follower) = follower.take() else {
        return Ok(());
    };
    // Changes after the initial objects, each as a row (or an object) of its own.
    let mut table = table.filter(|t| !t.columns.is_empty() || t.custom.is_some());
    loop {
        let event = follower.next().await?;
        let Some(o) = &event.object else { continue };
        let item = Item::from_proto(o);
        match format {
            f if f.is_table() => {
                let t = match table.take() {
                    Some(t) => t,
                    None => {
                        table_for(
                            client,
                            std::slice::from_ref(&item),
                            &args.print,
                            one_namespace,
                            false,
                        )
                        .await
                    }
                };
                println_flush(&output::align(
                    None,
                    &[t.row(&item, SystemTime::now(), None)],
                ));
                table = Some(t);
            }
            other => print_streamed(&item, other),
        }
    }
}

/// One object of a stream (`get -w`, `watch`) in a non-table format, flushed at once:
/// each a document of its own (YAML ones separated by `---`).
fn print_streamed(item: &Item, format: &Format) {
    match format {
        Format::Json => println_flush(&output::to_json(&item.annotated())),
        Format::Yaml => println_flush(&format!("---\n{}", output::to_yaml(&item.annotated()))),
        Format::Name => println_flush(&format!("{}\n", item.qualified_name())),
        Format::JsonPath(t) => println_flush(&t.render(&item.annotated())),
        _ => {}
    }
}

/// " in namespace X" / " in cluster(s) …", for "No resources found" and "not found".
fn where_looked(q: &args::QueryArgs) -> String {
    let mut parts = Vec::new();
    if !q.namespaces.is_empty() {
        parts.push(format!("namespace {}", q.namespaces.join(", ")));
    }
    if !q.clusters.is_empty() {
        parts.push(format!("cluster {}", q.clusters.join(", ")));
    }
    if parts.is_empty() {
        String::new()
    } else {
        format!(" in {}", parts.join(" and "))
    }
}

/// A Watch followed until interrupted. When the stream breaks (the server restarted
/// or went away, or ended this subscriber), it resumes from the last revision seen
/// (through a router: from the last position token and the positions after it),
/// saying so on stderr; a revision the server no longer has ends it with an error.
struct Follower {
    client: Client,
    query: Query,
    since: u64,
    initial: bool,
    stream: Option<tonic::Streaming<proto::WatchEvent>>,
    broken: bool,
    /// Through a router: the last position token, and each cluster's position since.
    token: String,
    after: std::collections::BTreeMap<String, proto::StreamPosition>,
    /// Every object the Watch has shown and not deleted, as last shown: what a list
    /// again is told against, as a reflector replaces its store.
    known: std::collections::BTreeMap<(String, String, String), proto::Object>,
    /// Listing again (the position was no longer held): the objects listed so far.
    relisted: Option<std::collections::BTreeSet<(String, String, String)>>,
    /// Events made by a list again, handed out before the stream's next.
    pending: std::collections::VecDeque<proto::WatchEvent>,
}

/// An object's place in a Watch: cluster, namespace, name.
fn place(o: &proto::Object) -> (String, String, String) {
    (o.cluster.clone(), o.namespace.clone(), o.name.clone())
}

impl Follower {
    fn new(client: Client, query: Query, since: u64, initial: bool) -> Self {
        Self {
            client,
            query,
            since,
            initial,
            stream: None,
            broken: false,
            token: String::new(),
            after: std::collections::BTreeMap::new(),
            known: std::collections::BTreeMap::new(),
            relisted: None,
            pending: std::collections::VecDeque::new(),
        }
    }

    /// The position is no longer held: the Watch starts again with a list, which is
    /// then told against what was shown (see [`Follower::told`]), as a reflector does.
    fn list_again(&mut self, why: &str) {
        eprintln!(
            "fleetscope: revision {} is no longer held ({why}): listing again",
            self.since
        );
        self.since = 0;
        self.token.clear();
        self.after.clear();
        self.stream = None;
        self.relisted = Some(std::collections::BTreeSet::new());
    }

    /// What an event from the server means to the person watching: inside a list
    /// again, an object shown already and unchanged is not shown again, a changed one
    /// is MODIFIED, and at the list's end each object shown before and not listed is
    /// DELETED. `None` for an event not to show.
    fn told(&mut self, mut e: proto::WatchEvent) -> Option<proto::WatchEvent> {
        use proto::EventType as T;
        let kind = e.r#type();
        if let Some(listed) = &mut self.relisted {
            match (kind, &e.object) {
                (T::Added, Some(o)) => {
                    let p = place(o);
                    listed.insert(p.clone());
                    let same = self
                        .known
                        .get(&p)
                        .is_some_and(|k| k.resource_version == o.resource_version);
                    if self.known.contains_key(&p) {
                        e.r#type = T::Modified as i32;
                    }
                    self.known.insert(p, o.clone());
                    return (!same).then_some(e);
                }
                (T::InitialEventsEnd, _) => {
                    let listed = self.relisted.take().unwrap_or_default();
                    let gone: Vec<_> = self
                        .known
                        .keys()
                        .filter(|p| !listed.contains(*p))
                        .cloned()
                        .collect();
                    for p in gone {
                        if let Some(o) = self.known.remove(&p) {
                            self.pending.push_back(proto::WatchEvent {
                                r#type: T::Deleted as i32,
                                object: Some(o),
                                revision: e.revision,
                                ..Default::default()
                            });
                        }
                    }
                    eprintln!("fleetscope: listed again at revision {}", e.revision);
                    return None;
                }
                _ => {}
            }
        }
        if let Some(o) = &e.object {
            match kind {
                T::Deleted => {
                    self.known.remove(&place(o));
                }
                T::Added | T::Modified => {
                    self.known.insert(place(o), o.clone());
                }
                _ => {}
            }
        }
        Some(e)
    }

    /// The objects the Watch starts with (it was made with `initial`), up to the end
    /// of them; changes follow from [`Follower::next`].
    async fn initial_objects(&mut self) -> Result<Vec<Item>, ClientError> {
        let mut items = Vec::new();
        loop {
            let e = self.next().await?;
            match e.r#type() {
                proto::EventType::InitialEventsEnd => return Ok(items),
                proto::EventType::Added => items.extend(e.object.as_ref().map(Item::from_proto)),
                _ => {}
            }
        }
    }

    /// The next event, resuming as often as it takes.
    async fn next(&mut self) -> Result<proto::WatchEvent, ClientError> {
        let mut delay = Duration::from_millis(250);
        loop {
            if let Some(e) = self.pending.pop_front() {
                return Ok(e);
            }
            let Some(stream) = &mut self.stream else {
                let opened = self
                    .client
                    .watch(WatchRequest {
                        query: Some(self.query.clone()),
                        since_revision: if self.token.is_empty() { self.since } else { 0 },
                        send_initial_events: (self.initial || self.relisted.is_some())
                            && self.token.is_empty(),
                        bookmark_interval: None,
                        resume_token: self.token.clone(),
                        resume_positions: self.after.values().cloned().collect(),
                        ..WatchRequest::default()
                    })
                    .await;
                match opened {
                    Ok(s) => {
                        if self.broken {
                            eprintln!("fleetscope: resumed from revision {}", self.since);
                            self.broken = false;
                        }
                        // Initial objects only once: a resumed stream continues after them.
                        self.initial = false;
                        self.stream = Some(s.into_inner());
                        delay = Duration::from_millis(250);
                    }
                    Err(s) if retryable(&s) => {
                        self.broke(s.message());
                        tokio::time::sleep(delay).await;
                        delay = (delay * 2).min(Duration::from_secs(5));
                    }
                    Err(s) if s.code() == tonic::Code::OutOfRange && self.relisted.is_none() => {
                        self.list_again(s.message());
                    }
                    Err(s) => return Err(resource_error(&self.query.resource, s)),
                }
                continue;
            };
            match stream.next().await {
                Some(Ok(e)) => {
                    self.since = self.since.max(e.revision);
                    if !e.position_token.is_empty() {
                        self.token = e.position_token.clone();
                        self.after.clear();
                    } else if let Some(p) = &e.position {
                        self.after.insert(p.cluster.clone(), p.clone());
                    }
                    if let Some(e) = self.told(e) {
                        return Ok(e);
                    }
                }
                Some(Err(s)) if retryable(&s) => {
                    self.stream = None;
                    self.broke(s.message());
                }
                Some(Err(s)) if s.code() == tonic::Code::OutOfRange && self.relisted.is_none() => {
                    self.list_again(s.message());
                }
                Some(Err(s)) => return Err(s.into()),
                None => {
                    self.stream = None;
                    self.broke("the server ended the stream");
                }
            }
        }
    }

    fn broke(&mut self, why: &str) {
        if !self.broken {
            eprintln!(
                "fleetscope: the watch broke ({why}): resuming from revision {}",
                self.since
            );
            self.broken = true;
        }
    }
}

/// A cluster's owners through a router, the assigned one first; `<none>` from a
/// single server (or where no replica serves it).
fn owners_text(owners: &[String]) -> String {
    if owners.is_empty() {
        "<none>".into()
    } else {
        owners.join(",")
    }
}

/// Whether a Watch failure is worth resuming from the last revision.
fn retryable(s: &tonic::Status) -> bool {
    matches!(
        s.code(),
        tonic::Code::Unavailable
            | tonic::Code::Unknown
            | tonic::Code::ResourceExhausted
            | tonic::Code::Cancelled
            | tonic::Code::Internal
            | tonic::Code::DeadlineExceeded
    )
}

/// Says on stderr, as kubectl warns, which clusters an answer drew on are not current.
fn warn_not_current(clusters: &[proto::ClusterFreshness]) {
    for f in clusters
        .iter()
        .filter(|f| f.freshness() != proto::Freshness::Synced)
    {
        eprintln!(
            "warning: cluster {} is {}: {}",
            f.cluster,
            freshness_name(f.freshness()),
            f.message
        );
    }
}

/// `count`: grouped counts.
pub async fn count(client: &mut Client, args: args::CountArgs) -> Result<(), ClientError> {
    check_clusters(client, &args.query).await?;
    let query = args.query.query();
    let r = client
        .count(CountRequest {
            query: Some(query.clone()),
            group_by: args.group_by.clone(),
        })
        .await
        .map_err(|s| resource_error(&query.resource, s))?
        .into_inner();
    // A count over a cluster that failed or is syncing is not the cluster's count.
    warn_not_current(&r.clusters);
    if args.output == "json" {
        let groups: Vec<serde_json::Value> = r
            .groups
            .iter()
            .map(|g| {
                let key: serde_json::Map<String, serde_json::Value> = args
                    .group_by
                    .iter()
                    .cloned()
                    .zip(g.key.iter().cloned().map(serde_json::Value::String))
                    .collect();
                serde_json::json!({"key": key, "count": g.count.to_string()})
            })
            .collect();
        print(&output::to_json(&serde_json::json!({
            "resource": query.resource, "groupBy": args.group_by, "groups": groups,
            // 64-bit integers as strings, as the proto3 JSON mapping writes them: a
            // revision is about 1.8 × 10^18, past what a double (jq, JavaScript) holds.
            "total": r.total.to_string(), "revision": r.revision.to_string(),
        })));
        return Ok(());
    }
    let mut header: Vec<String> = args.group_by.iter().map(|g| g.to_uppercase()).collect();
    header.push("COUNT".into());
    let mut rows: Vec<Vec<String>> = r
        .groups
        .iter()
        .map(|g| g.key.iter().cloned().chain([g.count.to_string()]).collect())
        .collect();
    if !args.group_by.is_empty() {
        let mut total = vec![String::new(); args.group_by.len()];
        total[0] = "TOTAL".into();
        total.push(r.total.to_string());
        rows.push(total);
    } else {
        rows.push(vec![r.total.to_string()]);
    }
    print(&output::align(Some(&header), &rows));
    Ok(())
}

/// `watch`: changes as they happen, until interrupted; resumes by itself.
pub async fn watch(client: &mut Client, args: args::WatchArgs) -> Result<(), ClientError> {
    check_clusters(client, &args.query).await?;
    let query = args.query.query();
    let one_namespace = args.query.namespaces.len() == 1;
    let mut follower = Follower::new(client.clone(), query, args.since, args.initial);
    let mut table: Option<Table> = None;
    let mut header_printed = args.print.no_headers;
    loop {
        let e = follower.next().await?;
        let printed_row = e.object.is_some();
        table = watch_event(client, e, &args.print, one_namespace, table, header_printed).await;
        header_printed |= printed_row && args.print.output.is_table();
    }
}

/// Prints one Watch event; returns the table to use for the next.
async fn watch_event(
    client: &mut Client,
    e: proto::WatchEvent,
    print_args: &args::PrintArgs,
    one_namespace: bool,
    table: Option<Table>,
    header_printed: bool,
) -> Option<Table> {
    let kind = e
        .r#type()
        .as_str_name()
        .trim_start_matches("EVENT_TYPE_")
        .to_string();
    let format = &print_args.output;
    if !format.is_table() {
        if *format == Format::Json {
            let mut line = serde_json::json!({"type": kind, "revision": e.revision.to_string()});
            if let Some(o) = &e.object {
                line["cluster"] = o.cluster.clone().into();
                line["object"] = serde_json::from_str(&o.json).unwrap_or_default();
            }
            if let Some(c) = &e.cluster {
                line["cluster"] = c.cluster.clone().into();
                line["freshness"] = freshness_name(c.freshness()).into();
                line["message"] = c.message.clone().into();
            }
            if let Some(p) = &e.position {
                line["cluster"] = p.cluster.clone().into();
                line["resourceVersion"] = p.resource_version.clone().into();
            }
            println_flush(&format!("{line}\n"));
        } else if let Some(o) = &e.object {
            print_streamed(&Item::from_proto(o), format);
        }
        return table;
    }
    let Some(o) = &e.object else {
        if e.r#type() == proto::EventType::Reset
            && let Some(p) = &e.position
        {
            eprintln!(
                "cluster {} was reset (its history is gone where it is served now): its objects follow again",
                p.cluster
            );
        }
        if let Some(c) = &e.cluster {
            eprintln!(
                "cluster {} is {}{}",
                c.cluster,
                freshness_name(c.freshness()),
                if c.message.is_empty() {
                    String::new()
                } else {
                    format!(": {}", c.message)
                }
            );
        }
        return table;
    };
    let item = Item::from_proto(o);
    let t = match table {
        Some(t) => t,
        None => {
            table_for(
                client,
                std::slice::from_ref(&item),
                print_args,
                one_namespace,
                true,
            )
            .await
        }
    };
    let row = t.row(&item, SystemTime::now(), Some(&kind));
    let header = t.header();
    println_flush(&output::align(
        (!header_printed).then_some(&header[..]),
        &[row],
    ));
    Some(t)
}

fn freshness_name(f: proto::Freshness) -> String {
    f.as_str_name().trim_start_matches("FRESHNESS_").to_string()
}

fn state_name(s: proto::StreamState) -> String {
    s.as_str_name()
        .trim_start_matches("STREAM_STATE_")
        .to_string()
}

fn duration_text(d: Option<&prost_types::Duration>) -> String {
    match d {
        None => String::new(),
        Some(d) => {
            columns::human_duration(Duration::from_secs(u64::try_from(d.seconds).unwrap_or(0)))
        }
    }
}

/// `clusters`: one row per cluster (freshness, lag, objects, labels); with `-o wide`
/// one per stream; `-o json` everything.
pub async fn clusters(client: &mut Client, args: args::ClustersArgs) -> Result<(), ClientError> {
    let r = client
        .list_clusters(ListClustersRequest::default())
        .await?
        .into_inner();
    let labels_text = |l: &std::collections::HashMap<String, String>| {
        let mut v: Vec<String> = l.iter().map(|(k, v)| format!("{k}={v}")).collect();
        v.sort();
        if v.is_empty() {
            "<none>".into()
        } else {
            v.join(",")
        }
    };
    if args.output == "json" {
        let clusters: Vec<serde_json::Value> = r.clusters.iter().map(|c| {
            let streams: Vec<serde_json::Value> = c.streams.iter().map(|s| serde_json::json!({
                "resource": s.resource, "state": state_name(s.state()), "objects": s.object_count.to_string(),
                "resourceVersion": s.resource_version, "lastError": s.last_error,
                "syncLagSeconds": s.sync_lag.as_ref().map(|d| d.seconds as f64 + f64::from(d.nanos) / 1e9),
                "syncMethod": sync_method_name(s.sync_method()), "watchListFallback": s.watch_list_fallback,
            })).collect();
            let labels: std::collections::BTreeMap<&String, &String> = c.labels.iter().collect();
            serde_json::json!({
                "name": c.name, "freshness": freshness_name(c.freshness()), "labels": labels,
                "server": c.server, "kubernetesVersion": c.kubernetes_version, "source": c.source,
                "lastError": c.last_error, "streams": streams, "owners": c.owners,
            })
        }).collect();
        let mut doc = serde_json::json!({"clusters": clusters});
        if !r.sources_error.is_empty() {
            doc["sourcesError"] = r.sources_error.clone().into();
        }
        let inputs: Vec<serde_json::Value> = r.inputs.iter().map(|i| serde_json::json!({
            "name": i.name, "files": i.files, "reloads": i.reloads.to_string(),
            "loadedTime": i.loaded_time.as_ref().and_then(|t| jiff::Timestamp::new(t.seconds, t.nanos).ok()).map(|t| t.to_string()),
            "error": i.error,
        })).collect();
        if !inputs.is_empty() {
            doc["inputs"] = inputs.into();
        }
        print(&output::to_json(&doc));
        return Ok(());
    }
    let mut rows = Vec::new();
    let header: Vec<String> = if args.output == "wide" {
        for c in &r.clusters {
            for s in &c.streams {
                rows.push(vec![
                    c.name.clone(),
                    freshness_name(c.freshness()),
                    owners_text(&c.owners),
                    s.resource.clone(),
                    state_name(s.state()),
                    s.object_count.to_string(),
                    duration_text(s.sync_lag.as_ref()),
                    s.resource_version.clone(),
                    sync_method_name(s.sync_method()),
                    if s.last_error.is_empty() && !s.watch_list_fallback.is_empty() {
                        format!("listed: {}", s.watch_list_fallback)
                    } else {
                        s.last_error.clone()
                    },
                ]);
            }
            if c.streams.is_empty() {
                rows.push(vec![
                    c.name.clone(),
                    freshness_name(c.freshness()),
                    owners_text(&c.owners),
                    String::new(),
                    String::new(),
                    String::new(),
                    String::new(),
                    String::new(),
                    String::new(),
                    c.last_error.clone(),
                ]);
            }
        }
        [
            "CLUSTER",
            "FRESHNESS",
            "OWNERS",
            "RESOURCE",
            "STATE",
            "OBJECTS",
            "LAG",
            "RV",
            "SYNCED-BY",
            "ERROR",
        ]
        .map(String::from)
        .to_vec()
    } else {
        for c in &r.clusters {
            let objects: u64 = c.streams.iter().map(|s| s.object_count).sum();
            let lag = c
                .streams
                .iter()
                .filter_map(|s| s.sync_lag.as_ref())
                .max_by_key(|d| (d.seconds, d.nanos));
            let error = if c.last_error.is_empty() {
                c.streams
                    .iter()
                    .find(|s| !s.last_error.is_empty())
                    .map(|s| format!("{}: {}", s.resource, s.last_error))
                    .unwrap_or_default()
            } else {
                c.last_error.clone()
            };
            rows.push(vec![
                c.name.clone(),
                freshness_name(c.freshness()),
                c.streams.len().to_string(),
                objects.to_string(),
                duration_text(lag),
                c.kubernetes_version.clone(),
                labels_text(&c.labels),
                error,
            ]);
        }
        [
            "CLUSTER",
            "FRESHNESS",
            "STREAMS",
            "OBJECTS",
            "LAG",
            "VERSION",
            "LABELS",
            "ERROR",
        ]
        .map(String::from)
        .to_vec()
    };
    print(&output::align(Some(&header), &rows));
    if !r.sources_error.is_empty() {
        eprintln!(
            "warning: the last reload failed (the configuration before it stays in force): {}",
            r.sources_error
        );
    }
    // The configuration's and the kubeconfigs' failures are in sources_error.
    for i in r.inputs.iter().filter(|i| !i.error.is_empty()) {
        if !matches!(i.name.as_str(), "config" | "sources") {
            eprintln!(
                "warning: the last reload of {} failed (the version before it stays in force): {}",
                i.name, i.error
            );
        }
    }
    Ok(())
}

/// How a stream synced, as the CLI shows it.
fn sync_method_name(m: proto::SyncMethod) -> String {
    match m {
        proto::SyncMethod::Unspecified => "<none>",
        proto::SyncMethod::WatchList => "watch-list",
        proto::SyncMethod::ListFromCache => "list-from-cache",
        proto::SyncMethod::ListConsistent => "list-consistent",
        proto::SyncMethod::Resumed => "resumed",
    }
    .to_string()
}

/// `fleetscope store`: the persisted store's figures, one per line.
pub async fn store(client: &mut Client, args: args::StoreArgs) -> Result<(), ClientError> {
    let r = client
        .get_store(GetStoreRequest::default())
        .await?
        .into_inner();
    if args.output == "json" {
        let ms = |d: &Option<prost_types::Duration>| {
            d.as_ref()
                .map_or(0.0, |d| d.seconds as f64 * 1e3 + f64::from(d.nanos) / 1e6)
        };
        print(&output::to_json(&serde_json::json!({
            "persisted": r.persisted, "sizeOnDiskBytes": r.size_on_disk_bytes.to_string(),
            "pendingChanges": r.pending_changes.to_string(), "writes": r.flushes.to_string(),
            "lastWriteMs": ms(&r.last_flush), "longestWriteMs": ms(&r.max_flush),
            "eventsWritten": r.events_written.to_string(), "eventsInLog": r.logged_events.to_string(),
            "snapshots": r.snapshots.to_string(), "compactions": r.compactions.to_string(),
            "lastCompactionMs": ms(&r.last_compaction), "lastError": r.last_error,
        })));
        return Ok(());
    }
    if !r.persisted {
        print("in memory only: nothing is persisted\n");
        return Ok(());
    }
    let ms = |d: Option<prost_types::Duration>| {
        d.map_or(0.0, |d| d.seconds as f64 * 1e3 + f64::from(d.nanos) / 1e6)
    };
    let rows = [
        (
            "size on disk",
            format!("{:.1} MB", r.size_on_disk_bytes as f64 / 1e6),
        ),
        ("pending changes", r.pending_changes.to_string()),
        ("writes", r.flushes.to_string()),
        ("last write", format!("{:.1} ms", ms(r.last_flush))),
        ("longest write", format!("{:.1} ms", ms(r.max_flush))),
        ("events written", r.events_written.to_string()),
        ("events in the log", r.logged_events.to_string()),
        ("snapshots", r.snapshots.to_string()),
        ("compactions", r.compactions.to_string()),
        (
            "last compaction",
            format!("{:.1} ms", ms(r.last_compaction)),
        ),
        ("last error", r.last_error),
    ];
    let mut out = String::new();
    for (k, v) in rows {
        let _ = writeln!(out, "{:<18} {v}", format!("{k}:"));
    }
    print(&out);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_server_is_a_url_or_host_and_port() {
        assert_eq!(
            server_url("localhost:50051", false),
            "http://localhost:50051"
        );
        assert_eq!(
            server_url("localhost:50051", true),
            "https://localhost:50051"
        );
        assert_eq!(server_url("http://10.0.0.1:1", true), "http://10.0.0.1:1");
        assert_eq!(server_url("https://fleet:443", false), "https://fleet:443");
    }

    #[test]
    fn tables_align_like_kubectl() {
        let t = output::align(
            Some(&["A".into(), "LONGER".into()]),
            &[vec!["xyz".into(), "1".into()]],
        );
        assert_eq!(t, "A     LONGER\nxyz   1\n");
    }
}
