#!/usr/bin/env python3
"""Soak test: many concurrent clients against a real `arbiter serve`.

Starts `arbiter serve` on a free loopback port with its own temporary state
directory and a config of three models (two chat models and an embedding
model, made with `arbiter make-model`) whose weights together exceed the
memory budget, then runs --clients client threads for --seconds (or until
--max-requests requests) mixing chat, streaming chat, completions,
embeddings, multi-turn conversations (conversation_id) and a few
deliberately bad requests, while another thread flips POST /admin/pressure
between low, nominal and critical every 2-3 s.

It checks:
  - every answer is 200, 400 for a deliberately bad request (and only for
    those), or 503 with Retry-After;
  - every 200 body is well formed: JSON of the right object, and for streams
    `data: <json>` events ending with `data: [DONE]`;
  - the server never dies, and stops cleanly (exit 0) on SIGTERM at the end;
  - RSS (RssAnon + RssShmem of the server, sampled every 100 ms) never goes
    above (budget + runtime_bytes) * 1.05, where runtime_bytes comes from
    GET /admin/status (0 while the server does not report it).
It prints, per endpoint, the count of each status and p50/p99 latency, the
peak RSS against the limit, and exits 1 on any violation (2 on a setup
error). Loopback only; python3 standard library only. Not part of
`make test` (.ci/run runs a 60-second, 16-client version).

Usage:
  python3 scripts/soak.py [--binary build/tools/arbiter] [--clients 64]
                          [--seconds 600] [--max-requests N] [--budget SIZE]
                          [--models-dir DIR] [--seed N]
The models are generated once into --models-dir (default
<binary's build dir>/soak-models) and reused by later runs.
"""
import argparse
import collections
import http.client
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

ENDPOINTS = ("chat", "chat_stream", "completions", "completions_stream", "embeddings",
             "conversation", "bad_request", "pressure")
# (preset, seed) of the three models; names are the "model" field.
MODELS = (("chat-a", "demo-chat", 0, "text"),
          ("chat-b", "demo-chat", 1, "text"),
          ("embed", "demo-embed", 0, "embedding"))
TEXT_MODELS = ("chat-a", "chat-b")
WORDS = ("the quick brown fox jumps over a lazy dog while seven wizards quietly "
         "hum tunes about memory budgets pressure and streaming tokens").split()


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def percentile(values, p):
    if not values:
        return float("nan")
    v = sorted(values)
    k = min(len(v) - 1, max(0, int(round(p / 100.0 * (len(v) - 1)))))
    return v[k]


