//! The policies of one keyed limiter: the default, the per-key overrides, and the slots a key's
//! stored state names its policy by.
//!
//! # Slots and the arena
//!
//! A key's slot in the table stores its policy as an 8-bit *slot* index (0..=254). A slot maps to
//! an entry of a grow-only *arena* of policies: entries are immutable and live as long as the
//! limiter, so a decision that read a slot's policy can use it however long it is delayed (no
//! reference is ever invalidated: the whole registry is safe code, with no lock on the hot path).
//! The arena holds each distinct policy once: a limiter that switches between a few policies
//! keeps a few entries, however many times it switches.
//!
//! A slot's word is the arena position, with [`RETIRED`] set once neither the default nor an
//! override uses it: a decision on a key stored under a retired slot converts the key to its
//! current policy first ([`crate::algorithms::convert`]: it keeps what the key consumed), reading
//! the retired slot's policy for the conversion.
//!
//! # Reusing slots
//!
//! When a policy needs a slot and all 255 are taken, the retired ones are reclaimed: every key
//! still stored under a retired slot is converted (a sweep of the table, each shard under its
//! lock), and only then are the slots freed and reassigned. Nothing can store a key under a
//! retired slot after the sweep has passed its shard: an insertion or conversion resolves the
//! key's slot, takes the shard lock, and checks under it that the slot's word is still the one it
//! resolved ([`Policies::still`]); a retired or reassigned slot's word differs. A decision that
//! found a key under the old slot before the sweep converted it fails its compare-exchange or its
//! re-validation of the key word (the conversion changes both) and looks the key up again.
//!
//! So at most 255 distinct policies are *in use* at once (the default and the overrides); over
//! the limiter's life there is no limit but memory, a few hundred bytes a distinct policy.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU32, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock};

use crate::sync::lock;

use crate::algorithms::Algorithm;
use crate::keyed::table::MAX_POLICIES;
use crate::policy::{Policy, PolicyError};

/// A slot no policy was given (or one freed by a sweep).
const FREE: u32 = u32::MAX;
/// Set in a slot's word once no new key may take it.
const RETIRED: u32 = 1 << 31;

/// What the key tables need to know of the limiter's policies.
pub(crate) trait Policies {
    /// The policy behind slot `idx`, or `None` if the slot is retired (the key must move to its
    /// current policy) or free.
    fn algorithm(&self, idx: u8) -> Option<&Algorithm>;
    /// The policy behind slot `idx` even if retired: what a key stored under it is converted from.
    fn previous(&self, idx: u8) -> Option<&Algorithm>;
    /// The slot a key with this fingerprint takes now, and the slot's word to check under the
    /// shard lock with [`still`](Self::still).
    fn resolve(&self, fp: u64) -> (u8, u32);
    /// `true` if slot `idx` still has the word `resolve` gave: it may be stored in a key.
    fn still(&self, idx: u8, word: u32) -> bool;
    /// Whether a key stored under slot `idx` is decided under it as it is: always, except for a
    /// decision under a pinned policy ([`Pinned`]), which first moves a key stored under any
    /// other slot to its own.
    #[inline(always)]
    fn wants(&self, idx: u8) -> bool {
        let _ = idx;
        true
    }
    /// The policy a key stored under slot `idx` is decided by as it is stored: the slot's
    /// ([`algorithm`](Self::algorithm)), unless the slot is retired or the decision
    /// [`wants`](Self::wants) the key moved to another first (`None`: move it).
    #[inline(always)]
    fn deciding(&self, idx: u8) -> Option<&Algorithm> {
        if self.wants(idx) { self.algorithm(idx) } else { None }
    }
}

/// The registry as a decision under a registered policy sees it (`Request::policy`):
/// every key resolves to slot `idx`, and a key stored under another slot is converted to it
/// first, keeping what it consumed. The slot stays assigned while its [`PolicyId`] is held
/// (it is pinned), so `resolve` never names a retired slot.
///
/// [`PolicyId`]: crate::PolicyId
pub(crate) struct Pinned<'a> {
    pub(crate) registry: &'a Registry,
    pub(crate) idx: u8,
    pub(crate) word: u32,
}

