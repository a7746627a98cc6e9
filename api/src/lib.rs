//! Shared API of the GPU DRA driver, used by the kubelet plugin, the
//! controller and the admin CLI alike, so that what the webhook accepts is
//! exactly what the plugin can prepare.

pub mod schema;
pub mod quantity;
pub mod config;
pub mod cel;
pub mod allocator;
