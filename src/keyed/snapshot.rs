//! A keyed limiter's snapshots (the format: `src/snapshot.rs`).
//!
//! Writing reads each shard under its insert lock, so no key is caught between its two buckets
//! and every key is written once; decisions on present keys take no lock and go on. Each state
//! is one atomic load: the key's state at some instant of the snapshot.
//!
//! Restoring parses and checks the whole snapshot before it changes anything: an error leaves
//! the limiter as it was. Then it forgets every key, takes the snapshot's hash seeds, maps the
//! snapshot's policy slots onto its own ([`Registry::adopt`]) and stores each key in the bucket
//! it was in.
//!
//! [`Registry::adopt`]: super::registry::Registry::adopt

use std::hash::Hash;
use std::io::{Read, Write};
use std::path::Path;
use std::time::SystemTime;

use super::table::Table;
use super::{Backend, KeyedLimiter, Store};
use crate::algorithms::{Algorithm, sliding_log::Log};
use crate::clock::Clock;
use crate::snapshot::{
    self, Header, In, KIND_LOGS, KIND_WORDS, Out, PROBE, Restored, Resume, SnapshotError,
    SnapshotInfo, kind_name,
};

type Parse<T> = Result<T, SnapshotError>;

/// A snapshot read and checked, not yet applied.
pub(crate) struct Parsed {
    pub(crate) header: Header,
    seeds: [u64; 4],
    slots: Vec<snapshot::Slot>,
    records: Records,
}

enum Records {
    /// `(position, key word, state)`.
    Words(Vec<(u64, u64, u64)>),
    /// `(hash, slot, log)`.
    Logs(Vec<(u64, u8, Log)>),
}

/// The most entries a sliding log holds (its largest limit).
const MAX_ENTRIES: u32 = crate::algorithms::sliding_log::MAX_LIMIT;

/// The hash state of `seeds`.
pub(crate) fn hasher_of(seeds: [u64; 4]) -> ahash::RandomState {
    ahash::RandomState::with_seeds(seeds[0], seeds[1], seeds[2], seeds[3])
}

