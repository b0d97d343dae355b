//! The configuration file: one YAML document for everything `serve`'s flags set, plus
//! per-resource settings and cluster aliases. Its keys, and how each value is read,
//! come from the settings' declarations ([`super::flags`]): the file's values become
//! the flags' defaults, so a flag or its environment variable still wins (flag >
//! environment > file > default) and every value is checked by its flag's own parser
//! too. Unknown keys and bad values are errors naming the key's full path (with a
//! close match).

use std::path::Path;

use serde_json::{Map, Value};

use super::flags::serve_settings;
use super::settings::{FromFile, LABEL_RULE_KEYS, RESOURCE_KEYS, Setting};
pub use fleetscope_model::yaml::FileError;
use fleetscope_model::yaml::{close_match, text_of, value};

/// One setting the file gives: the flag it stands for (by clap id), its values as the
/// flag would take them, and its key in the file.
#[derive(Debug, Clone, PartialEq)]
pub struct Given {
    /// The key's path in the file.
    pub key: &'static str,
    /// The flag's clap id.
    pub arg: &'static str,
    /// The values, as on the command line.
    pub values: Vec<String>,
}

/// Reads a configuration file of `serve`: the settings it gives.
pub fn read(path: &Path) -> Result<Vec<Given>, FileError> {
    read_for(path, &serve_settings().collect::<Vec<_>>())
}

/// Reads a configuration file of a command whose settings are `settings`: the ones
/// it gives.
pub fn read_for(path: &Path, settings: &[&'static Setting]) -> Result<Vec<Given>, FileError> {
    parse_for(path, &text_of(path)?, settings)
}

/// Parses a configuration document of `serve` (`path` names it in errors): the
/// settings it gives, each checked by its kind.
pub fn parse(path: &Path, text: &str) -> Result<Vec<Given>, FileError> {
    parse_for(path, text, &serve_settings().collect::<Vec<_>>())
}

/// Parses a configuration document of a command whose settings are `settings`.
pub fn parse_for(
    path: &Path,
    text: &str,
    settings: &[&'static Setting],
) -> Result<Vec<Given>, FileError> {
    let document = value(path, text)?;
    let reader = Reader { path, settings };
    match &document {
        Value::Null => return Ok(Vec::new()),
        Value::Object(map) => reader.known(map, "")?,
        other => {
            return Err(reader.bad(
                "(top level)",
                format!("expected a map of settings, found {}", found(other)),
            ));
        }
    }
    let mut given = Vec::new();
    // `resources` last: its types' field indexes join the fleet's own.
    let (types, others): (Vec<&&Setting>, Vec<&&Setting>) = settings
        .iter()
        .filter(|s| s.file != FromFile::Derived)
        .partition(|s| s.file == FromFile::Resources);
    for setting in others.into_iter().chain(types) {
        match at(&document, setting.key) {
            None | Some(Value::Null) => {}
            Some(v) => reader.give(setting, v, &mut given)?,
        }
    }
    Ok(given)
}

/// The value at a dotted key path.
fn at<'a>(document: &'a Value, key: &str) -> Option<&'a Value> {
    key.split('.')
        .try_fold(document, |v, step| v.as_object()?.get(step))
}

/// What a value is, for errors.
fn found(v: &Value) -> String {
    match v {
        Value::Null => "nothing".into(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => n.to_string(),
        Value::String(s) => format!("{s:?}"),
        Value::Array(_) => "a list".into(),
        Value::Object(_) => "a map".into(),
    }
}

struct Reader<'a> {
    path: &'a Path,
    settings: &'a [&'static Setting],
}

