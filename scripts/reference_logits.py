#!/usr/bin/python3
"""Numerical reference for arbiter's CPU engine: Llama / Qwen2 / Qwen3 logits in float64.

Reads a model with nothing but json + numpy and runs the Hugging Face forward pass
(LlamaForCausalLM semantics: RMSNorm, rotate_half RoPE, grouped-query causal
attention, SwiGLU MLP; Qwen2 q/k/v bias; Qwen3 per-head q/k RMSNorm before RoPE;
tied lm_head; rope_scaling "linear" and "llama3") in float64 on the given token ids,
and writes the logits of every position. Other rope_scaling types are refused (exit 2).

MODEL is either
  - a Hugging Face model directory: config.json and the safetensors weights
    (model.safetensors, or the shards named by model.safetensors.index.json), or
  - a GGUF file (versions 2 and 3): the hyperparameters from its metadata, every
    tensor dequantized to float64 from its ggml type (F32, F16, BF16, Q4_0, Q4_1,
    Q5_0, Q5_1, Q8_0, Q8_1, Q4_K, Q5_K, Q6_K, Q8_K; block layouts from ggml's
    ggml-common.h, see dequantize()), llama.cpp tensor names mapped to Hugging Face
    ones, and the q/k rows of "llama"/"mistral" files put back in Hugging Face order
    (llama.cpp's converter permutes them for its adjacent-pair RoPE; see
    unpermute_llama()). Written from the specification, not from arbiter's C++.

Usage:
  reference_logits.py MODEL --ids 1,2,3 [--ids 4,5 ...] --out logits.f64
Each --ids is one prompt, run on its own (a fresh context).
Output: raw little-endian float64, row-major [sum of n_tokens, vocab_size]: the
prompts' rows one after the other (no header).
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


# ---------------------------------------------------------------------------- GGUF
#
# File layout (ggml docs/gguf.md), little-endian: "GGUF", u32 version (2 or 3),
# u64 tensor_count, u64 kv_count; kv_count x (string key, u32 type, value); then
# tensor_count x (string name, u32 n_dims, u64 dims[n_dims] innermost first, u32
# ggml type, u64 offset); zero padding to general.alignment (default 32); the data.
# A string is a u64 length and the bytes.

GGUF_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<B",
                10: "<Q", 11: "<q", 12: "<d"}
GGUF_STRING, GGUF_ARRAY = 8, 9

# ggml type -> (name, elements per block, bytes per block).
GGML_TYPES = {
    0: ("F32", 1, 4), 1: ("F16", 1, 2), 30: ("BF16", 1, 2),
    2: ("Q4_0", 32, 18), 3: ("Q4_1", 32, 20), 6: ("Q5_0", 32, 22), 7: ("Q5_1", 32, 24),
    8: ("Q8_0", 32, 34), 9: ("Q8_1", 32, 36),
    12: ("Q4_K", 256, 144), 13: ("Q5_K", 256, 176), 14: ("Q6_K", 256, 210),
    15: ("Q8_K", 256, 292),
}


class GgufReader:
    def __init__(self, path):
        with open(path, "rb") as f:
            self.buf = f.read()
        self.path = path
        self.pos = 0

    def take(self, fmt):
        size = struct.calcsize(fmt)
        if self.pos + size > len(self.buf):
            fail("%s: truncated at byte %d" % (self.path, self.pos))
        (v,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += size
        return v

    def string(self):
        n = self.take("<Q")
        if self.pos + n > len(self.buf):
            fail("%s: truncated string at byte %d" % (self.path, self.pos))
        s = self.buf[self.pos:self.pos + n].decode("utf-8", errors="replace")
        self.pos += n
        return s

    def value(self, vtype):
        if vtype in GGUF_SCALARS:
            v = self.take(GGUF_SCALARS[vtype])
            return bool(v) if vtype == 7 else v
        if vtype == GGUF_STRING:
            return self.string()
        if vtype == GGUF_ARRAY:
            etype = self.take("<I")
            n = self.take("<Q")
            return [self.value(etype) for _ in range(n)]
        fail("%s: unknown metadata value type %d at byte %d" % (self.path, vtype, self.pos))


def read_gguf(path):
    """(metadata dict, {name: (ggml type, dims innermost first, raw bytes)})."""
    r = GgufReader(path)
    if r.buf[:4] != b"GGUF":
        fail("%s: not a GGUF file" % path)
    r.pos = 4
    version = r.take("<I")
    if version not in (2, 3):
        fail("%s: GGUF version %d (2 and 3 are read)" % (path, version))
    n_tensors = r.take("<Q")
    n_kv = r.take("<Q")
    meta = {}
    for _ in range(n_kv):
        key = r.string()
        meta[key] = r.value(r.take("<I"))
    infos = []
    for _ in range(n_tensors):
        name = r.string()
        n_dims = r.take("<I")
        dims = [r.take("<Q") for _ in range(n_dims)]
        infos.append((name, dims, r.take("<I"), r.take("<Q")))
    align = meta.get("general.alignment", 32)
    data = (r.pos + align - 1) // align * align
    tensors = {}
    for name, dims, gtype, offset in infos:
        if gtype not in GGML_TYPES:
            fail("%s: tensor %s has ggml type %d, which this script does not read"
                 % (path, name, gtype))
        _, block_elems, block_bytes = GGML_TYPES[gtype]
        count = int(np.prod(dims))
        if dims[0] % block_elems:
            fail("%s: tensor %s: row of %d elements is not whole blocks of %d"
                 % (path, name, dims[0], block_elems))
        size = count // block_elems * block_bytes
        begin = data + offset
        if begin + size > len(r.buf):
            fail("%s: tensor %s ends past the end of the file" % (path, name))
        tensors[name] = (gtype, dims, r.buf[begin:begin + size])
    return meta, tensors


def _f16(b):
    """[nb, 2] uint8 -> float64 [nb] (IEEE half)."""
    return np.ascontiguousarray(b).view("<f2")[:, 0].astype(np.float64)


def _nibbles(qs):
    """[nb, 16] bytes -> [nb, 32] ints: byte j holds element j (low) and j + 16 (high)."""
    q = qs.astype(np.int64)
    return np.concatenate([q & 0xF, q >> 4], axis=1)


def _high_bits(qh):
    """[nb, 4] bytes (a u32, little-endian) -> [nb, 32]: bit j of the u32."""
    u = np.ascontiguousarray(qh).view("<u4")[:, 0].astype(np.int64)
    return (u[:, None] >> np.arange(32)[None, :]) & 1


def _k_scales(s):
    """Q4_K / Q5_K: 12 bytes -> 8 six-bit scales and 8 six-bit mins ([nb, 8] each).

    Sub-blocks 0..3: scale = s[j] & 63, min = s[j + 4] & 63. Sub-blocks 4..7: the low
    4 bits come from s[j + 4] (scale low nibble, min high nibble), the top 2 bits from
    the top bits of s[j - 4] (scale) and s[j] (min).
    """
    s = s.astype(np.int64)
    sc = np.empty((s.shape[0], 8), dtype=np.int64)
    mn = np.empty_like(sc)
    for j in range(4):
        sc[:, j] = s[:, j] & 63
        mn[:, j] = s[:, j + 4] & 63
    for j in range(4, 8):
        sc[:, j] = (s[:, j + 4] & 0xF) | ((s[:, j - 4] >> 6) << 4)
        mn[:, j] = (s[:, j + 4] >> 4) | ((s[:, j] >> 6) << 4)
    return sc, mn


def dequantize(gtype, raw, count):
    """The ggml tensor bytes `raw` of `count` elements -> float64 [count].

    Block layouts (ggml-common.h); d, m, dmin are f16 unless said otherwise, qs are
    the quants, j indexes the elements of a block:
      Q4_0 (32) d, qs[16]           x = (nibble_j - 8) d
      Q4_1 (32) d, m, qs[16]        x = nibble_j d + m
      Q5_0 (32) d, qh u32, qs[16]   x = ((nibble_j | bit_j(qh) << 4) - 16) d
      Q5_1 (32) d, m, qh, qs[16]    x = (nibble_j | bit_j(qh) << 4) d + m
      Q8_0 (32) d, qs i8[32]        x = q_j d;  Q8_1 (32) d, s, qs i8[32] likewise
      Q4_K (256) d, dmin, scales[12], qs[128]: 8 sub-blocks of 32 with 6-bit scale
          sc and min mn (_k_scales); each 32 bytes of qs hold sub-block 2c (low
          nibbles) and 2c + 1 (high nibbles); x = d sc q - dmin mn
      Q5_K (256) d, dmin, scales[12], qh[32], qs[128]: as Q4_K, plus a fifth bit:
          element l of sub-block s has bit s of qh[l]
      Q6_K (256) ql[128], qh[64], scales i8[16], d: two halves of 128; in half n,
          element 32k + l (k = 0..3, l < 32) has low 4 bits from
          ql[64n + l + 32 (k & 1)] (low nibble for k < 2, high for k >= 2) and high
          2 bits (qh[32n + l] >> 2k) & 3; x = d scales[e / 16] (q - 32)
      Q8_K (256) d f32, qs i8[256], bsums i16[16]   x = q_j d
    """
    name, block_elems, block_bytes = GGML_TYPES[gtype]
    if name == "F32":
        return np.frombuffer(raw, dtype="<f4", count=count).astype(np.float64)
    if name == "F16":
        return np.frombuffer(raw, dtype="<f2", count=count).astype(np.float64)
    if name == "BF16":
        u16 = np.frombuffer(raw, dtype="<u2", count=count)
        return (u16.astype(np.uint32) << 16).view("<f4").astype(np.float64)
    nb = count // block_elems
    b = np.frombuffer(raw, dtype=np.uint8, count=nb * block_bytes).reshape(nb, block_bytes)
    if name == "Q4_0":
        q = _nibbles(b[:, 2:18]) - 8
        x = q * _f16(b[:, 0:2])[:, None]
    elif name == "Q4_1":
        q = _nibbles(b[:, 4:20])
        x = q * _f16(b[:, 0:2])[:, None] + _f16(b[:, 2:4])[:, None]
    elif name == "Q5_0":
        q = (_nibbles(b[:, 6:22]) | (_high_bits(b[:, 2:6]) << 4)) - 16
        x = q * _f16(b[:, 0:2])[:, None]
    elif name == "Q5_1":
        q = _nibbles(b[:, 8:24]) | (_high_bits(b[:, 4:8]) << 4)
        x = q * _f16(b[:, 0:2])[:, None] + _f16(b[:, 2:4])[:, None]
    elif name == "Q8_0":
        q = np.ascontiguousarray(b[:, 2:34]).view(np.int8).astype(np.int64)
        x = q * _f16(b[:, 0:2])[:, None]
    elif name == "Q8_1":
        q = np.ascontiguousarray(b[:, 4:36]).view(np.int8).astype(np.int64)
        x = q * _f16(b[:, 0:2])[:, None]
    elif name in ("Q4_K", "Q5_K"):
        d, dmin = _f16(b[:, 0:2]), _f16(b[:, 2:4])
        sc, mn = _k_scales(b[:, 4:16])
        qs = b[:, 16:144] if name == "Q4_K" else b[:, 48:176]
        qs = qs.astype(np.int64).reshape(nb, 4, 32)
        q = np.stack([qs & 0xF, qs >> 4], axis=2).reshape(nb, 8, 32)  # sub-block 2c + h
        if name == "Q5_K":
            qh = b[:, 16:48].astype(np.int64)                          # [nb, 32]
            bits = (qh[:, None, :] >> np.arange(8)[None, :, None]) & 1  # [nb, 8, 32]
            q = q + 16 * bits
        x = (d[:, None, None] * sc[:, :, None] * q - dmin[:, None, None] * mn[:, :, None])
    elif name == "Q6_K":
        ql = b[:, 0:128].astype(np.int64).reshape(nb, 2, 64)
        qh = b[:, 128:192].astype(np.int64).reshape(nb, 2, 32)
        scales = np.ascontiguousarray(b[:, 192:208]).view(np.int8).astype(np.int64)
        d = _f16(b[:, 208:210])
        lo, hi = ql[:, :, :32], ql[:, :, 32:]
        q = np.stack([(lo & 0xF) | (((qh >> 0) & 3) << 4),
                      (hi & 0xF) | (((qh >> 2) & 3) << 4),
                      (lo >> 4) | (((qh >> 4) & 3) << 4),
                      (hi >> 4) | (((qh >> 6) & 3) << 4)], axis=2).reshape(nb, 256) - 32
        x = d[:, None] * np.repeat(scales, 16, axis=1) * q
    elif name == "Q8_K":
        d = np.ascontiguousarray(b[:, 0:4]).view("<f4")[:, 0].astype(np.float64)
        q = np.ascontiguousarray(b[:, 4:260]).view(np.int8).astype(np.int64)
        x = q * d[:, None]
    else:
        fail("ggml type %s cannot be dequantized" % name)
    return x.reshape(count)


def unpermute_llama(w, n_head):
    """Undo llama.cpp's convert_hf_to_gguf.py LlamaModel.permute for q/k rows (or bias).

    The converter stores w.reshape(n_head, 2, head_dim/2, ...).swapaxes(1, 2): within
    each head, GGUF row 2i + s is Hugging Face row s * head_dim/2 + i. This is the
    inverse: view each head as [head_dim/2, 2] and swap back.
    """
    return (w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


GGUF_ARCHS = {"llama": "LlamaForCausalLM", "mistral": "LlamaForCausalLM",
              "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}

# llama.cpp tensor name suffix -> Hugging Face suffix (per layer).
GGUF_LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight", "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias", "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.bias": "self_attn.v_proj.bias",
    "attn_q_norm.weight": "self_attn.q_norm.weight",
    "attn_k_norm.weight": "self_attn.k_norm.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight", "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}


def load_gguf(path):
    """(HF-style config dict, {HF name: float64 ndarray in HF row-major shape})."""
    meta, tensors = read_gguf(path)
    arch = meta.get("general.architecture")
    if arch not in GGUF_ARCHS:
        fail("%s: general.architecture %r is not llama, mistral, qwen2 or qwen3" % (path, arch))
    a = arch + "."

    def need(key):
        if a + key not in meta:
            fail("%s: metadata key %s%s is missing" % (path, a, key))
        return meta[a + key]

    n_heads = need("attention.head_count")
    hidden = need("embedding_length")
    cfg = {
        "architectures": [GGUF_ARCHS[arch]],
        "hidden_size": hidden,
        "intermediate_size": need("feed_forward_length"),
        "num_hidden_layers": need("block_count"),
        "num_attention_heads": n_heads,
        "num_key_value_heads": meta.get(a + "attention.head_count_kv", n_heads),
        "head_dim": meta.get(a + "attention.key_length", hidden // n_heads),
        "rms_norm_eps": need("attention.layer_norm_rms_epsilon"),
        "rope_theta": meta.get(a + "rope.freq_base", 10000.0),
        "tie_word_embeddings": "output.weight" not in tensors,
        "attention_bias": arch == "qwen2" or "blk.0.attn_q.bias" in tensors,
    }
    scaling = meta.get(a + "rope.scaling.type", "none")
    if scaling == "linear":
        cfg["rope_scaling"] = {"rope_type": "linear", "factor": meta[a + "rope.scaling.factor"]}
    elif scaling != "none":
        fail("%s: rope scaling %r is not implemented" % (path, scaling))
    if "rope_freqs.weight" in tensors:
        # Llama 3.1+: inv_freq_i / factor_i (llama.cpp's converter bakes the
        # llama3 rope_scaling into these factors).
        gtype, dims, raw = tensors["rope_freqs.weight"]
        cfg["rope_freq_factors"] = dequantize(gtype, raw, int(np.prod(dims)))

    w = {}
    for name, (gtype, dims, raw) in tensors.items():
        shape = tuple(reversed(dims))  # row-major, outermost first
        arr = dequantize(gtype, raw, int(np.prod(dims))).reshape(shape)
        if name == "token_embd.weight":
            hf = "model.embed_tokens.weight"
        elif name == "output_norm.weight":
            hf = "model.norm.weight"
        elif name == "output.weight":
            hf = "lm_head.weight"
        elif name.startswith("blk."):
            _, layer, rest = name.split(".", 2)
            if rest not in GGUF_LAYER_NAMES:
                continue  # not a tensor the forward pass uses
            hf = "model.layers.%s.%s" % (layer, GGUF_LAYER_NAMES[rest])
            if arch in ("llama", "mistral") and rest.startswith(("attn_q.", "attn_k.")):
                heads = n_heads if rest.startswith("attn_q.") else cfg["num_key_value_heads"]
                arr = unpermute_llama(arr, heads)
        else:
            continue
        w[hf] = arr
    return cfg, w


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
    if "rope_freq_factors" in cfg:
        inv_freq = inv_freq / cfg["rope_freq_factors"]
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


def is_gguf(path):
    if not os.path.isfile(path):
        return False
    with open(path, "rb") as f:
        return f.read(4) == b"GGUF"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model", help="a model directory or a .gguf file")
    ap.add_argument("--ids", required=True, action="append",
                    help="comma-separated token ids of one prompt; repeat for more prompts")
    ap.add_argument("--out", required=True,
                    help="output file: raw f64 [sum of n_tokens, vocab]")
    args = ap.parse_args()
    prompts = []
    for text in args.ids:
        try:
            ids = [int(t) for t in text.split(",") if t.strip()]
        except ValueError:
            fail("--ids must be comma-separated integers")
        if not ids:
            fail("--ids is empty")
        prompts.append(ids)
    if is_gguf(args.model):
        cfg, w = load_gguf(args.model)
    else:
        with open(os.path.join(args.model, "config.json")) as f:
            cfg = json.load(f)
        w = load_weights(args.model)
    logits = np.concatenate([forward(cfg, w, ids) for ids in prompts], axis=0)
    logits.astype("<f8").tofile(args.out)
    sys.stderr.write("reference_logits.py: %d prompts, %d tokens x %d vocab written to %s\n"
                     % (len(prompts), logits.shape[0], logits.shape[1], args.out))


if __name__ == "__main__":
    main()
