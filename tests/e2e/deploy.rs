//! The Kubernetes manifests (`deploy/kubernetes`), rendered as kustomize renders them
//! (with the real `kubectl kustomize` when it is installed, and always by reading the
//! files the kustomizations name), then checked: every object parses as its
//! Kubernetes type (k8s-openapi) without losing a field, and the pieces agree with
//! each other and with the configuration file they ship (ports, paths, probes, the
//! read-only grants covering the collected types, a restricted pod).

#![allow(clippy::unwrap_used)]

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret, Service, ServiceAccount};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use serde_json::Value;

fn deploy() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/kubernetes")
}

fn yaml_docs(text: &str) -> Vec<Value> {
    serde_saphyr::from_multiple::<Value>(text)
        .unwrap()
        .into_iter()
        .filter(|v| !v.is_null())
        .collect()
}

fn read_docs(path: &Path) -> Vec<Value> {
    yaml_docs(&std::fs::read_to_string(path).unwrap())
}

/// kustomize's rendering, by reading the files: resources (files and directories),
/// components, the namespace, common labels and the configMapGenerator.
fn render_by_reading(dir: &Path) -> Vec<Value> {
    let k = read_docs(&dir.join("kustomization.yaml")).remove(0);
    let list = |key: &str| -> Vec<String> {
        k[key]
            .as_array()
            .map(|a| a.iter().map(|v| v.as_str().unwrap().to_string()).collect())
            .unwrap_or_default()
    };
    let mut objects = Vec::new();
    for r in list("resources").into_iter().chain(list("components")) {
        let path = dir.join(&r);
        if path.is_dir() {
            objects.extend(render_by_reading(&path));
        } else {
            objects.extend(read_docs(&path));
        }
    }
    for g in k["configMapGenerator"].as_array().into_iter().flatten() {
        let mut data = serde_json::Map::new();
        for f in g["files"].as_array().unwrap() {
            let f = f.as_str().unwrap();
            data.insert(
                f.to_string(),
                Value::String(std::fs::read_to_string(dir.join(f)).unwrap()),
            );
        }
        objects.push(serde_json::json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": g["name"]}, "data": data,
        }));
    }
    let cluster_scoped = ["Namespace", "ClusterRole", "ClusterRoleBinding"];
    for o in &mut objects {
        if let Some(ns) = k["namespace"].as_str()
            && !cluster_scoped.contains(&o["kind"].as_str().unwrap())
        {
            o["metadata"]["namespace"] = ns.into();
        }
        for l in k["labels"].as_array().into_iter().flatten() {
            for (key, v) in l["pairs"].as_object().unwrap() {
                o["metadata"]["labels"][key] = v.clone();
            }
        }
    }
    objects
}

