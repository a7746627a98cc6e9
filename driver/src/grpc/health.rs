//! The `DRAResourceHealth` service (packages `v1alpha1` and `v1`) on the DRA
//! socket. Each `NodeWatchResources` stream sends the current device health
//! list at once, then the whole list again on every change, and stays open
//! until the plugin shuts down. The list comes from a watch channel
//! ([`channel`]) that the health monitor feeds; until one exists the list
//! is empty.

use std::pin::Pin;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use dra_proto::health::{v1, v1alpha1};
use futures::Stream;
use tokio::sync::watch;
use tonic::{Request, Response, Status};

use super::metrics::{GrpcMetrics, Method, Outcome, Service};

/// Health of one device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HealthStatus {
    /// Not known (yet).
    Unknown,
    /// Usable.
    Healthy,
    /// Not usable.
    Unhealthy,
}

/// One device's health as reported to kubelet.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceHealth {
    /// The ResourceSlice pool of the device.
    pub pool_name: String,
    /// The device name inside the pool.
    pub device_name: String,
    /// Its health.
    pub status: HealthStatus,
    /// When the status was last determined.
    pub last_updated: SystemTime,
    /// How long kubelet may trust this status without an update; `None`
    /// lets kubelet use its default (30 s).
    pub health_check_timeout: Option<Duration>,
    /// Human-readable detail.
    pub message: String,
}

/// The sending side: the health monitor replaces the whole list.
pub type HealthSender = watch::Sender<Vec<DeviceHealth>>;
/// The receiving side the health service reads.
pub type HealthReceiver = watch::Receiver<Vec<DeviceHealth>>;

/// A health channel starting with an empty device list.
pub fn channel() -> (HealthSender, HealthReceiver) {
    watch::channel(Vec::new())
}

/// The health service, for both packages.
#[derive(Clone)]
pub(crate) struct HealthService {
    devices: HealthReceiver,
    stopping: watch::Receiver<bool>,
    metrics: GrpcMetrics,
}

type BoxStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send + 'static>>;

impl HealthService {
    pub(crate) fn new(
        devices: HealthReceiver,
        stopping: watch::Receiver<bool>,
        metrics: GrpcMetrics,
    ) -> Self {
        Self {
            devices,
            stopping,
            metrics,
        }
    }

    /// A stream of complete device lists, converted by `convert`: the
    /// current list first, then one per change, ending when the plugin stops.
    fn watch<T, F>(&self, convert: F) -> BoxStream<T>
    where
        T: Send + 'static,
        F: Fn(&[DeviceHealth]) -> T + Send + 'static,
    {
        let mut devices = self.devices.clone();
        devices.mark_changed();
        let stopping = self.stopping.clone();
        let stream = futures::stream::unfold(
            (devices, stopping, convert),
            |(mut devices, mut stopping, convert)| async move {
                let stopped = *stopping.borrow();
                if stopped {
                    return None;
                }
                tokio::select! {
                    changed = devices.changed() => {
                        if changed.is_err() {
                            // The monitor is gone: keep the last list and the
                            // stream open until shutdown, so kubelet does not
                            // reconnect in a loop.
                            until_stopped(&mut stopping).await;
                            return None;
                        }
                    }
                    () = until_stopped(&mut stopping) => return None,
                }
                let item = convert(&devices.borrow_and_update());
                Some((Ok(item), (devices, stopping, convert)))
            },
        );
        Box::pin(stream)
    }
}

/// Waits until the plugin stops (or the stop signal is gone).
async fn until_stopped(stopping: &mut watch::Receiver<bool>) {
    let _ = stopping.wait_for(|s| *s).await.is_ok();
}

fn unix_seconds(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}

fn timeout_seconds(t: Option<Duration>) -> i64 {
    t.map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}

fn to_v1alpha1(devices: &[DeviceHealth]) -> v1alpha1::NodeWatchResourcesResponse {
    v1alpha1::NodeWatchResourcesResponse {
        devices: devices
            .iter()
            .map(|d| v1alpha1::DeviceHealth {
                device: Some(v1alpha1::DeviceIdentifier {
                    pool_name: d.pool_name.clone(),
                    device_name: d.device_name.clone(),
                }),
                health: match d.status {
                    HealthStatus::Unknown => v1alpha1::HealthStatus::Unknown,
                    HealthStatus::Healthy => v1alpha1::HealthStatus::Healthy,
                    HealthStatus::Unhealthy => v1alpha1::HealthStatus::Unhealthy,
                }
                .into(),
                last_updated_time: unix_seconds(d.last_updated),
                health_check_timeout_seconds: timeout_seconds(d.health_check_timeout),
                message: d.message.clone(),
            })
            .collect(),
    }
}

