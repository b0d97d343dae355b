//! `describe`: objects in detail, as kubectl's generic describer prints them (the
//! cluster first), with the events about each from its cluster when the fleet collects
//! events.

use super::connect::{Client, ClientError};
use super::lookup::{Listed, check_clusters, list_all, targets, where_looked};
use super::printing::print;
use std::fmt::Write as _;
use std::time::SystemTime;

use serde_json::Value;

use super::args;
use super::columns::age_of;
use super::jsonpath::text;
use super::output::Item;
use fleetscope_proto::Query;

/// The events' type as the fleet collects it.
const EVENTS: &str = "events";

/// `describe`: every object the arguments name, each with its events.
pub async fn describe(client: &mut Client, args: args::DescribeArgs) -> Result<(), ClientError> {
    check_clusters(client, &args.query).await?;
    let targets = targets(&args.query.resource, &args.names)?;
    let mut described = 0;
    let mut missing = Vec::new();
    for target in &targets {
        let Listed { items, .. } = list_all(client, &target.query(&args.query), None).await?;
        if items.is_empty()
            && let Some(m) = target.not_found(&args.query)
        {
            missing.push(m);
        }
        for item in &items {
            let events = events_of(client, item).await;
            if described > 0 {
                print("\n\n");
            }
            print(&render(item, &events, SystemTime::now()));
            described += 1;
        }
    }
    if described == 0 && missing.is_empty() {
        eprintln!("No resources found{}.", where_looked(&args.query));
    }
    if !missing.is_empty() {
        return Err(ClientError::Message(missing.join("\n")));
    }
    Ok(())
}

/// The events about an object, from its cluster, oldest first.
enum Events {
    /// The fleet does not collect events.
    NotCollected,
    /// Listing them failed.
    Failed(String),
    /// The events.
    Held(Vec<Value>),
}

async fn events_of(client: &mut Client, item: &Item) -> Events {
    let uid = item.object["metadata"]["uid"].as_str().unwrap_or_default();
    let query = Query {
        resource: EVENTS.into(),
        clusters: vec![item.cluster.clone()],
        namespaces: if item.namespace.is_empty() {
            Vec::new()
        } else {
            vec![item.namespace.clone()]
        },
        field_selector: if uid.is_empty() {
            format!("involvedObject.name={}", item.name)
        } else {
            format!("involvedObject.uid={uid}")
        },
        ..Default::default()
    };
    match list_all(client, &query, None).await {
        Ok(Listed { items, .. }) => {
            let mut events: Vec<Value> = items.into_iter().map(|i| i.object).collect();
            events.sort_by(|a, b| last_seen(a).cmp(last_seen(b)));
            Events::Held(events)
        }
        Err(ClientError::Message(m)) if m.contains("doesn't have a resource type") => {
            Events::NotCollected
        }
        Err(e) => Events::Failed(e.to_string()),
    }
}

fn last_seen(event: &Value) -> &str {
    ["lastTimestamp", "eventTime", "firstTimestamp"]
        .iter()
        .find_map(|k| event[*k].as_str())
        .or_else(|| event["metadata"]["creationTimestamp"].as_str())
        .unwrap_or_default()
}

/// One object in detail: cluster, name, namespace, labels and annotations, then every
/// other field as `Title Case: value` lines (kubectl's generic describer), then events.
fn render(item: &Item, events: &Events, now: SystemTime) -> String {
    let mut out = String::new();
    header(&mut out, item);
    fields(&mut out, item);
    events_table(&mut out, events, now);
    out
}

/// One `Key: value` line, values aligned as kubectl aligns them.
fn field(out: &mut String, key: &str, value: &str) {
    let _ = writeln!(out, "{:<13}{value}", format!("{key}:"));
}

