//! TokenReview (`authentication.k8s.io/v1`) and SubjectAccessReview (`authorization.k8s.io/v1`),
//! answered as kube-apiserver answers them from the tokens and access rules a test configures:
//! what a sidecar that authenticates and authorizes its own clients (csi-snapshot-metadata)
//! asks the API server. Nothing is stored; the answers are pure functions of the request and
//! the [`Reviews`] table. The HTTP edge (routing, counting, faults) is in `http.rs`.
//!
//! ```no_run
//! # async fn example() -> Result<(), Box<dyn std::error::Error>> {
//! use testkit::apiserver::ApiServer;
//! use testkit::apiserver::reviews::{Access, Subject, TokenIdentity};
//!
//! let server = ApiServer::start().await?;
//! let reviews = server.reviews();
//! reviews.add_token(
//!     "backup-token",
//!     TokenIdentity::service_account("backup", "client").audience("test-backup-client"),
//! );
//! reviews.allow(
//!     Subject::user("system:serviceaccount:backup:client"),
//!     Access::new("get", "snapshot.storage.k8s.io", "volumesnapshots", "backup"),
//! );
//! # Ok(())
//! # }
//! ```

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::SystemTime;

use serde_json::{Value, json};

use super::error::ApiError;
use super::registry::{Kind, NameRule, StatusMetadata};
use super::validation::{self, BadValue, FieldError};

/// The audience a token is for when it names none, and a TokenReview asks for when it names
/// none: kube-apiserver's `--api-audiences`, by default the service account issuer.
pub const API_AUDIENCE: &str = "https://kubernetes.default.svc.cluster.local";

/// The group kube-apiserver adds to every authenticated user.
pub const AUTHENTICATED_GROUP: &str = "system:authenticated";

/// The review resources: `(group, plural, kind)`, served at `v1`, cluster-scoped, create only.
pub const RESOURCES: &[(&str, &str, &str)] = &[
    ("authentication.k8s.io", "tokenreviews", "TokenReview"),
    (
        "authorization.k8s.io",
        "subjectaccessreviews",
        "SubjectAccessReview",
    ),
];

/// Whether `group/v1/plural` is a review resource.
pub fn is_review(group: &str, plural: &str) -> bool {
    RESOURCES
        .iter()
        .any(|(g, p, _)| *g == group && *p == plural)
}

/// Who a bearer token authenticates as.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TokenIdentity {
    pub username: String,
    pub uid: String,
    /// Besides [`AUTHENTICATED_GROUP`], which every answer adds.
    pub groups: Vec<String>,
    /// What the token was issued for (a service account token's `aud`); empty:
    /// [`API_AUDIENCE`].
    pub audiences: Vec<String>,
    /// From when on the token no longer authenticates; `None`: never.
    pub expires: Option<SystemTime>,
}

impl TokenIdentity {
    /// A user of that name.
    pub fn new(username: impl Into<String>) -> Self {
        Self {
            username: username.into(),
            ..Self::default()
        }
    }

    /// The service account `namespace/name`, with the user name and groups kube-apiserver
    /// gives its tokens.
    pub fn service_account(namespace: &str, name: &str) -> Self {
        Self {
            username: format!("system:serviceaccount:{namespace}:{name}"),
            groups: vec![
                "system:serviceaccounts".to_owned(),
                format!("system:serviceaccounts:{namespace}"),
            ],
            ..Self::default()
        }
    }

    pub fn uid(mut self, uid: impl Into<String>) -> Self {
        self.uid = uid.into();
        self
    }

    pub fn group(mut self, group: impl Into<String>) -> Self {
        self.groups.push(group.into());
        self
    }

    pub fn audience(mut self, audience: impl Into<String>) -> Self {
        self.audiences.push(audience.into());
        self
    }

    pub fn expires(mut self, at: SystemTime) -> Self {
        self.expires = Some(at);
        self
    }
}

/// Whom an access rule is for.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Subject {
    User(String),
    Group(String),
}

impl Subject {
    pub fn user(name: impl Into<String>) -> Self {
        Self::User(name.into())
    }

    pub fn group(name: impl Into<String>) -> Self {
        Self::Group(name.into())
    }

    fn describe(&self) -> String {
        match self {
            Self::User(name) => format!("User {name:?}"),
            Self::Group(name) => format!("Group {name:?}"),
        }
    }
}

/// A resource request a subject may make, as an RBAC rule grants it: `*` matches any verb,
/// API group or resource; an empty namespace matches every namespace and cluster-scoped
/// requests (a ClusterRoleBinding), another only requests in that namespace (a RoleBinding).
/// Every object name matches. A subresource is granted as `resource/subresource`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Access {
    pub verb: String,
    /// Empty for the core group.
    pub api_group: String,
    pub resource: String,
    pub namespace: String,
}

