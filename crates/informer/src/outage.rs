//! One log line per cluster outage, not one per stream per retry: the cluster's loop
//! and each of its streams report their failures and recoveries here, and the cluster
//! is logged as failing (error, with its address and the cause) when the first of
//! them fails while it was healthy, and as recovered (info, with how long it was
//! down) when the last of them works again; while it stays down, a reminder (warn, with
//! how long and the latest cause) at most every [`REMIND_EVERY`]. Everything else in
//! between is at debug level.

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
    /// When the outage was last logged (its start, or a reminder).
    logged: Option<Instant>,
}

/// How often a cluster that stays down is logged again.
pub const REMIND_EVERY: std::time::Duration = std::time::Duration::from_secs(600);

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
        self.failed_at(what, cause, Instant::now()) == Logged::Began
    }

    /// [`Outage::failed`] at `now`: what it logged.
    fn failed_at(&self, what: &str, cause: &str, now: Instant) -> Logged {
        let mut s = self.lock();
        let server = s.server.clone();
        let last = s.logged;
        match &mut s.down {
            Some((since, failing)) => {
                failing.insert(what.to_string());
                let since = *since;
                if last.is_some_and(|t| now.duration_since(t) >= REMIND_EVERY) {
                    s.logged = Some(now);
                    let down_for = now.duration_since(since);
                    tracing::warn!(cluster = %self.cluster, server = %server, down_for = ?down_for, failing = what, error = %cause, "cluster still failing");
                    return Logged::Reminded;
                }
                tracing::debug!(cluster = %self.cluster, server = %server, failing = what, error = %cause, "still failing");
                Logged::Quiet
            }
            None => {
                s.down = Some((now, BTreeSet::from([what.to_string()])));
                s.logged = Some(now);
                tracing::error!(cluster = %self.cluster, server = %server, failing = what, error = %cause, "cluster failing: retrying with backoff, logged again when it recovers (and every 10 minutes while it does not)");
                Logged::Began
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

/// What a failure logged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Logged {
    /// The outage's first line.
    Began,
    /// A reminder that it goes on.
    Reminded,
    /// Nothing above debug level.
    Quiet,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cluster_that_stays_down_is_recalled_at_a_bounded_rate() {
        let o = Outage::new(ClusterName::from("c"));
        let t0 = Instant::now();
        let at = |s: u64| t0 + std::time::Duration::from_secs(s);
        assert_eq!(o.failed_at("connect", "refused", at(0)), Logged::Began);
        // A retry every second for ten minutes: quiet.
        for s in 1..600 {
            assert_eq!(
                o.failed_at("connect", "refused", at(s)),
                Logged::Quiet,
                "{s}"
            );
        }
        assert_eq!(o.failed_at("connect", "refused", at(600)), Logged::Reminded);
        assert_eq!(o.failed_at("connect", "refused", at(601)), Logged::Quiet);
        assert_eq!(
            o.failed_at("connect", "refused", at(1200)),
            Logged::Reminded
        );
    }

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
