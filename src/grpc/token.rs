//! Page tokens: opaque to clients, they carry the snapshot's revision, the query and
//! where to continue, so the next page walks the same snapshot.

use base64::Engine as _;
use fleetscope_model::{ClusterName, ObjectKey, Revision};
use prost::Message as _;
use tonic::Status;

use crate::proto;

/// What a page token carries: the snapshot's revision, the query, and where to continue.
#[derive(serde::Serialize, serde::Deserialize)]
struct PageToken {
    /// Snapshot revision.
    r: u64,
    /// The query, protobuf-encoded, base64.
    q: String,
    /// The last key returned: resource, cluster, namespace, name.
    a: [String; 4],
}

pub(crate) fn encode_token(revision: Revision, query: &proto::Query, after: &ObjectKey) -> String {
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
    };
    b64.encode(serde_json::to_vec(&token).unwrap_or_default())
}

pub(crate) fn decode_token(token: &str) -> Result<(Revision, proto::Query, ObjectKey), Status> {
    let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let bad = || {
        Status::invalid_argument(
            "page_token is not a token this server issued: pass back next_page_token unchanged, or start the list without one",
        )
    };
    let raw = b64.decode(token).map_err(|_| bad())?;
    let t: PageToken = serde_json::from_slice(&raw).map_err(|_| bad())?;
    let query =
        proto::Query::decode(b64.decode(&t.q).map_err(|_| bad())?.as_slice()).map_err(|_| bad())?;
    let [r, c, n, m] = t.a;
    Ok((
        Revision(t.r),
        query,
        ObjectKey::new(&r, &ClusterName::from(c), &n, &m),
    ))
}
