//! The C ABI the module's C half calls (`include/ratewell_nginx.h`, generated from this file by
//! cbindgen; `tests/header.rs` checks that it is current). The crate's only `unsafe` code.
//!
//! Every function catches a panic, so none crosses into nginx: it answers as for an error
//! (null, 0 or -1). Strings are pointers and lengths, not NUL-terminated; error messages are
//! written NUL-terminated into the caller's buffer, cut to fit.

#![allow(unsafe_code)]

use std::cell::RefCell;
use std::ffi::c_void;
use std::panic::{AssertUnwindSafe, catch_unwind};

use std::path::Path;

use ratewell::{OnFull, Policy, Region, SnapshotError};

use crate::{Ask, Burst, Zone, capacity_for, decide, decide_bare, policy_burst, rate_zone_policy};

/// A worker's handle on a zone's table (opaque to C).
pub struct RatewellZone(Zone);

/// One zone of a request's location, and the request's key in it.
#[repr(C)]
pub struct RatewellAsk {
    /// The zone, from [`ratewell_zone_open`].
    pub zone: *const RatewellZone,
    /// The key's bytes (any bytes; `key_len` of them).
    pub key: *const u8,
    /// The key's length.
    pub key_len: usize,
    /// The location's burst on a leaky-bucket zone; negative: the zone's own burst and delay.
    pub burst: i64,
    /// The location's delay (requests of the excess not delayed); negative: `nodelay`.
    pub delay: i64,
}

/// A location's burst and delay from their C encoding (negative: none, `nodelay`).
fn burst_of(burst: i64, delay: i64) -> Option<Burst> {
    let burst = u32::try_from(burst).ok()?;
    Some(Burst { burst, delay: u32::try_from(delay).ok() })
}

/// What [`ratewell_decide`] decided.
#[repr(C)]
pub struct RatewellVerdict {
    /// 1: every zone admitted the request, and each is charged; 0: none is.
    pub admitted: u8,
    /// 1: rejected by a zone that can never admit the cost (no `Retry-After`).
    pub impossible: u8,
    /// 1: rejected by a full zone that refuses new keys (`on_full=refuse`).
    pub table_full: u8,
    /// The index of the ask that rejected it (when rejected).
    pub rejected_by: usize,
    /// When rejected, the wait in nanoseconds before the request could pass that zone;
    /// [`RATEWELL_NO_RETRY`] when impossible.
    pub retry_after_ns: u64,
    /// When admitted, the longest delay a zone asks for, in nanoseconds.
    pub delay_ns: u64,
    /// The index of the ask whose zone asks for that delay (when `delay_ns` is not 0).
    pub delayed_by: usize,
    /// When admitted, the least any zone has left; when rejected, what the rejecting zone has
    /// left.
    pub remaining: u64,
    /// The length of the `RateLimit` field, written into the caller's buffer when it fits
    /// (when it does not, nothing is written).
    pub fields_len: usize,
}

/// [`RatewellVerdict::retry_after_ns`] of a request no wait lets through.
pub const RATEWELL_NO_RETRY: u64 = u64::MAX;

/// `len` bytes at `ptr` (none when `len` is 0, whatever `ptr` is).
///
/// # Safety
///
/// `ptr` points to `len` readable bytes that stay unchanged while the slice is used.
unsafe fn bytes<'a>(ptr: *const u8, len: usize) -> &'a [u8] {
    if len == 0 || ptr.is_null() {
        return &[];
    }
    // SAFETY: as the caller promises.
    unsafe { std::slice::from_raw_parts(ptr, len) }
}

/// Copy `text` into the `cap` bytes at `out`, NUL-terminated, cut at a character boundary to
/// fit.
///
/// # Safety
///
/// `out` is null, or points to `cap` writable bytes.
unsafe fn write_message(out: *mut u8, cap: usize, text: &str) {
    if out.is_null() || cap == 0 {
        return;
    }
    let mut n = text.len().min(cap - 1);
    while !text.is_char_boundary(n) {
        n -= 1;
    }
    // SAFETY: `n + 1 <= cap` bytes at `out` are writable, and `text` is not among them (it
    // is Rust's own string).
    unsafe {
        std::ptr::copy_nonoverlapping(text.as_ptr(), out, n);
        *out.add(n) = 0;
    }
}

/// A policy from its text, or the engine's message.
fn policy(spec: &[u8]) -> Result<Policy, String> {
    let text = std::str::from_utf8(spec).map_err(|_| "the policy is not UTF-8".to_string())?;
    text.parse().map_err(|e: ratewell::PolicyError| e.to_string())
}

