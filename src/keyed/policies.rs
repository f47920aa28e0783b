//! [`KeyedLimiter`]'s policies: the default ([`set_policy`]), per-key overrides
//! ([`set_override`]), the policies registered for decisions that name one ([`register`],
//! [`release`]), and the conversion of keys from one policy to another.
//!
//! [`set_policy`]: KeyedLimiter::set_policy
//! [`set_override`]: KeyedLimiter::set_override
//! [`register`]: KeyedLimiter::register
//! [`release`]: KeyedLimiter::release

use std::hash::Hash;

use super::registry::{Locked, Policies};
use super::store::{Backend, Store};
use super::{KeyedLimiter, PolicyId};
use crate::clock::Clock;
use crate::policy::{Policy, PolicyError};

impl<K: Hash + ?Sized, C: Clock> KeyedLimiter<K, C> {
    /// Replace the policy of every key without an override. Each key present keeps what it
    /// consumed: at its next decision its state is converted to the new policy
    /// ([`Policy`]'s limit less what remained under the old one, in whole units, rounded
    /// against the key, is taken from a fresh state of the new policy at that instant). So a new
    /// rate or capacity on the same algorithm keeps the consumed part, and an exhausted key
    /// stays exhausted under a policy no larger; across algorithms the same rule applies, and a
    /// window or refill schedule restarts at the conversion. A sliding log keeps its log.
    ///
    /// Fails if the policy's kind differs (a sliding log and the one-word algorithms do not share
    /// a table), or if 255 distinct policies are in use at once (the default and the overrides).
    /// Policies no longer in use free their slots for later ones: there is no limit on how many
    /// times a limiter's policies change.
    ///
    /// # Examples
    ///
    /// ```
    /// use ratewell::{KeyedLimiter, ManualClock, Policy};
    ///
    /// let limiter = KeyedLimiter::<str, _>::with_clock(&"token-bucket capacity=10 rate=1/h".parse()?, 100, ManualClock::new(0));
    /// assert!(limiter.request("k").cost(10).check().is_admitted()); // exhausted
    /// limiter.set_policy(&"token-bucket capacity=14 rate=1/h".parse()?)?;
    /// assert_eq!(limiter.request("k").peek().remaining(), 4); // 10 consumed of 14, not a fresh 14
    /// # Ok::<(), ratewell::PolicyError>(())
    /// ```
    pub fn set_policy(&self, policy: &Policy) -> Result<(), PolicyError> {
        self.registry.set_default(policy, &|locked| self.sweep(locked))
    }

    /// Give `key` its own policy (a premium API key, an internal service), or with `None` return
    /// it to the limiter's policy. A key present keeps what it consumed (see
    /// [`set_policy`](Self::set_policy)). Fails as [`set_policy`](Self::set_policy) fails
    /// (clearing an override cannot fail).
    ///
    /// # Examples
    ///
    /// ```
    /// use ratewell::{KeyedLimiter, Policy};
    ///
    /// let limiter = KeyedLimiter::<str>::new(&"fixed-window limit=10 window=1m".parse()?, 100);
    /// let premium: Policy = "fixed-window limit=1000 window=1m".parse()?;
    /// limiter.set_override("vip", Some(&premium))?;
    /// assert_eq!(limiter.check("vip").remaining(), 999);
    /// limiter.set_override("vip", None)?;
    /// assert_eq!(limiter.check("vip").remaining(), 8); // two of ten consumed
    /// # Ok::<(), ratewell::PolicyError>(())
    /// ```
    pub fn set_override(&self, key: &K, policy: Option<&Policy>) -> Result<(), PolicyError> {
        let hash = self.hasher.hash_one(key);
        self.registry.set_override(self.fingerprint(hash), policy, &|l| self.sweep(l))?;
        self.migrate(hash);
        Ok(())
    }

