//! A keyed limiter on a shared region: the layout, the header, attaching, and the API
//! ([`KeyedLimiter::open_shared`], [`KeyedLimiter::attach_shared`], [`Builder::open_shared`],
//! [`Builder::in_region`]).

use std::hash::Hash;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use super::lock::{self, Liveness, System};
use super::logs::{Geometry, LogRegion};
use crate::algorithms::Algorithm;
use crate::clock::{Floor, SharedClock};
use crate::keyed::counts::{self, Counters, Counts};
use crate::keyed::registry::Registry;
use crate::keyed::store::Backend;
use crate::keyed::table::{Bucket, CapacityError, OnFull, Shard, Table};
use crate::keyed::{Builder, KeyedLimiter};
use crate::mem::{Region, Slab};
use crate::policy::{Policy, PolicyError};
use crossbeam_utils::CachePadded;

/// `"RATEWELL"`, little-endian: the header's second word.
const MAGIC: u64 = u64::from_le_bytes(*b"RATEWELL");
/// The layout this code reads and writes; any change to the header or the table's layout
/// changes it.
pub(crate) const VERSION: u64 = 1;
const HEADER_BYTES: usize = 4096;
/// Processes that count in a block of their own at once (the rest count on the stripes).
const BLOCKS: usize = 16;
/// The most bytes of policy text the header holds.
const POLICY_BYTES: usize = 1024;

/// The header's words.
mod word {
    pub(super) const INIT: usize = 0;
    pub(super) const MAGIC: usize = 1;
    pub(super) const VERSION: usize = 2;
    pub(super) const TOTAL: usize = 3;
    pub(super) const SHARDS: usize = 4;
    pub(super) const BUCKETS_PER_SHARD: usize = 5;
    pub(super) const ON_FULL: usize = 6;
    pub(super) const SEEDS: usize = 7; // 4 words
    pub(super) const PROBE: usize = 11;
    pub(super) const CLOCK_START: usize = 12;
    pub(super) const CLOCK_SCALE: usize = 13;
    pub(super) const BOOT: usize = 14; // 2 words
    pub(super) const BLOCKS: usize = 16;
    pub(super) const POLICY_LEN: usize = 17;
    pub(super) const SHARDS_AT: usize = 18;
    pub(super) const COUNTS_AT: usize = 19;
    pub(super) const BUCKETS_AT: usize = 20;
    pub(super) const CREATED_BY: usize = 21;
    pub(super) const PID_NAMESPACE: usize = 22;
    /// A sliding log's entries per key (0: a one-word table).
    pub(super) const LOG_ENTRIES: usize = 23;
    /// Added to every process's clock readings: a restore's time line (0 until one).
    pub(super) const CLOCK_OFFSET: usize = 24;
    pub(super) const OWNERS: usize = 32; // BLOCKS words
    pub(super) const POLICY: usize = 64; // POLICY_BYTES / 8 words
}
const _: () = assert!(word::OWNERS + BLOCKS <= word::POLICY);
const _: () = assert!((word::POLICY + POLICY_BYTES / 8) * 8 <= HEADER_BYTES);

/// Why a shared table cannot be opened or attached.
#[derive(Debug)]
#[non_exhaustive]
pub enum SharedError {
    /// The file could not be opened, sized or mapped.
    Io(std::io::Error),
    /// The capacity cannot be had.
    Capacity(CapacityError),
    /// The region is smaller than the table needs.
    TooSmall {
        /// Bytes the table needs ([`KeyedLimiter::region_size`]).
        needed: usize,
        /// Bytes the region has.
        given: usize,
    },
    /// The region's start is not aligned to 8 bytes.
    Misaligned,
    /// The region holds something else than a table of this crate (its magic number differs),
    /// or a header no table writes.
    NotATable {
        /// What is wrong with it.
        reason: String,
    },
    /// The region holds a table made with other parameters than the ones asked for: attaching
    /// would misread it, so it is refused.
    Mismatch {
        /// Which: `layout version`, `capacity`, `policy`, `on_full`, `hasher`, `pid namespace`,
        /// `clock` or `boot`.
        field: &'static str,
        /// The table's.
        table: String,
        /// The one asked for (or this process's).
        ours: String,
    },
}