/// Whether `spec` is a policy of the engine's grammar: 0, or -1 with the reason in `err`.
///
/// # Safety
///
/// `spec` points to `spec_len` readable bytes; `err` is null or points to `err_cap` writable
/// bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ratewell_policy_check(
    spec: *const u8,
    spec_len: usize,
    err: *mut u8,
    err_cap: usize,
) -> i32 {
    // SAFETY: as the caller promises.
    let spec = unsafe { bytes(spec, spec_len) };
    let result = catch_unwind(|| policy(spec).map(drop));
    let message = match result {
        Ok(Ok(())) => return 0,
        Ok(Err(message)) => message,
        Err(_) => "a panic in ratewell".to_string(),
    };
    // SAFETY: as the caller promises.
    unsafe { write_message(err, err_cap, &message) };
    -1
}

/// The policy of a zone declared in `limit_req`'s grammar (`rate` is `10r/s` or `30r/m`; see
/// [`rate_zone_policy`]): its text written into `out` when it fits in `cap` bytes, and its length;
/// or -1 with the reason in `err`.
///
/// # Safety
///
/// `rate` points to `rate_len` readable bytes; `out` and `err` are null or point to `cap` and
/// `err_cap` writable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ratewell_rate_policy(
    rate: *const u8,
    rate_len: usize,
    out: *mut u8,
    cap: usize,
    err: *mut u8,
    err_cap: usize,
) -> isize {
    // SAFETY: as the caller promises.
    let rate = unsafe { bytes(rate, rate_len) };
    let made = catch_unwind(|| {
        let rate = std::str::from_utf8(rate).map_err(|_| "the rate is not UTF-8".to_string())?;
        rate_zone_policy(rate).map(|p| p.to_string())
    });
    let message = match made {
        Ok(Ok(text)) => {
            if !out.is_null() && text.len() <= cap {
                // SAFETY: `cap` writable bytes at `out`, none of them the text's.
                unsafe { std::ptr::copy_nonoverlapping(text.as_ptr(), out, text.len()) };
            }
            return isize::try_from(text.len()).unwrap_or(-1);
        }
        Ok(Err(message)) => message,
        Err(_) => "a panic in ratewell".to_string(),
    };
    // SAFETY: as the caller promises.
    unsafe { write_message(err, err_cap, &message) };
    -1
}

/// The burst of the leaky-bucket policy `spec`; -1 for another algorithm or an invalid policy.
///
/// # Safety
///
/// `spec` points to `spec_len` readable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ratewell_policy_burst(spec: *const u8, spec_len: usize) -> i64 {
    // SAFETY: as the caller promises.
    let spec = unsafe { bytes(spec, spec_len) };
    let burst = catch_unwind(|| policy(spec).ok().as_ref().and_then(policy_burst));
    burst.ok().flatten().map_or(-1, i64::from)
}

/// The most keys a table under `spec` holds in `bytes` (0: not one), and in `region_len` the
/// bytes that table needs (at most `bytes`).
///
/// # Safety
///
/// `spec` points to `spec_len` readable bytes; `region_len` is null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ratewell_capacity(
    spec: *const u8,
    spec_len: usize,
    bytes_given: usize,
    region_len: *mut usize,
) -> usize {
    // SAFETY: as the caller promises.
    let spec = unsafe { bytes(spec, spec_len) };
    let found = catch_unwind(|| policy(spec).ok().and_then(|p| capacity_for(&p, bytes_given)));
    let (keys, len) = found.ok().flatten().unwrap_or((0, 0));
    if !region_len.is_null() {
        // SAFETY: writable, as the caller promises.
        unsafe { *region_len = len };
    }
    keys
}

