//! The module: `RedisModule_OnLoad`, the server's API, and `RATEWELL.BATCH` on the server's
//! keyspace. The only `unsafe` code of the crate; every block says why it holds.
//!
//! The API is the table of functions `redismodule.h` describes, looked up by name at load
//! through `RedisModule_GetApi` (the first word of the load context, as the header's own
//! `RedisModule_Init` does). Only functions Redis 7.0 has are used; a server that lacks one
//! refuses the module at load, saying which.
//!
//! Effects, not commands, are replicated: a batch's stored states go to the replicas and the AOF
//! as one `EVAL` of a fixed script that sets each as the primary has it (`SET key value PXAT t`,
//! or `DEL key`), a sliding log's list edits as they are made (`LTRIM`/`LSET`/`RPUSH`/`LREM` and
//! `PEXPIREAT`), so a replica or an AOF replay never decides on a clock of its own. A command
//! that changes nothing replicates nothing.
#![allow(unsafe_code)]

use std::cell::RefCell;
use std::ffi::{CString, c_char, c_int, c_long, c_longlong, c_void};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::time::{SystemTime, UNIX_EPOCH};

use crate::batch::{Policies, Store, WrongType, decide};

/// `RedisModuleCtx`, `RedisModuleString`, `RedisModuleKey`: opaque.
#[repr(C)]
pub(crate) struct Ctx {
    _opaque: [u8; 0],
}
#[repr(C)]
pub(crate) struct RString {
    _opaque: [u8; 0],
}
#[repr(C)]
pub(crate) struct Key {
    _opaque: [u8; 0],
}

const OK: c_int = 0;
const ERR: c_int = 1;
const APIVER_1: c_int = 1;
const READ: c_int = 1;
const WRITE: c_int = 2;
const KEYTYPE_EMPTY: c_int = 0;
const KEYTYPE_STRING: c_int = 1;
const KEYTYPE_LIST: c_int = 2;
const LIST_HEAD: c_int = 0;
const LIST_TAIL: c_int = 1;
const NO_EXPIRE: c_longlong = -1;

type CmdFunc = unsafe extern "C" fn(*mut Ctx, *mut *mut RString, c_int) -> c_int;
type GetApi = unsafe extern "C" fn(*const c_char, *mut c_void) -> c_int;

/// The functions this module calls, by their `redismodule.h` names and signatures.
macro_rules! api {
    ($($field:ident = $name:literal: $ty:ty,)*) => {
        struct Api { $($field: $ty,)* }

        impl Api {
            /// Every function, or the name of the first the server lacks.
            ///
            /// # Safety
            /// `get` is the server's `RedisModule_GetApi`.
            unsafe fn load(get: GetApi) -> Result<Api, &'static str> {
                Ok(Api { $($field: {
                    let mut f: *mut c_void = std::ptr::null_mut();
                    // SAFETY: `get` writes a function pointer (or nothing) into `f`, which is
                    // pointer-sized; the name is NUL-terminated.
                    let found = unsafe { get(concat!($name, "\0").as_ptr().cast(), (&raw mut f).cast()) };
                    if found != OK || f.is_null() {
                        return Err($name);
                    }
                    // SAFETY: the server's function of that name has the signature
                    // `redismodule.h` declares, which `$ty` transcribes.
                    unsafe { std::mem::transmute::<*mut c_void, $ty>(f) }
                },)* })
            }
        }
    };
}

