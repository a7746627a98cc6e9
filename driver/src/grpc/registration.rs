//! The plugin registration service kubelet's plugin watcher calls on
//! `<registrar-dir>/<driver>-reg.sock`: `GetInfo` says who we are and where
//! the DRA socket is; `NotifyRegistrationStatus` carries kubelet's verdict.

use dra_proto::registration::registration_server::Registration;
use dra_proto::registration::{
    InfoRequest, PluginInfo, RegistrationStatus as WireStatus, RegistrationStatusResponse,
};
use tokio::sync::watch;
use tonic::{Request, Response, Status};

use super::metrics::{GrpcMetrics, Method, Outcome, Service};

/// What kubelet last said about the registration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RegistrationStatus {
    /// Kubelet has not answered yet.
    Pending,
    /// Kubelet registered the plugin.
    Registered,
    /// Kubelet rejected the plugin, with its reason.
    Rejected(String),
}

/// The `pluginregistration.Registration` implementation.
pub(crate) struct RegistrationService {
    info: PluginInfo,
    status: watch::Sender<RegistrationStatus>,
    metrics: GrpcMetrics,
}

impl RegistrationService {
    pub(crate) fn new(
        info: PluginInfo,
        status: watch::Sender<RegistrationStatus>,
        metrics: GrpcMetrics,
    ) -> Self {
        Self {
            info,
            status,
            metrics,
        }
    }
}

#[tonic::async_trait]
impl Registration for RegistrationService {
    async fn get_info(&self, _: Request<InfoRequest>) -> Result<Response<PluginInfo>, Status> {
        tracing::debug!(driver = %self.info.name, "kubelet asked for plugin info");
        self.metrics
            .request(Service::registration, Method::get_info, Outcome::ok);
        Ok(Response::new(self.info.clone()))
    }

    async fn notify_registration_status(
        &self,
        request: Request<WireStatus>,
    ) -> Result<Response<RegistrationStatusResponse>, Status> {
        let status = request.into_inner();
        let new = if status.plugin_registered {
            tracing::info!(driver = %self.info.name, "kubelet registered the plugin");
            RegistrationStatus::Registered
        } else {
            tracing::error!(
                driver = %self.info.name,
                reason = %status.error,
                "kubelet rejected the plugin registration"
            );
            RegistrationStatus::Rejected(status.error)
        };
        self.metrics
            .set_registered(new == RegistrationStatus::Registered);
        self.metrics.request(
            Service::registration,
            Method::notify_registration_status,
            Outcome::ok,
        );
        self.status.send_replace(new);
        Ok(Response::new(RegistrationStatusResponse {}))
    }
}
