use std::time::Duration;

use super::*;

fn tokens() -> BTreeMap<String, TokenIdentity> {
    BTreeMap::from([
        (
            "alice-token".to_owned(),
            TokenIdentity::new("alice")
                .uid("u-1")
                .group("backup-admins")
                .audience("backup")
                .audience("other"),
        ),
        ("plain".to_owned(), TokenIdentity::new("bob")),
        (
            "old".to_owned(),
            TokenIdentity::new("carol").expires(SystemTime::UNIX_EPOCH + Duration::from_secs(10)),
        ),
    ])
}

fn token_status(token: &str, audiences: Value) -> Value {
    let review = json!({
        "apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
        "spec": {"token": token, "audiences": audiences}
    });
    let now = SystemTime::UNIX_EPOCH + Duration::from_secs(100);
    token_review(&tokens(), &review, now).unwrap()["status"].clone()
}

#[test]
fn known_tokens_authenticate_for_their_audiences() {
    let status = token_status("alice-token", json!(["backup", "elsewhere"]));
    assert_eq!(
        status,
        json!({
            "authenticated": true,
            "user": {"username": "alice", "uid": "u-1",
                     "groups": ["backup-admins", "system:authenticated"]},
            "audiences": ["backup"]
        })
    );
    // The intersection, in the token's order.
    let status = token_status("alice-token", json!(["other", "backup"]));
    assert_eq!(status["audiences"], json!(["backup", "other"]));
}

#[test]
fn a_token_for_other_audiences_is_not_authenticated() {
    let status = token_status("alice-token", json!(["elsewhere"]));
    assert_eq!(status.get("authenticated"), None, "Go omits false");
    assert_eq!(
        status["error"],
        r#"token audiences ["backup" "other"] is invalid for the target audiences ["elsewhere"]"#
    );
    assert_eq!(status["user"], json!({}));
    // Without audiences in the spec, the API server's own are asked for.
    assert!(token_status("alice-token", Value::Null)["error"].is_string());
    let status = token_status("plain", Value::Null);
    assert_eq!(status["authenticated"], true);
    assert_eq!(status["audiences"], json!([API_AUDIENCE]));
    assert!(token_status("plain", json!(["backup"]))["error"].is_string());
}

#[test]
fn unknown_expired_and_missing_tokens() {
    assert_eq!(
        token_status("nope", json!(["backup"]))["error"],
        "invalid bearer token"
    );
    let expired = token_status("old", Value::Null);
    assert_eq!(
        (expired.get("authenticated"), expired["error"].as_str()),
        (None, Some("service account token has expired"))
    );
    let missing = token_review(&tokens(), &json!({"spec": {}}), SystemTime::now()).unwrap_err();
    assert_eq!(
        (missing.code, missing.message.as_str()),
        (400, "token is required for TokenReview in authentication")
    );
}

#[test]
fn service_account_identities_read_like_upstream() {
    let sa = TokenIdentity::service_account("backup", "client");
    assert_eq!(sa.username, "system:serviceaccount:backup:client");
    assert_eq!(
        sa.groups,
        ["system:serviceaccounts", "system:serviceaccounts:backup"]
    );
}

fn rules() -> Vec<(Subject, Access)> {
    vec![
        (
            Subject::user("alice"),
            Access::new("get", "snapshot.storage.k8s.io", "volumesnapshots", "ns1"),
        ),
        (Subject::group("admins"), Access::new("*", "*", "*", "")),
        (Subject::user("bob"), Access::new("get", "", "pods/log", "")),
    ]
}

fn access(user: &str, groups: &[&str], attributes: Value) -> Value {
    let review = json!({
        "apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
        "spec": {"user": user, "groups": groups, "uid": "u-1", "resourceAttributes": attributes}
    });
    subject_access_review(&rules(), &review).unwrap()
}

fn snapshots_in(namespace: &str) -> Value {
    json!({"verb": "get", "group": "snapshot.storage.k8s.io", "version": "v1",
           "resource": "volumesnapshots", "namespace": namespace})
}

