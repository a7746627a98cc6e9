//! Claim preparation: what the plugin does to a node's GPUs when the kubelet
//! asks it to prepare or unprepare ResourceClaims, and the durable record of
//! it ([`checkpoint`]) that makes prepare idempotent, lets unprepare work
//! from local state alone and survives plugin crashes.

mod capped;
pub mod cdi;
pub mod checkpoint;
pub mod mig;
pub mod mps;
pub mod preparer;
pub mod timeslice;
