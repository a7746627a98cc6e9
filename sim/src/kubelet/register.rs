//! [`KubeletSim::register`]: the simulated kubelet's registration of one
//! plugin socket (`GetInfo`, kubelet's checks, the version choice,
//! `NotifyRegistrationStatus`).

use std::path::{Path, PathBuf};

use dra_proto::registration::registration_client::RegistrationClient;
use dra_proto::registration::{InfoRequest, PluginInfo, RegistrationStatus};

use super::conn::channel;
use super::plugin::Plugin;
use super::{DraVersion, Error, HealthVersion, KubeletSim, REGISTER_RETRY, REGISTER_TRIES};

impl KubeletSim {
    /// Registers the plugin behind `socket` as kubelet does: `GetInfo`
    /// (1 s deadline), validation, version choice, then
    /// `NotifyRegistrationStatus` with the verdict. A rejection is returned
    /// as [`Error::Rejected`] after the plugin has been told. A `GetInfo`
    /// past its deadline (a plugin busy starting up) is tried again after a
    /// second, as kubelet's reconciler does, up to [`REGISTER_TRIES`] tries
    /// in all; any other failure is returned at once.
    pub async fn register(&self, socket: &Path) -> Result<Plugin, Error> {
        let mut tries = 1;
        loop {
            match self.register_checked(socket, |_| Ok(())).await {
                Err(Error::Timeout { method, after })
                    if method == "GetInfo" && tries < REGISTER_TRIES =>
                {
                    tracing::debug!(socket = %socket.display(), ?after, tries, "GetInfo timed out; retrying");
                    tries += 1;
                    tokio::time::sleep(REGISTER_RETRY).await;
                }
                other => return other,
            }
        }
    }

    /// [`register`](Self::register) with one more check of the endpoint
    /// before the verdict is sent (the registrar's "endpoint already
    /// registered").
    pub(crate) async fn register_checked(
        &self,
        socket: &Path,
        check: impl FnOnce(&Path) -> Result<(), String>,
    ) -> Result<Plugin, Error> {
        let mut client = RegistrationClient::new(channel(socket, &self.authority)?);
        let mut request = tonic::Request::new(InfoRequest {});
        request.set_timeout(self.get_info_timeout);
        // Past the deadline here, or at the plugin's server, which
        // enforces the deadline it was sent too (tonic answers `Cancelled`,
        // "Timeout expired"): the same miss.
        let answer = tokio::time::timeout(self.get_info_timeout, client.get_info(request))
            .await
            .unwrap_or_else(|_| Err(tonic::Status::deadline_exceeded("no answer in time")));
        let info = match answer {
            Err(status)
                if matches!(
                    status.code(),
                    tonic::Code::DeadlineExceeded | tonic::Code::Cancelled
                ) =>
            {
                return Err(Error::Timeout {
                    method: "GetInfo",
                    after: self.get_info_timeout,
                });
            }
            Err(status) => {
                return Err(Error::Rpc {
                    method: "GetInfo",
                    code: status.code(),
                    message: status.message().to_owned(),
                });
            }
            Ok(r) => r.into_inner(),
        };
        let verdict = self
            .validate(socket, &info)
            .and_then(|v| check(&v.0).map(|()| v));
        let notify = RegistrationStatus {
            plugin_registered: verdict.is_ok(),
            error: verdict.as_ref().err().cloned().unwrap_or_default(),
        };
        client
            .notify_registration_status(notify)
            .await
            .map_err(|status| Error::Rpc {
                method: "NotifyRegistrationStatus",
                code: status.code(),
                message: status.message().to_owned(),
            })?;
        match verdict {
            Ok((endpoint, dra_version, health_version)) => Ok(Plugin::new(
                info,
                socket.to_owned(),
                endpoint,
                dra_version,
                health_version,
                self,
            )?),
            Err(reason) => Err(Error::Rejected {
                socket: socket.to_owned(),
                reason,
            }),
        }
    }

