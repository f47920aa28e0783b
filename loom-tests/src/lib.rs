//! Nothing here: the models are in `tests/`, and compile only with `--cfg ratewell_loom`:
//!
//! ```sh
//! RUSTFLAGS="--cfg ratewell_loom" LOOM_MAX_PREEMPTIONS=2 \
//!     cargo test --release -p ratewell-loom-tests
//! ```
