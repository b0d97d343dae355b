//! The tokens file: bearer tokens by their SHA-256 (the file never holds a token),
//! each with the name and groups of the identity it stands for. A presented token is
//! hashed and compared with every entry in constant time.
//!
//! ```yaml
//! tokens:
//!   - name: dashboard            # the identity's user name
//!     groups: [team-a]
//!     sha256: 9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08
//! ```
//!
//! `printf %s "$TOKEN" | sha256sum` gives a token's hash.

use std::path::Path;

use fleetscope_model::access::Subject;
use serde::Deserialize;

use fleetscope_model::yaml::{FileError, document, text_of};

const KEYS: &[&str] = &["tokens", "name", "groups", "sha256"];

#[derive(Debug, Deserialize)]
struct TokensFile {
    tokens: Vec<TokenFile>,
}

#[derive(Debug, Deserialize)]
struct TokenFile {
    name: String,
    #[serde(default)]
    groups: Vec<String>,
    sha256: String,
}

#[derive(Debug, Clone)]
struct Entry {
    hash: [u8; 32],
    subject: Subject,
}

/// The tokens a server accepts.
#[derive(Debug, Clone, Default)]
pub struct Tokens {
    entries: Vec<Entry>,
}

/// The SHA-256 of a token.
pub fn hash(token: &str) -> [u8; 32] {
    let digest = ring::digest::digest(&ring::digest::SHA256, token.as_bytes());
    let mut out = [0u8; 32];
    out.copy_from_slice(digest.as_ref());
    out
}

fn hex32(s: &str) -> Option<[u8; 32]> {
    let s = s.trim();
    if s.len() != 64 || !s.is_ascii() {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, b) in out.iter_mut().enumerate() {
        *b = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(out)
}

impl Tokens {
    /// Reads a tokens file. Every error names the file and the key.
    pub fn load(path: &Path) -> Result<Self, FileError> {
        Self::parse(path, &text_of(path)?)
    }

    /// Parses a tokens document read from `path`.
    pub fn parse(path: &Path, text: &str) -> Result<Self, FileError> {
        let value = |key: String, message: &str| FileError::Value {
            path: path.to_path_buf(),
            key,
            message: message.to_string(),
        };
        let Some(file) = document::<TokensFile>(path, text, KEYS)? else {
            return Err(value(
                "tokens".into(),
                "the tokens file is empty: it must list its tokens",
            ));
        };
        let mut entries: Vec<Entry> = Vec::new();
        for (i, t) in file.tokens.into_iter().enumerate() {
            let hash = hex32(&t.sha256).ok_or_else(|| {
                value(
                    format!("tokens[{i}].sha256"),
                    "expected 64 hex digits: the SHA-256 of the token (printf %s \"$TOKEN\" | sha256sum)",
                )
            })?;
            if t.name.is_empty() {
                return Err(value(format!("tokens[{i}].name"), "a token needs a name"));
            }
            if entries.iter().any(|e| e.hash == hash) {
                return Err(value(
                    format!("tokens[{i}].sha256"),
                    "the same token is listed twice",
                ));
            }
            entries.push(Entry {
                hash,
                subject: Subject {
                    user: t.name,
                    groups: t.groups,
                },
            });
        }
        Ok(Self { entries })
    }

    /// Who a presented token stands for, if anyone. Every entry is compared, each in
    /// constant time, so the time taken says nothing about which entry came close.
    pub fn subject(&self, token: &str) -> Option<&Subject> {
        let presented = hash(token);
        let mut found = None;
        for e in &self.entries {
            let diff = e
                .hash
                .iter()
                .zip(presented.iter())
                .fold(0u8, |acc, (a, b)| acc | (a ^ b));
            if std::hint::black_box(diff) == 0 {
                found = Some(&e.subject);
            }
        }
        found
    }

    /// How many tokens.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// The hex SHA-256 of a token, as the tokens file lists it.
pub fn hex_hash(token: &str) -> String {
    hash(token).iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_is_known_by_its_hash_and_nothing_else_matches() {
        let text = format!(
            "tokens:\n  - name: dashboard\n    groups: [team-a]\n    sha256: {}\n  - name: ci\n    sha256: {}\n",
            hex_hash("s3cret"),
            hex_hash("other").to_uppercase()
        );
        let t = Tokens::parse(Path::new("tokens.yaml"), &text).unwrap();
        let s = t.subject("s3cret").unwrap();
        assert_eq!(
            (s.user.as_str(), s.groups.as_slice()),
            ("dashboard", &["team-a".to_string()][..])
        );
        assert_eq!(t.subject("other").unwrap().user, "ci");
        assert!(t.subject("s3cre").is_none());
        assert!(t.subject("").is_none());
        // The well-known test vector: sha256("test").
        assert_eq!(
            hex_hash("test"),
            "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
        );
    }

    #[test]
    fn bad_tokens_files_name_the_file_and_the_key() {
        let e = |text: &str| {
            Tokens::parse(Path::new("tokens.yaml"), text)
                .unwrap_err()
                .to_string()
        };
        let m = e("tokens:\n  - name: a\n    sha256: s3cret\n");
        assert!(
            m.contains("tokens.yaml") && m.contains("tokens[0].sha256") && m.contains("64 hex"),
            "{m}"
        );
        let m = e("tokens:\n  - name: a\n    token: s3cret\n");
        assert!(m.contains("tokens[0]"), "{m}");
        let h = hex_hash("x");
        let m = e(&format!(
            "tokens:\n  - {{name: a, sha256: {h}}}\n  - {{name: b, sha256: {h}}}\n"
        ));
        assert!(m.contains("tokens[1].sha256") && m.contains("twice"), "{m}");
        assert!(e("").contains("empty"));
    }

    proptest::proptest! {
        /// The tokens file is operator input: any text is a clear error or a file,
        /// never a panic.
        #[test]
        fn any_tokens_file_text_parses_or_is_an_error(
            text in "(tokens:\n)?(  - (name|sha256|groups): [a-z0-9\\[\\] ,{}:]{0,70}\n){0,4}\\PC{0,20}",
        ) {
            let _ = Tokens::parse(Path::new("tokens.yaml"), &text);
        }
    }
}
