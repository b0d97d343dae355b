//! fleetscope's domain model: the types every layer shares and nothing else.
//!
//! Entry points:
//! - [`selector::LabelSelector`] and [`selector::FieldSelector`]: Kubernetes selector
//!   syntax, parsed with errors that name the position, and matched against labels
//!   ([`selector::Labels`]) or fields ([`selector::Fields`]).

pub mod selector;

pub use selector::{FieldSelector, LabelSelector, SelectorError};