api! {
    set_module_attribs = "RedisModule_SetModuleAttribs":
        unsafe extern "C" fn(*mut Ctx, *const c_char, c_int, c_int),
    is_module_name_busy = "RedisModule_IsModuleNameBusy": unsafe extern "C" fn(*const c_char) -> c_int,
    create_command = "RedisModule_CreateCommand":
        unsafe extern "C" fn(*mut Ctx, *const c_char, Option<CmdFunc>, *const c_char, c_int, c_int, c_int) -> c_int,
    string_ptr_len = "RedisModule_StringPtrLen":
        unsafe extern "C" fn(*const RString, *mut usize) -> *const c_char,
    create_string = "RedisModule_CreateString":
        unsafe extern "C" fn(*mut Ctx, *const c_char, usize) -> *mut RString,
    free_string = "RedisModule_FreeString": unsafe extern "C" fn(*mut Ctx, *mut RString),
    string_set = "RedisModule_StringSet": unsafe extern "C" fn(*mut Key, *mut RString) -> c_int,
    open_key = "RedisModule_OpenKey": unsafe extern "C" fn(*mut Ctx, *mut RString, c_int) -> *mut Key,
    close_key = "RedisModule_CloseKey": unsafe extern "C" fn(*mut Key),
    key_type = "RedisModule_KeyType": unsafe extern "C" fn(*mut Key) -> c_int,
    value_length = "RedisModule_ValueLength": unsafe extern "C" fn(*mut Key) -> usize,
    string_dma = "RedisModule_StringDMA": unsafe extern "C" fn(*mut Key, *mut usize, c_int) -> *mut c_char,
    string_truncate = "RedisModule_StringTruncate": unsafe extern "C" fn(*mut Key, usize) -> c_int,
    delete_key = "RedisModule_DeleteKey": unsafe extern "C" fn(*mut Key) -> c_int,
    get_abs_expire = "RedisModule_GetAbsExpire": unsafe extern "C" fn(*mut Key) -> c_longlong,
    set_abs_expire = "RedisModule_SetAbsExpire": unsafe extern "C" fn(*mut Key, c_longlong) -> c_int,
    list_push = "RedisModule_ListPush": unsafe extern "C" fn(*mut Key, c_int, *mut RString) -> c_int,
    list_pop = "RedisModule_ListPop": unsafe extern "C" fn(*mut Key, c_int) -> *mut RString,
    list_get = "RedisModule_ListGet": unsafe extern "C" fn(*mut Key, c_long) -> *mut RString,
    list_set = "RedisModule_ListSet": unsafe extern "C" fn(*mut Key, c_long, *mut RString) -> c_int,
    list_delete = "RedisModule_ListDelete": unsafe extern "C" fn(*mut Key, c_long) -> c_int,
    reply_with_string_buffer = "RedisModule_ReplyWithStringBuffer":
        unsafe extern "C" fn(*mut Ctx, *const c_char, usize) -> c_int,
    reply_with_error = "RedisModule_ReplyWithError": unsafe extern "C" fn(*mut Ctx, *const c_char) -> c_int,
    replicate = "RedisModule_Replicate":
        unsafe extern "C" fn(*mut Ctx, *const c_char, *const c_char, ...) -> c_int,
    log = "RedisModule_Log": unsafe extern "C" fn(*mut Ctx, *const c_char, *const c_char, ...),
}

static API: std::sync::OnceLock<Api> = std::sync::OnceLock::new();

/// What the replicas and the AOF run in place of a batch: its stored states applied. `ARGV[1]`
/// holds, per key `KEYS[i]`, a byte (the value's length, or 255: delete the key), the value, and
/// its absolute expiry (ms) as a little-endian double; each is `SET key value PXAT t` or `DEL key`.
const APPLY: &std::ffi::CStr = c"local b, p, u = ARGV[1], 1, struct.unpack \
    for i = 1, #KEYS do local n n, p = u('<B', b, p) \
    if n == 255 then redis.call('DEL', KEYS[i]) else local v = string.sub(b, p, p + n - 1) \
    local t t, p = u('<d', b, p + n) \
    redis.call('SET', KEYS[i], v, 'PXAT', string.format('%d', t)) end end";

thread_local! {
    /// The policies commands name, parsed once (commands run on the server's main thread).
    static POLICIES: RefCell<Policies> = RefCell::new(Policies::default());
}

/// The module's version as the server lists it (`MODULE LIST`): major * 10000 + minor * 100 +
/// patch.
fn version() -> c_int {
    let part = |s: &str| s.parse::<c_int>().unwrap_or(0);
    part(env!("CARGO_PKG_VERSION_MAJOR")) * 10_000
        + part(env!("CARGO_PKG_VERSION_MINOR")) * 100
        + part(env!("CARGO_PKG_VERSION_PATCH"))
}