impl std::fmt::Display for SharedError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SharedError::Io(e) => write!(f, "the shared table's file: {e}"),
            SharedError::Capacity(e) => e.fmt(f),
            SharedError::TooSmall { needed, given } => {
                write!(f, "the region has {given} bytes; the table needs {needed}")
            }
            SharedError::Misaligned => write!(f, "the region does not start on an 8-byte boundary"),
            SharedError::NotATable { reason } => {
                write!(f, "the region is not a ratewell shared table: {reason}")
            }
            SharedError::Mismatch { field, table, ours } => write!(
                f,
                "the shared table was made with {field} {table}, not {ours}: attaching would \
                 misread it (remove it, or attach with its parameters)"
            ),
        }
    }
}

impl std::error::Error for SharedError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            SharedError::Io(e) => Some(e),
            SharedError::Capacity(e) => Some(e),
            _ => None,
        }
    }
}

impl From<std::io::Error> for SharedError {
    fn from(e: std::io::Error) -> Self {
        SharedError::Io(e)
    }
}

impl From<CapacityError> for SharedError {
    fn from(e: CapacityError) -> Self {
        SharedError::Capacity(e)
    }
}

/// What a shared table's header says, and its processes' counter blocks: what `ratewell
/// inspect` prints.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct SharedInfo {
    /// The layout version.
    pub version: u64,
    /// The region's size in bytes.
    pub bytes: u64,
    /// Shards.
    pub shards: u64,
    /// Buckets (of 8 slots) per shard; for a sliding log's table, keys per shard.
    pub buckets_per_shard: u64,
    /// A sliding log's table: the entries a key's log holds (the policy's limit); 0 for a
    /// one-word table.
    pub log_entries: u64,
    /// What a new key does when its candidate slots are live.
    pub on_full: OnFull,
    /// The clock's scale: nanoseconds per 2^32 ticks of the counter it reads.
    pub clock_scale: u64,
    /// The pid of the process that initialised the table.
    pub created_by: u32,
    /// The pids of the processes whose counter blocks are leased, and whether each is alive.
    pub processes: Vec<(u32, bool)>,
    /// The shards whose insert lock is held, and the holder's pid (a holder that is gone is
    /// taken over by the next process that needs the shard).
    pub locks_held: Vec<(usize, u32)>,
}

/// Where each part of a table of some geometry lies in its region. A sliding log's table has
/// `logs`: its keys per shard are `buckets_per_shard`, and its logs lie where a one-word
/// table's buckets would.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Layout {
    shards: u64,
    buckets_per_shard: u64,
    logs: Option<Geometry>,
    shards_at: usize,
    counts_at: usize,
    buckets_at: usize,
    total: usize,
}

impl Layout {
    /// The layout of a one-word table of `shards` shards of `buckets_per_shard` buckets (with
    /// `entries` 0), or of a sliding log's of `shards` shards of `buckets_per_shard` keys of
    /// `entries` entries.
    fn new(shards: u64, buckets_per_shard: u64, entries: u64) -> Result<Self, CapacityError> {
        let keys = if entries == 0 { 8 } else { 1 };
        let too_large = || CapacityError::TooLarge {
            requested: shards.saturating_mul(buckets_per_shard).saturating_mul(keys),
            max: crate::keyed::table::MAX_CAPACITY,
        };
        let buckets = shards.checked_mul(buckets_per_shard).ok_or_else(too_large)?;
        if buckets.checked_mul(keys).is_none_or(|slots| slots > crate::keyed::table::MAX_CAPACITY) {
            return Err(too_large());
        }
        let buckets = usize::try_from(buckets).map_err(|_| too_large())?;
        let shards_at = HEADER_BYTES;
        let counts_at = shards_at + shards as usize * size_of::<Shard>();
        let counts_end = counts_at + counts::region_cells(BLOCKS) * size_of::<Counters>();
        let buckets_at = counts_end.next_multiple_of(4096);
        let (logs, bytes) = if entries == 0 {
            (None, buckets.checked_mul(size_of::<Bucket>()).ok_or_else(too_large)?)
        } else {
            let geo = Geometry::new(shards, buckets_per_shard, entries).ok_or_else(too_large)?;
            (Some(geo), geo.bytes())
        };
        let total = bytes
            .checked_add(buckets_at)
            .and_then(|t| t.checked_next_multiple_of(4096))
            .ok_or_else(too_large)?;
        Ok(Layout { shards, buckets_per_shard, logs, shards_at, counts_at, buckets_at, total })
    }

