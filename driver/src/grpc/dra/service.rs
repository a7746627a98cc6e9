//! The `DRAPlugin` handlers: [`DraCore`] works on the internal claim form
//! and enforces kubelet's response contract; [`DraV1`] and [`DraV1beta1`]
//! only convert wire messages.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Instant;

use dra_proto::dra::{v1, v1beta1};
use tonic::{Request, Response, Status};

use super::claims::{self, Purpose};
use crate::grpc::metrics::nvidia::Operation as Nvidia;
use crate::grpc::metrics::{GrpcMetrics, Method, Operation, Outcome, Service};
use crate::prepare::claim::{ClaimError, ClaimPreparer, ClaimRef, ClaimResults, PreparedDevice};

/// Per-claim outcomes of one call, keyed by UID.
pub(crate) type Answers<T> = BTreeMap<String, Result<T, ClaimError>>;

/// Version-independent request handling.
#[derive(Clone)]
pub(crate) struct DraCore {
    preparer: Arc<dyn ClaimPreparer>,
    metrics: GrpcMetrics,
}

impl DraCore {
    pub(crate) fn new(preparer: Arc<dyn ClaimPreparer>, metrics: GrpcMetrics) -> Self {
        Self { preparer, metrics }
    }

    pub(crate) async fn prepare(&self, claims: Vec<ClaimRef>) -> Answers<Vec<PreparedDevice>> {
        let (valid, answers) = screen(claims, Purpose::Prepare);
        let started = Instant::now();
        let results = if valid.is_empty() {
            HashMap::new()
        } else {
            let _in_flight = self
                .metrics
                .nvidia()
                .in_flight(Nvidia::prepare, valid.len());
            self.preparer.prepare(&valid).await
        };
        let answers = self.finish(Operation::prepare, &valid, results, answers);
        let nvidia = self.metrics.nvidia();
        for (uid, r) in &answers {
            match r {
                Ok(devices) => {
                    nvidia.succeeded(Nvidia::prepare, started.elapsed());
                    nvidia.prepared(uid, devices.iter().map(|d| d.device_name.as_str()));
                }
                Err(_) => nvidia.failed(Nvidia::prepare),
            }
        }
        answers
    }

    pub(crate) async fn unprepare(&self, claims: Vec<ClaimRef>) -> Answers<()> {
        let (valid, answers) = screen(claims, Purpose::Unprepare);
        let started = Instant::now();
        let results = if valid.is_empty() {
            HashMap::new()
        } else {
            let _in_flight = self
                .metrics
                .nvidia()
                .in_flight(Nvidia::unprepare, valid.len());
            self.preparer.unprepare(&valid).await
        };
        let answers = self.finish(Operation::unprepare, &valid, results, answers);
        let nvidia = self.metrics.nvidia();
        for (uid, r) in &answers {
            if r.is_ok() {
                nvidia.succeeded(Nvidia::unprepare, started.elapsed());
                nvidia.unprepared(uid);
            } else {
                nvidia.failed(Nvidia::unprepare);
            }
        }
        answers
    }

    /// Merges the preparer's results into the answers: exactly one entry per
    /// requested UID, whatever the preparer returned. Logs and counts them.
    fn finish<T>(
        &self,
        operation: Operation,
        valid: &[ClaimRef],
        mut results: ClaimResults<T>,
        mut answers: Answers<T>,
    ) -> Answers<T> {
        for c in valid {
            let r = results
                .remove(&c.uid)
                .unwrap_or_else(|| Err(ClaimError::Missing(c.uid.clone())));
            answers.insert(c.uid.clone(), r);
        }
        for uid in results.keys() {
            tracing::warn!(claim = %uid, "dropping a result for a claim that was not requested");
        }
        for (uid, r) in &answers {
            match r {
                Ok(_) => {
                    tracing::debug!(claim = %uid, ?operation, "claim done");
                    self.metrics.claim(operation, Outcome::ok);
                }
                Err(e) => {
                    tracing::warn!(claim = %uid, ?operation, error = %e, "claim failed");
                    self.metrics.claim(operation, Outcome::error);
                }
            }
        }
        answers
    }
}

/// Splits a request into claims to hand to the preparer and answers that
/// are already known (invalid or duplicate claims).
pub(crate) fn screen<T>(claims: Vec<ClaimRef>, purpose: Purpose) -> (Vec<ClaimRef>, Answers<T>) {
    let mut count: HashMap<&str, usize> = HashMap::new();
    for c in &claims {
        *count.entry(c.uid.as_str()).or_default() += 1;
    }
    let duplicated: Vec<String> = count
        .into_iter()
        .filter(|&(_, n)| n > 1)
        .map(|(uid, _)| uid.to_owned())
        .collect();
    let mut answers = Answers::new();
    let mut valid = Vec::with_capacity(claims.len());
    for c in claims {
        if let Err(e) = claims::validate(&c, purpose) {
            answers.entry(c.uid).or_insert(Err(e));
        } else if duplicated.contains(&c.uid) {
            let uid = c.uid;
            answers
                .entry(uid.clone())
                .or_insert(Err(ClaimError::Duplicate(uid)));
        } else {
            valid.push(c);
        }
    }
    (valid, answers)
}

/// `DRAPlugin` in package `k8s.io.kubelet.pkg.apis.dra.v1`.
pub(crate) struct DraV1(pub(crate) DraCore);