impl Policies for Pinned<'_> {
    #[inline(always)]
    fn algorithm(&self, idx: u8) -> Option<&Algorithm> {
        self.registry.algorithm(idx)
    }
    fn previous(&self, idx: u8) -> Option<&Algorithm> {
        self.registry.previous(idx)
    }
    fn resolve(&self, _fp: u64) -> (u8, u32) {
        (self.idx, self.word)
    }
    fn still(&self, idx: u8, word: u32) -> bool {
        self.registry.still(idx, word)
    }
    #[inline(always)]
    fn wants(&self, idx: u8) -> bool {
        idx == self.idx
    }
}

/// The policies of a decision (`inner`: the registry, or [`Pinned`]) with slot `idx` narrowed
/// for one call (`Request::within`, `Request::burst`): `algorithm` is the slot's own at the
/// call's limit or burst, on the same state words, so a key converted to the slot, stored or
/// refunded under it reads the same under either.
pub(crate) struct Within<P> {
    pub(crate) inner: P,
    pub(crate) idx: u8,
    pub(crate) algorithm: Algorithm,
}

impl<P: Policies> Policies for Within<P> {
    #[inline(always)]
    fn algorithm(&self, idx: u8) -> Option<&Algorithm> {
        if idx == self.idx { Some(&self.algorithm) } else { self.inner.algorithm(idx) }
    }
    fn previous(&self, idx: u8) -> Option<&Algorithm> {
        self.inner.previous(idx)
    }
    fn resolve(&self, fp: u64) -> (u8, u32) {
        self.inner.resolve(fp)
    }
    fn still(&self, idx: u8, word: u32) -> bool {
        self.inner.still(idx, word)
    }
    #[inline(always)]
    fn wants(&self, idx: u8) -> bool {
        self.inner.wants(idx)
    }
}

impl<P: Policies + ?Sized> Policies for &P {
    #[inline(always)]
    fn algorithm(&self, idx: u8) -> Option<&Algorithm> {
        (**self).algorithm(idx)
    }
    fn previous(&self, idx: u8) -> Option<&Algorithm> {
        (**self).previous(idx)
    }
    fn resolve(&self, fp: u64) -> (u8, u32) {
        (**self).resolve(fp)
    }
    fn still(&self, idx: u8, word: u32) -> bool {
        (**self).still(idx, word)
    }
    #[inline(always)]
    fn wants(&self, idx: u8) -> bool {
        (**self).wants(idx)
    }
}

/// Positions below this are in the arena's first, inline array: a decision on them costs what
/// an array of policies would (a limiter gets further only after 256 distinct policies).
const INLINE: u32 = 256;
/// Beyond: chunk `c` holds `FIRST << c` entries, from position `INLINE + FIRST * (2^c - 1)`.
const FIRST: u32 = 8;
const CHUNKS: usize = 28;

/// Grow-only storage of policies, addressed by position.
struct Arena {
    /// `INLINE` entries (built on the heap: as an array value it would take 30 KiB of stack, more
    /// than a loom model's thread has). An array, not a slice: indexing it below `INLINE` needs
    /// no length.
    first: Box<[OnceLock<Policy>; INLINE as usize]>,
    chunks: [OnceLock<Box<[OnceLock<Policy>]>>; CHUNKS],
}

impl Arena {
    fn new() -> Self {
        let first: Box<[OnceLock<Policy>]> = (0..INLINE).map(|_| OnceLock::new()).collect();
        Arena {
            first: first.try_into().unwrap_or_else(|_| unreachable!("INLINE entries")),
            chunks: std::array::from_fn(|_| OnceLock::new()),
        }
    }

