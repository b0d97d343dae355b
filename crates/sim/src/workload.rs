//! A realistic workload for a simulated cluster: nodes, namespaces, deployments with
//! their replicasets and pods (labels, owner references, node names, IPs, statuses),
//! configmaps and services; and churn that creates, relabels, updates and deletes.

use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::cluster::Cluster;
use crate::status::ApiError;

/// What to create.
#[derive(Debug, Clone)]
pub struct WorkloadSpec {
    /// About how many objects in all.
    pub objects: usize,
    /// Seed for names and choices, so a run can be repeated.
    pub seed: u64,
}

impl WorkloadSpec {
    /// About `objects` objects, seeded.
    pub fn new(objects: usize, seed: u64) -> Self {
        Self { objects, seed }
    }
}

#[derive(Debug, Clone)]
struct Deployment {
    namespace: String,
    name: String,
    rs_name: String,
    rs_uid: String,
    hash: String,
}

/// The objects a workload created, so churn can pick among them.
pub struct Workload {
    rng: StdRng,
    nodes: Vec<String>,
    deployments: Vec<Deployment>,
    pods: Vec<(String, String)>,
    configmaps: Vec<(String, String)>,
    target_pods: usize,
    serial: u64,
}

fn pod_body(d: &Deployment, name: &str, node: &str, ip: u64, app: &str) -> Value {
    json!({
        "metadata": {
            "name": name,
            "generateName": format!("{}-{}-", d.name, d.hash),
            "namespace": d.namespace,
            "labels": {"app": app, "pod-template-hash": d.hash, "tier": if ip.is_multiple_of(3) { "frontend" } else { "backend" }},
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": d.rs_name, "uid": d.rs_uid, "controller": true, "blockOwnerDeletion": true}],
        },
        "spec": {
            "containers": [{
                "name": app,
                "image": format!("registry.example.com/{app}:1.{}", ip % 7),
                "ports": [{"containerPort": 8080, "protocol": "TCP"}],
                "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}, "limits": {"memory": "256Mi"}},
                "terminationMessagePath": "/dev/termination-log",
                "terminationMessagePolicy": "File",
                "imagePullPolicy": "IfNotPresent",
            }],
            "restartPolicy": "Always",
            "terminationGracePeriodSeconds": 30,
            "dnsPolicy": "ClusterFirst",
            "serviceAccountName": "default",
            "nodeName": node,
            "securityContext": {},
            "schedulerName": "default-scheduler",
            "tolerations": [
                {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300},
                {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300},
            ],
            "priority": 0,
            "enableServiceLinks": true,
        },
        "status": {
            "phase": "Running",
            "conditions": [
                {"type": "Initialized", "status": "True", "lastProbeTime": null},
                {"type": "Ready", "status": "True", "lastProbeTime": null},
                {"type": "ContainersReady", "status": "True", "lastProbeTime": null},
                {"type": "PodScheduled", "status": "True", "lastProbeTime": null},
            ],
            "hostIP": format!("10.0.{}.{}", (ip / 250) % 250, ip % 250 + 1),
            "podIP": format!("10.244.{}.{}", (ip / 250) % 250, ip % 250 + 1),
            "podIPs": [{"ip": format!("10.244.{}.{}", (ip / 250) % 250, ip % 250 + 1)}],
            "qosClass": "Burstable",
            "containerStatuses": [{
                "name": app,
                "state": {"running": {"startedAt": "2026-01-01T00:00:00Z"}},
                "ready": true,
                "restartCount": 0,
                "image": format!("registry.example.com/{app}:1.{}", ip % 7),
                "imageID": format!("registry.example.com/{app}@sha256:{:064x}", ip),
                "containerID": format!("containerd://{:064x}", ip * 7919),
                "started": true,
            }],
        },
    })
}

const APPS: &[&str] = &[
    "web", "api", "worker", "cache", "auth", "billing", "search", "ingest",
];

