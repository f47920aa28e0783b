//! Health, reported as envoyproxy/ratelimit reports it (`src/server/health.go`): the AND of its
//! components. The service is healthy unless it is stopping (the Go service's `sigterm`
//! component) or, with `HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED`, the configuration in force
//! has no domain (its `config` component: failed at start, made healthy by a configuration
//! with a domain, failed again by one without, left as it is by a refused one).
//!
//! Over xDS without `FORCE_START_WITHOUT_INITIAL_CONFIG` the Go service does not listen until
//! the control plane's first response (accepted or refused); here the ports are open, and health
//! fails until then, which a probe reads the same way.
//!
//! gRPC health answers for `""`, [`HEALTH_NAME`] and [`SERVICE_NAME`] alike (the Go service
//! answers for `ratelimit` alone, and leaves `""` at gRPC's default, `SERVING`, even while
//! stopping).

use std::sync::atomic::{AtomicBool, Ordering};

use crate::serving::proto::SERVICE_NAME;

/// The name the Go service registers its health under (`src/server/server_impl.go`), the one
/// Envoy's `grpc_health_check` with `service_name: ratelimit` asks for.
pub const HEALTH_NAME: &str = "ratelimit";

/// Every name gRPC health answers for: the server as a whole (`""`), the Go service's name,
/// and the rate limit service's own.
pub(crate) const HEALTH_NAMES: [&str; 3] = ["", HEALTH_NAME, SERVICE_NAME];

/// The components that decide health but the configuration's domains, which the service holds.
#[derive(Debug)]
pub(crate) struct Health {
    /// `HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED`.
    needs_domain: bool,
    /// Over xDS without `FORCE_START_WITHOUT_INITIAL_CONFIG`: no response from the control plane
    /// yet.
    waiting: AtomicBool,
    /// Stopping (SIGTERM, SIGINT or SIGHUP).
    draining: AtomicBool,
}

impl Health {
    /// Health for a service that needs a configuration with a domain (`needs_domain`), and
    /// that waits for the control plane's first response (`waiting`).
    pub(crate) fn new(needs_domain: bool, waiting: bool) -> Health {
        Health { needs_domain, waiting: AtomicBool::new(waiting), draining: AtomicBool::new(false) }
    }

    /// The control plane answered once (with a configuration put in force or refused).
    pub(crate) fn answered(&self) {
        // SeqCst here and below: a flag read by probes, not on the decisions' path; no other
        // memory is published through it.
        self.waiting.store(false, Ordering::SeqCst);
    }

    /// The service is stopping: unhealthy from now on.
    pub(crate) fn drain(&self) {
        self.draining.store(true, Ordering::SeqCst);
    }

    /// Whether the service is healthy, given whether the configuration in force has a domain.
    pub(crate) fn healthy(&self, has_domains: bool) -> bool {
        !self.draining.load(Ordering::SeqCst)
            && !self.waiting.load(Ordering::SeqCst)
            && (!self.needs_domain || has_domains)
    }
}

#[cfg(test)]
mod tests {
    use super::Health;

    #[test]
    fn components() {
        let plain = Health::new(false, false);
        assert!(plain.healthy(false) && plain.healthy(true));
        let needs = Health::new(true, false);
        assert!(!needs.healthy(false) && needs.healthy(true));
        let waiting = Health::new(false, true);
        assert!(!waiting.healthy(true));
        waiting.answered();
        assert!(waiting.healthy(false));
        waiting.drain();
        assert!(!waiting.healthy(true));
    }
}
