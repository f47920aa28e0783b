//! ratewell's decisions as one native Redis command: `RATEWELL.BATCH`, loaded into
//! `redis-server` (7.0 or later) or `valkey-server` as a module, deciding with the engine's own
//! code on the same keys, in the same bytes, as ratewell-redis's function library.
//!
//! The command takes the function library's requests (see ratewell-redis's `decide.lua`): its
//! keys, then one argument, the library's arguments framed (each as a 4-byte little-endian
//! length and its bytes), the policies in the engine's grammar. It answers the library's fields,
//! in one string ([`encode_reply`]). ratewell-redis finds the command at connect (`COMMAND INFO`) and sends its batches
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

/// A command's reply as the module sends it: one string, where the function library answers an
/// array (one string costs the server one reply, where an array of numbers costs one each).
/// The first 8 bytes are the array's first element (the server's time, us, little-endian); then
/// each further element: a tag byte, `0` and an `i64` (little-endian), `1` and a string, or `2`
/// and an error reply's text, a string being a `u32` length (little-endian) and its bytes.
pub fn encode_reply(fields: &[Reply]) -> Vec<u8> {
    let mut out = Vec::with_capacity(8 + fields.len() * 10);
    let now = match fields.first() {
        Some(Reply::Int(v)) => *v,
        _ => 0,
    };
    out.extend_from_slice(&now.to_le_bytes());
    for f in fields.iter().skip(1) {
        match f {
            Reply::Int(v) => {
                out.push(0);
                out.extend_from_slice(&v.to_le_bytes());
            }
            Reply::Bytes(b) => {
                out.push(1);
                out.extend_from_slice(&(b.len() as u32).to_le_bytes());
                out.extend_from_slice(b);
            }
            Reply::Error(e) => {
                out.push(2);
                out.extend_from_slice(&(e.len() as u32).to_le_bytes());
                out.extend_from_slice(e.as_bytes());
            }
        }
    }
    out
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
