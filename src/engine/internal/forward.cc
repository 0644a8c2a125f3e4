// engine/internal/forward.cc — see forward.h for the layer equations.
//
// Note [Prefill vs decode kernels]
// A chunk of nt > 1 tokens turns every projection into one sgemm (the weight
// matrix is read once per chunk, so prefill is compute-bound). nt == 1 is
// decode: each weight matrix is streamed once through sgemv and the step is
// memory-bandwidth-bound; the fused wqkv / w_gate_up matrices (see
// model_weights.h) halve the number of calls. Attention for a chunk runs per
// head and per tile of 64 query rows as S = scale·Q·Kᵀ over the L = pos +
// tile end positions the tile can see, masks j > pos + i, softmaxes each row
// and computes O = P·V; masked entries inside the tile's diagonal block are
// computed and discarded. For decode
// the loops visit each K/V row once for all heads.
//
// Note [Decode attention access order]
// By the time a decode step reaches attention, the whole model's weights,
// streamed since the previous step, have evicted the KV cache from every
// cache level, so K/V come from DRAM. Walking positions in the outer loop
// and heads in the inner loop reads K (then V) as one sequential stream of
// [kv_dim] rows, which the hardware prefetcher follows; a head-outer order
// reads head_dim-wide pieces at a kv_dim stride, n_kv_heads times over, and
// stalls on misses.
//
// Note [Decode matvec]
// Decode's y = W·x does not use cblas_sgemv: it runs as one Dot per row, in
// row order, so each thread reads its rows as a single sequential stream,
// which sustains more bandwidth on one core than OpenBLAS 0.3.21's sgemv
// kernel (which interleaves four rows); OpenBLAS's 2-thread sgemv was slower
// still (docs/BENCHMARKS.md "Engine benchmarks", "Optimizations made"). Rows
// are split across the decoder's MatVecPool (matvec_pool.h).
//
// Note [Prefill on typed weights]
// A chunk's projection (nt > 1 tokens) through a matrix that is not f32 takes
// one of two paths, chosen per segment type by PrefillIsInteger:
//   - Integer (Q4_K, Q5_K, Q6_K on the AVX2 path): the chunk's nt rows of x
//     are quantized once into the type's activation type (Q8_K; quant_gemm.h,
//     the same 8-bit blocks decode uses, Note [Activation quantization] in
//     quant.cc), tokens split across the decoder's MatVecPool; then
//     GemmRows computes tiles of 1 row × 8 tokens in integers on the stored
//     blocks, the rows cut into chunks of about kGemmChunkBytes of weights
//     and split across the pool. Each unpacked weight block (nibbles, high
//     bits, the sub-block scales as i16 multipliers) serves 8 tokens, and the
//     float work (d·d_x, the mins) is done once per 256 elements for 4
//     tokens at once.
//   - Dequantize + sgemm (every other type): panels of at most
//     ForwardScratch::kPanelFloats floats (4 MiB) are dequantized to f32,
//     rows split across the pool, then one sgemm per panel (OpenBLAS's
//     threads). Larger panels mean fewer sgemm calls, each of which packs the
//     chunk's activations again (512 KiB panels measured slower than 4 MiB
//     on demo-chat Q4_K_M; 8 MiB no better).
// Why the split: without AVX-VNNI, an 8-bit product is maddubs (u8 × i8 →
// i16 pairs) plus madd (→ i32), and on the machines measured (Zen 3, no
// VNNI) that pair sustains only somewhat more multiply-adds per cycle than
// f32 FMA, which OpenBLAS's sgemm runs near peak: there is little room for
// per-block overhead. The K-quants carry their sub-block scales as small
// integers, so a 32-element sub-block costs maddubs, madd-by-scale and an
// add per token, and floats appear once per 256: the tile kernel beats
// dequantize + sgemm. The 32-element types (Q4_0, Q5_0, Q8_0, Q4_1, Q5_1)
// have an f16 scale per 32 elements, so each block and token also needs an
// int→float conversion and an FMA (Q8_0 a sign operation too); their tile
// kernels (kept in quant_gemm_avx2.cc, and used by GemmRows) measured
// slower than dequantize + sgemm, so prefill does not use them; nor Q8_K
// weights (no tile kernel). `arbiter bench kernels` measures both ways per
// type (its prefill columns); docs/BENCHMARKS.md ("Prefill on the stored
// blocks") has the figures. The integer path rounds x to 8 bits as decode
// does (gguf_reference_test.cc bounds both against a float64 reference);
// the sgemm path keeps x in f32.
// Scratch: the panel (typed and batch > 1) and the quantized activations
// (ForwardScratch::xa) are part of each slot's scratch, charged to the
// ledger with it.
//
// Note [KV cache types]
// The KV cache holds each K and V row in the slot's kv_type (f16 by default;
// bf16, q8_0 or f32 by choice: arbiter/engine/kv_snapshot.h), converted
// from f32 once when the token's row is computed (StoreKvRow), so the
// slot, its snapshots and its KV files hold the same bytes. Attention reads
// the rows as stored and converts them to f32 right before use, into the
// small s.kvf buffer:
//   - decode converts kDecodeKvRows (32) rows at a time, so the K (then V)
//     rows still stream once in position order (Note [Decode attention
//     access order]), at half (f16, bf16) or ~0.27× (q8_0) the f32 bytes;
//     each converted block is read from L1 by every head.
//   - prefill converts, per KV head, its [L, head_dim] columns of every row
//     once per chunk, then runs the same two sgemm per query head and tile
//     on them: the conversion is ~L·head_dim values per KV head against
//     ~2·nt·L·head_dim multiply-adds per query head, well under 1 %.
// So the scratch grows by max(2·n_ctx·head_dim, 32·kv_dim) floats per slot
// while the cache shrinks by n_layers·2·n_ctx·kv_dim·(4 − bytes per value).
// The current token's own K/V are also read back from the stored type:
// prefill and decode see the same numbers, as llama.cpp does with its f16
// cache. q8_0 needs head_dim to be a multiple of 32 (per-head blocks), which
// Engine::Load checks. f32 keeps the unconverted path of before.
//
// Note [Residual in place]
// o_proj and down_proj accumulate into the residual stream with beta = 1,
// so no separate add pass or temporary is needed.
//
// Note [Llama 3 RoPE scaling]
// Llama 3.1+ stretches its context 8× by slowing only the low-frequency RoPE
// channels. With wavelen_i = 2π / inv_freq_i (positions per full turn) and
// the pre-training context C = original_max_position_embeddings:
//   wavelen > C / low_freq_factor    (long waves)   inv_freq / factor
//   wavelen < C / high_freq_factor   (short waves)  inv_freq unchanged
//   otherwise, with s = (C / wavelen − low_freq_factor) /
//                       (high_freq_factor − low_freq_factor) ∈ [0, 1],
//                                                   (1 − s) · inv_freq / factor
//                                                   + s · inv_freq
// so the middle band interpolates continuously between the two (s = 0 at the
// long end, s = 1 at the short end). This is transformers'
// `_compute_llama3_parameters`; scripts/reference_logits.py implements the
// same rule independently in numpy.
#include "engine/internal/forward.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numbers>

