//! `fleetscope kubeconfig`: a kubeconfig for the server's Kubernetes API, with a
//! `fleet` context (the whole fleet, `/clusters/*`) and one context per cluster
//! (`/clusters/NAME`), all with the caller's own credentials (the same token file,
//! client certificate and CA the CLI was given), so that
//! `kubectl --kubeconfig FILE --context fleet get pods -A` works as printed.

use std::path::Path;

use serde_json::{Value, json};

use super::args;
use super::connect::{Client, ClientError, message};

/// `fleetscope kubeconfig`: writes the kubeconfig (JSON, which kubectl reads as
/// YAML) to stdout.
pub async fn kubeconfig(
    client: &mut Client,
    args: args::KubeconfigArgs,
) -> Result<(), ClientError> {
    let api = args.kube_api.trim_end_matches('/');
    if !api.starts_with("https://") && !api.starts_with("http://") {
        return Err(message(format!(
            "--kube-api {api:?}: expected https://HOST:PORT or http://HOST:PORT (the server's --kube-api-listen)"
        )));
    }
    let clusters = super::status::cluster_names(client).await?;
    let text = serde_json::to_string_pretty(&of(api, &clusters, &args.server)?)
        .map_err(|e| message(e.to_string()))?;
    println!("{text}");
    Ok(())
}

/// The kubeconfig for `api` over `clusters`, with the credentials `server` names.
fn of(api: &str, clusters: &[String], server: &args::ServerArg) -> Result<Value, ClientError> {
    let absolute = |p: &Path| -> Result<String, ClientError> {
        std::path::absolute(p)
            .map(|p| p.display().to_string())
            .map_err(|e| message(format!("{}: {e}", p.display())))
    };
    let mut cluster = json!({});
    if let Some(ca) = &server.ca {
        cluster["certificate-authority"] = json!(absolute(ca)?);
    }
    if let Some(name) = &server.tls_server_name {
        cluster["tls-server-name"] = json!(name);
    }
    let mut user = json!({});
    if let Some(token) = &server.token_file {
        user["tokenFile"] = json!(absolute(token)?);
    }
    if let (Some(cert), Some(key)) = (&server.cert, &server.key) {
        user["client-certificate"] = json!(absolute(cert)?);
        user["client-key"] = json!(absolute(key)?);
    }
    let scoped: Vec<(String, String)> = std::iter::once(("fleet".to_string(), "*".to_string()))
        .chain(clusters.iter().map(|c| (c.clone(), c.clone())))
        .collect();
    let entries: Vec<Value> = scoped
        .iter()
        .map(|(name, path)| {
            let mut c = cluster.clone();
            c["server"] = json!(format!("{api}/clusters/{path}"));
            json!({"name": name, "cluster": c})
        })
        .collect();
    let contexts: Vec<Value> = scoped
        .iter()
        .map(|(name, _)| json!({"name": name, "context": {"cluster": name, "user": "fleetscope"}}))
        .collect();
    Ok(json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": entries,
        "users": [{"name": "fleetscope", "user": user}],
        "contexts": contexts,
        "current-context": "fleet",
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_context_for_the_fleet_and_each_cluster_with_the_caller_s_credentials() {
        let server = args::ServerArg {
            server: "https://fleetscope:50051".into(),
            ca: Some("ca.crt".into()),
            cert: None,
            key: None,
            token_file: Some("/run/token".into()),
            tls_server_name: None,
        };
        let k = of("https://fleetscope:6443", &["prod-1".into()], &server).unwrap();
        assert_eq!(k["current-context"], "fleet");
        assert_eq!(
            k["clusters"][0]["cluster"]["server"],
            "https://fleetscope:6443/clusters/*"
        );
        assert_eq!(
            k["clusters"][1]["cluster"]["server"],
            "https://fleetscope:6443/clusters/prod-1"
        );
        assert!(
            k["clusters"][1]["cluster"]["certificate-authority"]
                .as_str()
                .is_some_and(|p| p.starts_with('/') && p.ends_with("/ca.crt"))
        );
        assert_eq!(k["users"][0]["user"]["tokenFile"], "/run/token");
        assert_eq!(k["contexts"][1]["context"]["cluster"], "prod-1");
    }
}