#[test]
fn rules_of_the_user_or_a_group_allow() {
    let allowed = access("alice", &[], snapshots_in("ns1"));
    assert_eq!(allowed["status"]["allowed"], true);
    assert!(
        allowed["status"]["reason"]
            .as_str()
            .unwrap()
            .contains("alice")
    );
    assert_eq!(allowed["status"].get("denied"), None);
    // The spec comes back as sent.
    assert_eq!(allowed["spec"]["uid"], "u-1");
    assert_eq!(allowed["kind"], "SubjectAccessReview");

    // Another namespace, verb or resource: not allowed, no reason, never denied.
    for attributes in [
        snapshots_in("ns2"),
        json!({"verb": "list", "group": "snapshot.storage.k8s.io", "resource": "volumesnapshots", "namespace": "ns1"}),
        json!({"verb": "get", "group": "snapshot.storage.k8s.io", "resource": "volumesnapshotcontents", "namespace": "ns1"}),
    ] {
        let status = &access("alice", &["others"], attributes)["status"];
        assert_eq!(status, &json!({"allowed": false}));
    }
    // A group's cluster-wide wildcard rule.
    let status = &access("carol", &["admins"], snapshots_in("any"))["status"];
    assert_eq!(status["allowed"], true);
    // Subresources are granted by name.
    let log = json!({"verb": "get", "resource": "pods", "subresource": "log", "namespace": "x"});
    assert_eq!(access("bob", &[], log)["status"]["allowed"], true);
    assert_eq!(
        access(
            "bob",
            &[],
            json!({"verb": "get", "resource": "pods", "namespace": "x"})
        )["status"]["allowed"],
        false
    );
}

#[test]
fn malformed_reviews_are_invalid_as_upstream() {
    let err = subject_access_review(&rules(), &json!({"spec": {}})).unwrap_err();
    assert_eq!(err.code, 422);
    assert_eq!(
        err.message,
        r#"SubjectAccessReview.authorization.k8s.io "" is invalid: [spec.resourceAttributes: Invalid value: "null": exactly one of nonResourceAttributes or resourceAttributes must be specified, spec.user: Invalid value: "": at least one of user or group must be specified]"#
    );
    let both = json!({"spec": {"user": "a", "resourceAttributes": {}, "nonResourceAttributes": {"path": "/x", "verb": "get"}}});
    assert_eq!(
        subject_access_review(&rules(), &both).unwrap_err().code,
        422
    );
    // A non-resource request is never allowed here.
    let non_resource = json!({"spec": {"groups": ["admins"], "nonResourceAttributes": {"path": "/x", "verb": "get"}}});
    let answer = subject_access_review(&rules(), &non_resource).unwrap();
    assert_eq!(answer["status"]["allowed"], false);
}

#[test]
fn the_handle_edits_the_table() {
    let reviews = Reviews::default();
    reviews.add_token("t", TokenIdentity::new("alice"));
    reviews.allow(Subject::user("alice"), Access::new("get", "", "pods", ""));
    reviews.allow(Subject::user("bob"), Access::new("get", "", "pods", ""));
    reviews.revoke(&Subject::user("alice"));
    let table = reviews.table();
    assert_eq!(table.rules.len(), 1);
    assert!(table.tokens.contains_key("t"));
    reviews.remove_token("t");
    assert!(reviews.table().tokens.is_empty());
    reviews.clear();
    assert_eq!(reviews.table(), ReviewTable::default());
}

/// Through real HTTP on 127.0.0.1, with kube's typed clients as a Rust sidecar uses them.
mod served {
    use http_body_util::BodyExt;
    use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
    use k8s_openapi::api::authorization::v1::{
        ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
    };
    use kube::Api;
    use kube::api::PostParams;

    use super::*;
    use crate::apiserver::{ApiServer, RequestMatch, Verb};

    fn token_review_of(token: &str, audience: &str) -> TokenReview {
        TokenReview {
            spec: TokenReviewSpec {
                token: token.to_owned(),
                audiences: Some(vec![audience.to_owned()]),
            },
            ..TokenReview::default()
        }
    }

