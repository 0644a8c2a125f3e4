#!/usr/bin/python3
"""Numerical reference for arbiter's CPU engine: Llama / Qwen2 / Qwen3 logits in float64.

Reads <model_dir>/config.json and the safetensors weights (model.safetensors, or the
shards named by model.safetensors.index.json) with nothing but json + numpy, runs the
Hugging Face forward pass (LlamaForCausalLM semantics: RMSNorm, rotate_half RoPE,
grouped-query causal attention, SwiGLU MLP; Qwen2 q/k/v bias; Qwen3 per-head q/k
RMSNorm before RoPE; tied lm_head; rope_scaling "linear" and "llama3") in float64 on
the given token ids, and writes the logits of every position. Other rope_scaling types
are refused (exit 2).

Usage:
  reference_logits.py MODEL_DIR --ids 1,2,3 --out logits.f64
Output: raw little-endian float64, row-major [n_tokens, vocab_size] (no header).
Exit codes: 0 ok; 2 bad arguments or model; 3 numpy missing.
"""
import argparse
import json
import os
import struct
import sys

try:
    import numpy as np
except ImportError:  # the C++ test turns this into a clear failure
    sys.stderr.write("reference_logits.py: numpy is not installed for %s "
                     "(install python3-numpy)\n" % sys.executable)
    sys.exit(3)


def fail(msg):
    sys.stderr.write("reference_logits.py: %s\n" % msg)
    sys.exit(2)


def read_safetensors(path):
    """name -> float64 ndarray for every tensor in one .safetensors file."""
    with open(path, "rb") as f:
        buf = f.read()
    (n,) = struct.unpack("<Q", buf[:8])
    header = json.loads(buf[8:8 + n].decode("utf-8"))
    base = 8 + n
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dtype = info["dtype"]
        shape = tuple(info["shape"])
        begin, end = info["data_offsets"]
        count = int(np.prod(shape)) if shape else 1
        size = {"BF16": 2, "F16": 2, "F32": 4, "F64": 8}.get(dtype)
        if size is None:
            continue  # not a weight we use
        if end - begin != count * size:
            fail("%s: tensor %s: data_offsets span %d bytes, shape needs %d"
                 % (path, name, end - begin, count * size))
        if dtype == "BF16":
            u16 = np.frombuffer(buf, dtype="<u2", count=count, offset=base + begin)
            arr = (u16.astype(np.uint32) << 16).view("<f4")
        elif dtype == "F16":
            arr = np.frombuffer(buf, dtype="<f2", count=count, offset=base + begin)
        elif dtype == "F32":
            arr = np.frombuffer(buf, dtype="<f4", count=count, offset=base + begin)
        else:
            arr = np.frombuffer(buf, dtype="<f8", count=count, offset=base + begin)
        out[name] = arr.astype(np.float64).reshape(shape)
    return out