    /// Keys the table holds: 8 a bucket, or `buckets_per_shard` a shard for logs.
    fn keys(&self) -> u64 {
        let per_bucket = if self.logs.is_some() { 1 } else { 8 };
        self.shards * self.buckets_per_shard * per_bucket
    }

    /// A shared table has shards of about 8,192 keys, not a heap table's 1,024: its shards
    /// fill more evenly, so that live keys are first evicted later (a shard is a fixed part of
    /// the table, and its fullest shard fills first), and its processes contend on its insert
    /// locks only when they insert.
    ///
    /// A sliding log's table has as many shards, each of `capacity / shards` keys (rounded
    /// up), each with room for the policy's limit in entries.
    fn for_policy(policy: &Policy, capacity: usize) -> Result<Self, CapacityError> {
        let shards = |capacity: u64| (capacity / 8192).clamp(1, 256).next_power_of_two();
        match &policy.algorithm {
            Algorithm::Log(log) => {
                let capacity = (capacity as u64).max(1);
                if capacity > crate::keyed::table::MAX_CAPACITY {
                    return Err(CapacityError::TooLarge {
                        requested: capacity,
                        max: crate::keyed::table::MAX_CAPACITY,
                    });
                }
                let n = shards(capacity);
                Self::new(n, capacity.div_ceil(n), log.max_entries())
            }
            _ => {
                let (shards, per_shard) = Table::geometry_with(capacity, shards)?;
                Self::new(shards, per_shard, 0)
            }
        }
    }
}

/// What a process asks of the table it attaches to (built by [`Builder::wanted`]).
struct Wanted {
    policy: Policy,
    layout: Layout,
    on_full: OnFull,
    seed: Option<u64>,
}

fn on_full_code(on_full: OnFull) -> u64 {
    match on_full {
        OnFull::EvictLeastGranting => 0,
        OnFull::Refuse => 1,
    }
}

fn on_full_of(code: u64) -> Option<OnFull> {
    match code {
        0 => Some(OnFull::EvictLeastGranting),
        1 => Some(OnFull::Refuse),
        _ => None,
    }
}

/// The kernel's boot id (`/proc/sys/kernel/random/boot_id`) as two words; zeros where unknown.
fn boot_id() -> [u64; 2] {
    let text = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap_or_default();
    let hex: String = text.chars().filter(char::is_ascii_hexdigit).collect();
    let half = |s: &str| u64::from_str_radix(s, 16).unwrap_or(0);
    if hex.len() == 32 { [half(&hex[..16]), half(&hex[16..])] } else { [0, 0] }
}

/// This process's pid namespace (the inode of `/proc/self/ns/pid`; 0 where unknown): the
/// processes of one table must name each other's pids alike, or one would take another's live
/// lock for a dead one's.
fn pid_namespace() -> u64 {
    let link = std::fs::read_link("/proc/self/ns/pid").unwrap_or_default();
    let text = link.to_string_lossy();
    text.trim_start_matches("pid:[").trim_end_matches(']').parse().unwrap_or(0)
}

/// The hasher of `seeds`, and its probe: the hash of a fixed value, which differs between
/// builds whose `ahash` hashes differently (another version, other CPU features).
fn hasher_and_probe(seeds: [u64; 4]) -> (ahash::RandomState, u64) {
    let hasher = crate::keyed::snapshot::hasher_of(seeds);
    let probe = hasher.hash_one(0x7072_6f62_6520_6861_u64);
    (hasher, probe)
}

