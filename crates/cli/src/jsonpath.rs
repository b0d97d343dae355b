//! kubectl's JSONPath templates (`-o jsonpath=...`, `custom-columns`, `--sort-by`):
//! text with `{…}` actions, each a path (`.metadata.name`, `['a.b']`, `[0]`, `[-1]`,
//! `[1:3]`, `[*]`, `..name`, `[?(@.status=="True")]`), a quoted literal
//! (`{"\n"}`), or `range PATH` … `end`. Several results of one action print
//! space-separated; strings print raw, anything else as JSON. A missing key prints
//! nothing, as kubectl's default `--allow-missing-template-keys` does.

use serde_json::Value;

/// A template that does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("JSONPath {template:?}: {why}")]
pub struct TemplateError {
    /// The template.
    pub template: String,
    /// What is wrong, and where.
    pub why: String,
}

/// A parsed template.
#[derive(Debug, Clone, PartialEq)]
pub struct Template {
    nodes: Vec<Node>,
}

#[derive(Debug, Clone, PartialEq)]
enum Node {
    Text(String),
    Path(Vec<Step>),
    Range(Vec<Step>, Vec<Node>),
}

#[derive(Debug, Clone, PartialEq)]
enum Step {
    /// `$` or `@`: where evaluation stands.
    Current,
    Field(String),
    Wildcard,
    Index(i64),
    Slice(Option<i64>, Option<i64>),
    /// `..name` (or `..*`).
    Descend(Option<String>),
    Filter(Vec<Step>, Option<(Op, Value)>),
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Op {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
}

impl Template {
    /// Parses a template; a bare path (`.metadata.name`, as `custom-columns` and
    /// `--sort-by` take it) is read as `{.metadata.name}`.
    pub fn parse(text: &str) -> Result<Self, TemplateError> {
        let err = |why: String| TemplateError {
            template: text.to_string(),
            why,
        };
        let source = if text.contains('{') {
            text.to_string()
        } else {
            format!("{{{text}}}")
        };
        let mut stack: Vec<(Vec<Step>, Vec<Node>)> = Vec::new();
        let mut nodes = Vec::new();
        let mut rest = source.as_str();
        while !rest.is_empty() {
            let Some(open) = rest.find('{') else {
                nodes.push(Node::Text(rest.to_string()));
                break;
            };
            if open > 0 {
                nodes.push(Node::Text(rest[..open].to_string()));
            }
            let close = action_end(&rest[open..])
                .ok_or_else(|| err(format!("unclosed action at {:?}", &rest[open..])))?;
            let action = rest[open + 1..open + close].trim();
            rest = &rest[open + close + 1..];
            if let Some(path) = action.strip_prefix("range ") {
                stack.push((
                    parse_path(path.trim()).map_err(err)?,
                    std::mem::take(&mut nodes),
                ));
            } else if action == "end" {
                let (path, outer) = stack
                    .pop()
                    .ok_or_else(|| err("{end} without {range}".into()))?;
                let body = std::mem::replace(&mut nodes, outer);
                nodes.push(Node::Range(path, body));
            } else if let Some(literal) = quoted(action) {
                nodes.push(Node::Text(literal.map_err(err)?));
            } else {
                nodes.push(Node::Path(parse_path(action).map_err(err)?));
            }
        }
        if !stack.is_empty() {
            return Err(err("{range} without {end}".into()));
        }
        Ok(Self { nodes })
    }

    /// The template applied to `data`.
    pub fn render(&self, data: &Value) -> String {
        let mut out = String::new();
        render(&self.nodes, data, &mut out);
        out
    }

    /// The values the template's first path selects (for columns and sorting).
    pub fn values<'a>(&self, data: &'a Value) -> Vec<&'a Value> {
        self.nodes
            .iter()
            .find_map(|n| match n {
                Node::Path(steps) => Some(eval(steps, vec![data])),
                _ => None,
            })
            .unwrap_or_default()
    }
}

