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

    /// The client side of the protobuf tests: prost messages written from the published
    /// field numbers of `k8s.io/api` authentication/v1 and authorization/v1 (independent of
    /// the server's converter), filled as Go's generated marshalling writes them: every value
    /// field, empty ones too.
    mod wire {
        use std::collections::BTreeMap;

        use prost::Message;

        #[derive(Clone, PartialEq, Message)]
        pub struct ObjectMeta {
            #[prost(string, optional, tag = "1")]
            pub name: Option<String>,
        }

        #[derive(Clone, PartialEq, Message)]
        pub struct ExtraValue {
            #[prost(string, repeated, tag = "1")]
            pub items: Vec<String>,
        }

        #[derive(Clone, PartialEq, Message)]
        pub struct TokenReview {
            #[prost(message, optional, tag = "1")]
            pub metadata: Option<ObjectMeta>,
            #[prost(message, optional, tag = "2")]
            pub spec: Option<TokenReviewSpec>,
            #[prost(message, optional, tag = "3")]
            pub status: Option<TokenReviewStatus>,
        }

        #[derive(Clone, PartialEq, Message)]
        pub struct TokenReviewSpec {
            #[prost(string, optional, tag = "1")]
            pub token: Option<String>,
            #[prost(string, repeated, tag = "2")]
            pub audiences: Vec<String>,
        }

        #[derive(Clone, PartialEq, Message)]
        pub struct TokenReviewStatus {
            #[prost(bool, optional, tag = "1")]
            pub authenticated: Option<bool>,
            #[prost(message, optional, tag = "2")]
            pub user: Option<UserInfo>,
            #[prost(string, optional, tag = "3")]
            pub error: Option<String>,
            #[prost(string, repeated, tag = "4")]
            pub audiences: Vec<String>,
        }

        #[derive(Clone, PartialEq, Message)]
        pub struct UserInfo {
            #[prost(string, optional, tag = "1")]
            pub username: Option<String>,
            #[prost(string, optional, tag = "2")]
            pub uid: Option<String>,
            #[prost(string, repeated, tag = "3")]
            pub groups: Vec<String>,
            #[prost(btree_map = "string, message", tag = "4")]
            pub extra: BTreeMap<String, ExtraValue>,
        }

        #[derive(Clone, PartialEq, Message)]
        pub struct SubjectAccessReview {
            #[prost(message, optional, tag = "1")]
            pub metadata: Option<ObjectMeta>,
            #[prost(message, optional, tag = "2")]
            pub spec: Option<SubjectAccessReviewSpec>,
            #[prost(message, optional, tag = "3")]
            pub status: Option<SubjectAccessReviewStatus>,
        }

        #[derive(Clone, PartialEq, Message)]
        pub struct SubjectAccessReviewSpec {
            #[prost(message, optional, tag = "1")]
            pub resource_attributes: Option<ResourceAttributes>,
            #[prost(message, optional, tag = "2")]
            pub non_resource_attributes: Option<NonResourceAttributes>,
            #[prost(string, optional, tag = "3")]
            pub user: Option<String>,
            #[prost(string, repeated, tag = "4")]
            pub groups: Vec<String>,
            #[prost(btree_map = "string, message", tag = "5")]
            pub extra: BTreeMap<String, ExtraValue>,
            #[prost(string, optional, tag = "6")]
            pub uid: Option<String>,
        }

        #[derive(Clone, PartialEq, Message)]
        pub struct ResourceAttributes {
            #[prost(string, optional, tag = "1")]
            pub namespace: Option<String>,
            #[prost(string, optional, tag = "2")]
            pub verb: Option<String>,
            #[prost(string, optional, tag = "3")]
            pub group: Option<String>,
            #[prost(string, optional, tag = "4")]
            pub version: Option<String>,
            #[prost(string, optional, tag = "5")]
            pub resource: Option<String>,
            #[prost(string, optional, tag = "6")]
            pub subresource: Option<String>,
            #[prost(string, optional, tag = "7")]
            pub name: Option<String>,
        }

        #[derive(Clone, PartialEq, Message)]
        pub struct NonResourceAttributes {
            #[prost(string, optional, tag = "1")]
            pub path: Option<String>,
            #[prost(string, optional, tag = "2")]
            pub verb: Option<String>,
        }

        #[derive(Clone, PartialEq, Message)]
        pub struct SubjectAccessReviewStatus {
            #[prost(bool, optional, tag = "1")]
            pub allowed: Option<bool>,
            #[prost(string, optional, tag = "2")]
            pub reason: Option<String>,
            #[prost(string, optional, tag = "3")]
            pub evaluation_error: Option<String>,
            #[prost(bool, optional, tag = "4")]
            pub denied: Option<bool>,
        }
    }

    mod over_protobuf {
        use std::collections::BTreeMap;

        use http_body_util::BodyExt;
        use prost::Message;

        use super::super::*;
        use super::wire;
        use crate::apiserver::protobuf::{self, MEDIA_TYPE};
        use crate::apiserver::{ApiServer, Verb};

        /// What client-go's typed clients send: protobuf first, JSON as the fallback.
        const CLIENT_GO_ACCEPT: &str = "application/vnd.kubernetes.protobuf, application/json";
        const TOKEN_REVIEWS: &str = "/apis/authentication.k8s.io/v1/tokenreviews";
        const ACCESS_REVIEWS: &str = "/apis/authorization.k8s.io/v1/subjectaccessreviews";

        /// `(status code, content type, body)` of a POST.
        async fn post(
            server: &ApiServer,
            uri: &str,
            content_type: &str,
            accept: &str,
            body: Vec<u8>,
        ) -> (u16, String, Vec<u8>) {
            let req = http::Request::post(uri)
                .header("content-type", content_type)
                .header("accept", accept)
                .body(body.into())
                .unwrap();
            let resp = server.client().send(req).await.unwrap();
            let code = resp.status().as_u16();
            let ct = resp
                .headers()
                .get("content-type")
                .and_then(|v| v.to_str().ok())
                .unwrap_or("")
                .to_owned();
            let bytes = resp.into_body().collect().await.unwrap().to_bytes();
            (code, ct, bytes.to_vec())
        }

        fn empty_meta() -> Option<wire::ObjectMeta> {
            Some(wire::ObjectMeta::default())
        }

        /// A TokenReview as client-go marshals it: an empty status and user included.
        fn token_review(token: &str, audiences: &[&str]) -> Vec<u8> {
            let review = wire::TokenReview {
                metadata: empty_meta(),
                spec: Some(wire::TokenReviewSpec {
                    token: Some(token.to_owned()),
                    audiences: audiences.iter().map(|a| (*a).to_owned()).collect(),
                }),
                status: Some(wire::TokenReviewStatus {
                    authenticated: Some(false),
                    user: Some(wire::UserInfo {
                        username: Some(String::new()),
                        uid: Some(String::new()),
                        ..wire::UserInfo::default()
                    }),
                    error: Some(String::new()),
                    audiences: Vec::new(),
                }),
            };
            protobuf::wrap_envelope(
                "authentication.k8s.io/v1",
                "TokenReview",
                review.encode_to_vec(),
            )
        }

        /// A SubjectAccessReview as client-go marshals it: every string of the attributes,
        /// an empty status.
        fn access_review(
            user: &str,
            groups: &[&str],
            namespace: &str,
        ) -> wire::SubjectAccessReview {
            wire::SubjectAccessReview {
                metadata: empty_meta(),
                spec: Some(wire::SubjectAccessReviewSpec {
                    resource_attributes: Some(wire::ResourceAttributes {
                        namespace: Some(namespace.to_owned()),
                        verb: Some("get".to_owned()),
                        group: Some("snapshot.storage.k8s.io".to_owned()),
                        version: Some("v1".to_owned()),
                        resource: Some("volumesnapshots".to_owned()),
                        subresource: Some(String::new()),
                        name: Some(String::new()),
                    }),
                    non_resource_attributes: None,
                    user: Some(user.to_owned()),
                    groups: groups.iter().map(|g| (*g).to_owned()).collect(),
                    extra: BTreeMap::from([(
                        "authentication.kubernetes.io/credential-id".to_owned(),
                        wire::ExtraValue {
                            items: vec!["JTI=1f2e".to_owned()],
                        },
                    )]),
                    uid: Some("0d8c".to_owned()),
                }),
                status: Some(wire::SubjectAccessReviewStatus {
                    allowed: Some(false),
                    reason: Some(String::new()),
                    evaluation_error: Some(String::new()),
                    denied: Some(false),
                }),
            }
        }

        fn envelope_sar(review: &wire::SubjectAccessReview) -> Vec<u8> {
            protobuf::wrap_envelope(
                "authorization.k8s.io/v1",
                "SubjectAccessReview",
                review.encode_to_vec(),
            )
        }

        /// The answer's message bytes, checking it is a protobuf `apiVersion`/`kind`.
        fn answer_of(
            (code, ct, body): (u16, String, Vec<u8>),
            api_version: &str,
            kind: &str,
        ) -> Vec<u8> {
            assert_eq!(
                (code, ct.as_str()),
                (201, MEDIA_TYPE),
                "{}",
                String::from_utf8_lossy(&body)
            );
            let (av, k, raw) = protobuf::unwrap_envelope(&body).unwrap();
            assert_eq!((av.as_str(), k.as_str()), (api_version, kind));
            raw
        }

        async fn token_answer(
            server: &ApiServer,
            token: &str,
            audiences: &[&str],
        ) -> wire::TokenReview {
            let sent = post(
                server,
                TOKEN_REVIEWS,
                MEDIA_TYPE,
                CLIENT_GO_ACCEPT,
                token_review(token, audiences),
            )
            .await;
            let raw = answer_of(sent, "authentication.k8s.io/v1", "TokenReview");
            wire::TokenReview::decode(&raw[..]).unwrap()
        }

        async fn access_answer(
            server: &ApiServer,
            review: &wire::SubjectAccessReview,
        ) -> wire::SubjectAccessReview {
            let sent = post(
                server,
                ACCESS_REVIEWS,
                MEDIA_TYPE,
                CLIENT_GO_ACCEPT,
                envelope_sar(review),
            )
            .await;
            let raw = answer_of(sent, "authorization.k8s.io/v1", "SubjectAccessReview");
            wire::SubjectAccessReview::decode(&raw[..]).unwrap()
        }

        /// A protobuf Status error: `(code, reason, message)`.
        fn status_of((code, ct, body): (u16, String, Vec<u8>)) -> (u16, String, String) {
            assert_eq!(ct, MEDIA_TYPE, "{}", String::from_utf8_lossy(&body));
            let status = protobuf::decode_object(&body).unwrap();
            assert_eq!(status["kind"], "Status");
            assert_eq!(status["code"], code);
            (
                code,
                status["reason"].as_str().unwrap_or("").to_owned(),
                status["message"].as_str().unwrap_or("").to_owned(),
            )
        }

        #[tokio::test]
        async fn a_protobuf_token_review_is_answered_in_protobuf() {
            let server = ApiServer::start().await.unwrap();
            server.reviews().add_token(
                "sa-token",
                TokenIdentity::service_account("backup", "client")
                    .uid("0d8c")
                    .audience("test-backup-client"),
            );

            let review = token_answer(&server, "sa-token", &["test-backup-client", "other"]).await;
            assert_eq!(
                review.spec.unwrap(),
                wire::TokenReviewSpec {
                    token: Some("sa-token".to_owned()),
                    audiences: vec!["test-backup-client".to_owned(), "other".to_owned()],
                }
            );
            let status = review.status.unwrap();
            assert_eq!(status.authenticated, Some(true));
            assert_eq!(status.audiences, ["test-backup-client"]);
            assert_eq!(status.error.as_deref().unwrap_or(""), "");
            let user = status.user.unwrap();
            assert_eq!(
                (user.username.as_deref(), user.uid.as_deref()),
                (Some("system:serviceaccount:backup:client"), Some("0d8c"))
            );
            assert_eq!(
                user.groups,
                [
                    "system:serviceaccounts",
                    "system:serviceaccounts:backup",
                    AUTHENTICATED_GROUP
                ]
            );
            assert!(user.extra.is_empty());

            // Refused: not authenticated, with the error; the same for an unknown token.
            let wrong = token_answer(&server, "sa-token", &["someone-else"]).await;
            let status = wrong.status.unwrap();
            assert_ne!(status.authenticated, Some(true));
            assert_eq!(
                status.error.as_deref(),
                Some(
                    r#"token audiences ["test-backup-client"] is invalid for the target audiences ["someone-else"]"#
                )
            );
            assert_eq!(status.user, Some(wire::UserInfo::default()));
            let unknown = token_answer(&server, "nope", &[]).await.status.unwrap();
            assert_eq!(
                (
                    unknown.authenticated.unwrap_or(false),
                    unknown.error.as_deref()
                ),
                (false, Some("invalid bearer token"))
            );

            // A protobuf request read by a JSON-only client gets JSON, and the other way round.
            let (code, ct, body) = post(
                &server,
                TOKEN_REVIEWS,
                MEDIA_TYPE,
                "application/json",
                token_review("sa-token", &["test-backup-client"]),
            )
            .await;
            assert_eq!((code, ct.as_str()), (201, "application/json"));
            let answer: Value = serde_json::from_slice(&body).unwrap();
            assert_eq!(answer["status"]["authenticated"], true);
            assert_eq!(answer["spec"]["token"], "sa-token");
            let json_body = json!({
                "apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
                "spec": {"token": "sa-token", "audiences": ["test-backup-client"]}
            });
            let sent = post(
                &server,
                TOKEN_REVIEWS,
                "application/json",
                MEDIA_TYPE,
                serde_json::to_vec(&json_body).unwrap(),
            )
            .await;
            let raw = answer_of(sent, "authentication.k8s.io/v1", "TokenReview");
            let review = wire::TokenReview::decode(&raw[..]).unwrap();
            assert_eq!(review.status.unwrap().authenticated, Some(true));

            // Errors are protobuf Status objects: no token is 400.
            let failed = post(
                &server,
                TOKEN_REVIEWS,
                MEDIA_TYPE,
                CLIENT_GO_ACCEPT,
                token_review("", &[]),
            )
            .await;
            assert_eq!(
                status_of(failed),
                (
                    400,
                    "BadRequest".to_owned(),
                    "token is required for TokenReview in authentication".to_owned()
                )
            );
            // The envelope must carry the endpoint's type.
            let sar = envelope_sar(&access_review("u", &[], "ns"));
            let (code, reason, message) =
                status_of(post(&server, TOKEN_REVIEWS, MEDIA_TYPE, CLIENT_GO_ACCEPT, sar).await);
            assert_eq!((code, reason.as_str()), (400, "BadRequest"));
            assert!(
                message.contains("does not match the expected API version"),
                "{message}"
            );
            let garbage = b"k8s\0\x0a\xff".to_vec();
            let (code, ..) = status_of(
                post(
                    &server,
                    TOKEN_REVIEWS,
                    MEDIA_TYPE,
                    CLIENT_GO_ACCEPT,
                    garbage,
                )
                .await,
            );
            assert_eq!(code, 400);
            assert_eq!(server.counters().get(Verb::Create, "tokenreviews"), 8);
            server.shutdown().await;
        }

        #[tokio::test]
        async fn a_protobuf_subject_access_review_is_answered_in_protobuf() {
            let server = ApiServer::start().await.unwrap();
            server.reviews().allow(
                Subject::group("system:serviceaccounts:backup"),
                Access::new(
                    "get",
                    "snapshot.storage.k8s.io",
                    "volumesnapshots",
                    "backup",
                ),
            );
            let user = "system:serviceaccount:backup:client";
            let groups = ["system:serviceaccounts:backup", AUTHENTICATED_GROUP];

            let sent = access_review(user, &groups, "backup");
            let allowed = access_answer(&server, &sent).await;
            let status = allowed.status.unwrap();
            assert_eq!(status.allowed, Some(true));
            assert_ne!(status.denied, Some(true));
            assert!(
                status
                    .reason
                    .as_deref()
                    .is_some_and(|r| r.starts_with("RBAC: allowed by testkit rule get")),
                "{status:?}"
            );
            // The spec comes back as sent, extra included; Go's empty strings are left out.
            let mut spec = sent.spec.clone().unwrap();
            let attributes = spec.resource_attributes.as_mut().unwrap();
            (attributes.subresource, attributes.name) = (None, None);
            assert_eq!(allowed.spec.unwrap(), spec);

            // Not allowed: `allowed` is written, false, as Go's JSON writes it.
            let other = access_answer(&server, &access_review(user, &groups, "other")).await;
            let status = other.status.unwrap();
            assert_eq!(
                (status.allowed, status.denied, status.reason),
                (Some(false), None, None)
            );
            let mut non_resource = access_review(user, &groups, "backup");
            let spec = non_resource.spec.as_mut().unwrap();
            spec.resource_attributes = None;
            spec.non_resource_attributes = Some(wire::NonResourceAttributes {
                path: Some("/healthz".to_owned()),
                verb: Some("get".to_owned()),
            });
            let answer = access_answer(&server, &non_resource).await;
            assert_eq!(answer.status.unwrap().allowed, Some(false));
            assert_eq!(
                answer
                    .spec
                    .unwrap()
                    .non_resource_attributes
                    .unwrap()
                    .path
                    .as_deref(),
                Some("/healthz")
            );

            // A malformed review is 422 in protobuf.
            let mut nobody = access_review("", &[], "backup");
            nobody.spec.as_mut().unwrap().resource_attributes = None;
            let (code, reason, message) = status_of(
                post(
                    &server,
                    ACCESS_REVIEWS,
                    MEDIA_TYPE,
                    CLIENT_GO_ACCEPT,
                    envelope_sar(&nobody),
                )
                .await,
            );
            assert_eq!((code, reason.as_str()), (422, "Invalid"));
            assert!(
                message.contains("at least one of user or group must be specified"),
                "{message}"
            );
            // A TokenReview sent to the access reviews is refused.
            let (code, ..) = status_of(
                post(
                    &server,
                    ACCESS_REVIEWS,
                    MEDIA_TYPE,
                    CLIENT_GO_ACCEPT,
                    token_review("t", &[]),
                )
                .await,
            );
            assert_eq!(code, 400);
            // The kind is checked as well as the version.
            let wrong_kind = protobuf::wrap_envelope(
                "authorization.k8s.io/v1",
                "SelfSubjectAccessReview",
                sent.encode_to_vec(),
            );
            let (code, _, message) = status_of(
                post(
                    &server,
                    ACCESS_REVIEWS,
                    MEDIA_TYPE,
                    CLIENT_GO_ACCEPT,
                    wrong_kind,
                )
                .await,
            );
            assert_eq!(code, 400);
            assert!(
                message.contains("cannot be handled as a SubjectAccessReview"),
                "{message}"
            );
            assert_eq!(
                server.counters().get(Verb::Create, "subjectaccessreviews"),
                6
            );
            server.shutdown().await;
        }
    }
}
