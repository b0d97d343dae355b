//! fleetscope's domain model: the types every layer shares and nothing else.
//!
//! Entry points:
//! - [`ClusterName`], [`ResourceType`], [`ObjectKey`], [`Revision`], [`EventType`]:
//!   identity and ordering shared by every layer.
//! - [`selector::LabelSelector`] and [`selector::FieldSelector`]: Kubernetes selector
//!   syntax, parsed with errors that name the position, and matched against labels
//!   ([`selector::Labels`]) or fields ([`selector::Fields`]).

mod identity;
pub mod selector;

pub use identity::{ClusterName, EventType, Location, ObjectKey, ResourceType, Revision};
pub use selector::{FieldSelector, LabelSelector, SelectorError};
