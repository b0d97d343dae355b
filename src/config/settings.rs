//! What a setting of `serve` is: declared once, on its field of a flags struct in
//! [`super::flags`], with the [`settings!`](crate::settings) macro. The field's
//! `#[arg]` and doc comment give the flag, its environment variable, its default and
//! its documentation (clap reads them); the `[key, kind, applies]` before the field
//! gives its key in the configuration file, how the file's value becomes the flag's
//! (`kind`, a [`FromFile`]) and when a change applies (an [`Applies`]).
//!
//! Everything else reads these declarations: the file reader (every key known, each
//! value checked by its kind, then by the flag's own parser), the unknown-key hints,
//! `config check` and the reload's "takes effect at the next restart".

/// How the configuration file's value of a setting becomes its flag's values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FromFile {
    /// A string.
    Text,
    /// A whole number, 0 or more.
    Count,
    /// A number.
    Number,
    /// `true` or `false`.
    Bool,
    /// `true` or `false`, the flag's opposite (`store.persist: false` is `--no-persist`).
    Not,
    /// `keep` or `drop`: `keep` sets the flag.
    Keep,
    /// A duration (`30s`, `2m`, or a number of seconds).
    Duration,
    /// A duration, given to the flag as whole seconds (at least 1).
    Seconds,
    /// A list of strings, one flag value each.
    Texts,
    /// A map of strings, one `KEY=VALUE` flag value per entry.
    Pairs,
    /// `clusters.labels`: a list of `{match: GLOB, labels: {KEY: VALUE}}`, one
    /// `GLOB:KEY=VALUE,…` flag value each.
    LabelRules,
    /// `resources`: a list of type names, or a map from a type name to its settings
    /// (see [`RESOURCE_KEYS`]); gives `--resources`, and `--scope` and more
    /// `--field-index` values for the types with settings.
    Resources,
    /// Given by another key's value: `--scope` by `resources`.
    Derived,
}

impl FromFile {
    /// What the file's value must be, for errors.
    pub fn expected(self) -> &'static str {
        match self {
            FromFile::Text => "a string",
            FromFile::Count => "a whole number, 0 or more",
            FromFile::Number => "a number",
            FromFile::Bool | FromFile::Not => "true or false",
            FromFile::Keep => "keep or drop",
            FromFile::Duration | FromFile::Seconds => "a duration (e.g. 30s, 500ms, 2m)",
            FromFile::Texts => "a list of strings",
            FromFile::Pairs => "a map of strings",
            FromFile::LabelRules => "a list of {match: GLOB, labels: {KEY: VALUE}}",
            FromFile::Resources => {
                "a list of resource types, or a map from resource type to its settings"
            }
            FromFile::Derived => "nothing",
        }
    }
}

/// When a new value of a setting (in a reloaded configuration file) takes effect.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Applies {
    /// At once: the cluster sources are loaded again (kubeconfigs, contexts, names).
    Sources,
    /// At once: each cluster changes what it collects and how, without reconnecting.
    Collection,
    /// At the next restart: it shapes the process (listeners, the store, buffers,
    /// which security files are read).
    Restart,
}

impl Applies {
    /// `live` or `restart`, as `config check` prints it.
    pub fn as_str(self) -> &'static str {
        match self {
            Applies::Sources | Applies::Collection => "live",
            Applies::Restart => "restart",
        }
    }
}

/// One setting: its clap argument (by id, the field's name), its key in the file,
/// how the file's value is read, and when a change applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Setting {
    /// The clap argument's id: the field's name.
    pub id: &'static str,
    /// The key's full path in the configuration file (`informer.pageSize`).
    pub key: &'static str,
    /// How the file's value becomes the flag's.
    pub file: FromFile,
    /// When a change applies.
    pub applies: Applies,
}

/// The keys of one type's settings under `resources` (each optional): the `--scope`
/// part each gives, if any.
pub const RESOURCE_KEYS: &[(&str, Option<&str>)] = &[
    ("namespace", Some("namespace")),
    ("labelSelector", Some("labels")),
    ("fieldSelector", Some("fields")),
    ("managedFields", Some("managedFields")),
    ("pruneAnnotations", Some("pruneAnnotations")),
    ("fieldIndexes", None),
];

/// The keys of one `clusters.labels` entry.
pub const LABEL_RULE_KEYS: &[&str] = &["match", "labels"];

