//! Stream progress waiting for its batch: what the ingest records of each update
//! (a list, an event, a bookmark, a new state, a cluster gone), kept in order with
//! the changes of its batch by the persister, and reported to the status table once
//! that batch is visible. Below both the ingest that writes it and the persister
//! that carries it.

use std::collections::HashMap;
use std::sync::Arc;

use fleetscope_informer::StreamId;
use fleetscope_model::ClusterName;

use crate::status::StatusTable;

/// Stream progress in the order it happened, waiting to be reported with the batch
/// it belongs to. Consecutive events and bookmarks of one stream fold into one entry,
/// so a backlog that waits on a slow store stays small.
#[derive(Default)]
pub struct ProgressLog {
    entries: Vec<Entry>,
    /// Each stream's last entry.
    last: HashMap<(ClusterName, Arc<str>), usize>,
}

/// One entry of a [`ProgressLog`].
enum Entry {
    Stream(Arc<StreamId>, Progress),
    /// The cluster left the fleet; its objects were kept or deleted.
    ClusterGone(ClusterName, bool),
}

impl ProgressLog {
    /// Records a stream's progress.
    pub fn push(&mut self, stream: Arc<StreamId>, progress: Progress) {
        let key = (stream.cluster.clone(), stream.name.clone());
        if let Some(&i) = self.last.get(&key)
            && let Entry::Stream(_, earlier) = &mut self.entries[i]
            && let Some(folded) = earlier.fold(&progress)
        {
            *earlier = folded;
            return;
        }
        self.last.insert(key, self.entries.len());
        self.entries.push(Entry::Stream(stream, progress));
    }

    /// Records that a cluster left the fleet.
    pub(crate) fn gone(&mut self, cluster: ClusterName, kept: bool) {
        self.last.retain(|(c, _), _| *c != cluster);
        self.entries.push(Entry::ClusterGone(cluster, kept));
    }

    /// Appends later progress.
    pub(crate) fn append(&mut self, later: ProgressLog) {
        for entry in later.entries {
            match entry {
                Entry::Stream(stream, progress) => self.push(stream, progress),
                Entry::ClusterGone(cluster, kept) => self.gone(cluster, kept),
            }
        }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Reports the progress to the status table, in order.
    pub(crate) fn apply(self, status: &StatusTable) {
        for entry in self.entries {
            let (stream, progress) = match entry {
                Entry::Stream(stream, progress) => (stream, progress),
                Entry::ClusterGone(cluster, kept) => {
                    status.cluster_gone(&cluster, kept);
                    continue;
                }
            };
            let (cluster, rt) = (&stream.cluster, &stream.resource);
            match progress {
                Progress::Dropped => {}
                Progress::Listed(rv) => status.stream_listed(cluster, rt, &rv),
                Progress::Event(rv) => status.stream_progress(cluster, rt, &rv, true),
                Progress::Bookmark(rv) => status.stream_progress(cluster, rt, &rv, false),
                Progress::State(state, error) => status.stream_state(cluster, rt, state, error),
            }
        }
    }
}

/// What an update says about its stream, recorded once its batch is visible.
pub enum Progress {
    /// The stream's type is gone: its objects were dropped.
    Dropped,
    /// A complete list at this resourceVersion.
    Listed(String),
    /// An event at this resourceVersion.
    Event(String),
    /// A bookmark at this resourceVersion.
    Bookmark(String),
    /// A new state, and why when it is not healthy.
    State(fleetscope_informer::StreamState, Option<String>),
}

impl Progress {
    /// One entry for this and `later`, when both are events or bookmarks: the later
    /// resourceVersion, an event if either was.
    fn fold(&self, later: &Progress) -> Option<Progress> {
        match (self, later) {
            (Progress::Event(_), Progress::Event(rv) | Progress::Bookmark(rv))
            | (Progress::Bookmark(_), Progress::Event(rv)) => Some(Progress::Event(rv.clone())),
            (Progress::Bookmark(_), Progress::Bookmark(rv)) => Some(Progress::Bookmark(rv.clone())),
            _ => None,
        }
    }
}
