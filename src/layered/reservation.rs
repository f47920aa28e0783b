//! The reservation guards: a request's charge on every layer of a [`LayeredLimiter`], taken now
//! and settled later ([`Reservation`], [`OwnedReservation`]).

use std::sync::Arc;

use super::limiter::{Receipts, refund_taken};
use super::{KeyCountError, LayerKey, LayeredDecision, LayeredLimiter};
use crate::clock::{Clock, QuantaClock};

impl<C: Clock> LayeredLimiter<C> {
    /// Take now, settle later: the request's charge on every layer, held by a [`Reservation`]
    /// that [`commit`](Reservation::commit)s it, or takes it back on
    /// [`cancel`](Reservation::cancel) or when dropped uncommitted (the work never ran: a
    /// cancelled future, an upstream that failed before sending anything). A rejected request's
    /// reservation holds nothing.
    ///
    /// # Examples
    ///
    /// ```
    /// use ratewell::{Layer, LayeredLimiter, ManualClock, Policy};
    ///
    /// let layers = vec![Layer::new("api", &"fixed-window limit=1 window=1m".parse::<Policy>()?)];
    /// let limiter = LayeredLimiter::with_clock(layers, ManualClock::new(0))?;
    /// let reservation = limiter.reserve(&[&"alice"], 1)?;
    /// assert!(reservation.decision().is_admitted());
    /// drop(reservation); // never committed: the charge comes back
    /// let reservation = limiter.reserve(&[&"alice"], 1)?;
    /// assert!(reservation.decision().is_admitted());
    /// reservation.commit();
    /// assert!(!limiter.check(&[&"alice"], 1)?.is_admitted());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn reserve(
        &self,
        keys: &[&dyn LayerKey],
        cost: u32,
    ) -> Result<Reservation<'_, C>, KeyCountError> {
        let (mut decision, mut receipts) = (LayeredDecision::default(), Receipts::default());
        let now = self.floor.now(&self.clock);
        self.take(keys, cost, &mut decision, &mut receipts, true, now)?;
        Ok(Reservation { limiter: self, receipts, decision })
    }

    /// [`reserve`](Self::reserve) holding the limiter by an [`Arc`], for a reservation that
    /// outlives the borrow (one kept in a `'static` future).
    pub fn reserve_owned(
        self: &Arc<Self>,
        keys: &[&dyn LayerKey],
        cost: u32,
    ) -> Result<OwnedReservation<C>, KeyCountError> {
        let (mut decision, mut receipts) = (LayeredDecision::default(), Receipts::default());
        let now = self.floor.now(&self.clock);
        self.take(keys, cost, &mut decision, &mut receipts, true, now)?;
        Ok(OwnedReservation { limiter: Arc::clone(self), receipts, decision })
    }

    /// Take back the admissions of a reservation, at the current instant.
    fn refund(&self, receipts: &mut Receipts) {
        if receipts.is_empty() {
            return;
        }
        let now = self.floor.now(&self.clock);
        refund_taken(&self.layers, &mut receipts.0, now);
    }
}

/// A request's charge on every layer of a [`LayeredLimiter`], not yet settled: see
/// [`LayeredLimiter::reserve`]. Dropping it uncommitted takes the charge back.
#[derive(Debug)]
#[must_use = "dropping a reservation takes its charge back; commit it if the work ran"]
pub struct Reservation<'a, C: Clock = QuantaClock> {
    limiter: &'a LayeredLimiter<C>,
    receipts: Receipts,
    decision: LayeredDecision,
}

impl<C: Clock> Reservation<'_, C> {
    /// The decision the reservation was taken with.
    pub fn decision(&self) -> &LayeredDecision {
        &self.decision
    }

    /// Keep the charge: the work ran.
    pub fn commit(mut self) {
        self.receipts = Receipts::default();
    }

    /// Take the charge back now (what dropping does).
    pub fn cancel(self) {}
}

impl<C: Clock> Drop for Reservation<'_, C> {
    fn drop(&mut self) {
        self.limiter.refund(&mut self.receipts);
    }
}

/// [`Reservation`] holding its limiter by an [`Arc`]: see [`LayeredLimiter::reserve_owned`].
#[derive(Debug)]
#[must_use = "dropping a reservation takes its charge back; commit it if the work ran"]
pub struct OwnedReservation<C: Clock = QuantaClock> {
    limiter: Arc<LayeredLimiter<C>>,
    receipts: Receipts,
    decision: LayeredDecision,
}

impl<C: Clock> OwnedReservation<C> {
    /// The decision the reservation was taken with.
    pub fn decision(&self) -> &LayeredDecision {
        &self.decision
    }

    /// Keep the charge: the work ran.
    pub fn commit(mut self) {
        self.receipts = Receipts::default();
    }

    /// Take the charge back now (what dropping does).
    pub fn cancel(self) {}
}

impl<C: Clock> Drop for OwnedReservation<C> {
    fn drop(&mut self) {
        self.limiter.refund(&mut self.receipts);
    }
}
