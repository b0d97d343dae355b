//! The next page of a routed list, asked of its replica while the caller reads this
//! one. A caller paging through a list asks for each page once it has read the one
//! before: the replica's work, the hop and the router's decoding of each page would
//! add to the caller's. The router asks, as soon as it answers a page, for what the
//! next page will ask the replica first (the same request: the same snapshot, from
//! the same key), and answers that page from it when it comes. A page continues a
//! snapshot, so the replica's answer is the same whenever it is asked; one not taken
//! within [`KEPT`] is let go, as is the oldest past [`AT_MOST`].

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use fleetscope_model::FleetError;
use fleetscope_model::fleet::{ListAnswer, ListRequest};
use tokio::sync::oneshot;

/// How long a page asked ahead is kept for the caller to ask for it.
const KEPT: Duration = Duration::from_secs(10);

/// The most pages asked ahead held at once (across callers).
const AT_MOST: usize = 64;

/// A replica's answer, to come.
type Coming = oneshot::Receiver<Result<ListAnswer, FleetError>>;

/// Pages asked ahead, by what was asked of whom.
#[derive(Default)]
pub(super) struct Prefetched(Mutex<VecDeque<(String, Instant, Coming)>>);

/// What identifies a request to a replica: who asks it, of which replica, what.
pub(super) fn key(replica: &str, r: &ListRequest) -> String {
    format!(
        "{replica}|{}|{}|{:?}|{:?}|{:?}|{}|{}|{:?}|{}",
        r.access.caller(),
        fleetscope_grpc::remote::fingerprint(&r.query, r.projection),
        r.query.clusters.patterns(),
        r.query.clusters.selector(),
        r.after,
        r.limit,
        r.max_bytes,
        r.resume,
        r.keep_snapshot,
    )
}

impl Prefetched {
    /// Holds the answer to come for `key`, letting go of those kept too long and the
    /// oldest past [`AT_MOST`].
    pub(super) fn put(&self, key: String, coming: Coming) {
        let mut held = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        held.retain(|(_, at, _)| now.duration_since(*at) < KEPT);
        held.push_back((key, now, coming));
        while held.len() > AT_MOST {
            held.pop_front();
        }
    }

    /// The answer asked ahead for `key`, if one is held: taken.
    pub(super) fn take(&self, key: &str) -> Option<Coming> {
        let mut held = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        held.retain(|(_, at, _)| now.duration_since(*at) < KEPT);
        let i = held.iter().position(|(k, _, _)| k == key)?;
        held.remove(i).map(|(_, _, coming)| coming)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(limit: usize) -> ListRequest {
        let (_, policy) =
            tokio::sync::watch::channel(std::sync::Arc::new(fleetscope_model::access::Everything)
                as std::sync::Arc<dyn fleetscope_model::access::Policy>);
        let mut r = ListRequest::for_caller(fleetscope_model::Access::new(
            fleetscope_model::access::Subject::unrestricted(),
            policy,
        ));
        r.limit = limit;
        r
    }

    #[test]
    fn a_page_asked_ahead_is_taken_once_by_the_same_request_of_the_same_replica() {
        let prefetched = Prefetched::default();
        let (tx, rx) = oneshot::channel();
        prefetched.put(key("a", &request(500)), rx);
        assert!(prefetched.take(&key("b", &request(500))).is_none());
        assert!(prefetched.take(&key("a", &request(50))).is_none());
        let mut coming = prefetched.take(&key("a", &request(500))).unwrap();
        assert!(prefetched.take(&key("a", &request(500))).is_none());
        tx.send(Err(FleetError::Unavailable("x".into()))).unwrap();
        assert!(coming.try_recv().unwrap().is_err());
    }

    #[test]
    fn at_most_so_many_are_held_the_oldest_let_go() {
        let prefetched = Prefetched::default();
        let mut senders = Vec::new();
        for i in 0..=AT_MOST {
            let (tx, rx) = oneshot::channel();
            senders.push(tx);
            prefetched.put(key(&format!("r{i}"), &request(1)), rx);
        }
        assert!(prefetched.take(&key("r0", &request(1))).is_none());
        assert!(prefetched.take(&key("r1", &request(1))).is_some());
        // The first one's answer has nowhere to go.
        assert!(
            senders
                .remove(0)
                .send(Err(FleetError::Unavailable("x".into())))
                .is_err()
        );
    }
}
