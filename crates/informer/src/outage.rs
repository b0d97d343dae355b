//! One log line per cluster outage, not one per stream per retry: the cluster's loop
//! and each of its streams report their failures and recoveries here, and the cluster
//! is logged as failing (error, with its address and the cause) when the first of
//! them fails while it was healthy, and as recovered (info, with how long it was
//! down) when the last of them works again. Everything in between is at debug level.

use std::collections::BTreeSet;
use std::sync::Mutex;
use std::time::Instant;

use fleetscope_model::ClusterName;

/// A cluster's outage, if it is in one.
#[derive(Debug)]
pub struct Outage {
    cluster: ClusterName,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// The API server's address, once known.
    server: String,
    /// Since when, and what is failing (`connect`, `discovery`, or a stream's type).
    down: Option<(Instant, BTreeSet<String>)>,
}

impl Outage {
    /// The tracker of one cluster, healthy.
    pub fn new(cluster: ClusterName) -> Self {
        Self {
            cluster,
            state: Mutex::default(),
        }
    }

    /// The cluster's API server address, for the log lines.
    pub fn server(&self, server: &str) {
        self.lock().server = server.to_string();
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// `what` failed with `cause`. Returns whether this began the outage (and was
    /// logged at error level).
    pub fn failed(&self, what: &str, cause: &str) -> bool {
        let mut s = self.lock();
        let server = s.server.clone();
        match &mut s.down {
            Some((_, failing)) => {
                failing.insert(what.to_string());
                tracing::debug!(cluster = %self.cluster, server = %server, failing = what, error = %cause, "still failing");
                false
            }
            None => {
                s.down = Some((Instant::now(), BTreeSet::from([what.to_string()])));
                tracing::error!(cluster = %self.cluster, server = %server, failing = what, error = %cause, "cluster failing: retrying with backoff, logged again when it recovers");
                true
            }
        }
    }

    /// `what` works (again). Returns whether this ended the outage (and was logged).
    pub fn recovered(&self, what: &str) -> bool {
        let mut s = self.lock();
        let server = s.server.clone();
        let Some((since, failing)) = &mut s.down else {
            return false;
        };
        failing.remove(what);
        if !failing.is_empty() {
            return false;
        }
        let after = since.elapsed();
        s.down = None;
        tracing::info!(cluster = %self.cluster, server = %server, down_for = ?after, "cluster recovered");
        true
    }

    /// Forgets `what` (a stream stopped for good): it no longer holds the outage open.
    pub fn forget(&self, what: &str) {
        self.recovered(what);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_outage_begins_with_the_first_failure_and_ends_with_the_last_recovery() {
        let o = Outage::new(ClusterName::from("c"));
        o.server("https://10.0.0.1:6443");
        assert!(!o.recovered("pods"), "healthy: nothing to recover from");
        assert!(o.failed("pods", "connection refused"));
        assert!(
            !o.failed("pods", "connection refused"),
            "a retry is not a new outage"
        );
        assert!(!o.failed("configmaps", "connection refused"));
        assert!(!o.recovered("pods"), "configmaps still fails");
        assert!(o.recovered("configmaps"));
        assert!(o.failed("connect", "timed out"), "a new outage");
        o.forget("connect");
        assert!(!o.recovered("connect"));
    }
}