#include "engine/internal/quant.h"
#include "engine/internal/quant_gemm.h"
#include "engine/internal/vec_ops.h"

namespace arbiter::engine_internal {
namespace {

// Query rows per prefill attention tile (see Decoder::Attention).
constexpr int kAttnTile = 64;

// Note [Prefill on typed weights]: the work units of prefill's parallel loops.
constexpr int kPrepareTokens = 16;        // tokens quantized per chunk
constexpr size_t kGemmChunkBytes = 8192;  // weight bytes per chunk of the integer product,
constexpr size_t kGemmMinChunkRows = 8;   // as rows, clamped to [8, 64]
constexpr size_t kGemmMaxChunkRows = 64;
constexpr int kDequantChunkRows = 64;     // rows dequantized per chunk

// Whether prefill through weights of `type` quantizes the activations and
// computes in integers (quant_gemm.h) rather than dequantizing panels for
// sgemm (Note [Prefill on typed weights]).
bool PrefillIsInteger(GgmlType type) {
  switch (type) {
    case GgmlType::kQ4_K:
    case GgmlType::kQ5_K:
    case GgmlType::kQ6_K:
      return HasGemmTileKernel(type);
    default:
      return false;
  }
}

}  // namespace

std::vector<double> RopeInverseFrequencies(const ModelConfig& config, int head_dim) {
  const int half = head_dim / 2;
  const double theta = config.rope_theta;
  const RopeScaling& rs = config.rope_scaling;
  const double factor = rs.factor;
  std::vector<double> inv_freq(half);
  for (int i = 0; i < half; ++i) {
    const double base = std::pow(theta, -2.0 * i / head_dim);
    switch (rs.type) {
      case RopeScalingType::kNone:
        inv_freq[i] = base;
        break;
      case RopeScalingType::kLinear:
        inv_freq[i] = base / factor;
        break;
      case RopeScalingType::kLlama3: {  // Note [Llama 3 RoPE scaling]
        const double context = rs.original_max_position_embeddings;
        const double low = rs.low_freq_factor, high = rs.high_freq_factor;
        const double wavelen = 2.0 * std::numbers::pi / base;
        if (wavelen > context / low) {
          inv_freq[i] = base / factor;
        } else if (wavelen < context / high) {
          inv_freq[i] = base;
        } else {
          const double smooth = (context / wavelen - low) / (high - low);
          inv_freq[i] = (1.0 - smooth) * base / factor + smooth * base;
        }
        break;
      }
    }
    if (!rs.freq_factors.empty()) inv_freq[i] /= rs.freq_factors[i];  // GGUF rope_freqs
  }
  return inv_freq;
}

void KvCache::CopyRowsFrom(const KvCache& src, int begin, int end) {
  const size_t bytes = static_cast<size_t>(end - begin) * row_bytes_;
  if (bytes == 0) return;
  const size_t at = static_cast<size_t>(begin) * row_bytes_;
  for (int l = 0; l < n_layers_; ++l) {
    std::memcpy(k(l) + at, src.k(l) + at, bytes);
    std::memcpy(v(l) + at, src.v(l) + at, bytes);
  }
}

void KvCache::ReadRows(int n, uint8_t* out) const {
  const size_t block = static_cast<size_t>(n) * row_bytes_;  // bytes of n rows
  if (block == 0) return;
  for (int l = 0; l < n_layers_; ++l) {
    std::memcpy(out + (2 * l) * block, k(l), block);
    std::memcpy(out + (2 * l + 1) * block, v(l), block);
  }
}

void KvCache::WriteRows(int n, const uint8_t* in) {
  const size_t block = static_cast<size_t>(n) * row_bytes_;
  if (block == 0) return;
  for (int l = 0; l < n_layers_; ++l) {
    std::memcpy(k(l), in + (2 * l) * block, block);
    std::memcpy(v(l), in + (2 * l + 1) * block, block);
  }
}

namespace {

size_t XqFloats(const ModelDims& d, bool typed) {
  return typed ? size_t{3} * std::max({d.hidden, d.q_dim, d.inter}) : 0;
}
size_t PanelFloats(int batch, bool typed) {
  return typed && batch > 1 ? ForwardScratch::kPanelFloats : 0;
}
// Room for GemmActivationBytes of any projection's input (at most
// nt × (cols × 11/8 + 64) bytes, quant_gemm.h), in floats.
size_t XaFloats(const ModelDims& d, int batch, bool typed) {
  if (!typed || batch <= 1) return 0;
  const size_t cols = static_cast<size_t>(std::max({d.hidden, d.q_dim, d.inter}));
  return (static_cast<size_t>(batch) * (cols * 11 / 8 + 64) + 3) / 4;
}
size_t KvFloats(const ModelDims& d, int n_ctx, GgmlType kv_type) {
  if (kv_type == GgmlType::kF32) return 0;
  return std::max(size_t{2} * n_ctx * d.head_dim,
                  size_t{1} * ForwardScratch::kDecodeKvRows * d.kv_dim);
}

// Writes one K or V row x [n] into the cache row `dst` in `type` (Note [KV
// cache types]).
void StoreKvRow(GgmlType type, const float* x, int n, uint8_t* dst) {
  switch (type) {
    case GgmlType::kF32:
      std::memcpy(dst, x, sizeof(float) * n);
      return;
    case GgmlType::kQ8_0:
      // The Q8_0 activation quantizer is the Q8_0 block format (vectorized).
      PrepareActivation(GgmlType::kQ8_0, x, n, dst);
      return;
    default:
      (void)QuantizeRow(type, x, n, dst);  // f16 / bf16: checked at load, cannot fail
      return;
  }
}

}  // namespace

ForwardScratch::ForwardScratch(const ModelDims& d, int batch, int n_ctx, bool typed,
                               GgmlType kv_type)
    : x(size_t{1} * batch * d.hidden),
      xn(size_t{1} * batch * d.hidden),
      qkv(size_t{1} * batch * d.qkv_dim),
      attn(size_t{1} * batch * d.q_dim),
      gu(size_t{2} * batch * d.inter),
      act(size_t{1} * batch * d.inter),
      scores(size_t{1} * std::max(batch, d.n_heads) * n_ctx),
      xq(XqFloats(d, typed)),
      panel(PanelFloats(batch, typed)),
      xa(XaFloats(d, batch, typed)),
      kvf(KvFloats(d, n_ctx, kv_type)),
      batch_(batch) {}

size_t ForwardScratch::bytes() const {
  return x.size_bytes() + xn.size_bytes() + qkv.size_bytes() + attn.size_bytes() +
         gu.size_bytes() + act.size_bytes() + scores.size_bytes() + xq.size_bytes() +
         panel.size_bytes() + xa.size_bytes() + kvf.size_bytes();
}

size_t ForwardScratch::BytesFor(const ModelDims& d, int batch, int n_ctx, bool typed,
                                GgmlType kv_type) {
  const size_t floats = size_t{1} * batch * d.hidden * 2 + size_t{1} * batch * d.qkv_dim +
                        size_t{1} * batch * d.q_dim + size_t{2} * batch * d.inter +
                        size_t{1} * batch * d.inter +
                        size_t{1} * std::max(batch, d.n_heads) * n_ctx + XqFloats(d, typed) +
                        PanelFloats(batch, typed) + XaFloats(d, batch, typed) +
                        KvFloats(d, n_ctx, kv_type);
  return floats * sizeof(float);
}

void Decoder::Project(const WeightMatrix& w, ForwardScratch& s, const float* x, int nt, float* y,
                      int ldy, bool accumulate) const {
  if (nt == 1) {
    // Each segment's activation type once (Note [Activation quantization]
    // in quant.cc); f32 activations are x itself.
    const void* xa[3] = {x, x, x};
    uint8_t* free_bytes = reinterpret_cast<uint8_t*>(s.xq.data());
    for (int k = 0; k < w.n_segments; ++k) {
      const GgmlType at = ActivationType(w.segments[k].type);
      if (at == GgmlType::kF32) continue;
      int same = -1;
      for (int j = 0; j < k; ++j) {
        if (ActivationType(w.segments[j].type) == at) same = j;
      }
      if (same >= 0) {
        xa[k] = xa[same];
        continue;
      }
      PrepareActivation(w.segments[k].type, x, w.cols, free_bytes);
      xa[k] = free_bytes;
      free_bytes += *GgmlRowBytes(at, w.cols);
    }
    pool_->Run(w, xa, accumulate, y);
    return;
  }
  const float beta = accumulate ? 1.0f : 0.0f;
  GgmlType prepared = GgmlType::kF32;  // the activation type s.xa holds
  int row0 = 0;
  for (int k = 0; k < w.n_segments; row0 += w.segments[k].rows, ++k) {
    const MatrixSegment& seg = w.segments[k];
    if (seg.type == GgmlType::kF32) {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, nt, seg.rows, w.cols, 1.0f, x, w.cols,
                  reinterpret_cast<const float*>(seg.data), w.cols, beta, y + row0, ldy);
      continue;
    }
    if (PrefillIsInteger(seg.type)) {
      // Note [Prefill on typed weights]: x quantized once per activation
      // type, then tiles of rows × tokens in integers, rows split across
      // the pool.
      void* xa = s.xa.data();
      if (ActivationType(seg.type) != prepared) {
        pool_->ParallelFor(nt, kPrepareTokens, [&](int t0, int t1) {
          PrepareGemmActivations(seg.type, x, w.cols, t0, t1, nt, xa);
        });
        prepared = ActivationType(seg.type);
      }
      const size_t row_bytes = *GgmlRowBytes(seg.type, w.cols);
      const int chunk = static_cast<int>(
          std::clamp<size_t>(kGemmChunkBytes / row_bytes, kGemmMinChunkRows, kGemmMaxChunkRows));
      float* yseg = y + row0;
      pool_->ParallelFor(seg.rows, chunk, [&](int r0, int r1) {
        GemmRows(seg.type, seg.data, w.cols, xa, nt, r0, r1, yseg + r0, ldy, accumulate);
      });
      continue;
    }
    // Note [Prefill on typed weights]: panels of rows dequantized to f32
    // (split across the pool), then sgemm.
    const int panel_rows =
        std::max(1, static_cast<int>(ForwardScratch::kPanelFloats / static_cast<size_t>(w.cols)));
    float* panel = s.panel.data();
    for (int p0 = 0; p0 < seg.rows; p0 += panel_rows) {
      const int p1 = std::min(seg.rows, p0 + panel_rows);
      pool_->ParallelFor(p1 - p0, kDequantChunkRows, [&](int r0, int r1) {
        DequantizeRows(seg.type, seg.data, w.cols, p0 + r0, p0 + r1,
                       panel + static_cast<size_t>(r0) * w.cols);
      });
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, nt, p1 - p0, w.cols, 1.0f, x, w.cols,
                  panel, w.cols, beta, y + row0 + p0, ldy);
    }
  }
}

