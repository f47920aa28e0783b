//! Per-request overhead of a rate-limit layer in process: `ServiceExt::oneshot` through the layer
//! on a no-op service, next to the same without a layer and with tower_governor's layer, in one
//! run (this crate's README quotes the ratios; `variants/mod.rs` says what each variant is).

mod variants;

use std::convert::Infallible;
use std::hint::black_box;

use axum::body::Body;
use criterion::{BenchmarkGroup, Criterion, criterion_group, criterion_main};
use http::{Request, Response};
use tower::Service;

struct Time<'g, 'c>(&'g mut BenchmarkGroup<'c, criterion::measurement::WallTime>);

impl variants::Visit for Time<'_, '_> {
    fn visit<S, B>(&mut self, name: &str, service: S)
    where
        S: Service<Request<Body>, Response = Response<B>, Error = Infallible> + Clone,
    {
        let mut i = 0u32;
        self.0.bench_function(name, |b| {
            b.iter(|| {
                i = i.wrapping_add(1);
                black_box(variants::one(&service, i));
            })
        });
    }
}

fn overhead(c: &mut Criterion) {
    let mut group = c.benchmark_group("overhead");
    variants::each(None, &mut Time(&mut group));
    group.finish();
}

criterion_group!(benches, overhead);
criterion_main!(benches);
