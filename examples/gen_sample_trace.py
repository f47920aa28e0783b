#!/usr/bin/env python3
"""Generate examples/sample.csv: a minute of traffic from a few keys, for `ratewell replay`.

- alice: steady Poisson traffic, 1 request/s (under the 20-per-10-s limit of the README);
- bob: the busiest key, the one `compare` charts: Poisson 1.5/s, a surge of 10/s from 16 s to 24 s
  (across the 20 s boundary, so a fixed window admits two windows' worth back to back) and a
  burst of 25 requests within half a second of 40 s;
- carol: quiet, then bursts of 24 requests straddling every 10 s boundary (from 2 ms before the
  boundary to 2 ms after), the pattern that lets a fixed window admit twice its limit;
- dave: Poisson 1/s, each request of cost 1 to 5 (batch uploads).

Deterministic (fixed seed): regenerate with `python3 examples/gen_sample_trace.py > examples/sample.csv`.
"""

import random

SECOND = 1_000_000_000
DURATION = 60 * SECOND


def poisson(rng, key, per_second, cost=lambda: None):
    t = 0
    while True:
        t += int(rng.expovariate(per_second) * SECOND)
        if t >= DURATION:
            return
        yield t, key, cost()


def boundary_bursts(rng, key):
    for k in range(1, 6):
        boundary = k * 10 * SECOND
        for _ in range(24):
            yield boundary + rng.randrange(-2_000_000, 2_000_000), key, None


def surge(rng, key, per_second, start, end):
    t = start * SECOND
    while True:
        t += int(rng.expovariate(per_second) * SECOND)
        if t >= end * SECOND:
            return
        yield t, key, None


def burst(key, count, at, spread):
    for i in range(count):
        yield int((at - spread / 2 + spread * i / count) * SECOND), key, None


def main():
    rng = random.Random(20261130)
    events = []
    events += poisson(rng, "alice", 1)
    events += poisson(rng, "bob", 1.5)
    events += surge(rng, "bob", 10, 16, 24)
    events += burst("bob", 25, 40, 1.0)
    events += poisson(rng, "carol", 0.2)
    events += boundary_bursts(rng, "carol")
    events += poisson(rng, "dave", 1, cost=lambda: rng.randint(1, 5))
    events.sort(key=lambda e: (e[0], e[1]))
    for t, key, cost in events:
        print(f"{t},{key}" if cost is None else f"{t},{key},{cost}")


if __name__ == "__main__":
    main()
