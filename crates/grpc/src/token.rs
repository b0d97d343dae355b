//! Page tokens: opaque to clients, they carry the snapshot's revision, the query and
//! where to continue, so the next page walks the same snapshot. Each is signed
//! (HMAC-SHA256 with the server's key) over its contents and the identity it was
//! issued to: a token altered, forged, or replayed by another caller is refused as
//! `INVALID_ARGUMENT`, never read.

use base64::Engine as _;
use fleetscope_model::{ClusterName, ObjectKey, Revision};
use prost::Message as _;
use tonic::Status;

use fleetscope_proto as proto;

/// The key page tokens are signed with.
#[derive(Clone)]
pub struct TokenKey(ring::hmac::Key);

impl std::fmt::Debug for TokenKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TokenKey(..)")
    }
}

impl TokenKey {
    /// A key from 32 secret bytes.
    pub fn new(secret: &[u8; 32]) -> Self {
        Self(ring::hmac::Key::new(ring::hmac::HMAC_SHA256, secret))
    }

    /// A fresh random key (tokens then live as long as the process).
    pub fn random() -> Result<Self, RandomUnavailable> {
        Ok(Self::new(&random_secret()?))
    }

    /// The key in a file shared by the servers that continue each other's lists (a
    /// ring's replicas and routers): at least 32 bytes, all of them used.
    pub fn from_file(path: &std::path::Path) -> Result<Self, String> {
        let secret = fleetscope_model::file::read_capped(path)
            .map_err(|e| format!("{}: {e}", path.display()))?;
        if secret.len() < 32 {
            return Err(format!(
                "{}: {} bytes; a page token key needs at least 32 (e.g. head -c 32 /dev/urandom)",
                path.display(),
                secret.len()
            ));
        }
        Ok(Self(ring::hmac::Key::new(ring::hmac::HMAC_SHA256, &secret)))
    }

    /// A key of its own for `purpose`, derived from this one (HMAC of the purpose),
    /// so that what is signed for one purpose is never valid for another.
    pub fn derive(&self, purpose: &[u8]) -> ring::hmac::Key {
        let tag = ring::hmac::sign(&self.0, purpose);
        ring::hmac::Key::new(ring::hmac::HMAC_SHA256, tag.as_ref())
    }
}

/// The system's random generator failed: no key can be made, and a predictable one
/// would let anyone forge page tokens, so the start stops.
#[derive(Debug, Clone, Copy, thiserror::Error)]
#[error("the system's random generator failed, so no key for page tokens can be made")]
pub struct RandomUnavailable;

/// 32 random bytes from the system's generator.
pub fn random_secret() -> Result<[u8; 32], RandomUnavailable> {
    use ring::rand::SecureRandom as _;
    let mut secret = [0u8; 32];
    ring::rand::SystemRandom::new()
        .fill(&mut secret)
        .map_err(|_| RandomUnavailable)?;
    Ok(secret)
}

/// What a page token carries: the snapshot's revision, the query, and where to continue.
#[derive(serde::Serialize, serde::Deserialize)]
struct PageToken {
    /// Snapshot revision.
    r: u64,
    /// The query, protobuf-encoded, base64.
    q: String,
    /// The last key returned: resource, cluster, namespace, name.
    a: [String; 4],
    /// A router's continuation ([`fleetscope_model::fleet::ListAnswer::resume`]),
    /// base64; absent for a single server's.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    p: String,
}

/// What a page token continues: the snapshot's revision, the query, the last key
/// returned, and a router's continuation (empty from a single server).
#[derive(Debug)]
pub struct Continuation {
    /// The snapshot's revision.
    pub revision: Revision,
    /// The query paged.
    pub query: proto::Query,
    /// The last key returned.
    pub after: ObjectKey,
    /// A router's continuation; empty from a single server.
    pub resume: Vec<u8>,
}

/// The most a page token may be: a query and a key, with room to spare.
const MAX_TOKEN: usize = 64 * 1024;

