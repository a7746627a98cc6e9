//! A registered plugin as the simulated kubelet sees it: DRA calls in the
//! chosen version, with kubelet's deadline and its check that the answer
//! covers exactly the requested claims; and the health stream.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::pin::Pin;
use std::time::Duration;

use dra_proto::dra::{v1, v1beta1};
use dra_proto::health::{v1 as health_v1, v1alpha1 as health_v1alpha1};
use dra_proto::registration::PluginInfo;
use futures::{Stream, StreamExt};
use tonic::transport::Channel;

use super::conn::channel;
use super::{Claim, DraVersion, Error, HealthVersion, KubeletSim};

/// One prepared device, as the plugin described it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Device {
    /// Requests the device serves (empty: all).
    pub request_names: Vec<String>,
    /// Pool of the device.
    pub pool_name: String,
    /// Device name inside the pool.
    pub device_name: String,
    /// CDI device IDs.
    pub cdi_device_ids: Vec<String>,
    /// Share ID (v1 only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub share_id: Option<String>,
}

/// The plugin's answer for one claim of a NodePrepareResources call.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct PrepareResult {
    /// The devices (ignored by kubelet when `error` is set).
    pub devices: Vec<Device>,
    /// The per-claim error, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// The plugin's answer for one claim of a NodeUnprepareResources call.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct UnprepareResult {
    /// The per-claim error, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// One device's health from the health stream.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct DeviceHealth {
    /// Pool of the device.
    pub pool_name: String,
    /// Device name inside the pool.
    pub device_name: String,
    /// `Unknown`, `Healthy` or `Unhealthy` (or the raw number if unknown).
    pub health: String,
    /// Unix seconds.
    pub last_updated_time: i64,
    /// Seconds; <= 0 means kubelet's default.
    pub health_check_timeout_seconds: i64,
    /// Detail.
    pub message: String,
}

/// Complete device lists, one per message of the stream.
pub type HealthStream = Pin<Box<dyn Stream<Item = Result<Vec<DeviceHealth>, Error>> + Send>>;

/// A plugin the simulated kubelet registered.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Plugin {
    /// The driver name.
    pub name: String,
    /// The DRA socket.
    pub endpoint: PathBuf,
    /// The registration socket it was found on.
    pub registration_socket: PathBuf,
    /// The DRAPlugin version chosen.
    pub dra_version: DraVersion,
    /// The health version chosen, if any.
    pub health_version: Option<HealthVersion>,
    /// What the plugin advertised.
    pub supported_versions: Vec<String>,
    #[serde(skip)]
    channel: Channel,
    #[serde(skip)]
    call_timeout: Duration,
}

/// The body of [`Plugin::watch_health`] for one health API version: the
/// versions' messages share their shape but not their Rust types.
macro_rules! health_stream {
    ($api:ident, $channel:expr, $rpc:expr) => {{
        let rpc = $rpc;
        let mut c =
            $api::dra_resource_health_client::DraResourceHealthClient::new($channel.clone());
        let stream = c
            .node_watch_resources($api::NodeWatchResourcesRequest {})
            .await
            .map_err(rpc)?
            .into_inner();
        Ok(Box::pin(stream.map(move |m| {
            m.map_err(rpc).map(|m| {
                m.devices
                    .into_iter()
                    .map(|d| {
                        let id = d.device.unwrap_or_default();
                        DeviceHealth {
                            pool_name: id.pool_name,
                            device_name: id.device_name,
                            health: $api::HealthStatus::try_from(d.health)
                                .map_or_else(|_| d.health.to_string(), |h| format!("{h:?}")),
                            last_updated_time: d.last_updated_time,
                            health_check_timeout_seconds: d.health_check_timeout_seconds,
                            message: d.message,
                        }
                    })
                    .collect()
            })
        })))
    }};
}