/// Load: look up the API, name the module `ratewell`, and register `RATEWELL.BATCH`: a write
/// command refused when the server is out of memory, whose keys are every argument but the last
/// (so a cluster routes it, and refuses keys of different slots).
///
/// # Safety
/// Called by the server, once, with a load context.
#[unsafe(no_mangle)]
#[allow(unreachable_pub)] // exported to the server, not to Rust
pub unsafe extern "C" fn RedisModule_OnLoad(
    ctx: *mut Ctx,
    _argv: *mut *mut RString,
    _argc: c_int,
) -> c_int {
    // SAFETY: the context's first word is `RedisModule_GetApi` (`RedisModule_Init` in
    // `redismodule.h` reads it so), a function of this signature.
    let get = unsafe { std::mem::transmute::<*mut c_void, GetApi>(*ctx.cast::<*mut c_void>()) };
    // SAFETY: `get` is the server's `RedisModule_GetApi`.
    let api = match unsafe { Api::load(get) } {
        Ok(api) => api,
        Err(missing) => {
            // Without the API there is no log function either: the server logs the failure.
            let _ = missing;
            return ERR;
        }
    };
    let api = API.get_or_init(|| api);
    // SAFETY: the strings are NUL-terminated; `ctx` is the load context.
    unsafe {
        if (api.is_module_name_busy)(c"ratewell".as_ptr()) != 0 {
            (api.log)(
                ctx,
                c"warning".as_ptr(),
                c"%s".as_ptr(),
                c"ratewell: a module of that name is loaded already".as_ptr(),
            );
            return ERR;
        }
        (api.set_module_attribs)(ctx, c"ratewell".as_ptr(), version(), APIVER_1);
        if (api.create_command)(
            ctx,
            c"ratewell.batch".as_ptr(),
            Some(batch_command),
            c"write deny-oom".as_ptr(),
            1,
            -2,
            1,
        ) != OK
        {
            return ERR;
        }
    }
    OK
}

/// `RATEWELL.BATCH key [key ...] args`: the function library's batch, decided here.
///
/// # Safety
/// Called by the server with a command context and `argc` arguments.
unsafe extern "C" fn batch_command(ctx: *mut Ctx, argv: *mut *mut RString, argc: c_int) -> c_int {
    let Some(api) = API.get() else { return ERR };
    let argc = usize::try_from(argc).unwrap_or(0);
    if argc < 3 {
        // SAFETY: a NUL-terminated message on the command's context.
        unsafe {
            (api.reply_with_error)(
                ctx,
                c"ERR wrong number of arguments for 'ratewell.batch' command".as_ptr(),
            )
        };
        return OK;
    }
    // SAFETY: the server passes `argc` valid strings, alive for the whole call.
    let args: &[*mut RString] = unsafe { std::slice::from_raw_parts(argv, argc) };
    let bytes = |s: *mut RString| -> &[u8] {
        let mut len = 0usize;
        // SAFETY: `s` is one of the call's strings; the pointer it returns is valid for `len`
        // bytes while the string lives (the whole call) and nothing here changes it.
        unsafe {
            let p = (api.string_ptr_len)(s, &raw mut len);
            if p.is_null() { &[] } else { std::slice::from_raw_parts(p.cast::<u8>(), len) }
        }
    };
    let keys = &args[1..argc - 1];
    let names: Vec<&[u8]> = keys.iter().map(|&k| bytes(k)).collect();
    let blob = bytes(args[argc - 1]);

    let mut server = Server {
        api,
        ctx,
        keys,
        open: vec![std::ptr::null_mut(); keys.len()],
        applied: Vec::with_capacity(keys.len()),
        effects: Vec::with_capacity(keys.len() * 34),
        real_us: None,
    };
    let result = catch_unwind(AssertUnwindSafe(|| {
        let Some(frames) = crate::frames(blob) else {
            return Err("ratewell: the last argument is not the library's arguments, framed".into());
        };
        POLICIES.with(|p| decide(&mut server, &mut p.borrow_mut(), &names, &frames))
    }));
    let reply = match result {
        Ok(r) => r,
        Err(panic) => {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_default();
            Err(format!("ratewell: internal error: {what}"))
        }
    };
    // SAFETY: replies on the command's context, each string valid for its length.
    unsafe {
        match reply {
            Err(e) => {
                (api.reply_with_error)(ctx, error_text(&e).as_ptr());
            }
            Ok(fields) => {
                let blob = crate::encode_reply(&fields);
                (api.reply_with_string_buffer)(ctx, blob.as_ptr().cast(), blob.len());
            }
        }
    }
    OK
}

