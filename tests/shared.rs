//! Shared tables across real processes: this test binary runs itself again as child processes
//! (the `#[ignore]`d `child` entry point, chosen by `RATEWELL_CHILD`), which open one table file
//! and decide at once; the parent checks the totals against what the policy allows.
#![cfg(target_os = "linux")]

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use ratewell::{KeyedLimiter, OnFull, Policy, SharedError};

/// A table file of its own for each test, removed when dropped.
struct TableFile(PathBuf);

impl TableFile {
    fn new(name: &str) -> Self {
        let dir = if Path::new("/dev/shm").is_dir() {
            PathBuf::from("/dev/shm")
        } else {
            std::env::temp_dir()
        };
        let path = dir.join(format!("ratewell-test-{name}-{}", std::process::id()));
        let _ = std::fs::remove_file(&path);
        TableFile(path)
    }
}

impl Drop for TableFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Start this binary's `child` entry with `args` (space-separated), its stdout piped; through
/// `RATEWELL_TEST_RUNNER` (a program and its arguments, space-separated) where one is set, as
/// `scripts/aarch64` sets qemu's.
fn spawn(args: &str) -> Child {
    let exe = std::env::current_exe().unwrap();
    let runner = std::env::var("RATEWELL_TEST_RUNNER").unwrap_or_default();
    let mut runner = runner.split_whitespace();
    let mut command = match runner.next() {
        Some(program) => {
            let mut c = Command::new(program);
            c.args(runner).arg(exe);
            c
        }
        None => Command::new(exe),
    };
    command
        .args(["child", "--exact", "--ignored", "--nocapture", "--test-threads=1", "-q"])
        .env("RATEWELL_CHILD", args)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("the test binary runs again")
}

/// Wait for `child` (a hang fails the test after a deadline only a hang reaches), and the
/// numbers it printed on its `result` line.
fn result(child: Child) -> Vec<u64> {
    let deadline = Instant::now() + Duration::from_secs(600);
    let mut child = child;
    loop {
        if child.try_wait().unwrap().is_some() {
            break;
        }
        assert!(Instant::now() < deadline, "a child process hung");
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "a child failed: {:?}", out.status);
    let text = String::from_utf8(out.stdout).unwrap();
    let line = text.lines().find_map(|l| l.strip_prefix("result ")).expect("a result line");
    line.split_whitespace().map(|n| n.parse().unwrap()).collect()
}

