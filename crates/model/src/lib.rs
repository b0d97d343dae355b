//! fleetscope's domain model: the types every layer shares and nothing else.
//!
//! Entry points:
//! - [`ClusterName`], [`ResourceType`], [`ObjectKey`], [`Revision`], [`EventType`]:
//!   identity and ordering shared by every layer; [`ObjectState`], an object as
//!   the index takes it and the store keeps it.
//! - [`Fleet`]: the seam every front end talks through, with its request and answer
//!   types and [`FleetError`].
//! - [`Access`]: who asks and the policy they are held to, enforced below the seam;
//!   [`access::Hidden`], where Secrets' values are hidden from a query.
//! - [`ClusterFilter`]: which clusters a query draws on, evaluated against the live fleet.
//! - [`selector::LabelSelector`] and [`selector::FieldSelector`]: Kubernetes selector
//!   syntax, parsed with errors that name the position, and matched against labels
//!   ([`selector::Labels`]) or fields ([`selector::Fields`]).
//! - [`file::read_capped`]: a configured file, read to a bound.

pub mod access;
pub mod catalogue;
mod clusters;
pub mod file;
pub mod fleet;
mod identity;
pub mod inputs;
mod json;
mod object;
pub mod raw;
pub mod selector;
pub mod yaml;

/// An object's stored state, read in place: what the store writes of an object,
/// whoever holds it (the index, or a record decoded from the store).
pub trait StoredObject {
    /// Identity.
    fn key(&self) -> &ObjectKey;
    /// The revision of the change that produced this state.
    fn revision(&self) -> Revision;
    /// The pruned object as JSON.
    fn json(&self) -> impl std::ops::Deref<Target = str> + '_;
    /// metadata.labels, as (key, value).
    fn labels(&self) -> impl ExactSizeIterator<Item = (&str, &str)>;
    /// The uids of metadata.ownerReferences.
    fn owners(&self) -> impl ExactSizeIterator<Item = &str>;
    /// Values of the configured field indexes, as (JSON path, value).
    fn fields(&self) -> impl ExactSizeIterator<Item = (&str, &str)>;
}

pub use access::{Access, Verb};
pub use catalogue::Catalogue;
pub use clusters::{ClusterFilter, ClusterFilterError};
pub use fleet::{Fleet, FleetError, GroupBy};
pub use identity::{
    ClusterName, EventType, Location, ObjectKey, ResourceNameError, ResourceType, Revision,
    check_resource_name, is_resource_version,
};
pub use json::{Json, PackedJson};
pub use object::{ObjectState, StoredJson, StoredRun, StoredView};
pub use selector::{FieldSelector, LabelSelector, SelectorError};
