//! The `ratewell` command-line tool's reusable parts (the trace reader), exposed for fuzzing.

pub mod trace;
