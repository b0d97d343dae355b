//! Field selectors in Kubernetes syntax (`fields.ParseSelector`): `path=value`,
//! `path==value`, `path!=value`, joined by commas, with `\` escaping `,`, `=`, `!`
//! and `\` in values.

use std::borrow::Cow;
use std::fmt;

use super::{SelectorError, SelectorKind};

/// The operator of a field requirement.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FieldOp {
    /// `=` or `==`.
    Equals,
    /// `!=`.
    NotEquals,
}

/// One requirement of a field selector.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldRequirement {
    /// The dotted path, e.g. `status.phase`.
    pub path: String,
    /// The operator.
    pub op: FieldOp,
    /// The value, unescaped.
    pub value: String,
}

impl FieldRequirement {
    /// Whether a field's value satisfies this requirement. An absent field reads as
    /// the empty string, as Kubernetes reads an unset `spec.nodeName`.
    pub fn matches_value(&self, value: Option<&str>) -> bool {
        let v = value.unwrap_or("");
        match self.op {
            FieldOp::Equals => v == self.value,
            FieldOp::NotEquals => v != self.value,
        }
    }
}

impl fmt::Display for FieldRequirement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let op = match self.op {
            FieldOp::Equals => "=",
            FieldOp::NotEquals => "!=",
        };
        write!(f, "{}{op}{}", self.path, escape(&self.value))
    }
}

/// Read access to an object's fields by dotted path.
pub trait Fields {
    /// The value at a path as text, if present and a scalar.
    fn field(&self, path: &str) -> Option<Cow<'_, str>>;
}

impl Fields for serde_json::Value {
    fn field(&self, path: &str) -> Option<Cow<'_, str>> {
        json_path(self, path).and_then(scalar_text)
    }
}

impl Fields for [(String, String)] {
    fn field(&self, path: &str) -> Option<Cow<'_, str>> {
        self.iter()
            .find(|(k, _)| k == path)
            .map(|(_, v)| Cow::Borrowed(v.as_str()))
    }
}

/// Renders a scalar JSON value as a field selector compares it; objects, arrays and null are not scalars.
pub fn scalar_text(value: &serde_json::Value) -> Option<Cow<'_, str>> {
    match value {
        serde_json::Value::String(s) => Some(Cow::Borrowed(s)),
        serde_json::Value::Bool(b) => Some(Cow::Owned(b.to_string())),
        serde_json::Value::Number(n) => Some(Cow::Owned(n.to_string())),
        _ => None,
    }
}

/// Follows a dotted path into a JSON value. At each object, a key that contains dots
/// itself (a label such as `app.kubernetes.io/name`) is tried whole before the path is
/// split, so `metadata.labels.app.kubernetes.io/name` finds that label.
pub fn json_path<'v>(value: &'v serde_json::Value, path: &str) -> Option<&'v serde_json::Value> {
    if path.is_empty() {
        return Some(value);
    }
    match value {
        serde_json::Value::Object(map) => {
            if let Some(v) = map.get(path) {
                return Some(v);
            }
            let (head, rest) = path.split_once('.')?;
            json_path(map.get(head)?, rest)
        }
        serde_json::Value::Array(items) => {
            let (head, rest) = path.split_once('.').unwrap_or((path, ""));
            let index: usize = head.parse().ok()?;
            json_path(items.get(index)?, rest)
        }
        _ => None,
    }
}

/// A parsed field selector: every requirement must hold. The empty selector matches everything.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FieldSelector {
    requirements: Vec<FieldRequirement>,
}

impl FieldSelector {
    /// The selector that matches every object.
    pub fn everything() -> Self {
        Self::default()
    }

    /// Parses Kubernetes field selector syntax; errors name the position (0-based byte offset).
    pub fn parse(input: &str) -> Result<Self, SelectorError> {
        let mut requirements = Vec::new();
        if input.trim().is_empty() {
            return Ok(Self { requirements });
        }
        for (start, term) in split_terms(input) {
            requirements.push(parse_term(input, start, term)?);
        }
        Ok(Self { requirements })
    }

    /// The requirements, in the order written.
    pub fn requirements(&self) -> &[FieldRequirement] {
        &self.requirements
    }

    /// True when the selector has no requirements.
    pub fn is_empty(&self) -> bool {
        self.requirements.is_empty()
    }

    /// Whether the object's fields satisfy every requirement.
    pub fn matches<F: Fields + ?Sized>(&self, fields: &F) -> bool {
        self.requirements
            .iter()
            .all(|r| r.matches_value(fields.field(&r.path).as_deref()))
    }
}

impl fmt::Display for FieldSelector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        super::write_joined(f, &self.requirements)
    }
}

