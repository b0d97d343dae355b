//! The client commands' flags (`get`, `describe`, `count`, `watch`, `clusters`,
//! `store`): the server and how to reach it, the query, and the output.

use std::path::PathBuf;

use clap::Args;

#[derive(Debug, Args, Clone)]
pub struct ServerArg {
    /// The fleetscope server: `https://host:port` (TLS), `http://host:port` (plaintext),
    /// or `host:port` (TLS when a TLS flag is given, else plaintext, as grpcurl takes it).
    #[arg(
        long,
        short = 's',
        env = "FLEETSCOPE_SERVER",
        default_value = fleetscope_proto::DEFAULT_ADDRESS
    )]
    pub server: String,
    /// CA certificates (PEM) to verify the server with; default: the public web roots.
    #[arg(long, env = "FLEETSCOPE_CA", value_name = "FILE")]
    pub ca: Option<PathBuf>,
    /// A client certificate (PEM) for mutual TLS.
    #[arg(long, env = "FLEETSCOPE_CERT", value_name = "FILE", requires = "key")]
    pub cert: Option<PathBuf>,
    /// The client certificate's private key (PEM).
    #[arg(long, env = "FLEETSCOPE_KEY", value_name = "FILE", requires = "cert")]
    pub key: Option<PathBuf>,
    /// A file holding a bearer token, sent with every call (only over TLS, or to this host).
    #[arg(long, env = "FLEETSCOPE_TOKEN_FILE", value_name = "FILE")]
    pub token_file: Option<PathBuf>,
    /// The server name TLS verifies (default: the host of --server).
    #[arg(long, value_name = "NAME")]
    pub tls_server_name: Option<String>,
}

#[derive(Debug, Args)]
pub struct QueryArgs {
    /// The resource type, kubectl-style: pods, po, pod, deployments.apps, deploy, apps/v1/deployments, Deployment
    /// (`get` and `describe` also take several, `pods,svc`, and TYPE/NAME).
    pub resource: String,
    /// Namespaces; repeatable. Default: all.
    #[arg(short = 'n', long = "namespace")]
    pub namespaces: Vec<String>,
    /// Every namespace (the default; accepted as kubectl takes it).
    #[arg(short = 'A', long = "all-namespaces", conflicts_with = "namespaces")]
    pub all_namespaces: bool,
    /// Label selector, Kubernetes syntax.
    #[arg(short = 'l', long = "selector", default_value = "")]
    pub labels: String,
    /// Field selector over any JSON path, Kubernetes syntax.
    #[arg(long = "field-selector", default_value = "")]
    pub fields: String,
    /// Clusters by name or glob; repeatable. Default: all.
    #[arg(long = "cluster")]
    pub clusters: Vec<String>,
    /// Label selector over cluster labels.
    #[arg(long = "cluster-selector", default_value = "")]
    pub cluster_selector: String,
    /// kubectl's --context, which fleetscope takes as the slip it is: clusters are
    /// named with --cluster here (each kubeconfig context is a cluster).
    #[arg(long = "context", hide = true, value_name = "CONTEXT", value_parser = context_is_a_cluster)]
    pub context: Option<String>,
    /// Only apiVersion, kind and metadata.
    #[arg(long)]
    pub metadata_only: bool,
    #[command(flatten)]
    pub server: ServerArg,
}

/// Refuses `--context NAME`, saying what to type instead.
fn context_is_a_cluster(name: &str) -> Result<String, String> {
    Err(format!(
        "fleetscope names clusters with --cluster (each kubeconfig context is a cluster): try --cluster {name}"
    ))
}

impl QueryArgs {
    pub fn query(&self) -> fleetscope_proto::Query {
        fleetscope_proto::Query {
            clusters: self.clusters.clone(),
            cluster_selector: self.cluster_selector.clone(),
            resource: self.resource.clone(),
            namespaces: self.namespaces.clone(),
            label_selector: self.labels.clone(),
            field_selector: self.fields.clone(),
            projection: if self.metadata_only {
                fleetscope_proto::Projection::Metadata as i32
            } else {
                0
            },
        }
    }
}

/// How objects print: shared by `get` and `watch`.
#[derive(Debug, Args)]
pub struct PrintArgs {
    /// Output format: table, wide, json, yaml, name, jsonpath=TEMPLATE, custom-columns=HEADER:PATH[,...].
    #[arg(short = 'o', long, default_value = "table", value_parser = crate::output::parse_format)]
    pub output: crate::output::Format,
    /// No header row.
    #[arg(long)]
    pub no_headers: bool,
    /// A LABELS column with every label.
    #[arg(long)]
    pub show_labels: bool,
    /// A column for each of these label keys; repeatable or comma-separated.
    #[arg(short = 'L', long = "label-columns", value_delimiter = ',')]
    pub label_columns: Vec<String>,
}