/// The children's side: `RATEWELL_CHILD` says what to do.
#[test]
#[ignore = "a child process of the other tests (run by them)"]
fn child() {
    let Ok(args) = std::env::var("RATEWELL_CHILD") else { return };
    let args: Vec<&str> = args.split(' ').collect();
    let path = Path::new(args[1]);
    let out = std::io::stdout();
    match args[0] {
        // hot POLICY_INDEX CAPACITY REQUESTS: one key, REQUESTS times.
        "hot" => {
            let policy = &policies()[args[2].parse::<usize>().unwrap()].0;
            let limiter =
                KeyedLimiter::<str>::open_shared(path, policy, args[3].parse().unwrap()).unwrap();
            let n: u64 = args[4].parse().unwrap();
            let admitted = (0..n).filter(|_| limiter.allow("hot")).count();
            writeln!(out.lock(), "result {admitted}").unwrap();
        }
        // keys CAPACITY KEYS ROUNDS ME PROCESSES: each key ROUNDS times, in an order of this
        // process's; prints how many of each key's requests it admitted, as a run of bytes
        // written to PATH.ME.
        "keys" => {
            let policy: Policy = "token-bucket capacity=50 rate=1/h".parse().unwrap();
            let limiter = KeyedLimiter::<u32>::builder(&policy, args[2].parse().unwrap())
                .on_full(OnFull::Refuse)
                .open_shared(path)
                .unwrap();
            let keys: u32 = args[3].parse().unwrap();
            let rounds: u32 = args[4].parse().unwrap();
            let me: u32 = args[5].parse().unwrap();
            let mut admitted = vec![0u8; keys as usize];
            // Interleaved: every process walks all keys each round, from its own offset.
            for _ in 0..rounds {
                for i in 0..keys {
                    let k = (i + me * keys / 8) % keys;
                    if limiter.allow(&k) {
                        admitted[k as usize] += 1;
                    }
                }
            }
            std::fs::write(format!("{}.{me}", path.display()), &admitted).unwrap();
            writeln!(out.lock(), "result 0").unwrap();
        }
        // insert PATH KILL_POLICY: new keys, as fast as it can, until killed.
        "insert" => {
            let policy: Policy = KILL_POLICIES[args[2].parse::<usize>().unwrap()].parse().unwrap();
            let limiter = KeyedLimiter::<u64>::open_shared(path, &policy, 20_000).unwrap();
            writeln!(out.lock(), "ready").unwrap();
            let seed = u64::from(std::process::id()) << 32;
            for k in 0.. {
                limiter.allow(&(seed | k));
            }
        }
        // decide PATH KEYS ROUNDS KILL_POLICY: as `keys`, on the table `insert` uses; prints
        // the slowest decision's microseconds and the admitted counts' sum; writes the counts
        // to PATH.d.
        "decide" => {
            let policy: Policy = KILL_POLICIES[args[4].parse::<usize>().unwrap()].parse().unwrap();
            let limiter = KeyedLimiter::<u64>::open_shared(path, &policy, 20_000).unwrap();
            let keys: u64 = args[2].parse().unwrap();
            let rounds: u32 = args[3].parse().unwrap();
            let mut admitted = vec![0u8; keys as usize];
            let mut slowest = Duration::ZERO;
            for _ in 0..rounds {
                for k in 0..keys {
                    let t = Instant::now();
                    if limiter.allow(&k) {
                        admitted[k as usize] += 1;
                    }
                    slowest = slowest.max(t.elapsed());
                }
            }
            std::fs::write(format!("{}.d", path.display()), &admitted).unwrap();
            let sum: u64 = admitted.iter().map(|&a| u64::from(a)).sum();
            writeln!(out.lock(), "result {} {sum}", slowest.as_micros()).unwrap();
        }
        // hold PATH LIMIT: attach to the `fixed-window limit=LIMIT window=1h` table, say
        // `ready`, and stay attached until killed.
        "hold" => {
            let policy: Policy =
                format!("fixed-window limit={} window=1h", args[2]).parse().unwrap();
            let _limiter = KeyedLimiter::<str>::open_shared(path, &policy, 1000).unwrap();
            writeln!(out.lock(), "ready").unwrap();
            std::thread::sleep(Duration::from_secs(600));
        }
        other => panic!("no child mode {other}"),
    }
}

/// The policies of the kill test: a one-word table, whose lock is its insert lock, and a
/// sliding log's, whose lock every decision takes.
const KILL_POLICIES: [&str; 2] =
    ["token-bucket capacity=50 rate=1/h", "sliding-log limit=50 window=1h"];

/// Every algorithm at a limit of 1,000 for one key, none refilling within the test.
fn policies() -> Vec<(Policy, u64)> {
    [
        "token-bucket capacity=1000 rate=1/h",
        "token-bucket capacity=1000 refill=1 every=1h",
        "leaky-bucket rate=1r/m burst=999 nodelay",
        "fixed-window limit=1000 window=1h",
        "sliding-window limit=1000 window=1h",
        "sliding-log limit=1000 window=1h",
    ]
    .iter()
    .map(|p| (p.parse().unwrap(), 1000))
    .collect()
}

#[test]
fn eight_processes_on_one_key_admit_exactly_the_limit() {
    for (i, (policy, limit)) in policies().into_iter().enumerate() {
        let file = TableFile::new(&format!("hot{i}"));
        let children: Vec<Child> =
            (0..8).map(|_| spawn(&format!("hot {} {i} 1000 10000", file.0.display()))).collect();
        let admitted: u64 = children.into_iter().map(|c| result(c)[0]).sum();
        assert_eq!(admitted, limit, "{policy}: 8 processes, 10,000 requests each");
        let limiter = KeyedLimiter::<str>::open_shared(&file.0, &policy, 1000).unwrap();
        let m = limiter.metrics();
        assert_eq!((m.admitted, m.rejected), (limit, 80_000 - limit), "{policy}: the counters");
    }
}

