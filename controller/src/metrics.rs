//! The controller's one Prometheus registry, shared by every part of the
//! controller and served as `/metrics` beside the webhook.
//!
//! Each part registers its own metrics through [`SharedRegistry::register`]
//! (any time, also after the server has started), for example:
//!
//! ```
//! use prometheus_client::metrics::counter::Counter;
//! let registry = gpu_dra_controller::metrics::SharedRegistry::new();
//! let reconciles = Counter::<u64>::default();
//! registry.register(|r| {
//!     r.sub_registry_with_prefix("lifecycle")
//!         .register("reconciles", "Claims reconciled", reconciles.clone())
//! });
//! reconciles.inc();
//! assert!(registry.encode().contains("gpu_dra_controller_lifecycle_reconciles_total 1"));
//! ```

use std::sync::{Arc, PoisonError, RwLock};

use prometheus_client::registry::Registry;

/// Prefix of every metric of the controller.
pub const PREFIX: &str = "gpu_dra_controller";

/// Content type of [`SharedRegistry::encode`]'s output.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// A cheaply clonable handle on the controller's registry.
#[derive(Debug, Clone)]
pub struct SharedRegistry(Arc<RwLock<Registry>>);

impl Default for SharedRegistry {
    fn default() -> Self {
        Self::new()
    }
}

impl SharedRegistry {
    /// An empty registry whose metrics are all prefixed with [`PREFIX`].
    pub fn new() -> Self {
        SharedRegistry(Arc::new(RwLock::new(Registry::with_prefix(PREFIX))))
    }

    /// Runs `f` with the registry to register metrics (use
    /// `sub_registry_with_prefix` to namespace a part's metrics).
    pub fn register<R>(&self, f: impl FnOnce(&mut Registry) -> R) -> R {
        let mut registry = self.0.write().unwrap_or_else(PoisonError::into_inner);
        f(&mut registry)
    }

    /// All metrics in the OpenMetrics text format ([`CONTENT_TYPE`]).
    pub fn encode(&self) -> String {
        let registry = self.0.read().unwrap_or_else(PoisonError::into_inner);
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &registry);
        out
    }
}

#[cfg(test)]
mod tests {
    use prometheus_client::metrics::gauge::Gauge;

    use super::*;

    #[test]
    fn metrics_registered_after_cloning_show_up_in_every_handle() {
        let a = SharedRegistry::new();
        let b = a.clone();
        let g = Gauge::<i64>::default();
        b.register(|r| r.register("things", "Things", g.clone()));
        g.set(7);
        let text = a.encode();
        assert!(text.contains("gpu_dra_controller_things 7"), "{text}");
        assert!(text.ends_with("# EOF\n"), "{text}");
    }
}