/// `kubectl kustomize DIR`, when kubectl is installed.
fn render_by_kubectl(dir: &Path) -> Option<Vec<Value>> {
    let out = std::process::Command::new("kubectl")
        .arg("kustomize")
        .arg(dir)
        .output()
        .ok()?;
    assert!(
        out.status.success(),
        "kubectl kustomize {}: {}",
        dir.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    Some(yaml_docs(&String::from_utf8(out.stdout).unwrap()))
}

fn kind_and_name(o: &Value) -> (String, String) {
    (
        o["kind"].as_str().unwrap().to_string(),
        o["metadata"]["name"].as_str().unwrap().to_string(),
    )
}

/// Parses `o` as `T` and checks nothing was dropped: a misspelt or misplaced field
/// would be.
fn typed<T: serde::de::DeserializeOwned + serde::Serialize>(o: &Value) -> T {
    let parsed: T =
        serde_json::from_value(o.clone()).unwrap_or_else(|e| panic!("{:?}: {e}", kind_and_name(o)));
    let back = serde_json::to_value(&parsed).unwrap();
    // Serializing may add what the type implies (an embedded claim's kind), never
    // drop or change what the manifest says.
    if let Err(at) = contained(o, &back, String::new()) {
        panic!("{:?} lost or changed {at}", kind_and_name(o));
    }
    parsed
}

/// Whether everything in `a` is in `b` (objects may have more keys in `b`); else the
/// path where they part.
fn contained(a: &Value, b: &Value, at: String) -> Result<(), String> {
    match (a, b) {
        (Value::Object(a), Value::Object(b)) => {
            for (k, v) in a {
                contained(v, b.get(k).unwrap_or(&Value::Null), format!("{at}.{k}"))?;
            }
            Ok(())
        }
        (Value::Array(a), Value::Array(b)) if a.len() == b.len() => {
            for (i, (x, y)) in a.iter().zip(b).enumerate() {
                contained(x, y, format!("{at}[{i}]"))?;
            }
            Ok(())
        }
        _ if a == b => Ok(()),
        _ => Err(format!("{at}: {a} became {b}")),
    }
}

fn check_typed(o: &Value) {
    match o["kind"].as_str().unwrap() {
        "Namespace" => drop(typed::<Namespace>(o)),
        "ServiceAccount" => drop(typed::<ServiceAccount>(o)),
        "Secret" => drop(typed::<Secret>(o)),
        "ClusterRole" => drop(typed::<ClusterRole>(o)),
        "ClusterRoleBinding" => drop(typed::<ClusterRoleBinding>(o)),
        "StatefulSet" => drop(typed::<StatefulSet>(o)),
        "Service" => drop(typed::<Service>(o)),
        "NetworkPolicy" => drop(typed::<NetworkPolicy>(o)),
        "PodDisruptionBudget" => drop(typed::<PodDisruptionBudget>(o)),
        "ConfigMap" => drop(typed::<ConfigMap>(o)),
        "ServiceMonitor" => {
            assert_eq!(o["apiVersion"], "monitoring.coreos.com/v1");
            let endpoint = &o["spec"]["endpoints"][0];
            assert_eq!(endpoint["port"], "metrics");
            assert_eq!(endpoint["path"], "/metrics");
            assert_eq!(endpoint["scheme"], "https");
            assert_eq!(
                endpoint["tlsConfig"]["ca"]["secret"]["name"],
                "fleetscope-tls"
            );
            assert_eq!(endpoint["authorization"]["type"], "Bearer");
        }
        "Issuer" => {
            assert_eq!(o["apiVersion"], "cert-manager.io/v1");
            let spec = o["spec"].as_object().unwrap();
            assert!(
                spec.contains_key("selfSigned") || spec.contains_key("ca"),
                "{spec:?}"
            );
        }
        "Certificate" => {
            assert_eq!(o["apiVersion"], "cert-manager.io/v1");
            assert!(o["spec"]["secretName"].is_string());
            assert_eq!(o["spec"]["issuerRef"]["kind"], "Issuer");
        }
        other => panic!("unexpected kind {other}"),
    }
}

fn find<'a>(objects: &'a [Value], kind: &str) -> &'a Value {
    objects
        .iter()
        .find(|o| o["kind"] == kind)
        .unwrap_or_else(|| panic!("no {kind}"))
}

