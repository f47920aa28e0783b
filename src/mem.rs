//! The crate's one file of `unsafe` code. Two hints about memory that change no value: a software
//! prefetch of a key's bucket (batched decisions) and, on Linux, asking for transparent huge
//! pages under the key table. And the memory a key table lives in: [`Slab`] (the table's arrays,
//! on the heap or in a shared region) and [`Region`] (memory that several processes map: a file
//! mapped with `mmap`, or memory the caller provides), with the few system calls a shared table
//! needs (`mmap`, `flock`, `kill(pid, 0)`). Each `unsafe` block states why it is sound; `cargo
//! +nightly miri test --lib` runs the table's, the batches' and the slabs' unit tests (Miri
//! cannot call the kernel or run inline assembly: under it the huge-page advice and the aarch64
//! prefetch are skipped, and no file is mapped).
#![allow(unsafe_code)]
// Shared tables are built on Linux only, and not under loom.
#![cfg_attr(not(all(target_os = "linux", not(ratewell_loom))), allow(dead_code))]

/// Start loading the cache line holding `value` (to every level of cache), without waiting for
/// it: a hint that reads nothing into the program, cannot fault, and is dropped by the CPU if
/// the line cannot be fetched cheaply. `prefetcht0` on x86_64, `prfm pldl1keep` on aarch64, a
/// no-op elsewhere.
#[inline(always)]
pub(crate) fn prefetch<T>(value: &T) {
    #[cfg(all(target_arch = "x86_64", target_feature = "sse"))]
    {
        use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
        let p = std::ptr::from_ref(value).cast::<i8>();
        // SAFETY: `_mm_prefetch` is `unsafe` only because it needs the `sse` target feature,
        // which the `cfg` above proves is enabled for this build. It dereferences nothing: any
        // address is allowed (and this one is a live reference).
        unsafe { _mm_prefetch::<_MM_HINT_T0>(p) }
    }
    // aarch64 has no stable prefetch intrinsic (`core::arch::aarch64::_prefetch` is unstable):
    // the instruction itself. Not under Miri, which cannot run inline assembly.
    #[cfg(all(target_arch = "aarch64", not(miri)))]
    {
        let p = std::ptr::from_ref(value);
        // SAFETY: `prfm` is a hint (Arm Architecture Reference Manual, *Prefetch memory*: it
        // generates no synchronous Data Abort, whatever the address), so it cannot fault, and
        // it writes no register, flag or memory: at most it starts a cache fill. The options
        // say so: no stack, flags kept, memory at most read. (The address is a live
        // reference's anyway.)
        unsafe {
            std::arch::asm!(
                "prfm pldl1keep, [{p}]",
                p = in(reg) p,
                options(nostack, preserves_flags, readonly)
            )
        }
    }
    #[cfg(not(any(
        all(target_arch = "x86_64", target_feature = "sse"),
        all(target_arch = "aarch64", not(miri))
    )))]
    let _ = value;
}

/// The size of a transparent huge page on x86_64 and (4 KiB granule) aarch64 Linux.
pub(crate) const HUGE_PAGE: usize = 2 << 20;

/// Ask the kernel to back the whole 2 MiB pages inside `region` (memory allocated and not yet
/// written, so that its first touch faults huge pages in) with transparent huge pages:
/// `madvise(MADV_HUGEPAGE)`. Whether it did (the kernel accepted the advice; `false` for a
/// region holding no whole huge page, off Linux, and under Miri). The advice changes no contents
/// and no permission; with THP set to `never` the kernel ignores it, with `always` it is
/// redundant.
pub(crate) fn advise_huge_pages<T>(region: &mut [std::mem::MaybeUninit<T>]) -> bool {
    let start = region.as_ptr().addr();
    let (from, to) = huge_pages_within(start, size_of_val(region));
    if to <= from {
        return false;
    }
    #[cfg(all(target_os = "linux", not(miri)))]
    {
        let at = region.as_mut_ptr().cast::<u8>().wrapping_add(from - start);
        // SAFETY: `[from, to)` is page-aligned and lies inside `region`, memory this process
        // owns (borrowed mutably, so no other value lives in it), so the advice concerns no
        // other allocation; and MADV_HUGEPAGE only changes how the kernel backs those pages
        // (their contents and permissions stay the same), so no Rust value can be affected.
        let rc = unsafe { libc::madvise(at.cast(), to - from, libc::MADV_HUGEPAGE) };
        rc == 0
    }
    #[cfg(not(all(target_os = "linux", not(miri))))]
    false
}

