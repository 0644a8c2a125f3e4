#!/usr/bin/env python3
"""Writes the seed corpora of the fuzz targets (fuzz/corpus/<target>/).

Each seed is a small, valid (or nearly valid) input of its reader, so the
fuzzer starts from the accepting paths instead of discovering the format
byte by byte. Run from anywhere; it rewrites the files it owns and leaves
others (e.g. crash reproducers added by hand) in place. The binary seeds
(safetensors, GGUF, KV file, weight region) follow the layouts documented in
include/arbiter/formats/safetensors.h, include/arbiter/formats/gguf.h,
include/arbiter/kv/kv_file.h and include/arbiter/weights/region_format.h; the
KV trailer is XXH3-64 computed by the system libxxhash (the library the
writer links).
"""
import ctypes
import ctypes.util
import json
import os
import struct

ROOT = os.path.dirname(os.path.abspath(__file__))


def put(target, name, data):
    d = os.path.join(ROOT, target)
    os.makedirs(d, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


# ---- safetensors ----------------------------------------------------------
def safetensors(tensors, metadata=None):
    header, blob = {}, b""
    if metadata:
        header["__metadata__"] = metadata
    for name, dtype, shape, payload in tensors:
        header[name] = {"dtype": dtype, "shape": shape,
                        "data_offsets": [len(blob), len(blob) + len(payload)]}
        blob += payload
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    return struct.pack("<Q", len(h)) + h + blob


f32 = lambda *v: struct.pack("<%df" % len(v), *v)
put("safetensors", "tiny_f32.safetensors",
    safetensors([("model.norm.weight", "F32", [4], f32(1, 1, 0.5, -2)),
                 ("lm_head.weight", "F32", [2, 2], f32(0.25, -1, 3, 0))],
                {"format": "pt"}))
put("safetensors", "mixed_dtypes.safetensors",
    safetensors([("a.bf16", "BF16", [3], struct.pack("<3H", 0x3f80, 0xbf80, 0x7f80)),
                 ("b.f16", "F16", [2], struct.pack("<2H", 0x3c00, 0xfc00)),
                 ("c.i8", "I8", [4], bytes([1, 255, 127, 128])),
                 ("d.empty", "F32", [0, 3], b""),
                 ("e.f8", "F8_E4M3", [2], bytes([0x38, 0xff])),
                 ("f.bool", "BOOL", [1], b"\x01")]))

# ---- GGUF -----------------------------------------------------------------
# Value types (gguf_type) and the struct formats of the scalars.
U8, I8, U16, I16, U32, I32, F32, BOOL, STR, ARR, U64, I64, F64 = range(13)
SCALAR = {U8: "<B", I8: "<b", U16: "<H", I16: "<h", U32: "<I", I32: "<i", F32: "<f",
          BOOL: "<?", U64: "<Q", I64: "<q", F64: "<d"}
GGML_F32, GGML_F16, GGML_Q8_0, GGML_BF16 = 0, 1, 8, 30
GGML_BYTES = {GGML_F32: (1, 4), GGML_F16: (1, 2), GGML_Q8_0: (32, 34), GGML_BF16: (1, 2)}


def gguf_str(s):
    b = s.encode() if isinstance(s, str) else s
    return struct.pack("<Q", len(b)) + b


def gguf_payload(vtype, value):
    """A value without its type tag; arrays are (element_type, [items])."""
    if vtype == STR:
        return gguf_str(value)
    if vtype == ARR:
        et, items = value
        return struct.pack("<IQ", et, len(items)) + b"".join(gguf_payload(et, v) for v in items)
    return struct.pack(SCALAR[vtype], value)


def gguf(kv, tensors, version=3):
    """kv: [(key, type, value)]; tensors: [(name, dims in ggml order, ggml type, bytes)]."""
    alignment = 32
    for key, vtype, value in kv:
        if key == "general.alignment":
            alignment = value
    out = b"GGUF" + struct.pack("<IQQ", version, len(tensors), len(kv))
    for key, vtype, value in kv:
        out += gguf_str(key) + struct.pack("<I", vtype) + gguf_payload(vtype, value)
    offset, blob = 0, b""
    for name, dims, gtype, payload in tensors:
        offset = (offset + alignment - 1) // alignment * alignment
        blob += b"\0" * (offset - len(blob)) + payload
        out += gguf_str(name) + struct.pack("<I", len(dims))
        out += b"".join(struct.pack("<Q", d) for d in dims)
        out += struct.pack("<IQ", gtype, offset)
        offset += len(payload)
    if tensors:
        out += b"\0" * ((alignment - len(out) % alignment) % alignment)
    return out + blob


def zeros(dims, gtype):
    n = 1
    for d in dims:
        n *= d
    block, size = GGML_BYTES[gtype]
    return b"\0" * (n // block * size)


def llm_kv(arch, layers, hidden, ffn, heads, kv_heads, tokens, extra=()):
    return [("general.architecture", STR, arch), ("general.name", STR, "seed"),
            (arch + ".block_count", U32, layers), (arch + ".context_length", U32, 256),
            (arch + ".embedding_length", U32, hidden), (arch + ".feed_forward_length", U32, ffn),
            (arch + ".attention.head_count", U32, heads),
            (arch + ".attention.head_count_kv", U32, kv_heads),
            (arch + ".attention.layer_norm_rms_epsilon", F32, 1e-6),
            (arch + ".rope.freq_base", F32, 1000000.0),
            ("tokenizer.ggml.model", STR, "gpt2"),
            ("tokenizer.ggml.tokens", ARR, (STR, tokens)),
            ("tokenizer.ggml.bos_token_id", U32, 1), ("tokenizer.ggml.eos_token_id", U32, 2),
            *extra]


# qwen3, one layer, every tensor of its plan (tied embeddings: no output.weight).
qwen3_tokens = ["<unk>", "<s>", "</s>"] + ["t%d" % i for i in range(9)]
H, FFN, HEADS, KVH, HD, V = 8, 16, 2, 1, 4, len(qwen3_tokens)
qwen3_tensors = [("token_embd.weight", [H, V], GGML_F32)]
for name, dims in [("attn_norm", [H]), ("attn_q", [H, HEADS * HD]), ("attn_k", [H, KVH * HD]),
                   ("attn_v", [H, KVH * HD]), ("attn_q_norm", [HD]), ("attn_k_norm", [HD]),
                   ("attn_output", [HEADS * HD, H]), ("ffn_norm", [H]), ("ffn_gate", [H, FFN]),
                   ("ffn_up", [H, FFN]), ("ffn_down", [FFN, H])]:
    qwen3_tensors.append(("blk.0.%s.weight" % name, dims, GGML_F32))
qwen3_tensors.append(("output_norm.weight", [H], GGML_F32))
put("gguf", "qwen3_tiny.gguf",
    gguf(llm_kv("qwen3", 1, H, FFN, HEADS, KVH, qwen3_tokens,
                [("qwen3.attention.key_length", U32, HD), ("qwen3.attention.value_length", U32, HD)]),
         [(n, d, t, zeros(d, t)) for n, d, t in qwen3_tensors]))

# llama with Q8_0 tensors, an output.weight, linear rope scaling and EOT.
put("gguf", "llama_q8_0.gguf",
    gguf(llm_kv("llama", 1, 32, 64, 4, 2, ["<s>", "</s>", "a", "b"],
                [("llama.rope.scaling.type", STR, "linear"),
                 ("llama.rope.scaling.factor", F32, 2.0),
                 ("tokenizer.ggml.eot_token_id", U32, 3)]),
         [("token_embd.weight", [32, 4], GGML_Q8_0, bytes(range(4 * 34))),
          ("output.weight", [32, 4], GGML_Q8_0, zeros([32, 4], GGML_Q8_0)),
          ("blk.0.attn_q.bias", [32], GGML_F16, zeros([32], GGML_F16))]))

# Version 2, every value type, nested arrays, alignment 64.
put("gguf", "all_types_v2.gguf",
    gguf([("general.alignment", U32, 64),
          ("u8", U8, 255), ("i8", I8, -128), ("u16", U16, 65535), ("i16", I16, -32768),
          ("u32", U32, 4294967295), ("i32", I32, -1), ("f32", F32, 0.5), ("bool", BOOL, True),
          ("string", STR, "héllo"), ("u64", U64, 2**64 - 1), ("i64", I64, -2**63),
          ("f64", F64, -1e300),
          ("arr.i16", ARR, (I16, [1, -2, 3])), ("arr.f64", ARR, (F64, [0.25])),
          ("arr.bool", ARR, (BOOL, [True, False])), ("arr.empty", ARR, (STR, [])),
          ("arr.nested", ARR, (ARR, [(U8, [1, 2]), (ARR, [(STR, ["x"])]), (F32, [])]))],
         [("a", [3], GGML_F16, zeros([3], GGML_F16)),
          ("b", [2, 2], GGML_BF16, struct.pack("<4H", 0x3f80, 0xbf80, 0, 0x7f80))],
         version=2))

# ---- config.json ----------------------------------------------------------
put("model_config", "qwen3.json", json.dumps({
    "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 64,
    "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
    "num_key_value_heads": 2, "head_dim": 32, "vocab_size": 300,
    "max_position_embeddings": 2048, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
    "tie_word_embeddings": True, "bos_token_id": 1, "eos_token_id": [2, 3],
    "torch_dtype": "bfloat16", "attention_bias": False}, indent=2))
put("model_config", "llama3_rope.json", json.dumps({
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
    "intermediate_size": 172, "num_hidden_layers": 2, "num_attention_heads": 4,
    "num_key_value_heads": 2, "vocab_size": 256, "max_position_embeddings": 8192,
    "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
    "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                     "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
    "bos_token_id": 0, "eos_token_id": 1, "torch_dtype": "float32"}, indent=2))
put("model_config", "qwen2_bias.json", json.dumps({
    "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 32,
    "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2,
    "num_key_value_heads": 1, "vocab_size": 100, "max_position_embeddings": 512,
    "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "tie_word_embeddings": False,
    "rope_scaling": {"type": "linear", "factor": 2.0}}))

# ---- tokenizer.json -------------------------------------------------------
byte_vocab = {}
for b in list(range(ord("!"), ord("~") + 1)) + list(range(0xa1, 0xad)) + list(range(0xae, 0x100)):
    byte_vocab[chr(b)] = len(byte_vocab)
n = 0
for b in range(256):
    if chr(b) not in byte_vocab:
        byte_vocab[chr(256 + n)] = len(byte_vocab)
        n += 1
merges = ["Ġ t", "h e", "Ġt he", "i n", "Ġ a", "e r", "o n", "Ġ w", "l l", "Ġ s"]
vocab = dict(byte_vocab)
for m in merges:
    vocab.setdefault(m.replace(" ", ""), len(vocab))
specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
put("tokenizer_json", "bytelevel_chatml.json", json.dumps({
    "version": "1.0",
    "added_tokens": [{"id": len(vocab) + i, "content": s, "single_word": False, "lstrip": False,
                      "rstrip": False, "normalized": False, "special": True}
                     for i, s in enumerate(specials)],
    "normalizer": {"type": "NFC"},
    "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"},
         "behavior": "Isolated", "invert": False},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}]},
    "post_processor": None,
    "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
    "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": "",
              "end_of_word_suffix": "", "fuse_unk": False, "byte_fallback": False,
              "ignore_merges": False, "vocab": vocab, "merges": merges}}, ensure_ascii=False))
