//! Exec credential plugins (`users[].user.exec` in a kubeconfig), run by fleetscope
//! itself rather than by the kube client: with a timeout, in their own process group
//! so that a timeout or a shutdown kills the plugin and everything it started, never
//! blocking a thread, and with failures reported without the plugin's output: its
//! stdout carries tokens, and its stderr may carry anything (no redaction can know
//! every way a secret is written). A failure names the plugin and its exit status;
//! the stderr is logged only for an operator who asks for it, at debug level of this
//! module (`RUST_LOG=info,fleetscope_informer::exec=debug`).

use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, SystemTime};

use kube::config::{ExecAuthCluster, ExecConfig};
use serde::Deserialize;
use tokio::io::AsyncReadExt;

/// The most of a plugin's stdout read (an ExecCredential is a few KB).
const MAX_OUTPUT: u64 = 1 << 20;

/// Why a credential plugin gave no credential. Messages name the plugin and never
/// carry its output.
#[derive(Debug, thiserror::Error)]
pub enum ExecError {
    /// The plugin could not be started.
    #[error("exec credential plugin {plugin:?} could not be started")]
    Start {
        /// The plugin's file name.
        plugin: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The plugin did not finish in time; it was killed with its children.
    #[error(
        "exec credential plugin {plugin:?} did not finish within {after:?}: it was stopped (with the processes it started)"
    )]
    TimedOut {
        /// The plugin's file name.
        plugin: String,
        /// The timeout.
        after: Duration,
    },
    /// The plugin failed.
    #[error(
        "exec credential plugin {plugin:?} failed ({status}); its stderr is not shown (log it with RUST_LOG=fleetscope_informer::exec=debug)"
    )]
    Failed {
        /// The plugin's file name.
        plugin: String,
        /// How it ended (exit status or signal).
        status: String,
    },
    /// The plugin's output is not an ExecCredential with a credential in it.
    #[error("exec credential plugin {plugin:?} printed no usable ExecCredential: {reason}")]
    BadOutput {
        /// The plugin's file name.
        plugin: String,
        /// What is wrong, without the output itself.
        reason: String,
    },
    /// The kubeconfig's exec section names no command.
    #[error("the kubeconfig's exec section names no command")]
    NoCommand,
}

/// What a plugin gave.
#[derive(Clone)]
pub struct Credential {
    /// A bearer token.
    pub token: Option<String>,
    /// A client certificate and key, PEM.
    pub client_cert: Option<(String, String)>,
    /// When it expires, if it says.
    pub expires: Option<SystemTime>,
}

impl std::fmt::Debug for Credential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credential")
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .field(
                "client_cert",
                &self.client_cert.as_ref().map(|_| "<redacted>"),
            )
            .field("expires", &self.expires)
            .finish()
    }
}

#[derive(Deserialize)]
struct ExecCredential {
    status: Option<ExecCredentialStatus>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ExecCredentialStatus {
    token: Option<String>,
    client_certificate_data: Option<String>,
    client_key_data: Option<String>,
    expiration_timestamp: Option<String>,
}

/// The plugin's file name, as errors name it.
fn plugin_name(command: &str) -> String {
    Path::new(command)
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| command.to_string())
}

/// Kills a plugin's whole process group when dropped: on success (stragglers), on
/// timeout, and when the task running it is cancelled at shutdown.
struct Group(Option<rustix::process::Pid>);

impl Drop for Group {
    fn drop(&mut self) {
        if let Some(pid) = self.0 {
            // Already gone is fine.
            let _ = rustix::process::kill_process_group(pid, rustix::process::Signal::KILL);
        }
    }
}

