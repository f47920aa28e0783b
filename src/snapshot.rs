//! Snapshots: a keyed or layered limiter's keys written to bytes, and read back into a limiter
//! of the same shape, exactly.
//!
//! # Format (version 1)
//!
//! Little-endian throughout. A keyed limiter's snapshot:
//!
//! | field | bytes | meaning |
//! |---|---|---|
//! | magic | 8 | `RWSNAP\r\n` (a text-mode copy breaks it) |
//! | version | 4 | 1 |
//! | kind | 1 | 1: one-word states, 2: sliding logs, 3: layered |
//! | reserved | 3 | zero |
//! | now | 8 | the limiter's time at the snapshot (ns on its clock's time line) |
//! | anchor | 8 | the system clock at the snapshot, ns since the Unix epoch |
//! | seeds | 32 | the key hash's four seeds |
//! | probe | 8 | a fixed key hashed with them: another build's hash function fails the check |
//! | shape | 16 | shards, and buckets per shard (one-word) or keys per shard (logs) |
//! | slots | 2 + ... | count, then per policy slot: index, role, text length (2), policy text |
//! | keys | 8 | count |
//! | records | ... | per key, see below |
//! | checksum | 8 | of every byte before it |
//!
//! A one-word key's record is its bucket's position (shard-major, as a LEB128 difference from
//! the previous record's: one byte for most keys), its key word (policy slot and fingerprint)
//! and its state word, unmasked: 17 bytes for most keys. A sliding-log key's record is its
//! hash, its policy slot, its entry count (4 bytes) and the entries (time 8, cost 4), oldest
//! first; records go from the least recently admitted key of each shard.
//!
//! A layered limiter's snapshot is the header to `anchor`, a layer count (in the reserved
//! bytes), then per layer its name (2 + length) and its table's keyed snapshot (8 + length),
//! then the checksum.
//!
//! # Time
//!
//! States are stored as they are, on the limiter's time line. Restoring puts the new limiter's
//! clock on that line: its time becomes the snapshot's `now` plus the system time that passed
//! since `anchor` (none if the system clock reads earlier: nothing is minted), by an offset
//! added to every reading ([`Resume`]). So a state restored after a pause decides as it would
//! have after that much silence, with every window boundary where it was.

use std::fmt;
use std::io::{self, Read, Write};
use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::keyed::registry::SlotRole;
use crate::policy::Policy;

pub(crate) const MAGIC: [u8; 8] = *b"RWSNAP\r\n";
pub(crate) const VERSION: u32 = 1;
pub(crate) const KIND_WORDS: u8 = 1;
pub(crate) const KIND_LOGS: u8 = 2;
pub(crate) const KIND_LAYERED: u8 = 3;
/// Hashed with a snapshot's seeds into its `probe` field.
pub(crate) const PROBE: &str = "ratewell snapshot probe";
/// The latest time a snapshot may record (146 years of nanoseconds): far from wrapping.
const MAX_TIME: u64 = 1 << 62;

/// Why a snapshot could not be restored. The limiter is unchanged whenever one is returned.
#[derive(Debug)]
#[non_exhaustive]
pub enum SnapshotError {
    /// Reading the snapshot failed.
    Io(io::Error),
    /// The snapshot is empty.
    Empty,
    /// The snapshot ends before its last field.
    Truncated,
    /// The bytes are not a ratewell snapshot.
    NotASnapshot,
    /// A format version this build does not read.
    Version {
        /// The snapshot's version.
        found: u32,
        /// The version this build reads.
        supported: u32,
    },
    /// The checksum does not match: the bytes were changed after they were written.
    Checksum,
    /// A snapshot of another kind of limiter.
    Kind {
        /// What the snapshot holds.
        found: &'static str,
        /// What the limiter restoring it is.
        expected: &'static str,
    },
    /// A snapshot of a table of another shape (capacity): its keys' places cannot be computed
    /// from what it stores.
    Shape {
        /// The snapshot's shards and buckets (or keys) per shard.
        found: (u64, u64),
        /// The limiter's.
        expected: (u64, u64),
    },
    /// Written by a build whose key hash differs: its keys cannot be found here.
    HashFunction,
    /// A policy in the snapshot does not parse.
    Policy {
        /// The policy's text.
        text: String,
        /// Why it is refused.
        error: String,
    },
    /// The limiter has per-key overrides, which name keys by the hash the restore replaces:
    /// restore first, then set them.
    Overrides,
    /// A field holds a value no snapshot has.
    Corrupt(&'static str),
    /// The limiter's table is shared (`KeyedLimiter::open_shared`) and another live process
    /// is attached to it: restoring replaces the hash seeds and the time line that every
    /// process attached shares, so it is done before the others attach (an nginx master before
    /// it forks its workers, say).
    Shared,
}

impl fmt::Display for SnapshotError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SnapshotError::Io(e) => write!(f, "reading the snapshot failed: {e}"),
            SnapshotError::Empty => f.write_str("the snapshot is empty"),
            SnapshotError::Truncated => f.write_str("the snapshot is truncated"),
            SnapshotError::NotASnapshot => f.write_str("not a ratewell snapshot (bad magic)"),
            SnapshotError::Version { found, supported } => {
                write!(f, "snapshot format version {found}; this build reads version {supported}")
            }
            SnapshotError::Checksum => f.write_str("the snapshot's checksum does not match"),
            SnapshotError::Kind { found, expected } => {
                write!(f, "a snapshot of {found}, restored into {expected}")
            }
            SnapshotError::Shape { found, expected } => write!(
                f,
                "a snapshot of a table of {} shards of {} (this limiter's: {} of {}): build the \
                 limiter with the capacity the snapshot was taken with",
                found.0, found.1, expected.0, expected.1
            ),
            SnapshotError::HashFunction => {
                f.write_str("the snapshot was written by a build that hashes keys differently")
            }
            SnapshotError::Policy { text, error } => {
                write!(f, "the snapshot's policy {text:?} is refused: {error}")
            }
            SnapshotError::Overrides => f.write_str(
                "the limiter has per-key overrides: restore the snapshot first, then set them",
            ),
            SnapshotError::Corrupt(what) => write!(f, "the snapshot is corrupt: {what}"),
            SnapshotError::Shared => f.write_str(
                "the shared table has another live process attached: it is restored before the \
                 others attach (they share its hash seeds and time line)",
            ),
        }
    }
}

