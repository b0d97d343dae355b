//! Delegated authentication: a bearer token the tokens file does not know is checked
//! with a TokenReview at a configured cluster, and the answer kept, by the token's
//! SHA-256, for a bounded time (a refusal for a shorter one), so a busy caller costs
//! the cluster one review per TTL.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use fleetscope_informer::review::{Reviewed, TokenReviewer};
use fleetscope_model::access::Subject;

/// How many answers are kept at most.
const MAX_CACHED: usize = 10_000;

/// Answers kept, by the token's SHA-256: until when, and who (`None`: no one).
type Cache = HashMap<[u8; 32], (Instant, Option<Subject>)>;

/// A TokenReviewer and its cache.
pub struct Reviewer {
    reviewer: TokenReviewer,
    ttl: Duration,
    negative_ttl: Duration,
    timeout: Duration,
    cache: Mutex<Cache>,
}

/// Why a token could not be checked now: a transient state, retryable.
#[derive(Debug, thiserror::Error)]
#[error(
    "checking the bearer token with cluster {cluster} failed: {message}; retry in a few seconds"
)]
pub struct ReviewFailed {
    /// The reviewing cluster.
    pub cluster: String,
    /// Why.
    pub message: String,
}

impl Reviewer {
    /// Reviews with `reviewer`, within `timeout`, keeping a good answer for `ttl` and
    /// a refusal for `negative_ttl`.
    pub fn new(
        reviewer: TokenReviewer,
        ttl: Duration,
        negative_ttl: Duration,
        timeout: Duration,
    ) -> Self {
        Self {
            reviewer,
            ttl,
            negative_ttl,
            timeout,
            cache: Mutex::new(HashMap::new()),
        }
    }

    /// Who `token` stands for (`None`: no one), from the cache or a review.
    pub async fn subject(&self, token: &str) -> Result<Option<Subject>, ReviewFailed> {
        let key = super::tokens::hash(token);
        let now = Instant::now();
        {
            let cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
            if let Some((until, answer)) = cache.get(&key)
                && *until > now
            {
                return Ok(answer.clone());
            }
        }
        let failed = |message: String| ReviewFailed {
            cluster: self.reviewer.cluster().to_string(),
            message,
        };
        let reviewed = tokio::time::timeout(self.timeout, self.reviewer.review(token))
            .await
            .map_err(|_| failed(format!("no answer within {:?}", self.timeout)))?
            .map_err(|e| failed(fleetscope_informer::source::chain(&e)))?;
        let (answer, ttl) = match reviewed {
            Reviewed::Authenticated { user, groups } => (Some(Subject { user, groups }), self.ttl),
            Reviewed::Refused(why) => {
                tracing::debug!(cluster = self.reviewer.cluster(), reason = %why, "a bearer token was refused by its TokenReview");
                (None, self.negative_ttl)
            }
        };
        let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        if cache.len() >= MAX_CACHED {
            cache.retain(|_, (until, _)| *until > now);
            if cache.len() >= MAX_CACHED {
                // Still full of live answers: the soonest to expire go.
                let mut by_expiry: Vec<([u8; 32], Instant)> =
                    cache.iter().map(|(k, (until, _))| (*k, *until)).collect();
                by_expiry.sort_by_key(|(_, until)| *until);
                for (k, _) in by_expiry.into_iter().take(MAX_CACHED / 10) {
                    cache.remove(&k);
                }
            }
        }
        cache.insert(key, (now + ttl, answer.clone()));
        Ok(answer)
    }
}
