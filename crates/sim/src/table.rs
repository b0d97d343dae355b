//! `meta.k8s.io/v1` `Table` responses, which kubectl asks for to print `get` output.

use std::sync::Arc;

use serde_json::{Value, json};

use crate::request::partial_metadata;
use crate::resource::ResourceDef;
use crate::store::StoredObject;

fn column(name: &str, kind: &str, format: &str, description: &str, priority: u8) -> Value {
    json!({"name": name, "type": kind, "format": format, "description": description, "priority": priority})
}

fn age(created: Option<&str>) -> String {
    let Some(t) = created.and_then(|c| c.parse::<jiff::Timestamp>().ok()) else {
        return "<unknown>".into();
    };
    let secs = (jiff::Timestamp::now().as_second() - t.as_second()).max(0);
    match secs {
        s if s < 120 => format!("{s}s"),
        s if s < 3600 * 2 => format!("{}m", s / 60),
        s if s < 86400 * 2 => format!("{}h", s / 3600),
        s => format!("{}d", s / 86400),
    }
}

fn text<'v>(v: &'v Value, path: &[&str]) -> &'v str {
    path.iter()
        .try_fold(v, |v, k| v.get(k))
        .and_then(Value::as_str)
        .unwrap_or("")
}

/// Columns and cells for a type, as the apiserver's printers give them.
///
/// (Long for a reason: a table, one arm per type, each its columns.)
fn columns(def: &ResourceDef) -> Vec<Value> {
    let name = column(
        "Name",
        "string",
        "name",
        "Name must be unique within a namespace.",
        0,
    );
    let age = column(
        "Age",
        "string",
        "",
        "CreationTimestamp is a timestamp representing the server time when this object was created.",
        0,
    );
    let mut cols = vec![name];
    match (def.group.as_str(), def.plural.as_str()) {
        ("", "pods") => {
            cols.push(column(
                "Ready",
                "string",
                "",
                "The aggregate readiness state of this pod for accepting traffic.",
                0,
            ));
            cols.push(column(
                "Status",
                "string",
                "",
                "The aggregate status of the containers in this pod.",
                0,
            ));
            cols.push(column(
                "Restarts",
                "string",
                "",
                "The number of times the containers in this pod have been restarted.",
                0,
            ));
            cols.push(age);
            cols.push(column(
                "IP",
                "string",
                "",
                "IP address allocated to the pod.",
                1,
            ));
            cols.push(column(
                "Node",
                "string",
                "",
                "Name of the node the pod is scheduled on.",
                1,
            ));
        }
        ("", "configmaps") => {
            cols.push(column("Data", "integer", "", "Number of data entries.", 0));
            cols.push(age);
        }
        ("", "namespaces" | "nodes") => {
            cols.push(column(
                "Status",
                "string",
                "",
                "The status of the object.",
                0,
            ));
            cols.push(age);
        }
        ("", "services") => {
            cols.push(column("Type", "string", "", "The type of the service.", 0));
            cols.push(column(
                "Cluster-IP",
                "string",
                "",
                "The cluster IP of the service.",
                0,
            ));
            cols.push(age);
        }
        ("", "events") => {
            cols.push(column(
                "Last Seen",
                "string",
                "",
                "When the event last happened.",
                0,
            ));
            cols.push(column("Type", "string", "", "Normal or Warning.", 0));
            cols.push(column("Reason", "string", "", "Why the event happened.", 0));
            cols.push(column(
                "Object",
                "string",
                "",
                "The object the event is about.",
                0,
            ));
            cols.push(column("Message", "string", "", "What happened.", 0));
        }
        ("apps", "deployments" | "replicasets") => {
            cols.push(column(
                "Ready",
                "string",
                "",
                "Ready replicas of desired replicas.",
                0,
            ));
            cols.push(age);
        }
        _ => cols.push(age),
    }
    cols
}

fn cells(def: &ResourceDef, v: &Value) -> Vec<Value> {
    let name = json!(text(v, &["metadata", "name"]));
    let age = json!(age(v["metadata"]["creationTimestamp"].as_str()));
    match (def.group.as_str(), def.plural.as_str()) {
        ("", "pods") => {
            let statuses = v["status"]["containerStatuses"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            let total = v["spec"]["containers"].as_array().map_or(0, Vec::len);
            let ready = statuses.iter().filter(|s| s["ready"] == true).count();
            let restarts: i64 = statuses
                .iter()
                .filter_map(|s| s["restartCount"].as_i64())
                .sum();
            vec![
                name,
                json!(format!("{ready}/{total}")),
                json!(text(v, &["status", "phase"])),
                json!(restarts.to_string()),
                age,
                json!(text(v, &["status", "podIP"])),
                json!(text(v, &["spec", "nodeName"])),
            ]
        }
        ("", "configmaps") => vec![
            name,
            json!(v["data"].as_object().map_or(0, |d| d.len())),
            age,
        ],
        ("", "namespaces") => vec![name, json!(text(v, &["status", "phase"])), age],
        ("", "nodes") => {
            let ready = v["status"]["conditions"]
                .as_array()
                .and_then(|c| c.iter().find(|c| c["type"] == "Ready"))
                .is_some_and(|c| c["status"] == "True");
            vec![name, json!(if ready { "Ready" } else { "NotReady" }), age]
        }
        ("", "services") => vec![
            name,
            json!(text(v, &["spec", "type"])),
            json!(text(v, &["spec", "clusterIP"])),
            age,
        ],
        ("", "events") => vec![
            name,
            json!(self::age(v["lastTimestamp"].as_str())),
            json!(text(v, &["type"])),
            json!(text(v, &["reason"])),
            json!(format!(
                "{}/{}",
                text(v, &["involvedObject", "kind"]).to_lowercase(),
                text(v, &["involvedObject", "name"])
            )),
            json!(text(v, &["message"])),
        ],
        ("apps", "deployments" | "replicasets") => {
            let want = v["spec"]["replicas"].as_i64().unwrap_or(1);
            let ready = v["status"]["readyReplicas"].as_i64().unwrap_or(0);
            vec![name, json!(format!("{ready}/{want}")), age]
        }
        _ => vec![name, age],
    }
}

/// A Table of `items`, with list metadata.
pub(crate) fn render(
    def: &ResourceDef,
    rv: u64,
    continue_token: Option<&str>,
    items: &[Arc<StoredObject>],
) -> Value {
    let rows: Vec<Value> = items
        .iter()
        .map(|o| json!({"cells": cells(def, &o.value()), "object": partial_metadata(o)}))
        .collect();
    let mut metadata = json!({"resourceVersion": rv.to_string()});
    if let Some(c) = continue_token {
        metadata["continue"] = json!(c);
    }
    json!({"kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": metadata, "columnDefinitions": columns(def), "rows": rows})
}