#[test]
fn the_manifests_render_parse_and_agree_with_each_other() {
    let overlay = deploy().join("overlays/with-monitoring");
    let read = render_by_reading(&overlay);
    let objects = match render_by_kubectl(&overlay) {
        Some(rendered) => {
            // Both renderings hold the same objects (kubectl adds a hash to the
            // generated ConfigMap's name).
            let names = |objects: &[Value]| -> BTreeSet<(String, String)> {
                objects
                    .iter()
                    .map(kind_and_name)
                    .map(|(k, n)| {
                        // A generated ConfigMap's name ends in -HASH (ten characters).
                        let n = match n.rsplit_once('-') {
                            Some((base, hash)) if k == "ConfigMap" && hash.len() == 10 => {
                                base.to_string()
                            }
                            _ => n,
                        };
                        (k, n)
                    })
                    .collect()
            };
            assert_eq!(names(&rendered), names(&read));
            rendered
        }
        None => read,
    };
    for o in &objects {
        check_typed(o);
    }

    // The configuration it ships is valid, and the rest agrees with it.
    let config_map = |key: &str| -> String {
        objects
            .iter()
            .filter(|o| o["kind"] == "ConfigMap")
            .find_map(|o| o["data"][key].as_str().map(str::to_string))
            .unwrap_or_else(|| panic!("no ConfigMap holds {key}"))
    };
    let text = &config_map("fleetscope.yaml");
    let file = fleetscope::config::file::parse(Path::new("fleetscope.yaml"), text).unwrap();
    // A setting's values in the file, by its key.
    let setting = |key: &str| -> Vec<String> {
        file.iter()
            .find(|g| g.key == key)
            .map(|g| g.values.clone())
            .unwrap_or_default()
    };
    let one = |key: &str| setting(key).first().cloned();
    let port_of = |addr: &Option<String>| -> i32 {
        addr.as_deref()
            .unwrap()
            .rsplit_once(':')
            .unwrap()
            .1
            .parse()
            .unwrap()
    };
    let (grpc_port, metrics_port) = (port_of(&one("listen")), port_of(&one("metricsListen")));
    let kube_api_port = port_of(&one("kubeApi.listen"));

    let sts: StatefulSet = typed(find(&objects, "StatefulSet"));
    let pod = sts.spec.as_ref().unwrap().template.spec.as_ref().unwrap();
    let c = &pod.containers[0];
    let ports: Vec<(String, i32)> = c
        .ports
        .iter()
        .flatten()
        .map(|p| (p.name.clone().unwrap(), p.container_port))
        .collect();
    assert_eq!(
        ports,
        [
            ("grpc".into(), grpc_port),
            ("metrics".into(), metrics_port),
            ("kube-api".into(), kube_api_port)
        ]
    );
    // The kubelet's gRPC probes speak no TLS: the probes read the metrics listener's
    // open endpoints over HTTPS.
    for (probe, path) in [
        (&c.startup_probe, "/readyz"),
        (&c.liveness_probe, "/livez"),
        (&c.readiness_probe, "/readyz"),
    ] {
        let get = probe
            .as_ref()
            .unwrap()
            .http_get
            .as_ref()
            .expect("an HTTP probe");
        assert_eq!(get.path.as_deref(), Some(path));
        assert_eq!(get.scheme.as_deref(), Some("HTTPS"));
        assert_eq!(
            get.port,
            k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::String("metrics".into())
        );
    }
    // Restricted: non-root, read-only root, nothing to escalate.
    let psc = pod.security_context.as_ref().unwrap();
    assert_eq!(psc.run_as_non_root, Some(true));
    assert_eq!(
        psc.seccomp_profile.as_ref().unwrap().type_,
        "RuntimeDefault"
    );
    let sc = c.security_context.as_ref().unwrap();
    assert_eq!(sc.read_only_root_filesystem, Some(true));
    assert_eq!(sc.allow_privilege_escalation, Some(false));
    assert_eq!(
        sc.capabilities.as_ref().unwrap().drop.as_deref(),
        Some(&["ALL".to_string()][..])
    );
    let limits = c.resources.as_ref().unwrap();
    assert!(limits.requests.is_some() && limits.limits.is_some());
    // The mounts are where the configuration says.
    let mount = |name: &str| {
        c.volume_mounts
            .iter()
            .flatten()
            .find(|m| m.name == name)
            .unwrap()
            .mount_path
            .clone()
    };
    assert_eq!(
        Path::new(&mount("data")),
        Path::new(&one("store.dataDir").unwrap())
    );
    let config_path = c.args.as_ref().unwrap().last().unwrap().clone();
    assert_eq!(
        Path::new(&config_path).parent().unwrap(),
        Path::new(&mount("config"))
    );
    // TLS, tokens and the policy are read from where they are mounted; the policy
    // shipped is valid; the TLS Secret is cert-manager's.
    for (key, volume) in [
        ("security.tlsCert", "tls"),
        ("security.tlsKey", "tls"),
        ("security.clientCa", "tls"),
        ("security.tokensFile", "tokens"),
        ("security.policy", "policy"),
    ] {
        let path = one(key).unwrap_or_else(|| panic!("the example sets {key}"));
        assert!(
            Path::new(&path).starts_with(mount(volume)),
            "{path:?} in {volume}"
        );
    }
    assert_eq!(one("security.insecureListen").as_deref(), Some("false"));
    let policy_path = std::path::PathBuf::from(one("security.policy").unwrap());
    fleetscope::auth::policy::PolicyGrants::parse(&policy_path, &config_map("policy.yaml"))
        .expect("the shipped policy is valid");
    let volume = |name: &str| {
        pod.volumes
            .iter()
            .flatten()
            .find(|v| v.name == name)
            .unwrap_or_else(|| panic!("no volume {name}"))
            .clone()
    };
    let tls_secret = volume("tls").secret.unwrap().secret_name.unwrap();
    assert!(
        objects.iter().any(|o| o["kind"] == "Certificate"
            && o["spec"]["secretName"] == tls_secret.as_str()
            && o["spec"]["usages"][0] == "server auth"),
        "cert-manager issues the server's Secret {tls_secret}"
    );
    for kubeconfig in setting("kubeconfigs") {
        assert!(
            Path::new(&kubeconfig).starts_with(mount("kubeconfig")),
            "{kubeconfig:?}"
        );
    }
    let claim = &sts
        .spec
        .as_ref()
        .unwrap()
        .volume_claim_templates
        .as_ref()
        .unwrap()[0];
    assert_eq!(claim.metadata.name.as_deref(), Some("data"));

    // The Service reaches the pod on both ports.
    let svc: Service = typed(find(&objects, "Service"));
    let spec = svc.spec.unwrap();
    let labels = sts
        .spec
        .as_ref()
        .unwrap()
        .template
        .metadata
        .as_ref()
        .unwrap()
        .labels
        .clone()
        .unwrap();
    for (k, v) in spec.selector.unwrap() {
        assert_eq!(labels.get(&k), Some(&v), "the Service selects the pod");
    }
    let svc_ports: Vec<i32> = spec.ports.unwrap().iter().map(|p| p.port).collect();
    assert_eq!(svc_ports, [grpc_port, metrics_port, kube_api_port]);

    // Read-only grants, covering every type the configuration collects.
    let role: ClusterRole = typed(find(&objects, "ClusterRole"));
    let mut granted = BTreeSet::new();
    for rule in role.rules.unwrap() {
        for verb in &rule.verbs {
            assert!(["get", "list", "watch"].contains(&verb.as_str()), "{verb}");
        }
        for group in rule.api_groups.iter().flatten() {
            for r in rule.resources.iter().flatten() {
                granted.insert(if group.is_empty() {
                    r.clone()
                } else {
                    format!("{r}.{group}")
                });
            }
        }
    }
    let collected: BTreeSet<String> = setting("resources").into_iter().collect();
    assert_eq!(granted, collected);
    let binding: ClusterRoleBinding = typed(find(&objects, "ClusterRoleBinding"));
    assert_eq!(
        binding.subjects.unwrap()[0].name,
        pod.service_account_name.clone().unwrap()
    );
}

