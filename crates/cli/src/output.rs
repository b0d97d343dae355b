//! How `get`, `watch` and the other client commands print, with kubectl's formats:
//! aligned columns (`wide` adds more), `json` and `yaml` (a `kind: List` whose items
//! carry their cluster in the `fleetscope.io/cluster` annotation), `name`
//! (`CLUSTER/kind.group/NAME`), `jsonpath=TEMPLATE` and `custom-columns=SPEC`.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::SystemTime;

use serde_json::{Value, json};

use super::columns::{self, Column};
use super::jsonpath::{Template, text};

/// The annotation carrying an object's cluster in `-o json` and `-o yaml`.
pub const CLUSTER_ANNOTATION: &str = "fleetscope.io/cluster";

/// An output format, as `-o` takes it.
#[derive(Debug, Clone, PartialEq)]
pub enum Format {
    /// Aligned columns.
    Table,
    /// Aligned columns, with the wide ones.
    Wide,
    /// JSON.
    Json,
    /// YAML.
    Yaml,
    /// `CLUSTER/kind.group/NAME` per object.
    Name,
    /// A JSONPath template over the object (or the List).
    JsonPath(Template),
    /// Columns of JSONPath expressions: (header, expression).
    CustomColumns(Vec<(String, Template)>),
}

impl Format {
    /// Whether the format is a table (headers, columns).
    pub fn is_table(&self) -> bool {
        matches!(
            self,
            Format::Table | Format::Wide | Format::CustomColumns(_)
        )
    }
}

/// Parses `-o`: `table`, `wide`, `json`, `yaml`, `name`, `jsonpath=TEMPLATE`,
/// `custom-columns=HEADER:PATH,...`.
pub fn parse_format(text: &str) -> Result<Format, String> {
    let (kind, arg) = match text.split_once('=') {
        Some((k, a)) => (k, Some(a)),
        None => (text, None),
    };
    let expected = "expected table, wide, json, yaml, name, jsonpath=TEMPLATE or custom-columns=HEADER:PATH[,...]";
    match (kind, arg) {
        ("table" | "", None) => Ok(Format::Table),
        ("wide", None) => Ok(Format::Wide),
        ("json", None) => Ok(Format::Json),
        ("yaml", None) => Ok(Format::Yaml),
        ("name", None) => Ok(Format::Name),
        ("jsonpath", Some(t)) => Template::parse(t)
            .map(Format::JsonPath)
            .map_err(|e| e.to_string()),
        ("custom-columns", Some(spec)) => {
            let mut columns = Vec::new();
            for part in spec.split(',').filter(|p| !p.is_empty()) {
                let (header, path) = part
                    .split_once(':')
                    .ok_or_else(|| format!("custom-columns: {part:?} is not HEADER:PATH"))?;
                let t = Template::parse(path).map_err(|e| format!("custom-columns: {e}"))?;
                columns.push((header.to_string(), t));
            }
            if columns.is_empty() {
                return Err("custom-columns: no columns given".into());
            }
            Ok(Format::CustomColumns(columns))
        }
        ("jsonpath" | "custom-columns", None) => Err(format!(
            "{kind} needs ={}",
            if kind == "jsonpath" {
                "TEMPLATE"
            } else {
                "SPEC"
            }
        )),
        _ => Err(format!("{text:?}: {expected}")),
    }
}

/// An object as the client prints it.
#[derive(Debug, Clone)]
pub struct Item {
    /// Its cluster.
    pub cluster: String,
    /// Its canonical resource type (`pods`, `deployments.apps`).
    pub resource: String,
    /// Its namespace; empty when cluster-scoped.
    pub namespace: String,
    /// Its name.
    pub name: String,
    /// The object.
    pub object: Value,
}

impl Item {
    /// From the API's object.
    pub fn from_proto(o: &fleetscope_proto::Object) -> Self {
        Self {
            cluster: o.cluster.clone(),
            resource: o.resource.clone(),
            namespace: o.namespace.clone(),
            name: o.name.clone(),
            object: serde_json::from_str(&o.json).unwrap_or(Value::Null),
        }
    }

    /// The object with its cluster in the `fleetscope.io/cluster` annotation.
    pub fn annotated(&self) -> Value {
        let mut o = self.object.clone();
        if let Some(meta) = o.get_mut("metadata").and_then(Value::as_object_mut) {
            let annotations = meta
                .entry("annotations")
                .or_insert_with(|| Value::Object(Default::default()));
            if let Some(a) = annotations.as_object_mut() {
                a.insert(
                    CLUSTER_ANNOTATION.into(),
                    Value::String(self.cluster.clone()),
                );
            }
        }
        o
    }