    /// The chunk and offset of position `pos >= INLINE`.
    #[inline]
    fn locate(pos: u32) -> (usize, usize) {
        let pos = pos - INLINE;
        let chunk = (pos / FIRST + 1).ilog2();
        let offset = pos - FIRST * ((1 << chunk) - 1);
        (chunk as usize, offset as usize)
    }

    #[inline]
    fn get(&self, pos: u32) -> Option<&Policy> {
        if pos < INLINE { self.first[pos as usize].get() } else { self.get_far(pos) }
    }

    #[cold]
    #[inline(never)]
    fn get_far(&self, pos: u32) -> Option<&Policy> {
        let (chunk, offset) = Self::locate(pos);
        self.chunks.get(chunk)?.get()?.get(offset)?.get()
    }

    /// Store `policy` at `pos` (the next free position; under the admin lock).
    fn set(&self, pos: u32, policy: Policy) -> bool {
        if let Some(cell) = self.first.get(pos as usize) {
            return cell.set(policy).is_ok();
        }
        let (chunk, offset) = Self::locate(pos);
        let Some(cell) = self.chunks.get(chunk) else { return false };
        let entries = cell.get_or_init(|| (0..FIRST << chunk).map(|_| OnceLock::new()).collect());
        entries[offset].set(policy).is_ok()
    }
}

pub(crate) struct Registry {
    /// Slot → arena position, with [`RETIRED`]; [`FREE`] if unassigned. Slot 255 is never used
    /// (it would make the table's `TOMBSTONE` a key word). Inline, not boxed: a decision reads
    /// its key's slot at a fixed offset from the limiter, with no pointer to follow.
    slots: [AtomicU32; 256],
    /// The algorithm at arena position 0, the limiter's first default policy, which every key
    /// is stored under until the policies change: a slot whose word is 0 (position 0, live) is
    /// decided by this copy, inline in the limiter, without the arena and its `OnceLock` (arena
    /// entries never change, so the copy is the entry for the registry's life).
    zero: Algorithm,
    arena: Arena,
    default: AtomicU8,
    has_overrides: AtomicBool,
    admin: Mutex<Admin>,
    /// A shared table's: its one policy is fixed, since every process attached holds a registry
    /// of its own and they must agree.
    frozen: bool,
}

/// What a slot serves. The default's slot serves it alone: when the default changes, every key
/// under its slot must move, including keys whose new policy equals an override's.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Role {
    Default,
    Override,
    /// Registered for decisions that name it (`KeyedLimiter::register`), held while any
    /// registration is.
    Pinned,
    /// Holds the keys of a restored snapshot whose policy no live slot has: retired from the
    /// start (each key is converted when next decided) and never revived.
    Restored,
}

/// A slot's role, as a snapshot records it (`src/snapshot.rs`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum SlotRole {
    Default = 0,
    Override = 1,
    Pinned = 2,
    /// Retired: its keys are converted to their current policy when next decided.
    Retired = 3,
}

impl SlotRole {
    pub(crate) fn from_byte(b: u8) -> Option<Self> {
        [SlotRole::Default, SlotRole::Override, SlotRole::Pinned, SlotRole::Retired]
            .into_iter()
            .find(|r| *r as u8 == b)
    }
}

struct Admin {
    overrides: HashMap<u64, u8>,
    roles: [Option<Role>; 256],
    /// Per slot, the registrations of a pinned policy not yet released (on the heap: the
    /// registry is built on the stack, and a loom model's thread has little of it).
    pins: Box<[u32]>,
    /// Arena positions in use, and each distinct policy's (by its canonical text).
    arena_len: u32,
    positions: HashMap<String, u32>,
    log_kind: bool,
}

fn is_log(policy: &Policy) -> bool {
    matches!(policy.algorithm, Algorithm::Log(_))
}

/// The registry as seen by a sweep, which runs under the admin lock: resolving reads the
/// overrides it already holds.
pub(crate) struct Locked<'a> {
    registry: &'a Registry,
    admin: &'a Admin,
}