impl<K: Hash + ?Sized, C: Clock> KeyedLimiter<K, C> {
    /// Write a snapshot of every key's state to `w`, while decisions go on: each key's state as
    /// it was at some instant of the snapshot (see `docs/SEMANTICS.md`, *Snapshots*). The bytes
    /// are built in memory, then written with one `write_all`: about 17 bytes a key of one-word
    /// state.
    ///
    /// Read back with [`restore`](Self::restore) into a limiter of the same capacity and key
    /// type, in this build or a later one that reads the format's version.
    ///
    /// # Examples
    ///
    /// ```
    /// use ratewell::{KeyedLimiter, ManualClock, Policy, Resume};
    ///
    /// let policy: Policy = "fixed-window limit=3 window=1h".parse()?;
    /// let limiter = KeyedLimiter::<str, _>::with_clock(&policy, 1_000, ManualClock::new(0));
    /// limiter.request("alice").cost(2).check();
    /// let mut bytes = Vec::new();
    /// limiter.snapshot(&mut bytes)?;
    ///
    /// // Another process, later: alice's spent budget is still spent.
    /// let mut restarted = KeyedLimiter::<str, _>::with_clock(&policy, 1_000, ManualClock::new(0));
    /// let restored = restarted.restore(&bytes[..], Resume::WallClock)?;
    /// assert_eq!(restored.keys, 1);
    /// assert_eq!(restarted.check("alice").remaining(), 0);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn snapshot(&self, mut w: impl Write) -> std::io::Result<SnapshotInfo> {
        let (bytes, info) = self.snapshot_now();
        w.write_all(&bytes)?;
        w.flush()?;
        Ok(info)
    }

    /// [`snapshot`](Self::snapshot) into the file at `path`, replacing it only once the new one
    /// is whole: written beside it (`path` with `.tmp` appended), synced, then renamed over it.
    pub fn save(&self, path: impl AsRef<Path>) -> std::io::Result<SnapshotInfo> {
        let (bytes, info) = self.snapshot_now();
        snapshot::write_file(path.as_ref(), &bytes)?;
        Ok(info)
    }

    /// A snapshot's bytes now, anchored at the system clock's reading now.
    fn snapshot_now(&self) -> (Vec<u8>, SnapshotInfo) {
        let anchor = SystemTime::now();
        let now = self.floor.now(&self.clock);
        let (bytes, keys) = self.snapshot_bytes(now, snapshot::wall_ns(anchor));
        let info = SnapshotInfo { keys, bytes: bytes.len() as u64, anchor };
        (bytes, info)
    }

    /// Replace every key's state by the snapshot read from `r`, with time passed as `resume`
    /// says.
    ///
    /// The snapshot is read and checked whole before anything changes: on any error (a
    /// truncated, corrupted or foreign file, another version, a table of another capacity) the
    /// limiter is as it was. Then:
    ///
    /// - the limiter takes the snapshot's key hash (its seeds), so the keys are found again, and
    ///   its clock is put on the snapshot's time line (see [`Resume`]): every window, refill
    ///   schedule and log entry is where it was, older by the time that passed;
    /// - a key whose policy is the one it is decided under here keeps its state as it is; a key
    ///   whose policy changed is converted when next decided, as [`set_policy`](Self::set_policy)
    ///   converts; keys back to full by now are not stored;
    /// - registered policies ([`register`](Self::register)) whose keys should keep their states
    ///   exactly may be registered before or after.
    ///
    /// Per-key overrides name keys by the hash the restore replaces: set them after restoring
    /// (a limiter that has some refuses with [`SnapshotError::Overrides`]). Restoring needs a
    /// limiter of the snapshot's capacity for one-word states (a key's place is not computable
    /// from its stored fingerprint at another capacity); a sliding log's table can be restored
    /// at any capacity, the keys that do not fit counted in [`Restored::dropped`].
    ///
    /// [`Resume::WallClock`] counts the system time that passed since the snapshot was taken; a
    /// snapshot from a file is `File::open(path)?`.
    pub fn restore(&mut self, r: impl Read, resume: Resume) -> Result<Restored, SnapshotError> {
        let bytes = snapshot::read_all(r, self.snapshot_limit())?;
        let parsed = self.parse_snapshot(&bytes)?;
        #[cfg(all(target_os = "linux", not(ratewell_loom)))]
        if self.region.is_some() && !self.alone_on_region() {
            return Err(SnapshotError::Shared);
        }
        let elapsed = snapshot::elapsed(resume, parsed.header.anchor);
        let reading = self.floor.reading(&self.clock);
        let offset = snapshot::offset(parsed.header.now, elapsed, reading);
        self.floor.set_offset(offset);
        // A shared table's header takes the snapshot's seeds and time line, for the processes
        // that attach after.
        #[cfg(all(target_os = "linux", not(ratewell_loom)))]
        self.publish_restore(parsed.seeds, offset);
        let now = reading.wrapping_add(offset);
        let mut restored = self.apply_snapshot(parsed, now);
        restored.elapsed = elapsed.unwrap_or_default();
        Ok(restored)
    }

    /// Forget every key (a layer a layered snapshot does not name).
    pub(crate) fn forget_all(&mut self) {
        let secret = self.hasher.hash_one(0x5eed_u64);
        with_store!(mut self, store => store.reseed(secret));
    }

    /// The longest snapshot this limiter could have written (one-word states: a header, 255
    /// policies, every slot); a sliding log's is not bounded here.
    pub(crate) fn snapshot_limit(&self) -> u64 {
        match &self.backend {
            Backend::Words(table) => 256 + 255 * (4 + 65_535) + table_capacity(table) * 26,
            _ => u64::MAX,
        }
    }

    /// The snapshot's bytes at `now`, anchored at `anchor` (ns since the epoch), and its keys.
    pub(crate) fn snapshot_bytes(&self, now: u64, anchor: u64) -> (Vec<u8>, u64) {
        // Keys present now: the buffer's size (the per-thread decision counts are not needed).
        let len = with_store!(self, store => store.stats().len) as usize;
        let (kind, shape) = match &self.backend {
            Backend::Words(t) => (KIND_WORDS, t.shape()),
            Backend::Logs(t) => (KIND_LOGS, t.shape()),
            #[cfg(all(target_os = "linux", not(ratewell_loom)))]
            Backend::SharedLogs(t) => (KIND_LOGS, t.shape()),
        };
        let mut out = Out(Vec::with_capacity(1024 + len * 18));
        out.header(kind, 0, now, anchor);
        for seed in self.seeds {
            out.u64(seed);
        }
        out.u64(self.hasher.hash_one(PROBE));
        out.u64(shape.0);
        out.u64(shape.1);
        snapshot::write_slots(&mut out, &self.registry.slots_in_use());
        let count_at = out.0.len();
        out.u64(0);
        let mut keys = 0u64;
        match &self.backend {
            Backend::Words(table) => {
                let mut last = 0;
                table.snapshot(|position, key, state| {
                    out.leb(position - last);
                    last = position;
                    out.u64(key);
                    out.u64(state);
                    keys += 1;
                });
            }
            Backend::Logs(table) => table.snapshot(|hash, idx, log| {
                write_log(&mut out, hash, idx, log);
                keys += 1;
            }),
            #[cfg(all(target_os = "linux", not(ratewell_loom)))]
            Backend::SharedLogs(table) => table.snapshot(|hash, idx, log| {
                write_log(&mut out, hash, idx, log);
                keys += 1;
            }),
        }
        out.0[count_at..count_at + 8].copy_from_slice(&keys.to_le_bytes());
        out.seal();
        (out.0, keys)
    }

    /// Read and check a whole snapshot for this limiter, changing nothing.
    pub(crate) fn parse_snapshot(&self, bytes: &[u8]) -> Parse<Parsed> {
        let (header, mut input) = snapshot::open(bytes)?;
        let (expected, shape) = match &self.backend {
            Backend::Words(t) => (KIND_WORDS, t.shape()),
            Backend::Logs(t) => (KIND_LOGS, t.shape()),
            #[cfg(all(target_os = "linux", not(ratewell_loom)))]
            Backend::SharedLogs(t) => (KIND_LOGS, t.shape()),
        };
        if header.kind != expected || header.count != 0 {
            return Err(SnapshotError::Kind {
                found: kind_name(header.kind),
                expected: kind_name(expected),
            });
        }
        if self.registry.has_overrides() {
            return Err(SnapshotError::Overrides);
        }
        let mut seeds = [0u64; 4];
        for seed in &mut seeds {
            *seed = input.u64()?;
        }
        if hasher_of(seeds).hash_one(PROBE) != input.u64()? {
            return Err(SnapshotError::HashFunction);
        }
        let found = (input.u64()?, input.u64()?);
        if header.kind == KIND_WORDS && found != shape {
            return Err(SnapshotError::Shape { found, expected: shape });
        }
        let slots = snapshot::read_slots(&mut input)?;
        let is_log = |p: &crate::Policy| matches!(p.algorithm, Algorithm::Log(_));
        if slots.iter().any(|(_, _, p)| is_log(p) != (header.kind == KIND_LOGS)) {
            return Err(SnapshotError::Corrupt("a policy of the other kind of table"));
        }
        let mut policy_of = vec![None; 256];
        for (idx, _, policy) in &slots {
            policy_of[usize::from(*idx)] = Some(&policy.algorithm);
        }
        let count = input.u64()?;
        let records = match header.kind {
            KIND_WORDS => Records::Words(read_words(&mut input, count, shape, &policy_of)?),
            _ => Records::Logs(read_logs(&mut input, count, &policy_of)?),
        };
        if !input.is_empty() {
            return Err(SnapshotError::Corrupt("bytes after the last key"));
        }
        Ok(Parsed { header, seeds, slots, records })
    }

    /// Forget every key and store the snapshot's, deciding at `now` which are back to full.
    /// Cannot fail: everything that could was checked by [`parse_snapshot`](Self::parse_snapshot).
    pub(crate) fn apply_snapshot(&mut self, parsed: Parsed, now: u64) -> Restored {
        let Parsed { seeds, slots, records, .. } = parsed;
        self.seeds = seeds;
        self.hasher = hasher_of(seeds);
        let secret = self.hasher.hash_one(0x5eed_u64);
        with_store!(mut self, store => store.reseed(secret));
        let map = if self.region.is_some() {
            // A shared table's policy is fixed (every process has its own registry): keys of
            // the snapshot under that policy keep their states; the others are not restored.
            let own = self.registry.default_policy().clone();
            let slot = super::registry::Policies::resolve(&self.registry, 0).0;
            let mut map = vec![None; 256];
            for (idx, _, policy) in &slots {
                map[usize::from(*idx)] = (*policy == own).then_some(slot);
            }
            map
        } else {
            self.registry.adopt(&slots)
        };
        let mut policy_of = vec![None; 256];
        for (idx, _, policy) in &slots {
            policy_of[usize::from(*idx)] = Some(policy.algorithm.clone());
        }
        let mut restored = Restored::default();
        match (&mut self.backend, records) {
            (Backend::Words(table), Records::Words(records)) => {
                for (position, key, state) in records {
                    let idx = Table::policy_of(key);
                    let Some(to) = map[usize::from(idx)] else {
                        restored.fresh += 1;
                        continue;
                    };
                    let policy = policy_of[usize::from(idx)].as_ref().expect("checked");
                    if policy.reset_after(state, now) == 0 {
                        restored.expired += 1;
                    } else if table.put(position, Table::with_policy(key, to), state) {
                        restored.keys += 1;
                    } else {
                        restored.dropped += 1;
                    }
                }
            }
            (Backend::Logs(table), Records::Logs(records)) => {
                restore_logs(records, &map, &policy_of, now, &mut restored, |hash, idx, log| {
                    table.put(hash, idx, log)
                });
            }
            #[cfg(all(target_os = "linux", not(ratewell_loom)))]
            (Backend::SharedLogs(table), Records::Logs(records)) => {
                restore_logs(records, &map, &policy_of, now, &mut restored, |hash, idx, log| {
                    table.put(hash, idx, &log)
                });
            }
            _ => unreachable!("checked: the snapshot's kind is the table's"),
        }
        restored
    }
}