/// Where the object is, what it is, and its labels and annotations.
fn header(out: &mut String, item: &Item) {
    let meta = &item.object["metadata"];
    field(out, "Cluster", &item.cluster);
    field(out, "Name", &item.name);
    if !item.namespace.is_empty() {
        field(out, "Namespace", &item.namespace);
    }
    for (title, key, sep) in [
        ("Labels", "labels", "="),
        ("Annotations", "annotations", ": "),
    ] {
        let pairs: Vec<String> = meta[key]
            .as_object()
            .map(|m| {
                m.iter()
                    .map(|(k, v)| format!("{k}{sep}{}", text(v)))
                    .collect()
            })
            .unwrap_or_default();
        if pairs.is_empty() {
            field(out, title, "<none>");
        } else {
            for (i, p) in pairs.iter().enumerate() {
                if i == 0 {
                    field(out, title, p);
                } else {
                    let _ = writeln!(out, "{:13}{p}", "");
                }
            }
        }
    }
    field(
        out,
        "API Version",
        item.object["apiVersion"].as_str().unwrap_or_default(),
    );
    field(
        out,
        "Kind",
        item.object["kind"].as_str().unwrap_or_default(),
    );
}

/// Everything else the object holds, nested as kubectl nests it.
fn fields(out: &mut String, item: &Item) {
    let meta = &item.object["metadata"];
    if let Some(obj) = item.object.as_object() {
        let mut rest = serde_json::Map::new();
        if let Some(m) = meta.as_object() {
            let skip = [
                "name",
                "namespace",
                "labels",
                "annotations",
                "managedFields",
            ];
            let kept: serde_json::Map<String, Value> = m
                .iter()
                .filter(|(k, _)| !skip.contains(&k.as_str()))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            if !kept.is_empty() {
                rest.insert("metadata".into(), Value::Object(kept));
            }
        }
        for (k, v) in obj {
            if !matches!(k.as_str(), "apiVersion" | "kind" | "metadata") {
                rest.insert(k.clone(), v.clone());
            }
        }
        for (k, v) in &rest {
            nested(out, 0, k, v);
        }
    }
}

/// The events about the object, as kubectl's describe tables them.
fn events_table(out: &mut String, events: &Events, now: SystemTime) {
    match events {
        Events::NotCollected => out.push_str(
            "Events:      <not collected: add events to the fleet's resources to see them here>\n",
        ),
        Events::Failed(e) => {
            let _ = writeln!(out, "Events:      <unavailable: {e}>");
        }
        Events::Held(list) if list.is_empty() => out.push_str("Events:      <none>\n"),
        Events::Held(list) => {
            out.push_str("Events:\n");
            let header = ["Type", "Reason", "Age", "From", "Message"].map(String::from);
            // kubectl's dashes (Age's are four wide).
            let dashes = ["----", "------", "----", "----", "-------"].map(String::from);
            let mut rows = vec![dashes.to_vec()];
            for e in list {
                let age = age_of(&Value::from(last_seen(e)), now);
                let count = e["count"].as_i64().unwrap_or(1);
                let age = if count > 1 {
                    format!(
                        "{age} (x{count} over {})",
                        age_of(&e["firstTimestamp"], now)
                    )
                } else {
                    age
                };
                let from = e["source"]["component"]
                    .as_str()
                    .or_else(|| e["reportingController"].as_str())
                    .or_else(|| e["reportingComponent"].as_str())
                    .unwrap_or_default();
                rows.push(vec![
                    text(&e["type"]),
                    text(&e["reason"]),
                    age,
                    from.to_string(),
                    text(&e["message"]).trim().to_string(),
                ]);
            }
            rows.insert(0, header.to_vec());
            // kubectl's describe tables: columns two spaces apart.
            let widths: Vec<usize> = (0..header.len())
                .map(|c| rows.iter().map(|r| r[c].chars().count()).max().unwrap_or(0))
                .collect();
            for row in &rows {
                let line: Vec<String> = row
                    .iter()
                    .zip(&widths)
                    .map(|(cell, w)| format!("{cell:<w$}"))
                    .collect();
                let _ = writeln!(out, "  {}", line.join("  ").trim_end());
            }
        }
    }
}