#[test]
fn eight_processes_on_a_nine_tenths_full_table_lose_no_key() {
    let file = TableFile::new("keys");
    // 100,000 keys in 90% of the slots (16 shards of 864 buckets).
    let policy: Policy = "token-bucket capacity=50 rate=1/h".parse().unwrap();
    let capacity = 110_592;
    let slots = KeyedLimiter::<u32>::builder(&policy, capacity)
        .on_full(OnFull::Refuse)
        .open_shared(&file.0)
        .unwrap()
        .metrics()
        .capacity;
    assert!(slots * 9 / 10 <= 100_000, "{slots} slots: at least 90% full");
    let children: Vec<Child> = (0..8)
        .map(|me| spawn(&format!("keys {} {capacity} 100000 10 {me}", file.0.display())))
        .collect();
    for c in children {
        result(c);
    }
    let mut totals = vec![0u32; 100_000];
    for me in 0..8 {
        let part = format!("{}.{me}", file.0.display());
        for (t, a) in totals.iter_mut().zip(std::fs::read(&part).unwrap()) {
            *t += u32::from(a);
        }
        std::fs::remove_file(part).unwrap();
    }
    let wrong: Vec<_> = totals.iter().enumerate().filter(|(_, t)| **t != 50).take(5).collect();
    assert!(wrong.is_empty(), "keys that did not admit exactly 50 of 80: {wrong:?}");
    let limiter = KeyedLimiter::<u32>::builder(&policy, capacity)
        .on_full(OnFull::Refuse)
        .open_shared(&file.0)
        .unwrap();
    let m = limiter.metrics();
    assert_eq!((m.keys, m.evictions, m.refused), (100_000, 0, 0), "{m:?}");
    assert_eq!((m.admitted, m.rejected), (5_000_000, 3_000_000));
}

#[test]
fn a_process_killed_holding_a_lock_stops_no_other() {
    for p in 0..KILL_POLICIES.len() {
        killed_holding_a_lock(p);
    }
}

fn killed_holding_a_lock(p: usize) {
    let policy: Policy = KILL_POLICIES[p].parse().unwrap();
    // Kill inserting processes, each on a table of its own, until one dies holding a shard
    // lock.
    let mut held = None;
    for attempt in 0..200 {
        let file = TableFile::new(&format!("kill{p}-{attempt}"));
        let limiter = KeyedLimiter::<u64>::open_shared(&file.0, &policy, 20_000).unwrap();
        let mut victim = spawn(&format!("insert {} {p}", file.0.display()));
        let mut line = String::new();
        std::io::BufRead::read_line(
            &mut std::io::BufReader::new(victim.stdout.as_mut().unwrap()),
            &mut line,
        )
        .unwrap();
        // Inserting in earnest (under qemu, a process starts slowly), then a moment more.
        let deadline = Instant::now() + Duration::from_secs(60);
        while limiter.metrics().keys < 200 {
            assert!(Instant::now() < deadline, "the inserting process inserted nothing");
            std::thread::sleep(Duration::from_millis(1));
        }
        std::thread::sleep(Duration::from_millis(attempt % 7));
        victim.kill().unwrap();
        victim.wait().unwrap();
        let info = limiter.shared_info().unwrap();
        if let Some(&(shard, pid)) = info.locks_held.first() {
            assert_eq!(pid, victim.id(), "only the victim held a lock");
            held = Some((shard, file, limiter));
            break;
        }
    }
    let (shard, file, limiter) =
        held.expect("one of 200 processes killed while inserting held a lock");
    let before = limiter.metrics().keys;
    // Another process decides on 2,000 keys of its own, 100 times each: each takes the dead
    // process's lock over when its shard needs it, mends the shard, and goes on.
    let (slowest, sum) = {
        let r = result(spawn(&format!("decide {} 2000 100 {p}", file.0.display())));
        (r[0], r[1])
    };
    assert_eq!(sum, 2000 * 50, "{policy}: every key admitted exactly 50 of 100");
    let counts = std::fs::read(format!("{}.d", file.0.display())).unwrap();
    assert!(counts.iter().all(|&c| c == 50));
    std::fs::remove_file(format!("{}.d", file.0.display())).unwrap();
    let info = limiter.shared_info().unwrap();
    assert!(info.locks_held.iter().all(|&(s, _)| s != shard), "the lock was taken over");
    let after = limiter.metrics().keys;
    assert!(after >= before + 2000 - 1, "{policy}: no key lost but the one being inserted");
    eprintln!("{policy}: the slowest decision after the kill: {slowest} us");
}