impl std::str::FromStr for FieldSelector {
    type Err = SelectorError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

/// Splits on commas not escaped by a backslash, keeping each term's byte offset.
fn split_terms(input: &str) -> Vec<(usize, &str)> {
    let mut terms = Vec::new();
    let mut start = 0;
    let mut escaped = false;
    for (i, c) in input.char_indices() {
        match c {
            _ if escaped => escaped = false,
            '\\' => escaped = true,
            ',' => {
                terms.push((start, &input[start..i]));
                start = i + 1;
            }
            _ => {}
        }
    }
    terms.push((start, &input[start..]));
    terms
}

fn parse_term(input: &str, start: usize, term: &str) -> Result<FieldRequirement, SelectorError> {
    let err = |position: usize, message: String| SelectorError {
        kind: SelectorKind::Field,
        input: input.to_string(),
        position,
        message,
    };
    // The operator is the first unescaped '=' or '!='.
    let mut escaped = false;
    let mut found = None;
    for (i, c) in term.char_indices() {
        match c {
            _ if escaped => escaped = false,
            '\\' => escaped = true,
            '!' if term[i + 1..].starts_with('=') => {
                found = Some((i, 2, FieldOp::NotEquals));
                break;
            }
            '=' if term[i + 1..].starts_with('=') => {
                found = Some((i, 2, FieldOp::Equals));
                break;
            }
            '=' => {
                found = Some((i, 1, FieldOp::Equals));
                break;
            }
            _ => {}
        }
    }
    let Some((at, len, op)) = found else {
        return Err(err(
            start,
            format!(
                "'{term}' is not a field requirement: expected 'path=value', 'path==value' or 'path!=value'"
            ),
        ));
    };
    let path = term[..at].trim();
    if path.is_empty() {
        return Err(err(start, "a field path must not be empty".into()));
    }
    if let Some(bad) = path.find(|c: char| c.is_whitespace() || c == '\\') {
        return Err(err(
            start + bad,
            format!("field path '{path}' must not contain spaces or '\\'"),
        ));
    }
    if let Some(bad) = path.find(['[', ']']) {
        return Err(err(
            start + bad,
            format!(
                "field path '{path}' uses brackets, which field selectors do not take: an array element is a dotted index, e.g. 'spec.containers.0.name'"
            ),
        ));
    }
    if path.starts_with('.') || path.ends_with('.') || path.contains("..") {
        return Err(err(
            start,
            format!("field path '{path}' has an empty segment: expected e.g. 'status.phase'"),
        ));
    }
    let raw = &term[at + len..];
    let value = unescape(raw).map_err(|(offset, m)| err(start + at + len + offset, m))?;
    Ok(FieldRequirement {
        path: path.to_string(),
        op,
        value,
    })
}

fn unescape(raw: &str) -> Result<String, (usize, String)> {
    let mut out = String::with_capacity(raw.len());
    let mut chars = raw.char_indices();
    while let Some((i, c)) = chars.next() {
        match c {
            '\\' => match chars.next() {
                Some((_, e @ ('\\' | ',' | '=' | '!'))) => out.push(e),
                Some((j, e)) => return Err((j, format!("invalid escape sequence '\\{e}'"))),
                None => return Err((i, "a value must not end with a lone '\\'".into())),
            },
            '=' | '!' => {
                return Err((i, format!("'{c}' in a value must be escaped as '\\{c}'")));
            }
            _ => out.push(c),
        }
    }
    Ok(out)
}

fn escape(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for c in value.chars() {
        if matches!(c, '\\' | ',' | '=' | '!') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn parses_and_matches_json_paths() {
        let pod = json!({"metadata": {"name": "p", "labels": {"app.kubernetes.io/name": "web"}},
                         "spec": {"nodeName": "n1", "containers": [{"name": "c"}]},
                         "status": {"phase": "Running", "ready": true}});
        let m = |s: &str| FieldSelector::parse(s).unwrap().matches(&pod);
        assert!(m("status.phase=Running"));
        assert!(m("status.phase==Running,spec.nodeName!=n2"));
        assert!(!m("status.phase!=Running"));
        assert!(m("metadata.labels.app.kubernetes.io/name=web"));
        assert!(m("spec.containers.0.name=c"));
        assert!(m("status.ready=true"));
        assert!(m("spec.missing="), "an absent field reads as empty");
        assert!(m("spec.missing!=x"));
    }

    #[test]
    fn escapes_are_honoured() {
        let s = FieldSelector::parse(r"a=x\,y\=z,b!=\\").unwrap();
        assert_eq!(s.requirements()[0].value, "x,y=z");
        assert_eq!(s.requirements()[1].value, "\\");
        assert_eq!(FieldSelector::parse(&s.to_string()).unwrap(), s);
    }

    #[test]
    fn errors_name_the_position() {
        let e = FieldSelector::parse("status.phase=Running,bogus").unwrap_err();
        assert_eq!(e.position, 21);
        assert!(e.to_string().contains("field selector"), "{e}");
        assert_eq!(FieldSelector::parse("=x").unwrap_err().position, 0);
        assert!(FieldSelector::parse("a=b=c").is_err());
        assert!(FieldSelector::parse(r"a=b\").is_err());
        assert!(FieldSelector::parse(r"a=\q").is_err());
        assert!(FieldSelector::parse("a b=c").is_err());
        for bad in [".status=x", "status.=x", "status..phase=x"] {
            let e = FieldSelector::parse(bad).unwrap_err();
            assert!(e.to_string().contains("empty segment"), "{bad}: {e}");
        }
        let e = FieldSelector::parse("spec.containers[0].name=x").unwrap_err();
        assert_eq!(e.position, 15);
        assert!(e.to_string().contains("spec.containers.0.name"), "{e}");
        assert!(FieldSelector::parse("a]=x").is_err());
        assert!(FieldSelector::parse("spec.containers.0.name=x").is_ok());
    }
}
