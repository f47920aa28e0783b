//! Prometheus collectors (feature `prometheus`, on [prometheus-client]): what a limiter of
//! requests and its engine decided, read from their counters at each scrape. Nothing is counted
//! twice and nothing is added to the request path: the collectors read [`HttpLimiter::metrics`] and
//! [`LayeredLimiter::metrics`].
//!
//! ```
//! use prometheus_client::registry::Registry;
//! use std::sync::Arc;
//! use ratewell_http::{HttpLimiter, Key, Limit};
//! use ratewell_http::prometheus::LayerCollector;
//!
//! let limiter = Arc::new(HttpLimiter::builder()
//!     .limit(Limit::new("ip", "token-bucket capacity=20 rate=10/s", Key::client_ip()))
//!     .build()?);
//! let mut registry = Registry::default();
//! registry.register_collector(Box::new(LayerCollector::new(limiter)));
//! let mut text = String::new();
//! prometheus_client::encoding::text::encode(&mut text, &registry)?;
//! assert!(text.contains("ratewell_http_requests_total{limit=\"ip\",outcome=\"admitted\"} 0"));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! | metric | type | labels | what |
//! |---|---|---|---|
//! | `ratewell_http_requests_total` | counter | `limit`, `outcome` | requests each limit of the layer decided: `admitted`, `rejected`, `would_reject` (a dry run let it through), `skipped` (no key), `absent_rejected` (no key, answered 400/401) |
//! | `ratewell_http_forwarded_total` | counter | `outcome` | forwarding headers ignored: `untrusted` (from a peer that is not a trusted proxy), `malformed` |
//! | `ratewell_http_missing_peer_total` | counter | | requests with no peer address |
//! | `ratewell_http_delayed_total` | counter | | requests that waited a leaky bucket's delay |
//! | `ratewell_http_delay_refunds_total` | counter | | delayed requests dropped before the inner service (refunded) |
//! | `ratewell_decisions_total` | counter | `limit`, `outcome` | the engine's decisions per limit, `admitted` or `rejected` ([`LimiterCollector`] only: a layer's are its requests) |
//! | `ratewell_refunds_total` | counter | `limit` | admissions taken back (another limit rejected, a delayed request dropped) |
//! | `ratewell_keys` | gauge | `limit` | keys holding state in the limit's table |
//! | `ratewell_key_capacity` | gauge | `limit` | keys the table can hold (its memory bound) |
//! | `ratewell_table_events_total` | counter | `limit`, `event` | the table's `reclaims` (fresh keys dropped, no decision changed), `evictions` (live keys evicted), `refusals` (new keys refused), `relocations` (keys placed by moving others) |
//!
//! [prometheus-client]: https://docs.rs/prometheus-client

use std::fmt;
use std::sync::Arc;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use ratewell::{Clock, LayeredLimiter, QuantaClock};

use crate::HttpLimiter;

/// A [`Collector`] of an [`HttpLimiter`]'s metrics and its tables': see the [module](self).
/// It shares the limiter's counters (an adapter's `collector()` makes one).
pub struct LayerCollector<C: Clock = QuantaClock> {
    layer: Arc<HttpLimiter<C>>,
}

/// A [`Collector`] of a [`LayeredLimiter`]'s decisions and tables, for the engine used
/// without the tower layer: see the [module](self).
///
/// ```
/// use std::sync::Arc;
/// use ratewell::{Layer, LayeredLimiter, Policy};
/// use ratewell_http::prometheus::LimiterCollector;
///
/// let policy: Policy = "fixed-window limit=100 window=1m".parse()?;
/// let limiter = Arc::new(LayeredLimiter::new(vec![Layer::new("tenant", &policy)])?);
/// let mut registry = prometheus_client::registry::Registry::default();
/// registry.register_collector(Box::new(LimiterCollector::new(Arc::clone(&limiter))));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct LimiterCollector<C: Clock = QuantaClock> {
    limiter: Arc<LayeredLimiter<C>>,
}

impl<C: Clock> LimiterCollector<C> {
    /// A collector of `limiter`'s metrics.
    pub fn new(limiter: Arc<LayeredLimiter<C>>) -> Self {
        LimiterCollector { limiter }
    }
}

impl<C: Clock> LayerCollector<C> {
    /// A collector of `limiter`'s metrics.
    pub fn new(limiter: Arc<HttpLimiter<C>>) -> Self {
        LayerCollector { layer: limiter }
    }
}

impl<C: Clock> fmt::Debug for LayerCollector<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LayerCollector").field("layer", &self.layer).finish()
    }
}

impl<C: Clock> fmt::Debug for LimiterCollector<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LimiterCollector").field("layers", &self.limiter.len()).finish()
    }
}

