#!/usr/bin/env python3
"""The module's speed beside stock limit_req and beside no limit, in one nginx.

One nginx (Debian's, the module loaded, 2 workers unless --workers) serves a small file at
three locations, each request keyed by its `k` argument (10,000 keys, at random, from wrk's
script), under a limit no request reaches, so that every request is decided and admitted:

    /none       no limit
    /limit_req  limit_req zone=stock (rate=1000000000r/s burst=1000000000 nodelay)
    /ratewell   ratewell zone=engine (token-bucket capacity=1000000000 rate=1000000000/s)

1. wrk: --runs rounds (default 5); in each, every location for --seconds (default 3) with
   `wrk -t1 -c16`, in an order that rotates round to round. Medians of requests per second,
   and the medians of each round's ratios (module / limit_req, module / none).
2. callgrind: nginx as one process (`master_process off`) under valgrind, from its start to its
   exit, sent N requests on one keep-alive connection, for two N: the difference of the counts
   over the difference of N is one request's instructions.

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
LOCATIONS = ["none", "limit_req", "ratewell"]
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
        location /ratewell {{ ratewell zone=engine; try_files /index.html =404; }}
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
            order = LOCATIONS[r % 3:] + LOCATIONS[:r % 3]
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


def requests(port, n, name):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    for i in range(n):
        conn.request("GET", f"/{name}?k=key{(i * 7919) % KEYS}")
        response = conn.getresponse()
        response.read()
        if response.status != 200:
            sys.exit(f"/{name}: status {response.status}")
    conn.close()


def instructions(directory, name, n):
    """Instructions callgrind counts in one nginx process (`master_process off`) from its start
    to its exit, having served n requests of /name: two n give one request's instructions, the
    start and the exit cancelled out."""
    port = free_port()
    with open(os.path.join(directory, "nginx.conf"), "w") as f:
        f.write(config(directory, port, 1, True))
    out = os.path.join(directory, f"callgrind.{name}.{n}")
    proc = subprocess.Popen(
        ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}"] + nginx_command(directory),
        stderr=subprocess.DEVNULL)
    try:
        wait_for(port, proc, 120)
        requests(port, n, name)
    finally:
        proc.send_signal(signal.SIGQUIT)
        proc.wait(timeout=120)
    with open(out) as f:
        for line in f:
            if line.startswith("summary:") or line.startswith("totals:"):
                return int(line.split()[1])
    sys.exit(f"no totals in {out}")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--seconds", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--small", type=int, default=500)
    parser.add_argument("--large", type=int, default=2500)
    args = parser.parse_args()
    for tool in ["nginx", "wrk", "valgrind"]:
        if shutil.which(tool) is None:
            sys.exit(f"{tool} is missing (Debian: apt-get install nginx nginx-dev wrk valgrind)")
    directory = prepare()
    print(f"nginx {subprocess.run(['nginx', '-v'], capture_output=True, text=True).stderr.strip()}"
          f", {args.workers} workers, {os.cpu_count()} CPUs; wrk -t1 -c16 -d{args.seconds}s, "
          f"{KEYS} keys at random, {args.runs} rounds in rotating order")
    rates = wrk_rounds(args, directory)
    med = {n: statistics.median(rates[n]) for n in LOCATIONS}
    ratio = lambda a, b: statistics.median(x / y for x, y in zip(rates[a], rates[b]))
    print("median requests/s: " + ", ".join(f"{n} {med[n]:.0f}" for n in LOCATIONS))
    print(f"median of the rounds' ratios: ratewell / limit_req {ratio('ratewell', 'limit_req'):.3f}"
          f", ratewell / none {ratio('ratewell', 'none'):.3f}"
          f", limit_req / none {ratio('limit_req', 'none'):.3f}")
    per = {}
    for name in LOCATIONS:
        small = instructions(directory, name, args.small)
        large = instructions(directory, name, args.large)
        per[name] = (large - small) / (args.large - args.small)
        print(f"callgrind /{name}: {small} instructions for {args.small} requests, {large} for "
              f"{args.large}: {per[name]:.0f} a request", flush=True)
    print(f"instructions a request above no limit: limit_req {per['limit_req'] - per['none']:.0f}"
          f", ratewell {per['ratewell'] - per['none']:.0f}")
    shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    main()
