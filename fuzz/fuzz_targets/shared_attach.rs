#![no_main]
//! Attaching to a shared region of hostile bytes (`Builder::in_region`): a region is input from
//! another process, so any bytes must give an error or a working table, never undefined
//! behaviour, a panic or a hang.
//!
//! The region starts as a valid table (made by one `in_region` call on zeroed memory, cached per
//! configuration, optionally with keys decided into it), zeros, or the fuzzer's own bytes; the
//! fuzzer then patches words and bytes anywhere (mostly in the header), may truncate the region
//! or shift its start off the 128-byte alignment the counter cells need, and attaches, once or
//! twice (two processes), with the table's parameters or other ones. A table it gets is then
//! used: decisions, peeks, batches, resets, reclaims, metrics, `shared_info` and a snapshot.
//!
//! Words that name a process: the initialisation word (word 0) and each shard's insert lock
//! word. A process waits, by design, for a *live* process named there (the initialiser, the
//! lock holder) for as long as it lives, and this very process counts as live. So the target
//! never leaves a live process there: any value but 0 and `READY` is masked to its low 32 bits,
//! an identity `pid << 32 | start` with pid 0, which names no process (`mem::process_exists` is
//! false for pid <= 0): the attach then takes the word over from a dead holder after its
//! `CHECK_EVERY` tries (re-initialising the region, or repairing the shard).
use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use ratewell::{KeyedLimiter, OnFull, Policy, Region, Resume, SharedClock};

/// A region's memory: 4096-aligned pages (the table needs its start 128-aligned).
#[derive(Clone, Copy)]
#[repr(C, align(4096))]
struct Page([u64; 512]);

const PAGE_WORDS: usize = 512;
const READY: u64 = u64::MAX;
/// The header's words (`src/keyed/shared/region.rs`) and where the shards' lock words lie.
const HEADER_WORDS: usize = 512;
const SHARD_WORDS: usize = 16;
const BUCKETS_AT_WORD: usize = 20;

const POLICIES: [&str; 6] = [
    "token-bucket capacity=3 rate=1/s",
    "fixed-window limit=2 window=1h",
    "sliding-window limit=5 window=1s",
    "leaky-bucket rate=3/250ms burst=5 delay=2 compat=nginx",
    "token-bucket capacity=7 refill=3 every=250ms",
    "sliding-log limit=3 window=1s",
];
const CAPACITIES: [usize; 4] = [1, 64, 1000, 20_000];

#[derive(Arbitrary, Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct Config {
    policy: u8,
    capacity: u8,
    refuse: bool,
}

impl Config {
    fn policy(self) -> Policy {
        POLICIES[usize::from(self.policy) % POLICIES.len()].parse().expect("a valid policy")
    }
    fn capacity(self) -> usize {
        CAPACITIES[usize::from(self.capacity) % CAPACITIES.len()]
    }
    fn on_full(self) -> OnFull {
        if self.refuse { OnFull::Refuse } else { OnFull::EvictLeastGranting }
    }
    fn key(self) -> (usize, usize, bool) {
        (usize::from(self.policy) % POLICIES.len(), usize::from(self.capacity) % 4, self.refuse)
    }
    fn attach(
        self,
        region: Region,
    ) -> Result<KeyedLimiter<u16, SharedClock>, ratewell::SharedError> {
        let builder = KeyedLimiter::<u16>::builder(&self.policy(), self.capacity());
        builder.on_full(self.on_full()).seed(7).in_region(region)
    }
}

#[derive(Arbitrary, Debug)]
enum Base {
    /// A valid table of the configuration, as one attach to zeroed memory leaves it.
    Valid,
    /// A valid table holding the keys decided into it (key, cost).
    Keys(Vec<(u16, u8)>),
    /// A valid table holding `n` keys `from`, `from + stride`, ... (enough to fill a small one).
    Many {
        n: u8,
        from: u16,
        stride: u16,
    },
    Zeros,
    /// The fuzzer's bytes from the start, zeros after.
    Bytes(Vec<u8>),
}

