//! JSON read and written without parsing its values: an object's members in their
//! order with each value's text borrowed ([`Members`]), a string borrowed unless it
//! holds escapes ([`Text`]), and a string written ([`write_str`]). What reshapes an
//! object's text (pruning as it arrives, splicing an answer's metadata) copies what it
//! does not change.

use std::borrow::Cow;

use serde::de::{Deserialize, Deserializer, MapAccess, Visitor};
use serde_json::value::RawValue;

/// A JSON object's members in their order, each value as its raw text.
pub struct Members<'a>(pub Vec<(Cow<'a, str>, &'a RawValue)>);

impl<'de> Deserialize<'de> for Members<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visit;
        impl<'de> Visitor<'de> for Visit {
            type Value = Members<'de>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut members = Vec::with_capacity(map.size_hint().unwrap_or(8));
                while let Some(key) = map.next_key::<Text<'de>>()? {
                    members.push((key.0, map.next_value::<&'de RawValue>()?));
                }
                Ok(Members(members))
            }
        }
        d.deserialize_map(Visit)
    }
}

/// A JSON string, borrowed from the input unless it had escapes.
pub struct Text<'a>(pub Cow<'a, str>);

impl<'de: 'a, 'a> Deserialize<'de> for Text<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visit;
        impl<'de> Visitor<'de> for Visit {
            type Value = Text<'de>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a string")
            }
            fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Self::Value, E> {
                Ok(Text(Cow::Borrowed(v)))
            }
            fn visit_str<E>(self, v: &str) -> Result<Self::Value, E> {
                Ok(Text(Cow::Owned(v.to_string())))
            }
        }
        d.deserialize_str(Visit)
    }
}

/// Writes `s` as a JSON string.
pub fn write_str(out: &mut String, s: &str) {
    if s.bytes().all(|b| b >= 0x20 && b != b'"' && b != b'\\') {
        out.push('"');
        out.push_str(s);
        out.push('"');
    } else if let Ok(escaped) = serde_json::to_string(s) {
        // Serialising a string cannot fail.
        out.push_str(&escaped);
    }
}