Decoder::Decoder(const ModelConfig& config, bool has_lm_head, int n_ctx, int n_threads,
                 int end_layer)
    : config_(config), dims_(DimsOf(config)), has_lm_head_(has_lm_head), n_ctx_(n_ctx),
      end_layer_(end_layer < 0 ? dims_.n_layers : std::min(end_layer, dims_.n_layers)),
      pool_(std::make_unique<MatVecPool>(std::max(1, n_threads))) {
  const int half = dims_.head_dim / 2;
  rope_cos_.Resize(size_t{1} * n_ctx * half);
  rope_sin_.Resize(size_t{1} * n_ctx * half);
  const std::vector<double> inv_freq = RopeInverseFrequencies(config_, dims_.head_dim);
  for (int i = 0; i < half; ++i) {
    for (int p = 0; p < n_ctx; ++p) {
      const double angle = p * inv_freq[i];
      rope_cos_[size_t{1} * p * half + i] = static_cast<float>(std::cos(angle));
      rope_sin_[size_t{1} * p * half + i] = static_cast<float>(std::sin(angle));
    }
  }
}

void Decoder::Rope(float* head, int pos) const {
  const int half = dims_.head_dim / 2;
  const float* c = rope_cos_.data() + size_t{1} * pos * half;
  const float* s = rope_sin_.data() + size_t{1} * pos * half;
  float* a = head;
  float* b = head + half;
  for (int i = 0; i < half; ++i) {
    const float x0 = a[i], x1 = b[i];
    a[i] = x0 * c[i] - x1 * s[i];
    b[i] = x1 * c[i] + x0 * s[i];
  }
}

