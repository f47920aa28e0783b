#!/usr/bin/env python3
"""Peak RSS and time of `ratewell replay` runs whose traces hold more keys than `--capacity`.

1. 10,000,000 distinct keys through a 1,000,000-key table (token bucket), against the same
   command on a one-line trace: the difference per slot of capacity.
2. 1,000,000 new keys in one second through a 10,000-key table (sliding log): end-to-end time
   and peak RSS.

Each trace is streamed into the binary through a pipe (nothing on disk), and each figure is the
whole process's, from start to exit (`wait4`'s `ru_maxrss`; time from spawn to exit), the eviction
note included. With `--find-capacity` as the first argument, the runs add that flag.
Usage: python3 scripts/memory.py [--find-capacity] [path/to/ratewell]
"""

import os
import subprocess
import sys
import threading
import time

ARGS = [a for a in sys.argv[1:] if a != "--find-capacity"]
EXTRA = ["--find-capacity"] if "--find-capacity" in sys.argv[1:] else []
BIN = ARGS[0] if ARGS else "target/release/ratewell"


def lines(keys: int, span_ns: int):
    """`keys` requests, each a new key, spread evenly over `span_ns`."""
    step = max(span_ns // max(keys, 1), 1)
    chunk = []
    for i in range(keys):
        chunk.append(f"{i * step},k{i:x}\n")
        if len(chunk) == 100_000:
            yield "".join(chunk).encode()
            chunk.clear()
    if chunk:
        yield "".join(chunk).encode()


def run(policy: str, capacity: int, keys: int, span_ns: int):
    """(peak RSS in KiB, seconds, stderr) of one replay."""
    start = time.monotonic()
    proc = subprocess.Popen(
        [BIN, "replay", "--policy", policy, "--capacity", str(capacity), *EXTRA],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    err = []
    reader = threading.Thread(target=lambda: err.append(proc.stderr.read()))
    reader.start()
    for chunk in lines(keys, span_ns):
        proc.stdin.write(chunk)
    proc.stdin.close()
    _, status, usage = os.wait4(proc.pid, 0)
    elapsed = time.monotonic() - start
    reader.join()
    proc.returncode = os.waitstatus_to_exitcode(status)
    assert proc.returncode == 0, err
    return usage.ru_maxrss, elapsed, err[0].decode().strip()


def main() -> None:
    bucket = "token-bucket capacity=10 rate=1/s"
    capacity, keys = 1_000_000, 10_000_000
    base, _, _ = run(bucket, capacity, 1, 1)
    tiny, _, _ = run(bucket, 1, 1, 1)
    full, secs, note = run(bucket, capacity, keys, 10_000_000_000)
    print(f"one-line trace, capacity {capacity:,}: peak RSS {base} KiB")
    print(f"one-line trace, capacity 1: peak RSS {tiny} KiB")
    print(f"{keys:,} distinct keys, capacity {capacity:,}: peak RSS {full} KiB, {secs:.2f} s")
    print(f"  above the one-line trace at capacity {capacity:,}, per slot: "
          f"{(full - base) * 1024 / capacity:.2f} bytes")
    print(f"  above the one-line trace at capacity 1, per slot: "
          f"{(full - tiny) * 1024 / capacity:.2f} bytes")
    print(f"  stderr: {note}")

    log = "sliding-log limit=10 window=1s"
    rss, secs, note = run(log, 10_000, 1_000_000, 1_000_000_000)
    print(f"1,000,000 new keys in 1 s, {log}, capacity 10,000: {secs:.2f} s, peak RSS {rss} KiB")
    print(f"  stderr: {note}")


if __name__ == "__main__":
    main()
