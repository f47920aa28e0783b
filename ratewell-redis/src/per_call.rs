//! [`PerCallLimiter`]: decisions whose policies, costs and roles are named per call, all in one
//! script call, all or nothing on the server (what a rate limit service needs, whose every rule
//! carries its own limit).

use std::sync::Arc;

use ratewell::{Decision, Policy};

use crate::batch::Request;
use crate::conn::Shared;
use crate::error::Error;
use crate::keys::slot;
use crate::metrics::Metrics;
use crate::script::Compiled;

/// A policy compiled for the script once, to name in any number of calls.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CallPolicy {
    policy: Policy,
    compiled: Compiled,
    /// The algorithm and its six parameters, as the script takes them.
    args: Vec<String>,
}

impl CallPolicy {
    /// Compile `policy`, or say which bound of the script's exact arithmetic it breaks.
    ///
    /// ```
    /// use ratewell_redis::CallPolicy;
    ///
    /// let policy = CallPolicy::new(&"fixed-window limit=20 window=1m".parse().unwrap()).unwrap();
    /// assert_eq!(policy.policy().to_string(), "fixed-window limit=20 window=1m");
    /// ```
    pub fn new(policy: &Policy) -> Result<Self, Error> {
        let compiled = Compiled::new(policy)?;
        let mut args = Vec::with_capacity(8);
        compiled.push_args(&mut args);
        args.pop(); // the dry-run flag: a call names the mode
        Ok(CallPolicy { policy: policy.clone(), compiled, args })
    }

    /// The policy.
    pub fn policy(&self) -> &Policy {
        &self.policy
    }
}

/// What one limit of a call does to the call's answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// The call is admitted only if this limit admits it.
    Enforce,
    /// Decided, and charged if the call is admitted and the cost fits; never rejecting.
    DryRun,
    /// Rejecting only when every quota limit of the call rejects; charged as a dry run is.
    Quota,
    /// Decided, never charged, reported as a peek is (the state before the call).
    Read,
}

impl Mode {
    fn flag(self) -> &'static str {
        match self {
            Mode::Enforce => "0",
            Mode::DryRun => "1",
            Mode::Quota => "q",
            Mode::Read => "r",
        }
    }
}

/// One limit of a call: the key (stored under the limiter's prefix), its policy, its cost and
/// its mode.
#[derive(Clone, Copy, Debug)]
pub struct CallItem<'a> {
    /// The key, without the prefix.
    pub key: &'a str,
    /// Its policy.
    pub policy: &'a CallPolicy,
    /// Its cost (0 is taken as 1: read a state with [`Mode::Read`]).
    pub cost: u32,
    /// What it does to the call's answer.
    pub mode: Mode,
}

/// What the server decided for a call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CallDecision {
    /// Whether the call was admitted: every enforced limit admits it, and not every quota limit
    /// (if there is one) rejects it. Only an admitted call charges anything.
    pub admitted: bool,
    /// Per item, in order: its decision (for an item not charged, the state before the call).
    pub decisions: Vec<Decision>,
    /// The server's time of the decision, in microseconds since the Unix epoch.
    pub now_us: u64,
    /// Per item, what its charge stored and replaced (empty where nothing was charged): what
    /// [`PerCallLimiter::refund`] gives back.
    receipts: Vec<Vec<u8>>,
}

impl CallDecision {
    /// Whether item `i` was charged (the call was admitted, the item is not [`Mode::Read`] and
    /// its cost fitted).
    pub fn charged(&self, i: usize) -> bool {
        self.receipts.get(i).is_some_and(|r| !r.is_empty())
    }
}

/// Decisions in Redis whose policies are named per call: built by
/// [`Builder::build_per_call`](crate::Builder::build_per_call). Its connection, timeout and
/// reconnection are a [`RedisLimiter`](crate::RedisLimiter)'s; the caller decides what an error
/// means (there is no failover here). Cheap to clone.
#[derive(Clone)]
pub struct PerCallLimiter {
    pub(crate) shared: Arc<Shared>,
}

impl std::fmt::Debug for PerCallLimiter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PerCallLimiter").field("down", &self.is_down()).finish_non_exhaustive()
    }
}