/// The whole huge pages `[from, to)` inside the `bytes` bytes at address `start`.
fn huge_pages_within(start: usize, bytes: usize) -> (usize, usize) {
    let from = start.checked_next_multiple_of(HUGE_PAGE).unwrap_or(usize::MAX);
    let to = start.saturating_add(bytes) / HUGE_PAGE * HUGE_PAGE;
    (from, to)
}

/// Types that any bytes are a valid value of, made only of `u64`-sized atomics (and alignment
/// padding, which nothing reads): what a [`Region`] of another process's bytes may be viewed as.
///
/// # Safety
///
/// An implementor must be `repr(C)` or `repr(transparent)` over `AtomicU64`s only (arrays and
/// nested implementors included), so that every bit pattern of its size is a valid value, and
/// every access to it is atomic (another process may write it at any time).
pub(crate) unsafe trait Plain: Sync {}

// SAFETY: `AtomicU64` has the size, alignment and bit validity of `u64` (its documentation), so
// any 8 bytes are one, and it is only ever accessed atomically.
unsafe impl Plain for std::sync::atomic::AtomicU64 {}

// SAFETY: `repr(C)` over two `AtomicU64`s (std's outside the loom models, which build no shared
// table), accessed only atomically.
#[cfg(not(ratewell_loom))]
unsafe impl Plain for crate::keyed::table::Slot {}
// SAFETY: `repr(C, align(128))` over eight `Slot`s, 128 bytes: no padding.
#[cfg(not(ratewell_loom))]
unsafe impl Plain for crate::keyed::table::Bucket {}
// SAFETY: `repr(C, align(128))` over eleven std `AtomicU64`s; the padding to 128 bytes is never
// read.
unsafe impl Plain for crate::keyed::table::Shard {}
// SAFETY: `repr(C, align(128))` over sixteen std `AtomicU64`s, 128 bytes: no padding.
unsafe impl Plain for crate::keyed::counts::Counters {}

/// An array the key table's code indexes as a slice: on the heap (a `Box<[T]>` it owns), or a
/// run of a shared [`Region`] (which it keeps mapped). One pointer and one length either way, so
/// indexing it costs what indexing a boxed slice does.
pub(crate) struct Slab<T> {
    ptr: std::ptr::NonNull<T>,
    len: usize,
    /// `None`: `ptr` and `len` are a leaked `Box<[T]>`, rebuilt and dropped with the slab.
    region: Option<std::sync::Arc<Region>>,
}

// SAFETY: a `Slab<T>` is a shared borrow of `len` values of `T` (owned, or in a region kept
// mapped for as long as the slab lives), handing out only `&T`: it may be sent and shared
// between threads whenever `&[T]` may, that is when `T: Sync` (and, to drop an owned one on
// another thread, `T: Send`).
unsafe impl<T: Sync + Send> Send for Slab<T> {}
// SAFETY: as above: sharing a slab shares `&[T]`.
unsafe impl<T: Sync> Sync for Slab<T> {}

impl<T> Slab<T> {
    /// A slab owning `values`.
    pub(crate) fn from_box(values: Box<[T]>) -> Self {
        let len = values.len();
        let ptr = std::ptr::NonNull::from(Box::leak(values)).cast::<T>();
        Slab { ptr, len, region: None }
    }

    /// Whether the values are in a shared region rather than on this process's heap.
    pub(crate) fn is_shared(&self) -> bool {
        self.region.is_some()
    }
}

impl<T: Plain> Slab<T> {
    /// `count` values of `T` at byte `offset` of `region`, or `None` if they do not lie inside
    /// it or `offset` is not aligned for `T`.
    pub(crate) fn in_region(
        region: &std::sync::Arc<Region>,
        offset: usize,
        count: usize,
    ) -> Option<Self> {
        let bytes = count.checked_mul(size_of::<T>())?;
        let end = offset.checked_add(bytes)?;
        if end > region.len
            || !(region.ptr.as_ptr().addr() + offset).is_multiple_of(align_of::<T>())
        {
            return None;
        }
        // SAFETY: `offset + bytes <= region.len`, so the pointer stays inside the region's
        // allocation (or one past its end for an empty run).
        let at = unsafe { region.ptr.as_ptr().add(offset) };
        let ptr = std::ptr::NonNull::new(at.cast::<T>())?;
        Some(Slab { ptr, len: count, region: Some(std::sync::Arc::clone(region)) })
    }
}