impl std::error::Error for SnapshotError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            SnapshotError::Io(e) => Some(e),
            _ => None,
        }
    }
}

impl From<io::Error> for SnapshotError {
    fn from(e: io::Error) -> Self {
        SnapshotError::Io(e)
    }
}

/// How time passes between a snapshot and its restore.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum Resume {
    /// The time that passed is the system clock's advance since the snapshot's anchor, at least
    /// zero: a restart after a minute's pause finds every key a minute older. The default.
    #[default]
    WallClock,
    /// [`WallClock`](Self::WallClock), taking `SystemTime` as the system clock's reading now
    /// (for tests and tools).
    At(SystemTime),
    /// The limiter's clock already reads on the snapshot's time line (a trace's clock, a
    /// [`ManualClock`](crate::ManualClock) set by the caller): no shift.
    SameClock,
}

/// What a snapshot wrote.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct SnapshotInfo {
    /// Keys written.
    pub keys: u64,
    /// Bytes written.
    pub bytes: u64,
    /// The system clock at the snapshot.
    pub anchor: SystemTime,
}

/// What a restore did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Restored {
    /// Keys restored.
    pub keys: u64,
    /// Keys back to full by the time of the restore: not stored (no decision differs).
    pub expired: u64,
    /// Keys whose policy no slot could take (more than 255 distinct policies between the
    /// snapshot and the limiter): they start fresh.
    pub fresh: u64,
    /// Keys with no room left in their shard (a sliding log restored at a smaller capacity):
    /// they start fresh.
    pub dropped: u64,
    /// The time the restore counted as passed since the snapshot.
    pub elapsed: Duration,
    /// Layers of a layered snapshot that the limiter does not have (by name): ignored.
    pub ignored_layers: Vec<String>,
}

impl Restored {
    pub(crate) fn add(&mut self, other: &Restored) {
        self.keys += other.keys;
        self.expired += other.expired;
        self.fresh += other.fresh;
        self.dropped += other.dropped;
    }
}

/// A 64-bit checksum of `bytes`: eight bytes at a time, each step a bijection of the running
/// value, so any change confined to one 8-byte word is always detected, and others are missed
/// with odds of about 2^-64. About 1 ns a word.
pub(crate) fn checksum(bytes: &[u8]) -> u64 {
    const K: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut h = (bytes.len() as u64).wrapping_mul(K) ^ 0x5241_5445_5745_4c4c;
    let mut words = bytes.chunks_exact(8);
    for w in &mut words {
        let w = u64::from_le_bytes(w.try_into().expect("8 bytes"));
        h = (h ^ w).wrapping_mul(K).rotate_left(29);
    }
    let mut tail = [0u8; 8];
    tail[..words.remainder().len()].copy_from_slice(words.remainder());
    h = (h ^ u64::from_le_bytes(tail)).wrapping_mul(K).rotate_left(29);
    h ^ (h >> 32)
}

/// Bytes being written.
pub(crate) struct Out(pub(crate) Vec<u8>);

