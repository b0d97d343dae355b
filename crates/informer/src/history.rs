//! A member's history of one stream, read for one subscriber: the state at exactly
//! a resourceVersion, then every change after it, as the member's API server keeps
//! them (its etcd's history). A replica that takes a cluster over reads it to carry a
//! subscriber from where it stood (by another replica's reckoning) up to where its
//! own stream stands, so the subscriber sees every change once rather than the
//! cluster's objects anew. It reads with the stream's own client and settings, so
//! its objects are selected and pruned exactly as the stream's are.

use std::sync::Arc;

use kube::Client;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::stream::{Informer, ListFrom, ListStop, Stop, StreamConfig, StreamId, Update};

/// What reads a stream's history: its client and settings, lent by the cluster's
/// loop while the stream runs (see [`crate::Report::history`]).
#[derive(Clone)]
pub struct History {
    client: Client,
    id: Arc<StreamId>,
    config: StreamConfig,
    /// Places for reads of this stream's history at once, shared by every clone: the
    /// member is read by at most [`READS_AT_ONCE`] subscribers together; others wait.
    reads: Arc<tokio::sync::Semaphore>,
}

/// Reads of one stream's history at once, whatever asks for them: more wait, so that
/// no number of subscribers resuming together makes the replica hammer a member.
pub const READS_AT_ONCE: usize = 2;

impl std::fmt::Debug for History {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("History")
            .field("cluster", &self.id.cluster)
            .field("resource", &self.id.name)
            .finish_non_exhaustive()
    }
}

/// Why a read of history ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HistoryEnd {
    /// The member no longer holds the resourceVersion (410 Gone): the history is
    /// compacted away.
    Expired,
    /// The read failed (unreachable, refused, malformed); for a person to read.
    Failed(String),
    /// Cancelled, or whoever read it is gone.
    Cancelled,
}

/// How many times in a row a watch may end without a single update before the read
/// is taken as failed rather than reopened.
const EMPTY_REOPENS: u32 = 5;

impl History {
    pub(crate) fn new(client: Client, id: Arc<StreamId>, config: StreamConfig) -> Self {
        Self {
            client,
            id,
            config,
            reads: Arc::new(tokio::sync::Semaphore::new(READS_AT_ONCE)),
        }
    }

    /// Waits for a place to read the member (see [`READS_AT_ONCE`]); `None` when
    /// cancelled first.
    async fn place(&self, cancel: &CancellationToken) -> Option<tokio::sync::OwnedSemaphorePermit> {
        tokio::select! {
            p = self.reads.clone().acquire_owned() => p.ok(),
            _ = cancel.cancelled() => None,
        }
    }

    /// The member's newest resourceVersion of the stream's collection now (a
    /// consistent list of one object), within the same places as reads.
    pub async fn newest(&self, cancel: CancellationToken) -> Result<String, HistoryEnd> {
        let Some(_place) = self.place(&cancel).await else {
            return Err(HistoryEnd::Cancelled);
        };
        let (tx, _) = mpsc::channel(1);
        self.informer(tx, cancel).newest().await.map_err(ended)
    }

    /// An informer of the stream with its client and settings, for one read, handing
    /// its updates to `tx`.
    fn informer(&self, tx: mpsc::Sender<Update>, cancel: CancellationToken) -> Informer {
        let outage = Arc::new(crate::outage::Outage::new(self.id.cluster.clone()));
        Informer::new(
            self.client.clone(),
            self.id.clone(),
            outage,
            self.config.clone(),
            tx,
            cancel,
        )
    }

    /// The stream this reads.
    pub fn stream(&self) -> &Arc<StreamId> {
        &self.id
    }

    /// Reads the stream's history from `from` until cancelled (once a place is free:
    /// see [`READS_AT_ONCE`]): first
    /// [`Update::Listed`] with the state at exactly `from`, then each change after it
    /// ([`Update::Applied`], [`Update::Deleted`]) and the member's bookmarks
    /// ([`Update::Progress`]), in the member's order, on `tx`. A watch that ends is
    /// reopened from the last resourceVersion seen. Returns why it stopped.
    pub async fn read(
        &self,
        from: &str,
        tx: mpsc::Sender<Update>,
        cancel: CancellationToken,
    ) -> HistoryEnd {
        let Some(_place) = self.place(&cancel).await else {
            return HistoryEnd::Cancelled;
        };
        let informer = self.informer(tx, cancel);
        let listed = match informer
            .list(&ListFrom::Exact(from.to_string()), None)
            .await
        {
            Ok(listed) => listed,
            Err(ListStop::Stop(stop)) => return ended(stop),
            Err(ListStop::Unsupported(why)) => return HistoryEnd::Failed(why),
        };
        let update = Update::Listed {
            stream: self.id.clone(),
            objects: listed.objects,
            parts: None,
            resource_version: listed.resource_version,
            reason: crate::stream::ListReason::Initial,
            method: None,
            fallback: None,
        };
        if !informer.send(update).await {
            return HistoryEnd::Cancelled;
        }
        let mut seen = from.to_string();
        let mut empty = 0;
        loop {
            let (stop, reached) = informer.watch(&seen, None).await;
            if reached == seen {
                empty += 1;
            } else {
                empty = 0;
            }
            seen = reached;
            match stop {
                Stop::Reconnect if empty < EMPTY_REOPENS => continue,
                Stop::Reconnect => {
                    return HistoryEnd::Failed(format!(
                        "the member ended {EMPTY_REOPENS} watches from resourceVersion {seen} without a change"
                    ));
                }
                other => return ended(other),
            }
        }
    }
}

/// What a stop of a list or watch means to a read of history.
fn ended(stop: Stop) -> HistoryEnd {
    match stop {
        Stop::Expired => HistoryEnd::Expired,
        Stop::Cancelled => HistoryEnd::Cancelled,
        Stop::Reconnect | Stop::Confirm => HistoryEnd::Failed("the member ended the list".into()),
        Stop::Forbidden(m)
        | Stop::NotFound(m)
        | Stop::Invalid(m)
        | Stop::Failed(m)
        | Stop::Throttled(m, _) => HistoryEnd::Failed(m),
    }
}
