use std::collections::HashMap;
use std::path::Path;

use super::*;

fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
    let map: HashMap<String, String> = pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    move |name| map.get(name).cloned()
}

const FILE: &str = "apiVersion: apiserver.config.k8s.io/v1\nkind: TracingConfiguration\nendpoint: collector.monitoring:4317\nsamplingRatePerMillion: 250000\n";

#[test]
fn nothing_asked_means_tracing_off() {
    assert_eq!(resolve(None, env(&[])), Ok(None));
    assert_eq!(
        resolve(
            None,
            env(&[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318"),
                ("OTEL_SDK_DISABLED", "true")
            ])
        ),
        Ok(None)
    );
}

#[test]
fn the_kubernetes_file_gives_grpc_its_endpoint_and_a_parent_based_rate() {
    let settings = resolve(Some((Path::new("/etc/t.yaml"), FILE)), env(&[]))
        .unwrap()
        .unwrap();
    assert_eq!(settings.protocol, Protocol::Grpc);
    assert_eq!(
        settings.endpoint.to_string(),
        "http://collector.monitoring:4317/"
    );
    assert_eq!(
        settings.sampling,
        Sampling {
            ratio: 0.25,
            parent_based: true
        }
    );
}

#[test]
fn the_file_wins_over_the_environment_where_both_speak() {
    let settings = resolve(
        Some((Path::new("t.yaml"), FILE)),
        env(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://other:4318"),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"),
            ("OTEL_TRACES_SAMPLER", "always_on"),
            ("OTEL_SERVICE_NAME", "provisioner-a"),
        ]),
    )
    .unwrap()
    .unwrap();
    assert_eq!(settings.endpoint.host(), Some("collector.monitoring"));
    assert_eq!(settings.protocol, Protocol::Grpc);
    assert_eq!(settings.sampling.ratio, 0.25);
    assert_eq!(settings.service_name.as_deref(), Some("provisioner-a"));
}

#[test]
fn a_file_without_a_rate_keeps_no_root_and_one_with_a_default_endpoint_goes_to_the_node() {
    let settings = resolve(
        Some((
            Path::new("t"),
            "apiVersion: apiserver.config.k8s.io/v1beta1\nkind: TracingConfiguration\n",
        )),
        env(&[]),
    )
    .unwrap()
    .unwrap();
    assert_eq!(settings.sampling.ratio, 0.0);
    assert_eq!(settings.endpoint.to_string(), "http://localhost:4317/");
}

#[test]
fn the_environment_alone_follows_the_otlp_specification() {
    let settings = resolve(
        None,
        env(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318/"),
            (
                "OTEL_RESOURCE_ATTRIBUTES",
                "k8s.cluster.name=prod%2Deu,service.name=prov",
            ),
            ("OTEL_TRACES_SAMPLER", "parentbased_traceidratio"),
            ("OTEL_TRACES_SAMPLER_ARG", "0.5"),
            ("OTEL_BSP_SCHEDULE_DELAY", "100"),
        ]),
    )
    .unwrap()
    .unwrap();
    assert_eq!(settings.protocol, Protocol::HttpProtobuf);
    assert_eq!(
        settings.endpoint.to_string(),
        "http://collector:4318/v1/traces"
    );
    assert_eq!(settings.service_name.as_deref(), Some("prov"));
    assert_eq!(
        settings.resource,
        vec![("k8s.cluster.name".to_string(), "prod-eu".to_string())]
    );
    assert_eq!(
        settings.sampling,
        Sampling {
            ratio: 0.5,
            parent_based: true
        }
    );
    assert_eq!(settings.batching.delay, Duration::from_millis(100));

    let grpc = resolve(
        None,
        env(&[
            (
                "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
                "http://collector:4317",
            ),
            ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "grpc"),
        ]),
    )
    .unwrap()
    .unwrap();
    assert_eq!(grpc.protocol, Protocol::Grpc);
    assert_eq!(grpc.endpoint.port_u16(), Some(4317));
}

