//! An object's JSON text, held once and shared: the index, the event log, every
//! answer and every Watch subscriber hold the same allocation (one count, no weak
//! references), and the wire writes it straight from there.

use std::fmt;
use std::ops::Deref;

/// JSON text, shared.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Json(triomphe::Arc<str>);

impl Json {
    /// The text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl Default for Json {
    /// Empty text.
    fn default() -> Self {
        Self(triomphe::Arc::from(""))
    }
}

impl Deref for Json {
    type Target = str;

    fn deref(&self) -> &str {
        &self.0
    }
}

impl AsRef<str> for Json {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl From<String> for Json {
    fn from(s: String) -> Self {
        Self(triomphe::Arc::from(s))
    }
}

impl From<&str> for Json {
    fn from(s: &str) -> Self {
        Self(triomphe::Arc::from(s))
    }
}

impl From<Box<str>> for Json {
    fn from(s: Box<str>) -> Self {
        Self(triomphe::Arc::from(&*s))
    }
}

impl PartialEq<str> for Json {
    fn eq(&self, other: &str) -> bool {
        &*self.0 == other
    }
}

impl PartialEq<&str> for Json {
    fn eq(&self, other: &&str) -> bool {
        &*self.0 == *other
    }
}

impl PartialEq<String> for Json {
    fn eq(&self, other: &String) -> bool {
        *self.0 == **other
    }
}

impl fmt::Debug for Json {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

impl fmt::Display for Json {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_clone_shares_the_text() {
        let a = Json::from(String::from("{\"a\":1}"));
        let b = a.clone();
        assert!(std::ptr::eq(a.as_str(), b.as_str()));
        assert_eq!(b, "{\"a\":1}");
        assert_eq!(Json::default().as_str(), "");
    }
}
