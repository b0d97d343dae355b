//! Label selectors in Kubernetes syntax, as `labels.Parse` in apimachinery reads them.

use std::collections::BTreeSet;
use std::fmt;

use super::{SelectorError, SelectorKind};

/// One requirement of a label selector.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Requirement {
    /// `key=value` or `key==value`.
    Equals(String, String),
    /// `key!=value`: also true when the label is absent.
    NotEquals(String, String),
    /// `key in (a,b)`.
    In(String, BTreeSet<String>),
    /// `key notin (a,b)`: also true when the label is absent.
    NotIn(String, BTreeSet<String>),
    /// `key`: the label is present.
    Exists(String),
    /// `!key`: the label is absent.
    DoesNotExist(String),
    /// `key>N`: the label is an integer greater than N.
    GreaterThan(String, i64),
    /// `key<N`: the label is an integer less than N.
    LessThan(String, i64),
}

impl Requirement {
    /// The label key this requirement is about.
    pub fn key(&self) -> &str {
        match self {
            Requirement::Equals(k, _)
            | Requirement::NotEquals(k, _)
            | Requirement::In(k, _)
            | Requirement::NotIn(k, _)
            | Requirement::Exists(k)
            | Requirement::DoesNotExist(k)
            | Requirement::GreaterThan(k, _)
            | Requirement::LessThan(k, _) => k,
        }
    }

    /// Whether a label value (`None` when the label is absent) satisfies this requirement.
    pub fn matches_value(&self, value: Option<&str>) -> bool {
        match (self, value) {
            (Requirement::Equals(_, want), Some(v)) => v == want,
            (Requirement::Equals(..), None) => false,
            (Requirement::NotEquals(_, want), Some(v)) => v != want,
            (Requirement::NotEquals(..), None) => true,
            (Requirement::In(_, set), Some(v)) => set.contains(v),
            (Requirement::In(..), None) => false,
            (Requirement::NotIn(_, set), Some(v)) => !set.contains(v),
            (Requirement::NotIn(..), None) => true,
            (Requirement::Exists(_), v) => v.is_some(),
            (Requirement::DoesNotExist(_), v) => v.is_none(),
            (Requirement::GreaterThan(_, n), Some(v)) => v.parse::<i64>().is_ok_and(|x| x > *n),
            (Requirement::LessThan(_, n), Some(v)) => v.parse::<i64>().is_ok_and(|x| x < *n),
            (Requirement::GreaterThan(..) | Requirement::LessThan(..), None) => false,
        }
    }
}

impl fmt::Display for Requirement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let join = |s: &BTreeSet<String>| s.iter().cloned().collect::<Vec<_>>().join(",");
        match self {
            Requirement::Equals(k, v) => write!(f, "{k}={v}"),
            Requirement::NotEquals(k, v) => write!(f, "{k}!={v}"),
            Requirement::In(k, s) => write!(f, "{k} in ({})", join(s)),
            Requirement::NotIn(k, s) => write!(f, "{k} notin ({})", join(s)),
            Requirement::Exists(k) => write!(f, "{k}"),
            Requirement::DoesNotExist(k) => write!(f, "!{k}"),
            Requirement::GreaterThan(k, n) => write!(f, "{k}>{n}"),
            Requirement::LessThan(k, n) => write!(f, "{k}<{n}"),
        }
    }
}

/// Read access to an object's labels, so selectors match maps of any shape.
pub trait Labels {
    /// The value of a label, if present.
    fn label(&self, key: &str) -> Option<&str>;
}

impl<S: std::borrow::Borrow<str> + Ord> Labels for std::collections::BTreeMap<S, S> {
    fn label(&self, key: &str) -> Option<&str> {
        self.get(key).map(|v| v.borrow())
    }
}

impl<S: std::borrow::Borrow<str> + std::hash::Hash + Eq> Labels
    for std::collections::HashMap<S, S>
{
    fn label(&self, key: &str) -> Option<&str> {
        self.get(key).map(|v| v.borrow())
    }
}

impl Labels for [(String, String)] {
    fn label(&self, key: &str) -> Option<&str> {
        self.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
    }
}

impl Labels for serde_json::Map<String, serde_json::Value> {
    fn label(&self, key: &str) -> Option<&str> {
        self.get(key).and_then(|v| v.as_str())
    }
}

/// A parsed label selector: every requirement must hold. The empty selector matches everything.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LabelSelector {
    requirements: Vec<Requirement>,
}

