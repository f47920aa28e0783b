//! The long units, end to end: a limit per week, per month and per year is decided over gRPC in
//! windows on the Unix epoch's boundaries (as the Go service's cache keys divide the time),
//! `duration_until_reset` counting to the window's end, and the window's end restoring the
//! whole limit.

mod common;

use common::*;
use ratewell_rls::proto::{Code, Unit};

const CONFIG: &str = "
domain: long
descriptors:
  - key: per
    value: week
    rate_limit: {unit: week, requests_per_unit: 3}
  - key: per
    value: month
    rate_limit: {unit: month, requests_per_unit: 3}
  - key: per
    value: year
    rate_limit: {unit: year, requests_per_unit: 3}
";

/// Three requests admitted and a fourth over the limit, 100 s into a window of `unit_s`
/// seconds (the fifth one of the epoch); still over 1 s before the window ends; admitted again
/// once it has.
async fn decide_over_one_window(value: &str, unit: Unit, unit_s: u64) {
    let start = 5 * unit_s + 100;
    let mut h = Harness::start(&[("long.yaml", CONFIG)], &[], start).await;
    let descriptor: &[(&str, &str)] = &[("per", value)];
    let left = (unit_s - 100) as i64;
    for remaining in [2, 1, 0] {
        let r = h.call(request("long", &[descriptor], 1)).await.unwrap();
        assert_eq!(r, response(Code::Ok, vec![status(Code::Ok, 3, unit, remaining, left)]));
    }
    let r = h.call(request("long", &[descriptor], 1)).await.unwrap();
    let over = response(Code::OverLimit, vec![status(Code::OverLimit, 3, unit, 0, left)]);
    assert_eq!(r, over);
    h.clock.set((6 * unit_s - 1) * S);
    let r = h.call(request("long", &[descriptor], 1)).await.unwrap();
    assert_eq!(r, response(Code::OverLimit, vec![status(Code::OverLimit, 3, unit, 0, 1)]));
    h.clock.set(6 * unit_s * S);
    let r = h.call(request("long", &[descriptor], 1)).await.unwrap();
    let fresh = unit_s as i64;
    assert_eq!(r, response(Code::Ok, vec![status(Code::Ok, 3, unit, 2, fresh)]));
}

#[tokio::test]
async fn a_week() {
    decide_over_one_window("week", Unit::Week, 7 * 86_400).await;
}

/// A month is 30 days, as the Go service's `UnitToDivider` makes it.
#[tokio::test]
async fn a_month() {
    decide_over_one_window("month", Unit::Month, 30 * 86_400).await;
}

/// A year is 365 days, as the Go service's `UnitToDivider` makes it.
#[tokio::test]
async fn a_year() {
    decide_over_one_window("year", Unit::Year, 365 * 86_400).await;
}