    fn access_review_of(user: &str, namespace: &str) -> SubjectAccessReview {
        SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: Some(user.to_owned()),
                groups: Some(vec!["system:authenticated".to_owned()]),
                resource_attributes: Some(ResourceAttributes {
                    verb: Some("get".to_owned()),
                    group: Some("snapshot.storage.k8s.io".to_owned()),
                    version: Some("v1".to_owned()),
                    resource: Some("volumesnapshots".to_owned()),
                    namespace: Some(namespace.to_owned()),
                    ..ResourceAttributes::default()
                }),
                ..SubjectAccessReviewSpec::default()
            },
            ..SubjectAccessReview::default()
        }
    }

    #[tokio::test]
    async fn reviews_over_http() {
        let server = ApiServer::start().await.unwrap();
        let reviews = server.reviews();
        reviews.add_token(
            "sa-token",
            TokenIdentity::service_account("backup", "client")
                .uid("0d8c")
                .audience("test-backup-client"),
        );
        reviews.allow(
            Subject::group("system:serviceaccounts:backup"),
            Access::new(
                "get",
                "snapshot.storage.k8s.io",
                "volumesnapshots",
                "backup",
            ),
        );
        let client = server.client();
        let pp = PostParams::default();

        let tokens: Api<TokenReview> = Api::all(client.clone());
        let review = tokens
            .create(&pp, &token_review_of("sa-token", "test-backup-client"))
            .await
            .unwrap();
        let status = review.status.unwrap();
        assert_eq!(status.authenticated, Some(true));
        assert_eq!(
            status.audiences.as_deref(),
            Some(&["test-backup-client".to_owned()][..])
        );
        let user = status.user.unwrap();
        assert_eq!(
            (user.username.as_deref(), user.uid.as_deref()),
            (Some("system:serviceaccount:backup:client"), Some("0d8c"))
        );
        let wrong = tokens
            .create(&pp, &token_review_of("sa-token", "someone-else"))
            .await
            .unwrap()
            .status
            .unwrap();
        assert_ne!(wrong.authenticated, Some(true));
        assert!(wrong.error.is_some());

        let access: Api<SubjectAccessReview> = Api::all(client.clone());
        let groups = |namespace: &str| {
            let mut review = access_review_of("system:serviceaccount:backup:client", namespace);
            review.spec.groups = Some(vec!["system:serviceaccounts:backup".to_owned()]);
            review
        };
        let allowed = access.create(&pp, &groups("backup")).await.unwrap();
        assert!(allowed.status.as_ref().unwrap().allowed);
        assert_ne!(allowed.status.unwrap().denied, Some(true));
        let denied = access.create(&pp, &groups("other")).await.unwrap();
        assert!(!denied.status.unwrap().allowed);
        let nobody = access_review_of("nobody", "backup");
        assert!(
            !access
                .create(&pp, &nobody)
                .await
                .unwrap()
                .status
                .unwrap()
                .allowed
        );

        // Counted and faulted like other requests.
        let counters = server.counters();
        assert_eq!(counters.get(Verb::Create, "tokenreviews"), 2);
        assert_eq!(counters.get(Verb::Create, "subjectaccessreviews"), 3);
        server
            .faults()
            .fail_next(RequestMatch::new(Verb::Create, "tokenreviews"), 1, 500);
        let failed = tokens
            .create(&pp, &token_review_of("sa-token", "test-backup-client"))
            .await;
        assert!(matches!(failed, Err(kube::Error::Api(e)) if e.code == 500));

        // Only POST; a malformed review is 422.
        let get = http::Request::get("/apis/authentication.k8s.io/v1/tokenreviews")
            .body(Vec::new())
            .unwrap();
        let response = client.send(get.map(Into::into)).await.unwrap();
        assert_eq!(response.status(), 405);
        let post = http::Request::post("/apis/authorization.k8s.io/v1/subjectaccessreviews")
            .header("content-type", "application/json")
            .body(br#"{"spec": {}}"#.to_vec())
            .unwrap();
        let response = client.send(post.map(Into::into)).await.unwrap();
        assert_eq!(response.status(), 422);
        let body = response.into_body().collect().await.unwrap().to_bytes();
        let status: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(status["reason"], "Invalid");

        // Discovery lists them, create only.
        let list = http::Request::get("/apis/authentication.k8s.io/v1")
            .body(Vec::new())
            .unwrap();
        let response = client.send(list.map(Into::into)).await.unwrap();
        let body = response.into_body().collect().await.unwrap().to_bytes();
        let resources: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(resources["resources"][0]["name"], "tokenreviews");
        assert_eq!(resources["resources"][0]["verbs"], json!(["create"]));
        server.shutdown().await;
    }
}
