//! ratewell's decisions as one native Redis command: `RATEWELL.BATCH`, loaded into
//! `redis-server` (7.0 or later) or `valkey-server` as a module, deciding with the engine's own
//! code on the same keys, in the same bytes, as ratewell-redis's function library.
//!
//! The command takes the function library's requests (see ratewell-redis's `decide.lua`): its
//! keys, then one argument, the library's arguments framed (each as a 4-byte little-endian
//! length and its bytes), the policies in the engine's grammar. It answers what the library
//! answers. ratewell-redis finds the command at connect (`COMMAND INFO`) and sends its batches
//! to it; where it is missing (a managed Redis that loads no modules) the library decides.
//!
//! This library holds the command's parser and decision ([`decide`], on any [`Store`]), which
//! the tests and the fuzz target drive in process; `src/ffi.rs` is the module: the server's API,
//! and the only `unsafe` code.

#![deny(unsafe_code)]

mod batch;
mod codec;
mod ffi;
mod memory;

pub use batch::{Policies, Reply, Store, WrongType, decide};
pub use memory::Memory;

/// The command's one non-key argument split into the library's arguments: each is a 4-byte
/// little-endian length, then that many bytes. `None` when the bytes do not split exactly.
pub fn frames(blob: &[u8]) -> Option<Vec<&[u8]>> {
    // Most arguments are short: a guess that spares most of the vector's growth.
    let mut out = Vec::with_capacity(blob.len() / 8);
    let mut rest = blob;
    while !rest.is_empty() {
        let (len, tail) = rest.split_first_chunk::<4>()?;
        let len = usize::try_from(u32::from_le_bytes(*len)).ok()?;
        if tail.len() < len {
            return None;
        }
        let (arg, tail) = tail.split_at(len);
        out.push(arg);
        rest = tail;
    }
    Some(out)
}

/// The library's arguments framed as [`frames`] reads them (what ratewell-redis sends).
pub fn frame<A: AsRef<[u8]>>(args: &[A]) -> Vec<u8> {
    let mut out = Vec::with_capacity(args.iter().map(|a| 4 + a.as_ref().len()).sum::<usize>());
    for a in args {
        let a = a.as_ref();
        out.extend_from_slice(&(a.len() as u32).to_le_bytes());
        out.extend_from_slice(a);
    }
    out
}
