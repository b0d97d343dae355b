//! A replica's `fleetscope.v1.ListResponse` read as a router reads it: each object
//! straight into the fleet's own [`FleetObject`], its strings read where they lie in
//! the received message and its location shared with the object before it when they
//! are the same, rather than into the six strings of a `fleetscope.v1.Object` that are
//! then copied again. Every other field is the generated message's.

use std::sync::Arc;

use fleetscope_model::fleet::FleetObject;
use fleetscope_model::{Json, Location, ObjectKey, Revision};
use prost::Message as _;
use prost::bytes::{Buf, BufMut};
use prost::encoding::{self, DecodeContext, WireType};

use fleetscope_proto as proto;
use fleetscope_proto::wire::tag;

/// The tag of `ListResponse.items`.
const ITEMS: u32 = 1;

/// A page of a replica's list: its objects, and the rest of the message.
#[derive(Debug, Default)]
pub(crate) struct Page {
    /// `items`, in order.
    pub(crate) items: Vec<FleetObject>,
    /// Every other field (its `items` left empty).
    pub(crate) rest: proto::ListResponse,
    /// The location of the last object read, for the next to share.
    last: Option<Arc<Location>>,
}

/// The fields of one `fleetscope.v1.Object` as they lie in the message.
#[derive(Default)]
struct Fields<'a> {
    cluster: &'a str,
    resource: &'a str,
    namespace: &'a str,
    name: &'a str,
    uid: &'a str,
    resource_version: &'a str,
    revision: u64,
    json: &'a str,
}

impl<'a> Fields<'a> {
    /// The fields of the encoded `Object` in `body`; fields it does not know skipped,
    /// a field given twice taken as last given (as prost reads them). `None` for
    /// anything else, which prost then reads (or refuses) itself.
    fn read(mut body: &'a [u8], ctx: &DecodeContext) -> Option<Self> {
        let mut f = Fields::default();
        while !body.is_empty() {
            let (tag, wire_type) = encoding::decode_key(&mut body).ok()?;
            let text = match tag {
                tag::CLUSTER => &mut f.cluster,
                tag::RESOURCE => &mut f.resource,
                tag::NAMESPACE => &mut f.namespace,
                tag::NAME => &mut f.name,
                tag::UID => &mut f.uid,
                tag::RESOURCE_VERSION => &mut f.resource_version,
                tag::JSON => &mut f.json,
                tag::REVISION => {
                    encoding::uint64::merge(wire_type, &mut f.revision, &mut body, ctx.clone())
                        .ok()?;
                    continue;
                }
                _ => {
                    encoding::skip_field(wire_type, tag, &mut body, ctx.clone()).ok()?;
                    continue;
                }
            };
            if wire_type != WireType::LengthDelimited {
                return None;
            }
            let len = usize::try_from(encoding::decode_varint(&mut body).ok()?).ok()?;
            *text = std::str::from_utf8(body.get(..len)?).ok()?;
            body = &body[len..];
        }
        Some(f)
    }
}

impl Page {
    /// One encoded `Object` of `items`, read into the fleet's type.
    fn read_item(
        &mut self,
        wire_type: WireType,
        buf: &mut impl Buf,
        ctx: &DecodeContext,
    ) -> Result<(), prost::DecodeError> {
        // tonic hands a message over in one piece: taking an item of it is not a copy.
        let mut body = prost::bytes::Bytes::new();
        encoding::bytes::merge(wire_type, &mut body, buf, ctx.clone())?;
        let Some(f) = Fields::read(&body, ctx) else {
            let object = proto::Object::decode(body)?;
            self.items.push(crate::convert::object_in(object));
            return Ok(());
        };
        let location = match &self.last {
            Some(l)
                if *l.resource == *f.resource
                    && l.cluster.as_str() == f.cluster
                    && *l.namespace == *f.namespace =>
            {
                l.clone()
            }
            _ => Arc::new(Location {
                resource: f.resource.into(),
                cluster: f.cluster.into(),
                namespace: f.namespace.into(),
            }),
        };
        self.last = Some(location.clone());
        self.items.push(FleetObject {
            key: ObjectKey::in_location(location, f.name.into()),
            revision: Revision(f.revision),
            uid: f.uid.into(),
            resource_version: f.resource_version.into(),
            json: Json::from(f.json),
        });
        Ok(())
    }
}

impl prost::Message for Page {
    fn encode_raw(&self, buf: &mut impl BufMut) {
        for o in &self.items {
            encoding::message::encode(ITEMS, &crate::convert::object(o.clone()), buf);
        }
        self.rest.encode_raw(buf);
    }

    fn merge_field(
        &mut self,
        tag: u32,
        wire_type: WireType,
        buf: &mut impl Buf,
        ctx: DecodeContext,
    ) -> Result<(), prost::DecodeError> {
        if tag == ITEMS {
            return self.read_item(wire_type, buf, &ctx);
        }
        self.rest.merge_field(tag, wire_type, buf, ctx)
    }

