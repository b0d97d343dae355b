//! Kubernetes `Status` failures, shaped exactly as a real kube-apiserver sends them.

use http::StatusCode;
use serde_json::{Map, Value, json};

use crate::resource::ResourceDef;

/// An API failure: an HTTP code and the `Status` body that goes with it.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    /// HTTP status code, also the Status `code`.
    pub code: u16,
    /// The Status `reason`, e.g. `NotFound`.
    pub reason: &'static str,
    /// The Status `message`.
    pub message: String,
    /// The Status `details`; omitted when `None`.
    pub details: Option<Box<Value>>,
    /// The fresh continue token an expired continue carries in the Status `metadata`.
    pub continue_token: Option<String>,
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}: {}", self.code, self.reason, self.message)
    }
}

impl std::error::Error for ApiError {}

/// `details` naming an object: `{"name": .., "group": .., "kind": plural}`.
fn details(def: &ResourceDef, name: Option<&str>) -> Value {
    Value::Object(details_of(&def.group, &def.plural, name))
}

/// `details` naming an object by `kind` (a plural or a kind, as the error has it), in
/// API group `group` (omitted for the core group).
fn details_of(group: &str, kind: &str, name: Option<&str>) -> Map<String, Value> {
    let mut d = Map::new();
    if let Some(name) = name {
        d.insert("name".into(), json!(name));
    }
    if !group.is_empty() {
        d.insert("group".into(), json!(group));
    }
    d.insert("kind".into(), json!(kind));
    d
}

/// A field error as Kubernetes writes it (`field: Type: detail`), as a Status cause.
fn field_cause(error: &str) -> Value {
    let (field, body) = error.split_once(": ").unwrap_or(("", error));
    let reason = match body.split(':').next().unwrap_or_default() {
        "Forbidden" => "FieldValueForbidden",
        "Required value" => "FieldValueRequired",
        "Unsupported value" => "FieldValueNotSupported",
        "Duplicate value" => "FieldValueDuplicate",
        "Too long" => "FieldValueTooLong",
        _ => "FieldValueInvalid",
    };
    json!({"reason": reason, "message": body, "field": field})
}

