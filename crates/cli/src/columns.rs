//! The columns `fleetscope get` prints per resource type, as kubectl prints them for
//! the built-in types (its printers in `pkg/printers/internalversion`), a custom
//! resource's `additionalPrinterColumns`, or NAME and AGE. AGE is computed when
//! printed, in kubectl's human duration.

use std::time::{Duration, SystemTime};

use serde_json::Value;

use super::jsonpath::{Template, text};

/// How one cell is computed from an object.
pub type Cell = Box<dyn Fn(&Value, SystemTime) -> String + Send + Sync>;

/// One column.
pub struct Column {
    /// Its header.
    pub header: String,
    /// Its cell.
    pub cell: Cell,
    /// Shown with `-o wide` only.
    pub wide: bool,
}

impl std::fmt::Debug for Column {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Column")
            .field("header", &self.header)
            .field("wide", &self.wide)
            .finish()
    }
}

fn col(
    header: &str,
    cell: impl Fn(&Value, SystemTime) -> String + Send + Sync + 'static,
) -> Column {
    Column {
        header: header.into(),
        cell: Box::new(cell),
        wide: false,
    }
}

fn wide(
    header: &str,
    cell: impl Fn(&Value, SystemTime) -> String + Send + Sync + 'static,
) -> Column {
    Column {
        wide: true,
        ..col(header, cell)
    }
}

/// The value at a path of keys.
fn at<'a>(v: &'a Value, path: &[&str]) -> &'a Value {
    path.iter().fold(v, |v, k| &v[*k])
}

fn s(v: &Value, path: &[&str]) -> String {
    match at(v, path) {
        Value::Null => String::new(),
        other => text(other),
    }
}

fn n(v: &Value, path: &[&str]) -> i64 {
    at(v, path).as_i64().unwrap_or(0)
}

fn or_none(text: String) -> String {
    if text.is_empty() {
        "<none>".into()
    } else {
        text
    }
}

fn items<'a>(v: &'a Value, path: &[&str]) -> &'a [Value] {
    at(v, path).as_array().map_or(&[], Vec::as_slice)
}

/// kubectl's human duration (`duration.HumanDuration`): `45s`, `3m20s`, `5h`, `3d4h`, `2y30d`.
pub fn human_duration(d: Duration) -> String {
    let secs = d.as_secs();
    let (m, h) = (secs / 60, secs / 3600);
    if secs < 120 {
        format!("{secs}s")
    } else if m < 10 {
        match secs % 60 {
            0 => format!("{m}m"),
            s => format!("{m}m{s}s"),
        }
    } else if m < 60 * 3 {
        format!("{m}m")
    } else if h < 8 {
        match m % 60 {
            0 => format!("{h}h"),
            mm => format!("{h}h{mm}m"),
        }
    } else if h < 48 {
        format!("{h}h")
    } else if h < 24 * 8 {
        match h % 24 {
            0 => format!("{}d", h / 24),
            hh => format!("{}d{hh}h", h / 24),
        }
    } else if h < 24 * 365 * 2 {
        format!("{}d", h / 24)
    } else if h < 24 * 365 * 8 {
        match (h / 24) % 365 {
            0 => format!("{}y", h / 24 / 365),
            dd => format!("{}y{dd}d", h / 24 / 365),
        }
    } else {
        format!("{}y", h / 24 / 365)
    }
}

fn time_of(text: &str) -> Option<SystemTime> {
    let ts: jiff::Timestamp = text.parse().ok()?;
    Some(SystemTime::from(ts))
}

/// The time since an RFC 3339 timestamp, as kubectl prints an age; `<unknown>` when
/// there is none.
pub fn age_of(timestamp: &Value, now: SystemTime) -> String {
    match timestamp.as_str().and_then(time_of) {
        Some(t) => human_duration(now.duration_since(t).unwrap_or_default()),
        None => "<unknown>".into(),
    }
}

