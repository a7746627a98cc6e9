//! Cluster analysis of the GPU DRA driver, over the device contract of
//! `gpu-dra-api`: the CEL device environment ([`cel`]), the validation of
//! selectors and objects ([`validate`], the one engine behind the
//! admission webhook and `gpu-dra lint`) and the allocation simulator with
//! explanations ([`allocator`], behind the controller's unallocatable-claim
//! events and `gpu-dra simulate`). Used by the controller and the admin
//! CLI, never by the kubelet plugin, which needs only the contract (as
//! kube-runtime builds on kube-core).

pub mod allocator;
pub mod cel;
pub mod validate;