impl Access {
    pub fn new(
        verb: impl Into<String>,
        api_group: impl Into<String>,
        resource: impl Into<String>,
        namespace: impl Into<String>,
    ) -> Self {
        Self {
            verb: verb.into(),
            api_group: api_group.into(),
            resource: resource.into(),
            namespace: namespace.into(),
        }
    }

    fn grants(&self, asked: &Asked<'_>) -> bool {
        let any_or = |granted: &str, asked: &str| granted == "*" || granted == asked;
        any_or(&self.verb, asked.verb)
            && any_or(&self.api_group, asked.group)
            && any_or(&self.resource, &asked.resource)
            && (self.namespace.is_empty() || self.namespace == asked.namespace)
    }
}

/// The tokens TokenReview knows and what SubjectAccessReview allows.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReviewTable {
    pub tokens: BTreeMap<String, TokenIdentity>,
    pub rules: Vec<(Subject, Access)>,
}

/// Handle on the server's [`ReviewTable`]; clones share it, and changes apply to the
/// reviews that arrive afterwards. Empty at start: every token is unknown, nothing allowed.
#[derive(Clone, Debug, Default)]
pub struct Reviews {
    table: Arc<Mutex<ReviewTable>>,
}

impl Reviews {
    fn lock(&self) -> MutexGuard<'_, ReviewTable> {
        self.table.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// TokenReview authenticates `token` as `identity` (replacing what it was).
    pub fn add_token(&self, token: impl Into<String>, identity: TokenIdentity) {
        self.lock().tokens.insert(token.into(), identity);
    }

    /// `token` is unknown from now on, as a deleted service account's.
    pub fn remove_token(&self, token: &str) {
        self.lock().tokens.remove(token);
    }

    /// SubjectAccessReview allows `subject` the requests `access` describes.
    pub fn allow(&self, subject: Subject, access: Access) {
        self.lock().rules.push((subject, access));
    }

    /// Takes every rule of `subject` away.
    pub fn revoke(&self, subject: &Subject) {
        self.lock().rules.retain(|(s, _)| s != subject);
    }

    /// No tokens, no rules.
    pub fn clear(&self) {
        *self.lock() = ReviewTable::default();
    }

    /// A copy of the table.
    pub fn table(&self) -> ReviewTable {
        self.lock().clone()
    }

    pub(crate) fn token_review(&self, review: &Value, now: SystemTime) -> Result<Value, ApiError> {
        token_review(&self.lock().tokens, review, now)
    }

    pub(crate) fn subject_access_review(&self, review: &Value) -> Result<Value, ApiError> {
        subject_access_review(&self.lock().rules, review)
    }
}

fn str_at<'a>(v: &'a Value, pointer: &str) -> &'a str {
    v.pointer(pointer).and_then(Value::as_str).unwrap_or("")
}