fn age() -> Column {
    col("AGE", |o, now| {
        age_of(&o["metadata"]["creationTimestamp"], now)
    })
}

fn containers_and_images(template_spec: &'static [&'static str]) -> [Column; 2] {
    let names = move |o: &Value, _| {
        let mut path = template_spec.to_vec();
        path.push("containers");
        items(o, &path)
            .iter()
            .map(|c| s(c, &["name"]))
            .collect::<Vec<_>>()
            .join(",")
    };
    let images = move |o: &Value, _| {
        let mut path = template_spec.to_vec();
        path.push("containers");
        items(o, &path)
            .iter()
            .map(|c| s(c, &["image"]))
            .collect::<Vec<_>>()
            .join(",")
    };
    [wide("CONTAINERS", names), wide("IMAGES", images)]
}

fn selector(path: &'static [&'static str]) -> Column {
    wide("SELECTOR", move |o, _| {
        let sel = at(o, path);
        let labels = if sel.get("matchLabels").is_some() {
            &sel["matchLabels"]
        } else {
            sel
        };
        let mut parts: Vec<String> = labels
            .as_object()
            .map(|m| m.iter().map(|(k, v)| format!("{k}={}", text(v))).collect())
            .unwrap_or_default();
        for e in items(sel, &["matchExpressions"]) {
            let values: Vec<String> = items(e, &["values"]).iter().map(text).collect();
            parts.push(format!(
                "{} {} ({})",
                s(e, &["key"]),
                s(e, &["operator"]).to_lowercase(),
                values.join(",")
            ));
        }
        or_none(parts.join(","))
    })
}

/// kubectl's pod STATUS, READY and RESTARTS.
fn pod_status(pod: &Value) -> (String, String, String) {
    let mut reason = s(pod, &["status", "phase"]);
    if !s(pod, &["status", "reason"]).is_empty() {
        reason = s(pod, &["status", "reason"]);
    }
    let total = items(pod, &["spec", "containers"]).len();
    let mut ready = 0;
    let mut restarts = 0;
    let mut initializing = false;
    let inits = items(pod, &["spec", "initContainers"]).len();
    for (i, c) in items(pod, &["status", "initContainerStatuses"])
        .iter()
        .enumerate()
    {
        restarts += n(c, &["restartCount"]);
        let terminated = &c["state"]["terminated"];
        let waiting = &c["state"]["waiting"];
        if !terminated.is_null() && n(terminated, &["exitCode"]) == 0 {
            continue;
        }
        initializing = true;
        reason = if !terminated.is_null() {
            if !s(terminated, &["reason"]).is_empty() {
                format!("Init:{}", s(terminated, &["reason"]))
            } else if n(terminated, &["signal"]) != 0 {
                format!("Init:Signal:{}", n(terminated, &["signal"]))
            } else {
                format!("Init:ExitCode:{}", n(terminated, &["exitCode"]))
            }
        } else if !s(waiting, &["reason"]).is_empty()
            && s(waiting, &["reason"]) != "PodInitializing"
        {
            format!("Init:{}", s(waiting, &["reason"]))
        } else {
            format!("Init:{i}/{inits}")
        };
        break;
    }
    if !initializing {
        restarts = 0;
        let mut running = false;
        for c in items(pod, &["status", "containerStatuses"]).iter().rev() {
            restarts += n(c, &["restartCount"]);
            let terminated = &c["state"]["terminated"];
            let waiting = &c["state"]["waiting"];
            if !s(waiting, &["reason"]).is_empty() {
                reason = s(waiting, &["reason"]);
            } else if !s(terminated, &["reason"]).is_empty() {
                reason = s(terminated, &["reason"]);
            } else if !terminated.is_null() {
                reason = if n(terminated, &["signal"]) != 0 {
                    format!("Signal:{}", n(terminated, &["signal"]))
                } else {
                    format!("ExitCode:{}", n(terminated, &["exitCode"]))
                };
            } else if c["ready"] == true && !c["state"]["running"].is_null() {
                running = true;
                ready += 1;
            }
        }
        if reason == "Completed" && running {
            let pod_ready = items(pod, &["status", "conditions"])
                .iter()
                .any(|c| c["type"] == "Ready" && c["status"] == "True");
            reason = if pod_ready { "Running" } else { "NotReady" }.into();
        }
    }
    if !pod["metadata"]["deletionTimestamp"].is_null() {
        reason = if s(pod, &["status", "reason"]) == "NodeLost" {
            "Unknown".into()
        } else {
            "Terminating".into()
        };
    }
    (format!("{ready}/{total}"), reason, restarts.to_string())
}

