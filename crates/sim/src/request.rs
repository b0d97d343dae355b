//! What the handlers of a request share: the parsed query, the target resource, the
//! representation asked for, and the response shapes. The HTTP router (`http`), the
//! table printer (`table`) and the watch server (`watch`) all build on it, and it on none of them.

use std::collections::HashMap;
use std::convert::Infallible;
use std::io;
use std::sync::Arc;

use bytes::Bytes;
use fleetscope_model::{FieldSelector, LabelSelector};
use http::{HeaderValue, Response, StatusCode, header};
use http_body_util::{BodyExt, Full, combinators::BoxBody};
use serde_json::{Value, json};

use crate::resource::ResourceDef;
use crate::status::ApiError;
use crate::store::StoredObject;

/// The response body type: whole documents, or a watch stream.
pub type Body = BoxBody<Bytes, io::Error>;

/// How an object or list is to be represented, from the `Accept` header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Repr {
    /// Plain JSON.
    Full,
    /// `PartialObjectMetadata` / `PartialObjectMetadataList`.
    Metadata,
    /// A `meta.k8s.io/v1` `Table`, as kubectl asks for.
    Table,
}

pub(crate) fn negotiate(accept: Option<&HeaderValue>) -> Repr {
    let accept = accept.and_then(|a| a.to_str().ok()).unwrap_or("");
    // The first acceptable media type wins, as in the apiserver's negotiation.
    for part in accept.split(',') {
        if part.contains("as=Table")
            && (part.contains("v=v1;") || part.ends_with("v=v1") || part.contains("v=v1beta1"))
        {
            return Repr::Table;
        }
        if part.contains("as=PartialObjectMetadata") {
            return Repr::Metadata;
        }
        let media = part.split(';').next().unwrap_or("").trim();
        if matches!(media, "application/json" | "*/*" | "application/*") {
            return Repr::Full;
        }
    }
    Repr::Full
}

pub(crate) fn full(bytes: impl Into<Bytes>) -> Body {
    Full::new(bytes.into())
        .map_err(|never: Infallible| match never {})
        .boxed()
}

pub(crate) fn json_response(code: StatusCode, bytes: impl Into<Bytes>) -> Response<Body> {
    let mut resp = Response::new(full(bytes));
    *resp.status_mut() = code;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp
}

pub(crate) fn error_response(e: &ApiError) -> Response<Body> {
    let mut resp = json_response(
        e.status_code(),
        serde_json::to_vec(&e.body()).unwrap_or_default(),
    );
    if e.code == 429 || e.code == 504 {
        resp.headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    }
    resp
}

pub(crate) fn value_response(code: StatusCode, v: &Value) -> Response<Body> {
    json_response(code, serde_json::to_vec(v).unwrap_or_default())
}

/// Query parameters; the last of a repeated name wins.
pub(crate) struct Query(HashMap<String, String>);

impl Query {
    pub(crate) fn parse(q: Option<&str>) -> Self {
        Query(
            form_urlencoded::parse(q.unwrap_or("").as_bytes())
                .into_owned()
                .collect(),
        )
    }

    pub(crate) fn get(&self, k: &str) -> Option<&str> {
        self.0.get(k).map(String::as_str)
    }

    pub(crate) fn flag(&self, k: &str) -> bool {
        matches!(self.get(k), Some("1" | "true" | "True"))
    }

    pub(crate) fn label_selector(&self) -> Result<LabelSelector, ApiError> {
        LabelSelector::parse(self.get("labelSelector").unwrap_or(""))
            .map_err(|e| ApiError::bad_request(format!("unable to parse requirement: {e}")))
    }

    pub(crate) fn field_selector(&self, def: &ResourceDef) -> Result<FieldSelector, ApiError> {
        let s = FieldSelector::parse(self.get("fieldSelector").unwrap_or(""))
            .map_err(|e| ApiError::bad_request(e.to_string()))?;
        if let Some(r) = s
            .requirements()
            .iter()
            .find(|r| !def.is_selectable(&r.path))
        {
            return Err(ApiError::bad_request(format!(
                "field label not supported: {}",
                r.path
            )));
        }
        Ok(s)
    }
}

