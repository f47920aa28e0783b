#!/usr/bin/env python3
"""The module's speed beside stock limit_req and beside no limit, in one nginx.

One nginx (Debian's, the module loaded, 2 workers unless --workers) serves a small file at
four locations, each request keyed by its `k` argument (10,000 keys, at random, from wrk's
script), under a limit no request reaches, so that every request is decided and admitted:

    /none              no limit
    /limit_req         limit_req zone=stock (rate=1000000000r/s burst=1000000000 nodelay)
    /ratewell          ratewell zone=engine (token-bucket capacity=1000000000
                       rate=1000000000/s), ratewell_headers off: like limit_req, no fields sent
    /ratewell_headers  the same zone, with the RateLimit and RateLimit-Policy fields

1. wrk: --runs rounds (default 5); in each, every location for --seconds (default 3) with
   `wrk -t1 -c16`, in an order that rotates round to round. Medians of requests per second,
   and the medians of each round's ratios (module / limit_req, module / none).
2. callgrind: nginx as one process (`master_process off`) under valgrind, counting only inside
   ngx_http_process_request, sent N requests on one keep-alive connection, for two N: the
   difference of the counts over the difference of N is one request's instructions. Twice:
   keys that are new (every request its own key: both limiters insert it) and keys that are
   known (100 keys, in turn: the difference of N has only lookups).

Usage (repository root): python3 ratewell-nginx/benches/nginx_speed.py [--runs N] [--seconds S]
It builds the module with scripts/nginx-module unless RATEWELL_NGINX_MODULE names it.
"""
import argparse
import http.client
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LOCATIONS = ["none", "limit_req", "ratewell", "ratewell_headers"]
KEYS = 10_000

WRK_SCRIPT = """
math.randomseed(7)
request = function()
  return wrk.format("GET", wrk.path .. "?k=key" .. math.random(%d))
end
""" % KEYS


def module():
    path = os.environ.get("RATEWELL_NGINX_MODULE")
    if path:
        return path
    out = subprocess.check_output([os.path.join(ROOT, "scripts/nginx-module")], text=True)
    return out.strip().splitlines()[-1]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def config(directory, port, workers, single):
    d = directory
    process = "master_process off; daemon off;\n" if single else ""
    return f"""load_module {module()};
{process}worker_processes {workers};
pid {d}/nginx.pid;
error_log {d}/error.log warn;
events {{ worker_connections 1024; }}
http {{
    access_log off;
    client_body_temp_path {d}/body; proxy_temp_path {d}/proxy;
    fastcgi_temp_path {d}/fastcgi; uwsgi_temp_path {d}/uwsgi; scgi_temp_path {d}/scgi;
    limit_req_zone $arg_k zone=stock:10m rate=1000000000r/s;
    ratewell_zone $arg_k zone=engine:10m policy="token-bucket capacity=1000000000 rate=1000000000/s";
    server {{
        listen 127.0.0.1:{port};
        root {d}/html;
        location /none {{ try_files /index.html =404; }}
        location /limit_req {{ limit_req zone=stock burst=1000000000 nodelay; try_files /index.html =404; }}
        location /ratewell {{ ratewell zone=engine; ratewell_headers off; try_files /index.html =404; }}
        location /ratewell_headers {{ ratewell zone=engine; try_files /index.html =404; }}
    }}
}}
"""


def prepare():
    directory = tempfile.mkdtemp(prefix="ratewell-nginx-speed-")
    # nginx started as root serves as another user (nobody): the files must be readable.
    os.chmod(directory, 0o755)
    os.makedirs(os.path.join(directory, "html"))
    with open(os.path.join(directory, "html/index.html"), "w") as f:
        f.write("ok\n")
    with open(os.path.join(directory, "keys.lua"), "w") as f:
        f.write(WRK_SCRIPT)
    return directory


def wait_for(port, proc, seconds=60):
    until = time.time() + seconds
    while time.time() < until:
        if proc.poll() is not None:
            sys.exit(f"nginx exited ({proc.returncode})")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.05)
    sys.exit("nginx did not listen")


def nginx_command(directory):
    return ["nginx", "-p", directory + "/", "-c", directory + "/nginx.conf", "-e",
            directory + "/error.log"]