fn to_v1(devices: &[DeviceHealth]) -> v1::NodeWatchResourcesResponse {
    v1::NodeWatchResourcesResponse {
        devices: devices
            .iter()
            .map(|d| v1::DeviceHealth {
                device: Some(v1::DeviceIdentifier {
                    pool_name: d.pool_name.clone(),
                    device_name: d.device_name.clone(),
                }),
                health: match d.status {
                    HealthStatus::Unknown => v1::HealthStatus::Unknown,
                    HealthStatus::Healthy => v1::HealthStatus::Healthy,
                    HealthStatus::Unhealthy => v1::HealthStatus::Unhealthy,
                }
                .into(),
                last_updated_time: unix_seconds(d.last_updated),
                health_check_timeout_seconds: timeout_seconds(d.health_check_timeout),
                message: d.message.clone(),
            })
            .collect(),
    }
}

#[tonic::async_trait]
impl v1alpha1::dra_resource_health_server::DraResourceHealth for HealthService {
    type NodeWatchResourcesStream = BoxStream<v1alpha1::NodeWatchResourcesResponse>;

    async fn node_watch_resources(
        &self,
        _: Request<v1alpha1::NodeWatchResourcesRequest>,
    ) -> Result<Response<Self::NodeWatchResourcesStream>, Status> {
        tracing::info!(version = "v1alpha1", "kubelet opened the health stream");
        self.metrics.request(
            Service::health_v1alpha1,
            Method::node_watch_resources,
            Outcome::ok,
        );
        Ok(Response::new(self.watch(to_v1alpha1)))
    }
}

#[tonic::async_trait]
impl v1::dra_resource_health_server::DraResourceHealth for HealthService {
    type NodeWatchResourcesStream = BoxStream<v1::NodeWatchResourcesResponse>;

    async fn node_watch_resources(
        &self,
        _: Request<v1::NodeWatchResourcesRequest>,
    ) -> Result<Response<Self::NodeWatchResourcesStream>, Status> {
        tracing::info!(version = "v1", "kubelet opened the health stream");
        self.metrics.request(
            Service::health_v1,
            Method::node_watch_resources,
            Outcome::ok,
        );
        Ok(Response::new(self.watch(to_v1)))
    }
}

#[cfg(test)]
mod tests {
    use futures::StreamExt;

    use super::*;

    fn device(name: &str, status: HealthStatus) -> DeviceHealth {
        DeviceHealth {
            pool_name: "node-a".into(),
            device_name: name.into(),
            status,
            last_updated: UNIX_EPOCH + Duration::from_secs(1_700_000_000),
            health_check_timeout: Some(Duration::from_secs(60)),
            message: "xid 79".into(),
        }
    }

    #[tokio::test]
    async fn stream_sends_current_list_then_changes_then_ends_on_stop() {
        let (tx, rx) = channel();
        tx.send_replace(vec![device("gpu-0", HealthStatus::Healthy)]);
        let (stop_tx, stop_rx) = watch::channel(false);
        let svc = HealthService::new(rx, stop_rx, GrpcMetrics::default());
        let mut s = svc.watch(to_v1alpha1);

        let first = s.next().await.unwrap().unwrap();
        assert_eq!(first.devices.len(), 1);
        let d = &first.devices[0];
        assert_eq!(d.device.as_ref().unwrap().device_name, "gpu-0");
        assert_eq!(d.health, i32::from(v1alpha1::HealthStatus::Healthy));
        assert_eq!(d.last_updated_time, 1_700_000_000);
        assert_eq!(d.health_check_timeout_seconds, 60);
        assert_eq!(d.message, "xid 79");

        tx.send_replace(vec![
            device("gpu-0", HealthStatus::Unhealthy),
            device("gpu-1", HealthStatus::Unknown),
        ]);
        let second = s.next().await.unwrap().unwrap();
        assert_eq!(second.devices.len(), 2);
        assert_eq!(
            second.devices[0].health,
            i32::from(v1alpha1::HealthStatus::Unhealthy)
        );

        stop_tx.send_replace(true);
        assert!(s.next().await.is_none());
    }

    #[tokio::test]
    async fn stream_stays_open_when_the_monitor_goes_away() {
        let (tx, rx) = channel();
        let (stop_tx, stop_rx) = watch::channel(false);
        let svc = HealthService::new(rx, stop_rx, GrpcMetrics::default());
        let mut s = svc.watch(to_v1);
        assert!(s.next().await.unwrap().unwrap().devices.is_empty());
        drop(tx);
        let pending = tokio::time::timeout(Duration::from_millis(50), s.next()).await;
        assert!(pending.is_err(), "stream ended or yielded: {pending:?}");
        stop_tx.send_replace(true);
        assert!(s.next().await.is_none());
    }
}
