//! Shared API of the GPU DRA driver, used by the kubelet plugin, the
//! controller and the admin CLI alike, so that what the webhook accepts is
//! exactly what the plugin can prepare.

pub mod allocator;
pub mod cel;
pub mod config;
pub mod quantity;
pub mod schema;
pub mod validate;