impl LabelSelector {
    /// The selector that matches every object.
    pub fn everything() -> Self {
        Self::default()
    }

    /// Builds a selector from requirements.
    pub fn from_requirements(requirements: Vec<Requirement>) -> Self {
        Self { requirements }
    }

    /// Parses Kubernetes label selector syntax; errors name the position (0-based byte offset).
    pub fn parse(input: &str) -> Result<Self, SelectorError> {
        Parser::new(input).parse()
    }

    /// The requirements, in the order written.
    pub fn requirements(&self) -> &[Requirement] {
        &self.requirements
    }

    /// True when the selector has no requirements.
    pub fn is_empty(&self) -> bool {
        self.requirements.is_empty()
    }

    /// Whether the labels satisfy every requirement.
    pub fn matches<L: Labels + ?Sized>(&self, labels: &L) -> bool {
        self.requirements
            .iter()
            .all(|r| r.matches_value(labels.label(r.key())))
    }
}

impl fmt::Display for LabelSelector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        super::write_joined(f, &self.requirements)
    }
}

impl std::str::FromStr for LabelSelector {
    type Err = SelectorError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Token<'a> {
    Ident(&'a str),
    Not,
    Eq,
    DoubleEq,
    NotEq,
    In,
    NotIn,
    Open,
    Close,
    Comma,
    Gt,
    Lt,
    End,
}

impl Token<'_> {
    fn describe(&self) -> String {
        match self {
            Token::Ident(s) => format!("'{s}'"),
            Token::Not => "'!'".into(),
            Token::Eq => "'='".into(),
            Token::DoubleEq => "'=='".into(),
            Token::NotEq => "'!='".into(),
            Token::In => "'in'".into(),
            Token::NotIn => "'notin'".into(),
            Token::Open => "'('".into(),
            Token::Close => "')'".into(),
            Token::Comma => "','".into(),
            Token::Gt => "'>'".into(),
            Token::Lt => "'<'".into(),
            Token::End => "end of input".into(),
        }
    }
}

fn is_special(c: char) -> bool {
    matches!(c, '=' | '!' | '(' | ')' | ',' | '>' | '<')
}

struct Parser<'a> {
    input: &'a str,
    pos: usize,
    peeked: Option<(usize, Token<'a>)>,
}

impl<'a> Parser<'a> {
    fn new(input: &'a str) -> Self {
        Self {
            input,
            pos: 0,
            peeked: None,
        }
    }

    fn err(&self, position: usize, message: impl Into<String>) -> SelectorError {
        SelectorError {
            kind: SelectorKind::Label,
            input: self.input.to_string(),
            position,
            message: message.into(),
        }
    }

    fn lex(&mut self) -> (usize, Token<'a>) {
        let rest = &self.input[self.pos..];
        let trimmed = rest.trim_start();
        let start = self.pos + (rest.len() - trimmed.len());
        let mut chars = trimmed.chars();
        let Some(c) = chars.next() else {
            self.pos = start;
            return (start, Token::End);
        };
        let (len, token) = match c {
            '!' if trimmed[1..].starts_with('=') => (2, Token::NotEq),
            '!' => (1, Token::Not),
            '=' if trimmed[1..].starts_with('=') => (2, Token::DoubleEq),
            '=' => (1, Token::Eq),
            '(' => (1, Token::Open),
            ')' => (1, Token::Close),
            ',' => (1, Token::Comma),
            '>' => (1, Token::Gt),
            '<' => (1, Token::Lt),
            _ => {
                let len = trimmed
                    .find(|c: char| c.is_whitespace() || is_special(c))
                    .unwrap_or(trimmed.len());
                let word = &trimmed[..len];
                let token = match word {
                    "in" => Token::In,
                    "notin" => Token::NotIn,
                    _ => Token::Ident(word),
                };
                (len, token)
            }
        };
        self.pos = start + len;
        (start, token)
    }

    fn next(&mut self) -> (usize, Token<'a>) {
        self.peeked.take().unwrap_or_else(|| self.lex())
    }

    fn peek(&mut self) -> &(usize, Token<'a>) {
        if self.peeked.is_none() {
            let t = self.lex();
            self.peeked = Some(t);
        }
        // Filled just above.
        self.peeked.as_ref().unwrap_or(&(0, Token::End))
    }