impl PerCallLimiter {
    /// Decide `items` in one script call on the server's clock, all or nothing: an admitted call
    /// charges every item that is not [`Mode::Read`] and whose cost fits; a rejected one charges
    /// nothing. On a Redis Cluster every key must sit in one hash slot (give them one
    /// `{hash tag}`), else [`Error::Layers`]. No items is an empty, admitted decision.
    ///
    /// An error (a timeout, a connection down, a reply that is not the script's) is returned
    /// within the limiter's timeout; after a timeout the connection counts as down and later
    /// calls fail at once until a background probe finds the server back.
    pub async fn decide(&self, items: &[CallItem<'_>]) -> Result<CallDecision, Error> {
        if items.is_empty() {
            return Ok(CallDecision {
                admitted: true,
                decisions: Vec::new(),
                now_us: 0,
                receipts: Vec::new(),
            });
        }
        let s = &self.shared;
        let keys: Vec<String> = items.iter().map(|i| format!("{}{}", s.prefix, i.key)).collect();
        if s.cluster {
            let first = slot(keys[0].as_bytes());
            if keys.iter().any(|k| slot(k.as_bytes()) != first) {
                return Err(Error::Layers(
                    "the keys of one call must share a hash slot: give them one {hash tag}".into(),
                ));
            }
        }
        let mut args: Vec<Vec<u8>> = vec![Vec::new(), b"1".to_vec(), b"take".to_vec(), Vec::new()];
        for item in items {
            args.extend(item.policy.args.iter().map(|a| a.as_bytes().to_vec()));
            args.push(format!("{}:{}", item.mode.flag(), item.cost.max(1)).into_bytes());
        }
        let fields = 1 + 6 * items.len();
        let reply = s.submit(Request { keys, args, fields }).await?;
        let (now_us, admitted, fields, receipts) =
            crate::verdict::parse_call_reply(reply, items.len())?;
        let decisions =
            items.iter().zip(&fields).map(|(i, f)| i.policy.compiled.decision(f)).collect();
        crate::metrics::bump(&s.counters.server);
        Ok(CallDecision { admitted, decisions, now_us, receipts })
    }

    /// Take back what `decision` charged for `items` (the same items, in the same order, as the
    /// call that returned it): each charged key gets back what `docs/SEMANTICS.md` says a
    /// refund restores (untouched since the charge, its state before it, bit for bit). For a
    /// decision that must be undone after the call: a request decided on two servers whose
    /// other part was refused. A key charged by several items is refunded their costs added
    /// up; the keys of one such cost go in one script call.
    ///
    /// An error leaves the charges that were not yet refunded in place: the limit then errs on
    /// the side of admitting less.
    pub async fn refund(
        &self,
        items: &[CallItem<'_>],
        decision: &CallDecision,
    ) -> Result<(), Error> {
        if items.len() != decision.receipts.len() {
            return Err(Error::Layers(format!(
                "{} items for a decision of {}",
                items.len(),
                decision.receipts.len()
            )));
        }
        let s = &self.shared;
        // A key charged by several items of the call: the script stores its last state, whose
        // receipt's earlier state is the one before the call, so that receipt is refunded with
        // the costs of every charge of the key added up.
        let mut last: Vec<(usize, u64)> = Vec::new();
        for (i, item) in items.iter().enumerate() {
            if !decision.charged(i) {
                continue;
            }
            let cost = u64::from(item.cost.max(1));
            match last.iter_mut().find(|(j, _)| items[*j].key == item.key) {
                Some(entry) => *entry = (i, entry.1 + cost),
                None => last.push((i, cost)),
            }
        }
        let mut costs: Vec<u64> = last.iter().map(|&(_, c)| c).collect();
        costs.sort_unstable();
        costs.dedup();
        for cost in costs {
            let charged: Vec<usize> =
                last.iter().filter(|&&(_, c)| c == cost).map(|&(i, _)| i).collect();
            let keys = charged.iter().map(|&i| format!("{}{}", s.prefix, items[i].key)).collect();
            let mut args: Vec<Vec<u8>> =
                vec![Vec::new(), cost.to_string().into_bytes(), b"refund".to_vec(), Vec::new()];
            for &i in &charged {
                args.extend(items[i].policy.args.iter().map(|a| a.as_bytes().to_vec()));
                args.push(Mode::Enforce.flag().as_bytes().to_vec());
            }
            args.extend(charged.iter().map(|&i| decision.receipts[i].clone()));
            s.submit(Request { keys, args, fields: 1 }).await?;
            crate::metrics::bump(&s.counters.refunds);
        }
        Ok(())
    }

    /// `true` while the connection is considered down.
    pub fn is_down(&self) -> bool {
        self.shared.down.load(std::sync::atomic::Ordering::Acquire)
    }

    /// The counts so far (failovers stay 0: the caller decides what an error means).
    pub fn metrics(&self) -> Metrics {
        self.shared.counters.snapshot()
    }
}