/// The length of the action starting at `s[0] == '{'` to its `}`, quotes respected.
fn action_end(s: &str) -> Option<usize> {
    let mut quote: Option<char> = None;
    let mut escaped = false;
    for (i, c) in s.char_indices().skip(1) {
        match quote {
            Some(q) => {
                if escaped {
                    escaped = false;
                } else if c == '\\' {
                    escaped = true;
                } else if c == q {
                    quote = None;
                }
            }
            None => match c {
                '"' | '\'' => quote = Some(c),
                '}' => return Some(i),
                _ => {}
            },
        }
    }
    None
}

/// A quoted literal's text (escapes `\n`, `\t`, `\\`, `\"` read), if `action` is one.
fn quoted(action: &str) -> Option<Result<String, String>> {
    let q = action.chars().next().filter(|c| *c == '"' || *c == '\'')?;
    if action.len() < 2 || !action.ends_with(q) {
        return Some(Err(format!("unterminated literal {action}")));
    }
    let mut out = String::new();
    let mut chars = action[1..action.len() - 1].chars();
    while let Some(c) = chars.next() {
        if c == '\\' {
            match chars.next() {
                Some('n') => out.push('\n'),
                Some('t') => out.push('\t'),
                Some('r') => out.push('\r'),
                Some(other) => out.push(other),
                None => out.push('\\'),
            }
        } else {
            out.push(c);
        }
    }
    Some(Ok(out))
}

fn parse_path(text: &str) -> Result<Vec<Step>, String> {
    let mut steps = Vec::new();
    let chars: Vec<char> = text.chars().collect();
    let mut i = 0;
    // A name runs to the next unescaped '.' or '['; `\.` is a dot inside a name
    // (`.metadata.labels.app\.kubernetes\.io/name`).
    let name_end = |from: usize| {
        let mut j = from;
        while j < chars.len() && !matches!(chars[j], '.' | '[') {
            j += if chars[j] == '\\' { 2 } else { 1 };
        }
        j.min(chars.len())
    };
    let name = |from: usize, to: usize| -> String {
        chars[from..to]
            .iter()
            .collect::<String>()
            .replace("\\.", ".")
    };
    while i < chars.len() {
        match chars[i] {
            '$' | '@' => {
                steps.push(Step::Current);
                i += 1;
            }
            '.' if chars.get(i + 1) == Some(&'.') => {
                let end = name_end(i + 2);
                let n = name(i + 2, end);
                steps.push(Step::Descend((n != "*" && !n.is_empty()).then_some(n)));
                i = end;
            }
            '.' => {
                let end = name_end(i + 1);
                let n = name(i + 1, end);
                match n.as_str() {
                    "" => {}
                    "*" => steps.push(Step::Wildcard),
                    _ => steps.push(Step::Field(n)),
                }
                i = end;
            }
            '[' => {
                let close = closing_bracket(&chars, i)
                    .ok_or_else(|| format!("unclosed '[' at position {i}"))?;
                let inner: String = chars[i + 1..close].iter().collect();
                steps.push(bracket(inner.trim())?);
                i = close + 1;
            }
            c if i == 0 && (c.is_alphanumeric() || c == '_') => {
                // `metadata.name` without its leading dot, as people write it.
                let end = name_end(i);
                steps.push(Step::Field(name(i, end)));
                i = end;
            }
            c => return Err(format!("unexpected {c:?} at position {i}")),
        }
    }
    Ok(steps)
}

fn closing_bracket(chars: &[char], open: usize) -> Option<usize> {
    let mut depth = 0;
    let mut quote: Option<char> = None;
    for (j, &c) in chars.iter().enumerate().skip(open) {
        match quote {
            Some(q) if c == q => quote = None,
            Some(_) => {}
            None => match c {
                '"' | '\'' => quote = Some(c),
                '[' => depth += 1,
                ']' => {
                    depth -= 1;
                    if depth == 0 {
                        return Some(j);
                    }
                }
                _ => {}
            },
        }
    }
    None
}

