// engine/internal/forward.h — the decoder forward pass over weights in the
// types they are stored in (f32, f16, bf16, ggml block types; quant.h).
//
// `Decoder` holds the model's shape, the RoPE tables and the decode thread
// pool, and is immutable (shared by all slots). It does not own the weights:
// every Forward call is given a ModelWeights — views of the buffers a
// WeightCache lease pins for the request (model_weights.h). Per-sequence
// state lives outside it too: a `KvCache` and a `ForwardScratch`, owned by
// one slot and used by one thread at a time.
//
// One call of Decoder::Forward runs tokens [pos, pos + n) of a sequence whose
// positions [0, pos) are already in the KV cache. It processes the tokens in
// chunks of at most scratch.batch(): for a chunk of more than one token every
// projection is one cblas_sgemm ([n_tokens, in] × W^T) per f32 segment of W,
// an integer product on the stored blocks for the K-quants (quant_gemm.h),
// or one sgemm per panel of rows dequantized to f32 for other types (Note
// [Prefill on typed weights] in forward.cc), and attention is two
// sgemm per head and query tile (Q·Kᵀ then P·V) with the causal mask applied
// before the softmax; a single token (decode) uses row-streaming
// matrix-vector products (MatVecPool; faster than cblas_sgemv here, see
// forward.cc) and tight loops.
// Layer order (HF LlamaDecoderLayer):
//   h  = x + o_proj(attn(rope(qk_norm(q)), rope(qk_norm(k)), v))   on rms_norm(x)
//   x' = h + down(silu(gate(n)) · up(n))                           n = rms_norm(h)
// then the final RMSNorm and the lm_head.
//
// RoPE uses the HF "rotate_half" layout: dimension i pairs with i + head_dim/2,
// angle = pos · inv_freq_i with inv_freq_i = theta^(−2i/head_dim) adjusted by
// config.rope_scaling (RopeInverseFrequencies), tables computed in double at
// load.
//
// This is the CPU device's forward pass: CpuDecoderCompute (cpu_compute.h)
// puts it behind the compute seam (compute_backend.h), and the engine calls
// it only through that. Its results go to ForwardOutputs (compute_backend.h).
//
// Thread safety: Decoder is thread-safe (const). KvCache / ForwardScratch are
// thread-compatible; one thread per slot.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "arbiter/base/status.h"
#include "arbiter/engine/kv_snapshot.h"
#include "engine/internal/aligned_buffer.h"
#include "engine/internal/compute_backend.h"
#include "engine/internal/matvec_pool.h"
#include "engine/internal/model_weights.h"

namespace arbiter::engine_internal {

// K and V of one sequence: per layer, K rows [n_ctx] then V rows [n_ctx],
// each row kv_dim values of `type` (a KV type, arbiter/engine/kv_snapshot.h:
// f32, f16, bf16, q8_0) in row_bytes() = KvRowBytes(type, kv_dim) bytes.
// Forward writes each new row in the type (Note [KV cache types] in
// forward.cc) and attention reads the rows as stored.
class KvCache {
 public:
  KvCache() = default;
  // REQUIRES: IsKvType(type) and KvRowBytes(type, kv_dim) > 0.
  KvCache(int n_layers, int n_ctx, int kv_dim, GgmlType type = GgmlType::kF32)
      : n_layers_(n_layers), n_ctx_(n_ctx), kv_dim_(kv_dim), type_(type),
        row_bytes_(KvRowBytes(type, kv_dim)),
        data_(size_t{2} * n_layers * n_ctx * row_bytes_) {}

  // [n_ctx] K rows of `layer`.
  uint8_t* k(int layer) { return data_.data() + size_t{2} * layer * n_ctx_ * row_bytes_; }
  const uint8_t* k(int layer) const {
    return data_.data() + size_t{2} * layer * n_ctx_ * row_bytes_;
  }
  // [n_ctx] V rows of `layer`.
  uint8_t* v(int layer) { return k(layer) + static_cast<size_t>(n_ctx_) * row_bytes_; }
  const uint8_t* v(int layer) const { return k(layer) + static_cast<size_t>(n_ctx_) * row_bytes_; }
  int n_layers() const { return n_layers_; }
  int n_ctx() const { return n_ctx_; }
  int kv_dim() const { return kv_dim_; }
  GgmlType type() const { return type_; }
  size_t row_bytes() const { return row_bytes_; }
  size_t bytes() const { return data_.size_bytes(); }
  // bytes() of KvCache(n_layers, n_ctx, kv_dim, type), without allocating it.
  static size_t BytesFor(int n_layers, int n_ctx, int kv_dim, GgmlType type) {
    return size_t{2} * n_layers * n_ctx * KvRowBytes(type, kv_dim);
  }

