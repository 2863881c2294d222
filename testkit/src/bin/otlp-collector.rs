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
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let collector = match testkit::otlp::Collector::start_on(cli.grpc_port, cli.http_port).await {
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
        "OTLP/gRPC on {}, OTLP/HTTP on {}; Ctrl-C or SIGTERM prints the traces",
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