impl Reader<'_> {
    fn bad(&self, key: &str, message: String) -> FileError {
        FileError::Value {
            path: self.path.to_path_buf(),
            key: key.to_string(),
            message,
        }
    }

    fn unknown(&self, key: String, among: &[&str]) -> FileError {
        let last = key.rsplit('.').next().unwrap_or(&key).to_string();
        FileError::UnknownKey {
            path: self.path.to_path_buf(),
            hint: close_match(among, &last),
            key,
        }
    }

    /// Every key's name, for close matches.
    fn names(&self) -> Vec<&'static str> {
        let mut names: Vec<&str> = self
            .settings
            .iter()
            .flat_map(|s| s.key.split('.'))
            .chain(RESOURCE_KEYS.iter().map(|(k, _)| *k))
            .chain(LABEL_RULE_KEYS.iter().copied())
            .filter(|n| *n != "*")
            .collect();
        names.sort_unstable();
        names.dedup();
        names
    }

    /// Checks that every key of `map` (at `prefix`) is a setting's or leads to one.
    fn known(&self, map: &Map<String, Value>, prefix: &str) -> Result<(), FileError> {
        for (k, v) in map {
            let full = if prefix.is_empty() {
                k.clone()
            } else {
                format!("{prefix}.{k}")
            };
            let below = format!("{full}.");
            if self.settings.iter().any(|s| s.key == full) {
                continue;
            }
            if !self.settings.iter().any(|s| s.key.starts_with(&below)) {
                return Err(self.unknown(full, &self.names()));
            }
            match v {
                Value::Object(inner) => self.known(inner, &full)?,
                Value::Null => {}
                other => {
                    return Err(self.bad(&full, format!("expected a map, found {}", found(other))));
                }
            }
        }
        Ok(())
    }

    fn expected(&self, setting: &Setting, key: &str, v: &Value) -> FileError {
        self.bad(
            key,
            format!("expected {}, found {}", setting.file.expected(), found(v)),
        )
    }

    fn text(&self, key: &str, v: &Value) -> Result<String, FileError> {
        v.as_str()
            .map(str::to_string)
            .ok_or_else(|| self.bad(key, format!("expected a string, found {}", found(v))))
    }

    fn texts(&self, key: &str, v: &Value) -> Result<Vec<String>, FileError> {
        let Value::Array(items) = v else {
            return Err(self.bad(
                key,
                format!("expected a list of strings, found {}", found(v)),
            ));
        };
        items
            .iter()
            .enumerate()
            .map(|(i, item)| self.text(&format!("{key}[{i}]"), item))
            .collect()
    }

    fn strings(&self, key: &str, v: &Value) -> Result<Vec<(String, String)>, FileError> {
        let Value::Object(map) = v else {
            return Err(self.bad(
                key,
                format!("expected a map of strings, found {}", found(v)),
            ));
        };
        map.iter()
            .map(|(k, v)| Ok((k.clone(), self.text(&format!("{key}.{k}"), v)?)))
            .collect()
    }

    /// The flag values of `setting`'s value `v`, pushed to `given`.
    fn give(
        &self,
        setting: &'static Setting,
        v: &Value,
        given: &mut Vec<Given>,
    ) -> Result<(), FileError> {
        let key = setting.key;
        let wrong = || self.expected(setting, key, v);
        let one = |s: String| vec![s];
        let values = match setting.file {
            FromFile::Text => one(self.text(key, v)?),
            FromFile::Count => one(v.as_u64().ok_or_else(wrong)?.to_string()),
            FromFile::Number => {
                v.as_f64().ok_or_else(wrong)?;
                one(v.to_string())
            }
            FromFile::Bool => one(v.as_bool().ok_or_else(wrong)?.to_string()),
            FromFile::Not => one((!v.as_bool().ok_or_else(wrong)?).to_string()),
            FromFile::Keep => {
                one((!keep_or_drop(&self.text(key, v)?).map_err(|m| self.bad(key, m))?).to_string())
            }
            FromFile::Duration | FromFile::Seconds => {
                let text = match v {
                    Value::String(s) => s.clone(),
                    Value::Number(n) => n.to_string(),
                    _ => return Err(wrong()),
                };
                let d = super::parse_duration(&text).map_err(|m| self.bad(key, m))?;
                if setting.file == FromFile::Seconds {
                    one(d.as_secs().max(1).to_string())
                } else {
                    one(text)
                }
            }
            FromFile::Texts => self.texts(key, v)?,
            FromFile::Pairs => self
                .strings(key, v)?
                .into_iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect(),
            FromFile::LabelRules => self.label_rules(key, v)?,
            FromFile::Resources => return self.resources(setting, v, given),
            FromFile::Derived => return Ok(()),
        };
        given.push(Given {
            key,
            arg: setting.id,
            values,
        });
        Ok(())
    }

    /// `clusters.labels`: `GLOB:KEY=VALUE,…` per entry.
    fn label_rules(&self, key: &str, v: &Value) -> Result<Vec<String>, FileError> {
        let Value::Array(rules) = v else {
            return Err(self.bad(
                key,
                format!(
                    "expected {}, found {}",
                    FromFile::LabelRules.expected(),
                    found(v)
                ),
            ));
        };
        let mut specs = Vec::new();
        for (i, rule) in rules.iter().enumerate() {
            let at = format!("{key}[{i}]");
            let Value::Object(rule) = rule else {
                return Err(self.bad(&at, format!("expected a map, found {}", found(rule))));
            };
            if let Some(k) = rule.keys().find(|k| !LABEL_RULE_KEYS.contains(&k.as_str())) {
                return Err(self.unknown(format!("{at}.{k}"), LABEL_RULE_KEYS));
            }
            let glob = match rule.get("match") {
                Some(m) => self.text(&format!("{at}.match"), m)?,
                None => return Err(self.bad(&at, "has no match".into())),
            };
            if glob.contains(':') {
                return Err(self.bad(
                    &format!("{at}.match"),
                    format!("{glob:?}: a cluster name glob has no ':'"),
                ));
            }
            let labels = match rule.get("labels") {
                Some(l) => self.strings(&format!("{at}.labels"), l)?,
                None => Vec::new(),
            };
            let mut pairs = Vec::new();
            for (k, v) in labels {
                if k.contains([',', '=']) || v.contains([',', '=']) {
                    return Err(self.bad(
                        &format!("{at}.labels.{k}"),
                        "label keys and values have no ',' or '='".into(),
                    ));
                }
                pairs.push(format!("{k}={v}"));
            }
            specs.push(format!("{glob}:{}", pairs.join(",")));
        }
        Ok(specs)
    }

    /// `resources`: the type names, and for the types with settings their `--scope`
    /// and `--field-index` values.
    fn resources(
        &self,
        setting: &'static Setting,
        v: &Value,
        given: &mut Vec<Given>,
    ) -> Result<(), FileError> {
        let key = setting.key;
        let list: Vec<(String, Option<&Map<String, Value>>)> = match v {
            Value::Array(_) => self.texts(key, v)?.into_iter().map(|n| (n, None)).collect(),
            Value::Object(map) => map
                .iter()
                .map(|(name, s)| match s {
                    Value::Null => Ok((name.clone(), None)),
                    Value::Object(s) => Ok((name.clone(), Some(s))),
                    other => Err(self.bad(
                        &format!("{key}.{name}"),
                        format!("expected a map of settings, found {}", found(other)),
                    )),
                })
                .collect::<Result<_, _>>()?,
            _ => return Err(self.expected(setting, key, v)),
        };
        given.push(Given {
            key,
            arg: setting.id,
            values: list.iter().map(|(n, _)| n.clone()).collect(),
        });
        let names: Vec<&str> = RESOURCE_KEYS.iter().map(|(k, _)| *k).collect();
        let mut scopes = Vec::new();
        let mut field_indexes = Vec::new();
        for (name, settings) in &list {
            let Some(settings) = settings else { continue };
            let mut parts = Vec::new();
            for (k, value) in *settings {
                let at = format!("{key}.{name}.{k}");
                let Some((_, part)) = RESOURCE_KEYS.iter().find(|(n, _)| n == k) else {
                    return Err(self.unknown(at, &names));
                };
                if value.is_null() {
                    continue;
                }
                let text = match k.as_str() {
                    "pruneAnnotations" => self.texts(&at, value)?.join(","),
                    "fieldIndexes" => {
                        field_indexes.extend(self.texts(&at, value)?);
                        continue;
                    }
                    _ => self.text(&at, value)?,
                };
                match k.as_str() {
                    "labelSelector" => {
                        fleetscope_model::LabelSelector::parse(&text)
                            .map_err(|e| self.bad(&at, e.to_string()))?;
                    }
                    "fieldSelector" => {
                        fleetscope_model::FieldSelector::parse(&text)
                            .map_err(|e| self.bad(&at, e.to_string()))?;
                    }
                    "managedFields" => {
                        keep_or_drop(&text).map_err(|m| self.bad(&at, m))?;
                    }
                    _ => {}
                }
                if text.contains(';') {
                    return Err(self.bad(&at, format!("{text:?} has a ';'")));
                }
                if let Some(option) = part {
                    parts.push(format!("{option}={text}"));
                }
            }
            if !parts.is_empty() {
                scopes.push(format!("{name}:{}", parts.join(";")));
            }
        }
        let derived = |id: &str| self.settings.iter().copied().find(|s| s.id == id);
        if let (false, Some(s)) = (scopes.is_empty(), derived("scopes")) {
            given.push(Given {
                key: s.key,
                arg: s.id,
                values: scopes,
            });
        }
        if let (false, Some(s)) = (field_indexes.is_empty(), derived("field_indexes")) {
            if given.iter().all(|g| g.arg != s.id) {
                given.push(Given {
                    key: s.key,
                    arg: s.id,
                    values: Vec::new(),
                });
            }
            for g in given.iter_mut().filter(|g| g.arg == s.id) {
                for p in &field_indexes {
                    if !g.values.contains(p) {
                        g.values.push(p.clone());
                    }
                }
            }
        }
        Ok(())
    }
}

