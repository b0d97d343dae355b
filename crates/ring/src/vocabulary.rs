//! What a ring's Leases say: the label naming the ring, and the annotations a replica
//! publishes on its Lease (its address, the clusters it holds and holds ready, the
//! ring's configured clusters as it sees them, whether it is leaving), with the
//! readings of them every part of the ring shares.

use std::collections::{BTreeMap, BTreeSet};

/// The label every Lease of a ring carries, naming the ring.
pub const RING_LABEL: &str = "fleetscope.io/ring";

/// The annotation naming the process that holds a Lease (random for each start), so
/// that two processes given one identity tell each other apart.
pub const INSTANCE: &str = "fleetscope.io/instance";

/// The annotation naming the address a replica's gRPC listener is reached at.
pub const ADDRESS: &str = "fleetscope.io/address";
/// The annotation listing the clusters a replica holds synced, comma-separated.
pub const READY: &str = "fleetscope.io/ready";
/// The annotation listing the clusters a replica runs, ready or not (a router counts
/// one that no replica holds ready as unserved, never as absent).
pub const HELD: &str = "fleetscope.io/held";
/// The annotation listing the configured clusters no live replica publishes ready,
/// as this replica sees the ring: a router reports them unowned.
pub const UNOWNED: &str = "fleetscope.io/unowned";
/// The annotation listing every cluster the ring is configured with, as this
/// replica's configuration has it: a router knows from it which clusters the ring
/// has, served or not.
pub const CLUSTERS: &str = "fleetscope.io/clusters";
/// The annotation a replica sets while it shuts down: the others take its clusters
/// over as if it had left, while it still serves them.
pub const LEAVING: &str = "fleetscope.io/leaving";

/// A member of a ring, as its Lease shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    /// Its identity (the Lease's holder).
    pub identity: String,
    /// What it publishes on its Lease.
    pub annotations: BTreeMap<String, String>,
}

/// The clusters a member publishes ready.
pub fn ready_of(member: &Member) -> BTreeSet<&str> {
    listed(member, READY)
}

/// The comma-separated names a member publishes under `annotation`.
pub fn listed<'a>(member: &'a Member, annotation: &str) -> BTreeSet<&'a str> {
    member
        .annotations
        .get(annotation)
        .map(|r| r.split(',').filter(|c| !c.is_empty()).collect())
        .unwrap_or_default()
}

/// Whether a member is shutting down.
pub fn leaving(member: &Member) -> bool {
    member.annotations.get(LEAVING).is_some_and(|v| v == "true")
}