    fn encoded_len(&self) -> usize {
        let items: usize = self
            .items
            .iter()
            .map(|o| encoding::message::encoded_len(ITEMS, &crate::convert::object(o.clone())))
            .sum();
        items + self.rest.encoded_len()
    }

    fn clear(&mut self) {
        *self = Self::default();
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use prost::Message as _;

    use super::*;

    /// What the generated message and `convert::object_in` make of the same bytes.
    fn generated(wire: &[u8]) -> (Vec<FleetObject>, proto::ListResponse) {
        let mut page = proto::ListResponse::decode(wire).unwrap();
        let items = std::mem::take(&mut page.items);
        (
            items.into_iter().map(crate::convert::object_in).collect(),
            page,
        )
    }

    fn object(cluster: &str, namespace: &str, name: &str, json: &str) -> proto::Object {
        proto::Object {
            cluster: cluster.into(),
            resource: "pods".into(),
            namespace: namespace.into(),
            name: name.into(),
            uid: format!("uid-{name}"),
            resource_version: "12".into(),
            revision: 7,
            json: json.into(),
        }
    }

    fn same(wire: &[u8]) {
        let page = Page::decode(wire).unwrap();
        let (items, rest) = generated(wire);
        assert_eq!(page.items.len(), items.len());
        for (a, b) in page.items.iter().zip(&items) {
            assert_eq!(a.key, b.key);
            assert_eq!(
                (&a.uid, &a.resource_version, a.revision, &a.json),
                (&b.uid, &b.resource_version, b.revision, &b.json)
            );
        }
        assert_eq!(page.rest, rest);
        // And written back, the same message.
        assert_eq!(
            proto::ListResponse::decode(page.encode_to_vec().as_slice()).unwrap(),
            proto::ListResponse::decode(wire).unwrap()
        );
    }

    #[test]
    fn a_page_reads_as_the_generated_message_does_and_shares_each_location() {
        let response = proto::ListResponse {
            items: vec![
                object("a", "x", "1", "{\"n\":1}"),
                object("a", "x", "2", "{}"),
                object("a", "y", "3", ""),
                object("b", "y", "é", "{\"é\":\"ü\"}"),
                object("b", "y", "5", "{}"),
            ],
            next_page_token: "t".into(),
            revision: 99,
            clusters: vec![proto::ClusterFreshness {
                cluster: "a".into(),
                ..Default::default()
            }],
            partial: true,
            remaining_item_count: 3,
            warnings: vec!["w".into()],
        };
        let wire = response.encode_to_vec();
        same(&wire);
        let page = Page::decode(wire.as_slice()).unwrap();
        let shared = |i: usize, j: usize| {
            Arc::ptr_eq(page.items[i].key.location(), page.items[j].key.location())
        };
        assert!(shared(0, 1) && shared(3, 4));
        assert!(!shared(1, 2) && !shared(2, 3));
    }

    #[test]
    fn an_object_s_unknown_fields_are_skipped_and_bad_ones_refused() {
        // An item holding an unknown varint field 9, then name "p".
        let item = [0x48, 0x01, 0x22, 0x01, b'p'];
        let mut wire = vec![0x0a, item.len() as u8];
        wire.extend_from_slice(&item);
        same(&wire);
        assert_eq!(
            &*Page::decode(wire.as_slice()).unwrap().items[0].key.name,
            "p"
        );
        for bad in [
            // json not UTF-8.
            &[0x0a, 0x03, 0x42, 0x01, 0xff][..],
            // name longer than the item.
            &[0x0a, 0x03, 0x22, 0x05, b'a'][..],
            // The item longer than the message.
            &[0x0a, 0x09, 0x22, 0x01, b'a'][..],
            // json given as a varint.
            &[0x0a, 0x02, 0x40, 0x01][..],
            // items given as a varint.
            &[0x08, 0x01][..],
        ] {
            assert!(Page::decode(bad).is_err(), "{bad:?}");
            assert!(proto::ListResponse::decode(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn a_message_split_across_pieces_reads_the_same() {
        let wire = proto::ListResponse {
            items: vec![
                object("a", "x", "1", "{\"é\":1}"),
                object("a", "x", "2", "{}"),
            ],
            ..Default::default()
        }
        .encode_to_vec();
        for cut in 0..wire.len() {
            let (a, b) = wire.split_at(cut);
            let page = Page::decode(prost::bytes::Buf::chain(a, b)).unwrap();
            assert_eq!(page.items.len(), 2, "cut at {cut}");
            assert_eq!(page.items[0].json, "{\"é\":1}");
        }
    }

    proptest! {
        #[test]
        fn any_page_reads_as_the_generated_message_does(
            items in proptest::collection::vec(
                ("[ab]", "[xy]?", "\\PC{0,6}", "\\PC{0,40}", any::<u64>()),
                0..20,
            ),
            token in "\\PC{0,8}",
        ) {
            let response = proto::ListResponse {
                items: items
                    .iter()
                    .map(|(c, ns, name, json, revision)| proto::Object {
                        revision: *revision,
                        ..object(c, ns, name, json)
                    })
                    .collect(),
                next_page_token: token,
                ..Default::default()
            };
            same(&response.encode_to_vec());
        }
    }
}
