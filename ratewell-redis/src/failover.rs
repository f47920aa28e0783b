//! [`Failover`]: what decides when the server cannot, chosen when a limiter is built.

/// What a decision is when the server cannot make it: chosen when the limiter is built.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Failover {
    /// Admit the request (availability over the limit). The decision reports the whole limit as
    /// remaining: nothing was counted.
    Open,
    /// Reject it, with `retry_after` the current reconnect backoff.
    Closed,
    /// Decide it in process, with every layer's limits divided by `instances` (the number of
    /// processes sharing the limit), so that the instances together stay near the policy.
    Local {
        /// How many instances share the limit (at least 1).
        instances: u32,
    },
}