#[test]
fn the_watched_cluster_rbac_parses_and_only_reads() {
    let docs = read_docs(&deploy().join("watched-cluster/rbac-watched-cluster.yaml"));
    assert_eq!(docs.len(), 5);
    for d in &docs {
        check_typed(d);
    }
    let role: ClusterRole = typed(find(&docs, "ClusterRole"));
    for rule in role.rules.unwrap() {
        for verb in &rule.verbs {
            assert!(["get", "list", "watch"].contains(&verb.as_str()), "{verb}");
        }
    }
}

/// GitHub's anchor for a heading: lower case, punctuation dropped, spaces to dashes.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || *c == '-' || *c == ' ' || *c == '_')
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// The `](target)` links of a Markdown text.
fn links(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(i) = rest.find("](") {
        rest = &rest[i + 2..];
        if let Some(end) = rest.find(')') {
            let target = &rest[..end];
            if !target.contains(char::is_whitespace) {
                out.push(target.to_string());
            }
        }
    }
    out
}

#[test]
fn every_link_of_the_readme_and_the_docs_reaches_a_file_and_a_heading() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut pages = vec![root.join("README.md")];
    for dir in [root.join("docs"), root.join("docs/notes")] {
        for e in std::fs::read_dir(dir).unwrap() {
            let path = e.unwrap().path();
            if path.extension().is_some_and(|x| x == "md") {
                pages.push(path);
            }
        }
    }
    let headings = |path: &Path| -> BTreeSet<String> {
        std::fs::read_to_string(path)
            .unwrap()
            .lines()
            .filter(|l| l.starts_with('#'))
            .map(|l| anchor(l.trim_start_matches('#')))
            .collect()
    };
    let mut checked = 0;
    for page in &pages {
        let text = std::fs::read_to_string(page).unwrap();
        for target in links(&text) {
            if target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            let (file, fragment) = match target.split_once('#') {
                Some((f, a)) => (f, Some(a)),
                None => (target.as_str(), None),
            };
            let file = if file.is_empty() {
                page.clone()
            } else {
                page.parent().unwrap().join(file)
            };
            assert!(file.exists(), "{}: {target} names no file", page.display());
            if let Some(a) = fragment {
                assert!(
                    headings(&file).contains(a),
                    "{}: {target} names no heading of {}",
                    page.display(),
                    file.display()
                );
            }
            checked += 1;
        }
    }
    assert!(checked >= 8, "only {checked} links checked");
    for (page, most) in [
        // The front page stays a front page.
        ("README.md", 15),
        // The figures are a reference, one table per area; investigations go to the log.
        ("docs/performance.md", 15),
        // Concepts and procedures; every flag is in the generated reference.
        ("docs/operating.md", 30),
    ] {
        let size = std::fs::metadata(root.join(page)).unwrap().len();
        assert!(
            size <= most * 1024,
            "{page} is {size} bytes, over {most} KiB"
        );
    }
}