def load_weights(model_dir):
    index = os.path.join(model_dir, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
    else:
        files = ["model.safetensors"]
    weights = {}
    for name in files:
        weights.update(read_safetensors(os.path.join(model_dir, name)))
    return weights


def rms_norm(x, w, eps):
    var = np.mean(x * x, axis=-1, keepdims=True)
    return x / np.sqrt(var + eps) * w


def rotate_half(x):
    half = x.shape[-1] // 2
    return np.concatenate([-x[..., half:], x[..., :half]], axis=-1)


def rope_inv_freq(cfg, hd):
    """RoPE inverse frequencies [hd/2] (radians per position), rope_scaling applied.

    Written from the transformers rule, independently of the C++ engine: "linear"
    divides every frequency by factor; "llama3" splits channels by wavelength
    2*pi/inv_freq against the pre-training context C: waves longer than
    C/low_freq_factor are divided by factor, waves shorter than C/high_freq_factor
    are kept, and the band between blends the two linearly in C/wavelength.
    """
    theta = cfg.get("rope_theta")
    params = cfg.get("rope_parameters")  # newer transformers spelling
    if theta is None and isinstance(params, dict):
        theta = params.get("rope_theta")
    if theta is None:
        theta = 10000.0
    inv_freq = float(theta) ** (-np.arange(0, hd, 2, dtype=np.float64) / hd)
    scaling = cfg.get("rope_scaling")
    if scaling is None:
        scaling = params
    if not scaling:
        return inv_freq
    kind = scaling.get("rope_type") or scaling.get("type") or "default"
    if kind == "default":
        return inv_freq
    factor = float(scaling["factor"])
    if kind == "linear":
        return inv_freq / factor
    if kind != "llama3":
        fail("rope_scaling type %r is not implemented" % kind)
    low = float(scaling["low_freq_factor"])
    high = float(scaling["high_freq_factor"])
    context = float(scaling["original_max_position_embeddings"])
    wavelen = 2.0 * np.pi / inv_freq
    blend = (context / wavelen - low) / (high - low)   # 0 at the long end, 1 at the short end
    middle = (1.0 - blend) * inv_freq / factor + blend * inv_freq
    return np.where(wavelen > context / low, inv_freq / factor,
                    np.where(wavelen < context / high, inv_freq, middle))


def forward(cfg, w, ids):
    arch = cfg["architectures"][0]
    hidden = cfg["hidden_size"]
    n_heads = cfg["num_attention_heads"]
    n_kv = cfg.get("num_key_value_heads") or n_heads
    hd = cfg.get("head_dim") or hidden // n_heads
    eps = cfg.get("rms_norm_eps", 1e-6)
    n_layers = cfg["num_hidden_layers"]
    qwen2 = arch.startswith("Qwen2")
    qk_norm = arch.startswith("Qwen3")
    bias = cfg.get("attention_bias", qwen2)
    tied = cfg.get("tie_word_embeddings", False)

    p = "model." if "model.embed_tokens.weight" in w else ""
    T = len(ids)
    x = w[p + "embed_tokens.weight"][np.array(ids)]  # [T, hidden]

    pos = np.arange(T, dtype=np.float64)
    inv_freq = rope_inv_freq(cfg, hd)                                    # [hd/2]
    ang = pos[:, None] * inv_freq[None, :]                               # [T, hd/2]
    cos = np.concatenate([np.cos(ang), np.cos(ang)], axis=-1)[:, None, :]  # [T, 1, hd]
    sin = np.concatenate([np.sin(ang), np.sin(ang)], axis=-1)[:, None, :]
    mask = np.triu(np.full((T, T), -np.inf), k=1)                        # [T, T]
    rep = n_heads // n_kv

    for i in range(n_layers):
        L = "%slayers.%d." % (p, i)
        h = rms_norm(x, w[L + "input_layernorm.weight"], eps)
        q = h @ w[L + "self_attn.q_proj.weight"].T
        k = h @ w[L + "self_attn.k_proj.weight"].T
        v = h @ w[L + "self_attn.v_proj.weight"].T
        if bias:
            q = q + w[L + "self_attn.q_proj.bias"]
            k = k + w[L + "self_attn.k_proj.bias"]
            v = v + w[L + "self_attn.v_proj.bias"]
        q = q.reshape(T, n_heads, hd)
        k = k.reshape(T, n_kv, hd)
        v = v.reshape(T, n_kv, hd)
        if qk_norm:
            q = rms_norm(q, w[L + "self_attn.q_norm.weight"], eps)
            k = rms_norm(k, w[L + "self_attn.k_norm.weight"], eps)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        k = np.repeat(k, rep, axis=1)  # [T, n_heads, hd]; head h uses KV head h // rep
        v = np.repeat(v, rep, axis=1)
        s = np.einsum("thd,shd->hts", q, k) / np.sqrt(hd) + mask[None]
        s = s - s.max(axis=-1, keepdims=True)
        e = np.exp(s)
        a = e / e.sum(axis=-1, keepdims=True)
        o = np.einsum("hts,shd->thd", a, v).reshape(T, n_heads * hd)
        x = x + o @ w[L + "self_attn.o_proj.weight"].T
        h = rms_norm(x, w[L + "post_attention_layernorm.weight"], eps)
        g = h @ w[L + "mlp.gate_proj.weight"].T
        u = h @ w[L + "mlp.up_proj.weight"].T
        x = x + ((g / (1.0 + np.exp(-g))) * u) @ w[L + "mlp.down_proj.weight"].T
    x = rms_norm(x, w[p + "norm.weight"], eps)
    lm = w[p + "embed_tokens.weight"] if tied else w["lm_head.weight"]
    return x @ lm.T  # [T, vocab]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model_dir")
    ap.add_argument("--ids", required=True, help="comma-separated token ids")
    ap.add_argument("--out", required=True, help="output file: raw f64 [n_tokens, vocab]")
    args = ap.parse_args()
    try:
        ids = [int(t) for t in args.ids.split(",") if t.strip()]
    except ValueError:
        fail("--ids must be comma-separated integers")
    if not ids:
        fail("--ids is empty")
    with open(os.path.join(args.model_dir, "config.json")) as f:
        cfg = json.load(f)
    w = load_weights(args.model_dir)
    logits = forward(cfg, w, ids)
    logits.astype("<f8").tofile(args.out)
    sys.stderr.write("reference_logits.py: %d tokens x %d vocab written to %s\n"
                     % (logits.shape[0], logits.shape[1], args.out))


if __name__ == "__main__":
    main()
