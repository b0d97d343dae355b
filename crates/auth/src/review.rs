//! Delegated authentication: a bearer token the tokens file does not know is checked
//! with a TokenReview at a configured cluster, and the answer kept, by the token's
//! SHA-256, for a bounded time (a refusal for a shorter one), so a busy caller costs
//! the cluster one review per TTL.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
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
    /// Reviews under way, by the token's SHA-256: callers of one token wait for its one
    /// review (a thousand Watches of one token ask once when its answer expires).
    reviewing: Mutex<HashMap<[u8; 32], Arc<tokio::sync::Mutex<()>>>>,
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
            reviewing: Mutex::new(HashMap::new()),
        }
    }

    /// The answer cached for `key`, if it is still good.
    fn cached(&self, key: &[u8; 32]) -> Option<Option<Subject>> {
        let cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        cache
            .get(key)
            .filter(|(until, _)| *until > Instant::now())
            .map(|(_, answer)| answer.clone())
    }

    /// Who `token` stands for (`None`: no one), from the cache or a review.
    pub async fn subject(&self, token: &str) -> Result<Option<Subject>, ReviewFailed> {
        let key = super::tokens::hash(token);
        if let Some(answer) = self.cached(&key) {
            return Ok(answer);
        }
        // One review per token at a time: the others wait for it, then read its answer.
        let turn = self
            .reviewing
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(key)
            .or_default()
            .clone();
        let _turn = turn.lock().await;
        let answered = self.cached(&key);
        let result = match answered {
            Some(answer) => Ok(answer),
            None => self.review(token, key).await,
        };
        let mut reviewing = self.reviewing.lock().unwrap_or_else(|e| e.into_inner());
        // The last one out takes the entry away (the map holds one, and this `turn`).
        if Arc::strong_count(&turn) <= 2 {
            reviewing.remove(&key);
        }
        result
    }

    /// Reviews `token` (whose SHA-256 is `key`) and caches the answer.
    async fn review(&self, token: &str, key: [u8; 32]) -> Result<Option<Subject>, ReviewFailed> {
        let now = Instant::now();
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
