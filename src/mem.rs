//! The crate's two calls below safe Rust, both hints about memory that change no value: a
//! software prefetch of a key's bucket (batched decisions) and, on Linux, asking for transparent
//! huge pages under the key table. Each `unsafe` block states why it is sound; `cargo +nightly
//! miri test --lib` runs the table's and the batches' unit tests through the prefetch (Miri
//! cannot call the kernel or run inline assembly: under it the huge-page advice and the aarch64
//! prefetch are skipped).
#![allow(unsafe_code)]

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
