#!/usr/bin/env python3
"""Pipelined load on a redis-server, and its CPU time per operation (/proc/PID/stat).

  drive.py PORT PID module COMMANDS PER_COMMAND [POLICY [PREFIX]]
  drive.py PORT PID incr COMMANDS

`module`: COMMANDS calls of RATEWELL.BATCH, each carrying PER_COMMAND one-layer requests on
distinct keys (PREFIX{client-N}, N cycling over 100,000) of POLICY (the engine's text); `incr`:
COMMANDS plain INCRs. Everything is written at once and read back; prints the server's CPU
microseconds per decision (or per INCR) and the error replies seen.
"""
import socket
import struct
import sys
import time


def frame(args):
    return b"".join(struct.pack("<I", len(a)) + a for a in args)


def resp(parts):
    out = [b"*%d\r\n" % len(parts)]
    for p in parts:
        out.append(b"$%d\r\n%s\r\n" % (len(p), p))
    return b"".join(out)


def cpu(pid):
    stat = open("/proc/%d/stat" % pid).read()
    rest = stat[stat.rfind(")") + 2:].split(" ")
    return (int(rest[11]) + int(rest[12])) / 100.0


def main():
    port, pid, mode, ncmd = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
    per = int(sys.argv[5]) if mode == "module" else 1
    policy = (sys.argv[6] if len(sys.argv) > 6 else "token-bucket capacity=1000 rate=1000/s").encode()
    prefix = (sys.argv[7] if len(sys.argv) > 7 else "bench:").encode()
    cmds, k = [], 0
    for c in range(ncmd):
        if mode == "incr":
            cmds.append(resp([b"INCR", b"incr-%d" % c]))
            continue
        keys, args = [], [str(per).encode()]
        for _ in range(per):
            keys.append(prefix + b"{client-%d}" % (k % 100_000))
            k += 1
            args += [b"1", b"6", b"", b"1", b"take", b"", b"x|" + policy, b"0"]
        cmds.append(resp([b"RATEWELL.BATCH"] + keys + [frame(args)]))
    s = socket.create_connection(("127.0.0.1", port))
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    before = cpu(pid)
    s.sendall(b"".join(cmds))
    s.settimeout(2.0)
    data = b""
    while True:
        try:
            d = s.recv(1 << 20)
        except socket.timeout:
            break
        if not d:
            break
        data += d
    after = cpu(pid)
    n = ncmd * per
    print("%s: %d operations, server CPU %.3f us each, %d error replies"
          % (mode, n, (after - before) * 1e6 / n, data.count(b"\r\n-") + data.startswith(b"-")))


main()