#[test]
fn attaching_with_other_parameters_is_refused_naming_the_field() {
    let file = TableFile::new("mismatch");
    let policy: Policy = "token-bucket capacity=10 rate=1/s".parse().unwrap();
    let limiter = KeyedLimiter::<str>::open_shared(&file.0, &policy, 1000).unwrap();
    assert!(limiter.allow("k"));
    let field = |r: Result<KeyedLimiter<str, ratewell::SharedClock>, SharedError>| match r {
        Err(SharedError::Mismatch { field, .. }) => field,
        Err(e) => panic!("another error: {e}"),
        Ok(_) => panic!("attached"),
    };
    let other: Policy = "token-bucket capacity=11 rate=1/s".parse().unwrap();
    assert_eq!(field(KeyedLimiter::open_shared(&file.0, &other, 1000)), "policy");
    assert_eq!(field(KeyedLimiter::open_shared(&file.0, &policy, 100_000)), "capacity");
    let refuse = KeyedLimiter::<str>::builder(&policy, 1000).on_full(OnFull::Refuse);
    assert_eq!(field(refuse.open_shared(&file.0)), "on_full");
    let err = KeyedLimiter::<str>::open_shared(&file.0, &other, 1000).err().unwrap().to_string();
    assert!(err.contains("capacity=10") && err.contains("capacity=11"), "{err}");

    // Another layout version, written into the header (its third word).
    let mut bytes = std::fs::read(&file.0).unwrap();
    bytes[16..24].copy_from_slice(&2u64.to_le_bytes());
    let versioned = TableFile::new("version");
    std::fs::write(&versioned.0, &bytes).unwrap();
    assert_eq!(field(KeyedLimiter::open_shared(&versioned.0, &policy, 1000)), "layout version");

    // The table attached with its own parameters, and the state is the one shared.
    let again = KeyedLimiter::<str>::attach_shared(&file.0).unwrap();
    assert_eq!(again.policy(), policy);
    assert_eq!(again.request("k").peek().remaining(), 9);
    // Its policy is fixed.
    assert!(again.set_policy(&other).is_err());
    assert!(again.set_override("k", Some(&other)).is_err());
}

#[test]
fn a_shared_table_snapshots_and_is_restored_into_a_heap_limiter() {
    let file = TableFile::new("snapshot");
    let policy: Policy = "fixed-window limit=5 window=1h".parse().unwrap();
    let shared = KeyedLimiter::<str>::open_shared(&file.0, &policy, 1000).unwrap();
    for k in ["a", "b", "b"] {
        assert!(shared.allow(k));
    }
    assert!(shared.reset("a"));
    assert_eq!(shared.metrics().keys, 1);
    let mut bytes = Vec::new();
    shared.snapshot(&mut bytes).unwrap();
    // At 1,000 keys both tables have one shard of 125 buckets: the same shape.
    let mut heap = KeyedLimiter::<str>::new(&policy, 1000);
    let restored = heap.restore(&bytes[..], ratewell::Resume::WallClock).unwrap();
    assert_eq!(restored.keys, 1);
    assert_eq!(heap.request("b").peek().remaining(), 3);
    assert_eq!(heap.request("a").peek().remaining(), 5);
}

