//! `fleetscope.v1.Object` on the wire, written by hand so that its JSON is the
//! index's own shared text ([`Json`]): an answer or a Watch event is encoded straight
//! from it, never copied into a string per caller first. The other messages are
//! generated and hold this one (`extern_path` in `build.rs`); the wire format is the
//! proto's, field for field (a test compares it with a generated twin).

use prost::bytes::{Buf, BufMut};
use prost::encoding::{self, DecodeContext, WireType};

use fleetscope_model::Json;

/// One object: its identity, its revisions and its JSON. See `proto/fleetscope/v1`.
#[derive(Clone, PartialEq, Eq, Hash, Default, Debug)]
pub struct Object {
    /// The cluster's name.
    pub cluster: String,
    /// The resource type, as plural.group.
    pub resource: String,
    /// The namespace; empty for cluster-scoped objects.
    pub namespace: String,
    /// The name.
    pub name: String,
    /// metadata.uid.
    pub uid: String,
    /// metadata.resourceVersion in its cluster.
    pub resource_version: String,
    /// The fleet revision of the change that produced this state.
    pub revision: u64,
    /// The object as JSON.
    pub json: Json,
}

/// The field numbers of `fleetscope.v1.Object`.
pub mod tag {
    /// `cluster`.
    pub const CLUSTER: u32 = 1;
    /// `resource`.
    pub const RESOURCE: u32 = 2;
    /// `namespace`.
    pub const NAMESPACE: u32 = 3;
    /// `name`.
    pub const NAME: u32 = 4;
    /// `uid`.
    pub const UID: u32 = 5;
    /// `resource_version`.
    pub const RESOURCE_VERSION: u32 = 6;
    /// `revision`.
    pub const REVISION: u32 = 7;
    /// `json`.
    pub const JSON: u32 = 8;
}
use tag::*;

impl Object {
    fn strings(&self) -> [(u32, &String); 6] {
        [
            (CLUSTER, &self.cluster),
            (RESOURCE, &self.resource),
            (NAMESPACE, &self.namespace),
            (NAME, &self.name),
            (UID, &self.uid),
            (RESOURCE_VERSION, &self.resource_version),
        ]
    }
}

/// The JSON field's text, copied once from the buffer into the shared [`Json`] (not
/// into a string first) where the message's bytes are in one piece, as tonic hands a
/// message over; anything else (a text split across pieces, a length past the end,
/// text that is not UTF-8) is read, or refused, as prost reads a string.
fn json_in(
    wire_type: WireType,
    buf: &mut impl Buf,
    ctx: DecodeContext,
) -> Result<Json, prost::DecodeError> {
    encoding::check_wire_type(WireType::LengthDelimited, wire_type)?;
    let mut peek = buf.chunk();
    if let Ok(len) = encoding::decode_varint(&mut peek)
        && let Ok(len) = usize::try_from(len)
        && let Some(bytes) = peek.get(..len)
        && let Ok(text) = std::str::from_utf8(bytes)
    {
        let json = Json::from(text);
        let read = buf.chunk().len() - peek.len() + len;
        buf.advance(read);
        return Ok(json);
    }
    let mut text = String::new();
    encoding::string::merge(wire_type, &mut text, buf, ctx)?;
    Ok(Json::from(text))
}

impl prost::Message for Object {
    fn encode_raw(&self, buf: &mut impl BufMut) {
        for (tag, value) in self.strings() {
            if !value.is_empty() {
                encoding::string::encode(tag, value, buf);
            }
        }
        if self.revision != 0 {
            encoding::uint64::encode(REVISION, &self.revision, buf);
        }
        if !self.json.is_empty() {
            encoding::encode_key(JSON, WireType::LengthDelimited, buf);
            encoding::encode_varint(self.json.len() as u64, buf);
            buf.put_slice(self.json.as_bytes());
        }
    }

    fn merge_field(
        &mut self,
        tag: u32,
        wire_type: WireType,
        buf: &mut impl Buf,
        ctx: DecodeContext,
    ) -> Result<(), prost::DecodeError> {
        let field = match tag {
            CLUSTER => &mut self.cluster,
            RESOURCE => &mut self.resource,
            NAMESPACE => &mut self.namespace,
            NAME => &mut self.name,
            UID => &mut self.uid,
            RESOURCE_VERSION => &mut self.resource_version,
            REVISION => return encoding::uint64::merge(wire_type, &mut self.revision, buf, ctx),
            JSON => {
                self.json = json_in(wire_type, buf, ctx)?;
                return Ok(());
            }
            _ => return encoding::skip_field(wire_type, tag, buf, ctx),
        };
        encoding::string::merge(wire_type, field, buf, ctx)
    }