impl Plugin {
    pub(crate) fn new(
        info: PluginInfo,
        registration_socket: PathBuf,
        endpoint: PathBuf,
        dra_version: DraVersion,
        health_version: Option<HealthVersion>,
        sim: &KubeletSim,
    ) -> Result<Self, Error> {
        let channel = channel(&endpoint, &sim.authority)?;
        Ok(Self {
            name: info.name,
            endpoint,
            registration_socket,
            dra_version,
            health_version,
            supported_versions: info.supported_versions,
            channel,
            call_timeout: sim.call_timeout,
        })
    }

    /// NodePrepareResources for `claims`, in the chosen version.
    pub async fn prepare(
        &self,
        claims: &[Claim],
    ) -> Result<BTreeMap<String, PrepareResult>, Error> {
        const METHOD: &str = "NodePrepareResources";
        let answers: BTreeMap<String, PrepareResult> = match self.dra_version {
            DraVersion::V1 => {
                let mut c = v1::dra_plugin_client::DraPluginClient::new(self.channel.clone());
                let req = v1::NodePrepareResourcesRequest {
                    claims: claims.iter().map(Claim::to_v1).collect(),
                };
                let resp = self
                    .call(METHOD, c.node_prepare_resources(self.request(req)))
                    .await?;
                resp.claims
                    .into_iter()
                    .map(|(uid, r)| {
                        let devices = r
                            .devices
                            .into_iter()
                            .map(|d| Device {
                                request_names: d.request_names,
                                pool_name: d.pool_name,
                                device_name: d.device_name,
                                cdi_device_ids: d.cdi_device_ids,
                                share_id: d.share_id,
                            })
                            .collect();
                        (
                            uid,
                            PrepareResult {
                                devices,
                                error: non_empty(r.error),
                            },
                        )
                    })
                    .collect()
            }
            DraVersion::V1beta1 => {
                let mut c = v1beta1::dra_plugin_client::DraPluginClient::new(self.channel.clone());
                let req = v1beta1::NodePrepareResourcesRequest {
                    claims: claims.iter().map(Claim::to_v1beta1).collect(),
                };
                let resp = self
                    .call(METHOD, c.node_prepare_resources(self.request(req)))
                    .await?;
                resp.claims
                    .into_iter()
                    .map(|(uid, r)| {
                        let devices = r
                            .devices
                            .into_iter()
                            .map(|d| Device {
                                request_names: d.request_names,
                                pool_name: d.pool_name,
                                device_name: d.device_name,
                                cdi_device_ids: d.cdi_device_ids,
                                share_id: None,
                            })
                            .collect();
                        (
                            uid,
                            PrepareResult {
                                devices,
                                error: non_empty(r.error),
                            },
                        )
                    })
                    .collect()
            }
        };
        check_uids(METHOD, claims, answers.keys())?;
        Ok(answers)
    }

    /// NodeUnprepareResources for `claims`, in the chosen version.
    pub async fn unprepare(
        &self,
        claims: &[Claim],
    ) -> Result<BTreeMap<String, UnprepareResult>, Error> {
        const METHOD: &str = "NodeUnprepareResources";
        let answers: BTreeMap<String, UnprepareResult> = match self.dra_version {
            DraVersion::V1 => {
                let mut c = v1::dra_plugin_client::DraPluginClient::new(self.channel.clone());
                let req = v1::NodeUnprepareResourcesRequest {
                    claims: claims.iter().map(Claim::to_v1).collect(),
                };
                let resp = self
                    .call(METHOD, c.node_unprepare_resources(self.request(req)))
                    .await?;
                resp.claims
                    .into_iter()
                    .map(|(uid, r)| {
                        (
                            uid,
                            UnprepareResult {
                                error: non_empty(r.error),
                            },
                        )
                    })
                    .collect()
            }
            DraVersion::V1beta1 => {
                let mut c = v1beta1::dra_plugin_client::DraPluginClient::new(self.channel.clone());
                let req = v1beta1::NodeUnprepareResourcesRequest {
                    claims: claims.iter().map(Claim::to_v1beta1).collect(),
                };
                let resp = self
                    .call(METHOD, c.node_unprepare_resources(self.request(req)))
                    .await?;
                resp.claims
                    .into_iter()
                    .map(|(uid, r)| {
                        (
                            uid,
                            UnprepareResult {
                                error: non_empty(r.error),
                            },
                        )
                    })
                    .collect()
            }
        };
        check_uids(METHOD, claims, answers.keys())?;
        Ok(answers)
    }

