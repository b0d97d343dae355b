//! The controllers a real cluster runs beside its API server (kube-controller-manager's
//! and, for pods, what the scheduler and kubelet report), so what kubectl does to a
//! simulated cluster has the effects it has on a real one:
//!
//! - namespace: deleting a namespace deletes everything in it;
//! - deployment: a Deployment gets a ReplicaSet per pod template (named by the
//!   template's hash, as `pod-template-hash`), the current one scaled to
//!   `spec.replicas` and older ones to zero, and its status (replicas, updated, ready,
//!   available, `observedGeneration`, the Available and Progressing conditions) so
//!   `kubectl rollout status` finishes;
//! - replicaset: a ReplicaSet gets `spec.replicas` pods from its template, scheduled
//!   on a node and running (ready at once), and its status;
//! - garbage collector: deleting a Deployment deletes its ReplicaSets, deleting a
//!   ReplicaSet its pods (kubectl's default background propagation);
//! - each records Events (`ScalingReplicaSet`, `SuccessfulCreate`, `SuccessfulDelete`)
//!   when the cluster serves them.
//!
//! They follow the store's change stream and reconcile the object a change names (a
//! full pass at start and after falling behind), writing only what differs, so they
//! settle. Deployments a [`crate::Workload`] made are its own and left alone.

use std::sync::Arc;

use rand::Rng;
use serde_json::{Map, Value, json};
use tokio::sync::broadcast::error::RecvError;
use tokio_util::sync::CancellationToken;

use crate::cluster::Cluster;
use crate::store::{Change, ChangeKind, ReadAt, StoredObject, now_rfc3339};

const DEPLOYMENTS: &str = "deployments.apps";
const REPLICASETS: &str = "replicasets.apps";
const PODS: &str = "pods";
const EVENTS: &str = "events";
const HASH_LABEL: &str = "pod-template-hash";
const REVISION: &str = "deployment.kubernetes.io/revision";

/// Runs the controllers of `cluster` until `cancel`.
pub async fn run_controllers(cluster: Cluster, cancel: CancellationToken) {
    let mut changes = cluster.store.changes();
    resync(&cluster);
    loop {
        let change = tokio::select! {
            _ = cancel.cancelled() => return,
            change = changes.recv() => change,
        };
        match change {
            Ok(change) => handle(&cluster, &change),
            Err(RecvError::Lagged(_)) => resync(&cluster),
            Err(RecvError::Closed) => return,
        }
    }
}

/// Reconciles every Deployment and ReplicaSet.
fn resync(cluster: &Cluster) {
    for rs in objects(cluster, REPLICASETS, "") {
        reconcile_replica_set(cluster, &rs.namespace, &rs.name);
    }
    for d in objects(cluster, DEPLOYMENTS, "") {
        reconcile_deployment(cluster, &d.namespace, &d.name);
    }
}

fn handle(cluster: &Cluster, change: &Change) {
    let o = &change.object;
    match (change.def.id().as_str(), change.kind) {
        ("namespaces", ChangeKind::Deleted) => delete_namespace_contents(cluster, &o.name),
        (DEPLOYMENTS, ChangeKind::Deleted) => collect_garbage(cluster, REPLICASETS, o),
        (DEPLOYMENTS, _) => reconcile_deployment(cluster, &o.namespace, &o.name),
        (REPLICASETS, kind) => {
            if kind == ChangeKind::Deleted {
                collect_garbage(cluster, PODS, o);
            } else {
                reconcile_replica_set(cluster, &o.namespace, &o.name);
            }
            if let Some(owner) = controller_of(&o.value(), "Deployment") {
                reconcile_deployment(cluster, &o.namespace, &owner);
            }
        }
        (PODS, _) => {
            if let Some(owner) = controller_of(&o.value(), "ReplicaSet") {
                reconcile_replica_set(cluster, &o.namespace, &owner);
            }
        }
        _ => {}
    }
}

/// The objects of a type, in one namespace (or all when empty).
fn objects(cluster: &Cluster, id: &str, namespace: &str) -> Vec<Arc<StoredObject>> {
    let Ok(snapshot) = cluster.store.snapshot(id, ReadAt::Latest) else {
        return Vec::new();
    };
    snapshot
        .objects
        .values()
        .filter(|o| namespace.is_empty() || o.namespace == namespace)
        .cloned()
        .collect()
}

/// The name of the object's controlling owner of `kind`.
fn controller_of(object: &Value, kind: &str) -> Option<String> {
    object["metadata"]["ownerReferences"]
        .as_array()?
        .iter()
        .find(|r| r["controller"] == json!(true) && r["kind"] == kind)
        .and_then(|r| r["name"].as_str())
        .map(str::to_string)
}

