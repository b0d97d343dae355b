//! fleetscope's informers: one per (cluster, resource type), each a LIST then a WATCH
//! that resumes from its last resourceVersion, re-lists on 410 and backs off on
//! failure. They produce [`Update`]s only; what to do with them is the ingest's.
//!
//! Entry points:
//! - [`source::kubeconfig_paths`] and [`source::resolve`]: kubeconfig files and
//!   context patterns → [`source::ClusterSource`]s; [`source::client`] builds a kube
//!   client for one, with every auth method kube supports.
//! - [`discovery::discover`] and [`discovery::resolve`]: kubectl-style resource names
//!   → the types a cluster serves.
//! - [`stream::run`]: one informer, until cancelled.
//! - [`prune::prune`]: an object as fleetscope keeps it.

pub mod discovery;
pub mod prune;
pub mod source;
pub mod stream;

pub use prune::{PrunedObject, Pruning};
pub use source::{ClusterSource, Origin, SourceError};
pub use stream::{StreamConfig, StreamId, StreamState, Update};