#[test]
fn bad_settings_name_the_flag_or_variable() {
    let file = |text: &str| resolve(Some((Path::new("t.yaml"), text)), env(&[])).unwrap_err();
    let err = file(
        "apiVersion: apiserver.config.k8s.io/v1\nkind: TracingConfiguration\nsamplingRatePerMillion: 2000000\n",
    );
    assert_eq!(
        err.to_string(),
        "--tracing-config-file t.yaml: samplingRatePerMillion must be between 0 and 1000000, not 2000000"
    );
    let err =
        file("apiVersion: apiserver.config.k8s.io/v1\nkind: TracingConfiguration\nendpont: x:1\n");
    assert!(err.to_string().contains("endpont"), "{err}");
    let err = file("kind: TracingConfiguration\n");
    assert!(err.to_string().contains("apiVersion is missing"), "{err}");
    let err = file(
        "apiVersion: apiserver.config.k8s.io/v1\nkind: TracingConfiguration\nendpoint: http://collector:4317\n",
    );
    assert!(err.to_string().contains("unsupported scheme"), "{err}");
    let err = file(": : :\n\t[");
    assert!(
        err.to_string()
            .starts_with("--tracing-config-file t.yaml: "),
        "{err}"
    );

    let var = |pairs: &[(&str, &str)]| {
        let mut all = vec![("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318")];
        all.extend_from_slice(pairs);
        resolve(None, env(&all)).unwrap_err().to_string()
    };
    assert!(
        var(&[("OTEL_EXPORTER_OTLP_PROTOCOL", "thrift")])
            .starts_with("OTEL_EXPORTER_OTLP_PROTOCOL=\"thrift\"")
    );
    assert!(var(&[("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json")]).contains("not supported"));
    assert!(var(&[("OTEL_TRACES_SAMPLER", "sometimes")]).starts_with("OTEL_TRACES_SAMPLER="));
    assert!(
        var(&[
            ("OTEL_TRACES_SAMPLER", "traceidratio"),
            ("OTEL_TRACES_SAMPLER_ARG", "1.5")
        ])
        .starts_with("OTEL_TRACES_SAMPLER_ARG=")
    );
    assert!(
        var(&[("OTEL_RESOURCE_ATTRIBUTES", "novalue")]).starts_with("OTEL_RESOURCE_ATTRIBUTES=")
    );
    assert!(var(&[("OTEL_BSP_MAX_QUEUE_SIZE", "0")]).starts_with("OTEL_BSP_MAX_QUEUE_SIZE="));
    let err = resolve(
        None,
        env(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "ftp://c:4318")]),
    )
    .unwrap_err();
    assert!(err.to_string().contains("http or https"), "{err}");
    assert!(var(&[("OTEL_SDK_DISABLED", "yes")]).starts_with("OTEL_SDK_DISABLED="));
    assert!(
        var(&[("OTEL_EXPORTER_OTLP_COMPRESSION", "zstd")])
            .starts_with("OTEL_EXPORTER_OTLP_COMPRESSION=")
    );
    let err = resolve(None, env(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "not a url")])).unwrap_err();
    assert!(err.to_string().contains("not a URL"), "{err}");
}

#[test]
fn enumerated_values_are_read_case_insensitively_and_unknown_exporters_refused() {
    let endpoint = ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318");
    for off in [
        ("OTEL_SDK_DISABLED", "TRUE"),
        ("OTEL_TRACES_EXPORTER", "None"),
    ] {
        assert_eq!(resolve(None, env(&[endpoint, off])), Ok(None), "{off:?}");
    }
    let on = resolve(
        None,
        env(&[
            endpoint,
            ("OTEL_TRACES_EXPORTER", "OTLP"),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "GRPC"),
            ("OTEL_TRACES_SAMPLER", "ParentBased_Always_On"),
        ]),
    )
    .unwrap()
    .unwrap();
    assert_eq!(on.protocol, Protocol::Grpc);
    assert!(on.sampling.parent_based);
    for unsupported in ["console", "zipkin", "otlp,console"] {
        let err = resolve(
            None,
            env(&[endpoint, ("OTEL_TRACES_EXPORTER", unsupported)]),
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.starts_with("OTEL_TRACES_EXPORTER=") && err.contains("use otlp or none"),
            "{err}"
        );
    }
    // Refused even without an endpoint: nothing is quietly left untraced either.
    assert!(resolve(None, env(&[("OTEL_TRACES_EXPORTER", "console")])).is_err());
}