fn pods() -> Vec<Column> {
    vec![
        col("READY", |o, _| pod_status(o).0),
        col("STATUS", |o, _| pod_status(o).1),
        col("RESTARTS", |o, _| pod_status(o).2),
        age(),
        wide("IP", |o, _| or_none(s(o, &["status", "podIP"]))),
        wide("NODE", |o, _| or_none(s(o, &["spec", "nodeName"]))),
        wide("NOMINATED NODE", |o, _| {
            or_none(s(o, &["status", "nominatedNodeName"]))
        }),
        wide("READINESS GATES", |o, _| {
            let gates = items(o, &["spec", "readinessGates"]);
            if gates.is_empty() {
                return "<none>".into();
            }
            let ready = gates
                .iter()
                .filter(|g| {
                    items(o, &["status", "conditions"])
                        .iter()
                        .any(|c| c["type"] == g["conditionType"] && c["status"] == "True")
                })
                .count();
            format!("{ready}/{}", gates.len())
        }),
    ]
}

fn ports(o: &Value) -> String {
    let ports: Vec<String> = items(o, &["spec", "ports"])
        .iter()
        .map(|p| {
            let proto = s(p, &["protocol"]);
            let proto = if proto.is_empty() {
                "TCP".into()
            } else {
                proto
            };
            match n(p, &["nodePort"]) {
                0 => format!("{}/{proto}", n(p, &["port"])),
                node => format!("{}:{node}/{proto}", n(p, &["port"])),
            }
        })
        .collect();
    or_none(ports.join(","))
}

fn external_ip(o: &Value) -> String {
    let mut ips: Vec<String> = items(o, &["spec", "externalIPs"])
        .iter()
        .map(text)
        .collect();
    match s(o, &["spec", "type"]).as_str() {
        "LoadBalancer" => {
            ips.extend(
                items(o, &["status", "loadBalancer", "ingress"])
                    .iter()
                    .map(|i| {
                        let ip = s(i, &["ip"]);
                        if ip.is_empty() {
                            s(i, &["hostname"])
                        } else {
                            ip
                        }
                    }),
            );
            if ips.is_empty() {
                "<pending>".into()
            } else {
                ips.join(",")
            }
        }
        "ExternalName" => s(o, &["spec", "externalName"]),
        _ => or_none(ips.join(",")),
    }
}

fn node_roles(o: &Value) -> String {
    let roles: Vec<String> = o["metadata"]["labels"]
        .as_object()
        .map(|l| {
            l.iter()
                .filter_map(|(k, v)| {
                    k.strip_prefix("node-role.kubernetes.io/")
                        .map(str::to_string)
                        .or_else(|| (k == "kubernetes.io/role").then(|| text(v)))
                })
                .filter(|r| !r.is_empty())
                .collect()
        })
        .unwrap_or_default();
    or_none(roles.join(","))
}

fn node_status(o: &Value) -> String {
    let mut status = match items(o, &["status", "conditions"])
        .iter()
        .find(|c| c["type"] == "Ready")
    {
        Some(c) if c["status"] == "True" => "Ready".to_string(),
        _ => "NotReady".to_string(),
    };
    if o["spec"]["unschedulable"] == true {
        status.push_str(",SchedulingDisabled");
    }
    status
}