fn bracket(inner: &str) -> Result<Step, String> {
    if inner == "*" {
        return Ok(Step::Wildcard);
    }
    if let Some(Ok(key)) = quoted(inner) {
        return Ok(Step::Field(key));
    }
    if let Some(filter) = inner.strip_prefix("?(").and_then(|f| f.strip_suffix(')')) {
        return parse_filter(filter.trim());
    }
    if let Some((a, b)) = inner.split_once(':') {
        let bound = |s: &str| -> Result<Option<i64>, String> {
            let s = s.trim();
            if s.is_empty() {
                Ok(None)
            } else {
                s.parse()
                    .map(Some)
                    .map_err(|_| format!("{s:?} is not an index"))
            }
        };
        return Ok(Step::Slice(bound(a)?, bound(b)?));
    }
    inner
        .parse()
        .map(Step::Index)
        .map_err(|_| format!("[{inner}] is not an index, a slice, '*', a quoted key or a filter"))
}

fn parse_filter(text: &str) -> Result<Step, String> {
    for (token, op) in [
        ("==", Op::Eq),
        ("!=", Op::Ne),
        ("<=", Op::Le),
        (">=", Op::Ge),
        ("<", Op::Lt),
        (">", Op::Gt),
    ] {
        if let Some((left, right)) = text.split_once(token) {
            let right = right.trim();
            let value = match quoted(right) {
                Some(s) => Value::String(s?),
                None => serde_json::from_str(right)
                    .map_err(|_| format!("{right:?} is not a quoted string or a number"))?,
            };
            return Ok(Step::Filter(parse_path(left.trim())?, Some((op, value))));
        }
    }
    Ok(Step::Filter(parse_path(text)?, None))
}

fn eval<'a>(steps: &[Step], start: Vec<&'a Value>) -> Vec<&'a Value> {
    let mut current = start;
    for step in steps {
        let mut next = Vec::new();
        for v in current {
            match step {
                Step::Current => next.push(v),
                Step::Field(name) => next.extend(v.get(name.as_str())),
                Step::Wildcard => match v {
                    Value::Array(a) => next.extend(a.iter()),
                    Value::Object(o) => next.extend(o.values()),
                    _ => {}
                },
                Step::Index(i) => {
                    if let Value::Array(a) = v {
                        let len = a.len() as i64;
                        let at = if *i < 0 { len + i } else { *i };
                        if let Some(x) = usize::try_from(at).ok().and_then(|at| a.get(at)) {
                            next.push(x);
                        }
                    }
                }
                Step::Slice(from, to) => {
                    if let Value::Array(a) = v {
                        let len = a.len() as i64;
                        let clamp = |x: i64| {
                            let x = if x < 0 { len + x } else { x };
                            usize::try_from(x.clamp(0, len)).unwrap_or(0)
                        };
                        let (f, t) = (clamp(from.unwrap_or(0)), clamp(to.unwrap_or(len)));
                        if f < t {
                            next.extend(a[f..t].iter());
                        }
                    }
                }
                Step::Descend(name) => descend(v, name.as_deref(), &mut next),
                Step::Filter(path, test) => {
                    let items: Vec<&Value> = match v {
                        Value::Array(a) => a.iter().collect(),
                        other => vec![other],
                    };
                    for item in items {
                        let found = eval(path, vec![item]);
                        let keep = match test {
                            None => !found.is_empty(),
                            Some((op, want)) => found.iter().any(|got| compare(got, *op, want)),
                        };
                        if keep {
                            next.push(item);
                        }
                    }
                }
            }
        }
        current = next;
    }
    current
}

fn descend<'a>(v: &'a Value, name: Option<&str>, out: &mut Vec<&'a Value>) {
    let children: Vec<(&str, &'a Value)> = match v {
        Value::Object(o) => o.iter().map(|(k, v)| (k.as_str(), v)).collect(),
        Value::Array(a) => a.iter().map(|v| ("", v)).collect(),
        _ => return,
    };
    for (k, child) in children {
        if name.is_none_or(|n| n == k) && (name.is_some() || !k.is_empty()) {
            out.push(child);
        }
        descend(child, name, out);
    }
}