/// Declares a struct of flags, some of them settings of `serve`: a field preceded by
/// `[KEY, KIND, APPLIES]` (its file key, a [`FromFile`] and an [`Applies`]) is one;
/// a field without is a flag only (or a flattened struct). The struct gets
/// `SETTINGS`, its settings in order.
#[macro_export]
macro_rules! settings {
    (
        $(#[$meta:meta])*
        pub struct $name:ident {
            $(
                $([$key:literal, $file:ident, $applies:ident])?
                $(#[$fmeta:meta])*
                pub $field:ident : $ty:ty,
            )*
        }
    ) => {
        $(#[$meta])*
        pub struct $name {
            $( $(#[$fmeta])* pub $field: $ty, )*
        }

        impl $name {
            /// The settings among these flags, in order.
            pub const SETTINGS: &'static [$crate::config::settings::Setting] = &[
                $($(
                    $crate::config::settings::Setting {
                        id: stringify!($field),
                        key: $key,
                        file: $crate::config::settings::FromFile::$file,
                        applies: $crate::config::settings::Applies::$applies,
                    },
                )?)*
            ];
        }
    };
}

/// The setting of a clap id among `settings`.
pub fn of<'a>(settings: &'a [Setting], id: &str) -> Option<&'a Setting> {
    settings.iter().find(|s| s.id == id)
}

/// One setting as the reference shows it: everything its declaration gives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Described {
    /// Its key in the configuration file.
    pub key: &'static str,
    /// Its flag (`--page-size`).
    pub flag: String,
    /// Its environment variable, if it has one.
    pub env: Option<String>,
    /// Its default, as the flag takes it (several joined with `,`); empty for none.
    pub default: String,
    /// `live` or `restart`.
    pub applies: &'static str,
    /// Its documentation's first sentence.
    pub help: String,
}

/// The first sentence of `help`: up to the first full stop followed by a space that
/// ends neither an abbreviation (`e.g.`, `i.e.`) nor falls inside parentheses, with no
/// full stop of its own.
fn first_sentence(help: &str) -> &str {
    let mut depth = 0usize;
    for (i, c) in help.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth = depth.saturating_sub(1),
            '.' if depth == 0 && help[i + 1..].starts_with([' ', '\n']) => {
                let word = help[..i].rsplit([' ', '(', '\n']).next().unwrap_or("");
                if !matches!(word, "e.g" | "i.e" | "etc" | "cf" | "vs") {
                    return &help[..i];
                }
            }
            _ => {}
        }
    }
    help.trim_end().trim_end_matches('.')
}

/// Every setting of `settings` described from its declaration and its argument in
/// `serve` (the `serve` subcommand of a built command, so global flags are in it).
pub fn describe<'a>(
    serve: &clap::Command,
    settings: impl Iterator<Item = &'a Setting>,
) -> Vec<Described> {
    settings
        .filter_map(|s| {
            let arg = serve.get_arguments().find(|a| a.get_id() == s.id)?;
            let help = arg.get_help().map(|h| h.to_string()).unwrap_or_default();
            let first = first_sentence(&help).replace('\n', " ");
            Some(Described {
                key: s.key,
                flag: format!("--{}", arg.get_long()?),
                env: arg.get_env().map(|e| e.to_string_lossy().into_owned()),
                default: arg
                    .get_default_values()
                    .iter()
                    .map(|v| v.to_string_lossy())
                    .collect::<Vec<_>>()
                    .join(","),
                applies: s.applies.as_str(),
                help: first,
            })
        })
        .collect()
}

/// The settings as a Markdown table, as `docs/settings.md` shows them.
pub fn markdown(described: &[Described]) -> String {
    let cell = |s: &str| s.replace('|', "\\|");
    let mut out = String::from(
        "| key | flag | environment | default | applies | what |\n| --- | --- | --- | --- | --- | --- |\n",
    );
    for d in described {
        let code = |s: &str| {
            if s.is_empty() {
                String::new()
            } else {
                format!("`{}`", cell(s))
            }
        };
        out.push_str(&format!(
            "| `{}` | `{}` | {} | {} | {} | {} |\n",
            d.key,
            d.flag,
            code(d.env.as_deref().unwrap_or("")),
            code(&d.default),
            d.applies,
            cell(&d.help)
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_setting_s_summary_is_its_first_sentence_whole() {
        assert_eq!(
            first_sentence("A JSON path to index (e.g. `spec.nodeName`); repeatable."),
            "A JSON path to index (e.g. `spec.nodeName`); repeatable"
        );
        assert_eq!(
            first_sentence("Where to listen, e.g. 0.0.0.0:50051. Restart to change."),
            "Where to listen, e.g. 0.0.0.0:50051"
        );
        assert_eq!(first_sentence("One. Two."), "One");
        assert_eq!(first_sentence("Version 1.2 of it"), "Version 1.2 of it");
        assert_eq!(first_sentence(""), "");
    }
}
