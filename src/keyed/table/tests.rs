//! Tests of the one-word key table's placement: candidate buckets, partners and shards.

use super::*;

#[test]
fn placement_spreads_keys() {
    let t = Table::new(1_000_000, 7).unwrap();
    let hasher = ahash::RandomState::with_seeds(1, 2, 3, 4);
    let mut counts = std::collections::HashMap::new();
    let mut seconds = std::collections::HashMap::new();
    let mut shards = std::collections::HashSet::new();
    for k in 0..50_000u64 {
        let p = t.place(hasher.hash_one(k));
        let b2 = t.partner(p.b1, p.fp);
        // Both candidates in the array and in the key's shard, whose lock covers them, and
        // each the other's partner.
        assert!(p.b1 < t.buckets.len() && b2 < t.buckets.len(), "{p:?}");
        assert_eq!((p.b1 & t.shard_mask as usize, b2 & t.shard_mask as usize), (p.shard, p.shard));
        assert_eq!(t.partner(b2, p.fp), p.b1);
        *counts.entry(p.b1).or_insert(0) += 1;
        *seconds.entry(b2).or_insert(0) += 1;
        shards.insert(p.shard);
    }
    // 50,000 keys into 125,184 buckets: Poisson(0.4) per bucket, so about 0.5 buckets are
    // expected to get 6 keys and 0.03 to get 7; a skewed placement gets many more.
    let max = counts.values().max().unwrap();
    assert!(*max <= 7, "max keys in one first-choice bucket: {max}");
    let max = seconds.values().max().unwrap();
    assert!(*max <= 7, "max keys in one second-choice bucket: {max}");
    assert_eq!(shards.len(), t.shards.len());
}