def wrk_rounds(args, directory):
    port = free_port()
    with open(os.path.join(directory, "nginx.conf"), "w") as f:
        f.write(config(directory, port, args.workers, False))
    proc = subprocess.Popen(nginx_command(directory) + ["-g", "daemon off;"])
    try:
        wait_for(port, proc)
        rates = {name: [] for name in LOCATIONS}
        for r in range(args.runs):
            k = r % len(LOCATIONS)
            order = LOCATIONS[k:] + LOCATIONS[:k]
            for name in order:
                out = subprocess.check_output(
                    ["wrk", "-t1", "-c16", f"-d{args.seconds}s", "-s",
                     os.path.join(directory, "keys.lua"), f"http://127.0.0.1:{port}/{name}"],
                    text=True)
                rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))
                non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
                if non2xx:
                    sys.exit(f"/{name}: {non2xx.group(1)} responses were not 200")
                rates[name].append(rps)
            print(f"round {r + 1}: " + ", ".join(f"{n} {rates[n][-1]:.0f}/s" for n in LOCATIONS),
                  flush=True)
        return rates
    finally:
        proc.send_signal(signal.SIGQUIT)
        proc.wait(timeout=30)


def key(i, keys):
    """The i-th request's key: "new", every one its own (7919 is prime to KEYS); "known", 100
    keys in turn."""
    return (i * 7919) % KEYS if keys == "new" else i % 100


def requests(port, n, name, keys):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    for i in range(n):
        conn.request("GET", f"/{name}?k=key{key(i, keys)}")
        response = conn.getresponse()
        response.read()
        if response.status != 200:
            sys.exit(f"/{name}: status {response.status}")
    conn.close()


def stop(proc, port):
    """SIGQUIT, then a connection every 100 ms until nginx exits: under valgrind, a signal that
    comes while nginx waits in epoll_wait with no timer set is not seen until an event wakes it."""
    proc.send_signal(signal.SIGQUIT)
    until = time.time() + 120
    while proc.poll() is None and time.time() < until:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
        except OSError:
            pass
        time.sleep(0.1)
    if proc.poll() is None:
        proc.kill()
        sys.exit("nginx under valgrind did not exit on SIGQUIT")
    proc.wait()


def instructions(directory, name, n, keys):
    """Instructions callgrind counts in one nginx process (`master_process off`) inside
    ngx_http_process_request (a request's phases, the limiters', its response and its log), having
    served n requests of /name on one keep-alive connection: two n give one request's
    instructions, with whatever is done once cancelled out."""
    port = free_port()
    with open(os.path.join(directory, "nginx.conf"), "w") as f:
        f.write(config(directory, port, 1, True))
    out = os.path.join(directory, f"callgrind.{name}.{keys}.{n}")
    proc = subprocess.Popen(
        ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}",
         "--toggle-collect=ngx_http_process_request"] + nginx_command(directory),
        stderr=subprocess.DEVNULL)
    try:
        wait_for(port, proc, 120)
        requests(port, n, name, keys)
    finally:
        stop(proc, port)
    with open(out) as f:
        for line in f:
            if line.startswith("summary:") or line.startswith("totals:"):
                return int(line.split()[1])
    sys.exit(f"no totals in {out}")


def wrk_summary(args, directory):
    rates = wrk_rounds(args, directory)
    med = {n: statistics.median(rates[n]) for n in LOCATIONS}
    print("median requests/s: " + ", ".join(f"{n} {med[n]:.0f}" for n in LOCATIONS))
    for a, b in [("ratewell", "limit_req"), ("ratewell", "none"), ("ratewell_headers", "limit_req"),
                 ("ratewell_headers", "none"), ("limit_req", "none")]:
        ratio = statistics.median(x / y for x, y in zip(rates[a], rates[b]))
        print(f"median of the rounds' ratios: {a} / {b} {ratio:.3f}")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--seconds", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--small", type=int, default=500)
    parser.add_argument("--large", type=int, default=2500)
    parser.add_argument("--skip-wrk", action="store_true", help="callgrind only")
    args = parser.parse_args()
    for tool in ["nginx", "wrk", "valgrind"]:
        if shutil.which(tool) is None:
            sys.exit(f"{tool} is missing (Debian: apt-get install nginx nginx-dev wrk valgrind)")
    directory = prepare()
    print(f"nginx {subprocess.run(['nginx', '-v'], capture_output=True, text=True).stderr.strip()}"
          f", {args.workers} workers, {os.cpu_count()} CPUs; wrk -t1 -c16 -d{args.seconds}s, "
          f"{KEYS} keys at random, {args.runs} rounds in rotating order")
    if not args.skip_wrk:
        wrk_summary(args, directory)
    for keys in ["new", "known"]:
        per = {}
        for name in LOCATIONS:
            small = instructions(directory, name, args.small, keys)
            large = instructions(directory, name, args.large, keys)
            per[name] = (large - small) / (args.large - args.small)
            print(f"callgrind, {keys} keys, /{name}: {small} instructions for {args.small} "
                  f"requests, {large} for {args.large}: {per[name]:.0f} a request", flush=True)
        print(f"{keys} keys: instructions a request above no limit: " + ", ".join(
            f"{name} {per[name] - per['none']:.0f}" for name in LOCATIONS[1:]))
    shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    main()
