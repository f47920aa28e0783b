#!/usr/bin/env python3
"""Generate examples/sample.csv: a minute of traffic from a few keys, for `ratewell replay`.

- alice: steady Poisson traffic, 4 requests/s;
- bob: heavy Poisson traffic, 25 requests/s (over most limits);
- carol: quiet, then bursts of 30 requests straddling every 10 s boundary (from 2 ms before the
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
        for _ in range(30):
            yield boundary + rng.randrange(-2_000_000, 2_000_000), key, None


def main():
    rng = random.Random(20261130)
    events = []
    events += poisson(rng, "alice", 4)
    events += poisson(rng, "bob", 25)
    events += poisson(rng, "carol", 0.2)
    events += boundary_bursts(rng, "carol")
    events += poisson(rng, "dave", 1, cost=lambda: rng.randint(1, 5))
    events.sort(key=lambda e: (e[0], e[1]))
    for t, key, cost in events:
        print(f"{t},{key}" if cost is None else f"{t},{key},{cost}")


if __name__ == "__main__":
    main()