    /// `CLUSTER/kind.group/NAME`, as kubectl's `-o name` with the cluster first.
    pub fn qualified_name(&self) -> String {
        format!("{}/{}", self.cluster, self.typed_name())
    }

    /// `kind[.group]/name`, as kubectl names an object among several types.
    pub fn typed_name(&self) -> String {
        let kind = self.object["kind"]
            .as_str()
            .unwrap_or_default()
            .to_lowercase();
        let group = self
            .resource
            .split_once('.')
            .map(|(_, g)| format!(".{g}"))
            .unwrap_or_default();
        format!("{kind}{group}/{}", self.name)
    }
}

/// A `kind: List` of items, each annotated with its cluster.
pub fn list(items: &[Item]) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "List",
        "items": items.iter().map(Item::annotated).collect::<Vec<_>>(),
        "metadata": {"resourceVersion": ""},
    })
}

/// JSON, indented as kubectl prints it.
pub fn to_json(v: &Value) -> String {
    let mut s = serde_json::to_string_pretty(v).unwrap_or_default();
    s.push('\n');
    s
}

/// YAML.
pub fn to_yaml(v: &Value) -> String {
    serde_saphyr::to_string(v).unwrap_or_default()
}

/// The table settings of `get` and `watch`.
#[derive(Debug, Default)]
pub struct Table {
    /// The type's columns.
    pub columns: Vec<Column>,
    /// Custom columns instead.
    pub custom: Option<Vec<(String, Template)>>,
    /// Include wide columns.
    pub wide: bool,
    /// A NAMESPACE column (namespaced type, not one namespace).
    pub namespace: bool,
    /// A LABELS column.
    pub show_labels: bool,
    /// A column per label key (`-L`).
    pub label_columns: Vec<String>,
    /// A leading EVENT column (for watch rows).
    pub event: bool,
    /// Names as `kind/name` (several types in one answer).
    pub typed_names: bool,
}

impl Table {
    /// The header cells.
    pub fn header(&self) -> Vec<String> {
        let mut h = Vec::new();
        if self.event {
            h.push("EVENT".into());
        }
        if let Some(custom) = &self.custom {
            h.extend(custom.iter().map(|(name, _)| name.clone()));
            return h;
        }
        h.push("CLUSTER".into());
        if self.namespace {
            h.push("NAMESPACE".into());
        }
        h.push("NAME".into());
        h.extend(
            self.columns
                .iter()
                .filter(|c| self.wide || !c.wide)
                .map(|c| c.header.clone()),
        );
        if self.show_labels {
            h.push("LABELS".into());
        }
        for key in &self.label_columns {
            h.push(key.rsplit('/').next().unwrap_or(key).to_uppercase());
        }
        h
    }

    /// One object's cells.
    pub fn row(&self, item: &Item, now: SystemTime, event: Option<&str>) -> Vec<String> {
        let mut r = Vec::new();
        if self.event {
            r.push(event.unwrap_or_default().to_string());
        }
        if let Some(custom) = &self.custom {
            for (_, t) in custom {
                let values = t.values(&item.object);
                r.push(if values.is_empty() {
                    "<none>".into()
                } else {
                    values.iter().map(|v| text(v)).collect::<Vec<_>>().join(",")
                });
            }
            return r;
        }
        r.push(item.cluster.clone());
        if self.namespace {
            r.push(item.namespace.clone());
        }
        r.push(if self.typed_names {
            item.typed_name()
        } else {
            item.name.clone()
        });
        for c in self.columns.iter().filter(|c| self.wide || !c.wide) {
            r.push((c.cell)(&item.object, now));
        }
        let labels = item.object["metadata"]["labels"].as_object();
        if self.show_labels {
            let all: Vec<String> = labels
                .map(|l| l.iter().map(|(k, v)| format!("{k}={}", text(v))).collect())
                .unwrap_or_default();
            r.push(if all.is_empty() {
                "<none>".into()
            } else {
                all.join(",")
            });
        }
        for key in &self.label_columns {
            r.push(
                labels
                    .and_then(|l| l.get(key))
                    .map(text)
                    .unwrap_or_default(),
            );
        }
        r
    }
}