fn signature(key: &TokenKey, payload: &[u8], caller: &str) -> ring::hmac::Tag {
    let mut ctx = ring::hmac::Context::with_key(&key.0);
    ctx.update(payload);
    // A separator the payload (JSON) never holds, so (payload, caller) pairs cannot
    // collide.
    ctx.update(&[0]);
    ctx.update(caller.as_bytes());
    ctx.sign()
}

/// What a sealed token's signature covers besides its payload and caller, so that a
/// token of one kind is never taken for another.
const SEALED: &[u8] = b"fleetscope sealed token\0";

/// The most a sealed token may be.
const MAX_SEALED: usize = 4 << 20;

/// `payload` signed for `caller`, as a token (base64 payload, '.', base64 signature).
pub fn seal(key: &TokenKey, caller: &str, payload: &[u8]) -> String {
    let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let mut signed = SEALED.to_vec();
    signed.extend_from_slice(payload);
    let tag = signature(key, &signed, caller);
    format!("{}.{}", b64.encode(payload), b64.encode(tag.as_ref()))
}

/// The payload of a token [`seal`] made for `caller` with `key`; `None` for anything
/// else.
pub fn unseal(key: &TokenKey, caller: &str, token: &str) -> Option<Vec<u8>> {
    let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    if token.len() > MAX_SEALED {
        return None;
    }
    let (payload, tag) = token.split_once('.')?;
    let payload = b64.decode(payload).ok()?;
    let tag = b64.decode(tag).ok()?;
    let mut signed = SEALED.to_vec();
    signed.extend_from_slice(&payload);
    signed.push(0);
    signed.extend_from_slice(caller.as_bytes());
    ring::hmac::verify(&key.0, &signed, &tag).ok()?;
    Some(payload)
}

/// A page token continuing `query` from `after` in the snapshot at `revision` (and a
/// router's `resume`), signed for `caller`: only the same caller may continue it.
pub fn encode_token(
    key: &TokenKey,
    caller: &str,
    revision: Revision,
    query: &proto::Query,
    after: &ObjectKey,
    resume: &[u8],
) -> String {
    let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let token = PageToken {
        r: revision.0,
        q: b64.encode(query.encode_to_vec()),
        a: [
            after.resource.to_string(),
            after.cluster.to_string(),
            after.namespace.to_string(),
            after.name.to_string(),
        ],
        p: b64.encode(resume),
    };
    let payload = serde_json::to_vec(&token).unwrap_or_default();
    let tag = signature(key, &payload, caller);
    format!("{}.{}", b64.encode(&payload), b64.encode(tag.as_ref()))
}