#[derive(Arbitrary, Debug)]
enum Patch {
    /// A header word (0..512).
    Header { word: u16, value: u64 },
    /// A header word moved by a little (a geometry or an offset off by one).
    Nudge { word: u16, by: i8 },
    /// Any word of the region.
    Word { word: u32, value: u64 },
    /// Any byte of the region.
    Byte { at: u32, value: u8 },
    /// A run of bytes.
    Fill { at: u32, len: u16, value: u8 },
    /// A word of a shard (16 words: the lock, the counters, the move journal).
    Shard { shard: u8, word: u8, value: u64 },
    /// A shard's move journal naming slots `from` and `to` (indices into the table's slots,
    /// plus one; taken modulo the slots plus two), its lock left by a dead holder: the next
    /// process to lock the shard repairs it.
    Journal { shard: u8, from: u16, to: u16, key: u64, state: u64 },
    /// A word of a slot (its key word or its state word).
    Slot { slot: u32, state: bool, value: u64 },
    /// One word copied over another (a key word duplicated, say).
    Copy { from: u32, to: u32 },
}

#[derive(Arbitrary, Debug)]
enum Op {
    Allow(u16),
    Check(u16, u8),
    Peek(u16, u8),
    Batch(Vec<(u16, u8)>),
    Reset(u16),
    /// `n` keys `from`, `from + 1`, ... decided: inserts, relocations, evictions.
    Flood {
        n: u8,
        from: u16,
    },
    ReclaimFresh,
    Metrics,
    Info,
    Snapshot,
}

#[derive(Arbitrary, Debug)]
struct Input {
    /// The table the region starts as.
    made: Config,
    base: Base,
    patches: Vec<Patch>,
    /// What word 0 is forced to: see the module doc.
    init: Option<u64>,
    /// The parameters attached with, if not the table's.
    other: Option<Config>,
    /// The region's length, if not the whole table: any shorter, a little shorter, or longer.
    len: Option<u32>,
    /// From 224 on, words the region's start is shifted by (mod 32): off 128-byte alignment
    /// unless a multiple of 16.
    shift: u8,
    /// Attach a second limiter (another process) to the same memory.
    twice: bool,
    ops: Vec<(bool, Op)>,
}

/// A valid table's words, and its shard count, per configuration.
struct Template {
    words: Box<[u64]>,
    shards: usize,
    /// Where the buckets begin, in words, and the slots they hold.
    buckets_at: usize,
    slots: usize,
}

fn template(config: Config) -> &'static Template {
    type Cache = Mutex<HashMap<(usize, usize, bool), &'static Template>>;
    static CACHE: OnceLock<Cache> = OnceLock::new();
    let mut cache = CACHE.get_or_init(Default::default).lock().unwrap();
    cache.entry(config.key()).or_insert_with(|| {
        let policy = config.policy();
        let bytes = KeyedLimiter::<u16>::region_size(&policy, config.capacity())
            .expect("every policy has a region size");
        let mut pages = vec![Page([0; PAGE_WORDS]); bytes.div_ceil(PAGE_WORDS * 8)];
        let limiter = config
            .attach(region_of(pages.as_mut_ptr(), pages.len(), 0, bytes))
            .expect("zeroed memory of region_size gives a table");
        assert!(limiter.allow(&1));
        let shards = limiter.shared_info().expect("a shared table").shards as usize;
        let slots = limiter.metrics().capacity as usize;
        limiter.reset(&1);
        drop(limiter);
        let words: Box<[u64]> = pages.iter().flat_map(|p| p.0).take(bytes / 8).collect();
        let buckets_at = words[BUCKETS_AT_WORD] as usize / 8;
        Box::leak(Box::new(Template { words, shards, buckets_at, slots }))
    })
}

/// A region over `len` bytes from word `shift` of the `count` pages at `pages` (a pointer taken
/// once, so that two regions on the same pages derive from one borrow).
fn region_of(pages: *mut Page, count: usize, shift: usize, len: usize) -> Region {
    assert!(shift * 8 + len <= count * PAGE_WORDS * 8);
    let ptr = pages.cast::<u64>().wrapping_add(shift).cast::<u8>();
    // SAFETY: `len` bytes from word `shift` lie inside the `count` pages (checked above),
    // 8-aligned (a word). Every caller keeps the pages alive, unmoved and untouched (no
    // reference to them used) until every limiter on the region is dropped, so the memory is
    // accessed only through limiters meanwhile.
    unsafe { Region::from_raw(ptr, len) }
}

fn words_of(pages: &mut [Page]) -> &mut [u64] {
    let n = pages.len() * PAGE_WORDS;
    // SAFETY: `Page` is `repr(C)` around `[u64; 512]` (alignment padding none: 4096 bytes), so
    // the pages are `n` contiguous, initialised `u64`s, borrowed mutably here.
    unsafe { std::slice::from_raw_parts_mut(pages.as_mut_ptr().cast::<u64>(), n) }
}