/// Runs the plugin of `exec` and returns its credential, within `timeout`.
pub async fn credential(exec: &ExecConfig, timeout: Duration) -> Result<Credential, ExecError> {
    let cluster: Option<&ExecAuthCluster> = exec.cluster.as_ref();
    let command = exec.command.as_deref().ok_or(ExecError::NoCommand)?;
    let plugin = plugin_name(command);
    let mut cmd = tokio::process::Command::new(command);
    cmd.args(exec.args.iter().flatten());
    for env in exec.env.iter().flatten() {
        if let (Some(name), Some(value)) = (env.get("name"), env.get("value")) {
            cmd.env(name, value);
        }
    }
    let mut spec = serde_json::json!({ "interactive": false });
    if exec.provide_cluster_info
        && let Some(c) = cluster
    {
        spec["cluster"] = serde_json::to_value(c).unwrap_or_default();
    }
    let info = serde_json::json!({
        "apiVersion": exec.api_version.as_deref().unwrap_or("client.authentication.k8s.io/v1beta1"),
        "kind": "ExecCredential",
        "spec": spec,
    });
    cmd.env("KUBERNETES_EXEC_INFO", info.to_string());
    for name in exec.drop_env.iter().flatten() {
        cmd.env_remove(name);
    }
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    // A plugin file just written (an installer updating it, or another thread of this
    // process forking while it was open for writing) is briefly busy: try again.
    let mut tries = 0;
    let mut child = loop {
        match cmd.spawn() {
            Err(e) if e.kind() == std::io::ErrorKind::ExecutableFileBusy && tries < 20 => {
                tries += 1;
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            spawned => {
                break spawned.map_err(|source| ExecError::Start {
                    plugin: plugin.clone(),
                    source,
                })?;
            }
        }
    };
    let _group = Group(
        child
            .id()
            .and_then(|id| rustix::process::Pid::from_raw(i32::try_from(id).ok()?)),
    );
    let mut stdout = child.stdout.take();
    let mut stderr = child.stderr.take();
    let run = async {
        let mut out = Vec::new();
        let mut err = Vec::new();
        let read_out = async {
            if let Some(s) = stdout.as_mut() {
                let _ = s.take(MAX_OUTPUT).read_to_end(&mut out).await;
            }
        };
        let read_err = async {
            if let Some(s) = stderr.as_mut() {
                let _ = s.take(MAX_OUTPUT).read_to_end(&mut err).await;
            }
        };
        tokio::join!(read_out, read_err);
        let status = child.wait().await;
        (status, out, err)
    };
    let (status, out, err) =
        tokio::time::timeout(timeout, run)
            .await
            .map_err(|_| ExecError::TimedOut {
                plugin: plugin.clone(),
                after: timeout,
            })?;
    let status = status.map_err(|source| ExecError::Start {
        plugin: plugin.clone(),
        source,
    })?;
    if !status.success() {
        let status = describe_status(status);
        if tracing::enabled!(tracing::Level::DEBUG) {
            let text = String::from_utf8_lossy(&err);
            tracing::debug!(plugin = %plugin, %status, stderr = %text.trim(), "exec credential plugin failed");
        }
        return Err(ExecError::Failed { plugin, status });
    }
    parse(&plugin, &out)
}

fn describe_status(status: std::process::ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exit status {code}"),
        (None, Some(sig)) => format!("killed by signal {sig}"),
        _ => status.to_string(),
    }
}