  // Copies K and V rows [begin, end) of every layer from `src`.
  // REQUIRES: same n_layers, kv_dim and type; 0 ≤ begin ≤ end ≤ min(n_ctx,
  // src.n_ctx); &src != this.
  void CopyRowsFrom(const KvCache& src, int begin, int end);
  // Copies K and V rows [0, n) of every layer out into `out`, laid out
  // [n_layers, 2, n] rows (KvSnapshot::kv). REQUIRES: 0 ≤ n ≤ n_ctx;
  // `out` holds n_layers · 2 · n · row_bytes() bytes.
  void ReadRows(int n, uint8_t* out) const;
  // The inverse of ReadRows: rows [0, n) of every layer from `in`.
  void WriteRows(int n, const uint8_t* in);

 private:
  int n_layers_ = 0;
  int n_ctx_ = 0;
  int kv_dim_ = 0;
  GgmlType type_ = GgmlType::kF32;
  size_t row_bytes_ = 0;
  AlignedBytes data_;
};

// Activations of one chunk, sized for `batch` tokens and `n_ctx` positions.
// `typed`: the weights have matrices that are not f32 (ModelWeights::typed),
// which need room for quantized activations and prefill's dequantized panels.
// `kv_type`: the KV cache's type; any but f32 needs room for K/V rows
// converted to f32 for attention (Note [KV cache types] in forward.cc).
class ForwardScratch {
 public:
  ForwardScratch() = default;
  ForwardScratch(const ModelDims& d, int batch, int n_ctx, bool typed = false,
                 GgmlType kv_type = GgmlType::kF32);
  int batch() const { return batch_; }
  size_t bytes() const;
  // bytes() of ForwardScratch(d, batch, n_ctx, typed, kv_type), without
  // allocating it.
  static size_t BytesFor(const ModelDims& d, int batch, int n_ctx, bool typed = false,
                         GgmlType kv_type = GgmlType::kF32);
  // K/V rows a decode step converts to f32 at a time (kv_type not f32).
  static constexpr int kDecodeKvRows = 32;
  // Floats of one dequantized prefill panel (rows × cols ≤ this).
  static constexpr size_t kPanelFloats = size_t{1} << 20;  // 4 MiB

  AlignedFloats x;       // [batch, hidden]      residual stream
  AlignedFloats xn;      // [batch, hidden]      normed input of a sub-layer
  AlignedFloats qkv;     // [batch, qkv_dim]     q | k | v per token
  AlignedFloats attn;    // [batch, q_dim]       attention output
  AlignedFloats gu;      // [batch, 2 × inter]   gate | up per token
  AlignedFloats act;     // [batch, inter]       silu(gate) · up
  AlignedFloats scores;  // [max(batch, n_heads), n_ctx] attention probabilities
                         // (prefill: [batch, L] of one head; decode: [n_heads, L])
  AlignedFloats xq;      // typed: [3 × max(hidden, q_dim, inter)] quantized activations
  AlignedFloats panel;   // typed and batch > 1: [kPanelFloats] dequantized rows
  AlignedFloats xa;      // typed and batch > 1: a chunk's quantized activations,
                         // quant_gemm.h's layout for [batch, max(hidden, q_dim, inter)]
  AlignedFloats kvf;     // kv_type not f32: [max(2 × n_ctx × head_dim,
                         //   kDecodeKvRows × kv_dim)] K/V rows as f32