fn compare(got: &Value, op: Op, want: &Value) -> bool {
    let ordering = match (got, want) {
        (Value::Number(a), Value::Number(b)) => a.as_f64().partial_cmp(&b.as_f64()),
        (Value::String(a), Value::String(b)) => Some(a.cmp(b)),
        (Value::Bool(a), Value::Bool(b)) => Some(a.cmp(b)),
        _ => None,
    };
    match (op, ordering) {
        (Op::Eq, o) => o == Some(std::cmp::Ordering::Equal),
        (Op::Ne, o) => o != Some(std::cmp::Ordering::Equal),
        (_, None) => false,
        (Op::Lt, Some(o)) => o.is_lt(),
        (Op::Le, Some(o)) => o.is_le(),
        (Op::Gt, Some(o)) => o.is_gt(),
        (Op::Ge, Some(o)) => o.is_ge(),
    }
}

/// A value as kubectl prints it: a string raw, anything else as JSON.
pub fn text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

fn render(nodes: &[Node], data: &Value, out: &mut String) {
    for node in nodes {
        match node {
            Node::Text(t) => out.push_str(t),
            Node::Path(steps) => {
                let values: Vec<String> = eval(steps, vec![data]).into_iter().map(text).collect();
                out.push_str(&values.join(" "));
            }
            Node::Range(steps, body) => {
                for item in eval(steps, vec![data]) {
                    render(body, item, out);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn list() -> Value {
        json!({"kind": "List", "items": [
            {"metadata": {"name": "a", "labels": {"app.kubernetes.io/name": "web"}},
             "status": {"conditions": [{"type": "Ready", "status": "True"}], "restarts": 3}},
            {"metadata": {"name": "b"},
             "status": {"conditions": [{"type": "Ready", "status": "False"}], "restarts": 0}},
        ]})
    }

    fn render(t: &str) -> String {
        Template::parse(t).unwrap().render(&list())
    }

    #[test]
    fn renders_as_kubectl_does() {
        assert_eq!(render("{.items[*].metadata.name}"), "a b");
        assert_eq!(render("{.items[0].metadata.name}"), "a");
        assert_eq!(render("{.items[-1].metadata.name}"), "b");
        assert_eq!(render("{.items[0:1].metadata.name}"), "a");
        assert_eq!(
            render("{range .items[*]}{.metadata.name}{\"\\t\"}{.status.restarts}{\"\\n\"}{end}"),
            "a\t3\nb\t0\n"
        );
        assert_eq!(
            render("{.items[?(@.status.restarts>1)].metadata.name}"),
            "a"
        );
        assert_eq!(
            render("{.items[*].status.conditions[?(@.type==\"Ready\")].status}"),
            "True False"
        );
        assert_eq!(
            render("{.items[0].metadata.labels.app\\.kubernetes\\.io/name}"),
            "web"
        );
        assert_eq!(
            render("{.items[0].metadata.labels['app.kubernetes.io/name']}"),
            "web"
        );
        assert_eq!(render("{..name}"), "a b");
        assert_eq!(render("names: {.items[*].metadata.name}!"), "names: a b!");
        assert_eq!(
            render("{.items[1].status.conditions[0]}"),
            r#"{"type":"Ready","status":"False"}"#
        );
        assert_eq!(
            render("{.items[*].metadata.missing}"),
            "",
            "missing keys print nothing"
        );
        assert_eq!(render("{.items[?(@.metadata.labels)].metadata.name}"), "a");
    }

    #[test]
    fn bare_paths_are_one_action() {
        let t = Template::parse(".metadata.name").unwrap();
        assert_eq!(t.values(&json!({"metadata": {"name": "x"}})), [&json!("x")]);
        let t = Template::parse("metadata.name").unwrap();
        assert_eq!(t.render(&json!({"metadata": {"name": "x"}})), "x");
    }

    #[test]
    fn malformed_templates_say_why() {
        for bad in [
            "{.items[",
            "{range .items[*]}{.x}",
            "{end}",
            "{.items[x]}",
            "{.a}{",
            "{.a[?(@.b==c)]}",
        ] {
            let e = Template::parse(bad).unwrap_err();
            assert!(!e.why.is_empty(), "{bad}");
        }
    }
}
