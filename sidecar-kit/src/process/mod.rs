//! Process and flags: upstream's flag syntaxes (Go `flag`, pflag), klog's `-v` on tracing, the
//! bounded HTTP endpoint for metrics and health, the CSI operations histogram.

pub mod flags;
pub mod http;
pub mod logging;
pub mod metrics;
