// engine/internal/model_weights.h — a Llama-family decoder's compute layout
// (the weight buffers the forward pass reads, each in the type it computes
// in) and views of those buffers.
//
// The engine never owns weight memory (docs/architecture.md "Weight tiers"):
// a WeightCache holds the buffers and hands the engine a WeightLease per
// request. This file describes what those buffers are and how they are made:
//   - PlanComputeLayout validates the checkpoint against the ModelConfig —
//     every tensor the architecture needs must be present with exactly the
//     expected shape, headers only — and plans the compute buffers
//     (`ComputeLayout::buffers`, WeightSpecs) and where each safetensors
//     tensor goes in them (buffer index, byte offset).
//   - FillComputeLayout copies every tensor into its slice, converting it
//     only when the buffer's type differs from the stored one: the
//     WeightFill of the model's WeightCache registration.
//   - BindModelWeights turns the buffers' addresses (a lease's tensors) into
//     a ModelWeights of non-owning views: cheap, once per request.
// Two fusions are made so decode issues fewer, larger matrix-vector products:
//   wqkv      = [q_proj; k_proj; v_proj]   rows concatenated (bias: bqkv)
//   w_gate_up = [gate_proj; up_proj]       rows concatenated
// (row-major [out, in] matrices concatenated along `out` are contiguous).
// A group whose parts are computed in different types (a Q4_K_M file's
// Q4_K q/k and Q6_K v) keeps one buffer per part instead ("wq", "wk", "wv";
// "w_gate", "w_up"); the forward pass sees one WeightMatrix either way.
//
// Note [Compute types]
// Matrices (the embedding table, projections, lm_head) are computed in the
// type they are stored in (issue 13): F32, F16 and BF16 from safetensors,
// and any type quant.h computes from GGUF. Norm weights and biases are
// always F32 (they are tiny and read once per token). ComputeOptions::f32
// (`[[models]] compute_dtype = "f32"`) converts every matrix to F32 instead,
// as arbiter did before; so does a safetensors dtype other than F32, F16 or
// BF16.
//
// Buffer order and names (Engine::WeightModelFor documents the same order):
//   model.embed                         [vocab, hidden]
//   per layer i, p = "model.layers.<i>.":
//     p attn_norm                       [hidden]
//     p wqkv                            [q_dim + 2 × kv_dim, hidden]
//     p bqkv                            [q_dim + 2 × kv_dim]   attention_bias only
//     p q_norm, p k_norm                [head_dim]             qk_norm only
//     p wo                              [hidden, q_dim]
//     p ffn_norm                        [hidden]
//     p w_gate_up                       [2 × intermediate, hidden]
//     p w_down                          [hidden, intermediate]
//   model.final_norm                    [hidden]
//   model.lm_head                       [vocab, hidden]        unless tied / headless
// (the order of the tensors in arbiter/formats/llama_tensors.h, one buffer
// per fused group, created at its first tensor).
//
// Tensor names follow Hugging Face: "model.embed_tokens.weight",
// "model.layers.{i}.self_attn.{q,k,v,o}_proj.weight" (+ ".bias" for q/k/v when
// config.attention_bias), "model.layers.{i}.self_attn.{q,k}_norm.weight" (when
// config.qk_norm), "model.layers.{i}.mlp.{gate,up,down}_proj.weight",
// "model.layers.{i}.{input,post_attention}_layernorm.weight",
// "model.norm.weight", "lm_head.weight" (absent when tied). Headless
// checkpoints (architectures "*Model") omit the "model." prefix and may have
// no lm_head. Extra tensors (e.g. rotary inv_freq) are ignored.
//
// Thread safety: ComputeLayout and ModelWeights are immutable values;
// thread-safe reads. FillComputeLayout writes only `arrays`.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "arbiter/formats/ggml_type.h"
#include "arbiter/formats/gguf.h"
#include "arbiter/formats/llama_tensors.h"

#include "arbiter/base/status.h"
#include "arbiter/formats/model_config.h"
#include "arbiter/formats/safetensors.h"
#include "arbiter/weights/weight_files.h"

namespace arbiter::engine_internal {

// A read-only view of `size` floats owned elsewhere (a WeightLease's tensor).
class FloatView {
 public:
  FloatView() = default;
  FloatView(const float* data, size_t size) : data_(data), size_(size) {}
  const float* data() const { return data_; }
  size_t size() const { return size_; }
  size_t size_bytes() const { return size_ * sizeof(float); }
  bool empty() const { return size_ == 0; }
  float operator[](size_t i) const { return data_[i]; }

 private:
  const float* data_ = nullptr;
  size_t size_ = 0;
};

// Rows of a weight matrix stored in one type.
struct MatrixSegment {
  GgmlType type = GgmlType::kF32;
  const uint8_t* data = nullptr;  // rows × GgmlRowBytes(type, cols) bytes
  int rows = 0;
};

// A weight matrix W [rows, cols] (row-major, y = W·x) as 1–3 row segments,
// each in its own type (Note [Compute types]); non-owning, valid while the
// lease it was bound from is.
struct WeightMatrix {
  int rows = 0;  // Σ segment rows
  int cols = 0;
  std::array<MatrixSegment, 3> segments{};
  int n_segments = 0;