impl Policies for Locked<'_> {
    fn algorithm(&self, idx: u8) -> Option<&Algorithm> {
        self.registry.algorithm(idx)
    }
    fn previous(&self, idx: u8) -> Option<&Algorithm> {
        self.registry.previous(idx)
    }
    fn resolve(&self, fp: u64) -> (u8, u32) {
        let idx = self.admin.overrides.get(&fp).copied();
        let idx = idx.unwrap_or_else(|| self.registry.default.load(Ordering::Acquire));
        (idx, self.registry.slots[usize::from(idx)].load(Ordering::Acquire))
    }
    fn still(&self, idx: u8, word: u32) -> bool {
        self.registry.still(idx, word)
    }
}

/// What a policy change needs of the key table: convert every key stored under a retired slot
/// to its current policy (`Table::sweep`).
pub(crate) type Sweep<'a> = dyn Fn(&Locked<'_>) + 'a;

impl Registry {
    pub(crate) fn new(policy: &Policy) -> Self {
        let registry = Registry {
            slots: std::array::from_fn(|_| AtomicU32::new(FREE)),
            zero: policy.algorithm.clone(),
            arena: Arena::new(),
            default: AtomicU8::new(0),
            has_overrides: AtomicBool::new(false),
            frozen: false,
            admin: Mutex::new(Admin {
                overrides: HashMap::new(),
                roles: [None; 256],
                pins: vec![0; 256].into_boxed_slice(),
                arena_len: 0,
                positions: HashMap::new(),
                log_kind: is_log(policy),
            }),
        };
        let mut admin = registry.admin();
        let pos = registry.position(&mut admin, policy).expect("an empty arena has room");
        debug_assert_eq!(pos, 0, "the first policy takes position 0: `zero`");
        registry.slots[0].store(pos, Ordering::Release);
        admin.roles[0] = Some(Role::Default);
        drop(admin);
        registry
    }

    /// Refuse every policy change from now on (a shared table's registry).
    #[cfg_attr(not(all(target_os = "linux", not(ratewell_loom))), allow(dead_code))] // shared tables only
    pub(crate) fn freeze(&mut self) {
        self.frozen = true;
    }