fn node_address(o: &Value, kind: &str) -> String {
    or_none(
        items(o, &["status", "addresses"])
            .iter()
            .find(|a| a["type"] == kind)
            .map(|a| s(a, &["address"]))
            .unwrap_or_default(),
    )
}

fn count_of(o: &Value, key: &str) -> String {
    let data = o[key].as_object().map_or(0, |m| m.len());
    let binary = if key == "data" {
        o["binaryData"].as_object().map_or(0, |m| m.len())
    } else {
        0
    };
    (data + binary).to_string()
}

fn job_duration(o: &Value, now: SystemTime) -> String {
    let Some(start) = o["status"]["startTime"].as_str().and_then(time_of) else {
        return String::new();
    };
    let end = o["status"]["completionTime"]
        .as_str()
        .and_then(time_of)
        .unwrap_or(now);
    human_duration(end.duration_since(start).unwrap_or_default())
}

/// The columns of a built-in type, by canonical name (`pods`, `deployments.apps`);
/// `None` for any other type.
///
/// (Long for a reason: a table, one arm per type, each its columns as kubectl's
/// printers give them.)
pub fn builtin(resource: &str) -> Option<Vec<Column>> {
    const POD_TEMPLATE: &[&str] = &["spec", "template", "spec"];
    let columns = match resource {
        "pods" => pods(),
        "deployments.apps" => {
            let mut c = vec![
                col("READY", |o, _| {
                    format!(
                        "{}/{}",
                        n(o, &["status", "readyReplicas"]),
                        n(o, &["spec", "replicas"])
                    )
                }),
                col("UP-TO-DATE", |o, _| {
                    n(o, &["status", "updatedReplicas"]).to_string()
                }),
                col("AVAILABLE", |o, _| {
                    n(o, &["status", "availableReplicas"]).to_string()
                }),
                age(),
            ];
            c.extend(containers_and_images(POD_TEMPLATE));
            c.push(selector(&["spec", "selector"]));
            c
        }
        "replicasets.apps" => {
            let mut c = vec![
                col("DESIRED", |o, _| n(o, &["spec", "replicas"]).to_string()),
                col("CURRENT", |o, _| n(o, &["status", "replicas"]).to_string()),
                col("READY", |o, _| {
                    n(o, &["status", "readyReplicas"]).to_string()
                }),
                age(),
            ];
            c.extend(containers_and_images(POD_TEMPLATE));
            c.push(selector(&["spec", "selector"]));
            c
        }
        "statefulsets.apps" => {
            let mut c = vec![
                col("READY", |o, _| {
                    format!(
                        "{}/{}",
                        n(o, &["status", "readyReplicas"]),
                        n(o, &["spec", "replicas"])
                    )
                }),
                age(),
            ];
            c.extend(containers_and_images(POD_TEMPLATE));
            c
        }
        "daemonsets.apps" => {
            let mut c = vec![
                col("DESIRED", |o, _| {
                    n(o, &["status", "desiredNumberScheduled"]).to_string()
                }),
                col("CURRENT", |o, _| {
                    n(o, &["status", "currentNumberScheduled"]).to_string()
                }),
                col("READY", |o, _| n(o, &["status", "numberReady"]).to_string()),
                col("UP-TO-DATE", |o, _| {
                    n(o, &["status", "updatedNumberScheduled"]).to_string()
                }),
                col("AVAILABLE", |o, _| {
                    n(o, &["status", "numberAvailable"]).to_string()
                }),
                col("NODE SELECTOR", |o, _| {
                    let sel: Vec<String> = o["spec"]["template"]["spec"]["nodeSelector"]
                        .as_object()
                        .map(|m| m.iter().map(|(k, v)| format!("{k}={}", text(v))).collect())
                        .unwrap_or_default();
                    or_none(sel.join(","))
                }),
                age(),
            ];
            c.extend(containers_and_images(POD_TEMPLATE));
            c.push(selector(&["spec", "selector"]));
            c
        }
        "jobs.batch" => {
            let mut c = vec![
                col("COMPLETIONS", |o, _| {
                    let want = match at(o, &["spec", "completions"]) {
                        Value::Null => "1".to_string(),
                        v => text(v),
                    };
                    format!("{}/{want}", n(o, &["status", "succeeded"]))
                }),
                col("DURATION", job_duration),
                age(),
            ];
            c.extend(containers_and_images(POD_TEMPLATE));
            c.push(selector(&["spec", "selector"]));
            c
        }
        "cronjobs.batch" => {
            let mut c = vec![
                col("SCHEDULE", |o, _| s(o, &["spec", "schedule"])),
                col("TIMEZONE", |o, _| or_none(s(o, &["spec", "timeZone"]))),
                col("SUSPEND", |o, _| {
                    (o["spec"]["suspend"] == true)
                        .to_string()
                        .replace("true", "True")
                        .replace("false", "False")
                }),
                col("ACTIVE", |o, _| {
                    items(o, &["status", "active"]).len().to_string()
                }),
                col("LAST SCHEDULE", |o, now| {
                    match at(o, &["status", "lastScheduleTime"]) {
                        Value::Null => "<none>".into(),
                        t => age_of(t, now),
                    }
                }),
                age(),
            ];
            c.extend(containers_and_images(&[
                "spec",
                "jobTemplate",
                "spec",
                "template",
                "spec",
            ]));
            c.push(selector(&["spec", "jobTemplate", "spec", "selector"]));
            c
        }
        "services" => vec![
            col("TYPE", |o, _| {
                let t = s(o, &["spec", "type"]);
                if t.is_empty() { "ClusterIP".into() } else { t }
            }),
            col("CLUSTER-IP", |o, _| or_none(s(o, &["spec", "clusterIP"]))),
            col("EXTERNAL-IP", |o, _| external_ip(o)),
            col("PORT(S)", |o, _| ports(o)),
            age(),
            selector(&["spec", "selector"]),
        ],
        "nodes" => vec![
            col("STATUS", |o, _| node_status(o)),
            col("ROLES", |o, _| node_roles(o)),
            age(),
            col("VERSION", |o, _| {
                s(o, &["status", "nodeInfo", "kubeletVersion"])
            }),
            wide("INTERNAL-IP", |o, _| node_address(o, "InternalIP")),
            wide("EXTERNAL-IP", |o, _| node_address(o, "ExternalIP")),
            wide("OS-IMAGE", |o, _| {
                or_none(s(o, &["status", "nodeInfo", "osImage"]))
            }),
            wide("KERNEL-VERSION", |o, _| {
                or_none(s(o, &["status", "nodeInfo", "kernelVersion"]))
            }),
            wide("CONTAINER-RUNTIME", |o, _| {
                or_none(s(o, &["status", "nodeInfo", "containerRuntimeVersion"]))
            }),
        ],
        "namespaces" => vec![col("STATUS", |o, _| s(o, &["status", "phase"])), age()],
        "configmaps" => vec![col("DATA", |o, _| count_of(o, "data")), age()],
        "secrets" => vec![
            col("TYPE", |o, _| s(o, &["type"])),
            col("DATA", |o, _| count_of(o, "data")),
            age(),
        ],
        "serviceaccounts" => vec![
            col("SECRETS", |o, _| items(o, &["secrets"]).len().to_string()),
            age(),
        ],
        "persistentvolumeclaims" => vec![
            col("STATUS", |o, _| s(o, &["status", "phase"])),
            col("VOLUME", |o, _| s(o, &["spec", "volumeName"])),
            col("CAPACITY", |o, _| s(o, &["status", "capacity", "storage"])),
            col("ACCESS MODES", |o, _| {
                access_modes(items(o, &["status", "accessModes"]))
            }),
            col("STORAGECLASS", |o, _| {
                or_none(s(o, &["spec", "storageClassName"]))
            }),
            col("VOLUMEATTRIBUTESCLASS", |o, _| {
                or_none(s(o, &["spec", "volumeAttributesClassName"]))
            }),
            age(),
            wide("VOLUMEMODE", |o, _| s(o, &["spec", "volumeMode"])),
        ],
        "ingresses.networking.k8s.io" => vec![
            col("CLASS", |o, _| or_none(s(o, &["spec", "ingressClassName"]))),
            col("HOSTS", |o, _| {
                let hosts: Vec<String> = items(o, &["spec", "rules"])
                    .iter()
                    .map(|r| s(r, &["host"]))
                    .filter(|h| !h.is_empty())
                    .collect();
                if hosts.is_empty() {
                    "*".into()
                } else {
                    hosts.join(",")
                }
            }),
            col("ADDRESS", |o, _| {
                let a: Vec<String> = items(o, &["status", "loadBalancer", "ingress"])
                    .iter()
                    .map(|i| {
                        let ip = s(i, &["ip"]);
                        if ip.is_empty() {
                            s(i, &["hostname"])
                        } else {
                            ip
                        }
                    })
                    .collect();
                a.join(",")
            }),
            col("PORTS", |o, _| {
                if items(o, &["spec", "tls"]).is_empty() {
                    "80".into()
                } else {
                    "80, 443".into()
                }
            }),
            age(),
        ],
        "customresourcedefinitions.apiextensions.k8s.io" => vec![col("CREATED AT", |o, _| {
            s(o, &["metadata", "creationTimestamp"])
        })],
        _ => return None,
    };
    Some(columns)
}