/// This process's handle on the table of `capacity` keys under `spec` in the `len` bytes at
/// `addr` (initialised by the first process to open it), or null with the reason in `err`.
/// `refuse`: 1, a full table refuses new keys; 0, it evicts the least granting key. `name`
/// names the zone in the `RateLimit` fields.
///
/// # Safety
///
/// `addr` is memory every process that opens the zone maps, aligned to a page, zeroed when
/// no table has used it, that stays mapped (readable and writable) while any handle on it is
/// open, and that nothing but handles of this library accesses. `spec` and `name` point to
/// their lengths' readable bytes; `err` is null or points to `err_cap` writable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ratewell_zone_open(
    addr: *mut c_void,
    len: usize,
    spec: *const u8,
    spec_len: usize,
    capacity: usize,
    refuse: i32,
    name: *const u8,
    name_len: usize,
    err: *mut u8,
    err_cap: usize,
) -> *mut RatewellZone {
    // SAFETY: as the caller promises.
    let (spec, name) = unsafe { (bytes(spec, spec_len), bytes(name, name_len)) };
    let open = || {
        let policy = policy(spec)?;
        let name = std::str::from_utf8(name).map_err(|_| "the zone's name is not UTF-8")?;
        let on_full = if refuse != 0 { OnFull::Refuse } else { OnFull::EvictLeastGranting };
        // SAFETY: the memory is shared, mapped and left to this library while the handle
        // lives, as the caller promises.
        let region = unsafe { Region::from_raw(addr.cast(), len) };
        let zone = Zone::open(region, &policy, capacity, on_full, name);
        zone.map_err(|e| e.to_string())
    };
    let message = match catch_unwind(AssertUnwindSafe(open)) {
        Ok(Ok(zone)) => return Box::into_raw(Box::new(RatewellZone(zone))),
        Ok(Err(message)) => message,
        Err(_) => "a panic in ratewell".to_string(),
    };
    // SAFETY: as the caller promises.
    unsafe { write_message(err, err_cap, &message) };
    std::ptr::null_mut()
}

/// Close a handle from [`ratewell_zone_open`] (null: nothing). The table stays in the zone.
///
/// # Safety
///
/// `zone` is null or a handle from [`ratewell_zone_open`] not closed yet, that no call is
/// using; it is not used after.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ratewell_zone_close(zone: *mut RatewellZone) {
    if !zone.is_null() {
        // SAFETY: a box of `ratewell_zone_open`'s, given back once, as the caller promises.
        let zone = unsafe { Box::from_raw(zone) };
        let _ = catch_unwind(AssertUnwindSafe(move || drop(zone)));
    }
}

/// The zone's `RateLimit-Policy` field as a location's `burst` and `delay` narrow it (negative:
/// the zone's own; see [`RatewellAsk`]), written into `out` when it fits in `cap` bytes; its
/// length either way (0 for a null handle).
///
/// # Safety
///
/// `zone` is null or an open handle; `out` is null or points to `cap` writable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ratewell_zone_policy_field(
    zone: *const RatewellZone,
    burst: i64,
    delay: i64,
    out: *mut u8,
    cap: usize,
) -> usize {
    // SAFETY: an open handle, as the caller promises.
    let Some(zone) = (unsafe { zone.as_ref() }) else { return 0 };
    let Ok(field) =
        catch_unwind(AssertUnwindSafe(|| zone.0.policy_field_for(burst_of(burst, delay))))
    else {
        return 0;
    };
    if !out.is_null() && field.len() <= cap {
        // SAFETY: `cap` writable bytes at `out`, none of them the field's.
        unsafe { std::ptr::copy_nonoverlapping(field.as_ptr(), out, field.len()) };
    }
    field.len()
}

/// A zone's occupancy and the engine's counters, for `ratewell_metrics`.
#[repr(C)]
pub struct RatewellStats {
    /// Keys holding state now.
    pub keys: u64,
    /// Keys the zone can hold.
    pub capacity: u64,
    /// Keys dropped because their state was a fresh key's (nothing lost).
    pub reclaims: u64,
    /// Limited keys evicted to make room (`on_full=evict`).
    pub evictions: u64,
    /// New keys refused because the zone was full (`on_full=refuse`).
    pub refused: u64,
}

/// The zone's [`RatewellStats`] into `out`: 0, or -1 for a null handle.
///
/// # Safety
///
/// `zone` is null or an open handle; `out` is writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ratewell_zone_stats(
    zone: *const RatewellZone,
    out: *mut RatewellStats,
) -> i32 {
    // SAFETY: an open handle, as the caller promises.
    let Some(zone) = (unsafe { zone.as_ref() }) else { return -1 };
    if out.is_null() {
        return -1;
    }
    let Ok(m) = catch_unwind(AssertUnwindSafe(|| zone.0.metrics())) else { return -1 };
    let stats = RatewellStats {
        keys: m.keys,
        capacity: m.capacity,
        reclaims: m.reclaims,
        evictions: m.evictions,
        refused: m.refused,
    };
    // SAFETY: writable, as the caller promises.
    unsafe { out.write(stats) };
    0
}

