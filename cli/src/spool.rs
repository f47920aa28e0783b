//! Reading a trace again: with `--find-capacity`, standard input is copied to a temporary file as
//! it is read, so that a replay that evicted live keys can replay the trace once more to find the
//! capacity that would not have.

use std::fs::File;
use std::io::{self, BufWriter, Read, Write};
use std::path::{Path, PathBuf};

use ratewell::{KeyedLimiter, ManualClock, Policy};

use crate::input::Reopen;

/// The seed of every table `replay` and `compare` build: the same input gives the same output in
/// every run, evictions included.
pub(crate) const SEED: u64 = 0x7261_7465_7765_6c6c;

/// A temporary file, removed when dropped.
pub(crate) struct TempFile(PathBuf);

impl TempFile {
    pub(crate) fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// `inner`, with every byte read also written to a temporary file (dropped, with the file, on
/// the first error writing it: the copy is a convenience, never a reason to fail).
pub(crate) struct Tee<R> {
    inner: R,
    copy: Option<(BufWriter<File>, TempFile)>,
}

impl<R: Read> Tee<R> {
    /// `inner`, copied only if `copy` (a regular file can be read again as it is).
    pub(crate) fn new_if(inner: R, copy: bool) -> Self {
        let path =
            std::env::temp_dir().join(format!(".ratewell-input-{}.trace", std::process::id()));
        let copy = copy
            .then(|| File::create_new(&path).ok())
            .flatten()
            .map(|f| (BufWriter::with_capacity(1 << 16, f), TempFile(path)));
        Tee { inner, copy }
    }

    /// The copy of everything read, if it was kept whole.
    pub(crate) fn finish(self) -> Option<TempFile> {
        let (mut writer, file) = self.copy?;
        writer.flush().ok()?;
        Some(file)
    }
}

impl<R: Read> Read for Tee<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        if let Some((writer, _)) = &mut self.copy {
            if writer.write_all(&buf[..n]).is_err() {
                self.copy = None;
            }
        }
        Ok(n)
    }
}

/// How a run decides one request: `(limiter, key, cost)`, keyed as the run being reproduced.
pub(crate) type Check<'a, K> = dyn FnMut(&KeyedLimiter<K, ManualClock>, &[u8], u32) + 'a;

/// Whether replaying the input `reopen` reads through `policy` in a seeded table of `capacity`
/// keys evicts a live key; `None` if such a table cannot be allocated.
fn evicts<K: std::hash::Hash + ?Sized>(
    policy: &Policy,
    reopen: &Reopen<'_>,
    capacity: usize,
    check: &mut Check<'_, K>,
) -> Result<Option<bool>, String> {
    let clock = ManualClock::new(0);
    let built =
        KeyedLimiter::<K>::builder(policy, capacity).clock(clock.clone()).seed(SEED).build();
    let Ok(limiter) = built else {
        return Ok(None);
    };
    let mut reader = reopen()?;
    while let Some(request) = reader.next_request()? {
        clock.set(request.t);
        check(&limiter, request.key, request.cost);
        if limiter.metrics().evictions > 0 {
            return Ok(Some(true));
        }
    }
    Ok(Some(false))
}

/// Tables the search tries at most: 2^28 keys (4 GiB of slots), or 8 times the capacity asked
/// for if that is more. A larger table could be allocated and still exhaust the machine's memory
/// as it is filled.
const SEARCH_MAX: usize = 1 << 28;

/// What the eviction note advises.
pub(crate) enum Search {
    /// `--find-capacity` was not given: the note names it.
    NotAsked,
    /// The smallest capacity tried that evicts no live key.
    Found(usize),
    /// No capacity up to this many keys avoids it (or could be allocated).
    NoneUpTo(usize),
    /// Standard input could not be kept to be read again.
    Unreadable,
}

/// The smallest of `2c, 4c, 8c, ...` (from the capacity `c` that evicted) at which a replay of
/// the input `reopen` reads evicts no live key; [`Search::NoneUpTo`] if none up to `max` keys
/// does (or can be allocated).
pub(crate) fn avoiding_capacity<K: std::hash::Hash + ?Sized>(
    policy: &Policy,
    reopen: &Reopen<'_>,
    capacity: usize,
    check: &mut Check<'_, K>,
) -> Result<Search, String> {
    let max =
        SEARCH_MAX.max(capacity.saturating_mul(8)).min(KeyedLimiter::<K>::MAX_CAPACITY as usize);
    let mut c = capacity.max(1);
    loop {
        c = match c.checked_mul(2) {
            Some(c) if c <= max => c,
            _ => return Ok(Search::NoneUpTo(c.min(max))),
        };
        match evicts(policy, reopen, c, check)? {
            Some(true) => continue,
            Some(false) => return Ok(Search::Found(c)),
            None => return Ok(Search::NoneUpTo(c / 2)),
        }
    }
}

/// The stderr note for `evictions` live keys evicted from a table of `capacity` keys.
pub(crate) fn eviction_note(what: &str, evictions: u64, capacity: u64, search: Search) -> String {
    let times = if evictions == 1 { "once" } else { "times" };
    let count = if evictions == 1 { String::new() } else { format!("{evictions} ") };
    let advice = match search {
        Search::NotAsked => {
            "a larger --capacity avoids it (--find-capacity replays the trace again to find one)"
                .into()
        }
        Search::Found(c) => format!("--capacity {c} avoids it"),
        Search::NoneUpTo(max) => format!("no --capacity up to {max} avoids it"),
        Search::Unreadable => {
            "the trace could not be read again to find the capacity that avoids it".into()
        }
    };
    format!(
        "ratewell: {what}live keys were evicted {count}{times} from a table of {capacity} keys, \
         so decisions may differ from an unbounded table's; {advice}"
    )
}
