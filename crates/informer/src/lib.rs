//! fleetscope's informers: one per (cluster, resource type), each a streaming list (or
//! a LIST from the watch cache) then a WATCH that resumes from its last
//! resourceVersion, re-lists on 410 and backs off on failure, run by one loop per
//! cluster that connects, starts the streams of the types it already knows, discovers
//! the rest and follows its source's settings. They produce [`Update`]s only; what to do with them is the
//! ingest's. This is the only crate that sees kube's types; none crosses its API.
//!
//! Entry points:
//! - [`source::kubeconfig_paths`] and [`source::resolve`]: kubeconfig files and
//!   context patterns → [`source::ClusterSource`]s.
//! - [`cluster::run`]: one cluster (client, discovery, its streams) until it leaves
//!   the fleet or the engine stops, reporting through [`cluster::Report`].
//! - [`discovery::resolve`]: kubectl-style resource names → the types a cluster serves.
//! - [`prune::prune`]: an object as fleetscope keeps it.
//! - [`exec`]: exec credential plugins, run with a timeout and reported without
//!   their output; [`cause::describe`]: why a request to an API server failed.
//! - [`history::History`]: a stream's history from a resourceVersion, for carrying a
//!   subscriber from a position the stream is past.
//! - [`review::TokenReviewer`]: a bearer token checked by a cluster's TokenReview API.

pub mod cause;
pub mod cluster;
pub mod discovery;
pub mod exec;
pub mod history;
pub mod outage;
pub mod prune;
pub mod requests;
pub mod review;
pub mod source;
pub mod stream;

pub use cluster::{ClusterConfig, Report, Resume, ResumePoint, Scope, ScopeError, Seed};
pub use prune::{PrunedObject, Pruning};
pub use source::{ClusterSource, Origin, SourceError};
pub use stream::{StreamConfig, StreamId, StreamState, Update};