impl Out {
    pub(crate) fn u8(&mut self, v: u8) {
        self.0.push(v);
    }
    pub(crate) fn u16(&mut self, v: u16) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    pub(crate) fn u32(&mut self, v: u32) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    pub(crate) fn u64(&mut self, v: u64) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    pub(crate) fn bytes(&mut self, v: &[u8]) {
        self.0.extend_from_slice(v);
    }
    /// A text of at most 65,535 bytes, after its length.
    pub(crate) fn text(&mut self, v: &str) {
        let v = &v.as_bytes()[..v.len().min(usize::from(u16::MAX))];
        self.u16(v.len() as u16);
        self.bytes(v);
    }
    pub(crate) fn leb(&mut self, mut v: u64) {
        while v >= 0x80 {
            self.0.push(v as u8 | 0x80);
            v >>= 7;
        }
        self.0.push(v as u8);
    }
    /// The header up to `anchor` (included).
    pub(crate) fn header(&mut self, kind: u8, count: u8, now: u64, anchor: u64) {
        self.bytes(&MAGIC);
        self.u32(VERSION);
        self.bytes(&[kind, count, 0, 0]);
        self.u64(now);
        self.u64(anchor);
    }
    /// Append the checksum of everything so far.
    pub(crate) fn seal(&mut self) {
        let sum = checksum(&self.0);
        self.u64(sum);
    }
}

/// Bytes being read; every read past the end is [`SnapshotError::Truncated`].
pub(crate) struct In<'a> {
    bytes: &'a [u8],
    at: usize,
}

type Parse<T> = Result<T, SnapshotError>;

impl<'a> In<'a> {
    pub(crate) fn take(&mut self, n: usize) -> Parse<&'a [u8]> {
        let end = self.at.checked_add(n).filter(|&e| e <= self.bytes.len());
        let end = end.ok_or(SnapshotError::Truncated)?;
        let v = &self.bytes[self.at..end];
        self.at = end;
        Ok(v)
    }
    pub(crate) fn u8(&mut self) -> Parse<u8> {
        Ok(self.take(1)?[0])
    }
    pub(crate) fn u16(&mut self) -> Parse<u16> {
        Ok(u16::from_le_bytes(self.take(2)?.try_into().expect("2 bytes")))
    }
    pub(crate) fn u32(&mut self) -> Parse<u32> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().expect("4 bytes")))
    }
    pub(crate) fn u64(&mut self) -> Parse<u64> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().expect("8 bytes")))
    }
    pub(crate) fn text(&mut self) -> Parse<&'a str> {
        let n = usize::from(self.u16()?);
        std::str::from_utf8(self.take(n)?)
            .map_err(|_| SnapshotError::Corrupt("a text is not UTF-8"))
    }
    pub(crate) fn leb(&mut self) -> Parse<u64> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let b = self.u8()?;
            v |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                if shift == 63 && b > 1 {
                    break;
                }
                return Ok(v);
            }
        }
        Err(SnapshotError::Corrupt("a position is too long"))
    }
    pub(crate) fn is_empty(&self) -> bool {
        self.at == self.bytes.len()
    }
}

/// What every snapshot starts with.
pub(crate) struct Header {
    pub(crate) kind: u8,
    pub(crate) count: u8,
    pub(crate) now: u64,
    pub(crate) anchor: u64,
}

/// Check a whole snapshot's framing (magic, version, checksum) and read its header: the
/// header, and a reader of what follows it, up to the checksum.
pub(crate) fn open(bytes: &[u8]) -> Parse<(Header, In<'_>)> {
    if bytes.is_empty() {
        return Err(SnapshotError::Empty);
    }
    let magic_len = MAGIC.len().min(bytes.len());
    if bytes[..magic_len] != MAGIC[..magic_len] {
        return Err(SnapshotError::NotASnapshot);
    }
    if bytes.len() < 12 {
        return Err(SnapshotError::Truncated);
    }
    let version = u32::from_le_bytes(bytes[8..12].try_into().expect("4 bytes"));
    if version != VERSION {
        return Err(SnapshotError::Version { found: version, supported: VERSION });
    }
    // The header and the checksum at least.
    if bytes.len() < 40 {
        return Err(SnapshotError::Truncated);
    }
    let (body, sum) = bytes.split_at(bytes.len() - 8);
    if checksum(body) != u64::from_le_bytes(sum.try_into().expect("8 bytes")) {
        return Err(SnapshotError::Checksum);
    }
    let mut input = In { bytes: body, at: 12 };
    let [kind, count, r0, r1] = input.take(4)?.try_into().expect("4 bytes");
    if r0 != 0 || r1 != 0 {
        return Err(SnapshotError::Corrupt("reserved bytes are set"));
    }
    let now = input.u64()?;
    let anchor = input.u64()?;
    if now > MAX_TIME || anchor > MAX_TIME {
        return Err(SnapshotError::Corrupt("a time is out of range"));
    }
    Ok((Header { kind, count, now, anchor }, input))
}