/// What a page token continues, if it was signed with `key` for `caller`; an
/// invalid token (forged, another caller's, malformed) is `INVALID_ARGUMENT`.
pub fn decode_token(key: &TokenKey, caller: &str, token: &str) -> Result<Continuation, Status> {
    let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let bad = || {
        Status::invalid_argument(
            "page_token was not issued to this caller by this server (or the server restarted without a data directory): pass back next_page_token unchanged, or start the list again without one",
        )
    };
    if token.len() > MAX_TOKEN {
        return Err(bad());
    }
    let (payload, tag) = token.split_once('.').ok_or_else(bad)?;
    let payload = b64.decode(payload).map_err(|_| bad())?;
    let tag = b64.decode(tag).map_err(|_| bad())?;
    let mut ctx_payload = payload.clone();
    ctx_payload.push(0);
    ctx_payload.extend_from_slice(caller.as_bytes());
    ring::hmac::verify(&key.0, &ctx_payload, &tag).map_err(|_| bad())?;
    let t: PageToken = serde_json::from_slice(&payload).map_err(|_| bad())?;
    let query =
        proto::Query::decode(b64.decode(&t.q).map_err(|_| bad())?.as_slice()).map_err(|_| bad())?;
    let resume = b64.decode(&t.p).map_err(|_| bad())?;
    let [r, c, n, m] = t.a;
    Ok(Continuation {
        revision: Revision(t.r),
        query,
        after: ObjectKey::new(&r, &ClusterName::from(c), &n, &m),
        resume,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sealed_token_opens_only_for_its_caller_and_key_and_is_no_page_token() {
        let key = TokenKey::new(&[7; 32]);
        let token = seal(&key, "alice", b"{\"v\":1}");
        assert_eq!(
            unseal(&key, "alice", &token).as_deref(),
            Some(&b"{\"v\":1}"[..])
        );
        assert_eq!(unseal(&key, "bob", &token), None);
        assert_eq!(unseal(&TokenKey::new(&[8; 32]), "alice", &token), None);
        let (payload, _) = token.split_once('.').unwrap();
        assert_eq!(unseal(&key, "alice", &format!("{payload}.AAAA")), None);
        assert!(decode_token(&key, "alice", &token).is_err());
        let page = encode_token(
            &key,
            "alice",
            Revision(1),
            &proto::Query::default(),
            &ObjectKey::new("pods", &ClusterName::from("a"), "ns", "p"),
            b"",
        );
        assert_eq!(unseal(&key, "alice", &page), None);
        assert_eq!(unseal(&key, "alice", "garbage"), None);
    }

    fn token(key: &TokenKey, caller: &str) -> String {
        let query = proto::Query {
            resource: "pods".into(),
            ..Default::default()
        };
        let after = ObjectKey::new("pods", &ClusterName::from("a"), "ns", "p1");
        encode_token(key, caller, Revision(7), &query, &after, b"")
    }

    #[test]
    fn a_token_reads_back_for_its_caller_only() {
        let key = TokenKey::random().unwrap();
        let t = token(&key, "alice");
        let c = decode_token(&key, "alice", &t).unwrap();
        assert_eq!(
            (c.revision, c.query.resource.as_str(), &*c.after.name),
            (Revision(7), "pods", "p1")
        );
        assert!(c.resume.is_empty());
        // A router's continuation rides along, signed with the rest.
        let query = proto::Query::default();
        let routed = encode_token(
            &key,
            "alice",
            Revision(3),
            &query,
            &c.after,
            b"\x01positions",
        );
        assert_eq!(
            decode_token(&key, "alice", &routed).unwrap().resume,
            b"\x01positions"
        );
        let e = decode_token(&key, "bob", &t).unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument);
        assert!(e.message().contains("this caller"), "{}", e.message());
        // Another server's key.
        assert!(decode_token(&TokenKey::random().unwrap(), "alice", &t).is_err());
    }

    #[test]
    fn an_altered_or_forged_token_is_invalid_not_expired() {
        let key = TokenKey::random().unwrap();
        let t = token(&key, "alice");
        let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
        let (payload, tag) = t.split_once('.').unwrap();
        // Another revision, same signature.
        let mut raw: serde_json::Value =
            serde_json::from_slice(&b64.decode(payload).unwrap()).unwrap();
        raw["r"] = 1.into();
        let forged = format!("{}.{tag}", b64.encode(raw.to_string()));
        for bad in [
            forged,
            format!("{payload}."),
            "x".repeat(100),
            "a.b".into(),
            "x".repeat(MAX_TOKEN + 1),
        ] {
            let e = decode_token(&key, "alice", &bad).unwrap_err();
            assert_eq!(e.code(), tonic::Code::InvalidArgument, "{bad}");
            assert!(e.message().len() < 300, "the token is not echoed");
        }
    }

    proptest::proptest! {
        /// A page token is untrusted input: any text, and any change to a real one,
        /// is refused with INVALID_ARGUMENT, never a panic and never read.
        #[test]
        fn any_text_or_altered_token_is_refused_without_a_panic(
            text in "\\PC{0,200}",
            at in 0usize..400,
            byte in proptest::prelude::any::<u8>(),
        ) {
            let key = TokenKey::random().unwrap();
            let e = decode_token(&key, "alice", &text).unwrap_err();
            proptest::prop_assert_eq!(e.code(), tonic::Code::InvalidArgument);
            let good = token(&key, "alice");
            let mut altered = good.clone().into_bytes();
            let i = at % altered.len();
            if altered[i] != byte {
                altered[i] = byte;
                if let Ok(altered) = String::from_utf8(altered) {
                    proptest::prop_assert!(decode_token(&key, "alice", &altered).is_err());
                }
            }
        }
    }
}