/// One metric family: its descriptor, then one sample per label set.
fn family<'a, const N: usize>(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    kind: MetricType,
    samples: impl IntoIterator<Item = ([(&'a str, &'a str); N], u64)>,
) -> fmt::Result {
    let mut metric = encoder.encode_descriptor(name, help, None, kind)?;
    for (labels, value) in samples {
        let sample = metric.encode_family(&labels)?;
        match kind {
            MetricType::Gauge => ConstGauge::new(value).encode(sample)?,
            _ => ConstCounter::new(value).encode(sample)?,
        }
    }
    Ok(())
}

/// A metric without labels.
fn single(encoder: &mut DescriptorEncoder, name: &str, help: &str, value: u64) -> fmt::Result {
    let metric = encoder.encode_descriptor(name, help, None, MetricType::Counter)?;
    ConstCounter::new(value).encode(metric)
}

/// The tables of `limiter`'s layers: refunds, keys, capacity and the table's events.
fn tables<C: Clock>(limiter: &LayeredLimiter<C>, encoder: &mut DescriptorEncoder) -> fmt::Result {
    let layers: Vec<(&str, ratewell::Metrics)> = (0..limiter.len())
        .map(|i| (limiter.name(i).unwrap_or_default(), limiter.metrics(i).unwrap_or_default()))
        .collect();
    let each = |f: fn(&ratewell::Metrics) -> u64| {
        layers.iter().map(move |(name, m)| ([("limit", *name)], f(m)))
    };
    family(
        encoder,
        "ratewell_refunds",
        "Admissions taken back (another limit rejected the request, or it was dropped while delayed).",
        MetricType::Counter,
        each(|m| m.refunds),
    )?;
    family(
        encoder,
        "ratewell_keys",
        "Keys holding state in the limit's table.",
        MetricType::Gauge,
        each(|m| m.keys),
    )?;
    family(
        encoder,
        "ratewell_key_capacity",
        "Keys the limit's table can hold (its memory bound).",
        MetricType::Gauge,
        each(|m| m.capacity),
    )?;
    let events = layers.iter().flat_map(|(name, m)| {
        [
            ("reclaims", m.reclaims),
            ("evictions", m.evictions),
            ("refusals", m.refused),
            ("relocations", m.relocations),
        ]
        .map(|(event, n)| ([("limit", *name), ("event", event)], n))
    });
    family(
        encoder,
        "ratewell_table_events",
        "Key table events: fresh keys reclaimed, live keys evicted, new keys refused, keys placed by relocation.",
        MetricType::Counter,
        events,
    )
}

impl<C: Clock + Send + Sync + 'static> Collector for LayerCollector<C> {
    fn encode(&self, mut encoder: DescriptorEncoder) -> fmt::Result {
        let m = self.layer.metrics();
        let outcomes = m.layers.iter().flat_map(|l| {
            [
                ("admitted", l.admitted),
                ("rejected", l.rejected),
                ("would_reject", l.would_reject),
                ("skipped", l.skipped),
                ("absent_rejected", l.absent_rejected),
            ]
            .map(|(outcome, n)| ([("limit", l.name.as_str()), ("outcome", outcome)], n))
        });
        family(
            &mut encoder,
            "ratewell_http_requests",
            "Requests each limit decided, by outcome.",
            MetricType::Counter,
            outcomes,
        )?;
        family(
            &mut encoder,
            "ratewell_http_forwarded",
            "Forwarding headers ignored: from a peer that is not a trusted proxy, or malformed.",
            MetricType::Counter,
            [
                ([("outcome", "untrusted")], m.forwarded_untrusted),
                ([("outcome", "malformed")], m.forwarded_malformed),
            ],
        )?;
        single(
            &mut encoder,
            "ratewell_http_missing_peer",
            "Requests without a peer address.",
            m.missing_peer,
        )?;
        single(
            &mut encoder,
            "ratewell_http_delayed",
            "Requests that waited a leaky bucket's delay.",
            m.delayed,
        )?;
        single(
            &mut encoder,
            "ratewell_http_delay_refunds",
            "Delayed requests dropped before reaching the inner service (refunded).",
            m.delay_refunds,
        )?;
        tables(self.layer.limiter(), &mut encoder)
    }
}

impl<C: Clock + Send + Sync + 'static> Collector for LimiterCollector<C> {
    fn encode(&self, mut encoder: DescriptorEncoder) -> fmt::Result {
        let limiter = &self.limiter;
        let decisions = (0..limiter.len()).flat_map(|i| {
            let name = limiter.name(i).unwrap_or_default();
            let m = limiter.metrics(i).unwrap_or_default();
            [("admitted", m.admitted), ("rejected", m.rejected)]
                .map(|(outcome, n)| ([("limit", name), ("outcome", outcome)], n))
        });
        family(
            &mut encoder,
            "ratewell_decisions",
            "The engine's decisions per limit, by outcome.",
            MetricType::Counter,
            decisions,
        )?;
        tables(limiter, &mut encoder)
    }
}