/// `keep` or `drop`, as "drop it".
fn keep_or_drop(v: &str) -> Result<bool, String> {
    match v {
        "keep" => Ok(false),
        "drop" => Ok(true),
        other => Err(format!("{other:?}: expected keep or drop")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parsed(text: &str) -> Result<Vec<Given>, String> {
        parse(Path::new("fleetscope.yaml"), text).map_err(|e| e.to_string())
    }

    fn of<'a>(given: &'a [Given], arg: &str) -> &'a [String] {
        &given.iter().find(|g| g.arg == arg).unwrap().values
    }

    #[test]
    fn each_value_is_given_under_its_settings_key() {
        let given = parsed(
            "listen: a:1\nclusters: {labels: [{match: x, labels: {a: b}}], aliases: {c: d}}\nresources: {pods: {namespace: n}}\nstore: {persist: false}\n",
        )
        .unwrap();
        for g in &given {
            let s = serve_settings().find(|s| s.id == g.arg).unwrap();
            assert_eq!(s.key, g.key, "{g:?}");
        }
        assert_eq!(of(&given, "no_persist"), ["true"]);
    }

    #[test]
    fn the_shipped_example_is_valid_and_sets_every_key() {
        let path =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/kubernetes/base/fleetscope.yaml");
        let given = read(&path).unwrap();
        for s in serve_settings().filter(|s| !s.key.starts_with("sharding.")) {
            assert!(
                given.iter().any(|g| g.arg == s.id),
                "the example lacks {}",
                s.key
            );
        }
    }

    #[test]
    fn the_sharded_deployment_sets_every_sharding_setting_by_its_environment_variable() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let patch = std::fs::read_to_string(
            root.join("deploy/kubernetes/overlays/sharded/statefulset-patch.yaml"),
        )
        .unwrap();
        let command =
            <super::super::flags::ShardArgs as clap::Args>::augment_args(clap::Command::new("t"));
        for s in serve_settings().filter(|s| s.key.starts_with("sharding.")) {
            let arg = command
                .get_arguments()
                .find(|a| a.get_id() == s.id)
                .unwrap();
            let env = arg.get_env().unwrap().to_string_lossy().into_owned();
            assert!(
                patch.contains(&format!("name: {env}\n")),
                "the sharded overlay does not set {} ({env})",
                s.key
            );
        }
    }

    #[test]
    fn an_empty_file_sets_nothing() {
        assert!(parsed("").unwrap().is_empty());
        assert!(parsed("# only a comment\n").unwrap().is_empty());
        assert!(parsed("inCluster:\n").unwrap().is_empty());
    }

    #[test]
    fn unknown_keys_are_named_by_their_full_path_with_a_close_match() {
        let e = parsed("retention:\n  evnts: 10\n").unwrap_err();
        assert!(e.contains("\"retention.evnts\""), "{e}");
        assert!(e.contains("did you mean \"events\""), "{e}");
        let e = parsed("resources:\n  pods:\n    nmespace: x\n").unwrap_err();
        assert!(e.contains("resources.pods.nmespace"), "{e}");
        assert!(e.contains("\"namespace\""), "{e}");
        let e = parsed("resources: {pods: {namespace: no}}\nstore: {persist: yes}\n").unwrap_err();
        assert!(
            e.contains("store.persist"),
            "YAML 1.1 booleans are strings: {e}"
        );
        let e = parsed("colour: blue\n").unwrap_err();
        assert!(e.contains("unknown key \"colour\""), "{e}");
        assert!(!e.contains("did you mean"), "{e}");
        let e = parsed("informer:\n  pagesize: 10\n").unwrap_err();
        assert!(e.contains("did you mean \"pageSize\""), "{e}");
        let e = parsed("clusters:\n  labels:\n    - mtch: x\n").unwrap_err();
        assert!(
            e.contains("clusters.labels[0].mtch") && e.contains("\"match\""),
            "{e}"
        );
    }

    #[test]
    fn bad_values_are_named_by_their_full_path() {
        for (text, key, what) in [
            (
                "informer:\n  pageSize: lots\n",
                "informer.pageSize",
                "whole number",
            ),
            (
                "informer:\n  pageSize: -1\n",
                "informer.pageSize",
                "whole number",
            ),
            (
                "clusters:\n  labels:\n    - match: prod-*\n      labels: [a]\n",
                "clusters.labels[0].labels",
                "map",
            ),
            (
                "clusters:\n  labels:\n    - match: 'a:b'\n",
                "clusters.labels[0].match",
                "':'",
            ),
            (
                "pruning:\n  managedFields: sometimes\n",
                "pruning.managedFields",
                "keep or drop",
            ),
            (
                "watch:\n  bookmarkInterval: soon\n",
                "watch.bookmarkInterval",
                "duration",
            ),
            ("retention: 3\n", "retention", "expected a map"),
            ("kubeconfigs: a\n", "kubeconfigs", "list"),
            ("contexts: [a, [b]]\n", "contexts[1]", "string"),
            (
                "resources: {pods: {labelSelector: 'a in'}}\n",
                "resources.pods.labelSelector",
                "",
            ),
            (
                "resources: {pods: {namespace: 'a;b'}}\n",
                "resources.pods.namespace",
                "';'",
            ),
            ("- a\n- b\n", "(top level)", "map"),
        ] {
            let e = parsed(text).unwrap_err();
            assert!(
                e.contains(&format!(": {key}:")) && e.contains(what),
                "{text}: {e}"
            );
        }
        let e = parsed("listen: [1, 2\n").unwrap_err();
        assert!(e.contains("not YAML"), "{e}");
    }

    #[test]
    fn values_become_what_their_flags_take() {
        let given = parsed(
            "watch: {bookmarkInterval: 1m, stallTimeout: 90}\npruning: {managedFields: keep, lastApplied: drop}\nretention: {diskShare: 0.3}\nclusters: {aliases: {ctx: short}}\n",
        )
        .unwrap();
        assert_eq!(of(&given, "bookmark_seconds"), ["60"]);
        assert_eq!(of(&given, "watch_stall_timeout"), ["90"]);
        assert_eq!(of(&given, "keep_managed_fields"), ["true"]);
        assert_eq!(of(&given, "keep_last_applied"), ["false"]);
        assert_eq!(of(&given, "event_log_disk_share"), ["0.3"]);
        assert_eq!(of(&given, "cluster_aliases"), ["ctx=short"]);
    }

    proptest::proptest! {
        /// The configuration file is operator input: any text near its shape, at any
        /// key, is settings or an error naming what is wrong, never a panic.
        #[test]
        fn any_configuration_text_is_settings_or_an_error(
            text in "((listen|resources|clusters|informer|retention|watch|store|grpc|security|pruning|inCluster|fieldIndexes|kubeconfigs|contexts|logFormat):( [a-zA-Z0-9*./\\[\\] ,{}:=!;-]{0,40})?\n(  (pageSize|namespace|pods|labels|aliases|persist|tokenReview|ttl|match|managedFields|bookmarkInterval|events): [a-zA-Z0-9*./\\[\\] ,{}:=!;-]{0,40}\n){0,3}){0,5}\\PC{0,20}",
        ) {
            match parse(Path::new("fleetscope.yaml"), &text) {
                Ok(_) => {}
                Err(e) => proptest::prop_assert!(e.to_string().starts_with("fleetscope.yaml")),
            }
        }
    }

    #[test]
    fn resources_are_a_list_or_a_map_of_settings() {
        let list = parsed("resources: [pods, deployments.apps]\n").unwrap();
        assert_eq!(of(&list, "resources"), ["pods", "deployments.apps"]);
        let map = parsed(
            "resources:\n  pods:\n    fieldIndexes: [spec.nodeName]\n  configmaps:\n    namespace: team-0\n    labelSelector: app in (web,api)\n    managedFields: keep\n    pruneAnnotations: [a, b]\n  nodes:\nfieldIndexes: [status.phase]\n",
        )
        .unwrap();
        assert_eq!(of(&map, "resources"), ["pods", "configmaps", "nodes"]);
        assert_eq!(
            of(&map, "scopes"),
            [
                "configmaps:namespace=team-0;labels=app in (web,api);managedFields=keep;pruneAnnotations=a,b"
            ]
        );
        assert_eq!(of(&map, "field_indexes"), ["status.phase", "spec.nodeName"]);
        let scope = fleetscope_informer::cluster::Scope::parse(&of(&map, "scopes")[0]).unwrap();
        assert_eq!(scope.prune_managed_fields, Some(false));
        assert_eq!(scope.prune_annotations, Some(vec!["a".into(), "b".into()]));
        let only_types =
            parsed("resources:\n  pods:\n    fieldIndexes: [spec.nodeName]\n").unwrap();
        assert_eq!(of(&only_types, "field_indexes"), ["spec.nodeName"]);
    }
}