/// The words of a valid table of `config` holding `keys` (key, cost), decided into a copy of its
/// template (aligned, so that it attaches whatever the shift the fuzzer picks later).
fn with_keys(config: Config, template: &Template, keys: &[(u16, u8)]) -> Vec<u64> {
    let keys = keys.iter().take(64).copied();
    with_keys_of(config, template, keys)
}

fn with_keys_of(
    config: Config,
    template: &Template,
    keys: impl Iterator<Item = (u16, u8)>,
) -> Vec<u64> {
    let n = template.words.len();
    let mut pages = vec![Page([0; PAGE_WORDS]); n.div_ceil(PAGE_WORDS)];
    words_of(&mut pages)[..n].copy_from_slice(&template.words);
    let region = region_of(pages.as_mut_ptr(), pages.len(), 0, n * 8);
    let limiter = config.attach(region).expect("a valid table attaches with its parameters");
    for (k, c) in keys {
        limiter.request(&k).cost(u32::from(c % 4)).check();
    }
    drop(limiter);
    words_of(&mut pages)[..n].to_vec()
}

fn exercise(limiter: &KeyedLimiter<u16, SharedClock>, op: &Op, len: usize) {
    let cost = |c: u8| u32::from(c % 8);
    match op {
        Op::Allow(k) => {
            limiter.allow(k);
        }
        Op::Check(k, c) => {
            limiter.request(k).cost(cost(*c)).check();
        }
        Op::Peek(k, c) => {
            limiter.request(k).cost(cost(*c)).peek();
        }
        Op::Batch(requests) => {
            let requests: Vec<(&u16, u32)> =
                requests.iter().take(32).map(|(k, c)| (k, cost(*c))).collect();
            let mut out = Vec::new();
            limiter.batch(&requests, &mut out);
            assert_eq!(out.len(), requests.len());
        }
        Op::Reset(k) => {
            limiter.reset(k);
        }
        &Op::Flood { n, from } => {
            for i in 0..u16::from(n) {
                limiter.allow(&from.wrapping_add(i));
            }
        }
        Op::ReclaimFresh => {
            limiter.reclaim_fresh();
        }
        Op::Metrics | Op::Info => {
            let metrics = limiter.metrics();
            let info = limiter.shared_info().expect("a shared table's info");
            // The geometry was checked on attach, and nothing writes it since.
            assert_eq!(info.version, 1);
            assert_eq!(info.bytes, len as u64);
            let per_bucket = if info.log_entries == 0 { 8 } else { 1 };
            assert_eq!(metrics.capacity, info.shards * info.buckets_per_shard * per_bucket);
            let _ = format!("{metrics:?} {info:?}");
        }
        Op::Snapshot => {
            let mut bytes = Vec::new();
            limiter.snapshot(&mut bytes).expect("a snapshot into a Vec");
            let policy = limiter.policy();
            let mut heap = KeyedLimiter::<u16>::new(&policy, 64);
            let _ = heap.restore(&bytes[..], Resume::WallClock);
        }
    }
}