    fn admin(&self) -> MutexGuard<'_, Admin> {
        lock(&self.admin)
    }

    /// The policy of slot `idx` (retired or not).
    pub(crate) fn policy(&self, idx: u8) -> &Policy {
        let word = self.slots[usize::from(idx)].load(Ordering::Acquire);
        self.arena.get(word & !RETIRED).expect("an assigned slot")
    }

    /// The slot of keys without an override.
    #[inline]
    pub(crate) fn default_idx(&self) -> u8 {
        self.default.load(Ordering::Acquire)
    }

    pub(crate) fn default_policy(&self) -> &Policy {
        self.policy(self.default.load(Ordering::Acquire))
    }

    /// The arena position of `policy`, storing it if it is new.
    fn position(&self, admin: &mut Admin, policy: &Policy) -> Option<u32> {
        let text = policy.to_string();
        if let Some(&pos) = admin.positions.get(&text) {
            return Some(pos);
        }
        let pos = admin.arena_len;
        if pos & RETIRED != 0 || !self.arena.set(pos, policy.clone()) {
            return None;
        }
        admin.arena_len += 1;
        admin.positions.insert(text, pos);
        Some(pos)
    }

    /// The slot of `policy`: a live one that has it, a retired one revived, a free one, or one
    /// freed by sweeping the table of retired slots.
    fn register(
        &self,
        admin: &mut Admin,
        policy: &Policy,
        role: Role,
        sweep: &Sweep<'_>,
    ) -> Result<u8, PolicyError> {
        if self.frozen {
            return Err(PolicyError::new(
                policy.to_string(),
                "no policy change on a shared table (its policy is fixed when it is made: every \
                 process attached decides under it)",
            ));
        }
        if is_log(policy) != admin.log_kind {
            return Err(PolicyError::new(
                policy.to_string(),
                "a policy of the same kind as the limiter's (a sliding log cannot replace a \
                 one-word algorithm in a keyed limiter, nor the reverse)",
            ));
        }
        let too_many = || {
            PolicyError::new(
                policy.to_string(),
                "at most 255 distinct policies in use at once (the default, the overrides and the \
                 registered ones)",
            )
        };
        let pos = self.position(admin, policy).ok_or_else(too_many)?;
        let words: Vec<u32> =
            (0..MAX_POLICIES).map(|i| self.slots[i].load(Ordering::Acquire)).collect();
        // Live or retired with this policy in this role: its keys hold this policy's states.
        let same = |i: usize| {
            words[i] != FREE && words[i] & !RETIRED == pos && admin.roles[i] == Some(role)
        };
        if let Some(i) = (0..MAX_POLICIES).find(|&i| same(i)) {
            self.slots[i].store(pos, Ordering::Release);
            return Ok(i as u8);
        }
        let free = match words.iter().position(|&w| w == FREE) {
            Some(i) => i,
            None => {
                if !words.iter().any(|&w| w & RETIRED != 0) {
                    return Err(too_many());
                }
                sweep(&Locked { registry: self, admin });
                let mut first = None;
                for (i, &w) in words.iter().enumerate() {
                    if w & RETIRED != 0 {
                        self.slots[i].store(FREE, Ordering::Release);
                        admin.roles[i] = None;
                        first = first.or(Some(i));
                    }
                }
                first.expect("a retired slot")
            }
        };
        self.slots[free].store(pos, Ordering::Release);
        admin.roles[free] = Some(role);
        Ok(free as u8)
    }

    /// Retire slot `idx` if neither the default, an override nor a registration uses it.
    fn retire_unused(&self, admin: &Admin, idx: u8) {
        if idx != self.default.load(Ordering::Relaxed)
            && admin.pins[usize::from(idx)] == 0
            && !admin.overrides.values().any(|&i| i == idx)
        {
            self.slots[usize::from(idx)].fetch_or(RETIRED, Ordering::AcqRel);
        }
    }

    pub(crate) fn clear_overrides(&self) {
        let mut admin = self.admin();
        let idxs: Vec<u8> = admin.overrides.drain().map(|(_, idx)| idx).collect();
        self.has_overrides.store(false, Ordering::Release);
        for idx in idxs {
            self.retire_unused(&admin, idx);
        }
    }

    pub(crate) fn set_default(
        &self,
        policy: &Policy,
        sweep: &Sweep<'_>,
    ) -> Result<(), PolicyError> {
        let mut admin = self.admin();
        let idx = self.register(&mut admin, policy, Role::Default, sweep)?;
        let old = self.default.swap(idx, Ordering::AcqRel);
        if old != idx {
            self.retire_unused(&admin, old);
        }
        Ok(())
    }

    pub(crate) fn set_override(
        &self,
        fp: u64,
        policy: Option<&Policy>,
        sweep: &Sweep<'_>,
    ) -> Result<(), PolicyError> {
        let mut admin = self.admin();
        let old = match policy {
            Some(policy) => {
                let idx = self.register(&mut admin, policy, Role::Override, sweep)?;
                admin.overrides.insert(fp, idx).filter(|&old| old != idx)
            }
            None => admin.overrides.remove(&fp),
        };
        self.has_overrides.store(!admin.overrides.is_empty(), Ordering::Release);
        if let Some(old) = old {
            self.retire_unused(&admin, old);
        }
        Ok(())
    }

    /// Pin `policy` to a slot for decisions that name it: the slot and its word, which stay
    /// as they are until as many [`unpin`](Self::unpin)s.
    pub(crate) fn pin(&self, policy: &Policy, sweep: &Sweep<'_>) -> Result<(u8, u32), PolicyError> {
        let mut admin = self.admin();
        let idx = self.register(&mut admin, policy, Role::Pinned, sweep)?;
        admin.pins[usize::from(idx)] += 1;
        Ok((idx, self.slots[usize::from(idx)].load(Ordering::Acquire)))
    }

    /// Release one pin of slot `idx`; the last retires the slot (its keys are converted to the
    /// policy they resolve to when they are next decided, or when the slot is reused).
    pub(crate) fn unpin(&self, idx: u8) {
        let mut admin = self.admin();
        let pins = &mut admin.pins[usize::from(idx)];
        *pins = pins.saturating_sub(1);
        if *pins == 0 {
            self.retire_unused(&admin, idx);
        }
    }

    /// This registry's identity: the address of its arena's first entries, fixed for its life
    /// (on the heap: the registry itself moves with its limiter).
    pub(crate) fn id(&self) -> usize {
        std::ptr::from_ref::<[OnceLock<Policy>; INLINE as usize]>(&self.arena.first) as usize
    }

    /// Whether any key has an override.
    pub(crate) fn has_overrides(&self) -> bool {
        self.has_overrides.load(Ordering::Acquire)
    }

    /// Every assigned slot, live or retired, with its role and policy: what a snapshot records.
    pub(crate) fn slots_in_use(&self) -> Vec<(u8, SlotRole, Policy)> {
        let admin = self.admin();
        let default = self.default.load(Ordering::Acquire);
        (0..MAX_POLICIES)
            .filter_map(|i| {
                let word = self.slots[i].load(Ordering::Acquire);
                if word == FREE {
                    return None;
                }
                let role = if word & RETIRED != 0 {
                    SlotRole::Retired
                } else if i == usize::from(default) {
                    SlotRole::Default
                } else if admin.roles[i] == Some(Role::Pinned) {
                    SlotRole::Pinned
                } else {
                    SlotRole::Override
                };
                Some((i as u8, role, self.policy(i as u8).clone()))
            })
            .collect()
    }

    /// Restoring a snapshot into an empty table (no key is stored under any slot): the slot
    /// each of the snapshot's slots' keys are stored under, by the snapshot's index (`None`:
    /// no slot is left for its policy, and its keys start fresh).
    ///
    /// A pinned slot's keys go to a live pinned slot of the same policy; any slot's keys go to
    /// the default's slot if the default is that policy; the rest to a slot of their policy
    /// retired from the start ([`Role::Restored`]), so that each key is converted to its policy
    /// when it is next decided (by [`crate::algorithms::convert`], which keeps a state whose
    /// policy is unchanged as it is). The retired slots of this registry hold no key, so they
    /// are freed first. Must not be called while the limiter has overrides (they name keys by
    /// the fingerprints of the hash the restore replaces).
    pub(crate) fn adopt(&self, slots: &[(u8, SlotRole, Policy)]) -> Vec<Option<u8>> {
        let mut admin = self.admin();
        for i in 0..MAX_POLICIES {
            if self.slots[i].load(Ordering::Acquire) & RETIRED != 0 {
                self.slots[i].store(FREE, Ordering::Release);
                admin.roles[i] = None;
            }
        }
        let default = self.default.load(Ordering::Acquire);
        let mut map = vec![None; 256];
        for (idx, role, policy) in slots {
            if is_log(policy) != admin.log_kind {
                continue;
            }
            let live = |i: usize| {
                let word = self.slots[i].load(Ordering::Acquire);
                word != FREE && word & RETIRED == 0 && self.policy(i as u8) == policy
            };
            let pinned = (*role == SlotRole::Pinned)
                .then(|| {
                    (0..MAX_POLICIES).find(|&i| admin.roles[i] == Some(Role::Pinned) && live(i))
                })
                .flatten();
            let target = match pinned {
                Some(i) => Some(i as u8),
                None if live(usize::from(default)) => Some(default),
                None => self.adopt_retired(&mut admin, policy),
            };
            map[usize::from(*idx)] = target;
        }
        map
    }

    /// A slot retired from the start holding `policy`: one taken by an earlier call of this
    /// restore, or a free one.
    fn adopt_retired(&self, admin: &mut Admin, policy: &Policy) -> Option<u8> {
        let pos = self.position(admin, policy)?;
        let taken = (0..MAX_POLICIES).find(|&i| {
            admin.roles[i] == Some(Role::Restored)
                && self.slots[i].load(Ordering::Acquire) == pos | RETIRED
        });
        if let Some(i) = taken {
            return Some(i as u8);
        }
        let free = (0..MAX_POLICIES).find(|&i| self.slots[i].load(Ordering::Acquire) == FREE)?;
        self.slots[free].store(pos | RETIRED, Ordering::Release);
        admin.roles[free] = Some(Role::Restored);
        Some(free as u8)
    }

    /// Slots assigned now (live or retired).
    #[cfg(test)]
    fn assigned(&self) -> usize {
        self.slots.iter().filter(|s| s.load(Ordering::Relaxed) != FREE).count()
    }
}

