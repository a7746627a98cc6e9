//! The kubelet's side of the plugin's device health stream, for the health
//! tests: connecting to the stream and waiting for a wanted message.

use std::time::Duration;

use futures::StreamExt;
use gpu_dra_sim::kubelet::{DeviceHealth, HealthStream, KubeletSim};

use super::{DRIVER, Plugin};

/// The health stream of `plugin`, once it registered with the kubelet.
pub async fn health_stream(plugin: &Plugin) -> HealthStream {
    let mut registrar = KubeletSim::new().watch_registrar(&plugin.reg_dir);
    let p = registrar
        .wait_registered(DRIVER, Duration::from_secs(10))
        .await
        .unwrap();
    p.watch_health().await.unwrap()
}

/// Reads health messages until one satisfies `want`; panics with the last
/// one after `timeout`.
pub async fn wait_health(
    stream: &mut HealthStream,
    timeout: Duration,
    want: impl Fn(&[DeviceHealth]) -> bool,
) -> Vec<DeviceHealth> {
    let deadline = tokio::time::Instant::now() + timeout;
    let mut last = Vec::new();
    loop {
        match tokio::time::timeout_at(deadline, stream.next()).await {
            Ok(Some(Ok(list))) => {
                if want(&list) {
                    return list;
                }
                last = list;
            }
            Ok(other) => panic!("health stream ended: {other:?}"),
            Err(tokio::time::error::Elapsed { .. }) => {
                panic!("no matching health message in {timeout:?}; last: {last:#?}")
            }
        }
    }
}

/// The entry of `device` in a health message, if it has one.
pub fn health_of<'a>(list: &'a [DeviceHealth], device: &str) -> Option<&'a DeviceHealth> {
    list.iter().find(|d| d.device_name == device)
}

/// Whether a health message lists `device` with `health`.
pub fn is(list: &[DeviceHealth], device: &str, health: &str) -> bool {
    health_of(list, device).is_some_and(|d| d.health == health)
}