fn access_modes(modes: &[Value]) -> String {
    let short: Vec<&str> = modes
        .iter()
        .filter_map(|m| match m.as_str()? {
            "ReadWriteOnce" => Some("RWO"),
            "ReadOnlyMany" => Some("ROX"),
            "ReadWriteMany" => Some("RWX"),
            "ReadWriteOncePod" => Some("RWOP"),
            _ => None,
        })
        .collect();
    short.join(",")
}

/// A custom resource's columns from its CRD's `additionalPrinterColumns` for
/// `version` (priority 0 shown always, others with `-o wide`); `None` when the CRD
/// declares none.
pub fn from_crd(crd: &Value, version: &str) -> Option<Vec<Column>> {
    let v = items(crd, &["spec", "versions"])
        .iter()
        .find(|v| v["name"] == version)?;
    let declared = items(v, &["additionalPrinterColumns"]);
    if declared.is_empty() {
        return None;
    }
    let mut columns = Vec::new();
    for c in declared {
        let Ok(template) = Template::parse(&s(c, &["jsonPath"])) else {
            continue;
        };
        let date = c["type"] == "date";
        let cell = move |o: &Value, now: SystemTime| {
            let values = template.values(o);
            match values.first() {
                None => "<none>".into(),
                Some(v) if date => age_of(v, now),
                Some(_) => values.iter().map(|v| text(v)).collect::<Vec<_>>().join(","),
            }
        };
        columns.push(Column {
            header: s(c, &["name"]).to_uppercase(),
            cell: Box::new(cell),
            wide: n(c, &["priority"]) > 0,
        });
    }
    // kubectl adds AGE when the CRD's columns do not cover it.
    if !columns.iter().any(|c| c.header == "AGE") {
        columns.push(age());
    }
    Some(columns)
}