put("tokenizer_json", "sentencepiece_llama3.json", json.dumps({
    "added_tokens": [{"id": 8, "content": "<|begin_of_text|>", "special": True},
                     {"id": 9, "content": "<|start_header_id|>", "special": True},
                     {"id": 10, "content": "<|end_header_id|>", "special": True},
                     {"id": 11, "content": "<|eot_id|>", "special": True}],
    "normalizer": {"type": "Sequence", "normalizers": [
        {"type": "Prepend", "prepend": "▁"}, {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}]},
    "pre_tokenizer": None,
    "decoder": {"type": "Sequence", "decoders": [
        {"type": "Replace", "pattern": {"String": "▁"}, "content": " "}, {"type": "ByteFallback"},
        {"type": "Fuse"}, {"type": "Strip", "content": " ", "start": 1, "stop": 0}]},
    "model": {"type": "BPE", "unk_token": "<unk>", "byte_fallback": True, "fuse_unk": True,
              "vocab": {"<unk>": 0, "<0x41>": 1, "▁": 2, "h": 3, "▁h": 4, "i": 5, "hi": 6, "▁hi": 7},
              "merges": [["▁", "h"], ["h", "i"], ["▁h", "i"]]}}, ensure_ascii=False))

# ---- server config TOML ---------------------------------------------------
put("server_config", "full.toml", """[server]
host = "127.0.0.1"
port = 8080
api_key = "change-me"
max_body_bytes = "8MiB"
threads = 0
max_connections = 1024
queue_max = 256
read_timeout_s = 30
request_timeout_s = 60
write_timeout_s = 30
keep_alive_max = 100
keep_alive_timeout_s = 5
acquire_timeout_s = 300
preload = false
metrics_public = false

[memory]
budget = "75%"
device_arena = "2GiB"
weight_cache_fraction = 1.0
wiggle_fraction = 0.1
shared_host_weights = true
shared_host_weights_mode = "0660"
shared_host_weights_prefix = "arbiter"
mode = "self_managed"
compaction_interval = 0
same_role = "coexist"

[pressure]
source = "auto"

[kv]
prompt_cache = "512MiB"
disk_budget = "4GiB"

[[models]]
name = "qwen3-0.6b"
path = "/models/Qwen3-0.6B"
parallel = 2
ctx = 4096
system_prompt = "You are a helpful assistant."

[[models]]
name = "embed"
path = "models/embed"
capability = "embedding"
idle_ttl = "10m"
""")
put("server_config", "minimal.toml", """[memory]
budget = "6GiB"

[[models]]
name = "tiny"
path = "/tmp/tiny"
""")
put("server_config", "headroom_swap.toml", """[memory]
headroom = "1536MiB"
same_role = "swap"
mode = "externally_managed"

[[models]]
name = "a"
path = "/m/a"
residency = "pinned_system"
same_role = "swap"
parallel = 4
ctx = 512
""")