#[test]
fn the_readme_s_tour_is_what_the_demo_prints() {
    let readme =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md")).unwrap();
    let (_, section) = readme.split_once("## A tour").unwrap();
    let (_, block) = section.split_once("```sh\n").unwrap();
    let (block, _) = block.split_once("```").unwrap();
    assert_eq!(
        block,
        fleetscope::server::run::tour(
            "fleetscope",
            fleetscope::proto::DEFAULT_ADDRESS,
            "127.0.0.1:50052"
        ),
        "README.md's tour differs from the demo's (src/server/run/demo.rs, TOUR)"
    );
}

#[test]
fn the_settings_reference_is_the_declarations() {
    let page =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/settings.md"))
            .unwrap();
    for (command, marker, example) in [
        (
            "serve",
            "settings",
            "| `informer.pageSize` | `--page-size` |",
        ),
        (
            "router",
            "router settings",
            "| `router.replicaTimeout` | `--replica-timeout` |",
        ),
    ] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_fleetscope"))
            .args(["config", "settings", "--for", command, "-o", "markdown"])
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        let printed = String::from_utf8(out.stdout).unwrap();
        let (_, rest) = page
            .split_once(&format!("<!-- {marker}: begin -->\n"))
            .unwrap();
        let (table, _) = rest.split_once(&format!("<!-- {marker}: end -->")).unwrap();
        assert_eq!(
            table.trim(),
            printed.trim(),
            "docs/settings.md's table differs from `fleetscope config settings --for {command} -o markdown`"
        );
        // Every setting is there, each once, with when it applies.
        for line in printed.lines().skip(2) {
            assert!(
                line.contains("| live |") || line.contains("| restart |"),
                "{line}"
            );
        }
        assert!(printed.contains(example), "{printed}");
    }
}

/// The dependencies a crate's manifest declares (its `[dependencies]` section's keys).
fn dependencies_of(manifest: &Path) -> BTreeSet<String> {
    let text = std::fs::read_to_string(manifest).unwrap();
    let mut section = "";
    let mut out = BTreeSet::new();
    for line in text.lines().map(str::trim) {
        if line.starts_with('[') {
            section = line;
        } else if section == "[dependencies]"
            && let Some((name, _)) = line.split_once(['=', '.'])
            && !name.trim().is_empty()
            && !line.starts_with('#')
        {
            out.insert(name.trim().to_string());
        }
    }
    out
}

#[test]
fn the_layers_of_docs_development_md_are_the_crates_dependencies() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let page = std::fs::read_to_string(root.join("docs/development.md")).unwrap();
    let (_, layers) = page.split_once("## Layers").unwrap();
    let mut checked = 0;
    for row in layers.lines().filter(|l| l.starts_with("| `crates/")) {
        let cells: Vec<&str> = row.split('|').map(str::trim).collect();
        let dir = cells[1].trim_matches('`');
        let declared = dependencies_of(&root.join(dir).join("Cargo.toml"));
        // "every fleetscope crate but model", or a list of names.
        let forbidden: Vec<String> = if cells[3].starts_with("every fleetscope crate but") {
            let allowed = cells[3].rsplit(' ').next().unwrap().to_string();
            declared
                .iter()
                .filter(|d| d.starts_with("fleetscope-") && **d != format!("fleetscope-{allowed}"))
                .cloned()
                .collect()
        } else {
            cells[3]
                .split([',', ';'])
                .map(|w| w.trim().trim_matches('`'))
                .filter(|w| !w.is_empty() && !w.contains(' '))
                .map(|w| match w {
                    "kube" | "tonic" | "sled" => w.to_string(),
                    other => format!("fleetscope-{other}"),
                })
                .collect()
        };
        for name in &forbidden {
            assert!(
                !declared.contains(name),
                "{dir} depends on {name}, which docs/development.md says it must not"
            );
        }
        checked += 1;
    }
    assert!(checked >= 10, "only {checked} crates checked");
    // The root package sees no kube type.
    for entry in walk(&root.join("src")) {
        let text = std::fs::read_to_string(&entry).unwrap();
        assert!(
            !text.contains("kube::") && !text.contains("k8s_openapi"),
            "{} names a kube type",
            entry.display()
        );
    }
}

