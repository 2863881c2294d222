//! `csi-external-health-monitor-controller`: the command line; everything else lives in the
//! library and the sidecar runtime.

fn main() {
    sidecar_kit::runtime::main::<external_health_monitor::app::HealthMonitor>(std::env::args_os());
}