  bool empty() const { return n_segments == 0; }
  // Bytes of all segments.
  size_t bytes() const;
  // Writes row r as f32 to out[cols] (an embedding lookup).
  // REQUIRES: 0 ≤ r < rows.
  void RowToF32(int r, float* out) const;
  // Whether every segment is F32 (the forward pass can hand it to sgemm as is).
  bool all_f32() const;
};

struct LayerWeights {
  FloatView attn_norm;     // [hidden]
  WeightMatrix wqkv;       // [q_dim + 2 × kv_dim, hidden]; rows q, then k, then v
  FloatView bqkv;          // [q_dim + 2 × kv_dim]; empty unless attention_bias
  FloatView q_norm;        // [head_dim]; empty unless qk_norm
  FloatView k_norm;        // [head_dim]; empty unless qk_norm
  WeightMatrix wo;         // [hidden, q_dim]
  FloatView ffn_norm;      // [hidden]
  WeightMatrix w_gate_up;  // [2 × intermediate, hidden]; rows gate, then up
  WeightMatrix w_down;     // [hidden, intermediate]
};

// Derived sizes, all in elements.
struct ModelDims {
  int hidden = 0;
  int inter = 0;
  int n_layers = 0;
  int n_heads = 0;
  int n_kv_heads = 0;
  int head_dim = 0;
  int vocab = 0;
  int q_dim = 0;    // n_heads × head_dim
  int kv_dim = 0;   // n_kv_heads × head_dim
  int qkv_dim = 0;  // q_dim + 2 × kv_dim
};
ModelDims DimsOf(const ModelConfig& config);

// The weights one request computes from: views of the buffers of a
// ComputeLayout (BindModelWeights). Valid while those buffers are (the
// request's WeightLease).
struct ModelWeights {
  ModelConfig config;
  ModelDims dims;
  WeightMatrix embed;       // [vocab, hidden]
  std::vector<LayerWeights> layers;
  FloatView final_norm;     // [hidden]
  WeightMatrix lm_head;     // [vocab, hidden]; empty when tied or headless
  bool has_lm_head = false;  // false for a headless model without tied embeddings

  // The output projection [vocab, hidden] (embed when tied). REQUIRES: has_lm_head.
  const WeightMatrix& output() const { return lm_head.empty() ? embed : lm_head; }
  // Whether any matrix is not F32 (the forward pass then needs panel scratch).
  bool typed() const;
  // Bytes of all viewed buffers.
  size_t bytes() const;
  // Weight bytes a decode step streams from memory: every layer matrix, the
  // norms and the lm_head (one embedding row is negligible and not counted).
  size_t decode_bytes_per_token() const;
};

// Where one source tensor goes: bytes [byte_offset, byte_offset + its
// size in the buffer's type) of buffer `buffer`.
struct ComputePart {
  std::string tensor;           // name in the source file
  std::vector<int64_t> shape;   // expected shape, row-major [out, in] or [n]
  size_t buffer = 0;            // index into ComputeLayout::buffers
  size_t byte_offset = 0;       // from the buffer start
  // GGUF: the tensor's stored type at planning (the fill refuses a change),
  // and, when > 0, the number of heads whose rows the file stores permuted
  // (a "llama" file's q/k projections and biases, Note [GGUF q/k row order]
  // in arbiter/formats/llama_tensors.h); the fill puts them back in
  // Hugging Face order.
  GgmlType stored = GgmlType::kF32;
  int permute_heads = 0;
};

// The buffers of one weight matrix: one fused buffer, or one per part.
struct MatrixBuffers {
  std::array<int, 3> buffer = {-1, -1, -1};
  int n = 0;  // 0: absent
};

// Buffer indices of one layer; -1 / n 0 for an absent optional buffer.
struct LayerBuffers {
  int attn_norm = -1, bqkv = -1, q_norm = -1, k_norm = -1, ffn_norm = -1;
  MatrixBuffers wqkv, wo, w_gate_up, w_down;
};

// How to plan a layout.
struct ComputeOptions {
  // Compute every matrix in f32 (`[[models]] compute_dtype = "f32"`).
  bool f32 = false;
};

// Where a layout's tensors come from.
enum class ComputeSource { kSafetensors, kGguf };

// The planned compute layout of one checkpoint (see the file comment).
struct ComputeLayout {
  ComputeSource source = ComputeSource::kSafetensors;
  ModelConfig config;
  ModelDims dims;
  bool has_lm_head = false;
  // In the order of the file comment. A buffer's type: dtype F32/F16/BF16,
  // or ggml_type for a block type (Note [Compute types]).
  std::vector<WeightSpec> buffers;
  std::vector<ComputePart> parts;   // llama_tensors.h order; together they cover
                                    // every byte of every buffer exactly once
  MatrixBuffers embed;
  std::vector<LayerBuffers> layers;
  int final_norm = -1;
  MatrixBuffers lm_head;            // n 0 when tied or headless