    /// The policy `key` is decided under: its override, or the limiter's policy.
    ///
    /// # Examples
    ///
    /// ```
    /// use ratewell::{KeyedLimiter, Policy};
    ///
    /// let limiter = KeyedLimiter::<str>::new(&"fixed-window limit=10 window=1m".parse()?, 100);
    /// let premium: Policy = "fixed-window limit=1000 window=1m".parse()?;
    /// limiter.set_override("vip", Some(&premium))?;
    /// assert_eq!(limiter.policy_of("vip"), premium);
    /// assert_eq!(limiter.policy_of("anyone"), limiter.policy());
    /// # Ok::<(), ratewell::PolicyError>(())
    /// ```
    pub fn policy_of(&self, key: &K) -> Policy {
        let hash = self.hasher.hash_one(key);
        let (idx, _) = self.registry.resolve(self.fingerprint(hash));
        self.registry.policy(idx).clone()
    }

    fn fingerprint(&self, hash: u64) -> u64 {
        with_store!(self, store => store.fingerprint(hash))
    }

    /// Move the key to the policy it resolves to now, keeping what it consumed.
    fn migrate(&self, hash: u64) {
        let now = self.floor.now(&self.clock);
        with_store!(self, store => store.migrate(&self.registry, hash, now))
    }

    /// Convert every key stored under a retired policy slot (under the registry's lock).
    fn sweep(&self, policies: &Locked<'_>) {
        let now = self.floor.now(&self.clock);
        with_store!(self, store => store.sweep(policies, now))
    }

    /// The policy of keys without an override.
    pub fn policy(&self) -> Policy {
        self.registry.default_policy().clone()
    }

    /// Register `policy` for decisions that name it per call, and return its id: the way to
    /// decide keys of one table under many policies chosen per request (a rate limit service
    /// whose rules each carry their own limit). Registering a policy registered already returns
    /// the same slot again; each id is handed back once to [`release`](Self::release).
    ///
    /// A key decided under a policy other than the one it is stored under is first converted to
    /// it, keeping what it consumed, as [`set_policy`](Self::set_policy) converts keys: a rule
    /// whose limit changes does not hand its keys a fresh budget. The registered policies, the
    /// default and the overrides share the limiter's 255 slots; fails when they are taken, or if
    /// the policy's kind differs from the limiter's (a sliding log and the one-word algorithms
    /// do not share a table).
    ///
    /// # Examples
    ///
    /// ```
    /// use ratewell::{KeyedLimiter, ManualClock, Policy};
    ///
    /// let p = |s: &str| s.parse::<Policy>().expect("a valid policy");
    /// let limiter = KeyedLimiter::<str, _>::with_clock(&p("fixed-window limit=1 window=1s"), 1_000, ManualClock::new(0));
    /// let per_minute = limiter.register(&p("fixed-window limit=3 window=1m"))?;
    /// let per_hour = limiter.register(&p("fixed-window limit=100 window=1h"))?;
    /// assert_eq!(limiter.request("alice").policy(&per_minute).cost(3).check().remaining(), 0);
    /// assert!(!limiter.request("alice").policy(&per_minute).allow());
    /// assert_eq!(limiter.request("bob").policy(&per_hour).check().remaining(), 99);
    /// assert_eq!(per_hour.policy(), &p("fixed-window limit=100 window=1h"));
    /// limiter.release(per_minute);
    /// limiter.release(per_hour);
    /// # Ok::<(), ratewell::PolicyError>(())
    /// ```
    pub fn register(&self, policy: &Policy) -> Result<PolicyId, PolicyError> {
        let (idx, word) = self.registry.pin(policy, &|locked| self.sweep(locked))?;
        Ok(PolicyId { idx, word, owner: self.owner(), policy: policy.clone() })
    }

    /// Hand back an id from [`register`](Self::register). Once every id of a policy is
    /// released, its slot is retired: keys stored under it are converted to the policy they are
    /// next decided under, and the slot is reused when the limiter needs one.
    ///
    /// # Panics
    ///
    /// If `id` was registered with another limiter.
    pub fn release(&self, id: PolicyId) {
        self.check_owner(id.owner);
        self.registry.unpin(id.idx);
    }
}