pub(crate) fn kind_name(kind: u8) -> &'static str {
    match kind {
        KIND_WORDS => "a keyed limiter of one-word states",
        KIND_LOGS => "a keyed limiter of sliding logs",
        KIND_LAYERED => "a layered limiter",
        _ => "an unknown kind of limiter",
    }
}

/// The system clock now, as nanoseconds since the Unix epoch (0 before it).
pub(crate) fn wall_ns(at: SystemTime) -> u64 {
    at.duration_since(UNIX_EPOCH).map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

/// The time `resume` counts as passed since a snapshot anchored at `anchor` (ns since the
/// epoch), never less than zero; `None` for [`Resume::SameClock`].
pub(crate) fn elapsed(resume: Resume, anchor: u64) -> Option<Duration> {
    let at = match resume {
        Resume::WallClock => SystemTime::now(),
        Resume::At(at) => at,
        Resume::SameClock => return None,
    };
    let ns = wall_ns(at).saturating_sub(anchor).min(MAX_TIME);
    Some(Duration::from_nanos(ns))
}

/// The offset that puts a clock reading `reading` at `now + elapsed` on the snapshot's time
/// line; 0 for [`Resume::SameClock`].
pub(crate) fn offset(now: u64, elapsed: Option<Duration>, reading: u64) -> u64 {
    match elapsed {
        None => 0,
        Some(d) => now.saturating_add(d.as_nanos() as u64).wrapping_sub(reading),
    }
}

/// Read a whole snapshot from `r`, at most `limit` bytes (more is an error: it cannot be the
/// snapshot of this limiter).
pub(crate) fn read_all(r: impl Read, limit: u64) -> Parse<Vec<u8>> {
    let mut bytes = Vec::new();
    r.take(limit.saturating_add(1)).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > limit {
        return Err(SnapshotError::Corrupt("longer than any snapshot of this limiter"));
    }
    Ok(bytes)
}

/// Write `bytes` to `path` so that a crash leaves the old file or the new one, never a part:
/// to a temporary file beside it, synced, then renamed over it.
pub(crate) fn write_file(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = std::path::PathBuf::from(tmp);
    let mut file = std::fs::File::create(&tmp)?;
    file.write_all(bytes)?;
    file.sync_all()?;
    drop(file);
    std::fs::rename(&tmp, path)
}

/// A policy slot as a snapshot records it.
pub(crate) type Slot = (u8, SlotRole, Policy);

/// Write the slots: count, then index, role, text.
pub(crate) fn write_slots(out: &mut Out, slots: &[Slot]) {
    out.u16(slots.len() as u16);
    for (idx, role, policy) in slots {
        out.u8(*idx);
        out.u8(*role as u8);
        out.text(&policy.to_string());
    }
}

/// Read the slots back, each policy parsed; the table of slots by index.
pub(crate) fn read_slots(input: &mut In<'_>) -> Parse<Vec<Slot>> {
    let n = input.u16()?;
    if usize::from(n) > 255 {
        return Err(SnapshotError::Corrupt("more than 255 policy slots"));
    }
    let mut slots: Vec<Slot> = Vec::with_capacity(usize::from(n));
    for _ in 0..n {
        let idx = input.u8()?;
        let role =
            SlotRole::from_byte(input.u8()?).ok_or(SnapshotError::Corrupt("a slot's role"))?;
        let text = input.text()?;
        let policy: Policy = text.parse().map_err(|e: crate::PolicyError| {
            SnapshotError::Policy { text: text.to_owned(), error: e.to_string() }
        })?;
        if idx == 255 || slots.iter().any(|s| s.0 == idx) {
            return Err(SnapshotError::Corrupt("a policy slot's index"));
        }
        slots.push((idx, role, policy));
    }
    Ok(slots)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leb_round_trips() {
        for v in [0, 1, 127, 128, 300, u64::from(u32::MAX), u64::MAX] {
            let mut out = Out(Vec::new());
            out.leb(v);
            let mut input = In { bytes: &out.0, at: 0 };
            assert_eq!(input.leb().unwrap(), v);
            assert!(input.is_empty());
        }
        // Eleven continuation bytes: too long, not a panic.
        let bytes = [0xff; 11];
        assert!(matches!(In { bytes: &bytes, at: 0 }.leb(), Err(SnapshotError::Corrupt(_))));
    }

    #[test]
    fn a_changed_word_changes_the_checksum() {
        let bytes: Vec<u8> = (0..100u8).collect();
        let sum = checksum(&bytes);
        for i in 0..bytes.len() {
            for bit in 0..8 {
                let mut flipped = bytes.clone();
                flipped[i] ^= 1 << bit;
                assert_ne!(checksum(&flipped), sum, "byte {i} bit {bit}");
            }
        }
        assert_ne!(checksum(&bytes[..99]), sum);
    }
}
