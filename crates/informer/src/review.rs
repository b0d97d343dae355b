//! Delegated authentication: a bearer token checked by a cluster's own
//! authenticators with a TokenReview (`authentication.k8s.io/v1`), as kube-apiserver's
//! webhook token authenticator and the aggregated API servers do. The caller (the
//! front end) caches the answers.

use std::time::Duration;

use crate::source::{ClusterSource, SourceError, connect};

/// What a cluster said of a token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reviewed {
    /// The token is good: who it stands for.
    Authenticated {
        /// The user name.
        user: String,
        /// The user's groups.
        groups: Vec<String>,
    },
    /// The token is not good, and why (for a log line, never for the caller).
    Refused(String),
}

/// A TokenReview could not be made: the reviewing cluster is unreachable or refused
/// fleetscope (a transient state: the caller may retry).
#[derive(Debug, thiserror::Error)]
pub enum ReviewError {
    /// The reviewing cluster's client could not be made.
    #[error(transparent)]
    Source(#[from] SourceError),
    /// The TokenReview request failed.
    #[error("TokenReview at cluster {cluster}: {source}")]
    Request {
        /// The reviewing cluster.
        cluster: String,
        /// Why.
        #[source]
        source: kube::Error,
    },
}

/// A client kept between reviews, and when its credential expires.
type Kept =
    std::sync::Arc<tokio::sync::Mutex<Option<(kube::Client, Option<std::time::SystemTime>)>>>;

/// Checks tokens with one cluster's TokenReview API, over one client kept between
/// reviews (made again after a failure, or when its exec credential expires).
#[derive(Clone)]
pub struct TokenReviewer {
    source: ClusterSource,
    exec_timeout: Duration,
    audiences: Vec<String>,
    client: Kept,
}

impl TokenReviewer {
    /// Reviews tokens at `source`'s cluster (its credentials need `create` on
    /// `tokenreviews`), for `audiences` (empty: the API server's own).
    pub fn new(source: ClusterSource, exec_timeout: Duration, audiences: Vec<String>) -> Self {
        Self {
            source,
            exec_timeout,
            audiences,
            client: Default::default(),
        }
    }

    /// The client to review with: the one kept, unless its credential has expired.
    async fn client(&self) -> Result<kube::Client, ReviewError> {
        let mut kept = self.client.lock().await;
        if let Some((client, expires)) = kept.as_ref()
            && expires.is_none_or(|e| e > std::time::SystemTime::now())
        {
            return Ok(client.clone());
        }
        let conn = connect(&self.source, self.exec_timeout, None).await?;
        *kept = Some((conn.client.clone(), conn.expires));
        Ok(conn.client)
    }

    /// The reviewing cluster.
    pub fn cluster(&self) -> &str {
        &self.source.name
    }

    /// Asks the cluster about `token`.
    pub async fn review(&self, token: &str) -> Result<Reviewed, ReviewError> {
        let client = self.client().await?;
        let mut spec = serde_json::json!({ "token": token });
        if !self.audiences.is_empty() {
            spec["audiences"] = serde_json::json!(self.audiences);
        }
        let review = serde_json::json!({
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenReview",
            "spec": spec,
        });
        let request = http::Request::post("/apis/authentication.k8s.io/v1/tokenreviews")
            .header(http::header::CONTENT_TYPE, "application/json")
            .body(review.to_string().into_bytes())
            .map_err(|e| ReviewError::Request {
                cluster: self.source.name.clone(),
                source: kube::Error::HttpError(e),
            })?;
        let answer = match client.request::<serde_json::Value>(request).await {
            Ok(a) => a,
            Err(source) => {
                // Made again for the next review: the server may have moved on.
                *self.client.lock().await = None;
                return Err(ReviewError::Request {
                    cluster: self.source.name.clone(),
                    source,
                });
            }
        };
        let status = &answer["status"];
        if status["authenticated"] != serde_json::Value::Bool(true) {
            return Ok(Reviewed::Refused(
                status["error"]
                    .as_str()
                    .unwrap_or("not authenticated")
                    .to_string(),
            ));
        }
        let user = &status["user"];
        match user["username"].as_str().filter(|u| !u.is_empty()) {
            Some(name) => Ok(Reviewed::Authenticated {
                user: name.to_string(),
                groups: user["groups"]
                    .as_array()
                    .map(|g| {
                        g.iter()
                            .filter_map(|v| v.as_str().map(str::to_string))
                            .collect()
                    })
                    .unwrap_or_default(),
            }),
            None => Ok(Reviewed::Refused(
                "authenticated without a user name".to_string(),
            )),
        }
    }
}
