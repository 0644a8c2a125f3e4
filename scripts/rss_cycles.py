#!/usr/bin/env python3
"""Memory comes back (docs/memory.md "Memory comes back"): starts `arbiter serve`
on the demo models (its own temp state dir, a free loopback port), runs N cycles
of one kind, and compares the server's RssAnon after the first cycle with after
the last. Target: drift <= max(2 %, 8 MiB). Not part of `make test`.

usage: scripts/rss_cycles.py [--binary build/tools/arbiter] [--cycles 100]
                             [--kind load|conversation|pressure|all]
kinds:
  load          POST /admin/models/demo-chat/load, a 2-token chat, .../unload
  conversation  a new conversation on demo-chat's one slot (the previous one
                is parked in the prompt cache), the previous conversation again
                (restored; the new one is parked), pressure low (the prompt
                cache spills to disk), nominal: each cycle ends with the
                prompt cache empty
  pressure      an embedding and a chat, pressure critical (demo-embed is
                evicted), nominal
Exit status 0 when every kind run holds its target."""
import argparse, json, os, shutil, signal, socket, subprocess, sys, tempfile, time, urllib.request

def free_port():
    s = socket.socket(); s.bind(("127.0.0.1", 0)); p = s.getsockname()[1]; s.close(); return p

class Server:
    def __init__(self, binary):
        self.dir = tempfile.mkdtemp(prefix="arbiter-rss-")
        self.port = free_port()
        self.log = open(os.path.join(self.dir, "log"), "w")
        self.proc = subprocess.Popen([binary, "serve", "--host", "127.0.0.1", "--port", str(self.port),
                                      "--state-dir", os.path.join(self.dir, "state")],
                                     stdout=self.log, stderr=subprocess.STDOUT)
        for _ in range(1500):
            try:
                self.req("GET", "/health"); return
            except Exception:
                if self.proc.poll() is not None: raise SystemExit("server exited; log in " + self.dir)
                time.sleep(0.2)
        raise SystemExit("server did not start")
    def req(self, method, path, body=None):
        data = json.dumps(body).encode() if body is not None else (b"" if method == "POST" else None)
        r = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}", data=data, method=method,
                                   headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(r, timeout=300) as resp: return json.loads(resp.read() or b"{}")
    def rss_anon(self):
        for line in open(f"/proc/{self.proc.pid}/status"):
            if line.startswith("RssAnon:"): return int(line.split()[1]) * 1024
    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        try: self.proc.wait(30)
        except subprocess.TimeoutExpired: self.proc.kill()
        shutil.rmtree(self.dir, ignore_errors=True)

def chat(s, text, conversation=None):
    body = {"model": "demo-chat", "messages": [{"role": "user", "content": text}], "max_tokens": 2}
    if conversation: body["conversation_id"] = conversation
    s.req("POST", "/v1/chat/completions", body)

def pressure(s, level): s.req("POST", "/admin/pressure", {"level": level})

def cycle(s, kind, i):
    if kind == "load":
        s.req("POST", "/admin/models/demo-chat/load")
        chat(s, f"cycle {i}")
        s.req("POST", "/admin/models/demo-chat/unload")
    elif kind == "conversation":
        chat(s, f"conversation {i}: " + " ".join(f"w{j % 50}" for j in range(300)), f"rss-{i}")
        if i > 0: chat(s, "and again", f"rss-{i - 1}")
        pressure(s, "low"); pressure(s, "nominal")
    else:
        s.req("POST", "/v1/embeddings", {"model": "demo-embed", "input": f"cycle {i}"})
        chat(s, f"cycle {i}")
        pressure(s, "critical"); pressure(s, "nominal")

def run(binary, kind, n):
    s = Server(binary)
    try:
        cycle(s, kind, 0); time.sleep(0.5); base = s.rss_anon()
        for i in range(1, n): cycle(s, kind, i)
        time.sleep(1); end = s.rss_anon()
        st = s.req("GET", "/admin/status")
    finally:
        s.stop()
    limit = max(0.02 * base, 8 * 2**20)
    ok = end - base <= limit
    print(f"{kind:<13} {'ok' if ok else 'FAIL'}: RssAnon after 1 cycle {base / 2**20:.1f} MiB, after {n} "
          f"{end / 2**20:.1f} MiB (drift {(end - base) / 2**20:+.1f}, limit {limit / 2**20:.1f}); "
          f"charged {st['charged_bytes'] / 2**20:.1f} MiB, unaccounted {st.get('unaccounted_bytes', 0) / 2**20:+.1f} MiB")
    return ok

def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--binary", default="build/tools/arbiter")
    ap.add_argument("--cycles", type=int, default=100)
    ap.add_argument("--kind", default="all", choices=["load", "conversation", "pressure", "all"])
    a = ap.parse_args()
    kinds = ["load", "conversation", "pressure"] if a.kind == "all" else [a.kind]
    sys.exit(0 if all([run(a.binary, k, a.cycles) for k in kinds]) else 1)

if __name__ == "__main__":
    main()