/// An error reply's text, without the bytes a reply cannot carry.
fn error_text(e: &str) -> CString {
    let clean: String =
        e.chars().map(|c| if c == '\0' || c == '\r' || c == '\n' { ' ' } else { c }).collect();
    CString::new(clean).unwrap_or_default()
}

/// The server's keyspace, for one command: its key arguments by index.
struct Server<'a> {
    api: &'static Api,
    ctx: *mut Ctx,
    keys: &'a [*mut RString],
    /// Each key's handle once opened (null before), for reading and writing: one lookup a key
    /// for the whole command. Closed when the command ends.
    open: Vec<*mut Key>,
    /// The keys stored or deleted, in order, to replicate...
    applied: Vec<usize>,
    /// ...and what happened to each, as `APPLY` reads it: the value's length, the value and its
    /// absolute expiry (ms, an `f64`), or 255 for a deletion.
    effects: Vec<u8>,
    /// The machine's clock, read once: for expiries (and for the decisions, unless the request
    /// names its own time).
    real_us: Option<u64>,
}

impl Drop for Server<'_> {
    fn drop(&mut self) {
        for &k in &self.open {
            if !k.is_null() {
                // SAFETY: each handle came from `OpenKey` and is closed once, here.
                unsafe { (self.api.close_key)(k) }
            }
        }
    }
}

impl Server<'_> {
    fn real_us(&mut self) -> u64 {
        *self.real_us.get_or_insert_with(|| {
            SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_micros() as u64)
        })
    }

    /// The key's handle, opened for reading and writing on first use.
    fn key(&mut self, key: usize) -> Option<*mut Key> {
        if self.open[key].is_null() {
            // SAFETY: `keys[key]` is one of the call's key arguments.
            self.open[key] = unsafe { (self.api.open_key)(self.ctx, self.keys[key], READ | WRITE) };
        }
        (!self.open[key].is_null()).then_some(self.open[key])
    }

    /// A new string of `bytes`, freed by the caller.
    fn string(&self, bytes: &[u8]) -> *mut RString {
        // SAFETY: `bytes` is valid for its length; the server copies it.
        unsafe { (self.api.create_string)(self.ctx, bytes.as_ptr().cast(), bytes.len()) }
    }

    /// Note a stored state for replication.
    fn note_stored(&mut self, key: usize, value: &[u8], at: c_longlong) {
        self.applied.push(key);
        self.effects.push(value.len() as u8);
        self.effects.extend_from_slice(value);
        self.effects.extend_from_slice(&(at as f64).to_le_bytes());
    }

    /// `now + ttl_ms`, absolute (ms since the epoch).
    fn expiry(&mut self, ttl_ms: u64) -> c_longlong {
        (self.real_us() / 1_000).saturating_add(ttl_ms) as c_longlong
    }

    /// Move the open key's expiry to `now + ttl_ms` if it expires earlier (or never), and
    /// return the absolute expiry it has then (ms since the epoch).
    fn expire_at_least(&mut self, key: *mut Key, ttl_ms: u64) -> c_longlong {
        let target = self.expiry(ttl_ms);
        // SAFETY: `key` is an open key of this command.
        unsafe {
            let current = (self.api.get_abs_expire)(key);
            if current == NO_EXPIRE || current < target {
                (self.api.set_abs_expire)(key, target);
                target
            } else {
                current
            }
        }
    }
}