/// No two files of a crate import each other, directly or around a loop
/// (docs/development.md): each file's `crate::`, `self::` and `super::` paths name the
/// files they reach, and the graph they make has no cycle.
#[test]
fn no_two_files_of_a_crate_import_each_other() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    for src in sources(root) {
        // Each file by its module path.
        let mut files: std::collections::BTreeMap<Vec<String>, PathBuf> = Default::default();
        for file in walk(&src)
            .into_iter()
            .filter(|f| f.extension().is_some_and(|e| e == "rs"))
        {
            let rel = file.strip_prefix(&src).unwrap().with_extension("");
            let mut module: Vec<String> = rel
                .iter()
                .map(|p| p.to_string_lossy().into_owned())
                .collect();
            if matches!(
                module.last().map(String::as_str),
                Some("mod" | "lib" | "main")
            ) {
                module.pop();
            }
            files.insert(module, file);
        }
        let mut edges: std::collections::BTreeMap<Vec<String>, BTreeSet<Vec<String>>> =
            Default::default();
        for (module, file) in &files {
            let text = std::fs::read_to_string(file).unwrap();
            let text = text.split("#[cfg(test)]").next().unwrap_or_default();
            let is_dir = matches!(
                file.file_name().and_then(|n| n.to_str()),
                Some("mod.rs" | "lib.rs" | "main.rs")
            );
            let here: Vec<String> = if is_dir {
                module.clone()
            } else {
                module[..module.len().saturating_sub(1)].to_vec()
            };
            for (prefix, base) in [
                ("crate::", Vec::new()),
                ("self::", here.clone()),
                ("super::", here[..here.len().saturating_sub(1)].to_vec()),
            ] {
                for (at, _) in text.match_indices(prefix) {
                    let before = text[..at].chars().next_back();
                    if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':') {
                        continue;
                    }
                    for path in paths_after(&text[at + prefix.len()..]) {
                        let mut full = base.clone();
                        full.extend(path);
                        // The longest prefix that is a file.
                        let reached = (0..=full.len())
                            .rev()
                            .map(|k| full[..k].to_vec())
                            .find(|m| files.contains_key(m));
                        if let Some(reached) = reached.filter(|m| m != module) {
                            edges.entry(module.clone()).or_default().insert(reached);
                        }
                    }
                }
            }
        }
        if let Some(cycle) = a_cycle(&edges) {
            let names: Vec<String> = cycle
                .iter()
                .map(|m| {
                    files[m]
                        .strip_prefix(root)
                        .unwrap_or(&files[m])
                        .display()
                        .to_string()
                })
                .collect();
            panic!(
                "files that import each other, around a loop: {}",
                names.join(" → ")
            );
        }
    }
}

/// The sizes docs/development.md holds the code to: no file over 1,000 lines before
/// its tests, and no function over 100 lines unless it says at its top why it is long
/// ("Long for a reason": a table, one arm per type, say).
#[test]
fn no_file_over_a_thousand_lines_and_no_function_over_a_hundred_without_a_reason() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut long = Vec::new();
    for file in sources(root).iter().flat_map(|s| walk(s)) {
        if file.extension().is_none_or(|e| e != "rs") || file.ends_with("tests.rs") {
            continue;
        }
        let text = std::fs::read_to_string(&file).unwrap();
        let lines: Vec<&str> = text
            .lines()
            .take_while(|l| !l.starts_with("#[cfg(test)]"))
            .collect();
        let name = file.strip_prefix(root).unwrap().display().to_string();
        if lines.len() > 1000 {
            long.push(format!("{name}: {} lines", lines.len()));
        }
        for (at, line) in lines.iter().enumerate() {
            let code = line.trim_start();
            let indent = &line[..line.len() - code.len()];
            let is_fn = [
                "fn ",
                "pub fn ",
                "async fn ",
                "pub async fn ",
                "const fn ",
                "pub(crate) fn ",
                "pub(super) fn ",
                "pub(crate) async fn ",
            ]
            .iter()
            .any(|p| code.starts_with(p));
            if !is_fn || code.ends_with(';') {
                continue;
            }
            // The function ends at the first line that closes it at its own indent.
            let Some(end) = (at..lines.len()).find(|&j| lines[j] == format!("{indent}}}")) else {
                continue;
            };
            let reason = lines[..at]
                .iter()
                .rev()
                .take_while(|l| {
                    l.trim_start().starts_with("///") || l.trim_start().starts_with("#[")
                })
                .any(|l| l.contains("Long for a reason"));
            if end - at + 1 > 100 && !reason {
                long.push(format!(
                    "{name}:{}: a function of {} lines",
                    at + 1,
                    end - at + 1
                ));
            }
        }
    }
    assert!(long.is_empty(), "too long: {long:#?}");
}

