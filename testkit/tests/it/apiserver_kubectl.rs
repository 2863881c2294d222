//! kubectl against the in-process server: get, apply (create and update),
//! patch (merge and json), delete, and `get -w` seeing a change.
//!
//! What kubectl says about a write differs between its versions (v1.34 names
//! the namespace of a deleted object, older ones do not): the tests read the
//! outcome back through the API instead.

use std::process::{Command, Output, Stdio};

use crate::apiserver_support::{TIMEOUT, eventually};
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::api::storage::v1::StorageClass;
use kube::Api;
use testkit::apiserver::{ApiServer, Verb};
use testkit::process::CleanEnv;
use tokio::io::{AsyncBufReadExt, BufReader};

fn kubectl_present() -> bool {
    let found = Command::new("kubectl")
        .clean_env()
        .arg("version")
        .arg("--client")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok();
    if !found {
        println!("skipped: kubectl is not installed");
    }
    found
}

fn kubectl(server: &ApiServer, args: &[&str], stdin: Option<&str>) -> Output {
    use std::io::Write;
    let mut child = Command::new("kubectl")
        .clean_env()
        .env("KUBECONFIG", server.kubeconfig_path())
        .env("HOME", server.kubeconfig_path().parent().unwrap())
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut input = child.stdin.take().unwrap();
    if let Some(s) = stdin {
        input.write_all(s.as_bytes()).unwrap();
    }
    drop(input);
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "kubectl {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

const MANIFEST: &str = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: cfg\n  labels:\n    app: web\ndata:\n  key: one\n---\napiVersion: storage.k8s.io/v1\nkind: StorageClass\nmetadata:\n  name: fast\nprovisioner: csi.example.com\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_apply_get_patch_delete() {
    if !kubectl_present() {
        return;
    }
    let server = ApiServer::start().await.unwrap();
    let s = &server;
    tokio::task::block_in_place(|| kubectl(s, &["apply", "-f", "-"], Some(MANIFEST)));
    let cms: Api<ConfigMap> = Api::namespaced(server.client(), "default");
    let classes: Api<StorageClass> = Api::all(server.client());
    let created = cms.get("cfg").await.unwrap();
    assert_eq!(created.data.unwrap()["key"], "one");
    assert_eq!(created.metadata.labels.unwrap()["app"], "web");
    let class = classes.get("fast").await.unwrap();
    assert_eq!(class.provisioner, "csi.example.com");

    tokio::task::block_in_place(|| {
        kubectl(
            s,
            &["apply", "-f", "-"],
            Some(&MANIFEST.replace("key: one", "key: two")),
        )
    });
    assert_eq!(cms.get("cfg").await.unwrap().data.unwrap()["key"], "two");
    // The unchanged StorageClass is left alone: not written, same resourceVersion.
    assert_eq!(server.counters().get(Verb::Patch, "storageclasses"), 0);
    assert_eq!(
        classes.get("fast").await.unwrap().metadata.resource_version,
        class.metadata.resource_version
    );

    let out = tokio::task::block_in_place(|| kubectl(s, &["get", "configmaps"], None));
    let text = stdout(&out);
    assert!(
        text.starts_with("NAME") && text.contains("AGE") && text.contains("cfg"),
        "{text}"
    );
    let out = tokio::task::block_in_place(|| {
        kubectl(
            s,
            &["get", "sc", "fast", "-o", "jsonpath={.provisioner}"],
            None,
        )
    });
    assert_eq!(stdout(&out), "csi.example.com");

    tokio::task::block_in_place(|| {
        kubectl(
            s,
            &[
                "patch",
                "configmap",
                "cfg",
                "--type=merge",
                "-p",
                r#"{"data":{"key":"three"}}"#,
            ],
            None,
        )
    });
    assert_eq!(cms.get("cfg").await.unwrap().data.unwrap()["key"], "three");
    tokio::task::block_in_place(|| {
        kubectl(
            s,
            &[
                "patch",
                "configmap",
                "cfg",
                "--type=json",
                "-p",
                r#"[{"op":"replace","path":"/data/key","value":"four"}]"#,
            ],
            None,
        )
    });
    assert_eq!(cms.get("cfg").await.unwrap().data.unwrap()["key"], "four");
    tokio::task::block_in_place(|| {
        kubectl(
            s,
            &[
                "patch",
                "configmap",
                "cfg",
                "-p",
                r#"{"metadata":{"labels":{"tier":"1"}}}"#,
            ],
            None,
        )
    });
    assert_eq!(
        cms.get("cfg").await.unwrap().metadata.labels.unwrap().len(),
        2
    );

    tokio::task::block_in_place(|| kubectl(s, &["delete", "configmap", "cfg"], None));
    assert!(cms.get_opt("cfg").await.unwrap().is_none());
}

#[tokio::test]
async fn kubectl_get_watch_sees_a_change() {
    if !kubectl_present() {
        return;
    }
    let server = ApiServer::start().await.unwrap();
    let cms: Api<ConfigMap> = Api::namespaced(server.client(), "default");
    cms.create(
        &Default::default(),
        &serde_json::from_value(serde_json::json!({"metadata": {"name": "first"}})).unwrap(),
    )
    .await
    .unwrap();
    let mut child = tokio::process::Command::new("kubectl")
        .clean_env()
        .env("KUBECONFIG", server.kubeconfig_path())
        .env("HOME", server.kubeconfig_path().parent().unwrap())
        .args(["get", "configmaps", "-w", "-o", "name"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let first = tokio::time::timeout(TIMEOUT, lines.next_line())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(first, "configmap/first");
    // kubectl has listed; wait until its watch is open before changing anything.
    eventually(|| async {
        (server
            .counters()
            .get(testkit::apiserver::Verb::Watch, "configmaps")
            > 0)
        .then_some(())
    })
    .await;
    cms.create(
        &Default::default(),
        &serde_json::from_value(serde_json::json!({"metadata": {"name": "second"}})).unwrap(),
    )
    .await
    .unwrap();
    let next = tokio::time::timeout(TIMEOUT, lines.next_line())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(next, "configmap/second");
    child.kill().await.unwrap();
}