fn read_policy(words: &[AtomicU64]) -> Result<String, SharedError> {
    let len = words[word::POLICY_LEN].load(Ordering::Relaxed) as usize;
    if len > POLICY_BYTES {
        return Err(SharedError::NotATable { reason: format!("a policy of {len} bytes") });
    }
    let bytes: Vec<u8> = words[word::POLICY..word::POLICY + POLICY_BYTES / 8]
        .iter()
        .flat_map(|w| w.load(Ordering::Relaxed).to_le_bytes())
        .take(len)
        .collect();
    String::from_utf8(bytes)
        .map_err(|_| SharedError::NotATable { reason: "a policy that is not UTF-8".into() })
}

/// Write the header of a new table into `words` (every word but the initialisation word), which
/// the caller has claimed: the magic number first (so that a process that takes over a dead
/// initialiser knows the region for a table's), then zeros over everything else unless the
/// region is known to be zeros, then the header.
fn write_header(words: &[AtomicU64], want: &Wanted, fresh: bool, text: &str) {
    words[word::MAGIC].store(MAGIC, Ordering::Relaxed);
    if !fresh {
        for w in &words[word::MAGIC + 1..] {
            if w.load(Ordering::Relaxed) != 0 {
                w.store(0, Ordering::Relaxed);
            }
        }
    }
    let seeds = match want.seed {
        Some(seed) => crate::keyed::reseeded(seed),
        None => {
            let random = ahash::RandomState::new();
            [1u64, 2, 3, 4].map(|i| random.hash_one(i))
        }
    };
    let (_, probe) = hasher_and_probe(seeds);
    let clock = SharedClock::calibrate();
    let l = &want.layout;
    let set = |i: usize, v: u64| words[i].store(v, Ordering::Relaxed);
    set(word::VERSION, VERSION);
    set(word::TOTAL, l.total as u64);
    set(word::SHARDS, l.shards);
    set(word::BUCKETS_PER_SHARD, l.buckets_per_shard);
    set(word::LOG_ENTRIES, l.logs.map_or(0, |g| g.entries));
    set(word::ON_FULL, on_full_code(want.on_full));
    for (i, s) in seeds.iter().enumerate() {
        set(word::SEEDS + i, *s);
    }
    set(word::PROBE, probe);
    set(word::CLOCK_START, clock.0);
    set(word::CLOCK_SCALE, clock.1);
    let boot = boot_id();
    set(word::BOOT, boot[0]);
    set(word::BOOT + 1, boot[1]);
    set(word::BLOCKS, BLOCKS as u64);
    set(word::POLICY_LEN, text.len() as u64);
    for (i, chunk) in text.as_bytes().chunks(8).enumerate() {
        let mut b = [0u8; 8];
        b[..chunk.len()].copy_from_slice(chunk);
        set(word::POLICY + i, u64::from_le_bytes(b));
    }
    set(word::SHARDS_AT, l.shards_at as u64);
    set(word::COUNTS_AT, l.counts_at as u64);
    set(word::BUCKETS_AT, l.buckets_at as u64);
    set(word::CREATED_BY, u64::from(std::process::id()));
    set(word::PID_NAMESPACE, pid_namespace());
}

/// The layout a header describes, checked against the region's size and the offsets it would
/// give (a header no table writes is refused).
fn layout_of(words: &[AtomicU64], bytes: usize) -> Result<Layout, SharedError> {
    let get = |i: usize| words[i].load(Ordering::Relaxed);
    let not = |reason: String| SharedError::NotATable { reason };
    if get(word::MAGIC) != MAGIC {
        return Err(not("its magic number differs".into()));
    }
    if get(word::VERSION) != VERSION {
        return Err(SharedError::Mismatch {
            field: "layout version",
            table: get(word::VERSION).to_string(),
            ours: VERSION.to_string(),
        });
    }
    let (shards, per_shard) = (get(word::SHARDS), get(word::BUCKETS_PER_SHARD));
    if !shards.is_power_of_two() || shards > 256 || per_shard == 0 {
        return Err(not(format!("{shards} shards of {per_shard} buckets")));
    }
    let layout =
        Layout::new(shards, per_shard, get(word::LOG_ENTRIES)).map_err(|e| not(e.to_string()))?;
    let offsets = [get(word::SHARDS_AT), get(word::COUNTS_AT), get(word::BUCKETS_AT)];
    let ours = [layout.shards_at, layout.counts_at, layout.buckets_at].map(|o| o as u64);
    if offsets != ours
        || get(word::TOTAL) != layout.total as u64
        || get(word::BLOCKS) != BLOCKS as u64
    {
        return Err(not("offsets that its geometry does not give".into()));
    }
    if bytes < layout.total {
        return Err(SharedError::TooSmall { needed: layout.total, given: bytes });
    }
    Ok(layout)
}

