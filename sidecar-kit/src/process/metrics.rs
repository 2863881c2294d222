//! Prometheus metrics shared by the sidecars: the CSI operations histogram, exactly as upstream's
//! csi-lib-utils names and labels it, and the process metrics.

use std::sync::{Arc, RwLock};
use std::time::Duration;

use prometheus::{Encoder, HistogramOpts, HistogramVec, Registry, TextEncoder};

/// Name of the histogram of CSI calls.
pub const OPERATIONS_METRIC: &str = "csi_sidecar_operations_seconds";
/// HELP text of the histogram, with the stability prefix upstream's registry adds.
pub const OPERATIONS_HELP: &str =
    "[ALPHA] Container Storage Interface operation duration with gRPC error code status total";
/// `driver_name` label value until GetPluginInfo has answered.
pub const UNKNOWN_DRIVER: &str = "unknown-driver";
/// `grpc_status_code` label value for failures that carry no gRPC status.
pub const NON_GRPC_ERROR: &str = "unknown-non-grpc";
/// Histogram buckets in seconds.
pub const OPERATION_BUCKETS: [f64; 13] = [
    0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 15.0, 25.0, 50.0, 120.0, 300.0, 600.0,
];

const LABELS: [&str; 3] = ["driver_name", "method_name", "grpc_status_code"];

/// The name of a process's histogram of CSI calls and the labels it has besides upstream's
/// three: csi-lib-utils' metrics manager takes both per sidecar.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OperationsShape {
    pub name: &'static str,
    /// Labels after `driver_name`, `method_name` and `grpc_status_code`; empty on the CSI
    /// calls that have nothing to put in them.
    pub extra_labels: &'static [&'static str],
}

impl OperationsShape {
    /// `csi_sidecar_operations_seconds`, the controller sidecars'.
    pub const CSI_SIDECAR: Self = Self {
        name: OPERATIONS_METRIC,
        extra_labels: &[],
    };

    fn labels(&self, with_migration: bool) -> Vec<&'static str> {
        let mut labels = LABELS.to_vec();
        if with_migration {
            labels.push("migrated");
        }
        labels.extend_from_slice(self.extra_labels);
        labels
    }
}

#[derive(Debug, thiserror::Error)]
pub enum MetricsError {
    #[error("metrics registry: {0}")]
    Registry(#[from] prometheus::Error),
    #[error("metrics are not valid UTF-8")]
    Utf8(#[from] std::string::FromUtf8Error),
}

/// Go's `codes.Code.String()` for a gRPC status code: the `grpc_status_code` label value.
pub fn code_label(code: tonic::Code) -> &'static str {
    use tonic::Code::*;
    match code {
        Ok => "OK",
        Cancelled => "Canceled",
        Unknown => "Unknown",
        InvalidArgument => "InvalidArgument",
        DeadlineExceeded => "DeadlineExceeded",
        NotFound => "NotFound",
        AlreadyExists => "AlreadyExists",
        PermissionDenied => "PermissionDenied",
        ResourceExhausted => "ResourceExhausted",
        FailedPrecondition => "FailedPrecondition",
        Aborted => "Aborted",
        OutOfRange => "OutOfRange",
        Unimplemented => "Unimplemented",
        Internal => "Internal",
        Unavailable => "Unavailable",
        DataLoss => "DataLoss",
        Unauthenticated => "Unauthenticated",
    }
}

/// The metrics registry of one sidecar process. Cheap to clone.
#[derive(Clone)]
pub struct CsiMetrics {
    inner: Arc<Inner>,
}

struct Inner {
    registry: Registry,
    shape: OperationsShape,
    driver_name: RwLock<String>,
    operations: Arc<RwLock<Operations>>,
}

/// Serves whichever histogram is current: the registry refuses to re-register a name with
/// another label set, so the switch to the `migrated` label happens behind this collector.
struct OperationsCollector {
    operations: Arc<RwLock<Operations>>,
    descs: Vec<prometheus::core::Desc>,
}

impl prometheus::core::Collector for OperationsCollector {
    fn desc(&self) -> Vec<&prometheus::core::Desc> {
        self.descs.iter().collect()
    }

    fn collect(&self) -> Vec<prometheus::proto::MetricFamily> {
        self.operations
            .read()
            .map(|ops| prometheus::core::Collector::collect(&ops.histogram))
            .unwrap_or_default()
    }
}

struct Operations {
    histogram: HistogramVec,
    with_migration: bool,
}

fn operations_histogram(
    shape: &OperationsShape,
    with_migration: bool,
) -> Result<HistogramVec, prometheus::Error> {
    let opts = HistogramOpts::new(shape.name, OPERATIONS_HELP).buckets(OPERATION_BUCKETS.to_vec());
    HistogramVec::new(opts, &shape.labels(with_migration))
}

impl CsiMetrics {
    /// A fresh registry with the controller sidecars' operations histogram and the process
    /// metrics.
    pub fn new() -> Result<Self, MetricsError> {
        Self::with_shape(OperationsShape::CSI_SIDECAR)
    }