impl Policies for Registry {
    #[inline]
    fn algorithm(&self, idx: u8) -> Option<&Algorithm> {
        // Acquire: pairs with the Release of the slot's assignment, after its arena entry was
        // set. A stale live word decides once more under the policy the key was stored with, as
        // if the change had come a moment later.
        let word = self.slots[usize::from(idx)].load(Ordering::Acquire);
        if word == 0 {
            return Some(&self.zero);
        }
        if word & RETIRED != 0 {
            return None;
        }
        self.arena.get(word).map(|p| &p.algorithm)
    }

    #[inline]
    fn previous(&self, idx: u8) -> Option<&Algorithm> {
        let word = self.slots[usize::from(idx)].load(Ordering::Acquire);
        self.arena.get(word & !RETIRED).map(|p| &p.algorithm)
    }

    fn resolve(&self, fp: u64) -> (u8, u32) {
        let idx = if self.has_overrides.load(Ordering::Acquire) {
            self.admin().overrides.get(&fp).copied()
        } else {
            None
        };
        let idx = idx.unwrap_or_else(|| self.default.load(Ordering::Acquire));
        (idx, self.slots[usize::from(idx)].load(Ordering::Acquire))
    }

    #[inline]
    fn still(&self, idx: u8, word: u32) -> bool {
        word & RETIRED == 0 && self.slots[usize::from(idx)].load(Ordering::Acquire) == word
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arena_positions_cover_every_chunk() {
        let mut pos = INLINE;
        for chunk in 0..4u32 {
            for offset in 0..(FIRST << chunk) {
                assert_eq!(Arena::locate(pos), (chunk as usize, offset as usize));
                pos += 1;
            }
        }
        let arena = Arena::new();
        let p: Policy = "fixed-window limit=1 window=1s".parse().unwrap();
        for pos in [0, 255, 256, 263, 264, 10_000] {
            assert!(arena.get(pos).is_none());
            assert!(arena.set(pos, p.clone()));
            assert_eq!(arena.get(pos), Some(&p));
        }
    }

    #[test]
    fn slots_are_reused_after_a_sweep() {
        let p = |n: u32| format!("fixed-window limit={n} window=1s").parse::<Policy>().unwrap();
        let registry = Registry::new(&p(1));
        let swept = std::cell::Cell::new(0);
        let sweep = |_: &Locked<'_>| swept.set(swept.get() + 1);
        for n in 2..=1000 {
            registry.set_default(&p(n), &sweep).unwrap();
            assert_eq!(registry.default_policy(), &p(n));
        }
        // One slot in use; every 254 changes, one sweep frees the retired ones.
        assert!(swept.get() >= 3 && swept.get() <= 4, "{}", swept.get());
        assert!(registry.assigned() <= MAX_POLICIES);
        // Switching back to an earlier policy revives its entry: the arena does not grow.
        let len = registry.admin().arena_len;
        registry.set_default(&p(7), &sweep).unwrap();
        assert_eq!(registry.admin().arena_len, len);
    }
}