impl<T> std::ops::Deref for Slab<T> {
    type Target = [T];

    #[inline(always)]
    fn deref(&self) -> &[T] {
        // SAFETY: `ptr` and `len` are either a leaked `Box<[T]>` (valid until `drop`, which needs
        // `&mut self`), or `len` aligned values of a `Plain` type inside a region this slab keeps
        // mapped (`in_region` checked bounds and alignment): valid, initialized (every bit pattern
        // is a `T`), and only accessed through `&T`, whose methods are atomic (so other processes'
        // writes are no data race).
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl<T> Drop for Slab<T> {
    fn drop(&mut self) {
        if self.region.is_none() {
            let slice = std::ptr::slice_from_raw_parts_mut(self.ptr.as_ptr(), self.len);
            // SAFETY: without a region, `ptr` and `len` came from `Box::leak` in `from_box` and
            // nothing else owns them; no `&T` outlives the slab (they borrow it).
            drop(unsafe { Box::from_raw(slice) });
        }
    }
}

impl<T: std::fmt::Debug> std::fmt::Debug for Slab<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Slab").field("len", &self.len).field("shared", &self.is_shared()).finish()
    }
}

/// Memory a shared key table lives in, which other processes map too: a file mapped with
/// [`KeyedLimiter::open_shared`](crate::KeyedLimiter::open_shared), or memory the caller
/// provides ([`from_raw`](Self::from_raw): an nginx shared zone, a mapping made before `fork`).
///
/// A region is read and written only through atomic 64-bit operations, since other processes
/// write it at any time; its contents are checked when a table attaches (`docs/SEMANTICS.md`,
/// *Shared tables*), and any bytes there give an error or a working table, never undefined
/// behaviour.
pub struct Region {
    ptr: std::ptr::NonNull<u8>,
    len: usize,
    /// Whether the region is this process's mapping of a file (unmapped when dropped).
    mapped: bool,
}

// SAFETY: a region is memory shared with other processes, accessed only atomically (through
// `Plain` views): moving or sharing the handle between threads is no different from sharing it
// between processes.
unsafe impl Send for Region {}
// SAFETY: as above.
unsafe impl Sync for Region {}

impl std::fmt::Debug for Region {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Region").field("len", &self.len).field("mapped", &self.mapped).finish()
    }
}

impl Region {
    /// The `len` bytes at `ptr` as a region for a shared key table.
    ///
    /// Every process that maps the same memory (at any address) and passes it here shares one
    /// table. Memory no table has used must be zeroed (an anonymous shared mapping, a new nginx
    /// zone): a region whose first word is neither zero nor a table's is refused.
    ///
    /// # Safety
    ///
    /// For as long as any limiter built on the region lives (it keeps the region), the memory
    /// must stay mapped, readable and writable, aligned to 128 bytes (the table's counters are
    /// cache-line pairs; any page-aligned mapping is; memory aligned otherwise is refused), and
    /// no code may access it other than through a limiter of this crate (in this process or
    /// another): in particular no Rust reference to it may be used meanwhile.
    ///
    /// # Examples
    ///
    /// An anonymous shared mapping made before `fork`, so that parent and child share one table:
    ///
    /// ```no_run
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use ratewell::{KeyedLimiter, Policy, Region};
    ///
    /// let policy: Policy = "token-bucket capacity=10 rate=1/s".parse()?;
    /// let len = KeyedLimiter::<str>::region_size(&policy, 10_000)?;
    /// # let ptr: *mut u8 = std::ptr::null_mut(); // mmap(MAP_SHARED | MAP_ANONYMOUS) in a real program
    /// // SAFETY: `ptr` is a fresh shared mapping of `len` bytes, kept for the program's life.
    /// let region = unsafe { Region::from_raw(ptr, len) };
    /// let limiter = KeyedLimiter::<str>::builder(&policy, 10_000).in_region(region)?;
    /// assert!(limiter.allow("k"));
    /// # Ok(()) }
    /// ```
    pub unsafe fn from_raw(ptr: *mut u8, len: usize) -> Region {
        let ptr = std::ptr::NonNull::new(ptr).unwrap_or(std::ptr::NonNull::dangling());
        Region { ptr, len, mapped: false }
    }