/// Field errors in a message: one as it is, several as a list.
fn listed<E: AsRef<str>>(errors: &[E]) -> String {
    match errors {
        [one] => one.as_ref().to_string(),
        many => format!(
            "[{}]",
            many.iter()
                .map(AsRef::as_ref)
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

fn qualified(def: &ResourceDef) -> String {
    in_group(&def.plural, &def.group)
}

/// `name` qualified by API group `group` (`deployments.apps`, `Scale.autoscaling`); a
/// core name as it is.
fn in_group(name: &str, group: &str) -> String {
    match group {
        "" => name.to_string(),
        group => format!("{name}.{group}"),
    }
}

impl ApiError {
    fn new(
        code: u16,
        reason: &'static str,
        message: impl Into<String>,
        details: Option<Value>,
    ) -> Self {
        Self {
            code,
            reason,
            message: message.into(),
            details: details.map(Box::new),
            continue_token: None,
        }
    }

    /// The Status JSON body.
    pub fn body(&self) -> Value {
        let metadata = match &self.continue_token {
            Some(c) => json!({"continue": c}),
            None => json!({}),
        };
        let mut status = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": metadata,
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
        });
        if let Some(details) = &self.details {
            status["details"] = details.as_ref().clone();
        }
        status["code"] = json!(self.code);
        status
    }

    /// The HTTP status code.
    pub fn status_code(&self) -> StatusCode {
        StatusCode::from_u16(self.code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
    }

    /// 401: a missing or unknown bearer token.
    pub fn unauthorized() -> Self {
        Self::new(401, "Unauthorized", "Unauthorized", None)
    }

    /// 403: RBAC denies `verb` on the resource.
    pub fn forbidden(
        def: &ResourceDef,
        user: &str,
        verb: &str,
        namespace: Option<&str>,
        name: Option<&str>,
    ) -> Self {
        let subject = match name {
            Some(n) => format!("{} \"{n}\"", qualified(def)),
            None => qualified(def),
        };
        let scope = match namespace {
            Some(ns) => format!("in the namespace \"{ns}\""),
            None => "at the cluster scope".into(),
        };
        Self::new(
            403,
            "Forbidden",
            format!(
                "{subject} is forbidden: User \"{user}\" cannot {verb} resource \"{}\" in API group \"{}\" {scope}",
                def.plural, def.group
            ),
            Some(details(def, name)),
        )
    }

    /// 404: the named object does not exist.
    pub fn not_found(def: &ResourceDef, name: &str) -> Self {
        Self::new(
            404,
            "NotFound",
            format!("{} \"{name}\" not found", qualified(def)),
            Some(details(def, Some(name))),
        )
    }

    /// 404: the namespace of a create does not exist.
    pub fn namespace_not_found(namespace: &str) -> Self {
        Self::new(
            404,
            "NotFound",
            format!("namespaces \"{namespace}\" not found"),
            Some(json!({"name": namespace, "kind": "namespaces"})),
        )
    }

    /// 404: no such path or resource type.
    pub fn unknown_resource() -> Self {
        Self::new(
            404,
            "NotFound",
            "the server could not find the requested resource",
            Some(json!({})),
        )
    }

    /// 409: create of a name that exists.
    pub fn already_exists(def: &ResourceDef, name: &str) -> Self {
        Self::new(
            409,
            "AlreadyExists",
            format!("{} \"{name}\" already exists", qualified(def)),
            Some(details(def, Some(name))),
        )
    }

    /// 409: update with a stale resourceVersion.
    pub fn conflict(def: &ResourceDef, name: &str) -> Self {
        Self::new(
            409,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on {} \"{name}\": the object has been modified; please apply your changes to the latest version and try again",
                qualified(def)
            ),
            Some(details(def, Some(name))),
        )
    }

    /// 400: a malformed request.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, "BadRequest", message, None)
    }

    /// 422: an object of `kind` (in API group `group`, empty for the core group) whose
    /// fields fail validation, as the API server answers: each error `field: Type:
    /// detail`, as Kubernetes writes a field error, one cause each.
    pub fn invalid<E: AsRef<str>>(group: &str, kind: &str, name: &str, errors: &[E]) -> Self {
        let mut d = details_of(group, kind, (!name.is_empty()).then_some(name));
        d.insert(
            "causes".into(),
            errors.iter().map(|e| field_cause(e.as_ref())).collect(),
        );
        Self::new(
            422,
            "Invalid",
            format!(
                "{} \"{name}\" is invalid: {}",
                in_group(kind, group),
                listed(errors)
            ),
            Some(Value::Object(d)),
        )
    }

    /// 422 for a request's query parameters, as the API server's validation of
    /// `ListOptions` (group `meta.k8s.io`) answers.
    pub fn invalid_options(errors: &[&str]) -> Self {
        Self::invalid("meta.k8s.io", "ListOptions", "", errors)
    }

    /// 422: a request the server understood and cannot carry out (a JSON patch whose
    /// operation fails).
    pub fn unprocessable(message: impl Into<String>) -> Self {
        Self::new(422, "Invalid", message, None)
    }

    /// 410: a list at a resourceVersion older than the retained history.
    pub fn expired_rv() -> Self {
        Self::new(
            410,
            "Expired",
            "The resourceVersion for the provided list is too old.",
            None,
        )
    }

    /// 410: a continue token older than the retained history; carries a fresh token
    /// that continues inconsistently from the same key.
    pub fn expired_continue(fresh_token: String) -> Self {
        let mut e = Self::new(
            410,
            "Expired",
            "The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter, or use the continue token in this response to retrieve the remainder of the results. Continuing with the provided token results in an inconsistent list - objects that were created, modified, or deleted between the time the first chunk was returned and now may show up in the list.",
            None,
        );
        e.continue_token = Some(fresh_token);
        e
    }

    /// 410 as a watch `ERROR` event's object: the watch's resourceVersion is too old.
    pub fn too_old_rv(requested: u64, oldest: u64) -> Self {
        Self::new(
            410,
            "Expired",
            format!("too old resource version: {requested} ({oldest})"),
            None,
        )
    }

    /// 504: a resourceVersion newer than the cluster's.
    pub fn too_large_rv(requested: u64, current: u64) -> Self {
        Self::new(
            504,
            "Timeout",
            format!("Timeout: Too large resource version: {requested}, current: {current}"),
            Some(
                json!({"causes": [{"reason": "ResourceVersionTooLarge", "message": "Too large resource version"}], "retryAfterSeconds": 1}),
            ),
        )
    }

    /// 405: a verb the path does not support.
    pub fn method_not_allowed(method: &str) -> Self {
        Self::new(
            405,
            "MethodNotAllowed",
            format!("the server does not allow this method on the requested resource ({method})"),
            Some(json!({})),
        )
    }

    /// 415: a patch type the simulator does not apply.
    pub fn unsupported_media_type(content_type: &str) -> Self {
        Self::new(
            415,
            "UnsupportedMediaType",
            format!(
                "the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/strategic-merge-patch+json (got {content_type})"
            ),
            None,
        )
    }

    /// 429: throttled (fault injection).
    pub fn too_many_requests() -> Self {
        Self::new(
            429,
            "TooManyRequests",
            "Too many requests, please try again later.",
            Some(json!({"retryAfterSeconds": 1})),
        )
    }

    /// 503: the server cannot handle the request now, as an aggregated API whose
    /// server is down answers (fault injection).
    pub fn service_unavailable(message: &str) -> Self {
        Self::new(503, "ServiceUnavailable", message, None)
    }

    /// 500: an internal error (fault injection).
    pub fn internal(message: &str) -> Self {
        Self::new(
            500,
            "InternalError",
            format!("Internal error occurred: {message}"),
            Some(json!({"causes": [{"message": message}]})),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resource::builtin;

    fn pods() -> ResourceDef {
        builtin().into_iter().find(|d| d.plural == "pods").unwrap()
    }

    #[test]
    fn forbidden_reads_like_rbac() {
        let e = ApiError::forbidden(&pods(), "realk8s-nobody", "list", None, None);
        assert_eq!(
            e.message,
            "pods is forbidden: User \"realk8s-nobody\" cannot list resource \"pods\" in API group \"\" at the cluster scope"
        );
        assert_eq!(e.body()["details"], json!({"kind": "pods"}));
    }

    #[test]
    fn invalid_list_options_read_as_a_real_api_server_writes_them() {
        // As kube-apiserver v1.20.2 answered a streaming list's watch
        // (`?watch=1&sendInitialEvents=true&resourceVersionMatch=NotOlderThan`).
        let e = ApiError::invalid_options(&[
            "resourceVersionMatch: Forbidden: resourceVersionMatch is forbidden for watch",
            "resourceVersionMatch: Forbidden: resourceVersionMatch is forbidden unless resourceVersion is provided",
        ]);
        let captured = json!({
          "kind": "Status",
          "apiVersion": "v1",
          "metadata": {},
          "status": "Failure",
          "message": "ListOptions.meta.k8s.io \"\" is invalid: [resourceVersionMatch: Forbidden: resourceVersionMatch is forbidden for watch, resourceVersionMatch: Forbidden: resourceVersionMatch is forbidden unless resourceVersion is provided]",
          "reason": "Invalid",
          "details": {
            "group": "meta.k8s.io",
            "kind": "ListOptions",
            "causes": [
              {
                "reason": "FieldValueForbidden",
                "message": "Forbidden: resourceVersionMatch is forbidden for watch",
                "field": "resourceVersionMatch"
              },
              {
                "reason": "FieldValueForbidden",
                "message": "Forbidden: resourceVersionMatch is forbidden unless resourceVersion is provided",
                "field": "resourceVersionMatch"
              }
            ]
          },
          "code": 422
        });
        assert_eq!(e.body(), captured);
        let one = ApiError::invalid_options(&[
            "resourceVersionMatch: Unsupported value: \"x\": supported values: \"Exact\", \"NotOlderThan\", \"\"",
        ]);
        assert_eq!(
            one.message,
            "ListOptions.meta.k8s.io \"\" is invalid: resourceVersionMatch: Unsupported value: \"x\": supported values: \"Exact\", \"NotOlderThan\", \"\""
        );
        assert_eq!(
            one.body()["details"]["causes"][0]["reason"],
            "FieldValueNotSupported"
        );
    }

    #[test]
    fn unauthorized_has_no_details() {
        let body = ApiError::unauthorized().body();
        assert!(body.get("details").is_none());
        assert_eq!(body["code"], 401);
    }
}
