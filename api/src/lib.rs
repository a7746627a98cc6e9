//! The device contract of the GPU DRA driver: what a GPU device looks like
//! to Kubernetes and what a claim may say about it. The attribute schema
//! ([`schema`]: the one table the plugin publishes from and every checker
//! reads), the opaque config types ([`config`]) and Kubernetes quantities
//! ([`quantity`]), and the health taint keys devices carry ([`health`]).
//! Used by everyone, the kubelet plugin included, so it holds types and
//! their rules and nothing that evaluates a cluster: the CEL environment,
//! validation and the allocation simulator live in `gpu-dra-analysis`, as
//! kube-core keeps types apart from kube-runtime.

pub mod config;
pub mod health;
pub mod quantity;
pub mod schema;