/// NAME and AGE only, for any other type.
pub fn generic() -> Vec<Column> {
    vec![age()]
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn ages_read_as_kubectl_prints_them() {
        let d = Duration::from_secs;
        for (secs, want) in [
            (0, "0s"),
            (45, "45s"),
            (119, "119s"),
            (200, "3m20s"),
            (540, "9m"),
            (3000, "50m"),
            (4 * 3600 + 5 * 60, "4h5m"),
            (20 * 3600, "20h"),
            (3 * 86400 + 4 * 3600, "3d4h"),
            (10 * 86400, "10d"),
            (3 * 365 * 86400 + 30 * 86400, "3y30d"),
            (9 * 365 * 86400, "9y"),
        ] {
            assert_eq!(human_duration(d(secs)), want, "{secs}");
        }
    }

    fn status_of(pod: Value) -> (String, String, String) {
        pod_status(&pod)
    }

    #[test]
    fn pod_status_follows_kubectl() {
        let running = json!({
            "spec": {"containers": [{"name": "a"}, {"name": "b"}]},
            "status": {"phase": "Running", "containerStatuses": [
                {"name": "a", "ready": true, "restartCount": 2, "state": {"running": {}}},
                {"name": "b", "ready": false, "restartCount": 1, "state": {"waiting": {"reason": "CrashLoopBackOff"}}},
            ]}
        });
        assert_eq!(
            status_of(running),
            ("1/2".into(), "CrashLoopBackOff".into(), "3".into())
        );
        let init = json!({
            "spec": {"initContainers": [{"name": "i1"}, {"name": "i2"}], "containers": [{"name": "a"}]},
            "status": {"phase": "Pending", "initContainerStatuses": [
                {"name": "i1", "restartCount": 0, "state": {"terminated": {"exitCode": 0}}},
                {"name": "i2", "restartCount": 0, "state": {"running": {}}},
            ]}
        });
        assert_eq!(status_of(init).1, "Init:1/2");
        let init_failed = json!({
            "spec": {"initContainers": [{"name": "i1"}], "containers": [{"name": "a"}]},
            "status": {"phase": "Pending", "initContainerStatuses": [
                {"name": "i1", "restartCount": 4, "state": {"terminated": {"exitCode": 1, "reason": "Error"}}},
            ]}
        });
        assert_eq!(
            status_of(init_failed),
            ("0/1".into(), "Init:Error".into(), "4".into())
        );
        let terminating = json!({
            "metadata": {"deletionTimestamp": "2026-01-01T00:00:00Z"},
            "spec": {"containers": [{"name": "a"}]},
            "status": {"phase": "Running", "containerStatuses": [
                {"name": "a", "ready": true, "restartCount": 0, "state": {"running": {}}}]}
        });
        assert_eq!(
            status_of(terminating),
            ("1/1".into(), "Terminating".into(), "0".into())
        );
        let evicted = json!({"spec": {"containers": [{"name": "a"}]}, "status": {"phase": "Failed", "reason": "Evicted"}});
        assert_eq!(status_of(evicted).1, "Evicted");
        let signal = json!({
            "spec": {"containers": [{"name": "a"}]},
            "status": {"phase": "Failed", "containerStatuses": [
                {"name": "a", "restartCount": 0, "state": {"terminated": {"exitCode": 137, "signal": 9}}}]}
        });
        assert_eq!(status_of(signal).1, "Signal:9");
    }

    #[test]
    fn crd_columns_come_from_the_version_printed() {
        let crd = json!({"spec": {"versions": [{"name": "v1", "additionalPrinterColumns": [
            {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
            {"name": "Detail", "type": "string", "jsonPath": ".status.detail", "priority": 1},
            {"name": "Started", "type": "date", "jsonPath": ".status.started"},
        ]}]}});
        let cols = from_crd(&crd, "v1").unwrap();
        let headers: Vec<&str> = cols.iter().map(|c| c.header.as_str()).collect();
        assert_eq!(headers, ["PHASE", "DETAIL", "STARTED", "AGE"]);
        assert!(cols[1].wide && !cols[0].wide);
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let o = json!({"status": {"phase": "Ready", "started": "2025-01-15T08:00:00Z"}});
        assert_eq!((cols[0].cell)(&o, now), "Ready");
        assert_eq!((cols[1].cell)(&o, now), "<none>");
        assert_eq!((cols[2].cell)(&o, now), "2y");
        assert!(from_crd(&crd, "v2").is_none());
    }
}