void Decoder::Forward(const ModelWeights& w, KvCache& kv, ForwardScratch& s,
                      const int32_t* tokens, int n, int pos, const ForwardOutputs& out) const {
  const ModelDims& d = dims_;
  const bool need_all_rows = out.all_logits != nullptr || out.hidden_sum != nullptr;
  for (int c = 0; c < n; c += s.batch()) {
    const int nt = std::min(s.batch(), n - c);
    const bool last_chunk = c + nt == n;
    ForwardChunk(w, kv, s, tokens + c, nt, pos + c, need_all_rows);
    // s.xn holds final-normed rows: all nt when need_all_rows, else the last.
    if (out.hidden_sum != nullptr) {
      for (int t = 0; t < nt; ++t) {
        const float* row = s.xn.data() + size_t{1} * t * d.hidden;
        for (int i = 0; i < d.hidden; ++i) out.hidden_sum[i] += row[i];
      }
    }
    if (out.all_logits != nullptr) {
      float* dst = out.all_logits + size_t{1} * c * d.vocab;
      Project(w.output(), s, s.xn.data(), nt, dst, d.vocab, false);
      if (last_chunk && out.last_logits != nullptr) {
        std::memcpy(out.last_logits, dst + size_t{1} * (nt - 1) * d.vocab,
                    sizeof(float) * d.vocab);
      }
    } else if (last_chunk && out.last_logits != nullptr) {
      const int row = need_all_rows ? nt - 1 : 0;
      Project(w.output(), s, s.xn.data() + size_t{1} * row * d.hidden, 1, out.last_logits,
              d.vocab, false);
    }
  }
}