  // The type buffer i computes in.
  GgmlType buffer_type(size_t i) const;
  // Bytes of buffer i (WeightSpecBytes).
  size_t buffer_bytes(size_t i) const;
  // Σ buffer bytes (no alignment padding).
  size_t bytes() const;
  // As ModelWeights::decode_bytes_per_token, from the plan alone.
  size_t decode_bytes_per_token() const;
  // Whether any matrix is not F32.
  bool typed() const;
};

// Checks the checkpoint against `config` (headers only) and plans its layout.
// `model_dir` is used in messages.
// Errors: kNotFound naming a missing tensor and the files searched;
// kDataLoss `<file>: tensor "<name>" has shape [a, b], expected [c, d]`;
// kInvalidArgument for a config the forward pass cannot run (a non-positive
// dimension, odd head_dim, heads not divisible by KV heads).
// Matrices stored as F32, F16 or BF16 get a buffer of that type, unless
// options.f32 (Note [Compute types]).
Result<ComputeLayout> PlanComputeLayout(const ModelConfig& config, const SafetensorsModel& st,
                                        const std::string& model_dir,
                                        const ComputeOptions& options = {});

// Whether a tensor of `role` is a weight matrix (computed in its stored
// type) rather than a vector (norm, bias; always F32).
bool IsMatrixRole(LlamaTensorRole role);

// kInvalidArgument (naming model_dir) for dims the forward pass cannot run:
// a non-positive dimension, an odd head_dim, heads not a multiple of KV heads.
Status CheckComputeDims(const ModelDims& d, const std::string& model_dir);

// Routes `plan`'s tensors, each computed in types[k] (matrices) or F32
// (vectors), into buffers (fused groups as the file comment says): fills
// layout.buffers, parts, embed, layers, final_norm, lm_head and has_lm_head.
// Shared by the safetensors and GGUF planners.
// REQUIRES: layout.config and dims set and passing CheckComputeDims;
// types.size() == plan.tensors.size(); the plan's shapes consistent with dims.
Result<ComputeLayout> RouteParts(ComputeLayout layout, const LlamaTensorPlan& plan,
                                 const std::vector<GgmlType>& types,
                                 const std::string& model_dir);

// PlanComputeLayout's checks without keeping the plan. Errors as it.
Status ValidateModelWeights(const ModelConfig& config, const SafetensorsModel& st,
                            const std::string& model_dir);

// Copies (or converts to f32) every tensor of `st` into its slice of
// `arrays` (one per layout.buffers entry, each buffer_bytes(i) bytes,
// 4-byte aligned; their previous contents are irrelevant: every byte is
// written; a null entry is a buffer this fill does not hold — a split
// model's other part — and is skipped, but not every entry may be null). `st` is looked up again by name (the file may have changed since
// planning): presence and shape errors as PlanComputeLayout (model_dir in
// messages); kDataLoss when a tensor's dtype changed; kUnimplemented (from
// ConvertToF32, naming the tensor and file) for a dtype that cannot be
// converted; kInvalidArgument when `arrays` does not match the layout.
Status FillComputeLayout(const ComputeLayout& layout, const SafetensorsModel& st,
                         const std::string& model_dir, const std::vector<void*>& arrays);

// The GGUF counterparts of PlanComputeLayout and FillComputeLayout
// (gguf_weights.cc), for a file whose config ModelConfigFromGguf read.
// Matrices compute in their stored ggml type when quant.h computes it
// (IsComputeType), in F32 with options.f32; vectors (norms, biases) must be
// F32, F16 or BF16 and become F32. q/k rows of "llama" files are put back
// in Hugging Face order by the fill. `path` is used in messages.
// Errors: kNotFound naming a missing tensor; kDataLoss for a tensor of the
// wrong shape, a vector in a block type, or (fill) a tensor whose type or
// shape changed since planning or a file shorter than a tensor's end;
// kUnimplemented naming a tensor in a type arbiter does not compute
// (Q2_K, IQ*, …); kInvalidArgument as PlanComputeLayout and
// FillComputeLayout.
Result<ComputeLayout> PlanComputeLayoutGguf(const ModelConfig& config, const GgufFile& gguf,
                                            const std::string& path,
                                            const ComputeOptions& options = {});
Status FillComputeLayoutGguf(const ComputeLayout& layout, const GgufFile& gguf,
                             const std::string& path, const std::vector<void*>& arrays);

// Reads exactly `want` bytes of `tensor` at offset `at` of the file `path`
// (open as `fd`) into `out`, retrying on EINTR (Note [Weights are read, not
// mapped] in model_weights.cc). kDataLoss naming the file and tensor when
// the file ends first; the errno's status for a failed read.
Status ReadTensorBytes(int fd, const std::string& path, const std::string& tensor, uint64_t at,
                       size_t want, void* out);

// Views of `arrays` (one per layout.buffers entry, holding what
// FillComputeLayout wrote). Allocates only the layer vector.
// REQUIRES: arrays.size() == layout.buffers.size(), every entry non-null.
ModelWeights BindModelWeights(const ComputeLayout& layout, const std::vector<const void*>& arrays);

}  // namespace arbiter::engine_internal
