//! Exactness under concurrency, against the binary: 8 clients on their own connections send
//! 4,000 requests at one descriptor whose limit is 1,000, and exactly 1,000 are OK; requests of
//! two descriptors never leave one charged when the other rejected.

mod common;

use common::*;

const CONFIG: &str = "
domain: exact
descriptors:
  - key: route
    rate_limit: {unit: hour, requests_per_unit: 1000}
  - key: wide
    rate_limit: {unit: hour, requests_per_unit: 1000}
  - key: tight
    rate_limit: {unit: hour, requests_per_unit: 300}
";

/// What remains of `key`'s limit, read without charging (a per-descriptor `hits_addend` of 0).
async fn remaining(b: &Binary, key: &str) -> u32 {
    let mut req = request("exact", &[&[(key, "x")]], 1);
    req.descriptors[0].hits_addend = Some(0);
    let r = b.client().await.should_rate_limit(req).await.unwrap().into_inner();
    r.statuses[0].limit_remaining
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn eight_clients_get_exactly_the_limit() {
    let root = tempfile::tempdir().unwrap();
    write_config(root.path(), &[("exact.yaml", CONFIG)]);
    let root_s = root.path().display().to_string();
    let b = Binary::spawn(&[("RUNTIME_ROOT", &root_s), ("RUNTIME_SUBDIRECTORY", "ratelimit")]);
    clear_of_boundary(3600, 30).await;
    let ok = flood(b.grpc, 8, 500, request("exact", &[&[("route", "x")]], 1)).await;
    assert_eq!(ok, 1000);
    assert_eq!(remaining(&b, "route").await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_descriptors_are_charged_all_or_nothing() {
    let root = tempfile::tempdir().unwrap();
    write_config(root.path(), &[("exact.yaml", CONFIG)]);
    let root_s = root.path().display().to_string();
    let b = Binary::spawn(&[("RUNTIME_ROOT", &root_s), ("RUNTIME_SUBDIRECTORY", "ratelimit")]);
    clear_of_boundary(3600, 30).await;
    let ok =
        flood(b.grpc, 8, 100, request("exact", &[&[("wide", "x")], &[("tight", "x")]], 1)).await;
    assert_eq!(ok, 300, "the tighter limit admits 300 pairs");
    assert_eq!(remaining(&b, "tight").await, 0);
    assert_eq!(remaining(&b, "wide").await, 700, "only admitted pairs charged the wider limit");
}
