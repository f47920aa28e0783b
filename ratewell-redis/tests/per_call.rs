//! Per-call decisions (`PerCallLimiter`): each call's items decided at once on the server, all
//! or nothing, against an in-process reference built from the engine (`KeyedLimiter`'s
//! registered policies, a charge per item, refunds when the call is rejected), over random calls.

mod common;

use common::{Cluster, PATHS, Path, Rng, Server};
use ratewell::{KeyedLimiter, ManualClock, Policy};
use ratewell_redis::{CallItem, CallPolicy, Mode, RedisLimiter};

fn policy(s: &str) -> Policy {
    s.parse().unwrap()
}

/// The rule the server applies, decided in process: every item charged in turn unless it only
/// reads; the call admitted when no enforced item and not every quota item (if any) is over;
/// a rejected call's charges taken back.
struct Reference {
    table: KeyedLimiter<str, ManualClock>,
    ids: Vec<ratewell::PolicyId>,
}

impl Reference {
    fn decide(&self, items: &[(String, usize, u32, Mode)]) -> (bool, Vec<u64>) {
        let mut charges = Vec::new();
        let mut out = Vec::new();
        let (mut admitted, mut quota, mut quota_over) = (true, 0, 0);
        for (key, p, cost, mode) in items {
            let id = &self.ids[*p];
            if *mode == Mode::Read {
                out.push((false, self.table.request(key).policy(id).peek().remaining()));
                charges.push(None);
                continue;
            }
            let (d, charge) = self.table.request(key).policy(id).cost(*cost).take();
            let over = !d.is_admitted();
            match mode {
                Mode::Enforce if over => admitted = false,
                Mode::Quota => {
                    quota += 1;
                    quota_over += usize::from(over);
                }
                _ => {}
            }
            out.push((charge.is_some(), d.remaining()));
            charges.push(charge);
        }
        if quota > 0 && quota == quota_over {
            admitted = false;
        }
        let mut remaining = Vec::new();
        if admitted {
            remaining.extend(out.into_iter().map(|(_, left)| left));
        } else {
            // Nothing charged: each reports its key's state before the call.
            for c in charges.into_iter().flatten() {
                self.table.refund(c);
            }
            for (key, p, _, _) in items {
                remaining.push(self.table.request(key).policy(&self.ids[*p]).peek().remaining());
            }
        }
        (admitted, remaining)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_decide_as_the_engine_does() {
    for path in PATHS {
        calls_decide_as_the_engine_does_on(path).await;
    }
}

async fn calls_decide_as_the_engine_does_on(path: Path) {
    let server = Server::start_on(path, &[]);
    let limiter = RedisLimiter::builder(&server.url()).build_per_call().await.unwrap();
    let texts = [
        "fixed-window limit=7 window=1h",
        "fixed-window limit=20 window=1h",
        "fixed-window limit=3 window=1h",
    ];
    let compiled: Vec<CallPolicy> =
        texts.iter().map(|t| CallPolicy::new(&policy(t)).unwrap()).collect();
    let table = KeyedLimiter::<str, _>::with_clock(
        &policy("fixed-window limit=1 window=1s"),
        1000,
        ManualClock::new(0),
    );
    let ids = texts.iter().map(|t| table.register(&policy(t)).unwrap()).collect();
    let reference = Reference { table, ids };
    // An hour window must not turn over during the run.
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs();
    if 3600 - now % 3600 < 30 {
        tokio::time::sleep(std::time::Duration::from_secs(3600 - now % 3600 + 1)).await;
    }
    let modes = [Mode::Enforce, Mode::Enforce, Mode::DryRun, Mode::Quota, Mode::Read];
    let mut rng = Rng(7);
    for call in 0..400 {
        let n = 1 + rng.below(4) as usize;
        let items: Vec<(String, usize, u32, Mode)> = (0..n)
            .map(|_| {
                // A key keeps one policy: its index picks it.
                let k = rng.below(6) as usize;
                (format!("k{k}"), k % 3, 1 + rng.below(3) as u32, modes[rng.below(5) as usize])
            })
            .collect();
        let call_items: Vec<CallItem<'_>> = items
            .iter()
            .map(|(key, p, cost, mode)| CallItem {
                key,
                policy: &compiled[*p],
                cost: *cost,
                mode: *mode,
            })
            .collect();
        let got = limiter.decide(&call_items).await.unwrap();
        let (admitted, remaining) = reference.decide(&items);
        let got_remaining: Vec<u64> = got.decisions.iter().map(|d| d.remaining()).collect();
        assert_eq!((got.admitted, got_remaining), (admitted, remaining), "call {call}: {items:?}");
        assert!(got.now_us > 1_600_000_000_000_000);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_per_call_limiter_takes_no_layers_and_clusters_need_one_slot() {
    let server = Server::start();
    let p = policy("fixed-window limit=1 window=1m");
    let e = RedisLimiter::builder(&server.url()).layer("a", &p).build_per_call().await.unwrap_err();
    assert!(e.to_string().contains("no layers"), "{e}");
    let cluster = Cluster::start();
    let limiter = RedisLimiter::cluster_builder(&cluster.urls()).build_per_call().await.unwrap();
    let compiled = CallPolicy::new(&p).unwrap();
    let item = |key| CallItem { key, policy: &compiled, cost: 1, mode: Mode::Enforce };
    let e = limiter.decide(&[item("a"), item("b"), item("c")]).await.unwrap_err();
    assert!(e.to_string().contains("hash slot"), "{e}");
    let d = limiter.decide(&[item("{t}a"), item("{t}b")]).await.unwrap();
    assert!(d.admitted);
    assert!(!limiter.decide(&[item("{t}a")]).await.unwrap().admitted);
}

/// `refund` takes back exactly what an admitted call charged: every key returns to its state
/// before the call, byte for byte (`DUMP`), keys charged twice in one call and items of
/// different costs included; an uncharged (read) item is left alone; a refund whose items do
/// not match its decision is an error, refunding nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refund_restores_what_a_call_charged() {
    for path in PATHS {
        a_refund_restores_what_a_call_charged_on(path).await;
    }
}

async fn a_refund_restores_what_a_call_charged_on(path: Path) {
    let server = Server::start_on(path, &[]);
    let limiter = RedisLimiter::builder(&server.url()).build_per_call().await.unwrap();
    let texts = [
        "fixed-window limit=10 window=1h",
        "token-bucket capacity=10 rate=1/h",
        "sliding-log limit=10 window=1h",
    ];
    let compiled: Vec<CallPolicy> =
        texts.iter().map(|t| CallPolicy::new(&policy(t)).unwrap()).collect();
    let client = redis::Client::open(server.url()).unwrap();
    let mut con = client.get_multiplexed_async_connection().await.unwrap();
    let keys = ["fw", "tb", "log"];
    let mut states = async || {
        let mut out = Vec::new();
        for key in keys {
            let dump: redis::Value = redis::cmd("DUMP")
                .arg(format!("ratewell:{key}"))
                .query_async(&mut con)
                .await
                .unwrap();
            out.push(dump);
        }
        out
    };
    // Some earlier charges, kept.
    let first: Vec<CallItem<'_>> = keys
        .iter()
        .zip(&compiled)
        .map(|(key, policy)| CallItem { key, policy, cost: 2, mode: Mode::Enforce })
        .collect();
    assert!(limiter.decide(&first).await.unwrap().admitted);
    let before = states().await;
    assert!(before.iter().all(|s| *s != redis::Value::Nil), "{before:?}");
    // A call with costs 1 and 3, a key named twice, and an item that only reads.
    let items = vec![
        CallItem { key: "fw", policy: &compiled[0], cost: 3, mode: Mode::Enforce },
        CallItem { key: "tb", policy: &compiled[1], cost: 1, mode: Mode::DryRun },
        CallItem { key: "log", policy: &compiled[2], cost: 3, mode: Mode::Enforce },
        CallItem { key: "fw", policy: &compiled[0], cost: 1, mode: Mode::Enforce },
        CallItem { key: "tb", policy: &compiled[1], cost: 5, mode: Mode::Read },
    ];
    let d = limiter.decide(&items).await.unwrap();
    assert!(d.admitted);
    assert_eq!((0..5).map(|i| d.charged(i)).collect::<Vec<_>>(), [true, true, true, true, false]);
    assert_eq!(
        d.decisions[..4].iter().map(|d| d.remaining()).collect::<Vec<_>>(),
        [5, 7, 5, 4],
        "charged in order, the second charge of fw seeing the first"
    );
    let charged = states().await;
    assert!(charged.iter().zip(&before).all(|(a, b)| a != b));
    let e = limiter.refund(&items[..4], &d).await.unwrap_err();
    assert!(e.to_string().contains("4 items for a decision of 5"), "{e}");
    assert_eq!(states().await, charged, "a refused refund refunds nothing");
    limiter.refund(&items, &d).await.unwrap();
    assert_eq!(states().await, before);
    assert_eq!(
        limiter.metrics().refunds,
        3,
        "one script call per distinct cost (fw 4, tb 1, log 3)"
    );
}