    fn encoded_len(&self) -> usize {
        let strings: usize = self
            .strings()
            .iter()
            .filter(|(_, v)| !v.is_empty())
            .map(|(tag, v)| encoding::string::encoded_len(*tag, v))
            .sum();
        let revision = if self.revision == 0 {
            0
        } else {
            encoding::uint64::encoded_len(REVISION, &self.revision)
        };
        let json = if self.json.is_empty() {
            0
        } else {
            encoding::key_len(JSON)
                + encoding::encoded_len_varint(self.json.len() as u64)
                + self.json.len()
        };
        strings + revision + json
    }

    fn clear(&mut self) {
        *self = Self::default();
    }
}

#[cfg(test)]
mod tests {
    use prost::Message as _;

    use super::*;

    /// `fleetscope.v1.Object` as prost would generate it.
    #[derive(Clone, PartialEq, prost::Message)]
    struct Generated {
        #[prost(string, tag = "1")]
        cluster: String,
        #[prost(string, tag = "2")]
        resource: String,
        #[prost(string, tag = "3")]
        namespace: String,
        #[prost(string, tag = "4")]
        name: String,
        #[prost(string, tag = "5")]
        uid: String,
        #[prost(string, tag = "6")]
        resource_version: String,
        #[prost(uint64, tag = "7")]
        revision: u64,
        #[prost(string, tag = "8")]
        json: String,
    }

    fn pair(json: &str, revision: u64, name: &str) -> (Object, Generated) {
        (
            Object {
                cluster: "c".into(),
                resource: "pods".into(),
                namespace: String::new(),
                name: name.into(),
                uid: "u".into(),
                resource_version: "7".into(),
                revision,
                json: json.into(),
            },
            Generated {
                cluster: "c".into(),
                resource: "pods".into(),
                namespace: String::new(),
                name: name.into(),
                uid: "u".into(),
                resource_version: "7".into(),
                revision,
                json: json.into(),
            },
        )
    }

    #[test]
    fn the_wire_is_the_generated_messages() {
        for (json, revision, name) in [
            ("{\"a\":1}", 42, "n"),
            ("", 0, ""),
            (&"x".repeat(300) as &str, u64::MAX, "é"),
        ] {
            let (ours, theirs) = pair(json, revision, name);
            assert_eq!(ours.encode_to_vec(), theirs.encode_to_vec());
            assert_eq!(ours.encoded_len(), theirs.encoded_len());
            let back = Object::decode(theirs.encode_to_vec().as_slice()).unwrap();
            assert_eq!(back, ours);
        }
    }

    #[test]
    fn bad_input_is_a_decode_error_and_unknown_fields_are_skipped() {
        // json (tag 8) that is not UTF-8.
        assert!(Object::decode(&[0x42, 0x01, 0xff][..]).is_err());
        // Truncated.
        assert!(Object::decode(&[0x42, 0x05, b'a'][..]).is_err());
        // An unknown field 9 (a varint), then name.
        let o = Object::decode(&[0x48, 0x01, 0x22, 0x01, b'p'][..]).unwrap();
        assert_eq!(o.name, "p");
        // json given as a varint.
        assert!(Object::decode(&[0x40, 0x01][..]).is_err());
    }

    #[test]
    fn json_split_across_the_buffers_pieces_reads_the_same() {
        let (ours, theirs) = pair("{\"name\":\"é\"}", 7, "n");
        let wire = theirs.encode_to_vec();
        // Every cut, including one inside the text and one inside the "é".
        for cut in 0..wire.len() {
            let (a, b) = wire.split_at(cut);
            let back = Object::decode(prost::bytes::Buf::chain(a, b)).unwrap();
            assert_eq!(back, ours, "cut at {cut}");
        }
        // Not UTF-8, split.
        let bad = [0x42, 0x02, 0xc3, 0x28];
        assert!(Object::decode(prost::bytes::Buf::chain(&bad[..3], &bad[3..])).is_err());
    }
}