/// Whether `object` is controlled by the object with `uid`.
fn controlled_by(object: &Value, uid: &str) -> bool {
    object["metadata"]["ownerReferences"]
        .as_array()
        .is_some_and(|refs| {
            refs.iter()
                .any(|r| r["controller"] == json!(true) && r["uid"] == uid)
        })
}

fn owner_reference(kind: &str, object: &Value) -> Value {
    json!([{
        "apiVersion": "apps/v1",
        "kind": kind,
        "name": object["metadata"]["name"],
        "uid": object["metadata"]["uid"],
        "controller": true,
        "blockOwnerDeletion": true,
    }])
}

fn delete_namespace_contents(cluster: &Cluster, namespace: &str) {
    for def in cluster.store.defs().iter().filter(|d| d.namespaced) {
        for o in objects(cluster, &def.id(), namespace) {
            let _ = cluster.store.delete(&def.id(), &o.namespace, &o.name);
        }
    }
}

/// Deletes the objects of type `id` controlled by the deleted `owner`.
fn collect_garbage(cluster: &Cluster, id: &str, owner: &StoredObject) {
    for o in objects(cluster, id, &owner.namespace) {
        if controlled_by(&o.value(), &owner.uid) {
            let _ = cluster.store.delete(id, &o.namespace, &o.name);
        }
    }
}

/// The pod template's hash, as the deployment controller names its ReplicaSets: FNV-1a
/// (32 bits) of the template, its decimal digits in Kubernetes' safe alphabet.
fn template_hash(template: &Value) -> String {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let mut hash: u32 = 0x811c_9dc5;
    for b in template.to_string().bytes() {
        hash ^= u32::from(b);
        hash = hash.wrapping_mul(0x0100_0193);
    }
    hash.to_string()
        .bytes()
        .map(|d| ALPHABET[usize::from(d) % ALPHABET.len()] as char)
        .collect()
}

fn random_suffix() -> String {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let mut rng = rand::rng();
    (0..5)
        .map(|_| ALPHABET[rng.random_range(0..ALPHABET.len())] as char)
        .collect()
}

fn replicas(object: &Value) -> i64 {
    object["spec"]["replicas"].as_i64().unwrap_or(1).max(0)
}

fn status_count(object: &Value, field: &str) -> i64 {
    object["status"][field].as_i64().unwrap_or(0)
}

/// Records an Event about `object` when the cluster serves Events.
fn record(
    cluster: &Cluster,
    object: &Value,
    kind: &str,
    component: &str,
    reason: &str,
    message: String,
) {
    if cluster.store.def(EVENTS).is_none() {
        return;
    }
    let meta = &object["metadata"];
    let Some(namespace) = meta["namespace"].as_str() else {
        return;
    };
    let now = now_rfc3339();
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let api_version = if kind == "Pod" { "v1" } else { "apps/v1" };
    let _ = cluster.store.create(
        EVENTS,
        Some(namespace),
        json!({
            "metadata": {"name": format!("{}.{nanos:x}", meta["name"].as_str().unwrap_or_default())},
            "involvedObject": {
                "apiVersion": api_version,
                "kind": kind,
                "namespace": namespace,
                "name": meta["name"],
                "uid": meta["uid"],
                "resourceVersion": meta["resourceVersion"],
            },
            "reason": reason,
            "message": message,
            "source": {"component": component},
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
            "type": "Normal",
            "reportingComponent": component,
            "reportingInstance": "",
        }),
    );
}