/// Check the header against what this process asks for, field by field.
fn check(words: &[AtomicU64], layout: &Layout, want: &Wanted) -> Result<(), SharedError> {
    let get = |i: usize| words[i].load(Ordering::Relaxed);
    let mismatch =
        |field, table: String, ours: String| Err(SharedError::Mismatch { field, table, ours });
    let slots = |l: &Layout| match l.logs {
        None => format!("{} slots", l.keys()),
        Some(g) => format!("{} keys of {} log entries", l.keys(), g.entries),
    };
    if (layout.shards, layout.buckets_per_shard, layout.logs)
        != (want.layout.shards, want.layout.buckets_per_shard, want.layout.logs)
    {
        return mismatch("capacity", slots(layout), slots(&want.layout));
    }
    let text = read_policy(words)?;
    let ours = want.policy.to_string();
    if text != ours {
        return mismatch("policy", format!("`{text}`"), format!("`{ours}`"));
    }
    let on_full = on_full_of(get(word::ON_FULL))
        .ok_or_else(|| SharedError::NotATable { reason: "an unknown on_full".into() })?;
    if on_full != want.on_full {
        return mismatch("on_full", format!("{on_full:?}"), format!("{:?}", want.on_full));
    }
    check_process(words)
}

/// What every process must agree on whatever it asks for: the hasher, the clock and the boot.
fn check_process(words: &[AtomicU64]) -> Result<(), SharedError> {
    let get = |i: usize| words[i].load(Ordering::Relaxed);
    let seeds = [0, 1, 2, 3].map(|i| get(word::SEEDS + i));
    let (_, probe) = hasher_and_probe(seeds);
    if probe != get(word::PROBE) {
        return Err(SharedError::Mismatch {
            field: "hasher",
            table: format!("probe {:#x}", get(word::PROBE)),
            ours: format!("probe {probe:#x} (another ahash build: every process must hash alike)"),
        });
    }
    let boot = boot_id();
    let theirs = [get(word::BOOT), get(word::BOOT + 1)];
    if theirs != boot {
        return Err(SharedError::Mismatch {
            field: "boot",
            table: format!("{:016x}{:016x}", theirs[0], theirs[1]),
            ours: format!(
                "{:016x}{:016x} (its clock readings mean nothing after a reboot)",
                boot[0], boot[1]
            ),
        });
    }
    let (theirs, ours) = (get(word::PID_NAMESPACE), pid_namespace());
    if theirs != ours {
        return Err(SharedError::Mismatch {
            field: "pid namespace",
            table: theirs.to_string(),
            ours: format!("{ours} (its processes must see each other's pids)"),
        });
    }
    let scale = get(word::CLOCK_SCALE);
    let (_, ours) = SharedClock::calibrate();
    // The process reads time with the header's scale, not its own: this check is that it
    // reads the same counter. Two calibrations of one counter differ by up to a few tenths of
    // a percent on a busy machine (quanta calibrates in about half a millisecond); another
    // counter (the TSC and `CLOCK_MONOTONIC`, or TSCs of other frequencies) by far more.
    if scale == 0 || scale.abs_diff(ours) > scale / 10 {
        return Err(SharedError::Mismatch {
            field: "clock",
            table: format!("{scale} ns per 2^32 ticks"),
            ours: format!("{ours} ns per 2^32 ticks"),
        });
    }
    Ok(())
}

/// Lease this process a counter block: its own, a free one, or one whose process is gone.
fn lease_block(words: &[AtomicU64]) -> Option<usize> {
    let me = System.me();
    let owners = &words[word::OWNERS..word::OWNERS + BLOCKS];
    if let Some(b) = owners.iter().position(|w| w.load(Ordering::Acquire) == me) {
        return Some(b);
    }
    owners.iter().position(|w| {
        let owner = w.load(Ordering::Acquire);
        (owner == 0 || System.gone(owner))
            && w.compare_exchange(owner, me, Ordering::AcqRel, Ordering::Relaxed).is_ok()
    })
}

