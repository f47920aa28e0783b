#!/usr/bin/env python3
"""Peak RSS of `ratewell replay` over 10,000,000 distinct keys with a 1,000,000-key table.

Streams the trace into the binary (nothing on disk) and reads the replay process's own high-water
mark (VmHWM in /proc/PID/status) once all input is written, before the process exits (it waits for
EOF on stdin), so the figure is the replay's alone. Reports the same for the same input through a
1-key table (the fixed overhead: binary, runtime, I/O buffers, the copy of standard input it
keeps for its eviction note) and the difference per key of capacity.
Usage: python3 scripts/memory.py [path/to/ratewell]
"""

import subprocess
import sys

BIN = sys.argv[1] if len(sys.argv) > 1 else "target/release/ratewell"
KEYS = 10_000_000
CAPACITY = 1_000_000
POLICY = "token-bucket capacity=10 rate=1/s"


def vm_hwm_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    raise RuntimeError("no VmHWM")


def peak_rss_kib(capacity: int, keys: int) -> int:
    proc = subprocess.Popen(
        [BIN, "replay", "--policy", POLICY, "--capacity", str(capacity)],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
    )
    chunk = []
    for i in range(keys):
        chunk.append(f"{i},k{i:x}\n")
        if len(chunk) == 100_000:
            proc.stdin.write("".join(chunk).encode())
            chunk.clear()
    proc.stdin.write("".join(chunk).encode())
    proc.stdin.flush()
    # Every line but the last few buffered ones has been decided; the table is as full as it gets.
    peak = vm_hwm_kib(proc.pid)
    proc.stdin.close()
    assert proc.wait() == 0
    return peak


def main() -> None:
    base = peak_rss_kib(1, KEYS)
    full = peak_rss_kib(CAPACITY, KEYS)
    per_key = (full - base) * 1024 / CAPACITY
    print(f"fixed overhead (1-key table): {base} KiB")
    print(f"peak RSS, {KEYS:,} distinct keys, capacity {CAPACITY:,}: {full} KiB")
    print(f"per key of capacity: {per_key:.2f} bytes")


if __name__ == "__main__":
    main()