fn table_capacity(table: &Table) -> u64 {
    let (shards, buckets) = table.shape();
    shards * buckets * 8
}

/// One-word records: each position within the table, ascending, at most eight keys a bucket,
/// each a valid key word of a slot the snapshot names.
fn read_words(
    input: &mut In<'_>,
    count: u64,
    (shards, per_shard): (u64, u64),
    policy_of: &[Option<&Algorithm>],
) -> Parse<Vec<(u64, u64, u64)>> {
    let buckets = shards * per_shard;
    if count > buckets * 8 {
        return Err(SnapshotError::Corrupt("more keys than the table has slots"));
    }
    let mut records = Vec::with_capacity(count as usize);
    let (mut position, mut in_bucket) = (0u64, 0);
    for _ in 0..count {
        let delta = input.leb()?;
        position = position
            .checked_add(delta)
            .filter(|&p| p < buckets)
            .ok_or(SnapshotError::Corrupt("a key's bucket"))?;
        in_bucket = if delta == 0 && !records.is_empty() { in_bucket + 1 } else { 1 };
        let key = input.u64()?;
        let state = input.u64()?;
        if in_bucket > 8 {
            return Err(SnapshotError::Corrupt("more than eight keys in a bucket"));
        }
        if !Table::valid_key(key) || policy_of[usize::from(Table::policy_of(key))].is_none() {
            return Err(SnapshotError::Corrupt("a key word"));
        }
        records.push((position, key, state));
    }
    Ok(records)
}