# ---- OpenAI request bodies ------------------------------------------------
bodies = {
    "chat.json": {"model": "demo-chat", "messages": [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Hello!"}], "max_tokens": 16, "temperature": 0.7,
        "top_p": 0.9, "top_k": 40, "seed": 7, "stop": ["\n\n", "END"], "user": "u1"},
    "chat_stream.json": {"model": "demo-chat", "stream": True,
                         "stream_options": {"include_usage": True},
                         "messages": [{"role": "developer", "content": "x"},
                                      {"role": "user", "content": [{"type": "text", "text": "hi"}]}],
                         "max_completion_tokens": 8},
    "chat_conversation.json": {"model": "demo-chat", "conversation_id": "conv-42",
                               "prompt_cache_key": "k", "cache_ttl": "long",
                               "messages": [{"role": "user", "content": "a"},
                                            {"role": "assistant", "content": "b"},
                                            {"role": "user", "content": "c"}]},
    "completion.json": {"model": "demo-chat", "prompt": "Once upon a time", "max_tokens": 20,
                        "echo": True, "stop": "\n", "temperature": 0},
    "completion_ids.json": {"model": "demo-chat", "prompt": [1, 2, 3, 400], "stream": True},
    "completion_array.json": {"model": "demo-chat", "prompt": ["only one"], "seed": -1},
    "embedding.json": {"model": "demo-embed", "input": "The food was delicious",
                       "encoding_format": "float"},
    "embedding_batch.json": {"model": "demo-embed", "input": ["a", "b c"],
                             "encoding_format": "base64", "dimensions": 384},
    "prewarm_messages.json": {"model": "demo-chat", "conversation_id": "c1",
                              "messages": [{"role": "system", "content": "sys"}],
                              "cache_ttl": "extended"},
    "prewarm_prompt.json": {"model": "demo-chat", "conversation_id": "__system_prefix__",
                            "prompt": "You are a helpful assistant."},
}
for name, body in bodies.items():
    put("openai_request", name, json.dumps(body))

# ---- Ollama request bodies (server/internal/ollama.h) ----------------------
ollama = {
    "chat.json": {"model": "demo-chat:latest", "messages": [
        {"role": "system", "content": "sys"}, {"role": "user", "content": "hi", "images": ["aGVsbG8="]},
        {"role": "assistant", "content": "", "tool_calls": [
            {"function": {"name": "f", "arguments": {"x": 1}}}]},
        {"role": "tool", "content": "42", "tool_name": "f"}],
        "tools": [{"type": "function", "function": {"name": "f", "description": "d",
                                                     "parameters": {"type": "object"}}}],
        "format": "json", "stream": False, "keep_alive": "5m", "think": False,
        "options": {"temperature": 0.7, "top_p": 0.9, "top_k": 40, "min_p": 0.05, "seed": 3,
                    "num_predict": -1, "stop": ["\n"], "repeat_penalty": 1.1,
                    "presence_penalty": 0.5, "frequency_penalty": 0.5, "num_thread": 4,
                    "mirostat": 0, "tfs_z": 1, "typical_p": 1, "repeat_last_n": -1,
                    "num_ctx": 2048}},
    "generate.json": {"model": "demo-chat", "prompt": "Once", "system": "be brief",
                      "format": {"type": "object", "properties": {"a": {"type": "string"}}},
                      "keep_alive": -1, "options": {"num_predict": 8}},
    "generate_raw.json": {"model": "demo-chat", "prompt": "<|im_start|>user", "raw": True,
                          "keep_alive": 0},
    "embed.json": {"model": "demo-embed", "input": ["a", "b"], "truncate": True,
                   "options": {"num_ctx": 512}, "keep_alive": "30s"},
    "embeddings.json": {"model": "demo-embed", "prompt": "a"},
    "show.json": {"name": "demo-chat:latest", "verbose": True},
}
for name, body in ollama.items():
    put("ollama_request", name, json.dumps(body))

# ---- HTTP requests --------------------------------------------------------
def http(method, path, body=b"", headers=()):
    h = f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
    for k, v in headers:
        h += f"{k}: {v}\r\n"
    if body:
        h += f"Content-Length: {len(body)}\r\nContent-Type: application/json\r\n"
    return h.encode() + b"\r\n" + body


put("http_request", "get_health.http", http("GET", "/health"))
put("http_request", "post_body.http", http("POST", "/v1/chat/completions",
                                           json.dumps(bodies["chat.json"]).encode(),
                                           [("Authorization", "Bearer k")]))
put("http_request", "keepalive_two.http", http("GET", "/health") +
    http("GET", "/health", headers=[("Connection", "close")]))
put("http_request", "chunked.http",
    b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
    b"5\r\nhello\r\n0\r\n\r\n")
put("http_request", "http10.http", b"GET /health HTTP/1.0\r\n\r\n")

# ---- KV file --------------------------------------------------------------
xxh = ctypes.CDLL(ctypes.util.find_library("xxhash") or "libxxhash.so.0")
xxh.XXH3_64bits.restype = ctypes.c_uint64
xxh.XXH3_64bits.argtypes = [ctypes.c_char_p, ctypes.c_size_t]


def kv_file(model_hash, n_layers, kv_dim, tokens, dtype=0):
    """dtype: the ggml type number of the rows (0 f32, 1 f16, 8 q8_0, 30 bf16)."""
    header = b"ARBKV001" + struct.pack("<II", 1, dtype) + model_hash.encode()
    header += struct.pack("<III", n_layers, kv_dim, len(tokens))
    header += b"\0" * (64 - len(header))
    body = struct.pack("<%di" % len(tokens), *tokens)
    n = 2 * n_layers * len(tokens) * kv_dim
    values = [(i % 17) * 0.125 - 1 for i in range(n)]
    if dtype == 0:
        body += struct.pack("<%df" % n, *values)
    elif dtype == 1:
        body += struct.pack("<%de" % n, *values)
    elif dtype == 30:
        body += b"".join(struct.pack("<f", v)[2:] for v in values)  # bf16: the high half
    elif dtype == 8:
        for b in range(n // 32):  # blocks: f16 scale, 32 int8
            body += struct.pack("<e", 1.0 / 127) + bytes((i * 7 + b) % 256 for i in range(32))
    data = header + body
    return data + struct.pack("<Q", xxh.XXH3_64bits(data, len(data)))


put("kv_file", "two_layers.bin", kv_file("0123456789abcdef", 2, 8, [1, 17, 42]))
put("kv_file", "empty_prefix.bin", kv_file("fedcba9876543210", 1, 4, []))
put("kv_file", "f16.bin", kv_file("0123456789abcdef", 2, 8, [1, 17, 42], dtype=1))
put("kv_file", "bf16.bin", kv_file("0123456789abcdef", 1, 8, [5, 6], dtype=30))
put("kv_file", "q8_0.bin", kv_file("0123456789abcdef", 2, 32, [3, 4], dtype=8))

# ---- shared weight region -------------------------------------------------
def region(digest, specs):
    """specs: [(nbytes)] in order; returns a READY region's bytes."""
    table_end = 64 + 16 * len(specs)
    data_offset = (table_end + 63) // 64 * 64
    cursor, offsets = data_offset, []
    for nbytes in specs:
        off = (cursor + 63) // 64 * 64
        offsets.append((off, nbytes))
        cursor = off + nbytes
    out = bytearray(cursor)
    struct.pack_into("<8sIIQQQQQ", out, 0, b"ARBWFLR1", 1, 1, digest, cursor, len(specs), 64,
                     data_offset)
    for i, (off, nbytes) in enumerate(offsets):
        struct.pack_into("<QQ", out, 64 + 16 * i, off, nbytes)
        out[off:off + nbytes] = bytes((off + j) & 0xff for j in range(nbytes))
    return bytes(out)


# The target's fixed layout: tok_embd f32 [4,4], norm f16 [3], empty u8 [0].
put("weight_region", "fixed_layout.bin", region(0x0123456789abcdef, [64, 6, 0]))
# The derived layout read from the bytes themselves: 'A' → 1 tensor,
# 'R' → dtype 82 % 15 = I8, 'B' → rank 2, dims 'W' × 'F' = 87 × 70 bytes.
put("weight_region", "derived_layout.bin", region(0, [87 * 70]))
