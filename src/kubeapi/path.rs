//! What a request path of the Kubernetes API front end names. Paths follow kcp:
//! `/clusters/{cluster}/api/v1/…` and `/clusters/{cluster}/apis/{group}/{version}/…`
//! answer as that cluster would, `/clusters/*/…` is the whole fleet; the same paths
//! without the `/clusters/…` prefix are the whole fleet too.

/// Which clusters a path reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scope {
    /// The whole fleet (`/clusters/*/…`, or no prefix).
    Fleet,
    /// One cluster.
    Cluster(String),
}

/// A resource's place in the API: its group (empty for the core group), version and
/// plural name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resource {
    /// API group; empty for the core group (`/api/v1`).
    pub group: String,
    /// API version.
    pub version: String,
    /// Plural name.
    pub plural: String,
}

/// What a path names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Route {
    /// `/version`.
    Version,
    /// `/api`: the core group's versions.
    CoreVersions,
    /// `/apis`: the groups.
    Groups,
    /// `/apis/{group}`: one group.
    Group(String),
    /// `/api/v1` or `/apis/{group}/{version}`: the resources of a group version.
    Resources {
        /// Group (empty for the core group).
        group: String,
        /// Version.
        version: String,
    },
    /// A collection, in one namespace or in all.
    Collection {
        /// The resource.
        resource: Resource,
        /// The namespace, when the path names one.
        namespace: Option<String>,
    },
    /// One object.
    Object {
        /// The resource.
        resource: Resource,
        /// The namespace, when the path names one.
        namespace: Option<String>,
        /// Its name.
        name: String,
    },
    /// `/openapi/…`: the schema kubectl asks for before it writes (not served: the
    /// view is read-only).
    OpenApi,
    /// A subresource (`status`, `log`, `exec`, …): not served.
    Subresource {
        /// The subresource's name.
        name: String,
    },
}

/// Why a path names nothing served.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PathError {
    /// Nothing at that path.
    NotFound,
}

/// The scope and route of `path`.
pub fn route(path: &str) -> Result<(Scope, Route), PathError> {
    // Each segment as the client meant it (`%2A` is `*`, as client-go escapes it).
    let decoded: Vec<std::borrow::Cow<'_, str>> = path
        .trim_start_matches('/')
        .split('/')
        .filter(|p| !p.is_empty())
        .map(|p| {
            percent_encoding::percent_decode_str(p)
                .decode_utf8()
                .map_err(|_| PathError::NotFound)
        })
        .collect::<Result<_, _>>()?;
    let parts: Vec<&str> = decoded.iter().map(AsRef::as_ref).collect();
    let (scope, rest) = match parts.as_slice() {
        ["clusters", "*", rest @ ..] => (Scope::Fleet, rest),
        ["clusters", cluster, rest @ ..] => (Scope::Cluster((*cluster).to_string()), rest),
        rest => (Scope::Fleet, rest),
    };
    Ok((scope, route_in(rest)?))
}

/// The route of a path's parts after its scope.
fn route_in(parts: &[&str]) -> Result<Route, PathError> {
    let (group, version, rest) = match parts {
        ["version"] => return Ok(Route::Version),
        ["api"] => return Ok(Route::CoreVersions),
        ["apis"] => return Ok(Route::Groups),
        ["apis", group] => return Ok(Route::Group((*group).to_string())),
        ["openapi", ..] => return Ok(Route::OpenApi),
        ["api", version, rest @ ..] => ("", *version, rest),
        ["apis", group, version, rest @ ..] => (*group, *version, rest),
        _ => return Err(PathError::NotFound),
    };
    let resource = |plural: &str| Resource {
        group: group.to_string(),
        version: version.to_string(),
        plural: plural.to_string(),
    };
    Ok(match rest {
        [] => Route::Resources {
            group: group.to_string(),
            version: version.to_string(),
        },
        ["namespaces", ns, plural] => Route::Collection {
            resource: resource(plural),
            namespace: Some((*ns).to_string()),
        },
        ["namespaces", ns, plural, name] => Route::Object {
            resource: resource(plural),
            namespace: Some((*ns).to_string()),
            name: (*name).to_string(),
        },
        ["namespaces", _, _, _, sub, ..] => Route::Subresource {
            name: (*sub).to_string(),
        },
        [plural] => Route::Collection {
            resource: resource(plural),
            namespace: None,
        },
        [plural, name] => Route::Object {
            resource: resource(plural),
            namespace: None,
            name: (*name).to_string(),
        },
        [_, _, sub, ..] => Route::Subresource {
            name: (*sub).to_string(),
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pods(namespace: Option<&str>) -> Route {
        Route::Collection {
            resource: Resource {
                group: String::new(),
                version: "v1".into(),
                plural: "pods".into(),
            },
            namespace: namespace.map(str::to_string),
        }
    }

    #[test]
    fn paths_name_a_scope_and_what_is_read_there() {
        let fleet = Scope::Fleet;
        let one = Scope::Cluster("prod-1".into());
        assert_eq!(route("/api/v1/pods"), Ok((fleet.clone(), pods(None))));
        assert_eq!(
            route("/clusters/*/api/v1/pods"),
            Ok((fleet.clone(), pods(None)))
        );
        assert_eq!(
            route("/clusters/%2A/api/v1/pods"),
            Ok((fleet.clone(), pods(None)))
        );
        assert_eq!(
            route("/clusters/prod-1/api/v1/namespaces/team-0/pods"),
            Ok((one.clone(), pods(Some("team-0"))))
        );
        assert_eq!(
            route("/clusters/prod-1/apis/apps/v1/namespaces/a/deployments/web"),
            Ok((
                one.clone(),
                Route::Object {
                    resource: Resource {
                        group: "apps".into(),
                        version: "v1".into(),
                        plural: "deployments".into()
                    },
                    namespace: Some("a".into()),
                    name: "web".into()
                }
            ))
        );
        assert_eq!(
            route("/clusters/prod-1/version"),
            Ok((one.clone(), Route::Version))
        );
        assert_eq!(route("/apis"), Ok((fleet.clone(), Route::Groups)));
        assert_eq!(
            route("/apis/apps"),
            Ok((fleet.clone(), Route::Group("apps".into())))
        );
        assert_eq!(
            route("/apis/apps/v1"),
            Ok((
                fleet.clone(),
                Route::Resources {
                    group: "apps".into(),
                    version: "v1".into()
                }
            ))
        );
        assert_eq!(route("/api"), Ok((fleet.clone(), Route::CoreVersions)));
        assert_eq!(
            route("/api/v1/namespaces/a/pods/p/log"),
            Ok((fleet.clone(), Route::Subresource { name: "log".into() }))
        );
        assert_eq!(
            route("/api/v1/nodes/n/status"),
            Ok((
                fleet,
                Route::Subresource {
                    name: "status".into()
                }
            ))
        );
        assert_eq!(route("/healthz/x/y/z/w"), Err(PathError::NotFound));
        assert_eq!(route("/clusters/a"), Err(PathError::NotFound));
        assert_eq!(route("/"), Err(PathError::NotFound));
    }
}
