//! What the reading commands share: the objects a command names (by type and name
//! or by query), listed page by page, and the table their type is printed in.

use super::args;
use super::columns;
use super::connect::{Client, ClientError, message};
use super::output::{self, Format, Item, Table};
use super::printing::warn_not_current;
use fleetscope_proto::{ListRequest, Query};

/// Every object a list gave.
pub(super) struct Listed {
    pub(super) items: Vec<Item>,
}

/// Every page of a query (up to `limit` objects), warning on stderr about clusters
/// that are not synced.
pub(super) async fn list_all(
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
pub(super) fn resource_error(resource: &str, s: tonic::Status) -> ClientError {
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
pub(super) async fn columns_of(client: &mut Client, items: &[Item]) -> Vec<columns::Column> {
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
pub(super) async fn table_for(
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

/// What `get` and `describe` name, as kubectl reads it: `TYPE[,TYPE...] [NAME...]`
/// or `TYPE/NAME...`; each type with the name asked of it (none: every object).
pub(super) fn targets(resource: &str, names: &[String]) -> Result<Vec<Target>, ClientError> {
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
pub(super) struct Target {
    pub(super) resource: String,
    pub(super) name: Option<String>,
}

impl Target {
    /// The query: the command's, for this type and name.
    pub(super) fn query(&self, q: &args::QueryArgs) -> Query {
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
    pub(super) fn not_found(&self, q: &args::QueryArgs) -> Option<String> {
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
    let known: Vec<fleetscope_model::ClusterName> = super::status::cluster_names(client)
        .await?
        .into_iter()
        .map(fleetscope_model::ClusterName::from)
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

/// " in namespace X" / " in cluster(s) …", for "No resources found" and "not found".
pub(super) fn where_looked(q: &args::QueryArgs) -> String {
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