#[derive(Debug, Args)]
#[command(after_help = "Examples:
  fleetscope get pods -A                                   every pod in every cluster
  fleetscope get po -l app=web --cluster 'prod-*' -o wide  with IP and NODE
  fleetscope get deploy web -n payments                    one name, looked up across the fleet
  fleetscope get pods,svc -n payments                      several types, a table each
  fleetscope get pod/web-1 svc/web                         TYPE/NAME, as many as you like
  fleetscope get nodes -o custom-columns=NAME:.metadata.name,KUBELET:.status.nodeInfo.kubeletVersion
  fleetscope get pods --sort-by .metadata.creationTimestamp -w")]
pub struct GetArgs {
    #[command(flatten)]
    pub query: QueryArgs,
    /// Objects' names, looked up across the selected clusters and namespaces (or
    /// TYPE/NAME when the type is given that way).
    pub names: Vec<String>,
    #[command(flatten)]
    pub print: PrintArgs,
    /// Sort by a JSONPath (`.metadata.creationTimestamp`, `{.status.restartCount}`).
    #[arg(long)]
    pub sort_by: Option<String>,
    /// After listing, print changes as they arrive.
    #[arg(short = 'w', long)]
    pub watch: bool,
    /// At most this many objects.
    #[arg(long)]
    pub limit: Option<u64>,
}

#[derive(Debug, Args)]
#[command(after_help = "Examples:
  fleetscope describe deploy web -n payments               every cluster holding it
  fleetscope describe pod/web-1 --cluster prod-eu-1
  fleetscope describe nodes                                every node of the fleet

Events are shown when the fleet collects them (events among the resources).")]
pub struct DescribeArgs {
    #[command(flatten)]
    pub query: QueryArgs,
    /// Objects' names (or TYPE/NAME); none: every object of the type.
    pub names: Vec<String>,
}

#[derive(Debug, Args)]
#[command(after_help = "Examples:
  fleetscope count pods --group-by cluster,field:status.phase
  fleetscope count deploy --group-by label:app -o json")]
pub struct CountArgs {
    #[command(flatten)]
    pub query: QueryArgs,
    /// Group by cluster, namespace, label:KEY or field:PATH; comma-separated (also `--by`).
    #[arg(long, alias = "by", value_delimiter = ',')]
    pub group_by: Vec<String>,
    /// Output format: table or json.
    #[arg(short = 'o', long, default_value = "table", value_parser = ["table", "json"])]
    pub output: String,
}

#[derive(Debug, Args)]
#[command(after_help = "Examples:
  fleetscope watch configmaps -n team-0                     rows as changes arrive
  fleetscope watch pods -o json --since 1234               one JSON event per line, from a revision

It resumes by itself from its last revision when the server restarts, and says so on stderr.")]
pub struct WatchArgs {
    #[command(flatten)]
    pub query: QueryArgs,
    /// Deliver every change after this revision.
    #[arg(long, default_value_t = 0)]
    pub since: u64,
    /// First send the current objects as ADDED.
    #[arg(long)]
    pub initial: bool,
    #[command(flatten)]
    pub print: PrintArgs,
}

#[derive(Debug, Args)]
pub struct ClustersArgs {
    /// Output format: table (one row per cluster), wide (one row per stream) or json.
    #[arg(short = 'o', long, default_value = "table", value_parser = ["table", "wide", "json"])]
    pub output: String,
    #[command(flatten)]
    pub server: ServerArg,
}

#[derive(Debug, Args)]
pub struct KubeconfigArgs {
    /// The server's Kubernetes API (its --kube-api-listen), as kubectl reaches it:
    /// `https://HOST:PORT`, or `http://HOST:PORT` when the server is plaintext.
    #[arg(long, env = "FLEETSCOPE_KUBE_API", value_name = "URL")]
    pub kube_api: String,
    #[command(flatten)]
    pub server: ServerArg,
}

#[derive(Debug, Args)]
pub struct VersionArgs {
    /// The client's version only: no server is asked.
    #[arg(long)]
    pub client: bool,
    #[command(flatten)]
    pub server: ServerArg,
}

#[derive(Debug, Args)]
pub struct StoreArgs {
    /// Output format: table or json.
    #[arg(short = 'o', long, default_value = "table", value_parser = ["table", "json"])]
    pub output: String,
    #[command(flatten)]
    pub server: ServerArg,
}