void Decoder::ForwardHidden(const ModelWeights& w, KvCache& kv, ForwardScratch& s,
                            const int32_t* tokens, int nt, int pos, float* x) const {
  ForwardChunk(w, kv, s, tokens, nt, pos, /*need_all_rows=*/true);
  std::memcpy(x, s.x.data(), sizeof(float) * nt * dims_.hidden);
}

void Decoder::ForwardChunk(const ModelWeights& w, KvCache& kv, ForwardScratch& s,
                           const int32_t* tokens, int nt, int pos, bool need_all_rows) const {
  const ModelDims& d = dims_;
  const int H = d.hidden, I = d.inter, Q = d.q_dim, KV = d.kv_dim, QKV = d.qkv_dim,
            HD = d.head_dim;
  const float eps = config_.rms_norm_eps;
  float* x = s.x.data();      // [nt, H]
  float* xn = s.xn.data();    // [nt, H]
  float* qkv = s.qkv.data();  // [nt, QKV]
  float* gu = s.gu.data();    // [nt, 2I]
  float* act = s.act.data();  // [nt, I]

  for (int t = 0; t < nt; ++t) w.embed.RowToF32(tokens[t], x + size_t{1} * t * H);

  for (int li = 0; li < end_layer_; ++li) {
    const LayerWeights& L = w.layers[li];

    // --- attention block
    for (int t = 0; t < nt; ++t) {
      RmsNorm(x + size_t{1} * t * H, L.attn_norm.data(), eps, H, xn + size_t{1} * t * H);
    }
    Project(L.wqkv, s, xn, nt, qkv, QKV, false);
    uint8_t* kc = kv.k(li);  // [n_ctx] rows
    uint8_t* vc = kv.v(li);  // [n_ctx] rows
    const size_t row_bytes = kv.row_bytes();
    for (int t = 0; t < nt; ++t) {
      float* row = qkv + size_t{1} * t * QKV;
      if (!L.bqkv.empty()) {
        const float* b = L.bqkv.data();
        for (int i = 0; i < QKV; ++i) row[i] += b[i];
      }
      if (!L.q_norm.empty()) {
        for (int h = 0; h < d.n_heads; ++h) RmsNorm(row + h * HD, L.q_norm.data(), eps, HD, row + h * HD);
        for (int g = 0; g < d.n_kv_heads; ++g) {
          RmsNorm(row + Q + g * HD, L.k_norm.data(), eps, HD, row + Q + g * HD);
        }
      }
      for (int h = 0; h < d.n_heads; ++h) Rope(row + h * HD, pos + t);
      for (int g = 0; g < d.n_kv_heads; ++g) Rope(row + Q + g * HD, pos + t);
      StoreKvRow(kv.type(), row + Q, KV, kc + (pos + t) * row_bytes);
      StoreKvRow(kv.type(), row + Q + KV, KV, vc + (pos + t) * row_bytes);
    }
    Attention(kv, s, li, nt, pos);
    // x += attn · Woᵀ  (Note [Residual in place])
    Project(L.wo, s, s.attn.data(), nt, x, H, true);

    // --- MLP block
    for (int t = 0; t < nt; ++t) {
      RmsNorm(x + size_t{1} * t * H, L.ffn_norm.data(), eps, H, xn + size_t{1} * t * H);
    }
    Project(L.w_gate_up, s, xn, nt, gu, 2 * I, false);
    for (int t = 0; t < nt; ++t) {
      const float* g = gu + size_t{2} * t * I;
      const float* u = g + I;
      float* a = act + size_t{1} * t * I;
      for (int i = 0; i < I; ++i) a[i] = g[i] / (1.0f + ExpF(-g[i])) * u[i];
    }
    Project(L.w_down, s, act, nt, x, H, true);
  }
  // A split's host part ends with the residual stream (ForwardHidden).
  if (end_layer_ < d.n_layers) return;

  // Final norm into xn: every row when needed, else only the last (into row 0).
  if (need_all_rows) {
    for (int t = 0; t < nt; ++t) {
      RmsNorm(x + size_t{1} * t * H, w.final_norm.data(), eps, H, xn + size_t{1} * t * H);
    }
  } else {
    RmsNorm(x + size_t{1} * (nt - 1) * H, w.final_norm.data(), eps, H, xn);
  }
}

