//! Where the counts live: in process ([`memory`]) or on a Redis server shared by every
//! instance ([`redis`]), and the clock that opens their windows on the Unix epoch ([`clock`]).

pub mod clock;
pub mod memory;
pub mod redis;
