//! What a router measures of its replicas, for its `/metrics`: each replica's calls
//! (how long each took to its answer, or to a Watch's start) and failures by gRPC
//! code, counted as they happen; the ring as the router sees it (members, clusters
//! nobody serves, Leases refused) and its connections, read when scraped.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;

use fleetscope_model::FleetError;
use fleetscope_model::fleet::Histogram;

/// One replica's calls.
#[derive(Debug, Clone, Default)]
pub struct ReplicaCalls {
    /// How long each call took, answered or not.
    pub latency: Histogram,
    /// Calls that failed, by gRPC code.
    pub errors: BTreeMap<String, u64>,
}

/// Every replica's calls, by identity.
#[derive(Debug, Default)]
pub struct Stats(Mutex<BTreeMap<String, ReplicaCalls>>);

impl Stats {
    /// Counts one call to `replica` that took `took` and ended in `outcome`.
    pub fn record(&self, replica: &str, took: Duration, outcome: Result<(), &FleetError>) {
        let mut all = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let calls = all.entry(replica.to_string()).or_default();
        calls.latency.observe(took);
        if let Err(e) = outcome {
            *calls.errors.entry(code(e)).or_default() += 1;
        }
    }

    /// Every replica's calls so far.
    pub fn calls(&self) -> BTreeMap<String, ReplicaCalls> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

/// The gRPC code a failure stands for, as a metric label (`Unavailable`,
/// `DeadlineExceeded`, …: the codes' names, as gRPC's own metrics write them).
fn code(e: &FleetError) -> String {
    format!("{:?}", fleetscope_grpc::status::status(e.clone()).code())
}

/// The ring as a router sees it when scraped.
#[derive(Debug, Clone, Default)]
pub struct RingFigures {
    /// Live members.
    pub members: usize,
    /// The ring's clusters no replica serves now.
    pub unserved: usize,
    /// Leases of the ring not taken (not sealed with the ring's key, or written back).
    pub refused: usize,
    /// Per replica address: connections open, calls open on them.
    pub connections: BTreeMap<String, (usize, usize)>,
    /// Per replica identity: its calls.
    pub calls: BTreeMap<String, ReplicaCalls>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calls_are_counted_per_replica_with_their_failures_by_code() {
        let stats = Stats::default();
        stats.record("a", Duration::from_millis(2), Ok(()));
        let e = FleetError::Unavailable("down".into());
        stats.record("a", Duration::from_secs(6), Err(&e));
        stats.record("b", Duration::from_millis(1), Ok(()));
        let calls = stats.calls();
        assert_eq!(calls["a"].latency.count(), 2);
        assert_eq!(calls["a"].errors["Unavailable"], 1);
        assert!(calls["b"].errors.is_empty());
    }
}