void Decoder::Attention(KvCache& kv, ForwardScratch& s, int li, int nt, int pos) const {
  const ModelDims& d = dims_;
  const int Q = d.q_dim, KV = d.kv_dim, QKV = d.qkv_dim, HD = d.head_dim;
  const int group = d.n_heads / d.n_kv_heads;  // query heads per KV head
  const int L = pos + nt;                      // positions visible to the last token
  const float scale = 1.0f / std::sqrt(static_cast<float>(HD));
  const GgmlType type = kv.type();
  const bool f32 = type == GgmlType::kF32;
  const size_t row_bytes = kv.row_bytes();
  const uint8_t* kc = kv.k(li);
  const uint8_t* vc = kv.v(li);
  float* out = s.attn.data();  // [nt, Q]

  if (nt == 1) {
    // Decode: one sequential pass over the K rows, then one over the V rows
    // (each row [kv_dim] is read once for every head; Note [Decode attention
    // access order]). sc: [n_heads, L]. Rows not in f32 are converted
    // kDecodeKvRows at a time into s.kvf (Note [KV cache types]).
    const float* q = s.qkv.data();
    float* sc = s.scores.data();
    constexpr int kRows = ForwardScratch::kDecodeKvRows;
    // Rows [j0, j1) of `cache` as f32 [j1 − j0, KV]: in place, or converted.
    auto rows_f32 = [&](const uint8_t* cache, int j0, int j1) -> const float* {
      if (f32) return reinterpret_cast<const float*>(cache) + size_t{1} * j0 * KV;
      DequantizeRows(type, cache, KV, j0, j1, s.kvf.data());
      return s.kvf.data();
    };
    for (int j0 = 0; j0 < L; j0 += kRows) {
      const int j1 = std::min(L, j0 + kRows);
      const float* rows = rows_f32(kc, j0, j1);
      for (int j = j0; j < j1; ++j) {
        const float* krow = rows + size_t{1} * (j - j0) * KV;
        for (int h = 0; h < d.n_heads; ++h) {
          sc[size_t{1} * h * L + j] = Dot(q + h * HD, krow + (h / group) * HD, HD) * scale;
        }
      }
    }
    for (int h = 0; h < d.n_heads; ++h) Softmax(sc + size_t{1} * h * L, L);
    std::memset(out, 0, sizeof(float) * Q);
    for (int j0 = 0; j0 < L; j0 += kRows) {
      const int j1 = std::min(L, j0 + kRows);
      const float* rows = rows_f32(vc, j0, j1);
      for (int j = j0; j < j1; ++j) {
        const float* vrow = rows + size_t{1} * (j - j0) * KV;
        for (int h = 0; h < d.n_heads; ++h) {
          Axpy(sc[size_t{1} * h * L + j], vrow + (h / group) * HD, out + h * HD, HD);
        }
      }
    }
    return;
  }

  // Prefill, per KV head g: its K and V columns [L, HD] (in place when f32,
  // stride kv_dim; else converted into s.kvf, stride head_dim), then for
  // each of its query heads, row tiles of kAttnTile queries; tile [t0, t1)
  // sees positions [0, pos + t1), so the masked upper triangle is mostly
  // skipped.
  float* S = s.scores.data();  // [tile rows, Lt]
  const size_t head_bytes = f32 ? 0 : KvRowBytes(type, HD);
  for (int g = 0; g < d.n_kv_heads; ++g) {
    const float* kg = s.kvf.data();
    const float* vg = s.kvf.data();
    int ld = KV;
    if (f32) {
      kg = reinterpret_cast<const float*>(kc) + g * HD;
      vg = reinterpret_cast<const float*>(vc) + g * HD;
    } else {
      float* kf = s.kvf.data();                           // [L, HD]
      float* vf = s.kvf.data() + s.kvf.size() / 2;         // [L, HD]
      DequantizeStridedRows(type, kc + g * head_bytes, row_bytes, HD, L, kf);
      DequantizeStridedRows(type, vc + g * head_bytes, row_bytes, HD, L, vf);
      kg = kf;
      vg = vf;
      ld = HD;
    }
    for (int h = g * group; h < (g + 1) * group; ++h) {
      for (int t0 = 0; t0 < nt; t0 += kAttnTile) {
        const int rows = std::min(kAttnTile, nt - t0);
        const int Lt = pos + t0 + rows;
        // S = scale · Q_h [rows, HD] · K_gᵀ [HD, Lt]
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, Lt, HD, scale,
                    s.qkv.data() + size_t{1} * t0 * QKV + h * HD, QKV, kg, ld, 0.0f, S, Lt);
        for (int t = 0; t < rows; ++t) {
          float* row = S + size_t{1} * t * Lt;
          const int visible = pos + t0 + t + 1;
          Softmax(row, visible);
          std::memset(row + visible, 0, sizeof(float) * (Lt - visible));
        }
        // O_h [rows, HD] = P [rows, Lt] · V_g [Lt, HD]
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, HD, Lt, 1.0f, S, Lt, vg, ld,
                    0.0f, out + size_t{1} * t0 * Q + h * HD, Q);
      }
    }
  }
}

}  // namespace arbiter::engine_internal