    /// Kubelet's checks of a `PluginInfo`; `Err` is the reason sent back.
    pub(crate) fn validate(
        &self,
        socket: &Path,
        info: &PluginInfo,
    ) -> Result<(PathBuf, DraVersion, Option<HealthVersion>), String> {
        if info.r#type != dra_proto::DRA_PLUGIN_TYPE {
            return Err(format!(
                "no handler registered for plugin type: {:?}",
                info.r#type
            ));
        }
        if info.name.is_empty() {
            return Err("plugin name is empty".to_owned());
        }
        let endpoint = if info.endpoint.is_empty() {
            socket.to_owned()
        } else {
            PathBuf::from(&info.endpoint)
        };
        if !endpoint.is_absolute() {
            return Err(format!(
                "endpoint {:?} of plugin {} is not an absolute path",
                info.endpoint, info.name
            ));
        }
        let dra_version = info
            .supported_versions
            .iter()
            .filter_map(|v| DraVersion::parse(v))
            .find(|v| self.dra_versions.contains(v))
            .ok_or_else(|| {
                format!(
                    "none of the versions {:?} of plugin {} is supported; this kubelet supports {:?}",
                    info.supported_versions,
                    info.name,
                    self.dra_versions.iter().map(|v| v.as_str()).collect::<Vec<_>>()
                )
            })?;
        let health_version = info
            .supported_versions
            .iter()
            .filter_map(|v| HealthVersion::parse(v))
            .find(|v| self.health_versions.contains(v));
        Ok((endpoint, dra_version, health_version))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(versions: &[&str]) -> PluginInfo {
        PluginInfo {
            r#type: "DRAPlugin".into(),
            name: "gpu.nvidia.com".into(),
            endpoint: "/p/gpu.nvidia.com/dra.sock".into(),
            supported_versions: versions.iter().map(|s| (*s).to_owned()).collect(),
        }
    }

    const ALL: [&str; 4] = [
        "v1.DRAPlugin",
        "v1beta1.DRAPlugin",
        "v1alpha1.DRAResourceHealth",
        "v1.DRAResourceHealth",
    ];

    #[test]
    fn the_plugins_order_decides_the_version() {
        let sim = KubeletSim::new();
        let (ep, v, h) = sim.validate(Path::new("/r/x.sock"), &info(&ALL)).unwrap();
        assert_eq!(ep, Path::new("/p/gpu.nvidia.com/dra.sock"));
        assert_eq!(v, DraVersion::V1);
        assert_eq!(h, Some(HealthVersion::V1alpha1));
        // Same kubelet, plugin preferring v1beta1: v1beta1 is chosen.
        let (_, v, _) = sim
            .validate(
                Path::new("/r/x.sock"),
                &info(&["v1beta1.DRAPlugin", "v1.DRAPlugin"]),
            )
            .unwrap();
        assert_eq!(v, DraVersion::V1beta1);
    }

    #[test]
    fn an_old_kubelet_picks_v1beta1_and_no_health() {
        let sim = KubeletSim::new()
            .with_dra_versions([DraVersion::V1beta1])
            .with_health_versions([]);
        let (_, v, h) = sim.validate(Path::new("/r/x.sock"), &info(&ALL)).unwrap();
        assert_eq!(v, DraVersion::V1beta1);
        assert_eq!(h, None);
    }

    #[test]
    fn bad_plugin_info_is_rejected_with_a_reason() {
        let sim = KubeletSim::new();
        let s = Path::new("/r/x.sock");
        let mut i = info(&ALL);
        i.r#type = "CSIPlugin".into();
        assert!(sim.validate(s, &i).unwrap_err().contains("plugin type"));
        let mut i = info(&ALL);
        i.name = String::new();
        assert!(sim.validate(s, &i).unwrap_err().contains("name is empty"));
        let mut i = info(&ALL);
        i.endpoint = "relative/dra.sock".into();
        assert!(sim.validate(s, &i).unwrap_err().contains("absolute"));
        let e = sim
            .validate(s, &info(&["v1alpha3.Node", "v1alpha1.DRAResourceHealth"]))
            .unwrap_err();
        assert!(e.contains("none of the versions"), "{e}");
        assert!(sim.validate(s, &info(&[])).is_err());
        // An empty endpoint means the registration socket itself.
        let mut i = info(&ALL);
        i.endpoint = String::new();
        assert_eq!(sim.validate(s, &i).unwrap().0, s);
    }
}
