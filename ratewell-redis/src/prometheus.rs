//! Prometheus collectors (feature `prometheus`, on [prometheus-client]): what a
//! [`RedisLimiter`] and its [`Leases`] did, read from their counters at each scrape.
//!
//! ```no_run
//! use prometheus_client::registry::Registry;
//! use ratewell_redis::RedisLimiter;
//!
//! # async fn run() -> Result<(), ratewell_redis::Error> {
//! let limiter = RedisLimiter::builder("redis://127.0.0.1:6379")
//!     .layer("per-client", &"token-bucket capacity=20 rate=10/s".parse().unwrap())
//!     .build()
//!     .await?;
//! let mut registry = Registry::default();
//! registry.register_collector(Box::new(limiter.collector()));
//! # Ok(()) }
//! ```
//!
//! | metric | type | labels | what |
//! |---|---|---|---|
//! | `ratewell_redis_decisions_total` | counter | `source` | decisions by who made them: `server`, or the failover for a `timeout`, a connection `down` or a `bad_reply` |
//! | `ratewell_redis_up` | gauge | | 1 while the connection is up, 0 while decisions fail over |
//! | `ratewell_redis_script_loads_total` | counter | | times the script was loaded into a server |
//! | `ratewell_redis_disconnects_total` | counter | | times the connection was marked down |
//! | `ratewell_redis_reconnects_total` | counter | | times a probe found the server back |
//! | `ratewell_redis_refunds_total` | counter | | charges taken back |
//! | `ratewell_redis_calls_total` | counter | `path` | calls of the server's code (one request each, or a batch), by what decided them: the native `module` (ratewell-redis-module) or the function `library` |
//! | `ratewell_redis_lease_units_total` | counter | `outcome` | lease units: `leased` from the server, `returned` to it, `spent` in process |
//! | `ratewell_redis_leases_total` | counter | | leases taken |
//! | `ratewell_redis_lease_round_trips_total` | counter | | requests decided by a round trip instead of a lease |
//!
//! [prometheus-client]: https://docs.rs/prometheus-client

use std::fmt;
use std::sync::Arc;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;

use crate::{Leases, RedisLimiter};

/// A [`Collector`] of a [`RedisLimiter`]'s metrics (see the [module](self)); made by
/// [`RedisLimiter::collector`], it shares the limiter's counters.
#[derive(Debug)]
pub struct RedisCollector {
    limiter: RedisLimiter,
}

/// A [`Collector`] of [`Leases`]' metrics (see the [module](self)).
#[derive(Debug)]
pub struct LeasesCollector {
    leases: Arc<Leases>,
}

impl LeasesCollector {
    /// A collector of `leases`' metrics.
    pub fn new(leases: Arc<Leases>) -> Self {
        LeasesCollector { leases }
    }
}

impl RedisLimiter {
    /// A Prometheus [`Collector`] of this limiter's metrics (feature `prometheus`).
    pub fn collector(&self) -> RedisCollector {
        RedisCollector { limiter: self.clone() }
    }
}

/// A counter with one label.
fn labelled<const N: usize>(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    label: &str,
    samples: [(&str, u64); N],
) -> fmt::Result {
    let mut metric = encoder.encode_descriptor(name, help, None, MetricType::Counter)?;
    for (value, n) in samples {
        ConstCounter::new(n).encode(metric.encode_family(&[(label, value)])?)?;
    }
    Ok(())
}

/// A counter without labels.
fn counter(encoder: &mut DescriptorEncoder, name: &str, help: &str, n: u64) -> fmt::Result {
    ConstCounter::new(n).encode(encoder.encode_descriptor(name, help, None, MetricType::Counter)?)
}

impl Collector for RedisCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> fmt::Result {
        let m = self.limiter.metrics();
        labelled(
            &mut encoder,
            "ratewell_redis_decisions",
            "Decisions, by who made them: the server, or the failover and why.",
            "source",
            [
                ("server", m.server),
                ("timeout", m.failover_timeout),
                ("down", m.failover_down),
                ("bad_reply", m.failover_bad_reply),
            ],
        )?;
        let up = i64::from(!self.limiter.is_down());
        ConstGauge::new(up).encode(encoder.encode_descriptor(
            "ratewell_redis_up",
            "1 while the connection is up, 0 while decisions fail over.",
            None,
            MetricType::Gauge,
        )?)?;
        counter(
            &mut encoder,
            "ratewell_redis_script_loads",
            "Times the script was loaded into a server.",
            m.script_loads,
        )?;
        counter(
            &mut encoder,
            "ratewell_redis_disconnects",
            "Times the connection was marked down.",
            m.disconnects,
        )?;
        counter(
            &mut encoder,
            "ratewell_redis_reconnects",
            "Times a probe found the server back.",
            m.reconnects,
        )?;
        counter(&mut encoder, "ratewell_redis_refunds", "Charges taken back.", m.refunds)?;
        labelled(
            &mut encoder,
            "ratewell_redis_calls",
            "Calls of the server's code, each carrying one request or a batch of them, by what \
             decided them: the native module or the function library.",
            "path",
            [("module", m.module_calls), ("library", m.calls.saturating_sub(m.module_calls))],
        )
    }
}

impl Collector for LeasesCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> fmt::Result {
        let m = self.leases.metrics();
        labelled(
            &mut encoder,
            "ratewell_redis_lease_units",
            "Lease units: leased from the server, returned to it, spent in process.",
            "outcome",
            [("leased", m.leased_units), ("returned", m.returned_units), ("spent", m.local_units)],
        )?;
        counter(&mut encoder, "ratewell_redis_leases", "Leases taken from the server.", m.leases)?;
        counter(
            &mut encoder,
            "ratewell_redis_lease_round_trips",
            "Requests decided by a round trip instead of a lease.",
            m.round_trips,
        )?;
        counter(
            &mut encoder,
            "ratewell_redis_lease_evictions",
            "Keys gone cold that gave their slot to another.",
            m.evictions,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_sets_encode_as_prometheus_text() {
        #[derive(Debug)]
        struct Fixed;
        impl Collector for Fixed {
            fn encode(&self, mut encoder: DescriptorEncoder) -> fmt::Result {
                labelled(&mut encoder, "x", "An x.", "source", [("server", 3), ("down", 1)])?;
                counter(&mut encoder, "y", "A y.", 2)
            }
        }
        let mut registry = prometheus_client::registry::Registry::default();
        registry.register_collector(Box::new(Fixed));
        let mut text = String::new();
        prometheus_client::encoding::prometheus_text::encode(&mut text, &registry).unwrap();
        assert_eq!(
            text,
            "# HELP x_total An x.\n# TYPE x_total counter\nx_total{source=\"server\"} 3\n\
             x_total{source=\"down\"} 1\n# HELP y_total A y.\n# TYPE y_total counter\ny_total 2\n"
        );
    }
}
