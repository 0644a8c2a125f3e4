#!/usr/bin/env python3
"""HTTP transport under idle, half-sent and busy connections (docs/BENCHMARKS.md
"HTTP transport").

Starts SERVER_CMD (which must serve GET /health on --port), then measures:
  1. RSS of the server before and after opening N idle connections (per
     connection);
  2. GET /health on a fresh connection (connect → response) with N idle
     connections open, then with N half-sent requests ("POST /echo",
     "Content-Length: 100", headers only) open as well: median and max of
     --probes requests, each given --probe-timeout seconds;
  3. requests/s of GET /health with wrk (-t2 -c64 -d10s) once the idle and
     half-sent connections are closed.
Everything goes to 127.0.0.1 only; loops are bounded.

Usage: http_transport.py --port P [--idle N] [--half N] -- SERVER_CMD...
"""
import argparse
import os
import resource
import socket
import statistics
import subprocess
import sys
import time


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return -1


def wait_health(port, timeout):
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            if probe(port, 2.0) is not None:
                return True
        except OSError:
            pass
        time.sleep(0.1)
    return False


def probe(port, timeout):
    """Seconds for connect + GET /health + full response; None on timeout."""
    t0 = time.monotonic()
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    try:
        s.settimeout(timeout)
        s.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        data = b""
        while b"\r\n\r\n" not in data or b'"ok"' not in data:
            chunk = s.recv(4096)
            if not chunk:
                break
            data += chunk
        if b" 200 " not in data.split(b"\r\n", 1)[0]:
            return None
        return time.monotonic() - t0
    except socket.timeout:
        return None
    finally:
        s.close()


def probes(port, n, timeout):
    times = []
    for _ in range(n):
        try:
            t = probe(port, timeout)
        except OSError:
            t = None
        times.append(t)
    ok = [t for t in times if t is not None]
    failed = len(times) - len(ok)
    if not ok:
        return f"no answer within {timeout:g} s ({failed}/{n} timed out)"
    return (f"median {statistics.median(ok) * 1000:.2f} ms, max {max(ok) * 1000:.2f} ms"
            + (f", {failed}/{n} timed out after {timeout:g} s" if failed else ""))


def open_idle(port, n):
    socks = []
    for _ in range(n):
        socks.append(socket.create_connection(("127.0.0.1", port), timeout=10))
    return socks


def open_half(port, n):
    socks = open_idle(port, n)
    for s in socks:
        s.sendall(b"POST /echo HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 100\r\n\r\n")
    return socks


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--idle", type=int, default=1000)
    ap.add_argument("--half", type=int, nargs="+", default=[300, 1000])
    ap.add_argument("--probes", type=int, default=10)
    ap.add_argument("--probe-timeout", type=float, default=30.0)
    ap.add_argument("--wrk-seconds", type=int, default=10)
    ap.add_argument("cmd", nargs=argparse.REMAINDER)
    a = ap.parse_args()
    cmd = a.cmd[1:] if a.cmd and a.cmd[0] == "--" else a.cmd
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # inherited by the server

    server = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        if not wait_health(a.port, 60):
            sys.exit("server did not answer /health within 60 s")
        for _ in range(50):  # warm-up
            probe(a.port, 5)
        print(f"server: {' '.join(cmd)}")
        print(f"/health, nothing else open: {probes(a.port, a.probes, a.probe_timeout)}")
        time.sleep(0.5)
        rss0 = rss_kib(server.pid)
        idle = open_idle(a.port, a.idle)
        time.sleep(1.0)
        rss1 = rss_kib(server.pid)
        print(f"RSS: {rss0} KiB → {rss1} KiB with {a.idle} idle connections "
              f"({(rss1 - rss0) * 1024 / max(1, a.idle):.0f} B per connection)")
        print(f"/health with {a.idle} idle: {probes(a.port, a.probes, a.probe_timeout)}")
        for h in a.half:
            half = open_half(a.port, h)
            time.sleep(0.5)
            print(f"/health with {a.idle} idle + {h} half-sent: "
                  f"{probes(a.port, a.probes, a.probe_timeout)}")
            for s in half:
                s.close()
        for s in idle:
            s.close()
        time.sleep(1.0)
        wrk = subprocess.run(["wrk", "-t2", "-c64", f"-d{a.wrk_seconds}s", "--latency",
                              f"http://127.0.0.1:{a.port}/health"],
                             capture_output=True, text=True)
        for line in wrk.stdout.splitlines():
            if ("Requests/sec" in line or "Latency" in line or " 50%" in line
                    or " 99%" in line or "requests in" in line or "Non-2xx" in line
                    or "Socket errors" in line):
                print("wrk: " + line.strip())
    finally:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()


if __name__ == "__main__":
    main()
