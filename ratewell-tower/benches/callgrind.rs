//! One variant of `overhead.rs`, `N` requests, for callgrind to count: `callgrind.sh` runs it
//! under valgrind at `N` and `2N` requests and subtracts, so that what one request costs is left
//! (the services' set-up, the first request of each client and the exit cancel out).
//!
//! Usage: `callgrind VARIANT N` (the variants of `variants::NAMES`).

mod variants;

use std::convert::Infallible;
use std::hint::black_box;

use axum::body::Body;
use http::{Request, Response};
use tower::Service;

struct Drive(u32);

impl variants::Visit for Drive {
    fn visit<S, B>(&mut self, _: &str, service: S)
    where
        S: Service<Request<Body>, Response = Response<B>, Error = Infallible> + Clone,
    {
        // Every client's first request (its key's insertion) before the counted ones.
        for i in 0..variants::CLIENTS {
            black_box(variants::one(&service, i));
        }
        for i in 0..self.0 {
            black_box(variants::one(&service, i));
        }
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).filter(|a| a != "--bench").collect();
    let (Some(name), Some(n)) = (args.first(), args.get(1).and_then(|n| n.parse().ok())) else {
        eprintln!("usage: callgrind VARIANT N, with VARIANT one of {:?}", variants::NAMES);
        std::process::exit(2);
    };
    if !variants::NAMES.contains(&name.as_str()) {
        eprintln!("callgrind: no variant {name:?}; the variants: {:?}", variants::NAMES);
        std::process::exit(2);
    }
    variants::each(Some(name), &mut Drive(n));
}