#[test]
fn tls_follows_the_scheme_and_without_one_the_insecure_flag() {
    let with = |pairs: &[(&str, &str)]| resolve(None, env(pairs)).unwrap().unwrap();
    let https = with(&[
        ("OTEL_EXPORTER_OTLP_ENDPOINT", "https://otlp.example.com"),
        ("OTEL_EXPORTER_OTLP_CERTIFICATE", "/etc/otel/ca.pem"),
        (
            "OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE",
            "/etc/otel/traces-ca.pem",
        ),
        ("OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE", "/etc/otel/tls.crt"),
        ("OTEL_EXPORTER_OTLP_CLIENT_KEY", "/etc/otel/tls.key"),
    ]);
    assert_eq!(
        https.tls,
        Some(Tls {
            roots: Some("/etc/otel/traces-ca.pem".into()),
            identity: Some(("/etc/otel/tls.crt".into(), "/etc/otel/tls.key".into())),
        })
    );
    assert_eq!(
        https.collector,
        Collector::Tcp {
            host: "otlp.example.com".to_string(),
            port: 443
        }
    );
    assert_eq!(
        https.endpoint.to_string(),
        "https://otlp.example.com/v1/traces"
    );
    let grpc = |endpoint: &str, insecure: &str| {
        with(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
            ("OTEL_EXPORTER_OTLP_INSECURE", insecure),
        ])
    };
    // The specification: without a scheme, TLS unless insecure; a scheme decides by itself.
    assert!(grpc("collector:4317", "false").tls.is_some());
    assert!(grpc("collector:4317", "TRUE").tls.is_none());
    assert!(grpc("http://collector:4317", "false").tls.is_none());
    assert!(grpc("https://collector:4317", "true").tls.is_some());
    assert_eq!(
        grpc("[::1]", "true").collector,
        Collector::Tcp {
            host: "::1".to_string(),
            port: 4317
        }
    );
    // kube-apiserver's file: plain text, whatever the environment says of TLS.
    let file = resolve(
        Some((Path::new("t.yaml"), FILE)),
        env(&[("OTEL_EXPORTER_OTLP_CERTIFICATE", "/etc/otel/ca.pem")]),
    )
    .unwrap()
    .unwrap();
    assert!(file.tls.is_none());

    let half = resolve(
        None,
        env(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "https://c"),
            ("OTEL_EXPORTER_OTLP_TRACES_CLIENT_KEY", "/k"),
        ]),
    )
    .unwrap_err();
    assert!(
        half.to_string()
            .starts_with("OTEL_EXPORTER_OTLP_TRACES_CLIENT_KEY without"),
        "{half}"
    );
}

#[test]
fn headers_are_decoded_and_never_shown() {
    let settings = resolve(
        None,
        env(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "https://c"),
            ("OTEL_EXPORTER_OTLP_HEADERS", "ignored=1"),
            (
                "OTEL_EXPORTER_OTLP_TRACES_HEADERS",
                " Authorization = Bearer%20tok3n , x-scope=team-a",
            ),
            ("OTEL_EXPORTER_OTLP_TRACES_COMPRESSION", "GZIP"),
        ]),
    )
    .unwrap()
    .unwrap();
    let headers: Vec<(String, String)> = settings
        .headers
        .0
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_str().unwrap().to_string()))
        .collect();
    assert_eq!(
        headers,
        vec![
            ("authorization".to_string(), "Bearer tok3n".to_string()),
            ("x-scope".to_string(), "team-a".to_string())
        ]
    );
    assert_eq!(settings.compression, Compression::Gzip);
    let shown = format!("{settings:?}");
    assert!(
        !shown.contains("tok3n") && shown.contains("authorization"),
        "{shown}"
    );

    for (value, named) in [
        ("authorization=Bearer\u{7}tok3n", "authorization"),
        ("content-type=text/plain", "content-type"),
        ("bad name=tok3n", "bad name"),
        ("authorization=%zztok3n", "authorization"),
        ("tok3n", "name=value"),
    ] {
        let err = resolve(
            None,
            env(&[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "https://c"),
                ("OTEL_EXPORTER_OTLP_HEADERS", value),
            ]),
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.starts_with("OTEL_EXPORTER_OTLP_HEADERS: ") && err.contains(named),
            "{err}"
        );
        assert!(!err.contains("tok3n"), "{err}");
    }
}

#[test]
fn propagators_are_the_specifications_and_others_refused() {
    let with = |value: Option<&str>| {
        let mut pairs = vec![("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318")];
        pairs.extend(value.map(|v| ("OTEL_PROPAGATORS", v)));
        resolve(None, env(&pairs)).map(|s| s.unwrap().propagators)
    };
    assert_eq!(with(None), Ok(Propagators::default()));
    assert_eq!(
        with(Some("TraceContext")),
        Ok(Propagators {
            trace_context: true,
            baggage: false
        })
    );
    assert_eq!(
        with(Some("none")),
        Ok(Propagators {
            trace_context: false,
            baggage: false
        })
    );
    let err = with(Some("tracecontext,b3")).unwrap_err().to_string();
    assert!(err.starts_with("OTEL_PROPAGATORS="), "{err}");
}