/// Reads an ExecCredential (JSON, or YAML as client-go also accepts).
fn parse(plugin: &str, out: &[u8]) -> Result<Credential, ExecError> {
    let bad = |reason: &str| ExecError::BadOutput {
        plugin: plugin.to_string(),
        reason: reason.to_string(),
    };
    let text = std::str::from_utf8(out).map_err(|_| bad("its output is not UTF-8"))?;
    let parsed: ExecCredential = serde_json::from_str(text)
        .or_else(|_| serde_saphyr::from_str(text))
        .map_err(|_| bad("its output is not an ExecCredential document"))?;
    let status = parsed
        .status
        .ok_or_else(|| bad("the ExecCredential has no status"))?;
    let expires = match status.expiration_timestamp.as_deref() {
        None | Some("") => None,
        Some(t) => Some(
            t.parse::<jiff::Timestamp>()
                .map(SystemTime::from)
                .map_err(|_| bad("status.expirationTimestamp is not an RFC 3339 time"))?,
        ),
    };
    let client_cert = match (status.client_certificate_data, status.client_key_data) {
        (Some(c), Some(k)) if !c.is_empty() && !k.is_empty() => Some((c, k)),
        (Some(_), None) | (None, Some(_)) => {
            return Err(bad(
                "status has only one of clientCertificateData and clientKeyData",
            ));
        }
        _ => None,
    };
    let token = status.token.filter(|t| !t.is_empty());
    if token.is_none() && client_cert.is_none() {
        return Err(bad(
            "status has neither a token nor a client certificate and key",
        ));
    }
    Ok(Credential {
        token,
        client_cert,
        expires,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exec_credentials_parse_and_bad_ones_are_named_without_their_content() {
        let ok = parse(
            "p",
            br#"{"apiVersion":"client.authentication.k8s.io/v1","kind":"ExecCredential","status":{"token":"abc","expirationTimestamp":"2030-01-01T00:00:00Z"}}"#,
        )
        .unwrap();
        assert_eq!(ok.token.as_deref(), Some("abc"));
        assert!(ok.expires.is_some());
        assert!(!format!("{ok:?}").contains("abc"));
        let e = parse("p", br#"{"status":{"token":"SECRET-1"},"oops""#).unwrap_err();
        assert!(!e.to_string().contains("SECRET"), "{e}");
        let e = parse("p", br#"{"kind":"ExecCredential","status":{}}"#).unwrap_err();
        assert!(e.to_string().contains("neither a token"), "{e}");
    }

    fn script(dir: &Path, name: &str, body: &str) -> String {
        use std::os::unix::fs::PermissionsExt;
        let path = dir.join(name);
        std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        path.display().to_string()
    }

    fn exec(command: String) -> ExecConfig {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "client.authentication.k8s.io/v1",
            "command": command,
        }))
        .unwrap()
    }

    #[tokio::test]
    async fn a_failing_plugin_is_named_with_its_status_and_no_output() {
        let dir = tempfile::tempdir().unwrap();
        let cmd = script(
            dir.path(),
            "fail-plugin",
            r#"echo '{"status":{"token":"TOPSECRET-abc123"}}'; echo 'denied: password is TOPSECRET-abc123' >&2; exit 3"#,
        );
        let e = credential(&exec(cmd), Duration::from_secs(20))
            .await
            .unwrap_err();
        let text = e.to_string();
        assert!(text.contains("fail-plugin"), "{text}");
        assert!(text.contains("exit status 3"), "{text}");
        assert!(!text.contains("denied"), "stderr is not shown: {text}");
        assert!(!text.contains("TOPSECRET"), "{text}");
    }

    #[tokio::test]
    async fn a_hanging_plugin_is_stopped_with_its_children() {
        let dir = tempfile::tempdir().unwrap();
        let pids = dir.path().join("pids");
        let cmd = script(
            dir.path(),
            "hang-plugin",
            &format!(
                "sleep 600 & echo $! > {p}; echo $$ >> {p}; wait",
                p = pids.display()
            ),
        );
        let e = credential(&exec(cmd), Duration::from_millis(500))
            .await
            .unwrap_err();
        assert!(matches!(e, ExecError::TimedOut { .. }), "{e}");
        assert!(e.to_string().contains("hang-plugin"), "{e}");
        let text = std::fs::read_to_string(&pids).unwrap();
        for pid in text.split_whitespace() {
            // Killed processes may linger as zombies until reaped: check the state too.
            let deadline = std::time::Instant::now() + Duration::from_secs(20);
            loop {
                let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
                let gone = stat.is_empty() || stat.split_whitespace().nth(2) == Some("Z");
                if gone {
                    break;
                }
                assert!(
                    std::time::Instant::now() < deadline,
                    "process {pid} still runs"
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    }

    #[tokio::test]
    async fn a_working_plugin_gives_its_token() {
        let dir = tempfile::tempdir().unwrap();
        let cmd = script(
            dir.path(),
            "good-plugin",
            r#"echo '{"apiVersion":"client.authentication.k8s.io/v1","kind":"ExecCredential","status":{"token":"t-1"}}'"#,
        );
        let c = credential(&exec(cmd), Duration::from_secs(20))
            .await
            .unwrap();
        assert_eq!(c.token.as_deref(), Some("t-1"));
    }
}