/// `creationTimestamp` → `Creation Timestamp`, as kubectl titles a field.
fn title(key: &str) -> String {
    let mut out = String::new();
    let mut prev_upper = true;
    for c in key.chars() {
        if out.is_empty() {
            out.extend(c.to_uppercase());
        } else {
            if c.is_uppercase() && !prev_upper {
                out.push(' ');
            }
            out.push(c);
        }
        prev_upper = c.is_uppercase();
    }
    out
}

/// A field and what it holds, indented by `depth`: scalars on the line, maps and
/// lists below it.
fn nested(out: &mut String, depth: usize, key: &str, value: &Value) {
    let pad = "  ".repeat(depth);
    match value {
        Value::Object(m) if m.is_empty() => {
            let _ = writeln!(out, "{pad}{}:", title(key));
        }
        Value::Object(m) => {
            let _ = writeln!(out, "{pad}{}:", title(key));
            for (k, v) in m {
                nested(out, depth + 1, k, v);
            }
        }
        Value::Array(a) if a.is_empty() => {
            let _ = writeln!(out, "{pad}{}:", title(key));
        }
        Value::Array(a) => {
            let _ = writeln!(out, "{pad}{}:", title(key));
            for v in a {
                match v {
                    Value::Object(m) => {
                        for (i, (k, v)) in m.iter().enumerate() {
                            if i == 0 {
                                // The item's first field on its dash line.
                                let mut line = String::new();
                                nested(&mut line, 0, k, v);
                                let _ = write!(out, "{pad}  - {line}");
                                continue;
                            }
                            nested(out, depth + 2, k, v);
                        }
                    }
                    other => {
                        let _ = writeln!(out, "{pad}  - {}", text(other));
                    }
                }
            }
        }
        scalar => {
            let _ = writeln!(out, "{pad}{}:  {}", title(key), text(scalar));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn titles_read_as_kubectl_prints_them() {
        assert_eq!(title("creationTimestamp"), "Creation Timestamp");
        assert_eq!(title("podIP"), "Pod IP");
        assert_eq!(title("replicas"), "Replicas");
    }

    #[test]
    fn an_object_reads_with_its_cluster_fields_and_events() {
        let item = Item {
            cluster: "prod-eu".into(),
            resource: "deployments.apps".into(),
            namespace: "shop".into(),
            name: "web".into(),
            object: json!({
                "apiVersion": "apps/v1",
                "kind": "Deployment",
                "metadata": {"name": "web", "namespace": "shop", "labels": {"app": "web"}, "uid": "u1"},
                "spec": {"replicas": 2, "template": {"spec": {"containers": [{"name": "web", "image": "nginx:1"}]}}},
            }),
        };
        let now = SystemTime::now();
        let stamp = jiff::Timestamp::try_from(now).unwrap().to_string();
        let events = Events::Held(vec![json!({
            "type": "Normal", "reason": "ScalingReplicaSet", "message": "Scaled up replica set web-x to 2",
            "source": {"component": "deployment-controller"}, "lastTimestamp": stamp, "count": 1,
        })]);
        let text = render(&item, &events, now);
        assert!(
            text.starts_with("Cluster:     prod-eu\nName:        web\nNamespace:   shop\n"),
            "{text}"
        );
        assert!(text.contains("Labels:      app=web\n"), "{text}");
        assert!(text.contains("Annotations: <none>\n"), "{text}");
        assert!(text.contains("Spec:\n  Replicas:  2\n  Template:\n    Spec:\n      Containers:\n        - Name:  web\n          Image:  nginx:1\n"), "{text}");
        assert!(text.contains("Events:\n  Type    Reason"), "{text}");
        assert!(text.contains("  Normal  ScalingReplicaSet  0s    deployment-controller  Scaled up replica set web-x to 2"), "{text}");
        let none = render(&item, &Events::NotCollected, now);
        assert!(none.contains("Events:      <not collected"), "{none}");
    }
}