    /// A fresh registry with the operations histogram `shape` and the process metrics.
    pub fn with_shape(shape: OperationsShape) -> Result<Self, MetricsError> {
        let registry = Registry::new();
        let histogram = operations_histogram(&shape, false)?;
        let descs = prometheus::core::Collector::desc(&histogram)
            .into_iter()
            .cloned()
            .collect();
        let operations = Arc::new(RwLock::new(Operations {
            histogram,
            with_migration: false,
        }));
        registry.register(Box::new(OperationsCollector {
            operations: operations.clone(),
            descs,
        }))?;
        register_process_metrics(&registry)?;
        Ok(Self {
            inner: Arc::new(Inner {
                registry,
                shape,
                driver_name: RwLock::new(UNKNOWN_DRIVER.to_string()),
                operations,
            }),
        })
    }

    /// The registry, for sidecar-specific metrics and for serving.
    pub fn registry(&self) -> &Registry {
        &self.inner.registry
    }

    /// Sets the `driver_name` label of all later observations.
    pub fn set_driver_name(&self, name: &str) {
        if let Ok(mut current) = self.inner.driver_name.write() {
            *current = name.to_string();
        }
    }

    pub fn driver_name(&self) -> String {
        self.inner
            .driver_name
            .read()
            .map(|n| n.clone())
            .unwrap_or_default()
    }

    /// Adds the `migrated` label, as upstream does once it knows the driver is the target of
    /// CSI migration. Observations made before are dropped, as upstream's switch of registry does.
    pub fn enable_migration_label(&self) -> Result<(), MetricsError> {
        let mut ops = self
            .inner
            .operations
            .write()
            .map_err(|_| prometheus::Error::Msg("poisoned".into()))?;
        if ops.with_migration {
            return Ok(());
        }
        let histogram = operations_histogram(&self.inner.shape, true)?;
        *ops = Operations {
            histogram,
            with_migration: true,
        };
        Ok(())
    }

    /// Records one CSI call. `migrated` is used only when the migration label is enabled.
    pub fn observe(&self, method: &str, status_code: &str, elapsed: Duration, migrated: bool) {
        self.record(method, status_code, elapsed, Some(migrated), &[]);
    }

    /// Records one operation with the values of the shape's extra labels, in their order.
    pub fn observe_with(&self, method: &str, status_code: &str, elapsed: Duration, extra: &[&str]) {
        self.record(method, status_code, elapsed, None, extra);
    }

    fn record(
        &self,
        method: &str,
        status_code: &str,
        elapsed: Duration,
        migrated: Option<bool>,
        extra: &[&str],
    ) {
        let driver = self.driver_name();
        let Ok(ops) = self.inner.operations.read() else {
            return;
        };
        let mut values: Vec<&str> = vec![&driver, method, status_code];
        if ops.with_migration {
            values.push(if migrated == Some(true) {
                "true"
            } else {
                "false"
            });
        }
        let extra_labels = self.inner.shape.extra_labels.len();
        values.extend((0..extra_labels).map(|i| extra.get(i).copied().unwrap_or("")));
        if let Ok(histogram) = ops.histogram.get_metric_with_label_values(&values) {
            histogram.observe(elapsed.as_secs_f64());
        }
    }

    /// The registry in the Prometheus text exposition format.
    pub fn render(&self) -> Result<String, MetricsError> {
        let mut buffer = Vec::new();
        TextEncoder::new().encode(&self.inner.registry.gather(), &mut buffer)?;
        Ok(String::from_utf8(buffer)?)
    }
}

#[cfg(target_os = "linux")]
fn register_process_metrics(registry: &Registry) -> Result<(), prometheus::Error> {
    // Includes process_start_time_seconds, CPU, memory and file descriptors.
    registry.register(Box::new(
        prometheus::process_collector::ProcessCollector::for_self(),
    ))
}

#[cfg(not(target_os = "linux"))]
fn register_process_metrics(registry: &Registry) -> Result<(), prometheus::Error> {
    let start = prometheus::Gauge::new(
        "process_start_time_seconds",
        "Start time of the process since unix epoch in seconds.",
    )?;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    start.set(now.as_secs_f64());
    registry.register(Box::new(start))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn code_labels_are_go_names() {
        assert_eq!(code_label(tonic::Code::Ok), "OK");
        assert_eq!(code_label(tonic::Code::Cancelled), "Canceled");
        assert_eq!(
            code_label(tonic::Code::DeadlineExceeded),
            "DeadlineExceeded"
        );
        assert_eq!(
            code_label(tonic::Code::ResourceExhausted),
            "ResourceExhausted"
        );
    }

    #[test]
    fn migration_label_switch() {
        let metrics = CsiMetrics::new().unwrap();
        metrics.observe(
            "/csi.v1.Identity/Probe",
            "OK",
            Duration::from_millis(5),
            false,
        );
        metrics.set_driver_name("d.example.com");
        metrics.enable_migration_label().unwrap();
        metrics.observe(
            "/csi.v1.Controller/ControllerPublishVolume",
            "OK",
            Duration::from_millis(5),
            true,
        );
        let text = metrics.render().unwrap();
        assert!(text.contains(
            r#"csi_sidecar_operations_seconds_count{driver_name="d.example.com",grpc_status_code="OK",method_name="/csi.v1.Controller/ControllerPublishVolume",migrated="true"} 1"#
        ), "{text}");
        assert!(!text.contains("unknown-driver"), "{text}");
    }
}