    fn parse(mut self) -> Result<LabelSelector, SelectorError> {
        let mut requirements = Vec::new();
        if self.peek().1 == Token::End {
            return Ok(LabelSelector { requirements });
        }
        loop {
            requirements.push(self.requirement()?);
            match self.next() {
                (_, Token::End) => break,
                (_, Token::Comma) => continue,
                (pos, t) => {
                    return Err(self.err(
                        pos,
                        format!("expected ',' or end of input, found {}", t.describe()),
                    ));
                }
            }
        }
        Ok(LabelSelector { requirements })
    }

    fn requirement(&mut self) -> Result<Requirement, SelectorError> {
        let negated = if self.peek().1 == Token::Not {
            self.next();
            true
        } else {
            false
        };
        let key = self.key()?;
        if negated {
            return Ok(Requirement::DoesNotExist(key));
        }
        let (pos, op) = self.peek().clone();
        match op {
            Token::End | Token::Comma => Ok(Requirement::Exists(key)),
            Token::Eq | Token::DoubleEq => {
                self.next();
                Ok(Requirement::Equals(key, self.single_value()?))
            }
            Token::NotEq => {
                self.next();
                Ok(Requirement::NotEquals(key, self.single_value()?))
            }
            Token::In => {
                self.next();
                Ok(Requirement::In(key, self.value_set()?))
            }
            Token::NotIn => {
                self.next();
                Ok(Requirement::NotIn(key, self.value_set()?))
            }
            Token::Gt | Token::Lt => {
                self.next();
                let (vpos, v) = self.next();
                let Token::Ident(text) = v else {
                    return Err(self.err(vpos, format!("expected an integer, found {}", v.describe())));
                };
                let n: i64 = text
                    .parse()
                    .map_err(|_| self.err(vpos, format!("'{text}' is not an integer")))?;
                Ok(if op == Token::Gt {
                    Requirement::GreaterThan(key, n)
                } else {
                    Requirement::LessThan(key, n)
                })
            }
            other => Err(self.err(
                pos,
                format!(
                    "expected an operator ('=', '==', '!=', 'in', 'notin', '>', '<'), ',' or end of input after key '{key}', found {}",
                    other.describe()
                ),
            )),
        }
    }

    fn key(&mut self) -> Result<String, SelectorError> {
        let (pos, t) = self.next();
        match t {
            Token::Ident(k) => {
                validate_key(k).map_err(|m| self.err(pos, m))?;
                Ok(k.to_string())
            }
            // `in` and `notin` are valid label keys when they stand where a key goes.
            Token::In => Ok("in".into()),
            Token::NotIn => Ok("notin".into()),
            other => Err(self.err(
                pos,
                format!("expected a label key, found {}", other.describe()),
            )),
        }
    }

    fn single_value(&mut self) -> Result<String, SelectorError> {
        let (pos, t) = self.peek().clone();
        match t {
            Token::Ident(v) => {
                self.next();
                validate_value(v).map_err(|m| self.err(pos, m))?;
                Ok(v.to_string())
            }
            Token::In => {
                self.next();
                Ok("in".into())
            }
            Token::NotIn => {
                self.next();
                Ok("notin".into())
            }
            // `key=` selects the empty value, as in Kubernetes.
            Token::End | Token::Comma => Ok(String::new()),
            other => Err(self.err(pos, format!("expected a value, found {}", other.describe()))),
        }
    }

    fn value_set(&mut self) -> Result<BTreeSet<String>, SelectorError> {
        let (pos, t) = self.next();
        if t != Token::Open {
            return Err(self.err(
                pos,
                format!(
                    "expected '(' to open a set of values, found {}",
                    t.describe()
                ),
            ));
        }
        let mut values = BTreeSet::new();
        loop {
            let (pos, t) = self.next();
            match t {
                Token::Ident(v) => {
                    validate_value(v).map_err(|m| self.err(pos, m))?;
                    values.insert(v.to_string());
                }
                Token::In => {
                    values.insert("in".into());
                }
                Token::NotIn => {
                    values.insert("notin".into());
                }
                Token::Close => {
                    values.insert(String::new());
                    return Ok(values);
                }
                Token::Comma => {
                    values.insert(String::new());
                    continue;
                }
                other => {
                    return Err(self.err(
                        pos,
                        format!("expected a value or ')', found {}", other.describe()),
                    ));
                }
            }
            let (pos, t) = self.next();
            match t {
                Token::Comma => continue,
                Token::Close => return Ok(values),
                other => {
                    return Err(self.err(
                        pos,
                        format!(
                            "expected ',' or ')' in a set of values, found {}",
                            other.describe()
                        ),
                    ));
                }
            }
        }
    }
}

