//! TestCluster in its in-process mode (the real-cluster mode runs when
//! CSI_SIDECARS_TEST_KUBECONFIG is set, with the same assertions).

use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::Api;
use kube::api::PostParams;
use serde_json::json;
use testkit::apiserver::TestCluster;

#[tokio::test]
async fn each_cluster_gets_its_own_namespace() {
    let a = TestCluster::start().await.unwrap();
    let b = TestCluster::start().await.unwrap();
    assert_ne!(a.namespace(), b.namespace());
    assert!(a.kubeconfig_path().exists());
    let namespaces: Api<Namespace> = Api::all(a.client());
    namespaces.get(a.namespace()).await.unwrap();
    let cms: Api<ConfigMap> = Api::default_namespaced(a.client());
    let cm = cms
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "x"}})).unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(cm.metadata.namespace.as_deref(), Some(a.namespace()));
    assert_eq!(a.faults().is_some(), !a.is_real());
    assert_eq!(a.counters().is_some(), !a.is_real());
    a.cleanup().await.unwrap();
    b.cleanup().await.unwrap();
}