 private:
  int batch_ = 0;
};

// The RoPE inverse frequencies [head_dim / 2] in radians per position:
// theta^(−2i/head_dim), then config.rope_scaling applied as transformers'
// ROPE_INIT_FUNCTIONS do ("linear": / factor; "llama3": the three wavelength
// bands, see forward.cc Note [Llama 3 RoPE scaling]), then divided by
// config.rope_scaling.freq_factors[i] when there are any (GGUF rope_freqs).
// REQUIRES: head_dim even and > 0; config.rope_scaling as ParseModelConfig
// validates it.
std::vector<double> RopeInverseFrequencies(const ModelConfig& config, int head_dim);

class Decoder {
 public:
  // `n_ctx`: the largest position + 1 any KV cache will hold. `n_threads`:
  // threads for decode's matrix-vector products (the caller + a pool of
  // n_threads − 1), also used by prefill's integer products and panel
  // dequantization. Prefill's sgemm uses OpenBLAS's own thread count.
  // `has_lm_head`: whether the weights it will be given can produce logits.
  // REQUIRES: DimsOf(config) valid (PlanComputeLayout accepted it).
  // `end_layer` (−1: n_layers): a split's host part (Note [Partial
  // offload] in split_compute.cc) runs layers [0, end_layer) only, through
  // ForwardHidden; its KV caches hold end_layer layers.
  Decoder(const ModelConfig& config, bool has_lm_head, int n_ctx, int n_threads = 1,
          int end_layer = -1);

  const ModelConfig& config() const { return config_; }
  const ModelDims& dims() const { return dims_; }
  bool has_lm_head() const { return has_lm_head_; }
  int n_ctx() const { return n_ctx_; }

  // Runs `tokens` [n] at positions [pos, pos + n) with weights `w`, writing
  // their K/V into `kv`.
  // REQUIRES: `w` bound from the layout of this decoder's config (same
  // dims) and valid for the whole call; n ≥ 1; pos + n ≤ kv.n_ctx() ≤
  // n_ctx(); every token in [0, vocab); positions [0, pos) of `kv` hold this
  // sequence's K/V (computed with the same weights); logits outputs require
  // has_lm_head(); `s` made with typed = w.typed() and kv.type().
  void Forward(const ModelWeights& w, KvCache& kv, ForwardScratch& s, const int32_t* tokens, int n,
               int pos, const ForwardOutputs& out) const;
  // One chunk of a split's host part: the embedding and layers [0,
  // end_layer) for `tokens` [nt], the residual stream leaving the last of
  // them into `x` [nt, hidden]. `w` needs only those layers and the
  // embedding. REQUIRES: as Forward; nt ≤ s.batch(); kv.n_layers() ==
  // end_layer.
  void ForwardHidden(const ModelWeights& w, KvCache& kv, ForwardScratch& s, const int32_t* tokens,
                     int nt, int pos, float* x) const;
  // The layers this decoder runs: [0, end_layer()).
  int end_layer() const { return end_layer_; }

 private:
  // One chunk of nt ≤ s.batch() tokens.
  void ForwardChunk(const ModelWeights& w, KvCache& kv, ForwardScratch& s, const int32_t* tokens,
                    int nt, int pos, bool need_all_rows) const;
  void Attention(KvCache& kv, ForwardScratch& s, int layer, int nt, int pos) const;
  // y[t·ldy + r] = Σ_j W[r, j] · x[t·W.cols + j] (+= when `accumulate`) for
  // t < nt, r < W.rows: the matrix-vector pool for nt == 1; for nt > 1 sgemm
  // or the integer product (Note [Prefill on typed weights] in forward.cc).
  void Project(const WeightMatrix& w, ForwardScratch& s, const float* x, int nt, float* y,
               int ldy, bool accumulate) const;
  void Rope(float* head, int pos) const;

  const ModelConfig config_;
  const ModelDims dims_;
  const bool has_lm_head_;
  const int n_ctx_;
  const int end_layer_;  // ≤ dims_.n_layers; < only for a split's host part
  std::unique_ptr<MatVecPool> pool_;  // Run() is thread-safe
  AlignedFloats rope_cos_;  // [n_ctx, head_dim / 2]
  AlignedFloats rope_sin_;  // [n_ctx, head_dim / 2]
};

}  // namespace arbiter::engine_internal