/// Wait for a child's `ready` line (after the test harness's own lines).
fn ready(child: &mut Child) {
    let out = std::io::BufReader::new(child.stdout.as_mut().unwrap());
    let mut lines = std::io::BufRead::lines(out);
    assert!(lines.any(|l| l.unwrap().trim() == "ready"), "the child said it was ready");
}

#[test]
fn a_snapshot_is_restored_into_a_new_shared_table_before_others_attach() {
    let policy: Policy = "fixed-window limit=5 window=1h".parse().unwrap();
    let heap = KeyedLimiter::<str>::new(&policy, 1000);
    for k in ["a", "b", "b"] {
        assert!(heap.allow(k));
    }
    let other: Policy = "fixed-window limit=9 window=1h".parse().unwrap();
    heap.set_override("c", Some(&other)).unwrap();
    assert!(heap.allow("c"));
    let mut bytes = Vec::new();
    heap.snapshot(&mut bytes).unwrap();
    let reset = heap.request("b").peek().reset_after_ns();

    // A new table (seeds of its own): it takes the snapshot's seeds and time line.
    let file = TableFile::new("restore");
    let mut shared = KeyedLimiter::<str>::open_shared(&file.0, &policy, 1000).unwrap();
    let restored = shared.restore(&bytes[..], ratewell::Resume::WallClock).unwrap();
    assert_eq!(restored.keys, 2, "{restored:?}");
    // The key stored under another policy (`c`, an override's) is not restored.
    assert_eq!(restored.fresh, 1, "{restored:?}");
    assert_eq!(shared.request("b").peek().remaining(), 3);
    assert_eq!(shared.request("a").peek().remaining(), 4);
    assert_eq!(shared.request("c").peek().remaining(), 5);
    // A process that attaches after reads the same keys on the same time line.
    let later = KeyedLimiter::<str>::open_shared(&file.0, &policy, 1000).unwrap();
    assert!(later.allow("b") && later.allow("b") && later.allow("b") && !later.allow("b"));
    assert!(!shared.allow("b"));
    let drift = later.request("b").peek().reset_after_ns().abs_diff(reset);
    assert!(drift < 60_000_000_000, "the window's end moved by {drift} ns");

    // Another live process attached: refused, and the table is left as it was.
    let mut holder = spawn(&format!("hold {} 5", file.0.display()));
    ready(&mut holder);
    let err = shared.restore(&bytes[..], ratewell::Resume::WallClock).unwrap_err();
    assert!(matches!(err, ratewell::SnapshotError::Shared), "{err}");
    assert_eq!(shared.request("a").peek().remaining(), 4);
    holder.kill().unwrap();
    holder.wait().unwrap();
    // Once it is gone, the restore goes through: "b" as the snapshot had it.
    shared.restore(&bytes[..], ratewell::Resume::WallClock).unwrap();
    assert_eq!(shared.request("b").peek().remaining(), 3);
}

#[test]
fn a_sliding_log_is_shared_and_restored() {
    let policy: Policy = "sliding-log limit=3 window=1h".parse().unwrap();
    let file = TableFile::new("log");
    let a = KeyedLimiter::<str>::open_shared(&file.0, &policy, 100).unwrap();
    let b = KeyedLimiter::<str>::open_shared(&file.0, &policy, 100).unwrap();
    assert!(a.allow("k") && b.allow("k"));
    let (decision, charge) = a.request("k").take();
    assert!(decision.is_admitted());
    assert!(!b.allow("k"), "three in the log, shared");
    a.refund(charge.unwrap());
    assert!(b.allow("k"), "the refund came off the shared log");
    assert_eq!(a.request("j").cost(2).peek().remaining(), 3);
    let info = a.shared_info().unwrap();
    assert_eq!(info.log_entries, 3);
    assert_eq!(a.metrics().keys, 1);
    let needed = KeyedLimiter::<str>::region_size(&policy, 100).unwrap();
    assert!(needed >= 100 * 3 * 16, "room for every key's whole log: {needed} bytes");
    // Snapshot, restore into a new table: the log is there, entry by entry.
    let mut bytes = Vec::new();
    a.snapshot(&mut bytes).unwrap();
    drop((a, b));
    let copy = TableFile::new("log-copy");
    let mut c = KeyedLimiter::<str>::open_shared(&copy.0, &policy, 100).unwrap();
    assert_eq!(c.restore(&bytes[..], ratewell::Resume::WallClock).unwrap().keys, 1);
    assert!(!c.allow("k"));
    assert_eq!(c.request("k").peek().remaining(), 0);
    // Another capacity is another geometry: refused, naming it.
    match KeyedLimiter::<str>::open_shared(&copy.0, &policy, 10_000) {
        Err(SharedError::Mismatch { field, table, .. }) => {
            assert_eq!(field, "capacity");
            assert!(table.contains("3 log entries"), "{table}");
        }
        other => panic!("{:?}", other.err()),
    }
}

