//! Label and field selectors in Kubernetes syntax: parsing with positioned errors, and matching.

mod field;
mod json;
mod label;

pub use field::{FieldOp, FieldRequirement, FieldSelector, Fields, json_path, scalar_text};
pub use json::{field_in_json, metadata_json};
pub use label::{LabelSelector, Labels, Requirement};

/// Writes requirements comma-separated, as Kubernetes renders a selector.
fn write_joined<T: std::fmt::Display>(
    f: &mut std::fmt::Formatter<'_>,
    items: &[T],
) -> std::fmt::Result {
    for (i, item) in items.iter().enumerate() {
        if i > 0 {
            f.write_str(",")?;
        }
        write!(f, "{item}")?;
    }
    Ok(())
}

/// Which kind of selector an error is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SelectorKind {
    /// A label selector.
    Label,
    /// A field selector.
    Field,
}

/// A selector that could not be parsed, with the position of the fault.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid {} selector {input:?} at position {position}: {message}", match kind { SelectorKind::Label => "label", SelectorKind::Field => "field" })]
pub struct SelectorError {
    /// Label or field.
    pub kind: SelectorKind,
    /// The selector as given.
    pub input: String,
    /// The 0-based byte offset of the fault.
    pub position: usize,
    /// What is wrong, for a person to read.
    pub message: String,
}

#[cfg(test)]
mod proptests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    fn name() -> impl Strategy<Value = String> + Clone {
        prop_oneof!["[a-z]", "[a-z][a-z0-9.-]{0,6}[a-z0-9]", "in", "notin"]
    }

    fn requirement() -> impl Strategy<Value = Requirement> {
        let set = || proptest::collection::btree_set(name(), 1..4);
        prop_oneof![
            (name(), name()).prop_map(|(k, v)| Requirement::Equals(k, v)),
            (name(), name()).prop_map(|(k, v)| Requirement::NotEquals(k, v)),
            (name(), set()).prop_map(|(k, s)| Requirement::In(k, s)),
            (name(), set()).prop_map(|(k, s)| Requirement::NotIn(k, s)),
            name().prop_map(Requirement::Exists),
            name().prop_map(Requirement::DoesNotExist),
            (name(), -50i64..50).prop_map(|(k, n)| Requirement::GreaterThan(k, n)),
            (name(), -50i64..50).prop_map(|(k, n)| Requirement::LessThan(k, n)),
        ]
    }

    /// A plain model of label matching, written from the Kubernetes documentation.
    fn model_matches(reqs: &[Requirement], labels: &BTreeMap<String, String>) -> bool {
        reqs.iter().all(|r| {
            let v = labels.get(r.key());
            match r {
                Requirement::Equals(_, x) => v == Some(x),
                Requirement::NotEquals(_, x) => v != Some(x),
                Requirement::In(_, s) => v.is_some_and(|v| s.contains(v)),
                Requirement::NotIn(_, s) => !v.is_some_and(|v| s.contains(v)),
                Requirement::Exists(_) => v.is_some(),
                Requirement::DoesNotExist(_) => v.is_none(),
                Requirement::GreaterThan(_, n) => v
                    .and_then(|v| v.parse::<i64>().ok())
                    .is_some_and(|x| x > *n),
                Requirement::LessThan(_, n) => v
                    .and_then(|v| v.parse::<i64>().ok())
                    .is_some_and(|x| x < *n),
            }
        })
    }

    proptest! {
        #[test]
        fn label_selector_round_trips_and_matches_the_model(
            reqs in proptest::collection::vec(requirement(), 0..5),
            labels in proptest::collection::btree_map(name(), prop_oneof![name(), (-60i64..60).prop_map(|n| n.to_string())], 0..5),
        ) {
            let text = LabelSelector::from_requirements(reqs.clone()).to_string();
            let parsed = LabelSelector::parse(&text).map_err(|e| TestCaseError::fail(e.to_string()))?;
            prop_assert_eq!(parsed.requirements(), &reqs[..]);
            prop_assert_eq!(parsed.matches(&labels), model_matches(&reqs, &labels));
        }

        #[test]
        fn label_parser_never_panics(input in "\\PC{0,40}") {
            let _ = LabelSelector::parse(&input);
        }

        #[test]
        fn label_parser_errors_point_inside_the_input(input in "[a-z=!(), <>in]{0,30}") {
            if let Err(e) = LabelSelector::parse(&input) {
                prop_assert!(e.position <= input.len());
            }
        }

        #[test]
        fn field_selector_round_trips(
            reqs in proptest::collection::vec(("[a-z]{1,5}(\\.[a-z]{1,5}){0,2}", any::<bool>(), "[a-z,=!\\\\ ]{0,6}"), 0..4)
        ) {
            let reqs: Vec<FieldRequirement> = reqs.into_iter().map(|(path, eq, value)| FieldRequirement {
                path, op: if eq { FieldOp::Equals } else { FieldOp::NotEquals }, value,
            }).collect();
            let text = reqs.iter().map(|r| r.to_string()).collect::<Vec<_>>().join(",");
            let parsed = FieldSelector::parse(&text).map_err(|e| TestCaseError::fail(e.to_string()))?;
            // An empty selector string parses to no requirements; a single requirement never renders empty.
            if !text.is_empty() {
                prop_assert_eq!(parsed.requirements(), &reqs[..]);
            }
        }

        #[test]
        fn field_parser_never_panics(input in "\\PC{0,40}") {
            let _ = FieldSelector::parse(&input);
        }
    }
}