/// The paths a `crate::`/`self::`/`super::` prefix leads to in `rest`: one, or each of
/// a `{…}` group's (nested groups read by their first segments).
fn paths_after(rest: &str) -> Vec<Vec<String>> {
    let segments = |s: &str| -> Vec<String> {
        s.split("::")
            .map(|seg| {
                seg.chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect::<String>()
            })
            .take_while(|seg| !seg.is_empty())
            .collect()
    };
    let head: String = rest
        .chars()
        .take_while(|c| c.is_alphanumeric() || *c == '_' || *c == ':')
        .collect();
    let path = segments(&head);
    let after = &rest[head.len()..];
    if head.ends_with("::") && after.starts_with('{') {
        let group: String = after[1..].chars().take_while(|c| *c != ';').collect();
        return group
            .split(',')
            .map(|item| {
                let mut p = path.clone();
                p.extend(segments(item.trim().trim_start_matches('{')));
                p
            })
            .collect();
    }
    if path.is_empty() {
        return Vec::new();
    }
    vec![path]
}

/// A cycle of `edges`, if there is one.
fn a_cycle(
    edges: &std::collections::BTreeMap<Vec<String>, BTreeSet<Vec<String>>>,
) -> Option<Vec<Vec<String>>> {
    // Depth first: a node met again while on the stack closes a cycle.
    fn visit(
        node: &Vec<String>,
        edges: &std::collections::BTreeMap<Vec<String>, BTreeSet<Vec<String>>>,
        done: &mut BTreeSet<Vec<String>>,
        stack: &mut Vec<Vec<String>>,
    ) -> Option<Vec<Vec<String>>> {
        if let Some(at) = stack.iter().position(|n| n == node) {
            let mut cycle = stack[at..].to_vec();
            cycle.push(node.clone());
            return Some(cycle);
        }
        if done.contains(node) {
            return None;
        }
        stack.push(node.clone());
        for next in edges.get(node).into_iter().flatten() {
            if let Some(cycle) = visit(next, edges, done, stack) {
                return Some(cycle);
            }
        }
        stack.pop();
        done.insert(node.clone());
        None
    }
    let mut done = BTreeSet::new();
    edges
        .keys()
        .find_map(|node| visit(node, edges, &mut done, &mut Vec::new()))
}

/// The source folders of the root package and of every crate.
fn sources(root: &Path) -> Vec<PathBuf> {
    let mut sources = vec![root.join("src")];
    for e in std::fs::read_dir(root.join("crates")).unwrap() {
        sources.push(e.unwrap().path().join("src"));
    }
    sources
}

/// Every file under `dir`.
fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}

#[test]
fn the_root_package_s_rooms_only_use_the_rooms_below_them() {
    // From the bottom: each room may name only the rooms before it (and the crates).
    const FLOORS: [&str; 8] = [
        "tasks",
        "memory",
        "config",
        "shard",
        "telemetry",
        "kubeapi",
        "server",
        "command",
    ];
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    for (floor, room) in FLOORS.iter().enumerate() {
        let files = if src.join(room).is_dir() {
            walk(&src.join(room))
        } else {
            vec![src.join(format!("{room}.rs"))]
        };
        for file in files {
            let text = std::fs::read_to_string(&file).unwrap();
            for (at, _) in text.match_indices("crate::") {
                let named: String = text[at + "crate::".len()..]
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                if let Some(above) = FLOORS.iter().position(|r| *r == named) {
                    assert!(
                        above <= floor,
                        "{} (room {room}) names crate::{named}, a room above it",
                        file.display()
                    );
                }
            }
        }
    }
}