impl Workload {
    /// Creates the workload in `cluster`.
    pub fn populate(cluster: &Cluster, spec: &WorkloadSpec) -> Result<Self, ApiError> {
        let mut w = Workload {
            rng: StdRng::seed_from_u64(spec.seed),
            nodes: Vec::new(),
            deployments: Vec::new(),
            pods: Vec::new(),
            configmaps: Vec::new(),
            target_pods: 0,
            serial: 0,
        };
        let store = &cluster.store;
        let node_count = (spec.objects / 100).clamp(3, 5000);
        let ns_count = (spec.objects / 250).clamp(2, 2000);
        for i in 0..node_count {
            let name = format!("node-{i}");
            store.create("nodes", None, json!({
                "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, "topology.kubernetes.io/zone": format!("zone-{}", i % 3)}},
                "spec": {"podCIDR": format!("10.244.{i}.0/24")},
                "status": {"conditions": [{"type": "Ready", "status": "True"}], "nodeInfo": {"kubeletVersion": "v1.33.0"}},
            }))?;
            w.nodes.push(name);
        }
        // The namespaces every cluster has, as a real one does.
        for ns in ["default", "kube-system", "kube-public", "kube-node-lease"] {
            store.create(
                "namespaces",
                None,
                json!({"metadata": {"name": ns, "labels": {"kubernetes.io/metadata.name": ns}}}),
            )?;
        }
        let namespaces: Vec<String> = (0..ns_count).map(|i| format!("team-{i}")).collect();
        for ns in &namespaces {
            store.create(
                "namespaces",
                None,
                json!({"metadata": {"name": ns, "labels": {"team": ns}}}),
            )?;
        }
        // Each unit: a deployment, its replicaset, three pods, a configmap and a service.
        let units = (spec.objects.saturating_sub(node_count + ns_count) / 7).max(1);
        for u in 0..units {
            let ns = &namespaces[u % ns_count];
            let app = APPS[u % APPS.len()];
            let name = format!("{app}-{u}");
            let hash = format!("{:x}", w.rng.random_range(0x1000_0000u64..0xffff_ffff));
            let labels = json!({"app": app});
            let deploy = store.create("deployments.apps", Some(ns), json!({
                "metadata": {"name": name, "labels": labels, "annotations": {"deployment.kubernetes.io/revision": "1"}},
                "spec": {"replicas": 3, "selector": {"matchLabels": labels}, "template": {"metadata": {"labels": labels}, "spec": {"containers": [{"name": app, "image": format!("registry.example.com/{app}:1.0")}]}}},
                "status": {"replicas": 3, "readyReplicas": 3, "availableReplicas": 3, "updatedReplicas": 3},
            }))?;
            cluster
                .workload_deployments
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(deploy.uid.clone());
            let rs_name = format!("{name}-{hash}");
            let rs = store.create("replicasets.apps", Some(ns), json!({
                "metadata": {"name": rs_name, "labels": {"app": app, "pod-template-hash": hash},
                    "ownerReferences": [{"apiVersion": "apps/v1", "kind": "Deployment", "name": name, "uid": deploy.uid, "controller": true, "blockOwnerDeletion": true}]},
                "spec": {"replicas": 3, "selector": {"matchLabels": {"app": app, "pod-template-hash": hash}}},
                "status": {"replicas": 3, "readyReplicas": 3},
            }))?;
            let d = Deployment {
                namespace: ns.clone(),
                name: name.clone(),
                rs_name,
                rs_uid: rs.uid.clone(),
                hash,
            };
            for _ in 0..3 {
                w.create_pod(cluster, &d)?;
            }
            store.create(
                "configmaps",
                Some(ns),
                json!({
                    "metadata": {"name": format!("{name}-config"), "labels": {"app": app}},
                    "data": {"LOG_LEVEL": "info", "PORT": "8080", "FEATURES": "a,b,c"},
                }),
            )?;
            w.configmaps.push((ns.clone(), format!("{name}-config")));
            store.create("services", Some(ns), json!({
                "metadata": {"name": name, "labels": {"app": app}},
                "spec": {"type": "ClusterIP", "clusterIP": format!("10.96.{}.{}", (u / 250) % 250, u % 250 + 1), "selector": {"app": app}, "ports": [{"port": 80, "targetPort": 8080, "protocol": "TCP"}]},
            }))?;
            w.deployments.push(d);
        }
        w.target_pods = w.pods.len();
        Ok(w)
    }