/// A request aimed at one resource type.
pub(crate) struct Target {
    pub def: Arc<ResourceDef>,
    pub namespace: Option<String>,
    pub name: Option<String>,
    /// `scale` or `status`, for a subresource.
    pub subresource: Option<String>,
}

/// The object's metadata alone, as `PartialObjectMetadata`.
pub(crate) fn partial_metadata(obj: &StoredObject) -> Value {
    let v = obj.value();
    json!({"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": v.get("metadata").cloned().unwrap_or(json!({}))})
}

/// The field error of a `resourceVersionMatch` without a `resourceVersion`, on a list
/// and, on a server from before WatchList, on a watch.
pub(crate) const MATCH_WITHOUT_RV: &str = "resourceVersionMatch: Forbidden: resourceVersionMatch is forbidden unless resourceVersion is provided";

/// Parses `resourceVersion` and `resourceVersionMatch` as the apiserver validates them
/// for a list; a watch validates the match itself (see `watch::serve`).
pub(crate) fn parse_rv(q: &Query) -> Result<(Option<u64>, Option<&str>), ApiError> {
    let (rv, m) = parse_rv_unchecked(q)?;
    match (m, rv) {
        (Some(_), None) => Err(ApiError::invalid_options(&[MATCH_WITHOUT_RV])),
        (Some("Exact"), Some(0)) => Err(ApiError::invalid_options(&[
            "resourceVersionMatch: Forbidden: resourceVersionMatch \"exact\" is forbidden for resourceVersion \"0\"",
        ])),
        _ => Ok((rv, m)),
    }
}

/// Parses `resourceVersion` and `resourceVersionMatch`, checking only that each is well formed.
pub(crate) fn parse_rv_unchecked(q: &Query) -> Result<(Option<u64>, Option<&str>), ApiError> {
    let rv = match q.get("resourceVersion").filter(|s| !s.is_empty()) {
        None => None,
        Some(s) => Some(
            s.parse::<u64>()
                .map_err(|_| ApiError::bad_request(format!("invalid resource version: {s}")))?,
        ),
    };
    let m = q.get("resourceVersionMatch").filter(|s| !s.is_empty());
    match (m, rv) {
        (Some(m), _) if m != "NotOlderThan" && m != "Exact" => {
            Err(ApiError::invalid_options(&[&format!(
                "resourceVersionMatch: Unsupported value: \"{m}\": supported values: \"Exact\", \"NotOlderThan\", \"\""
            )]))
        }
        _ => Ok((rv, m)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A list's `resourceVersionMatch` checks answer as kube-apiserver v1.20.2 answered
    /// the same queries.
    #[test]
    fn list_options_are_refused_as_a_real_api_server_refuses_them() {
        for (query, message) in [
            (
                "resourceVersionMatch=NotOlderThan",
                "ListOptions.meta.k8s.io \"\" is invalid: resourceVersionMatch: Forbidden: resourceVersionMatch is forbidden unless resourceVersion is provided",
            ),
            (
                "resourceVersionMatch=Exact&resourceVersion=0",
                "ListOptions.meta.k8s.io \"\" is invalid: resourceVersionMatch: Forbidden: resourceVersionMatch \"exact\" is forbidden for resourceVersion \"0\"",
            ),
            (
                "resourceVersionMatch=x&resourceVersion=5",
                "ListOptions.meta.k8s.io \"\" is invalid: resourceVersionMatch: Unsupported value: \"x\": supported values: \"Exact\", \"NotOlderThan\", \"\"",
            ),
        ] {
            let e = parse_rv(&Query::parse(Some(query))).unwrap_err();
            assert_eq!(e.body()["code"], 422, "{query}");
            assert_eq!(e.message, message, "{query}");
            assert_eq!(
                e.body()["details"]["group"],
                "meta.k8s.io",
                "{query}: {}",
                e.body()
            );
        }
        assert_eq!(
            parse_rv(&Query::parse(Some(
                "resourceVersionMatch=NotOlderThan&resourceVersion=5"
            )))
            .unwrap(),
            (Some(5), Some("NotOlderThan"))
        );
    }
}