/// Attach to (initialising it first if no process has) the table in `region`.
fn attach<K: Hash + ?Sized>(
    region: Region,
    want: &Wanted,
    fresh: bool,
    lease: bool,
) -> Result<KeyedLimiter<K, SharedClock>, SharedError> {
    let text = want.policy.to_string();
    if text.len() > POLICY_BYTES {
        return Err(SharedError::NotATable {
            reason: format!("a policy over {POLICY_BYTES} bytes"),
        });
    }
    let region = Arc::new(region);
    let words = region.words().ok_or(SharedError::Misaligned)?;
    if words.len() * 8 < HEADER_BYTES {
        let given = region.len();
        return Err(SharedError::TooSmall { needed: want.layout.total, given });
    }
    let may_take = || match words[word::MAGIC].load(Ordering::Relaxed) {
        0 | MAGIC => Ok(()),
        _ => Err(SharedError::NotATable { reason: "its magic number differs".into() }),
    };
    let init = || {
        if region.len() < want.layout.total {
            return Err(SharedError::TooSmall { needed: want.layout.total, given: region.len() });
        }
        write_header(&words, want, fresh, &text);
        Ok(())
    };
    let first = words[word::INIT].load(Ordering::Acquire);
    if first != 0 && first != lock::READY {
        // Bytes that are no table's (their initialisation word names no process) are refused
        // as soon as their magic number says so.
        may_take()?;
    }
    lock::initialise(&words[word::INIT], &System, may_take, init)?;
    let layout = layout_of(&words, region.len())?;
    check(&words, &layout, want)?;
    build(&region, &words, &layout, want.policy.clone(), lease)
}

/// The limiter on a checked region.
fn build<K: Hash + ?Sized>(
    region: &Arc<Region>,
    words: &[AtomicU64],
    layout: &Layout,
    policy: Policy,
    lease: bool,
) -> Result<KeyedLimiter<K, SharedClock>, SharedError> {
    let get = |i: usize| words[i].load(Ordering::Relaxed);
    let seeds = [0, 1, 2, 3].map(|i| get(word::SEEDS + i));
    let (hasher, _) = hasher_and_probe(seeds);
    let secret = hasher.hash_one(0x5eed_u64);
    let on_full = on_full_of(get(word::ON_FULL)).unwrap_or_default();
    let bad = || SharedError::NotATable { reason: "a layout this build cannot map".into() };
    let buckets = (layout.shards * layout.buckets_per_shard) as usize;
    let shards: Slab<Shard> =
        Slab::in_region(region, layout.shards_at, layout.shards as usize).ok_or_else(bad)?;
    let backend = match layout.logs {
        None => {
            let bucket_slab: Slab<Bucket> =
                Slab::in_region(region, layout.buckets_at, buckets).ok_or_else(bad)?;
            let per_shard = layout.buckets_per_shard;
            Backend::Words(Table::in_region(bucket_slab, shards, per_shard, secret, on_full))
        }
        Some(geo) => {
            let words = Slab::in_region(region, layout.buckets_at, geo.bytes() / 8);
            let logs = LogRegion::new(shards, words.ok_or_else(bad)?, geo, on_full);
            Backend::SharedLogs(Box::new(logs.ok_or_else(bad)?))
        }
    };
    let block = if lease { lease_block(words) } else { None };
    let counts = Counts::in_region(region, layout.counts_at, BLOCKS, block).ok_or_else(bad)?;
    let mut registry = Registry::new(&policy);
    registry.freeze();
    let clock = SharedClock::new(get(word::CLOCK_START), get(word::CLOCK_SCALE));
    let mut floor = Floor::default();
    floor.set_offset(get(word::CLOCK_OFFSET));
    Ok(KeyedLimiter {
        registry,
        backend,
        hasher,
        seeds,
        clock,
        floor: CachePadded::new(floor),
        counts,
        region: Some(Arc::clone(region)),
        _key: std::marker::PhantomData,
    })
}