/// A path from C's bytes, or the reason it is none.
fn path_of(path: &[u8]) -> Result<&Path, String> {
    std::str::from_utf8(path).map(Path::new).map_err(|_| "the path is not UTF-8".to_string())
}

/// Save every key's state of the zone to the file `path` (written beside it, then renamed):
/// the keys saved, or -1 with the reason in `err`.
///
/// # Safety
///
/// `zone` is an open handle; `path` points to `path_len` readable bytes; `err` is null or
/// points to `err_cap` writable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ratewell_zone_save(
    zone: *const RatewellZone,
    path: *const u8,
    path_len: usize,
    err: *mut u8,
    err_cap: usize,
) -> i64 {
    // SAFETY: as the caller promises.
    let (zone, path) = unsafe { (zone.as_ref(), bytes(path, path_len)) };
    let saved = catch_unwind(AssertUnwindSafe(|| {
        let zone = zone.ok_or("no zone")?;
        let path = path_of(path)?;
        zone.0.save(path).map_err(|e| format!("{}: {e}", path.display()))
    }));
    let message = match saved {
        Ok(Ok(info)) => return i64::try_from(info.keys).unwrap_or(i64::MAX),
        Ok(Err(message)) => message,
        Err(_) => "a panic in ratewell".to_string(),
    };
    // SAFETY: as the caller promises.
    unsafe { write_message(err, err_cap, &message) };
    -1
}

/// Restore the zone from the file `path` (see [`Zone::restore`]) while no other process has it
/// open: the keys restored; -2 when there is no such file (nothing changes); or -1 with the
/// reason in `err` (the zone is as it was).
///
/// # Safety
///
/// `zone` is an open handle no call is using; `path` points to `path_len` readable bytes; `err`
/// is null or points to `err_cap` writable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ratewell_zone_restore(
    zone: *mut RatewellZone,
    path: *const u8,
    path_len: usize,
    err: *mut u8,
    err_cap: usize,
) -> i64 {
    // SAFETY: as the caller promises.
    let (zone, path) = unsafe { (zone.as_mut(), bytes(path, path_len)) };
    let restored = catch_unwind(AssertUnwindSafe(|| {
        let zone = zone.ok_or_else(|| "no zone".to_string())?;
        let path = path_of(path)?;
        match zone.0.restore(path) {
            Ok(restored) => Ok(Some(restored.keys)),
            Err(SnapshotError::Io(e)) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(format!("{}: {e}", path.display())),
        }
    }));
    let message = match restored {
        Ok(Ok(Some(keys))) => return i64::try_from(keys).unwrap_or(i64::MAX),
        Ok(Ok(None)) => return -2,
        Ok(Err(message)) => message,
        Err(_) => "a panic in ratewell".to_string(),
    };
    // SAFETY: as the caller promises.
    unsafe { write_message(err, err_cap, &message) };
    -1
}

thread_local! {
    /// The `RateLimit` field being written: kept, so that a decision allocates nothing for it.
    static FIELDS: RefCell<String> = const { RefCell::new(String::new()) };
}