/// The bytes of a string the server returned, and the string freed.
///
/// # Safety
/// `s` is a string the server handed this module to free.
unsafe fn take_string(api: &Api, ctx: *mut Ctx, s: *mut RString) -> Vec<u8> {
    let mut len = 0usize;
    // SAFETY: `s` is valid until freed; its bytes are copied first.
    unsafe {
        let p = (api.string_ptr_len)(s, &raw mut len);
        let out = if p.is_null() {
            Vec::new()
        } else {
            std::slice::from_raw_parts(p.cast::<u8>(), len).to_vec()
        };
        (api.free_string)(ctx, s);
        out
    }
}

impl Store for Server<'_> {
    fn now_us(&mut self) -> u64 {
        self.real_us()
    }

    fn get(&mut self, key: usize) -> Result<Option<Vec<u8>>, WrongType> {
        let Some(k) = self.key(key) else { return Ok(None) };
        // SAFETY: an open key; the DMA pointer is valid for `len` bytes until the key closes,
        // and the bytes are copied before it does.
        unsafe {
            match (self.api.key_type)(k) {
                KEYTYPE_EMPTY => Ok(None),
                KEYTYPE_STRING => {
                    let mut len = 0usize;
                    let p = (self.api.string_dma)(k, &raw mut len, READ);
                    Ok(Some(if p.is_null() {
                        Vec::new()
                    } else {
                        std::slice::from_raw_parts(p.cast::<u8>(), len).to_vec()
                    }))
                }
                _ => Err(WrongType),
            }
        }
    }

    fn set(&mut self, key: usize, value: &[u8], ttl_ms: u64) {
        let Some(k) = self.key(key) else { return };
        // SAFETY: an open key of type string or empty (the batch read it so). A new key takes a
        // string made here (freed once the key holds its own reference); a string of the
        // value's length is written in place; any other is truncated to that length first.
        // Exactly `value.len()` bytes are written through the DMA pointer.
        unsafe {
            let kind = (self.api.key_type)(k);
            if kind == KEYTYPE_EMPTY {
                let s = self.string(value);
                let stored = (self.api.string_set)(k, s);
                (self.api.free_string)(self.ctx, s);
                if stored != OK {
                    return;
                }
                // A new key has no expiry to compare with.
                let at = self.expiry(ttl_ms);
                (self.api.set_abs_expire)(k, at);
                self.note_stored(key, value, at);
                return;
            } else {
                if kind != KEYTYPE_STRING {
                    return;
                }
                let mut len = 0usize;
                let same =
                    !(self.api.string_dma)(k, &raw mut len, READ).is_null() && len == value.len();
                if !same && (self.api.string_truncate)(k, value.len()) != OK {
                    return;
                }
                let p = (self.api.string_dma)(k, &raw mut len, READ | WRITE);
                if p.is_null() || len != value.len() {
                    return;
                }
                std::ptr::copy_nonoverlapping(value.as_ptr(), p.cast::<u8>(), len);
            }
        }
        let at = self.expire_at_least(k, ttl_ms);
        self.note_stored(key, value, at);
    }

    fn delete(&mut self, key: usize) {
        let Some(k) = self.key(key) else { return };
        // SAFETY: an open key.
        unsafe {
            if (self.api.key_type)(k) == KEYTYPE_EMPTY {
                return;
            }
            (self.api.delete_key)(k);
        }
        self.applied.push(key);
        self.effects.push(255);
    }

    fn finish(&mut self) {
        if self.applied.is_empty() {
            return;
        }
        // One replicated command for every state the batch stored: `EVAL` of a script that
        // applies them (`APPLY`), deterministic and needing no module, where a `SET` per key
        // would cost a command lookup, an operation and its arguments each.
        let keys: Vec<*mut RString> = self.applied.iter().map(|&k| self.keys[k]).collect();
        let blob = self.string(&self.effects);
        // SAFETY: the format takes a C string, a long long, an array of strings with its length
        // (the call's own key arguments) and a string, freed after the server took its reference.
        unsafe {
            (self.api.replicate)(
                self.ctx,
                c"EVAL".as_ptr(),
                c"clvs".as_ptr(),
                APPLY.as_ptr(),
                keys.len() as c_longlong,
                keys.as_ptr(),
                keys.len(),
                blob,
            );
            (self.api.free_string)(self.ctx, blob);
        }
        self.applied.clear();
        self.effects.clear();
    }

    fn list(&mut self, key: usize) -> Result<Vec<Vec<u8>>, WrongType> {
        let Some(k) = self.key(key) else { return Ok(Vec::new()) };
        // SAFETY: an open key; each element the server returns is copied and freed.
        unsafe {
            match (self.api.key_type)(k) {
                KEYTYPE_EMPTY => Ok(Vec::new()),
                KEYTYPE_LIST => {
                    let len = (self.api.value_length)(k);
                    let mut out = Vec::with_capacity(len);
                    for i in 0..len {
                        let s = (self.api.list_get)(k, i as c_long);
                        if s.is_null() {
                            break;
                        }
                        out.push(take_string(self.api, self.ctx, s));
                    }
                    Ok(out)
                }
                _ => Err(WrongType),
            }
        }
    }

    fn list_trim_front(&mut self, key: usize, n: usize) {
        let Some(k) = self.key(key) else { return };
        // SAFETY: an open list; each popped element is freed; the format takes a string and
        // two long longs.
        unsafe {
            for _ in 0..n {
                let s = (self.api.list_pop)(k, LIST_HEAD);
                if s.is_null() {
                    break;
                }
                (self.api.free_string)(self.ctx, s);
            }
            (self.api.replicate)(
                self.ctx,
                c"LTRIM".as_ptr(),
                c"sll".as_ptr(),
                self.keys[key],
                n as c_longlong,
                -1 as c_longlong,
            );
        }
    }

    fn list_set(&mut self, key: usize, index: usize, value: &[u8]) {
        let Some(k) = self.key(key) else { return };
        let s = self.string(value);
        // SAFETY: an open list and a string this function made, freed after the server copied
        // it; the format takes a string, a long long and a buffer with its length.
        unsafe {
            (self.api.list_set)(k, index as c_long, s);
            (self.api.free_string)(self.ctx, s);
            (self.api.replicate)(
                self.ctx,
                c"LSET".as_ptr(),
                c"slb".as_ptr(),
                self.keys[key],
                index as c_longlong,
                value.as_ptr().cast::<c_char>(),
                value.len(),
            );
        }
    }

    fn list_push(&mut self, key: usize, value: &[u8]) {
        let Some(k) = self.key(key) else { return };
        let s = self.string(value);
        // SAFETY: as in `list_set`; the format takes a string and a buffer with its length.
        unsafe {
            (self.api.list_push)(k, LIST_TAIL, s);
            (self.api.free_string)(self.ctx, s);
            (self.api.replicate)(
                self.ctx,
                c"RPUSH".as_ptr(),
                c"sb".as_ptr(),
                self.keys[key],
                value.as_ptr().cast::<c_char>(),
                value.len(),
            );
        }
    }

    fn list_remove(&mut self, key: usize, index: usize) {
        let Some(k) = self.key(key) else { return };
        // SAFETY: an open list; the formats take a string, a long long and a buffer, then a
        // string, a long long and a buffer (`LSET` to a marker, `LREM` of it: the element at
        // `index`, removed on the replicas as the script removes it).
        unsafe {
            (self.api.list_delete)(k, index as c_long);
            (self.api.replicate)(
                self.ctx,
                c"LSET".as_ptr(),
                c"slb".as_ptr(),
                self.keys[key],
                index as c_longlong,
                c"".as_ptr(),
                0usize,
            );
            (self.api.replicate)(
                self.ctx,
                c"LREM".as_ptr(),
                c"slb".as_ptr(),
                self.keys[key],
                1 as c_longlong,
                c"".as_ptr(),
                0usize,
            );
        }
    }

    fn expire(&mut self, key: usize, ttl_ms: u64) {
        let Some(k) = self.key(key) else { return };
        // SAFETY: an open key.
        if unsafe { (self.api.key_type)(k) } == KEYTYPE_EMPTY {
            return;
        }
        let at = self.expire_at_least(k, ttl_ms);
        // SAFETY: the format takes a string and a long long.
        unsafe {
            (self.api.replicate)(
                self.ctx,
                c"PEXPIREAT".as_ptr(),
                c"sl".as_ptr(),
                self.keys[key],
                at,
            );
        }
    }
}