#[test]
fn foreign_bytes_are_refused() {
    let policy: Policy = "fixed-window limit=3 window=1m".parse().unwrap();
    let file = TableFile::new("foreign");
    for bytes in [vec![0x55u8; 1 << 20], b"not a table".to_vec(), vec![7u8; 64 << 10]] {
        std::fs::write(&file.0, &bytes).unwrap();
        match KeyedLimiter::<str>::open_shared(&file.0, &policy, 100) {
            Err(SharedError::NotATable { .. } | SharedError::TooSmall { .. }) => {}
            Err(e) => panic!("another error: {e}"),
            Ok(_) => panic!("attached to foreign bytes"),
        }
        assert_eq!(std::fs::read(&file.0).unwrap(), bytes, "the file is left as it was");
    }
}

#[test]
fn a_dead_initialiser_is_taken_over() {
    // A region whose initialisation word names a process that is gone (and whose magic number
    // it had written): the next process initialises it anew.
    let policy: Policy = "token-bucket capacity=2 rate=1/h".parse().unwrap();
    let file = TableFile::new("init");
    let size = KeyedLimiter::<str>::region_size(&policy, 100).unwrap();
    let mut gone = Command::new("true").spawn().unwrap();
    gone.wait().unwrap();
    let mut bytes = vec![0u8; size];
    bytes[..8].copy_from_slice(&(u64::from(gone.id()) << 32 | 12345).to_le_bytes());
    bytes[8..16].copy_from_slice(b"RATEWELL");
    std::fs::write(&file.0, &bytes).unwrap();
    let limiter = KeyedLimiter::<str>::open_shared(&file.0, &policy, 100).unwrap();
    assert!(limiter.allow("k") && limiter.allow("k") && !limiter.allow("k"));
    assert_eq!(limiter.shared_info().unwrap().created_by, std::process::id());
}

#[test]
fn counters_from_the_region_are_not_trusted() {
    // A shard's key count (the header is 4096 bytes; a shard's second word is its count) and a
    // counter cell made huge by another process's bytes: sums saturate, the key count is capped
    // by the capacity, and a snapshot sized from it is still made.
    let policy: Policy = "token-bucket capacity=5 rate=1/s".parse().unwrap();
    let file = TableFile::new("counters");
    let limiter = KeyedLimiter::<str>::open_shared(&file.0, &policy, 100).unwrap();
    assert!(limiter.allow("k"));
    drop(limiter);
    let mut bytes = std::fs::read(&file.0).unwrap();
    bytes[4096 + 8..4096 + 16].copy_from_slice(&u64::MAX.to_le_bytes());
    std::fs::write(&file.0, &bytes).unwrap();
    let limiter = KeyedLimiter::<str>::open_shared(&file.0, &policy, 100).unwrap();
    let m = limiter.metrics();
    assert_eq!(m.keys, m.capacity);
    let mut out = Vec::new();
    assert_eq!(limiter.snapshot(&mut out).unwrap().keys, 1);
    assert!(limiter.allow("k"));
}
