//! An object's JSON with a few fields of its metadata changed, everything else copied
//! as the index holds it: the fleet's name and cluster annotation, the
//! `resourceVersion` of a watch event. Only the top level, `metadata` and
//! `metadata.annotations` are split into their members (each member's text borrowed,
//! not parsed), so a list or an event costs a copy of each object rather than a parse
//! and a print of it.

use fleetscope_model::raw::{Members, write_str};

/// What to change in an object's metadata.
#[derive(Debug, Default, Clone, Copy)]
pub struct Edit<'a> {
    /// `metadata.name`.
    pub name: Option<&'a str>,
    /// `metadata.resourceVersion`.
    pub resource_version: Option<&'a str>,
    /// One annotation, set.
    pub annotation: Option<(&'a str, &'a str)>,
}

/// `json` (an object) with `edit` made; `None` if it is not an object with an object
/// for its metadata.
pub fn edit(json: &str, edit: &Edit<'_>) -> Option<String> {
    let top: Members<'_> = serde_json::from_str(json).ok()?;
    let mut out = String::with_capacity(json.len() + 128);
    out.push('{');
    for (i, (key, value)) in top.0.iter().enumerate() {
        separate(&mut out, i, key);
        if key == "metadata" {
            metadata(&mut out, value.get(), edit)?;
        } else {
            out.push_str(value.get());
        }
    }
    out.push('}');
    Some(out)
}

/// The metadata object `json`, edited, written to `out`.
fn metadata(out: &mut String, json: &str, edit: &Edit<'_>) -> Option<()> {
    let members: Members<'_> = serde_json::from_str(json).ok()?;
    let (mut name, mut rv, mut annotation) = (edit.name, edit.resource_version, edit.annotation);
    out.push('{');
    let mut n = 0;
    for (key, value) in &members.0 {
        separate(out, n, key);
        n += 1;
        match key.as_ref() {
            "name" if name.is_some() => write_str(out, name.take()?),
            "resourceVersion" if rv.is_some() => write_str(out, rv.take()?),
            "annotations" if annotation.is_some() => {
                annotations(out, value.get(), annotation.take()?)?;
            }
            _ => out.push_str(value.get()),
        }
    }
    for (key, value) in [("name", name), ("resourceVersion", rv)] {
        if let Some(value) = value {
            separate(out, n, key);
            n += 1;
            write_str(out, value);
        }
    }
    if let Some(a) = annotation {
        separate(out, n, "annotations");
        annotations(out, "{}", a)?;
    }
    out.push('}');
    Some(())
}

/// The annotations object `json` with `(key, value)` set, written to `out`.
fn annotations(out: &mut String, json: &str, (k, v): (&str, &str)) -> Option<()> {
    let members: Members<'_> = serde_json::from_str(json).ok()?;
    out.push('{');
    let mut n = 0;
    for (key, value) in members.0.iter().filter(|(key, _)| key != k) {
        separate(out, n, key);
        n += 1;
        out.push_str(value.get());
    }
    separate(out, n, k);
    write_str(out, v);
    out.push('}');
    Some(())
}

/// A comma before every member but the first, then the member's key.
fn separate(out: &mut String, i: usize, key: &str) {
    if i > 0 {
        out.push(',');
    }
    write_str(out, key);
    out.push(':');
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    fn edited(json: &Value, e: &Edit<'_>) -> Value {
        serde_json::from_str(&edit(&json.to_string(), e).unwrap()).unwrap()
    }

    #[test]
    fn the_metadata_changes_and_nothing_else_does() {
        let o = json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "web", "namespace": "shop", "resourceVersion": "7",
                "annotations": {"a": "1", "fleetscope.io/cluster": "old"}, "labels": {"x": "y"}},
            "data": {"k": "v \"quoted\" \\ \u{e9}"},
        });
        let e = Edit {
            name: Some("prod:web"),
            resource_version: Some("r.abc"),
            annotation: Some(("fleetscope.io/cluster", "prod")),
        };
        let mut want = o.clone();
        want["metadata"]["name"] = json!("prod:web");
        want["metadata"]["resourceVersion"] = json!("r.abc");
        want["metadata"]["annotations"]["fleetscope.io/cluster"] = json!("prod");
        assert_eq!(edited(&o, &e), want);
        // The order of the members is kept.
        let text = edit(&o.to_string(), &e).unwrap();
        assert!(
            text.starts_with(
                r#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"prod:web""#
            ),
            "{text}"
        );
    }

    #[test]
    fn what_is_missing_is_added_and_what_is_not_json_is_refused() {
        let o = json!({"kind": "Node", "metadata": {"uid": "u"}});
        let e = Edit {
            name: Some("a:n"),
            resource_version: Some("3"),
            annotation: Some(("k", "v")),
        };
        let got = edited(&o, &e);
        assert_eq!(
            got["metadata"],
            json!({"uid": "u", "name": "a:n", "resourceVersion": "3", "annotations": {"k": "v"}})
        );
        // Nothing asked: the same object.
        assert_eq!(edited(&o, &Edit::default()), o);
        assert!(edit("[1]", &e).is_none());
        assert!(edit("{\"metadata\": 3}", &e).is_none());
        assert!(edit("not json", &e).is_none());
    }
}