    /// Opens the health stream in the chosen health version.
    pub async fn watch_health(&self) -> Result<HealthStream, Error> {
        const METHOD: &str = "NodeWatchResources";
        let rpc = |status: tonic::Status| Error::Rpc {
            method: METHOD,
            code: status.code(),
            message: status.message().to_owned(),
        };
        match self.health_version {
            None => Err(Error::Unsupported(format!(
                "plugin {} serves no health version this kubelet knows",
                self.name
            ))),
            Some(HealthVersion::V1alpha1) => health_stream!(health_v1alpha1, self.channel, rpc),
            Some(HealthVersion::V1) => health_stream!(health_v1, self.channel, rpc),
        }
    }

    fn request<T>(&self, message: T) -> tonic::Request<T> {
        let mut r = tonic::Request::new(message);
        r.set_timeout(self.call_timeout);
        r
    }

    async fn call<T>(
        &self,
        method: &'static str,
        fut: impl Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    ) -> Result<T, Error> {
        match tokio::time::timeout(self.call_timeout, fut).await {
            Err(_) => Err(Error::Timeout {
                method,
                after: self.call_timeout,
            }),
            Ok(Err(status)) => Err(Error::Rpc {
                method,
                code: status.code(),
                message: status.message().to_owned(),
            }),
            Ok(Ok(r)) => Ok(r.into_inner()),
        }
    }
}

fn non_empty(s: String) -> Option<String> {
    (!s.is_empty()).then_some(s)
}

/// Kubelet's check of a response: its claim UIDs must be exactly the
/// requested ones (a missing UID is a failed call, so is an unexpected one).
pub fn check_uids<'a>(
    method: &'static str,
    requested: &[Claim],
    answered: impl IntoIterator<Item = &'a String>,
) -> Result<(), Error> {
    let requested: BTreeSet<&str> = requested.iter().map(|c| c.uid.as_str()).collect();
    let answered: BTreeSet<&str> = answered.into_iter().map(String::as_str).collect();
    let missing: Vec<String> = requested
        .difference(&answered)
        .map(|s| (*s).to_owned())
        .collect();
    let unexpected: Vec<String> = answered
        .difference(&requested)
        .map(|s| (*s).to_owned())
        .collect();
    if missing.is_empty() && unexpected.is_empty() {
        Ok(())
    } else {
        Err(Error::ResponseMismatch {
            method,
            missing,
            unexpected,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claims(uids: &[&str]) -> Vec<Claim> {
        uids.iter().map(|u| Claim::new("ns", "n", *u)).collect()
    }

    fn keys(uids: &[&str]) -> Vec<String> {
        uids.iter().map(|u| (*u).to_owned()).collect()
    }

    #[test]
    fn exact_answers_pass() {
        check_uids("M", &claims(&["a", "b"]), &keys(&["b", "a"])).unwrap();
        check_uids("M", &[], &keys(&[])).unwrap();
    }

    #[test]
    fn a_missing_uid_is_rejected() {
        let e =
            check_uids("NodePrepareResources", &claims(&["a", "b"]), &keys(&["a"])).unwrap_err();
        match e {
            Error::ResponseMismatch {
                missing,
                unexpected,
                ..
            } => {
                assert_eq!(missing, ["b"]);
                assert!(unexpected.is_empty());
            }
            other => panic!("{other}"),
        }
    }

    #[test]
    fn an_extra_uid_is_rejected() {
        let e = check_uids("M", &claims(&["a"]), &keys(&["a", "zzz"])).unwrap_err();
        assert!(e.to_string().contains("unexpected [\"zzz\"]"), "{e}");
    }
}