    /// The region's size in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the region has no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Map `len` bytes of `file` (opened for reading and writing, at least `len` long) shared
    /// with every other process that maps it.
    #[cfg(all(target_os = "linux", not(miri)))]
    pub(crate) fn map(file: &std::fs::File, len: usize) -> std::io::Result<Region> {
        use std::os::fd::AsRawFd;
        if len == 0 {
            return Err(std::io::Error::other("an empty region"));
        }
        // SAFETY: a new mapping chosen by the kernel (no address given), of a file descriptor
        // this process holds open for the call; it aliases no Rust value. A failure returns
        // MAP_FAILED, checked below.
        let at = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        if at == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        let ptr =
            std::ptr::NonNull::new(at.cast::<u8>()).ok_or_else(std::io::Error::last_os_error)?;
        Ok(Region { ptr, len, mapped: true })
    }

    /// Without the kernel (Miri), or off Linux: no mapping.
    #[cfg(not(all(target_os = "linux", not(miri))))]
    pub(crate) fn map(_file: &std::fs::File, _len: usize) -> std::io::Result<Region> {
        Err(std::io::Error::other("shared key tables are mapped on Linux only"))
    }

    /// The whole region as 64-bit words, or `None` if it is not 8-aligned.
    pub(crate) fn words(self: &std::sync::Arc<Self>) -> Option<Slab<std::sync::atomic::AtomicU64>> {
        Slab::in_region(self, 0, self.len / 8)
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        #[cfg(all(target_os = "linux", not(miri)))]
        if self.mapped {
            // SAFETY: `ptr` and `len` are this process's own mapping from `map`, and every slab
            // into it holds the `Arc` this region is dropped from, so no reference into it is
            // left. A failure leaves the mapping in place (a leak, not unsoundness).
            unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
        }
    }
}

/// `file`'s exclusive advisory lock (`flock`), held: released when dropped, or when the process
/// dies. (Closing the file would not release it while a mapping of the file keeps its open file
/// description alive.)
#[cfg(target_os = "linux")]
pub(crate) struct FileLock<'a>(&'a std::fs::File);

#[cfg(target_os = "linux")]
impl<'a> FileLock<'a> {
    /// Take `file`'s lock, waiting for it.
    pub(crate) fn take(file: &'a std::fs::File) -> std::io::Result<Self> {
        use std::os::fd::AsRawFd;
        loop {
            // SAFETY: `flock` on a descriptor this process holds open; it touches no memory.
            let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) };
            if rc == 0 {
                return Ok(FileLock(file));
            }
            let e = std::io::Error::last_os_error();
            if e.kind() != std::io::ErrorKind::Interrupted {
                return Err(e);
            }
        }
    }
}

#[cfg(target_os = "linux")]
impl Drop for FileLock<'_> {
    fn drop(&mut self) {
        use std::os::fd::AsRawFd;
        // SAFETY: as in `take`: a descriptor this process holds open (borrowed for the lock's
        // life); no memory is touched.
        unsafe { libc::flock(self.0.as_raw_fd(), libc::LOCK_UN) };
    }
}

/// Give `file` `len` bytes of storage now (`posix_fallocate`), so that a file system out of room
/// (a full `/dev/shm`) is an error here rather than a `SIGBUS` at a later write to its mapping.
#[cfg(target_os = "linux")]
pub(crate) fn allocate(file: &std::fs::File, len: usize) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    let len = libc::off_t::try_from(len)
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::InvalidInput, "a file too large"))?;
    loop {
        // SAFETY: `posix_fallocate` on a descriptor this process holds open; it touches no
        // memory of this process. It returns the error number rather than setting `errno`.
        let rc = unsafe { libc::posix_fallocate(file.as_raw_fd(), 0, len) };
        match rc {
            0 => return Ok(()),
            libc::EINTR => continue,
            // A file system that cannot allocate ahead: the pages come as they are written.
            libc::EOPNOTSUPP => return Ok(()),
            e => return Err(std::io::Error::from_raw_os_error(e)),
        }
    }
}

