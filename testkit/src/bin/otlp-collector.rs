//! `otlp-collector`: the test kit's OpenTelemetry collector as a program, for looking at the
//! sidecars' traces without a tracing backend. Listens for OTLP/gRPC and OTLP/HTTP on
//! 127.0.0.1 and, when stopped (Ctrl-C or SIGTERM), prints every trace it received as a
//! waterfall, the services of each span in brackets.

use clap::Parser;

#[derive(Parser, Debug)]
#[command(name = "otlp-collector", version)]
struct Cli {
    /// Port of the OTLP/gRPC receiver on 127.0.0.1
    #[arg(long, default_value_t = 4317)]
    grpc_port: u16,

    /// Port of the OTLP/HTTP receiver on 127.0.0.1 (spans posted to /v1/traces)
    #[arg(long, default_value_t = 4318)]
    http_port: u16,

    /// Print only the traces that hold a span of this service (e.g. kube-apiserver)
    #[arg(long)]
    with_service: Option<String>,

    /// Serve TLS on both ports with this certificate chain (PEM); needs --tls-key
    #[arg(long, requires = "tls_key")]
    tls_cert: Option<std::path::PathBuf>,

    /// The key of --tls-cert (PEM)
    #[arg(long, requires = "tls_cert")]
    tls_key: Option<std::path::PathBuf>,

    /// With TLS, require a client certificate signed by this CA (PEM)
    #[arg(long, requires = "tls_cert")]
    client_ca: Option<std::path::PathBuf>,

    /// Refuse exports without this header, as NAME=VALUE (UNAUTHENTICATED, HTTP 401)
    #[arg(long, value_name = "NAME=VALUE")]
    require_header: Option<String>,
}

fn options(cli: &Cli) -> Result<testkit::otlp::Options, String> {
    let read = |path: &std::path::Path| {
        std::fs::read_to_string(path).map_err(|err| format!("{}: {err}", path.display()))
    };
    let tls = match (&cli.tls_cert, &cli.tls_key) {
        (Some(cert), Some(key)) => Some(testkit::otlp::ServerTls {
            cert: read(cert)?,
            key: read(key)?,
            client_ca: cli.client_ca.as_deref().map(read).transpose()?,
        }),
        _ => None,
    };
    let required_header = match &cli.require_header {
        None => None,
        Some(pair) => {
            let (name, value) = pair
                .split_once('=')
                .ok_or("--require-header takes NAME=VALUE")?;
            Some((name.trim().to_ascii_lowercase(), value.to_string()))
        }
    };
    Ok(testkit::otlp::Options {
        tls,
        required_header,
    })
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let options = match options(&cli) {
        Ok(options) => options,
        Err(err) => {
            eprintln!("{err}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let collector =
        match testkit::otlp::Collector::start_on(cli.grpc_port, cli.http_port, options).await {
            Ok(collector) => collector,
            Err(err) => {
                eprintln!(
                    "cannot listen on ports {} and {}: {err}",
                    cli.grpc_port, cli.http_port
                );
                return std::process::ExitCode::FAILURE;
            }
        };
    println!(
        "OTLP/gRPC on {}, OTLP/HTTP on {}; Ctrl-C or SIGTERM prints the traces and what was refused",
        collector.grpc_endpoint(),
        collector.http_endpoint()
    );
    wait_for_stop().await;
    // Each trace's spans, the traces in the order their first span arrived.
    let mut order: Vec<String> = Vec::new();
    let mut traces: std::collections::HashMap<String, Vec<testkit::otlp::ReceivedSpan>> =
        std::collections::HashMap::new();
    for span in collector.spans() {
        let members = traces.entry(span.trace_id.clone()).or_insert_with(|| {
            order.push(span.trace_id.clone());
            Vec::new()
        });
        members.push(span);
    }
    for trace in order {
        let members = &traces[&trace];
        if let Some(service) = &cli.with_service
            && !members.iter().any(|s| &s.service == service)
        {
            continue;
        }
        println!("\ntrace {trace}");
        print!("{}", testkit::otlp::waterfall(members));
    }
    println!(
        "\n{} export requests taken, {} refused for the header, {} gzip-compressed",
        collector.requests(),
        collector.unauthenticated(),
        collector.compressed_requests()
    );
    std::process::ExitCode::SUCCESS
}

#[cfg(unix)]
async fn wait_for_stop() {
    use tokio::signal::unix::{SignalKind, signal};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => tokio::select! {
            _ = term.recv() => {}
            _ = tokio::signal::ctrl_c() => {}
        },
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

#[cfg(not(unix))]
async fn wait_for_stop() {
    let _ = tokio::signal::ctrl_c().await;
}
