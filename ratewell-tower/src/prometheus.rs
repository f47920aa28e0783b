//! Prometheus collectors (feature `prometheus`): [`ratewell_http::prometheus`]'s, for a layer.
//!
//! ```
//! use prometheus_client::registry::Registry;
//! use ratewell_tower::{Key, Limit, RateLimitLayer};
//!
//! let layer = RateLimitLayer::builder()
//!     .limit(Limit::new("ip", "token-bucket capacity=20 rate=10/s", Key::client_ip()))
//!     .build()?;
//! let mut registry = Registry::default();
//! registry.register_collector(Box::new(layer.collector()));
//! let mut text = String::new();
//! prometheus_client::encoding::text::encode(&mut text, &registry)?;
//! assert!(text.contains("ratewell_http_requests_total{limit=\"ip\",outcome=\"admitted\"} 0"));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! The metrics are listed in [`ratewell_http::prometheus`].

use std::sync::Arc;

use ratewell::Clock;
pub use ratewell_http::prometheus::{LayerCollector, LimiterCollector};

use crate::RateLimitLayer;

impl<C: Clock> RateLimitLayer<C> {
    /// A Prometheus collector of this layer's metrics (feature `prometheus`): register it
    /// once, and every scrape reads the counters every clone of the layer shares.
    pub fn collector(&self) -> LayerCollector<C> {
        LayerCollector::new(Arc::clone(self.http_limiter()))
    }
}