/// Decide a request of `cost` (0 counts as 1) against the `n` asks, in order, all or nothing
/// (see [`decide`]); the verdict in `out`, the `RateLimit` field in `fields` when it fits in
/// `fields_cap` bytes (a null `fields` or a `fields_cap` of 0 writes none, and then
/// `fields_len` is 0). 0, or -1 when an ask names no zone (nothing is charged then).
///
/// # Safety
///
/// `asks` points to `n` readable asks, each with an open handle and `key_len` readable bytes
/// at `key`; `fields` is null or points to `fields_cap` writable bytes; `out` is writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ratewell_decide(
    asks: *const RatewellAsk,
    n: usize,
    cost: u32,
    fields: *mut u8,
    fields_cap: usize,
    out: *mut RatewellVerdict,
) -> i32 {
    if out.is_null() || (asks.is_null() && n > 0) {
        return -1;
    }
    // SAFETY: `n` readable asks, as the caller promises.
    let raw = if n == 0 { &[][..] } else { unsafe { std::slice::from_raw_parts(asks, n) } };
    let ask = |raw: &RatewellAsk| {
        // SAFETY: an open handle and its key's bytes, as the caller promises.
        let zone = unsafe { raw.zone.as_ref() }?;
        // SAFETY: as above.
        let key = unsafe { bytes(raw.key, raw.key_len) };
        Some(Ask { zone: &zone.0, key, burst: burst_of(raw.burst, raw.delay) })
    };
    // A location names a few zones: up to eight on the stack, more on the heap.
    let Some(first) = raw.first().map(ask) else { return decide_none(out) };
    let Some(first) = first else { return -1 };
    let mut inline: [Ask<'_>; 8];
    let mut heap = Vec::new();
    let list: &[Ask<'_>] = if n == 1 {
        std::slice::from_ref(&first)
    } else if n <= 8 {
        inline = [first; 8];
        for (slot, raw) in inline.iter_mut().zip(raw) {
            let Some(a) = ask(raw) else { return -1 };
            *slot = a;
        }
        &inline[..n]
    } else {
        for raw in raw {
            let Some(a) = ask(raw) else { return -1 };
            heap.push(a);
        }
        &heap
    };
    let verdict = catch_unwind(AssertUnwindSafe(|| {
        if fields.is_null() || fields_cap == 0 {
            return (decide_bare(list, cost.max(1)), 0);
        }
        FIELDS.with(|kept| {
            let mut text = kept.borrow_mut();
            let verdict = decide(list, cost.max(1), &mut text);
            let len = text.len();
            if !fields.is_null() && len <= fields_cap {
                // SAFETY: `fields_cap` writable bytes at `fields`, none of them the text's.
                unsafe { std::ptr::copy_nonoverlapping(text.as_ptr(), fields, len) };
            }
            (verdict, len)
        })
    }));
    let Ok((verdict, fields_len)) = verdict else { return -1 };
    let written = RatewellVerdict {
        admitted: u8::from(verdict.admitted),
        impossible: u8::from(verdict.impossible),
        table_full: u8::from(verdict.table_full),
        rejected_by: verdict.rejected_by.unwrap_or(0),
        retry_after_ns: verdict.retry_after_ns.unwrap_or(RATEWELL_NO_RETRY),
        delay_ns: verdict.delay_ns,
        delayed_by: verdict.delayed_by.unwrap_or(0),
        remaining: verdict.remaining,
        fields_len,
    };
    // SAFETY: writable, as the caller promises.
    unsafe { out.write(written) };
    0
}

/// Decide a request of `cost` (0 counts as 1) against one ask, writing no `RateLimit` field:
/// what [`ratewell_decide`] decides of one ask with a null `fields`, by a shorter path (a
/// location of one zone without headers, the most common). 0, or -1 when the ask names no zone.
///
/// # Safety
///
/// `ask` points to a readable ask with an open handle and `key_len` readable bytes at `key`;
/// `out` is writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ratewell_decide_one(
    ask: *const RatewellAsk,
    cost: u32,
    out: *mut RatewellVerdict,
) -> i32 {
    // SAFETY: null, or a readable ask, as the caller promises.
    let Some(raw) = (unsafe { ask.as_ref() }) else { return -1 };
    // SAFETY: null, or an open handle, as the caller promises.
    let Some(zone) = (unsafe { raw.zone.as_ref() }) else { return -1 };
    if out.is_null() {
        return -1;
    }
    // SAFETY: the key's bytes, as the caller promises.
    let key = unsafe { bytes(raw.key, raw.key_len) };
    let ask = Ask { zone: &zone.0, key, burst: burst_of(raw.burst, raw.delay) };
    let Ok(d) = catch_unwind(AssertUnwindSafe(|| ask.request(cost.max(1)).check())) else {
        return -1;
    };
    let admitted = d.is_admitted();
    let written = RatewellVerdict {
        admitted: u8::from(admitted),
        impossible: u8::from(!admitted && d.is_impossible()),
        table_full: u8::from(!admitted && d.is_table_full()),
        rejected_by: 0,
        retry_after_ns: if admitted {
            RATEWELL_NO_RETRY
        } else {
            d.retry_after_ns().unwrap_or(RATEWELL_NO_RETRY)
        },
        delay_ns: if admitted { d.delay_ns() } else { 0 },
        delayed_by: 0,
        remaining: d.remaining(),
        fields_len: 0,
    };
    // SAFETY: writable, as the caller promises (checked not null).
    unsafe { out.write(written) };
    0
}