fn is_name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')
}

/// Checks a qualified name part (`[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?`, at most 63 characters).
fn validate_name(name: &str, what: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err(format!("{what} must not be empty"));
    }
    if name.len() > 63 {
        return Err(format!("{what} '{name}' is longer than 63 characters"));
    }
    let first_last_ok = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric());
    if !name.chars().all(is_name_char)
        || !first_last_ok(name.chars().next())
        || !first_last_ok(name.chars().last())
    {
        return Err(format!(
            "{what} '{name}' must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character"
        ));
    }
    Ok(())
}

fn validate_key(key: &str) -> Result<(), String> {
    match key.split_once('/') {
        Some((prefix, name)) => {
            if prefix.is_empty() || prefix.len() > 253 {
                return Err(format!(
                    "label key prefix '{prefix}' must be a DNS subdomain of 1 to 253 characters"
                ));
            }
            let dns_ok = prefix.split('.').all(|part| {
                !part.is_empty()
                    && part
                        .chars()
                        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
                    && !part.starts_with('-')
                    && !part.ends_with('-')
            });
            if !dns_ok {
                return Err(format!(
                    "label key prefix '{prefix}' must be a lowercase DNS subdomain"
                ));
            }
            validate_name(name, "label key name")
        }
        None => validate_name(key, "label key"),
    }
}

fn validate_value(value: &str) -> Result<(), String> {
    if value.is_empty() {
        return Ok(());
    }
    validate_name(value, "label value")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn parses_every_operator() {
        let s = LabelSelector::parse("a=1,b==2,c!=3,d in (x, y),e notin (z),f,!g,h>5,i<7").unwrap();
        assert_eq!(s.requirements().len(), 9);
        assert_eq!(
            s.requirements()[3],
            Requirement::In("d".into(), ["x".to_string(), "y".to_string()].into())
        );
        assert_eq!(s.requirements()[6], Requirement::DoesNotExist("g".into()));
    }

    #[test]
    fn matching_follows_kubernetes_semantics() {
        let l = labels(&[("app", "web"), ("tier", "t1"), ("n", "10")]);
        let m = |s: &str| LabelSelector::parse(s).unwrap().matches(&l);
        assert!(m(""));
        assert!(m("app=web"));
        assert!(m("app==web,tier in (t0,t1)"));
        assert!(!m("app!=web"));
        assert!(m("missing!=x"), "!= holds when the label is absent");
        assert!(
            m("missing notin (x)"),
            "notin holds when the label is absent"
        );
        assert!(!m("missing in (x)"));
        assert!(m("app"));
        assert!(!m("!app"));
        assert!(m("!missing"));
        assert!(m("n>9") && !m("n>10") && m("n<11"));
        assert!(!m("app>1"), "a non-integer value never satisfies > or <");
    }

    #[test]
    fn empty_value_is_allowed() {
        let s = LabelSelector::parse("a=,b in (,x)").unwrap();
        assert!(s.matches(&labels(&[("a", ""), ("b", "")])));
    }

    #[test]
    fn prefixed_keys_are_accepted() {
        let s = LabelSelector::parse("app.kubernetes.io/name=web").unwrap();
        assert!(s.matches(&labels(&[("app.kubernetes.io/name", "web")])));
    }

    #[test]
    fn errors_name_the_position() {
        let e = LabelSelector::parse("app=web,tier in t1").unwrap_err();
        assert_eq!(e.position, 16);
        assert!(e.to_string().contains("position 16"), "{e}");
        let e = LabelSelector::parse("app=web,,x").unwrap_err();
        assert_eq!(e.position, 8);
        let e = LabelSelector::parse("a b").unwrap_err();
        assert_eq!(e.position, 2);
        let e = LabelSelector::parse("-bad=1").unwrap_err();
        assert_eq!(e.position, 0);
        assert!(LabelSelector::parse("a in (x").is_err());
        assert!(LabelSelector::parse("a>x").is_err());
        assert!(LabelSelector::parse("!").is_err());
        assert!(LabelSelector::parse("a=b=c").is_err());
    }

    #[test]
    fn display_round_trips() {
        let text = "a=1,b!=2,c in (x,y),d notin (z),e,!f,g>1,h<2";
        let s = LabelSelector::parse(text).unwrap();
        assert_eq!(LabelSelector::parse(&s.to_string()).unwrap(), s);
    }
}
