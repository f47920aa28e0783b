//! `STATE_FILE`: the memory store's counts survive a restart of the binary: written at
//! shutdown (SIGTERM) and every `STATE_INTERVAL` (so a crash loses at most that much), read at
//! start; a file that cannot be restored is logged, and the counts start empty.

mod common;

use std::time::Duration;

use common::*;
use ratewell_rls::proto::Code;

const CONFIG: &str = "
domain: state
descriptors:
  - key: route
    rate_limit: {unit: hour, requests_per_unit: 3}
";

async fn ask(b: &Binary) -> (Code, u32) {
    let r = b
        .client()
        .await
        .should_rate_limit(request("state", &[&[("route", "x")]], 1))
        .await
        .unwrap()
        .into_inner();
    (Code::try_from(r.overall_code).unwrap(), r.statuses[0].limit_remaining)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counts_survive_a_restart() {
    let root = tempfile::tempdir().unwrap();
    write_config(root.path(), &[("state.yaml", CONFIG)]);
    let root_s = root.path().display().to_string();
    let state = root.path().join("state.bin");
    let state_s = state.display().to_string();
    let env = [
        ("RUNTIME_ROOT", root_s.as_str()),
        ("RUNTIME_SUBDIRECTORY", "ratelimit"),
        ("STATE_FILE", state_s.as_str()),
        ("STATE_INTERVAL", "100ms"),
    ];
    clear_of_boundary(3600, 30).await;

    // Written at shutdown.
    let mut b = Binary::spawn(&env);
    assert_eq!(ask(&b).await, (Code::Ok, 2));
    assert_eq!(ask(&b).await, (Code::Ok, 1));
    assert!(b.terminate().success(), "exits 0 on SIGTERM");
    assert!(state.exists());

    // Read at start; then written every interval: a kill after it loses nothing.
    let b = Binary::spawn(&env);
    assert!(b.logged("keys restored"), "{:?}", b.lines());
    assert_eq!(ask(&b).await, (Code::Ok, 0));
    written_again(&state).await;
    drop(b); // SIGKILL: no shutdown write.
    let mut b = Binary::spawn(&env);
    assert_eq!(ask(&b).await, (Code::OverLimit, 0));
    assert!(b.terminate().success());

    // Without STATE_FILE the counts start afresh.
    let b = Binary::spawn(&env[..2]);
    assert_eq!(ask(&b).await, (Code::Ok, 2));
    drop(b);

    // A file that is not a state file: logged, and the counts start empty.
    std::fs::write(&state, b"garbage").unwrap();
    let b = Binary::spawn(&env);
    assert!(b.logged("the counts start empty"), "{:?}", b.lines());
    assert_eq!(ask(&b).await, (Code::Ok, 2));
}

/// Wait until the periodic write has replaced `path` with a snapshot taken after this call:
/// two replacements seen (the writes follow one another, so the second began after the first
/// had finished, which was after the call). Each write replaces the file (a new file renamed
/// over it): a replacement is a new (inode, modification time).
async fn written_again(path: &std::path::Path) {
    use std::os::unix::fs::MetadataExt;
    let id = || {
        let m = std::fs::metadata(path).expect("the state file");
        (m.ino(), m.modified().unwrap())
    };
    let deadline = std::time::Instant::now() + DEADLINE;
    let mut last = id();
    let mut seen = 0;
    while seen < 2 {
        assert!(std::time::Instant::now() < deadline, "not written twice within {DEADLINE:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
        let now = id();
        if now != last {
            seen += 1;
        }
        last = now;
    }
}