/// Open (creating it if it does not exist) the table file at `path`, and attach to it.
fn open<K: Hash + ?Sized>(
    path: &Path,
    want: Option<&Wanted>,
) -> Result<KeyedLimiter<K, SharedClock>, SharedError> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut options = std::fs::OpenOptions::new();
    options.read(true).write(true);
    if want.is_some() {
        options.create(true).mode(0o600);
    }
    let file = options.open(path)?;
    // Sizing the file and initialising it happen under its lock: a process that opens it
    // meanwhile waits, then sees the whole header (and the lock goes with a process that dies).
    let _lock = crate::mem::FileLock::take(&file)?;
    let mut len = file.metadata()?.len() as usize;
    let fresh = len == 0;
    if fresh {
        let Some(want) = want else {
            return Err(SharedError::NotATable { reason: "an empty file".into() });
        };
        file.set_len(want.layout.total as u64)?;
        if let Err(e) = crate::mem::allocate(&file, want.layout.total) {
            // Out of room: no table is left half made.
            let _ = file.set_len(0);
            return Err(e.into());
        }
        len = want.layout.total;
    }
    if len < HEADER_BYTES {
        return Err(SharedError::NotATable { reason: format!("a file of {len} bytes") });
    }
    let region = Region::map(&file, len)?;
    match want {
        Some(want) => attach(region, want, fresh, true),
        None => {
            // Attach with what the header says.
            let region = Arc::new(region);
            let words = region.words().ok_or(SharedError::Misaligned)?;
            let layout = layout_of(&words, region.len())?;
            if words[word::INIT].load(Ordering::Acquire) != lock::READY {
                return Err(SharedError::NotATable {
                    reason: "no process has finished making it".into(),
                });
            }
            let text = read_policy(&words)?;
            let policy: Policy = text
                .parse()
                .map_err(|e: PolicyError| SharedError::NotATable { reason: e.to_string() })?;
            check_process(&words)?;
            build(&region, &words, &layout, policy, false)
        }
    }
}

impl<K: Hash + ?Sized> KeyedLimiter<K, crate::clock::QuantaClock> {
    /// The bytes a shared table of `capacity` keys under `policy` needs: the size of the region
    /// to give [`Builder::in_region`] (an nginx zone's size, say).
    pub fn region_size(policy: &Policy, capacity: usize) -> Result<usize, SharedError> {
        Ok(Layout::for_policy(policy, capacity)?.total)
    }

    /// A keyed limiter whose table every process that opens `path` shares (a file in
    /// `/dev/shm`, or on any file system every process can map), created by the first call:
    /// see [`Builder::open_shared`].
    ///
    /// # Examples
    ///
    /// ```
    /// use ratewell::{KeyedLimiter, Policy};
    ///
    /// let path = std::env::temp_dir().join(format!("ratewell-doc-{}", std::process::id()));
    /// let policy: Policy = "token-bucket capacity=2 rate=1/h".parse()?;
    /// let a = KeyedLimiter::<str>::open_shared(&path, &policy, 1_000)?;
    /// let b = KeyedLimiter::<str>::open_shared(&path, &policy, 1_000)?; // another process's, say
    /// assert!(a.allow("k") && b.allow("k"));
    /// assert!(!a.allow("k")); // the two share the key's two tokens
    /// # std::fs::remove_file(&path)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn open_shared(
        path: impl AsRef<Path>,
        policy: &Policy,
        capacity: usize,
    ) -> Result<KeyedLimiter<K, SharedClock>, SharedError> {
        Self::builder(policy, capacity).open_shared(path)
    }

    /// Attach to the shared table at `path` with the policy and capacity it was made with (its
    /// header's), leasing no counter block: for tools that look into a table (`ratewell
    /// inspect`) or decide on it without knowing how it was made.
    pub fn attach_shared(
        path: impl AsRef<Path>,
    ) -> Result<KeyedLimiter<K, SharedClock>, SharedError> {
        open(path.as_ref(), None)
    }
}

impl<K: Hash + ?Sized> Builder<K, crate::clock::QuantaClock> {
    fn wanted(&self) -> Result<Wanted, SharedError> {
        Ok(Wanted {
            policy: self.policy.clone(),
            layout: Layout::for_policy(&self.policy, self.capacity)?,
            on_full: self.on_full.unwrap_or_default(),
            seed: self.seed,
        })
    }