    fn create_pod(&mut self, cluster: &Cluster, d: &Deployment) -> Result<(), ApiError> {
        self.serial += 1;
        let suffix: String = (0..5)
            .map(|_| (b'a' + self.rng.random_range(0..26u8)) as char)
            .collect();
        let name = format!("{}-{}-{suffix}", d.name, d.hash);
        let node = self.nodes[self.rng.random_range(0..self.nodes.len())].clone();
        let app = d
            .name
            .rsplit_once('-')
            .map_or(d.name.as_str(), |(a, _)| a)
            .to_string();
        match cluster.store.create(
            "pods",
            Some(&d.namespace),
            pod_body(d, &name, &node, self.serial, &app),
        ) {
            Ok(_) => {
                self.pods.push((d.namespace.clone(), name));
                Ok(())
            }
            Err(e) if e.reason == "AlreadyExists" => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// How many pods the workload tracks.
    pub fn pod_count(&self) -> usize {
        self.pods.len()
    }

    /// Applies one random change: a pod status update, a relabel, a pod created or deleted,
    /// or a deployment scaled. Objects deleted behind the workload's back are skipped.
    pub fn step(&mut self, cluster: &Cluster) -> Result<(), ApiError> {
        let store = &cluster.store;
        let roll = self.rng.random_range(0..100);
        match roll {
            0..35 if !self.pods.is_empty() => {
                let (ns, name) = self.pods[self.rng.random_range(0..self.pods.len())].clone();
                let restarts = self.rng.random_range(0..5);
                let phase = if restarts == 4 { "Pending" } else { "Running" };
                // Pod names start with their app, which names the one container.
                let app = name.split('-').next().unwrap_or_default();
                let patch = json!({"status": {"phase": phase, "containerStatuses": [{"name": app, "ready": phase == "Running", "restartCount": restarts}]}});
                ignore_gone(store.patch("pods", &ns, &name, &patch))
            }
            35..55 if !self.configmaps.is_empty() => {
                let (ns, name) =
                    self.configmaps[self.rng.random_range(0..self.configmaps.len())].clone();
                let patch = json!({"metadata": {"labels": {"rev": self.rng.random_range(0..10).to_string()}}});
                ignore_gone(store.patch("configmaps", &ns, &name, &patch))
            }
            55..75
                if !self.deployments.is_empty()
                    && self.pods.len() <= self.target_pods + self.target_pods / 10 =>
            {
                let d = self.deployments[self.rng.random_range(0..self.deployments.len())].clone();
                self.create_pod(cluster, &d)
            }
            55..95 if !self.pods.is_empty() => {
                let i = self.rng.random_range(0..self.pods.len());
                let (ns, name) = self.pods.swap_remove(i);
                ignore_gone(store.delete("pods", &ns, &name))
            }
            _ if !self.deployments.is_empty() => {
                let d = self.deployments[self.rng.random_range(0..self.deployments.len())].clone();
                let replicas = self.rng.random_range(1..6);
                scale(cluster, &d, replicas)
            }
            _ => Ok(()),
        }
    }

    /// Applies `per_second` changes a second until cancelled.
    pub async fn churn(mut self, cluster: Cluster, per_second: f64, cancel: CancellationToken) {
        if per_second <= 0.0 {
            return;
        }
        let period = Duration::from_secs_f64(1.0 / per_second).max(Duration::from_micros(50));
        let mut ticks = tokio::time::interval(period);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        loop {
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = ticks.tick() => {
                    if let Err(e) = self.step(&cluster) {
                        tracing::warn!(cluster = cluster.name(), error = %e, "churn step failed");
                    }
                }
            }
        }
    }
}

/// `r`, an object gone meanwhile taken as done.
fn ignore_gone<T>(r: Result<T, ApiError>) -> Result<(), ApiError> {
    match r {
        Err(e) if e.code == 404 => Ok(()),
        other => other.map(|_| ()),
    }
}

/// Scales a workload's Deployment to `replicas`, its ReplicaSet with it, and says both
/// are ready at once (as their controller would, a moment later): the workload's pods
/// come and go on their own, so READY reads `replicas/replicas`, never a scale that
/// nothing follows.
fn scale(cluster: &Cluster, d: &Deployment, replicas: u32) -> Result<(), ApiError> {
    let store = &cluster.store;
    let ready =
        json!({"replicas": replicas, "readyReplicas": replicas, "availableReplicas": replicas});
    ignore_gone(store.patch(
        "replicasets.apps",
        &d.namespace,
        &d.rs_name,
        &json!({"spec": {"replicas": replicas}, "status": ready}),
    ))?;
    ignore_gone(store.patch(
        "deployments.apps",
        &d.namespace,
        &d.name,
        &json!({
            "spec": {"replicas": replicas},
            "status": {"replicas": replicas, "readyReplicas": replicas, "availableReplicas": replicas, "updatedReplicas": replicas},
        }),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::ClusterConfig;

    #[test]
    fn a_scaled_workload_deployment_reads_ready_at_its_new_size() {
        let c = Cluster::new(ClusterConfig::new("w"));
        let w = Workload::populate(&c, &WorkloadSpec::new(100, 1)).unwrap();
        let d = w.deployments[0].clone();
        scale(&c, &d, 5).unwrap();
        let deploy = c
            .store
            .get("deployments.apps", &d.namespace, &d.name)
            .unwrap();
        let deploy = deploy.value();
        assert_eq!(deploy["spec"]["replicas"], 5);
        for field in [
            "replicas",
            "readyReplicas",
            "availableReplicas",
            "updatedReplicas",
        ] {
            assert_eq!(deploy["status"][field], 5, "{field}: {deploy}");
        }
        let rs = c
            .store
            .get("replicasets.apps", &d.namespace, &d.rs_name)
            .unwrap();
        let rs = rs.value();
        assert_eq!(
            (&rs["spec"]["replicas"], &rs["status"]["readyReplicas"]),
            (&json!(5), &json!(5))
        );
        // Gone meanwhile: nothing to scale, no error.
        c.store
            .delete("deployments.apps", &d.namespace, &d.name)
            .unwrap();
        c.store
            .delete("replicasets.apps", &d.namespace, &d.rs_name)
            .unwrap();
        scale(&c, &d, 2).unwrap();
    }

    #[test]
    fn populate_creates_about_the_requested_count_with_owner_chains() {
        let c = Cluster::new(ClusterConfig::new("w"));
        let w = Workload::populate(&c, &WorkloadSpec::new(1000, 1)).unwrap();
        let total: usize = c.store.defs().iter().map(|d| c.store.count(&d.id())).sum();
        assert!((900..=1100).contains(&total), "{total}");
        let pod = c
            .store
            .snapshot("pods", crate::store::ReadAt::Latest)
            .unwrap();
        let v = pod.objects.values().next().unwrap().value();
        assert_eq!(v["metadata"]["ownerReferences"][0]["kind"], "ReplicaSet");
        assert!(v["spec"]["nodeName"].as_str().unwrap().starts_with("node-"));
        assert_eq!(w.pod_count(), c.store.count("pods"));
    }

    #[test]
    fn churn_steps_keep_the_pod_count_near_its_target() {
        let c = Cluster::new(ClusterConfig::new("w"));
        let mut w = Workload::populate(&c, &WorkloadSpec::new(700, 2)).unwrap();
        let before = c.store.resource_version();
        for _ in 0..2000 {
            w.step(&c).unwrap();
        }
        assert!(c.store.resource_version() > before + 1500);
        assert!(c.store.count("pods") > 0);
        assert!(c.store.count("pods") <= w.target_pods + w.target_pods / 10 + 1);
    }
}
