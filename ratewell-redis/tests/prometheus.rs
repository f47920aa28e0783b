//! The Prometheus collectors read what the limiter and its leases counted: decisions by the
//! server and by the failover, the connection's state, leases.
#![cfg(feature = "prometheus")]

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::Server;
use prometheus_client::encoding::prometheus_text;
use prometheus_client::registry::Registry;
use ratewell_redis::prometheus::LeasesCollector;
use ratewell_redis::{Failover, Leases, RedisLimiter};

fn scrape(registry: &Registry) -> String {
    let mut text = String::new();
    prometheus_text::encode(&mut text, registry).unwrap();
    text
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_collectors_read_the_limiters_counters() {
    let mut server = Server::start();
    let limiter = RedisLimiter::builder(&server.url())
        .layer("l", &"fixed-window limit=3 window=1m".parse().unwrap())
        .timeout(Duration::from_millis(50))
        .failover(Failover::Open)
        .build()
        .await
        .unwrap();
    let leases = Arc::new(Leases::new(limiter.clone(), 16, 4, Duration::from_secs(1)));
    let mut registry = Registry::default();
    registry.register_collector(Box::new(limiter.collector()));
    registry.register_collector(Box::new(LeasesCollector::new(Arc::clone(&leases))));
    for _ in 0..5 {
        limiter.check("k", 1).await;
    }
    let text = scrape(&registry);
    assert!(text.contains("ratewell_redis_decisions_total{source=\"server\"} 5\n"), "{text}");
    assert!(text.contains("ratewell_redis_up 1\n"), "{text}");
    assert!(text.contains("ratewell_redis_script_loads_total 1\n"), "{text}");

    server.kill();
    for _ in 0..2 {
        assert!(limiter.check("k", 1).await.is_admitted(), "fail-open");
    }
    let m = limiter.metrics();
    let failed = m.failover_down + m.failover_timeout;
    assert_eq!(failed, 2);
    let text = scrape(&registry);
    assert!(text.contains("ratewell_redis_up 0\n"), "{text}");
    let down = format!("ratewell_redis_decisions_total{{source=\"down\"}} {}\n", m.failover_down);
    let timeout =
        format!("ratewell_redis_decisions_total{{source=\"timeout\"}} {}\n", m.failover_timeout);
    assert!(text.contains(&down) && text.contains(&timeout), "{text}");
    assert!(text.contains("ratewell_redis_leases_total 0\n"), "{text}");
}