    /// The limiter on the shared table in the file at `path`, created (sized, and its header
    /// written) by the first process to open it; every process that opens it decides on the
    /// same states, exactly (`docs/SEMANTICS.md`, *Shared tables*).
    ///
    /// A table made with another policy, capacity or full-table behaviour is refused
    /// ([`SharedError::Mismatch`], naming the field). Every algorithm can be shared; a sliding
    /// log's table lays out `capacity` keys of `limit` entries each when it is made (16 bytes
    /// an entry: see [`KeyedLimiter::region_size`]). A shared table's policy is fixed when it is made:
    /// [`KeyedLimiter::set_policy`], [`set_override`](KeyedLimiter::set_override) and
    /// [`register`](KeyedLimiter::register) return an error on it. It reads the region's clock
    /// (the TSC, scaled as the header says, so every process reads the same time).
    pub fn open_shared(
        self,
        path: impl AsRef<Path>,
    ) -> Result<KeyedLimiter<K, SharedClock>, SharedError> {
        let want = self.wanted()?;
        open(path.as_ref(), Some(&want))
    }

    /// The limiter on the shared table in `region` (memory every process maps: see
    /// [`Region::from_raw`]), initialised by the first process to attach; otherwise as
    /// [`open_shared`](Self::open_shared).
    pub fn in_region(self, region: Region) -> Result<KeyedLimiter<K, SharedClock>, SharedError> {
        let want = self.wanted()?;
        attach(region, &want, false, true)
    }
}

impl<K: Hash + ?Sized> KeyedLimiter<K, SharedClock> {
    /// What the shared table's header says, and which processes have counted on it.
    pub fn shared_info(&self) -> Option<SharedInfo> {
        let region = self.region.as_ref()?;
        let words = region.words()?;
        let get = |i: usize| words[i].load(Ordering::Relaxed);
        let processes = words[word::OWNERS..word::OWNERS + BLOCKS]
            .iter()
            .map(|w| w.load(Ordering::Relaxed))
            .filter(|&w| w != 0)
            .map(|w| ((w >> 32) as u32, !System.gone(w)))
            .collect();
        Some(SharedInfo {
            version: get(word::VERSION),
            bytes: region.len() as u64,
            shards: get(word::SHARDS),
            buckets_per_shard: get(word::BUCKETS_PER_SHARD),
            log_entries: get(word::LOG_ENTRIES),
            on_full: on_full_of(get(word::ON_FULL)).unwrap_or_default(),
            clock_scale: get(word::CLOCK_SCALE),
            created_by: get(word::CREATED_BY) as u32,
            processes,
            locks_held: match &self.backend {
                Backend::Words(table) => table.lock_holders(),
                Backend::SharedLogs(logs) => logs.lock_holders(),
                Backend::Logs(_) => Vec::new(),
            },
        })
    }
}

impl<K: Hash + ?Sized, C: crate::clock::Clock> KeyedLimiter<K, C> {
    /// Whether no other live process has attached to this shared table (leased a counter
    /// block): a restore replaces what they share.
    pub(crate) fn alone_on_region(&self) -> bool {
        let Some(words) = self.region.as_ref().and_then(|r| r.words()) else { return true };
        let me = System.me();
        words[word::OWNERS..word::OWNERS + BLOCKS].iter().all(|w| {
            let owner = w.load(Ordering::Acquire);
            owner == 0 || owner == me || System.gone(owner)
        })
    }

    /// Write a restore's hash seeds and clock offset into the header, for the processes that
    /// attach after it.
    pub(crate) fn publish_restore(&self, seeds: [u64; 4], offset: u64) {
        let Some(words) = self.region.as_ref().and_then(|r| r.words()) else { return };
        let (_, probe) = hasher_and_probe(seeds);
        for (i, s) in seeds.iter().enumerate() {
            words[word::SEEDS + i].store(*s, Ordering::Relaxed);
        }
        words[word::PROBE].store(probe, Ordering::Relaxed);
        words[word::CLOCK_OFFSET].store(offset, Ordering::Release);
    }
}
