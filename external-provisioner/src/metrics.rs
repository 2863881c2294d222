//! The provisioning and deletion metrics of upstream's provisioner library, with its names,
//! help texts (typos included, dashboards match them) and labels.

use std::time::Duration;

use prometheus::{HistogramOpts, HistogramVec, IntCounterVec, Opts, Registry};

#[derive(Clone)]
pub struct ProvisionMetrics {
    provisioned: IntCounterVec,
    provision_failed: IntCounterVec,
    provision_duration: HistogramVec,
    deleted: IntCounterVec,
    delete_failed: IntCounterVec,
    delete_duration: HistogramVec,
}

impl ProvisionMetrics {
    pub fn register(registry: &Registry) -> Result<Self, prometheus::Error> {
        let counter =
            |name: &str, help: &str, labels: &[&str]| -> Result<IntCounterVec, prometheus::Error> {
                let c = IntCounterVec::new(Opts::new(name, help).subsystem("controller"), labels)?;
                registry.register(Box::new(c.clone()))?;
                Ok(c)
            };
        let histogram =
            |name: &str, help: &str, labels: &[&str]| -> Result<HistogramVec, prometheus::Error> {
                let h = HistogramVec::new(
                    HistogramOpts::new(name, help).subsystem("controller"),
                    labels,
                )?;
                registry.register(Box::new(h.clone()))?;
                Ok(h)
            };
        Ok(Self {
            provisioned: counter(
                "persistentvolumeclaim_provision_total",
                "Total number of persistent volumes provisioned succesfully. Broken down by storage class name and source of the claim.",
                &["class", "source"],
            )?,
            provision_failed: counter(
                "persistentvolumeclaim_provision_failed_total",
                "Total number of persistent volume provision failed attempts. Broken down by storage class name and source of the claim.",
                &["class", "source"],
            )?,
            provision_duration: histogram(
                "persistentvolumeclaim_provision_duration_seconds",
                "Latency in seconds to provision persistent volumes. Failed provisioning attempts are ignored. Broken down by storage class name and source of the claim.",
                &["class", "source"],
            )?,
            deleted: counter(
                "persistentvolume_delete_total",
                "Total number of persistent volumes deleted succesfully. Broken down by storage class name.",
                &["class"],
            )?,
            delete_failed: counter(
                "persistentvolume_delete_failed_total",
                "Total number of persistent volume delete failed attempts. Broken down by storage class name.",
                &["class"],
            )?,
            delete_duration: histogram(
                "persistentvolume_delete_duration_seconds",
                "Latency in seconds to delete persistent volumes. Failed deletion attempts are ignored. Broken down by storage class name.",
                &["class"],
            )?,
        })
    }

    pub fn provision(&self, class: &str, source: &str, result: Result<Duration, ()>) {
        match result {
            Ok(took) => {
                self.provisioned.with_label_values(&[class, source]).inc();
                self.provision_duration
                    .with_label_values(&[class, source])
                    .observe(took.as_secs_f64());
            }
            Err(()) => self
                .provision_failed
                .with_label_values(&[class, source])
                .inc(),
        }
    }

    pub fn delete(&self, class: &str, result: Result<Duration, ()>) {
        match result {
            Ok(took) => {
                self.deleted.with_label_values(&[class]).inc();
                self.delete_duration
                    .with_label_values(&[class])
                    .observe(took.as_secs_f64());
            }
            Err(()) => self.delete_failed.with_label_values(&[class]).inc(),
        }
    }
}
