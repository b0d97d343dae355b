//! Server-side printing: what kubectl asks for first (`Accept:
//! application/json;as=Table;v=v1;g=meta.k8s.io`), a `meta.k8s.io/v1` `Table` with the
//! columns `fleetscope get` prints for the type (the CLI's column definitions, the
//! same ones), `CLUSTER` first in the fleet's view, and each row's object as
//! `PartialObjectMetadata` (kubectl takes the namespace for `-A` from it).

use std::time::SystemTime;

use fleetscope_cli::columns::Column;
use serde_json::{Value, json};

/// The content type of a Table answer.
pub const CONTENT_TYPE: &str = "application/json;as=Table;v=v1;g=meta.k8s.io";

/// The Table of `objects` (each with its cluster) of the type named `resource`
/// (`pods`, `deployments.apps`), with `metadata` (the list's), a `CLUSTER` column when
/// `fleet`.
pub fn of(resource: &str, objects: &[(&str, Value)], fleet: bool, metadata: Value) -> Value {
    let columns = fleetscope_cli::output::columns_for(resource, None);
    let now = SystemTime::now();
    let rows: Vec<Value> = objects
        .iter()
        .map(|(cluster, o)| row(&columns, (cluster, o), fleet, now))
        .collect();
    json!({
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": metadata,
        "columnDefinitions": definitions(&columns, fleet),
        "rows": rows,
    })
}

/// A Table written as its rows come ([`Rows::head`], each [`Rows::row`], then the
/// caller closes `rows` and adds the list's `metadata`).
pub struct Rows {
    columns: Vec<Column>,
    fleet: bool,
}

impl Rows {
    /// The rows of objects of `resource`, with a `CLUSTER` column when `fleet`.
    pub fn new(resource: &str, fleet: bool) -> Self {
        Self {
            columns: fleetscope_cli::output::columns_for(resource, None),
            fleet,
        }
    }

    /// The Table's text up to its first row: `{…,"columnDefinitions":[…],"rows":[`.
    pub fn head(&self) -> String {
        let head = json!({
            "kind": "Table",
            "apiVersion": "meta.k8s.io/v1",
            "columnDefinitions": definitions(&self.columns, self.fleet),
        })
        .to_string();
        format!("{},\"rows\":[", &head[..head.len() - 1])
    }

    /// The row of `object` of `cluster`.
    pub fn row(&self, cluster: &str, object: &Value) -> Value {
        row(
            &self.columns,
            (cluster, object),
            self.fleet,
            SystemTime::now(),
        )
    }
}

/// The column definitions: `Cluster` (in the fleet's view), `Name`, then `columns`.
fn definitions(columns: &[Column], fleet: bool) -> Vec<Value> {
    let mut definitions = Vec::new();
    if fleet {
        definitions.push(definition(
            "Cluster",
            "",
            0,
            "The cluster the object is in.",
        ));
    }
    definitions.push(definition(
        "Name",
        "name",
        0,
        "Name must be unique within a namespace.",
    ));
    definitions.extend(
        columns
            .iter()
            .map(|c| definition(&c.header, "", i32::from(c.wide), "")),
    );
    definitions
}

/// One object's row: its cells, and its metadata as `PartialObjectMetadata`.
fn row(columns: &[Column], (cluster, o): (&str, &Value), fleet: bool, now: SystemTime) -> Value {
    let mut cells = Vec::new();
    if fleet {
        cells.push(json!(cluster));
    }
    cells.push(o["metadata"]["name"].clone());
    cells.extend(columns.iter().map(|c| json!((c.cell)(o, now))));
    json!({
        "cells": cells,
        "object": {
            "kind": "PartialObjectMetadata",
            "apiVersion": "meta.k8s.io/v1",
            "metadata": o["metadata"],
        },
    })
}

/// One column's definition: shown by default (priority 0) or with `-o wide` (1).
fn definition(name: &str, format: &str, priority: i32, description: &str) -> Value {
    json!({
        "name": name,
        "type": "string",
        "format": format,
        "description": description,
        "priority": priority,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_table_has_the_cli_s_columns_with_the_cluster_first_in_the_fleet() {
        let deploy = json!({
            "metadata": {"name": "web", "namespace": "shop", "creationTimestamp": "2020-01-01T00:00:00Z"},
            "spec": {"replicas": 3},
            "status": {"readyReplicas": 2, "updatedReplicas": 3, "availableReplicas": 2},
        });
        let t = of(
            "deployments.apps",
            &[("prod-1", deploy.clone())],
            true,
            json!({"resourceVersion": "7"}),
        );
        let names: Vec<&str> = t["columnDefinitions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| d["name"].as_str().unwrap())
            .collect();
        assert_eq!(&names[..3], ["Cluster", "Name", "READY"]);
        let cells = &t["rows"][0]["cells"];
        assert_eq!(
            (&cells[0], &cells[1], &cells[2]),
            (&json!("prod-1"), &json!("web"), &json!("2/3"))
        );
        assert_eq!(t["rows"][0]["object"]["metadata"]["namespace"], "shop");
        // In one cluster: no CLUSTER column.
        let t = of("deployments.apps", &[("prod-1", deploy)], false, json!({}));
        assert_eq!(t["columnDefinitions"][0]["name"], "Name");
        assert_eq!(t["rows"][0]["cells"][0], "web");
    }
}