/// The columns of a type: built in, from a CRD (`crd` with the served `version`), or
/// NAME and AGE.
pub fn columns_for(resource: &str, crd: Option<(&Value, &str)>) -> Vec<Column> {
    columns::builtin(resource)
        .or_else(|| crd.and_then(|(crd, version)| columns::from_crd(crd, version)))
        .unwrap_or_else(columns::generic)
}

/// Formats rows as aligned columns, as kubectl does (three spaces between columns).
pub fn align(header: Option<&[String]>, rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> =
        header.map_or_else(Vec::new, |h| h.iter().map(|c| c.chars().count()).collect());
    for row in rows {
        if widths.len() < row.len() {
            widths.resize(row.len(), 0);
        }
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let mut line = |cells: &[String]| {
        let mut l = String::new();
        for (i, cell) in cells.iter().enumerate() {
            if i + 1 == cells.len() {
                l.push_str(cell);
            } else {
                let pad = widths[i].saturating_sub(cell.chars().count()) + 3;
                let _ = write!(l, "{cell}{:pad$}", "");
            }
        }
        out.push_str(l.trim_end());
        out.push('\n');
    };
    if let Some(h) = header {
        line(h);
    }
    for row in rows {
        line(row);
    }
    out
}

/// Sorts items by the first value of `by` (numbers by value, others as text), stably.
pub fn sort(items: &mut [Item], by: &Template) {
    let key = |i: &Item| -> (Option<f64>, String) {
        match by.values(&i.object).first() {
            Some(Value::Number(n)) => (n.as_f64(), String::new()),
            Some(v) => (None, text(v)),
            None => (None, String::new()),
        }
    };
    let mut keyed: Vec<((Option<f64>, String), Item)> =
        items.iter().map(|i| (key(i), i.clone())).collect();
    keyed.sort_by(|(a, _), (b, _)| match (a.0, b.0) {
        (Some(x), Some(y)) => x.total_cmp(&y),
        _ => a.1.cmp(&b.1),
    });
    for (slot, (_, item)) in items.iter_mut().zip(keyed) {
        *slot = item;
    }
}

/// Counts of objects by (cluster, namespace), for "matches several" messages.
pub fn places(items: &[Item]) -> BTreeMap<String, usize> {
    let mut m = BTreeMap::new();
    for i in items {
        let place = if i.namespace.is_empty() {
            i.cluster.clone()
        } else {
            format!("{}/{}", i.cluster, i.namespace)
        };
        *m.entry(place).or_insert(0) += 1;
    }
    m
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn now() -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000)
    }

    fn item(cluster: &str, resource: &str, object: Value) -> Item {
        Item {
            cluster: cluster.into(),
            resource: resource.into(),
            namespace: object["metadata"]["namespace"]
                .as_str()
                .unwrap_or_default()
                .into(),
            name: object["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .into(),
            object,
        }
    }

    fn pod(name: &str, node: &str, created: &str, phase: &str) -> Value {
        json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "team-0", "creationTimestamp": created, "labels": {"app": "web", "tier": "front"}},
            "spec": {"nodeName": node, "containers": [{"name": "web", "image": "web:1"}]},
            "status": {"phase": phase, "podIP": "10.0.0.7", "containerStatuses": [
                {"name": "web", "ready": phase == "Running", "restartCount": 1, "state": if phase == "Running" { json!({"running": {}}) } else { json!({"waiting": {"reason": "ImagePullBackOff"}}) }}]}})
    }

    fn table_of(t: &Table, items: &[Item]) -> String {
        let rows: Vec<Vec<String>> = items.iter().map(|i| t.row(i, now(), None)).collect();
        align(Some(&t.header()), &rows)
    }

    #[test]
    fn pods_print_as_kubectl_prints_them_with_the_cluster_first() {
        let items = [
            item(
                "prod-eu",
                "pods",
                pod("web-1", "node-a", "2027-01-15T07:55:00Z", "Running"),
            ),
            item(
                "prod-us",
                "pods",
                pod("web-22", "node-b", "2027-01-13T08:00:00Z", "Pending"),
            ),
        ];
        let mut t = Table {
            columns: columns_for("pods", None),
            namespace: true,
            ..Default::default()
        };
        assert_eq!(
            table_of(&t, &items),
            "\
CLUSTER   NAMESPACE   NAME     READY   STATUS             RESTARTS   AGE
prod-eu   team-0      web-1    1/1     Running            1          5m
prod-us   team-0      web-22   0/1     ImagePullBackOff   1          2d
"
        );
        t.wide = true;
        t.namespace = false;
        t.label_columns = vec!["app".into()];
        assert_eq!(
            table_of(&t, &items[..1]),
            "\
CLUSTER   NAME    READY   STATUS    RESTARTS   AGE   IP         NODE     NOMINATED NODE   READINESS GATES   APP
prod-eu   web-1   1/1     Running   1          5m    10.0.0.7   node-a   <none>           <none>            web
"
        );
        t.wide = false;
        t.label_columns.clear();
        t.show_labels = true;
        assert!(
            table_of(&t, &items[..1])
                .lines()
                .nth(1)
                .unwrap()
                .ends_with("app=web,tier=front")
        );
    }

    #[test]
    fn deployments_services_and_nodes_have_their_columns() {
        let d = item(
            "c",
            "deployments.apps",
            json!({"kind": "Deployment", "metadata": {"name": "web", "namespace": "a", "creationTimestamp": "2027-01-15T07:00:00Z"},
            "spec": {"replicas": 3, "selector": {"matchLabels": {"app": "web"}}, "template": {"spec": {"containers": [{"name": "web", "image": "web:2"}]}}},
            "status": {"readyReplicas": 2, "updatedReplicas": 3, "availableReplicas": 2}}),
        );
        let t = Table {
            columns: columns_for("deployments.apps", None),
            wide: true,
            ..Default::default()
        };
        assert_eq!(
            table_of(&t, &[d]),
            "\
CLUSTER   NAME   READY   UP-TO-DATE   AVAILABLE   AGE   CONTAINERS   IMAGES   SELECTOR
c         web    2/3     3            2           60m   web          web:2    app=web
"
        );
        let s = item(
            "c",
            "services",
            json!({"kind": "Service", "metadata": {"name": "lb", "creationTimestamp": "2027-01-15T07:59:00Z"},
            "spec": {"type": "LoadBalancer", "clusterIP": "10.96.0.10", "ports": [{"port": 80, "nodePort": 30080, "protocol": "TCP"}, {"port": 53, "protocol": "UDP"}]},
            "status": {"loadBalancer": {}}}),
        );
        let t = Table {
            columns: columns_for("services", None),
            ..Default::default()
        };
        assert_eq!(
            table_of(&t, &[s]),
            "\
CLUSTER   NAME   TYPE           CLUSTER-IP   EXTERNAL-IP   PORT(S)               AGE
c         lb     LoadBalancer   10.96.0.10   <pending>     80:30080/TCP,53/UDP   60s
"
        );
        let n = item(
            "c",
            "nodes",
            json!({"kind": "Node", "metadata": {"name": "n1", "creationTimestamp": "2026-12-15T08:00:00Z", "labels": {"node-role.kubernetes.io/control-plane": ""}},
            "spec": {"unschedulable": true},
            "status": {"conditions": [{"type": "Ready", "status": "True"}], "nodeInfo": {"kubeletVersion": "v1.33.1"}}}),
        );
        let t = Table {
            columns: columns_for("nodes", None),
            ..Default::default()
        };
        assert_eq!(
            table_of(&t, &[n]),
            "\
CLUSTER   NAME   STATUS                     ROLES           AGE   VERSION
c         n1     Ready,SchedulingDisabled   control-plane   31d   v1.33.1
"
        );
    }

    #[test]
    fn the_other_built_in_types_have_kubectls_columns() {
        let created = "2027-01-15T07:00:00Z";
        let cases = [
            (
                "replicasets.apps",
                json!({"spec": {"replicas": 3}, "status": {"replicas": 3, "readyReplicas": 2}}),
                "CLUSTER   NAME   DESIRED   CURRENT   READY   AGE\nc         x      3         3         2       60m\n",
            ),
            (
                "statefulsets.apps",
                json!({"spec": {"replicas": 2}, "status": {"readyReplicas": 1}}),
                "CLUSTER   NAME   READY   AGE\nc         x      1/2     60m\n",
            ),
            (
                "daemonsets.apps",
                json!({"spec": {"template": {"spec": {"nodeSelector": {"os": "linux"}}}}, "status": {"desiredNumberScheduled": 3, "currentNumberScheduled": 3, "numberReady": 2, "updatedNumberScheduled": 3, "numberAvailable": 2}}),
                "CLUSTER   NAME   DESIRED   CURRENT   READY   UP-TO-DATE   AVAILABLE   NODE SELECTOR   AGE\nc         x      3         3         2       3            2           os=linux        60m\n",
            ),
            (
                "jobs.batch",
                json!({"spec": {"completions": 2}, "status": {"succeeded": 1, "startTime": "2027-01-15T07:50:00Z", "completionTime": "2027-01-15T07:52:30Z"}}),
                "CLUSTER   NAME   COMPLETIONS   DURATION   AGE\nc         x      1/2           2m30s      60m\n",
            ),
            (
                "cronjobs.batch",
                json!({"spec": {"schedule": "*/5 * * * *"}, "status": {"lastScheduleTime": "2027-01-15T07:55:00Z"}}),
                "CLUSTER   NAME   SCHEDULE      TIMEZONE   SUSPEND   ACTIVE   LAST SCHEDULE   AGE\nc         x      */5 * * * *   <none>     False     0        5m              60m\n",
            ),
            (
                "namespaces",
                json!({"status": {"phase": "Active"}}),
                "CLUSTER   NAME   STATUS   AGE\nc         x      Active   60m\n",
            ),
            (
                "configmaps",
                json!({"data": {"a": "1", "b": "2"}, "binaryData": {"c": "AA=="}}),
                "CLUSTER   NAME   DATA   AGE\nc         x      3      60m\n",
            ),
            (
                "secrets",
                json!({"type": "Opaque", "data": {"a": "MQ=="}}),
                "CLUSTER   NAME   TYPE     DATA   AGE\nc         x      Opaque   1      60m\n",
            ),
            (
                "persistentvolumeclaims",
                json!({"spec": {"volumeName": "pv-1", "storageClassName": "fast"}, "status": {"phase": "Bound", "capacity": {"storage": "10Gi"}, "accessModes": ["ReadWriteOnce"]}}),
                "CLUSTER   NAME   STATUS   VOLUME   CAPACITY   ACCESS MODES   STORAGECLASS   VOLUMEATTRIBUTESCLASS   AGE\nc         x      Bound    pv-1     10Gi       RWO            fast           <none>                  60m\n",
            ),
            (
                "widgets.example.com",
                json!({}),
                "CLUSTER   NAME   AGE\nc         x      60m\n",
            ),
        ];
        for (resource, mut object, want) in cases {
            object["metadata"] = json!({"name": "x", "creationTimestamp": created});
            let t = Table {
                columns: columns_for(resource, None),
                ..Default::default()
            };
            assert_eq!(
                table_of(&t, &[item("c", resource, object)]),
                want,
                "{resource}"
            );
        }
    }

    #[test]
    fn other_formats() {
        let i = item(
            "prod-eu",
            "deployments.apps",
            json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web", "namespace": "a"}}),
        );
        assert_eq!(i.qualified_name(), "prod-eu/deployment.apps/web");
        let p = item(
            "c",
            "pods",
            pod("p", "n", "2027-01-15T07:55:00Z", "Running"),
        );
        assert_eq!(p.qualified_name(), "c/pod/p");
        let l = list(std::slice::from_ref(&i));
        assert_eq!(l["kind"], "List");
        assert_eq!(
            l["items"][0]["metadata"]["annotations"][CLUSTER_ANNOTATION],
            "prod-eu"
        );
        assert!(
            to_yaml(&l).contains("fleetscope.io/cluster: prod-eu"),
            "{}",
            to_yaml(&l)
        );
        let Format::CustomColumns(custom) =
            parse_format("custom-columns=NAME:.metadata.name,NODE:.spec.nodeName,MISSING:.x")
                .unwrap()
        else {
            panic!()
        };
        let t = Table {
            custom: Some(custom),
            ..Default::default()
        };
        assert_eq!(
            table_of(&t, &[p]),
            "NAME   NODE   MISSING\np      n      <none>\n"
        );
        for bad in ["yml", "jsonpath", "custom-columns=NAME", "jsonpath={.a"] {
            assert!(parse_format(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn sorting_is_by_value_numbers_as_numbers() {
        let mut items: Vec<Item> = [("a", 10), ("b", 9), ("c", 100)]
            .iter()
            .map(|(n, r)| item("c", "x", json!({"metadata": {"name": n}, "r": r})))
            .collect();
        sort(&mut items, &Template::parse(".r").unwrap());
        let names: Vec<&str> = items.iter().map(|i| i.name.as_str()).collect();
        assert_eq!(names, ["b", "a", "c"]);
        sort(&mut items, &Template::parse("{.metadata.name}").unwrap());
        let names: Vec<&str> = items.iter().map(|i| i.name.as_str()).collect();
        assert_eq!(names, ["a", "b", "c"]);
    }
}