/// The verdict on a request no zone decides: admitted, nothing charged.
fn decide_none(out: *mut RatewellVerdict) -> i32 {
    let written = RatewellVerdict {
        admitted: 1,
        impossible: 0,
        table_full: 0,
        rejected_by: 0,
        retry_after_ns: RATEWELL_NO_RETRY,
        delay_ns: 0,
        delayed_by: 0,
        remaining: 0,
        fields_len: 0,
    };
    // SAFETY: `out` is writable, as `ratewell_decide`'s caller promises (checked not null).
    unsafe { out.write(written) };
    0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[repr(align(4096))]
    struct Page(#[allow(dead_code)] [u8; 4096]);

    fn open(memory: &mut [Page], spec: &str) -> *mut RatewellZone {
        let mut err = [0u8; 256];
        let policy: ratewell::Policy = spec.parse().unwrap();
        let (capacity, _) = capacity_for(&policy, memory.len() * 4096).unwrap();
        // SAFETY: the memory outlives the zone (closed at the end of each test), and the
        // strings are readable.
        let zone = unsafe {
            ratewell_zone_open(
                memory.as_mut_ptr().cast(),
                memory.len() * 4096,
                spec.as_ptr(),
                spec.len(),
                capacity,
                0,
                b"z".as_ptr(),
                1,
                err.as_mut_ptr(),
                err.len(),
            )
        };
        assert!(!zone.is_null(), "{}", String::from_utf8_lossy(&err));
        zone
    }

    fn verdict() -> RatewellVerdict {
        RatewellVerdict {
            admitted: 9,
            impossible: 9,
            table_full: 9,
            rejected_by: 9,
            retry_after_ns: 9,
            delay_ns: 9,
            delayed_by: 9,
            remaining: 9,
            fields_len: 9,
        }
    }

    fn fields(v: &RatewellVerdict) -> (u8, u8, u8, usize, bool, usize, u64, usize) {
        let retry = v.retry_after_ns != RATEWELL_NO_RETRY;
        (
            v.admitted,
            v.impossible,
            v.table_full,
            v.rejected_by,
            retry,
            v.delayed_by,
            v.remaining,
            v.fields_len,
        )
    }

    #[test]
    fn one_ask_decides_as_the_general_call_of_one() {
        // Two zones alike, one decided by each entry, on the same requests: every verdict the
        // same (a delay or a wait may differ by the time between the two calls).
        for spec in [
            "token-bucket capacity=3 rate=1/h",
            "leaky-bucket rate=1r/m burst=2 delay=1",
            "fixed-window limit=4 window=1h",
        ] {
            let (mut a, mut b) = (
                (0..64).map(|_| Page([0; 4096])).collect::<Vec<_>>(),
                (0..64).map(|_| Page([0; 4096])).collect::<Vec<_>>(),
            );
            let (one, general) = (open(&mut a, spec), open(&mut b, spec));
            let mut seed = 5u64;
            let mut seen = [false; 2];
            for _ in 0..300 {
                seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                let key = [b'a' + (seed >> 60) as u8 % 4];
                let cost = (seed >> 40) as u32 % 5;
                let burst = if seed >> 20 & 1 == 0 { -1 } else { 1 };
                let ask =
                    |zone| RatewellAsk { zone, key: key.as_ptr(), key_len: 1, burst, delay: -1 };
                let (mut x, mut y) = (verdict(), verdict());
                // SAFETY: open zones, a readable key, writable verdicts; a null field buffer.
                let (rx, ry) = unsafe {
                    (
                        ratewell_decide_one(&ask(one), cost, &mut x),
                        ratewell_decide(&ask(general), 1, cost, std::ptr::null_mut(), 0, &mut y),
                    )
                };
                assert_eq!((rx, ry), (0, 0));
                assert_eq!(fields(&x), fields(&y), "{spec}");
                assert!(x.delay_ns.abs_diff(y.delay_ns) < 1_000_000_000, "{spec}");
                seen[usize::from(x.admitted)] = true;
            }
            assert_eq!(seen, [true, true], "{spec}: both verdicts occur");
            // SAFETY: handles no call is using, closed once.
            unsafe {
                ratewell_zone_close(one);
                ratewell_zone_close(general);
            }
        }
        // No ask, or an ask without a zone: -1, and nothing written.
        let mut v = verdict();
        let no_zone = RatewellAsk {
            zone: std::ptr::null(),
            key: std::ptr::null(),
            key_len: 0,
            burst: -1,
            delay: -1,
        };
        // SAFETY: null pointers are what is checked.
        unsafe {
            assert_eq!(ratewell_decide_one(std::ptr::null(), 1, &mut v), -1);
            assert_eq!(ratewell_decide_one(&no_zone, 1, &mut v), -1);
        }
        assert_eq!(v.admitted, 9);
    }
}