/// Writes `object` with `status` unless its status already is that and nothing else
/// changed (conditions compared without their times, which are kept from the stored
/// ones).
fn write_status(cluster: &Cluster, id: &str, mut object: Value, mut status: Value, changed: bool) {
    let old = object["status"].clone();
    if let (Some(new), Some(old)) = (
        status["conditions"].as_array_mut(),
        old["conditions"].as_array(),
    ) {
        for c in new.iter_mut() {
            if let Some(o) = old.iter().find(|o| {
                o["type"] == c["type"] && o["status"] == c["status"] && o["reason"] == c["reason"]
            }) {
                for time in ["lastUpdateTime", "lastTransitionTime"] {
                    if !o[time].is_null() {
                        c[time] = o[time].clone();
                    }
                }
            }
        }
    }
    if status == old && !changed {
        return;
    }
    let (namespace, name) = (
        object["metadata"]["namespace"]
            .as_str()
            .unwrap_or_default()
            .to_string(),
        object["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string(),
    );
    object["status"] = status;
    // A conflict means the object changed meanwhile: that change reconciles it again.
    let _ = cluster.store.update(id, &namespace, &name, object);
}

fn reconcile_deployment(cluster: &Cluster, namespace: &str, name: &str) {
    let Some(stored) = cluster.store.get(DEPLOYMENTS, namespace, name) else {
        return;
    };
    if cluster
        .workload_deployments
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .contains(&stored.uid)
    {
        return;
    }
    let deployment = stored.value();
    let template = deployment["spec"]["template"].clone();
    if !template.is_object() {
        return;
    }
    let want = replicas(&deployment);
    let hash = template_hash(&template);
    let current_name = format!("{name}-{hash}");
    let owned: Vec<Value> = objects(cluster, REPLICASETS, namespace)
        .iter()
        .map(|o| o.value())
        .filter(|rs| controlled_by(rs, &stored.uid))
        .collect();
    let revision_of = |rs: &Value| {
        rs["metadata"]["annotations"][REVISION]
            .as_str()
            .and_then(|r| r.parse::<u64>().ok())
            .unwrap_or(0)
    };
    let current = owned
        .iter()
        .find(|rs| rs["metadata"]["name"] == current_name.as_str());
    let revision = match current {
        Some(rs) => revision_of(rs),
        None => owned.iter().map(revision_of).max().unwrap_or(0) + 1,
    };
    match current {
        None => create_replica_set(
            cluster,
            &deployment,
            namespace,
            (&current_name, &hash),
            revision,
            want,
        ),
        Some(rs) if replicas(rs) != want => {
            scale(cluster, &deployment, rs, want);
        }
        Some(_) => {}
    }
    for rs in owned
        .iter()
        .filter(|rs| rs["metadata"]["name"] != current_name.as_str())
    {
        if replicas(rs) != 0 {
            scale(cluster, &deployment, rs, 0);
        }
    }

    // The status, from the ReplicaSets as they are now.
    let owned: Vec<Value> = objects(cluster, REPLICASETS, namespace)
        .iter()
        .map(|o| o.value())
        .filter(|rs| controlled_by(rs, &stored.uid))
        .collect();
    let status = deployment_status(&deployment, &owned, &current_name, want);
    let Some(latest) = cluster.store.get(DEPLOYMENTS, namespace, name) else {
        return;
    };
    let mut latest = latest.value();
    let revised = latest["metadata"]["annotations"][REVISION] != revision.to_string().as_str();
    if revised {
        if !latest["metadata"]["annotations"].is_object() {
            latest["metadata"]["annotations"] = json!({});
        }
        latest["metadata"]["annotations"][REVISION] = json!(revision.to_string());
    }
    write_status(cluster, DEPLOYMENTS, latest, Value::Object(status), revised);
}

/// Creates the ReplicaSet of a Deployment's current template (named `current_name`,
/// labelled with its template `hash`), at `revision` with `want` replicas, and
/// records the event the deployment controller does.
fn create_replica_set(
    cluster: &Cluster,
    deployment: &Value,
    namespace: &str,
    (current_name, hash): (&str, &str),
    revision: u64,
    want: i64,
) {
    let template = &deployment["spec"]["template"];
    let mut labels = template["metadata"]["labels"].clone();
    if !labels.is_object() {
        labels = json!({});
    }
    labels[HASH_LABEL] = json!(hash);
    let mut selector = deployment["spec"]["selector"].clone();
    if !selector.is_object() {
        selector = json!({});
    }
    selector["matchLabels"][HASH_LABEL] = json!(hash);
    let mut rs_template = template.clone();
    rs_template["metadata"]["labels"] = labels.clone();
    let created = cluster.store.create(
        REPLICASETS,
        Some(namespace),
        json!({
            "metadata": {
                "name": current_name,
                "labels": labels,
                "annotations": {
                    REVISION: revision.to_string(),
                    "deployment.kubernetes.io/desired-replicas": want.to_string(),
                },
                "ownerReferences": owner_reference("Deployment", deployment),
            },
            "spec": {"replicas": want, "selector": selector, "template": rs_template},
        }),
    );
    if created.is_ok() {
        scaling(
            cluster,
            deployment,
            format!("Scaled up replica set {current_name} to {want}"),
        );
    }
}

/// A Deployment's status from its ReplicaSets as they are now (`owned`), the one of
/// its current template named `current_name`, `want` replicas wanted: the counts,
/// and the `Available` and `Progressing` conditions.
fn deployment_status(
    deployment: &Value,
    owned: &[Value],
    current_name: &str,
    want: i64,
) -> Map<String, Value> {
    let sum = |field: &str| owned.iter().map(|rs| status_count(rs, field)).sum::<i64>();
    let (total, ready, available) = (
        sum("replicas"),
        sum("readyReplicas"),
        sum("availableReplicas"),
    );
    let updated = owned
        .iter()
        .find(|rs| rs["metadata"]["name"] == current_name)
        .map_or(0, |rs| status_count(rs, "replicas"));
    let now = now_rfc3339();
    let complete = updated == want && total == want && available == want;
    let mut status = Map::new();
    status.insert(
        "observedGeneration".into(),
        deployment["metadata"]["generation"].clone(),
    );
    for (key, value) in [
        ("replicas", total),
        ("updatedReplicas", updated),
        ("readyReplicas", ready),
        ("availableReplicas", available),
        ("unavailableReplicas", (want - available).max(0)),
    ] {
        if value != 0 {
            status.insert(key.into(), json!(value));
        }
    }
    let (available_status, available_reason, available_message) = if available >= want {
        (
            "True",
            "MinimumReplicasAvailable",
            "Deployment has minimum availability.",
        )
    } else {
        (
            "False",
            "MinimumReplicasUnavailable",
            "Deployment does not have minimum availability.",
        )
    };
    let (progress_reason, progress_message) = if complete {
        (
            "NewReplicaSetAvailable",
            format!("ReplicaSet \"{current_name}\" has successfully progressed."),
        )
    } else {
        (
            "ReplicaSetUpdated",
            format!("ReplicaSet \"{current_name}\" is progressing."),
        )
    };
    status.insert(
        "conditions".into(),
        json!([
            {"type": "Available", "status": available_status, "lastUpdateTime": now, "lastTransitionTime": now,
             "reason": available_reason, "message": available_message},
            {"type": "Progressing", "status": "True", "lastUpdateTime": now, "lastTransitionTime": now,
             "reason": progress_reason, "message": progress_message},
        ]),
    );
    status
}

/// Records the event the deployment controller makes when it scales a ReplicaSet.
fn scaling(cluster: &Cluster, deployment: &Value, message: String) {
    record(
        cluster,
        deployment,
        "Deployment",
        "deployment-controller",
        "ScalingReplicaSet",
        message,
    );
}

fn scale(cluster: &Cluster, deployment: &Value, rs: &Value, to: i64) {
    let (namespace, name) = (
        rs["metadata"]["namespace"].as_str().unwrap_or_default(),
        rs["metadata"]["name"].as_str().unwrap_or_default(),
    );
    let patch = json!({
        "metadata": {"annotations": {"deployment.kubernetes.io/desired-replicas": to.to_string()}},
        "spec": {"replicas": to},
    });
    if cluster
        .store
        .patch(REPLICASETS, namespace, name, &patch)
        .is_ok()
    {
        let direction = if to > replicas(rs) { "up" } else { "down" };
        scaling(
            cluster,
            deployment,
            format!("Scaled {direction} replica set {name} to {to}"),
        );
    }
}

fn reconcile_replica_set(cluster: &Cluster, namespace: &str, name: &str) {
    let Some(stored) = cluster.store.get(REPLICASETS, namespace, name) else {
        return;
    };
    let rs = stored.value();
    let template = &rs["spec"]["template"];
    if !template.is_object() {
        // A workload's ReplicaSet: its pods are the workload's to make.
        return;
    }
    let want = replicas(&rs);
    let mut pods: Vec<Arc<StoredObject>> = objects(cluster, PODS, namespace)
        .into_iter()
        .filter(|p| controlled_by(&p.value(), &stored.uid))
        .collect();
    let have = pods.len() as i64;
    if have < want {
        let nodes = objects(cluster, "nodes", "");
        for i in 0..(want - have) {
            let pod_name = format!("{name}-{}", random_suffix());
            let node = nodes
                .get(((have + i) as usize) % nodes.len().max(1))
                .map(|n| n.name.clone());
            let body = pod_from_template(&rs, template, &pod_name, node);
            if cluster.store.create(PODS, Some(namespace), body).is_ok() {
                record(
                    cluster,
                    &rs,
                    "ReplicaSet",
                    "replicaset-controller",
                    "SuccessfulCreate",
                    format!("Created pod: {pod_name}"),
                );
            }
        }
    } else if have > want {
        // The newest go first.
        pods.sort_by_key(|p| std::cmp::Reverse(p.rv));
        for pod in pods.iter().take((have - want) as usize) {
            if cluster.store.delete(PODS, namespace, &pod.name).is_ok() {
                record(
                    cluster,
                    &rs,
                    "ReplicaSet",
                    "replicaset-controller",
                    "SuccessfulDelete",
                    format!("Deleted pod: {}", pod.name),
                );
            }
        }
    }
    let pods: Vec<Value> = objects(cluster, PODS, namespace)
        .iter()
        .map(|p| p.value())
        .filter(|p| controlled_by(p, &stored.uid))
        .collect();
    let count = pods.len() as i64;
    let ready = pods
        .iter()
        .filter(|p| {
            p["status"]["conditions"].as_array().is_some_and(|c| {
                c.iter()
                    .any(|c| c["type"] == "Ready" && c["status"] == "True")
            })
        })
        .count() as i64;
    let mut status = Map::new();
    status.insert("replicas".into(), json!(count));
    for (key, value) in [
        ("fullyLabeledReplicas", count),
        ("readyReplicas", ready),
        ("availableReplicas", ready),
    ] {
        if value != 0 {
            status.insert(key.into(), json!(value));
        }
    }
    status.insert(
        "observedGeneration".into(),
        rs["metadata"]["generation"].clone(),
    );
    let Some(latest) = cluster.store.get(REPLICASETS, namespace, name) else {
        return;
    };
    write_status(
        cluster,
        REPLICASETS,
        latest.value(),
        Value::Object(status),
        false,
    );
}

/// A pod of `rs`, as the scheduler and kubelet leave it once it runs: on `node`, its
/// containers started and ready.
fn pod_from_template(rs: &Value, template: &Value, name: &str, node: Option<String>) -> Value {
    let mut spec = template["spec"].clone();
    if !spec.is_object() {
        spec = json!({});
    }
    if let Some(node) = &node {
        spec["nodeName"] = json!(node);
    }
    let now = now_rfc3339();
    let containers: Vec<Value> = spec["containers"]
        .as_array()
        .map(|cs| {
            cs.iter()
                .map(|c| {
                    json!({
                        "name": c["name"],
                        "image": c["image"],
                        "imageID": "",
                        "ready": true,
                        "started": true,
                        "restartCount": 0,
                        "state": {"running": {"startedAt": now}},
                    })
                })
                .collect()
        })
        .unwrap_or_default();
    let mut rng = rand::rng();
    let ip = format!(
        "10.244.{}.{}",
        rng.random_range(0..=255),
        rng.random_range(2..=254)
    );
    let conditions: Vec<Value> = ["Initialized", "Ready", "ContainersReady", "PodScheduled"]
        .iter()
        .map(|t| json!({"type": t, "status": "True", "lastProbeTime": null, "lastTransitionTime": now}))
        .collect();
    json!({
        "metadata": {
            "name": name,
            "generateName": format!("{}-", rs["metadata"]["name"].as_str().unwrap_or_default()),
            "labels": template["metadata"]["labels"],
            "ownerReferences": owner_reference("ReplicaSet", rs),
        },
        "spec": spec,
        "status": {
            "phase": "Running",
            "conditions": conditions,
            "hostIP": "10.0.0.1",
            "podIP": ip,
            "podIPs": [{"ip": ip}],
            "startTime": now,
            "containerStatuses": containers,
            "qosClass": "BestEffort",
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn template_hashes_are_stable_and_use_the_safe_alphabet() {
        let a = json!({"metadata": {"labels": {"app": "web"}}, "spec": {"containers": [{"name": "web", "image": "nginx:1"}]}});
        let b = json!({"metadata": {"labels": {"app": "web"}}, "spec": {"containers": [{"name": "web", "image": "nginx:2"}]}});
        assert_eq!(template_hash(&a), template_hash(&a.clone()));
        assert_ne!(template_hash(&a), template_hash(&b));
        assert!(
            template_hash(&a)
                .bytes()
                .all(|c| b"bcdfghjklmnpqrstvwxz2456789".contains(&c))
        );
    }

    #[test]
    fn owners_are_found_by_controller_reference() {
        let pod = json!({"metadata": {"ownerReferences": [
            {"kind": "ReplicaSet", "name": "web-abc", "uid": "u1", "controller": true},
            {"kind": "Deployment", "name": "other", "uid": "u2"},
        ]}});
        assert_eq!(
            controller_of(&pod, "ReplicaSet").as_deref(),
            Some("web-abc")
        );
        assert_eq!(controller_of(&pod, "Deployment"), None);
        assert!(controlled_by(&pod, "u1"));
        assert!(!controlled_by(&pod, "u2"));
    }
}
