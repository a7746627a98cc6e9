//! Simulated peers of the driver, the backends of the demo and of the
//! tests: a Kubernetes API server stand-in ([`apiserver`], binary
//! `test-apiserver`), a kubelet simulator ([`kubelet`], binary
//! `kubelet-sim`), and the scheduler's judgement of a complete pool
//! ([`pool`]). They are doubles, not the real peers: the real API server,
//! kubelet, scheduler and container runtime run in `gpu-dra-e2e`'s
//! real-cluster tests, and the stand-in API server is checked against the
//! real one there.
//!
//! What the doubles do *not* model:
//!
//! - the API server: authentication and authorization, admission
//!   (webhooks, policies), finalizers and graceful deletion, namespace
//!   existence, CEL compilation, defaulting beyond ResourceClaim requests,
//!   protobuf, lists at an old resourceVersion, and every resource and
//!   patch type the driver's programs do not send (the list is in
//!   [`apiserver`]);
//! - kubelet: pods and containers, its claim cache and checkpoint,
//!   retries of failed prepares by pod syncs, and the container runtime's
//!   CDI injection: the simulator registers plugins, calls
//!   NodePrepareResources / NodeUnprepareResources and watches health,
//!   nothing else.

pub mod apiserver;
pub mod kubelet;
pub mod pool;
