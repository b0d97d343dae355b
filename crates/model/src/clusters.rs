//! Which clusters a query draws on: names or globs, narrowed by a selector over the
//! clusters' labels. A filter is a predicate, not a list, so it is evaluated against
//! the live fleet: a matching cluster added later is drawn on too.

use std::collections::BTreeMap;

use crate::{ClusterName, LabelSelector, SelectorError};

/// A cluster filter that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ClusterFilterError {
    /// A name or glob is not a valid glob.
    #[error("{pattern:?} is not a valid name or glob: {message}")]
    Pattern {
        /// The pattern.
        pattern: String,
        /// What is wrong with it.
        message: String,
    },
    /// The label selector does not parse.
    #[error(transparent)]
    Selector(#[from] SelectorError),
}

/// Names or globs (any matching; none means every cluster), and a label selector.
#[derive(Debug, Clone, Default)]
pub struct ClusterFilter {
    patterns: Vec<glob::Pattern>,
    selector: LabelSelector,
}

impl ClusterFilter {
    /// Parses names or globs and a cluster label selector (empty: no narrowing).
    pub fn parse(patterns: &[String], selector: &str) -> Result<Self, ClusterFilterError> {
        let patterns = patterns
            .iter()
            .filter(|p| !p.is_empty())
            .map(|p| {
                glob::Pattern::new(p).map_err(|e| ClusterFilterError::Pattern {
                    pattern: p.clone(),
                    message: e.to_string(),
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self {
            patterns,
            selector: LabelSelector::parse(selector)?,
        })
    }

    /// The names and globs, as given.
    pub fn patterns(&self) -> Vec<String> {
        self.patterns
            .iter()
            .map(|p| p.as_str().to_string())
            .collect()
    }

    /// The same label selector, the names and globs replaced by exactly `names`
    /// (each matched as written, glob characters and all); every cluster when
    /// `names` is empty.
    pub fn only(&self, names: &[String]) -> Self {
        Self {
            patterns: names
                .iter()
                .filter_map(|n| glob::Pattern::new(&glob::Pattern::escape(n)).ok())
                .collect(),
            selector: self.selector.clone(),
        }
    }

    /// The label selector over the clusters' labels.
    pub fn selector(&self) -> &LabelSelector {
        &self.selector
    }

    /// Whether a cluster of this name is selected by the names and globs (its labels
    /// aside).
    pub fn names_match(&self, name: &str) -> bool {
        self.patterns.is_empty() || self.patterns.iter().any(|p| p.matches(name))
    }

    /// A warning for each name or glob that names none of `clusters` (the fleet as the
    /// caller may see it): a name mistyped reads as an empty fleet otherwise.
    pub fn unmatched<'a>(
        &self,
        clusters: impl IntoIterator<Item = &'a ClusterName> + Clone,
    ) -> Vec<String> {
        self.patterns
            .iter()
            .filter(|p| !clusters.clone().into_iter().any(|c| p.matches(c.as_str())))
            .map(|p| {
                let text = p.as_str();
                if text.contains(['*', '?', '[']) {
                    format!("no cluster of the fleet matches {text:?}")
                } else {
                    format!("no cluster of the fleet is named {text:?}")
                }
            })
            .collect()
    }

    /// Whether it selects every cluster.
    pub fn is_everything(&self) -> bool {
        self.patterns.is_empty() && self.selector.is_empty()
    }

    /// Whether a cluster of this name and these labels is selected.
    pub fn matches(&self, name: &ClusterName, labels: &BTreeMap<String, String>) -> bool {
        (self.patterns.is_empty() || self.patterns.iter().any(|p| p.matches(name.as_str())))
            && self.selector.matches(labels)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_globs_and_labels_select_clusters() {
        let f = ClusterFilter::parse(&["prod-*".into(), "dev".into()], "region=eu").unwrap();
        let eu: BTreeMap<String, String> = [("region".to_string(), "eu".to_string())].into();
        assert!(f.matches(&ClusterName::from("prod-1"), &eu));
        assert!(f.matches(&ClusterName::from("dev"), &eu));
        assert!(!f.matches(&ClusterName::from("prod-1"), &BTreeMap::new()));
        assert!(!f.matches(&ClusterName::from("staging"), &eu));
        assert!(ClusterFilter::parse(&[], "").unwrap().is_everything());
        let e = ClusterFilter::parse(&["prod-[".into()], "").unwrap_err();
        assert!(e.to_string().contains("prod-["), "{e}");
        assert!(ClusterFilter::parse(&[], "region in eu").is_err());
    }
}