/// Whether a process `pid` exists (a zombie included: see `shared.rs`, which also reads its
/// state): `kill(pid, 0)`, which sends nothing and fails with `ESRCH` for no such process.
#[cfg(target_os = "linux")]
pub(crate) fn process_exists(pid: u32) -> bool {
    let Ok(pid) = libc::pid_t::try_from(pid) else { return false };
    if pid <= 0 {
        return false;
    }
    // SAFETY: signal 0 is no signal: `kill` only checks that the process exists and may be
    // signalled; it touches no memory of this process.
    let rc = unsafe { libc::kill(pid, 0) };
    rc == 0 || std::io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefetch_changes_nothing() {
        let words = vec![7u64; 64];
        for w in &words {
            prefetch(w);
        }
        assert!(words.iter().all(|&w| w == 7));
    }

    #[test]
    fn batches_prefetch_and_decide_on_a_small_table() {
        // The batch path through the prefetch, under Miri too: a table small enough to run
        // there, with repeated, new, moved and evicted keys.
        use crate::{KeyedLimiter, ManualClock, Policy};
        let policy: Policy = "fixed-window limit=2 window=1s".parse().unwrap();
        let build = || {
            let builder = KeyedLimiter::<u32>::builder(&policy, 16).clock(ManualClock::new(0));
            builder.seed(1).build().unwrap()
        };
        let (batched, single) = (build(), build());
        let keys: Vec<u32> = (0..40).map(|i| i * 7 % 23).collect();
        let requests: Vec<(&u32, u32)> = keys.iter().map(|k| (k, 1)).collect();
        let mut out = Vec::new();
        batched.batch(&requests, &mut out);
        let expected: Vec<_> = keys.iter().map(|k| single.check(k)).collect();
        assert_eq!(out, expected);
        assert_eq!(batched.metrics(), single.metrics());
        assert!(batched.metrics().keys == 16 && batched.metrics().evictions > 0);
    }

    #[test]
    fn slabs_view_owned_and_region_memory() {
        use std::sync::Arc;
        use std::sync::atomic::{AtomicU64, Ordering};
        let owned = Slab::from_box(vec![AtomicU64::new(1), AtomicU64::new(2)].into_boxed_slice());
        owned[1].fetch_add(1, Ordering::Relaxed);
        assert_eq!((owned.len(), owned[1].load(Ordering::Relaxed)), (2, 3));
        assert!(!owned.is_shared());

        // Caller memory: 64 words, 16 of them padding so that a 128-aligned run fits.
        let mut buffer = vec![0u64; 64].into_boxed_slice();
        // SAFETY: the buffer outlives the region (dropped last), and is only accessed through
        // the region until the region and its slabs are gone.
        let region = Arc::new(unsafe { Region::from_raw(buffer.as_mut_ptr().cast(), 64 * 8) });
        let words = region.words().unwrap();
        assert_eq!(words.len(), 64);
        words[3].store(7, Ordering::Relaxed);
        let run: Slab<AtomicU64> = Slab::in_region(&region, 8 * 60, 4).unwrap();
        run[3].store(9, Ordering::Release);
        assert!(run.is_shared());
        assert!(Slab::<AtomicU64>::in_region(&region, 8 * 61, 4).is_none(), "past the end");
        assert!(Slab::<AtomicU64>::in_region(&region, 4, 1).is_none(), "misaligned");
        assert!(Slab::<AtomicU64>::in_region(&region, usize::MAX - 7, 1).is_none(), "overflow");
        // A 128-aligned type: found at the first aligned offset only.
        let base = region.ptr.as_ptr().addr();
        let aligned = base.next_multiple_of(128) - base;
        let cells: Option<Slab<crate::keyed::counts::Counters>> =
            Slab::in_region(&region, aligned, 3);
        assert!(cells.is_some());
        assert!(
            Slab::<crate::keyed::counts::Counters>::in_region(&region, aligned + 8, 1).is_none()
        );
        drop((words, run, cells, region));
        assert_eq!((buffer[3], buffer[63]), (7, 9));
    }

    #[test]
    fn huge_pages_are_whole_and_inside() {
        const H: usize = HUGE_PAGE;
        assert_eq!(huge_pages_within(H, H - 1), (H, H)); // empty
        assert_eq!(huge_pages_within(H + 1, H), (2 * H, 2 * H)); // empty
        assert_eq!(huge_pages_within(H + 1, 3 * H), (2 * H, 4 * H));
        assert_eq!(huge_pages_within(H - 5, 3 * H), (H, 3 * H));
        let (from, to) = huge_pages_within(usize::MAX - 1, 10);
        assert!(to <= from, "none at the top of the address space");
        // A small region holds no whole huge page: no advice.
        let mut small = vec![0u64; 16];
        small.clear();
        assert!(!advise_huge_pages(small.spare_capacity_mut()));
    }
}
