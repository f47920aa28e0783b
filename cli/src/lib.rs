//! The `ratewell` command-line tool's reusable parts (the trace and access-log readers),
//! exposed for fuzzing.

pub mod logs;
pub mod trace;