/// `DRAPlugin` in package `k8s.io.kubelet.pkg.apis.dra.v1beta1`.
pub(crate) struct DraV1beta1(pub(crate) DraCore);

macro_rules! claim_refs {
    ($claims:expr) => {
        $claims
            .into_iter()
            .map(|c| ClaimRef {
                namespace: c.namespace,
                name: c.name,
                uid: c.uid,
            })
            .collect::<Vec<_>>()
    };
}

/// To the wire: a prepared device in kubelet's answer.
impl From<PreparedDevice> for v1::Device {
    fn from(d: PreparedDevice) -> Self {
        Self {
            request_names: d.request_names,
            pool_name: d.pool_name,
            device_name: d.device_name,
            cdi_device_ids: d.cdi_device_ids,
            share_id: d.share_id,
        }
    }
}

/// Back from the wire: a rolling update's waiting instance reads the
/// serving instance's answers (`grpc::handover`).
impl From<v1::Device> for PreparedDevice {
    fn from(d: v1::Device) -> Self {
        Self {
            request_names: d.request_names,
            pool_name: d.pool_name,
            device_name: d.device_name,
            cdi_device_ids: d.cdi_device_ids,
            share_id: d.share_id,
        }
    }
}

/// To the wire: the waiting instance's calls to the serving one.
impl From<&ClaimRef> for v1::Claim {
    fn from(c: &ClaimRef) -> Self {
        Self {
            namespace: c.namespace.clone(),
            name: c.name.clone(),
            uid: c.uid.clone(),
        }
    }
}

/// For v1: every prepared device can be described (fallible only to share
/// [`to_v1beta1`]'s signature in [`dra_plugin!`]).
#[allow(clippy::unnecessary_wraps)]
fn to_v1(_uid: &str, devices: Vec<PreparedDevice>) -> Result<Vec<v1::Device>, ClaimError> {
    Ok(devices.into_iter().map(v1::Device::from).collect())
}

/// Converts prepared devices for v1beta1, which has no share ID: a device
/// that carries one cannot be described to this kubelet.
fn to_v1beta1(uid: &str, devices: Vec<PreparedDevice>) -> Result<Vec<v1beta1::Device>, ClaimError> {
    devices
        .into_iter()
        .map(|d| {
            if let Some(share) = d.share_id {
                return Err(ClaimError::Unrepresentable(format!(
                    "claim {uid:?}: device {}/{} is allocated with share ID {share:?}, which DRAPlugin v1beta1 cannot carry; kubelet must use v1.DRAPlugin",
                    d.pool_name, d.device_name
                )));
            }
            Ok(v1beta1::Device {
                request_names: d.request_names,
                pool_name: d.pool_name,
                device_name: d.device_name,
                cdi_device_ids: d.cdi_device_ids,
            })
        })
        .collect()
}

/// The `DRAPlugin` service of one API version (`$api`, a module of
/// generated types) on [`DraCore`]: the two versions' messages have the
/// same fields but are distinct types, so one body serves both through
/// this macro; `$to_wire` converts the prepared devices.
macro_rules! dra_plugin {
    ($server:ty, $api:ident, $service:expr, $to_wire:path) => {
        #[tonic::async_trait]
        impl $api::dra_plugin_server::DraPlugin for $server {
            async fn node_prepare_resources(
                &self,
                request: Request<$api::NodePrepareResourcesRequest>,
            ) -> Result<Response<$api::NodePrepareResourcesResponse>, Status> {
                let claims = claim_refs!(request.into_inner().claims);
                tracing::debug!(
                    version = stringify!($api),
                    claims = claims.len(),
                    "NodePrepareResources"
                );
                let answers = self.0.prepare(claims).await;
                let claims = answers
                    .into_iter()
                    .map(|(uid, r)| {
                        let resp = match r.and_then(|devices| $to_wire(&uid, devices)) {
                            Ok(devices) => $api::NodePrepareResourceResponse {
                                devices,
                                error: String::new(),
                            },
                            Err(e) => $api::NodePrepareResourceResponse {
                                devices: Vec::new(),
                                error: e.to_string(),
                            },
                        };
                        (uid, resp)
                    })
                    .collect();
                self.0
                    .metrics
                    .request($service, Method::node_prepare_resources, Outcome::ok);
                Ok(Response::new($api::NodePrepareResourcesResponse { claims }))
            }

            async fn node_unprepare_resources(
                &self,
                request: Request<$api::NodeUnprepareResourcesRequest>,
            ) -> Result<Response<$api::NodeUnprepareResourcesResponse>, Status> {
                let claims = claim_refs!(request.into_inner().claims);
                tracing::debug!(
                    version = stringify!($api),
                    claims = claims.len(),
                    "NodeUnprepareResources"
                );
                let answers = self.0.unprepare(claims).await;
                let claims = answers
                    .into_iter()
                    .map(|(uid, r)| {
                        let error = r.err().map(|e| e.to_string()).unwrap_or_default();
                        (uid, $api::NodeUnprepareResourceResponse { error })
                    })
                    .collect();
                self.0
                    .metrics
                    .request($service, Method::node_unprepare_resources, Outcome::ok);
                Ok(Response::new($api::NodeUnprepareResourcesResponse {
                    claims,
                }))
            }
        }
    };
}

dra_plugin!(DraV1, v1, Service::dra_v1, to_v1);
dra_plugin!(DraV1beta1, v1beta1, Service::dra_v1beta1, to_v1beta1);

#[cfg(test)]
mod tests;
