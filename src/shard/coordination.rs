//! The coordination cluster's client. Its credential, when an exec plugin gives one
//! that expires (EKS, GKE and most cloud logins do, within minutes to an hour), is
//! fetched again a minute ahead of its expiry, as client-go's exec authenticator
//! does; every request then carries the newest. A renewal that fails is retried with
//! backoff while the credential in hand still works, and logged.

use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime};

use fleetscope_informer::ClusterSource;
use fleetscope_informer::source::SourceError;
use tokio_util::sync::CancellationToken;

/// How long before its expiry a credential is fetched again.
const AHEAD: Duration = Duration::from_secs(60);
/// The soonest a credential is fetched again after the last fetch.
const SOONEST: Duration = Duration::from_secs(10);

/// A client for `source` whose exec credential is renewed ahead of its expiry until
/// `stop`; a plain client when the credential does not expire.
pub async fn client(
    source: &ClusterSource,
    exec_timeout: Duration,
    stop: CancellationToken,
) -> Result<kube::Client, SourceError> {
    let (client, expires) = fleetscope_informer::source::client(source, exec_timeout).await?;
    let Some(expires) = expires else {
        return Ok(client);
    };
    let namespace = client.default_namespace().to_string();
    let current = Arc::new(RwLock::new(client));
    let renewed = current.clone();
    let source = source.clone();
    crate::tasks::spawn("coordination-credential", async move {
        let mut expires = expires;
        let mut retry = SOONEST;
        loop {
            let wait = expires
                .duration_since(SystemTime::now())
                .unwrap_or_default()
                .saturating_sub(AHEAD)
                .max(SOONEST);
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                _ = stop.cancelled() => return,
            }
            match fleetscope_informer::source::client(&source, exec_timeout).await {
                Ok((client, next)) => {
                    *renewed.write().unwrap_or_else(|e| e.into_inner()) = client;
                    tracing::debug!(cluster = %source.name, "the coordination cluster's credential was renewed");
                    retry = SOONEST;
                    match next {
                        Some(next) => expires = next,
                        // No longer expiring: the one in hand serves from now on.
                        None => return,
                    }
                }
                Err(e) => {
                    tracing::warn!(cluster = %source.name, error = %crate::sources::chain(&e), "renewing the coordination cluster's credential failed: retrying");
                    retry = (retry * 2).min(Duration::from_secs(60));
                    // Retried after `retry`, however close the expiry.
                    expires = SystemTime::now() + AHEAD + retry;
                }
            }
        }
    });
    let service = tower::service_fn(move |request: http::Request<kube::client::Body>| {
        let client = current.read().unwrap_or_else(|e| e.into_inner()).clone();
        async move { client.send(request).await }
    });
    Ok(kube::Client::new(service, namespace))
}
