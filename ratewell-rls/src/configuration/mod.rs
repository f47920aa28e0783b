//! Where the rate limits come from: the YAML files of one domain each ([`config`]), the
//! directory they are read from and watched in ([`runtime`]), an xDS control plane
//! ([`xds`]), and `ratewell-rls check` ([`check`]).

pub mod check;
pub mod config;
pub mod runtime;
pub mod xds;
