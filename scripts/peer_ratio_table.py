#!/usr/bin/python3
"""Paired decode/prefill throughput of arbiter and llama.cpp on the same GGUF files.

usage: scripts/peer_ratio_table.py ARBITER PEERDIR [--threads 1] [--rounds 3] NAME [NAME ...]

PEERDIR is the llama.cpp peer harness prepared by ../shared/checks/peer/setup.sh
(llama.cpp's prebuilt CPU library, its llama_cbench program and the demo-chat
GGUF files models/demo-chat-NAME.gguf). For each NAME, `rounds` alternating
pairs of `arbiter bench decode --model F --threads T` and llama_cbench on the
same file (512-token prefill, 128 decode steps, best of 3 each) are run; the
table gives the medians of each side's tok/s, the median of the per-round
ratios, and arbiter's decode as a fraction of its read-bandwidth roofline
(stored bytes streamed per token ÷ sequential read bandwidth, measured by
arbiter in the same run). Prints a Markdown table.
"""
import argparse, json, os, re, statistics, subprocess, sys

ap = argparse.ArgumentParser()
ap.add_argument("arbiter")
ap.add_argument("peer")
ap.add_argument("names", nargs="+")
ap.add_argument("--threads", type=int, default=1)
ap.add_argument("--rounds", type=int, default=3)
a = ap.parse_args()
sys.path.insert(0, a.peer)
from timing import run_llama  # noqa: E402


def arbiter(path):
    out = subprocess.run([a.arbiter, "bench", "decode", "--model", path, "--threads",
                          str(a.threads), "--json"], capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


print(f"| weights | llama.cpp decode tok/s | arbiter decode tok/s | ratio | "
      f"llama.cpp prefill tok/s | arbiter prefill tok/s | ratio | arbiter MB/token | "
      f"read roofline |")
print("|---|---|---|---|---|---|---|---|---|")
for name in a.names:
    path = os.path.join(a.peer, "models", f"demo-chat-{name}.gguf")
    ad, ap_, ld, lp, rd, rp, roof = [], [], [], [], [], [], []
    for rnd in range(a.rounds):
        order = ["a", "l"] if rnd % 2 == 0 else ["l", "a"]
        for who in order:
            if who == "a":
                r = arbiter(path)
                ad.append(r["decode_tok_s"]); ap_.append(r["prefill_tok_s"])
                roof.append(r["read_roofline_fraction"]); mb = r["weight_bytes_per_token"] / 1e6
            else:
                r = run_llama("c", path, a.threads)
                ld.append(r["decode_tok_s"]); lp.append(r["prefill_tok_s"])
        rd.append(ad[-1] / ld[-1]); rp.append(ap_[-1] / lp[-1])
    med = statistics.median
    print(f"| {name.upper()} | {med(ld):.0f} | {med(ad):.0f} | {med(rd):.2f} | {med(lp):.0f} | "
          f"{med(ap_):.0f} | {med(rp):.2f} | {mb:.1f} | {med(roof):.0%} |", flush=True)