def rss_bytes(pid):
    """RssAnon + RssShmem of `pid`, in bytes; None when it is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            total = 0
            for line in f:
                if line.startswith(("RssAnon:", "RssShmem:")):
                    total += int(line.split()[1]) * 1024
            return total
    except (OSError, ValueError):
        return None


class Stats:
    """Per-endpoint status counts and latencies, and the violations seen."""

    def __init__(self):
        self.mu = threading.Lock()
        self.status = collections.defaultdict(collections.Counter)
        self.latency = collections.defaultdict(list)
        self.violations = []
        self.requests = 0
        self.stale_retries = 0

    def record(self, endpoint, status, seconds):
        with self.mu:
            self.status[endpoint][status] += 1
            self.latency[endpoint].append(seconds)

    def violation(self, text):
        with self.mu:
            self.violations.append(text)

    def take_request(self, limit):
        with self.mu:
            if self.requests >= limit:
                return False
            self.requests += 1
            return True


class Client:
    """One keep-alive connection; reconnects when the server closes it."""

    def __init__(self, port, timeout, stats):
        self.port, self.timeout, self.stats = port, timeout, stats
        self.conn = None
        self.used = False  # a request was answered on self.conn

    def _connect(self):
        if self.conn is not None:
            self.conn.close()
        self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=self.timeout)
        self.used = False

    def post(self, path, body):
        """Returns (status, headers, response) with the body unread."""
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        for attempt in range(2):
            if self.conn is None:
                self._connect()
            reused = self.used
            try:
                self.conn.request("POST", path, body=data,
                                  headers={"Content-Type": "application/json"})
                resp = self.conn.getresponse()
                self.used = True
                return resp
            except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError):
                # A keep-alive connection the server closed between requests
                # (keep_alive_max, idle timeout): retry once on a new one, as
                # HTTP clients do. On a fresh connection it is a failure.
                self.conn.close()
                self.conn = None
                if not reused or attempt == 1:
                    raise
                with self.stats.mu:
                    self.stats.stale_retries += 1
        raise AssertionError("unreachable")

    def finish(self, resp):
        if resp.will_close:
            self.conn.close()
            self.conn = None

    def close(self):
        if self.conn is not None:
            self.conn.close()


def check_sse(raw, what):
    """Returns None when `raw` is a well-formed stream, else the problem."""
    text = raw.decode("utf-8", errors="strict")
    events = text.split("\n\n")
    if events[-1] != "":
        return f"{what}: stream does not end with a blank line: {text[-80:]!r}"
    events = events[:-1]
    if not events or events[-1] != "data: [DONE]":
        return f"{what}: stream does not end with data: [DONE]: {text[-120:]!r}"
    for ev in events[:-1]:
        if not ev.startswith("data: "):
            return f"{what}: event is not a data line: {ev[:120]!r}"
        try:
            obj = json.loads(ev[len("data: "):])
        except ValueError:
            return f"{what}: data line is not JSON: {ev[:120]!r}"
        if "error" in obj:
            return f"{what}: error event in stream: {ev[:200]!r}"
    return None


def check_json_body(raw, endpoint):
    try:
        obj = json.loads(raw)
    except ValueError:
        return f"{endpoint}: 200 body is not JSON: {raw[:120]!r}"
    if endpoint == "embeddings":
        ok = obj.get("object") == "list" and obj.get("data")
    elif endpoint == "pressure":
        ok = "level" in obj
    else:
        ok = bool(obj.get("choices"))
    return None if ok else f"{endpoint}: unexpected 200 body: {raw[:160]!r}"


def request(client, stats, endpoint, path, body, bad=False, stream=False):
    """One request; records it and checks the answer. Returns the parsed
    JSON of a 200 non-streaming answer, else None."""
    t0 = time.monotonic()
    try:
        resp = client.post(path, body)
        raw = resp.read()
    except (OSError, http.client.HTTPException) as e:
        stats.record(endpoint, "error", time.monotonic() - t0)
        stats.violation(f"{endpoint}: connection failed: {type(e).__name__}: {e}")
        client.close()
        client.conn = None
        return None
    seconds = time.monotonic() - t0
    status = resp.status
    key = status
    if status != 200:  # counted by status and error code, e.g. 503/budget_exceeded
        try:
            key = f"{status}/{json.loads(raw)['error']['code']}"
        except (ValueError, KeyError, TypeError):
            pass
    stats.record(endpoint, key, seconds)
    client.finish(resp)
    if status == 503:
        if not resp.getheader("Retry-After"):
            stats.violation(f"{endpoint}: 503 without Retry-After: {raw[:200]!r}")
        return None
    if status == 400 and bad:
        return None
    if status != 200 or bad:
        stats.violation(f"{endpoint}: unexpected {status}"
                        f"{' for a bad request' if bad else ''}: {raw[:200]!r}")
        return None
    if stream:
        ctype = resp.getheader("Content-Type", "")
        problem = None if ctype.startswith("text/event-stream") else \
            f"{endpoint}: stream Content-Type {ctype!r}"
        try:
            problem = problem or check_sse(raw, endpoint)
        except UnicodeDecodeError as e:
            problem = f"{endpoint}: stream is not UTF-8: {e}"
        if problem:
            stats.violation(problem)
        return None
    problem = check_json_body(raw, endpoint)
    if problem:
        stats.violation(problem)
        return None
    return json.loads(raw)


def sentence(rng, n):
    return " ".join(rng.choice(WORDS) for _ in range(n))


BAD_BODIES = (
    b'{"model": "chat-a", "messages": [',                                  # truncated JSON
    b'{"model": "chat-a", "messages": [{"role": "user", "content": "x"}], "temperature": 5}',
    b'{"model": "chat-a"}',                                                # no messages
    b'{"model": "chat-a", "messages": [{"role": "user", "content": "x"}], "n": 17}',  # n is 1..16
    b'{"model": "chat-a", "messages": [{"role": "user", "content": "x"}], "best_of": 2}',  # unknown to chat
    b'{"model": "chat-a", "messages": [{"role": "wizard", "content": "x"}]}',
    b'[1, 2, 3]',
)


def client_loop(idx, port, args, stats, deadline):
    rng = random.Random(args.seed * 1000003 + idx)
    client = Client(port, args.timeout, stats)
    conv_n = 0
    try:
        while time.monotonic() < deadline:
            if not stats.take_request(args.max_requests):
                return
            r = rng.random()
            model = rng.choice(TEXT_MODELS)
            common = {"model": model, "max_tokens": rng.randint(4, 16),
                      "temperature": rng.choice([0, 0.7, 1.0]), "seed": rng.randint(0, 1 << 30)}
            if r < 0.22:
                request(client, stats, "chat", "/v1/chat/completions",
                        dict(common, messages=[{"role": "user", "content": sentence(rng, 8)}]))
            elif r < 0.44:
                request(client, stats, "chat_stream", "/v1/chat/completions",
                        dict(common, stream=True, stream_options={"include_usage": True},
                             messages=[{"role": "system", "content": "Be brief."},
                                       {"role": "user", "content": sentence(rng, 10)}]),
                        stream=True)
            elif r < 0.56:
                request(client, stats, "completions", "/v1/completions",
                        dict(common, prompt=sentence(rng, 12), echo=rng.random() < 0.3))
            elif r < 0.62:
                request(client, stats, "completions_stream", "/v1/completions",
                        dict(common, prompt=sentence(rng, 6), stream=True), stream=True)
            elif r < 0.80:
                inputs = [sentence(rng, rng.randint(1, 12)) for _ in range(rng.randint(1, 4))]
                request(client, stats, "embeddings", "/v1/embeddings",
                        {"model": "embed", "input": inputs if len(inputs) > 1 else inputs[0],
                         "encoding_format": rng.choice(["float", "base64"])})
            elif r < 0.97:
                conv_n += 1
                cid = f"soak-{args.seed}-{idx}-{conv_n}"
                messages = [{"role": "system", "content": "You are a soak test."}]
                for _turn in range(rng.randint(2, 4)):
                    messages.append({"role": "user", "content": sentence(rng, 6)})
                    out = request(client, stats, "conversation", "/v1/chat/completions",
                                  dict(common, conversation_id=cid, cache_ttl="short",
                                       messages=messages))
                    if out is None or time.monotonic() >= deadline:
                        break
                    messages.append({"role": "assistant",
                                     "content": out["choices"][0]["message"]["content"] or ""})
                    if not stats.take_request(args.max_requests):
                        return
            else:
                path = rng.choice(["/v1/chat/completions", "/v1/completions"])
                request(client, stats, "bad_request", path, rng.choice(BAD_BODIES), bad=True)
    except Exception as e:  # a bug in this script or an unreadable answer
        stats.violation(f"client {idx}: {type(e).__name__}: {e}")
    finally:
        client.close()


def pressure_loop(port, args, stats, stop):
    rng = random.Random(args.seed)
    client = Client(port, args.timeout, stats)
    while not stop.wait(rng.uniform(2.0, 3.0)):
        level = rng.choice(["low", "nominal", "critical"])
        request(client, stats, "pressure", "/admin/pressure", {"level": level})
    request(client, stats, "pressure", "/admin/pressure", {"level": "nominal"})
    client.close()


def get_json(port, path, timeout=10):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        body = resp.read()
        return resp.status, (json.loads(body) if resp.status == 200 else body)
    finally:
        conn.close()


class Monitor(threading.Thread):
    """Samples RSS every 100 ms and /admin/status every second."""

    def __init__(self, pid, port, stats):
        super().__init__(daemon=True)
        self.pid, self.port, self.stats = pid, port, stats
        self.stop = threading.Event()
        self.budget = None
        self.runtime_bytes = 0
        self.runtime_reported = False
        self.max_rss = 0
        self.max_rss_at = 0.0
        self.max_charged = 0
        self.over = []  # (seconds, rss, limit) samples over the limit
        self.t0 = time.monotonic()

    def limit(self):
        return int((self.budget + self.runtime_bytes) * 1.05) if self.budget else None

    def poll_status(self):
        try:
            code, st = get_json(self.port, "/admin/status")
        except (OSError, http.client.HTTPException, ValueError):
            return
        if code != 200:
            return
        self.budget = st.get("budget_bytes", self.budget)
        if "runtime_bytes" in st:
            self.runtime_reported = True
            self.runtime_bytes = max(self.runtime_bytes, int(st["runtime_bytes"]))
        self.max_charged = max(self.max_charged, int(st.get("charged_bytes", 0)))

    def run(self):
        next_status = 0.0
        while not self.stop.is_set():
            now = time.monotonic()
            if now >= next_status:
                self.poll_status()
                next_status = now + 1.0
            rss = rss_bytes(self.pid)
            if rss is not None:
                if rss > self.max_rss:
                    self.max_rss, self.max_rss_at = rss, now - self.t0
                lim = self.limit()
                if lim is not None and rss > lim:
                    self.over.append((now - self.t0, rss, lim))
            self.stop.wait(0.1)


def make_models(binary, models_dir):
    os.makedirs(models_dir, exist_ok=True)
    for name, preset, seed, _cap in MODELS:
        out = os.path.join(models_dir, name)
        if os.path.exists(os.path.join(out, "config.json")):  # written last by make-model
            continue
        print(f"soak: making model {name} ({preset}, seed {seed}) in {out}", flush=True)
        subprocess.run([binary, "make-model", "--preset", preset, "--out", out,
                        "--seed", str(seed)], check=True, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)


def weights_bytes(models_dir):
    total = 0
    for name, *_ in MODELS:
        d = os.path.join(models_dir, name)
        total += sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d)
                     if f.endswith(".safetensors"))
    return total


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--binary", default="build/tools/arbiter")
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--seconds", type=float, default=600)
    ap.add_argument("--max-requests", type=int, default=1_000_000)
    ap.add_argument("--budget", default=None,
                    help="[memory] budget (default: 1.3 x the three models' weight files, "
                         "which the engine computes in their stored bf16: room for one chat "
                         "model and the embedding model with their KV and scratch, not for "
                         "both chat models, so the soak evicts and reloads)")
    ap.add_argument("--models-dir", default=None)
    ap.add_argument("--timeout", type=float, default=300, help="seconds per request")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--keep", action="store_true", help="keep the state dir and log")
    args = ap.parse_args()

    binary = os.path.abspath(args.binary)
    if not os.access(binary, os.X_OK):
        print(f"soak: no binary {binary} (make build)", file=sys.stderr)
        return 2
    models_dir = os.path.abspath(args.models_dir or
                                 os.path.join(os.path.dirname(os.path.dirname(binary)),
                                              "soak-models"))
    make_models(binary, models_dir)
    weights = weights_bytes(models_dir)
    budget = args.budget or str(int(weights * 1.3))

    work = tempfile.mkdtemp(prefix="arbiter-soak-")
    port = free_port()
    config = os.path.join(work, "arbiter.toml")
    with open(config, "w") as f:
        f.write(f'[server]\nhost = "127.0.0.1"\nport = {port}\n'
                f'[memory]\nbudget = "{budget}"\n[pressure]\nsource = "none"\n')
        for name, _preset, _seed, cap in MODELS:
            f.write(f'[[models]]\nname = "{name}"\npath = "{os.path.join(models_dir, name)}"\n'
                    f'capability = "{cap}"\n')
            if cap == "text":
                f.write("parallel = 2\nctx = 1024\n")
    log_path = os.path.join(work, "serve.log")
    env = {k: v for k, v in os.environ.items() if not k.startswith("ARBITER_")}
    log = open(log_path, "w")
    server = subprocess.Popen([binary, "serve", "--config", config, "--state-dir",
                               os.path.join(work, "state")],
                              stdout=log, stderr=subprocess.STDOUT, env=env,
                              start_new_session=True)
    stats = Stats()
    failed_setup = False
    monitor = None
    start = time.monotonic()
    try:
        deadline = time.monotonic() + 120
        while True:
            if server.poll() is not None:
                raise RuntimeError(f"server exited with {server.returncode} at startup")
            try:
                if get_json(port, "/health", timeout=2)[0] == 200:
                    break
            except (OSError, http.client.HTTPException):
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("server not healthy after 120 s")
            time.sleep(0.2)
        print(f"soak: server pid {server.pid} on 127.0.0.1:{port}, budget {budget} bytes, "
              f"model weights {weights} bytes (files), {args.clients} clients for "
              f"{args.seconds:g} s (at most {args.max_requests} requests)", flush=True)

        monitor = Monitor(server.pid, port, stats)
        monitor.poll_status()
        monitor.start()
        stop = threading.Event()
        pressure = threading.Thread(target=pressure_loop, args=(port, args, stats, stop))
        pressure.start()
        start = time.monotonic()
        deadline = start + args.seconds
        threads = [threading.Thread(target=client_loop, args=(i, port, args, stats, deadline))
                   for i in range(args.clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        stop.set()
        pressure.join()
        elapsed = time.monotonic() - start
        if server.poll() is not None:
            stats.violation(f"server died during the soak (exit {server.returncode})")
        else:
            code, st = get_json(port, "/admin/status")
            if code == 200:
                weight_total = sum(int(m.get("weight_bytes", 0)) for m in st.get("models", []))
                print(f"soak: weights in compute layout {weight_total} bytes vs budget "
                      f"{st.get('budget_bytes')} bytes; loads {st.get('loads')}, evictions "
                      f"{st.get('evictions')}")
                # The soak is about a budget that cannot hold everything: some
                # model must have been evicted to make room for another.
                if int(st.get("evictions") or 0) == 0:
                    stats.violation("no model was evicted: everything fit the budget; "
                                    "lower --budget")
    except (RuntimeError, OSError, http.client.HTTPException) as e:
        print(f"soak: setup failed: {e}", file=sys.stderr)
        failed_setup = True
        elapsed = time.monotonic() - start
    finally:
        if monitor is not None:
            monitor.stop.set()
            monitor.join()
        if server.poll() is None:
            server.send_signal(signal.SIGTERM)
            try:
                rc = server.wait(timeout=60)
                if rc != 0:
                    stats.violation(f"server exited with {rc} after SIGTERM")
            except subprocess.TimeoutExpired:
                stats.violation("server did not stop within 60 s of SIGTERM")
                os.killpg(server.pid, signal.SIGKILL)
                server.wait()
        log.close()

    # ---- report -------------------------------------------------------------
    total = sum(sum(c.values()) for c in stats.status.values())
    print(f"\nsoak: {total} requests in {elapsed:.0f} s ({total / max(elapsed, 1e-9):.1f}/s), "
          f"{args.clients} clients, {stats.stale_retries} keep-alive retries")
    print(f"{'endpoint':<20} {'count':>7} {'p50 ms':>9} {'p99 ms':>9}  statuses")
    for ep in ENDPOINTS:
        if ep not in stats.status:
            continue
        c = stats.status[ep]
        lat = stats.latency[ep]
        codes = " ".join(f"{k}:{v}" for k, v in sorted(c.items(), key=lambda kv: str(kv[0])))
        print(f"{ep:<20} {sum(c.values()):>7} {percentile(lat, 50) * 1000:>9.1f} "
              f"{percentile(lat, 99) * 1000:>9.1f}  {codes}")
    if monitor is not None:
        lim = monitor.limit()
        print(f"RSS (anon+shmem): max {monitor.max_rss / 2**20:.1f} MiB at {monitor.max_rss_at:.0f} s; "
              f"limit {lim / 2**20 if lim else float('nan'):.1f} MiB = (budget "
              f"{(monitor.budget or 0) / 2**20:.1f} MiB + runtime_bytes "
              f"{monitor.runtime_bytes / 2**20:.1f} MiB"
              f"{'' if monitor.runtime_reported else ' (not reported)'}) x 1.05; "
              f"max charged {monitor.max_charged / 2**20:.1f} MiB")
        if monitor.over:
            t, rss, lim = max(monitor.over, key=lambda o: o[1] - o[2])
            stats.violation(f"RSS over the limit in {len(monitor.over)} samples; worst "
                            f"{rss / 2**20:.1f} MiB > {lim / 2**20:.1f} MiB at {t:.0f} s")
    if stats.violations:
        print(f"\nsoak: FAILED, {len(stats.violations)} violations (first 20):")
        for v in stats.violations[:20]:
            print("  " + v)
    ok = not stats.violations and not failed_setup
    if ok and not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    else:
        print(f"soak: server log and state kept in {work}")
        if not ok:
            with open(log_path, errors="replace") as f:
                tail = f.readlines()[-20:]
            print("soak: end of the server log:\n" + "".join("  " + l for l in tail))
    print("soak: OK" if ok else "soak: FAILED")
    return 0 if ok else (2 if failed_setup else 1)


if __name__ == "__main__":
    sys.exit(main())