/// Sliding-log records: each log one its policy could have written.
fn read_logs(
    input: &mut In<'_>,
    count: u64,
    policy_of: &[Option<&Algorithm>],
) -> Parse<Vec<(u64, u8, Log)>> {
    let mut records = Vec::new();
    for _ in 0..count {
        let hash = input.u64()?;
        let idx = input.u8()?;
        let n = input.u32()?;
        let Some(Algorithm::Log(policy)) = policy_of[usize::from(idx)] else {
            return Err(SnapshotError::Corrupt("a key's policy slot"));
        };
        if n > MAX_ENTRIES {
            return Err(SnapshotError::Corrupt("a log longer than any limit"));
        }
        let mut entries = Vec::with_capacity(n as usize);
        for _ in 0..n {
            entries.push((input.u64()?, u64::from(input.u32()?)));
        }
        let log =
            Log::from_entries(policy, entries).ok_or(SnapshotError::Corrupt("a key's log"))?;
        records.push((hash, idx, log));
    }
    Ok(records)
}

/// One key's log in a snapshot: its hash, policy slot, entries, and each entry's time and cost.
fn write_log(out: &mut Out, hash: u64, idx: u8, log: &Log) {
    out.u64(hash);
    out.u8(idx);
    out.u32(log.entries().len() as u32);
    for (t, cost) in log.entries() {
        out.u64(t);
        out.u32(cost as u32);
    }
}

/// Restore a snapshot's logs with `put`, counting what became of each in `restored`.
fn restore_logs(
    mut records: Vec<(u64, u8, Log)>,
    map: &[Option<u8>],
    policy_of: &[Option<Algorithm>],
    now: u64,
    restored: &mut Restored,
    mut put: impl FnMut(u64, u8, Log) -> bool,
) {
    // Each shard's list runs from the least recently admitted key: re-inserted in the order of
    // their newest entries, keys of one old shard keep their order.
    records.sort_by_key(|(_, _, log)| log.entries().last().map_or(0, |(t, _)| t));
    for (hash, idx, log) in records {
        let Some(to) = map[usize::from(idx)] else {
            restored.fresh += 1;
            continue;
        };
        let Some(Algorithm::Log(policy)) = &policy_of[usize::from(idx)] else {
            unreachable!("checked: every slot of a log table is a log")
        };
        if policy.is_fresh(&log, now) {
            restored.expired += 1;
        } else if put(hash, to, log) {
            restored.keys += 1;
        } else {
            restored.dropped += 1;
        }
    }
}
