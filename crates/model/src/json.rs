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

/// JSON compressed (LZ4) against a dictionary: the text of an object of the same
/// type, which it shares most of its text with. The index holds settled objects so,
/// and a snapshot stores them so (with its dictionaries), so a restart reads them back
/// as they are held without decompressing them.
#[derive(Debug, PartialEq, Eq)]
pub struct PackedJson {
    dictionary: std::sync::Arc<[u8]>,
    /// The text's length.
    len: u32,
    bytes: Box<[u8]>,
}

impl PackedJson {
    /// Texts shorter than this are not worth compressing.
    pub const LEAST: usize = 64;

    /// `text` compressed against `dictionary`; `None` when that does not make it smaller.
    pub fn pack(dictionary: &std::sync::Arc<[u8]>, text: &str) -> Option<Self> {
        let len = u32::try_from(text.len()).ok()?;
        let bytes = lz4_flex::block::compress_with_dict(text.as_bytes(), dictionary);
        (text.len() >= Self::LEAST && bytes.len() < text.len()).then(|| Self {
            dictionary: dictionary.clone(),
            len,
            bytes: bytes.into_boxed_slice(),
        })
    }

    /// A packed text as it was stored: the compressed `bytes` of a text of `len`
    /// bytes, against `dictionary`. Whether they decompress is checked where they are
    /// read ([`PackedJson::text`]); a store checks its records' checksums.
    pub fn stored(dictionary: std::sync::Arc<[u8]>, len: u32, bytes: Box<[u8]>) -> Self {
        Self {
            dictionary,
            len,
            bytes,
        }
    }

    /// The dictionary it was compressed against.
    pub fn dictionary(&self) -> &std::sync::Arc<[u8]> {
        &self.dictionary
    }

    /// The compressed bytes.
    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// The length of the text.
    pub fn text_len(&self) -> usize {
        self.len as usize
    }

    /// The text; `None` when the bytes do not decompress against the dictionary to
    /// UTF-8 of the length given (they were damaged after they were checked).
    pub fn text(&self) -> Option<String> {
        let bytes =
            lz4_flex::block::decompress_with_dict(&self.bytes, self.len as usize, &self.dictionary)
                .ok()?;
        (bytes.len() == self.len as usize)
            .then(|| String::from_utf8(bytes).ok())
            .flatten()
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

    #[test]
    fn packed_text_reads_back_and_what_does_not_shrink_is_not_packed() {
        let dictionary: std::sync::Arc<[u8]> = std::sync::Arc::from(
            &br#"{"kind":"Pod","metadata":{"name":"a","namespace":"default"},"spec":{}}"#[..],
        );
        let text = r#"{"kind":"Pod","metadata":{"name":"b","namespace":"default"},"spec":{"x":1}}"#;
        let packed = PackedJson::pack(&dictionary, text).unwrap();
        assert!(packed.bytes().len() < text.len());
        assert_eq!(packed.text_len(), text.len());
        assert_eq!(packed.text().as_deref(), Some(text));
        let stored =
            PackedJson::stored(dictionary.clone(), text.len() as u32, packed.bytes().into());
        assert_eq!(stored, packed);
        // Against another dictionary the bytes do not give the text back.
        let other = PackedJson::stored(
            std::sync::Arc::from(&b"{}"[..]),
            text.len() as u32,
            packed.bytes().into(),
        );
        assert_ne!(other.text().as_deref(), Some(text));
        // Too short, or nothing shared: held as text.
        assert!(PackedJson::pack(&dictionary, r#"{"a":1}"#).is_none());
        let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
        let noise: String = (0..100)
            .map(|_| {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                char::from(b'!' + (seed % 90) as u8)
            })
            .collect();
        assert!(PackedJson::pack(&dictionary, &noise).is_none());
    }
}