fn strings_at(v: &Value, pointer: &str) -> Vec<String> {
    v.pointer(pointer)
        .and_then(Value::as_array)
        .map(|items| {
            items
                .iter()
                .filter_map(Value::as_str)
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default()
}

/// Go's `%q` of a `[]string`: `["a" "b"]`.
fn go_quoted_list(items: &[String]) -> String {
    let quoted: Vec<String> = items.iter().map(|s| validation::go_quote(s)).collect();
    format!("[{}]", quoted.join(" "))
}

/// The answer object: the request's kind, metadata and spec, with `status`.
fn answer(review: &Value, api_version: &str, kind: &str, status: Value) -> Value {
    json!({
        "kind": kind,
        "apiVersion": api_version,
        "metadata": review.get("metadata").cloned().unwrap_or_else(|| json!({})),
        "spec": review.get("spec").cloned().unwrap_or_else(|| json!({})),
        "status": status,
    })
}

/// Answers a TokenReview: authenticated if the token is known, not expired and issued for
/// one of the audiences asked for (by default [`API_AUDIENCE`]); `status.audiences` are those
/// of the token's audiences asked for. A token that is not authenticated gets `status.error`
/// and no `authenticated` (Go omits a false one).
pub fn token_review(
    tokens: &BTreeMap<String, TokenIdentity>,
    review: &Value,
    now: SystemTime,
) -> Result<Value, ApiError> {
    let token = str_at(review, "/spec/token");
    if token.is_empty() {
        return Err(ApiError::bad_request(
            "token is required for TokenReview in authentication",
        ));
    }
    let mut asked = strings_at(review, "/spec/audiences");
    if asked.is_empty() {
        asked.push(API_AUDIENCE.to_owned());
    }
    let refused = |error: String| json!({"user": {}, "error": error});
    let status = match tokens.get(token) {
        None => refused("invalid bearer token".to_owned()),
        Some(identity) => {
            let issued_for = if identity.audiences.is_empty() {
                vec![API_AUDIENCE.to_owned()]
            } else {
                identity.audiences.clone()
            };
            // In the token's order, as apiserver's `Audiences.Intersect`.
            let audiences: Vec<&String> = issued_for.iter().filter(|a| asked.contains(a)).collect();
            if audiences.is_empty() {
                refused(format!(
                    "token audiences {} is invalid for the target audiences {}",
                    go_quoted_list(&issued_for),
                    go_quoted_list(&asked)
                ))
            } else if identity.expires.is_some_and(|at| at <= now) {
                refused("service account token has expired".to_owned())
            } else {
                let mut groups = identity.groups.clone();
                if !groups.iter().any(|g| g == AUTHENTICATED_GROUP) {
                    groups.push(AUTHENTICATED_GROUP.to_owned());
                }
                let mut user = json!({"username": identity.username, "groups": groups});
                if !identity.uid.is_empty() {
                    user["uid"] = json!(identity.uid);
                }
                json!({"authenticated": true, "user": user, "audiences": audiences})
            }
        }
    };
    Ok(answer(
        review,
        "authentication.k8s.io/v1",
        "TokenReview",
        status,
    ))
}

/// What a SubjectAccessReview asks about a resource.
struct Asked<'a> {
    verb: &'a str,
    group: &'a str,
    /// `resource` or `resource/subresource`.
    resource: String,
    namespace: &'a str,
}

fn review_kind() -> Kind {
    Kind {
        group: "authorization.k8s.io",
        version: "v1",
        plural: "subjectaccessreviews",
        singular: "subjectaccessreview",
        kind: "SubjectAccessReview",
        namespaced: false,
        status_subresource: false,
        short_names: &[],
        field_selectors: &[],
        tracks_generation: false,
        custom: false,
        name_rule: NameRule::Subdomain,
        unconditional_update: true,
        status_metadata: StatusMetadata::FromRequest,
    }
}

/// Answers a SubjectAccessReview: allowed if a rule of the user, or of one of the groups,
/// grants the resource request; otherwise not allowed, with no reason (RBAC has no opinion).
/// Never `denied`. Non-resource requests are never allowed. `422` as upstream's validation
/// for a review without exactly one of the attribute sets or without user and groups.
pub fn subject_access_review(
    rules: &[(Subject, Access)],
    review: &Value,
) -> Result<Value, ApiError> {
    let present = |pointer: &str| review.pointer(pointer).is_some_and(|v| !v.is_null());
    let (resource, non_resource) = (
        present("/spec/resourceAttributes"),
        present("/spec/nonResourceAttributes"),
    );
    let user = str_at(review, "/spec/user");
    let groups = strings_at(review, "/spec/groups");
    let mut errs = Vec::new();
    if resource && non_resource {
        errs.push(FieldError::invalid(
            "spec.nonResourceAttributes",
            BadValue::Json(
                review
                    .pointer("/spec/nonResourceAttributes")
                    .map(Value::to_string)
                    .unwrap_or_default(),
            ),
            "cannot be specified in combination with resourceAttributes",
        ));
    }
    if !resource && !non_resource {
        // Upstream reports the (nil) nonResourceAttributes there.
        errs.push(FieldError::invalid(
            "spec.resourceAttributes",
            BadValue::Str("null".to_owned()),
            "exactly one of nonResourceAttributes or resourceAttributes must be specified",
        ));
    }
    if user.is_empty() && groups.is_empty() {
        errs.push(FieldError::invalid(
            "spec.user",
            BadValue::Str(user.to_owned()),
            "at least one of user or group must be specified",
        ));
    }
    if !errs.is_empty() {
        return Err(validation::invalid(&review_kind(), "", &errs));
    }
    let grant = resource
        .then(|| {
            let subresource = str_at(review, "/spec/resourceAttributes/subresource");
            let plural = str_at(review, "/spec/resourceAttributes/resource");
            let asked = Asked {
                verb: str_at(review, "/spec/resourceAttributes/verb"),
                group: str_at(review, "/spec/resourceAttributes/group"),
                resource: if subresource.is_empty() {
                    plural.to_owned()
                } else {
                    format!("{plural}/{subresource}")
                },
                namespace: str_at(review, "/spec/resourceAttributes/namespace"),
            };
            rules.iter().find(|(subject, access)| {
                let applies = match subject {
                    Subject::User(name) => name == user,
                    Subject::Group(name) => groups.contains(name),
                };
                applies && access.grants(&asked)
            })
        })
        .flatten();
    let status = match grant {
        Some((subject, access)) => json!({
            "allowed": true,
            "reason": format!(
                "RBAC: allowed by testkit rule {} {}/{} in namespace {:?} to {}",
                access.verb,
                access.api_group,
                access.resource,
                access.namespace,
                subject.describe()
            ),
        }),
        None => json!({"allowed": false}),
    };
    Ok(answer(
        review,
        "authorization.k8s.io/v1",
        "SubjectAccessReview",
        status,
    ))
}

#[cfg(test)]
mod tests;
