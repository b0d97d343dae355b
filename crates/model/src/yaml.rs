//! The YAML files fleetscope reads (the configuration file, the tokens file, the
//! policy): YAML 1.2's booleans only, every key known (an unknown one is named by its
//! full path, with a close match), every bad value named by its key.

use std::path::{Path, PathBuf};

/// A YAML file that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum FileError {
    /// The file cannot be read.
    #[error("reading {}: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// Not YAML.
    #[error("{}: not YAML: {message}", path.display())]
    Yaml {
        /// The file.
        path: PathBuf,
        /// The parser's message, with the line and column.
        message: String,
    },
    /// A key fleetscope does not know.
    #[error("{}: unknown key {key:?}{}", path.display(), suggestion(hint))]
    UnknownKey {
        /// The file.
        path: PathBuf,
        /// The key's full path.
        key: String,
        /// A known key close to it.
        hint: Option<String>,
    },
    /// A value that cannot be used, with its key's full path.
    #[error("{}: {key}: {message}", path.display())]
    Value {
        /// The file.
        path: PathBuf,
        /// The key's full path.
        key: String,
        /// Why.
        message: String,
    },
}

fn suggestion(hint: &Option<String>) -> String {
    hint.as_ref()
        .map(|h| format!(" (did you mean {h:?}?)"))
        .unwrap_or_default()
}

/// The known key closest to `key`, when one is close.
pub fn close_match(keys: &[&str], key: &str) -> Option<String> {
    keys.iter()
        .map(|k| {
            (
                strsim::jaro_winkler(&key.to_lowercase(), &k.to_lowercase()),
                k,
            )
        })
        .filter(|(score, _)| *score > 0.8)
        .max_by(|a, b| a.0.total_cmp(&b.0))
        .map(|(_, k)| k.to_string())
}

/// A file's text, or an error naming it.
pub fn text_of(path: &Path) -> Result<String, FileError> {
    crate::file::read_text_capped(path).map_err(|source| FileError::Read {
        path: path.to_path_buf(),
        source,
    })
}

/// A YAML document as a JSON value (`Null` when the file is empty), with YAML 1.2's
/// booleans only (`namespace: no` is the string "no").
pub fn value(path: &Path, text: &str) -> Result<serde_json::Value, FileError> {
    if text.trim().is_empty() {
        return Ok(serde_json::Value::Null);
    }
    let mut options = serde_saphyr::Options::default();
    options.strict_booleans = true;
    serde_saphyr::from_str_with_options(text, options).map_err(|e| FileError::Yaml {
        path: path.to_path_buf(),
        message: e.to_string(),
    })
}

/// Reads a YAML document (`None` when the file is empty): YAML 1.2's booleans only
/// (`namespace: no` is the string "no"), every key known (an unknown one is an error
/// naming its full path and the closest of `keys`), every value's error naming its key.
pub fn document<T: serde::de::DeserializeOwned>(
    path: &Path,
    text: &str,
    keys: &[&str],
) -> Result<Option<T>, FileError> {
    let value = value(path, text)?;
    if value.is_null() {
        return Ok(None);
    }
    let mut unknown = Vec::new();
    let mut note = |p: serde_ignored::Path<'_>| unknown.push(p.to_string());
    let de = serde_ignored::Deserializer::new(value, &mut note);
    let document: T = serde_path_to_error::deserialize(de).map_err(|e| {
        let key = e.path().to_string();
        FileError::Value {
            path: path.to_path_buf(),
            key: if key == "." {
                "(top level)".into()
            } else {
                key
            },
            message: e.into_inner().to_string(),
        }
    })?;
    if let Some(key) = unknown.into_iter().next() {
        // Optional values add a `?` step to the path; the file has none.
        let key = key
            .split('.')
            .filter(|step| *step != "?")
            .collect::<Vec<_>>()
            .join(".");
        let last = key.rsplit('.').next().unwrap_or(&key).to_string();
        return Err(FileError::UnknownKey {
            path: path.to_path_buf(),
            hint: close_match(keys, &last),
            key,
        });
    }
    Ok(Some(document))
}