fuzz_target!(|input: Input| {
    let made = input.made;
    let made_as = template(made);
    let table_words = made_as.words.len();
    // Mostly none: a start off 128-byte alignment is refused.
    let shift = if input.shift < 224 { 0 } else { usize::from(input.shift % 32) };
    // One page more than the table for the shift.
    let mut pages = vec![Page([0; PAGE_WORDS]); table_words.div_ceil(PAGE_WORDS) + 1];
    let region_words = &mut words_of(&mut pages)[shift..shift + table_words];
    match &input.base {
        Base::Valid => region_words.copy_from_slice(&made_as.words),
        Base::Keys(keys) => region_words.copy_from_slice(&with_keys(made, made_as, keys)),
        &Base::Many { n, from, stride } => {
            let keys = (0..u16::from(n)).map(|i| (from.wrapping_add(i.wrapping_mul(stride)), 1));
            region_words.copy_from_slice(&with_keys_of(made, made_as, keys));
        }
        Base::Zeros => {}
        Base::Bytes(bytes) => {
            for (i, chunk) in bytes.chunks(8).take(table_words).enumerate() {
                let mut word = [0u8; 8];
                word[..chunk.len()].copy_from_slice(chunk);
                region_words[i] = u64::from_le_bytes(word);
            }
        }
    }
    let region_words = &mut words_of(&mut pages)[shift..shift + table_words];
    for patch in input.patches.iter().take(64) {
        let n = region_words.len();
        match *patch {
            Patch::Header { word, value } => region_words[usize::from(word) % HEADER_WORDS] = value,
            Patch::Nudge { word, by } => {
                let w = &mut region_words[usize::from(word) % HEADER_WORDS];
                *w = w.wrapping_add_signed(i64::from(by));
            }
            Patch::Word { word, value } => region_words[word as usize % n] = value,
            Patch::Byte { at, value } | Patch::Fill { at, len: 1, value } => {
                let at = at as usize % (n * 8);
                let mut bytes = region_words[at / 8].to_le_bytes();
                bytes[at % 8] = value;
                region_words[at / 8] = u64::from_le_bytes(bytes);
            }
            Patch::Shard { shard, word, value } => {
                let shard = usize::from(shard) % made_as.shards.max(1);
                let at = HEADER_WORDS + shard * SHARD_WORDS + usize::from(word % 16);
                region_words[at % n] = value;
            }
            Patch::Journal { shard, from, to, key, state } => {
                let at = HEADER_WORDS + usize::from(shard) % made_as.shards.max(1) * SHARD_WORDS;
                let slot = |i: u16| (usize::from(i) % (made_as.slots + 2)) as u64;
                for (i, value) in [1, slot(from), slot(to), key, state].into_iter().enumerate() {
                    // The lock (`1`: pid 0, gone), then the journal's four words.
                    let i = if i == 0 { 0 } else { 6 + i };
                    region_words[(at + i) % n] = value;
                }
            }
            Patch::Slot { slot, state, value } => {
                let at = made_as.buckets_at + 2 * (slot as usize % made_as.slots.max(1));
                region_words[(at + usize::from(state)) % n] = value;
            }
            Patch::Copy { from, to } => {
                // Mostly within the buckets, where key words are.
                let within = |w: u32| made_as.buckets_at + w as usize % (2 * made_as.slots.max(1));
                region_words[within(to) % n] = region_words[within(from) % n];
            }
            Patch::Fill { at, len, value } => {
                let from = at as usize % (n * 8);
                for at in from..(from + usize::from(len)).min(n * 8) {
                    let mut bytes = region_words[at / 8].to_le_bytes();
                    bytes[at % 8] = value;
                    region_words[at / 8] = u64::from_le_bytes(bytes);
                }
            }
        }
    }
    // Never a live process in a word that names one (module doc): pid 0 is no process.
    let dead = |w: &mut u64| {
        if *w != READY {
            *w &= 0xffff_ffff;
        }
    };
    if let Some(init) = input.init {
        region_words[0] = init;
    }
    dead(&mut region_words[0]);
    // The lock words of the shards of any table an attach may accept: the one it was made as,
    // or the one attached as (a region it re-initialises has zeros there).
    let attach_as = input.other.unwrap_or(made);
    let shards = made_as.shards.max(template(attach_as).shards);
    for s in 0..shards {
        if let Some(w) = region_words.get_mut(HEADER_WORDS + s * SHARD_WORDS) {
            dead(w);
        }
    }
    let total = table_words * 8;
    let len = match input.len {
        None => total,
        Some(x) => match x % 4 {
            0 => (x / 4) as usize % (total + 1),
            1 => total.saturating_sub((x / 4) as usize % 4097),
            // Longer than the table: the spare page, less the shift.
            2 => total + (x / 4) as usize % (PAGE_WORDS * 8 - shift * 8 + 1),
            _ => total,
        },
    };
    let (base, count) = (pages.as_mut_ptr(), pages.len());
    let first = attach_as.attach(region_of(base, count, shift, len));
    let limiter = match first {
        Ok(limiter) => limiter,
        Err(e) => {
            assert!(!e.to_string().is_empty());
            return;
        }
    };
    let second = if input.twice {
        match attach_as.attach(region_of(base, count, shift, len)) {
            Ok(second) => Some(second),
            Err(e) => panic!("a second attach to a table that one attached to: {e}"),
        }
    } else {
        None
    };
    for (other, op) in input.ops.iter().take(32) {
        let on = match (&second, other) {
            (Some(second), true) => second,
            _ => &limiter,
        };
        exercise(on, op, len);
    }
    drop((limiter, second));
    drop(pages);
});
