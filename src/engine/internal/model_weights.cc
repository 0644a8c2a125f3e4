// engine/internal/model_weights.cc — the compute layout of a decoder's
// safetensors weights: planning, filling caller-owned buffers (a copy in the
// stored type, or a conversion to f32), and views.
//
// Planning (PlanComputeLayout) reads headers only: it lists, for the whole
// model, every (tensor, expected shape, buffer, float offset), creating each
// compute buffer at the first tensor routed to it, and checks presence and
// shape of every entry, so a bad checkpoint fails before any weight memory
// is touched. Filling (FillComputeLayout) reads each tensor straight into
// its slice (fused matrices get their parts at row offsets). The parts of a
// buffer tile it exactly (checked when planning), so a fill writes every
// byte: the weight cache may hand it memory that holds an older model.
//
// Note [Weights are read, not mapped]
// The fill reads tensor bytes with pread into a bounded buffer and converts
// from there; it never touches the safetensors mapping. A file truncated
// while a fill runs (another process rewriting the model in place) would
// make a read through the mapping fault with SIGBUS and kill the server; a
// short pread is an error naming the file instead (docs/weights.md
// "Changed model files").
#include "engine/internal/model_weights.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <map>
#include <string>

#include "arbiter/base/fd.h"
#include "arbiter/formats/llama_tensors.h"
#include "arbiter/weights/weight_store.h"
#include "engine/internal/quant.h"

namespace arbiter::engine_internal {

ModelDims DimsOf(const ModelConfig& c) {
  ModelDims d;
  d.hidden = c.hidden_size;
  d.inter = c.intermediate_size;
  d.n_layers = c.num_hidden_layers;
  d.n_heads = c.num_attention_heads;
  d.n_kv_heads = c.num_key_value_heads > 0 ? c.num_key_value_heads : c.num_attention_heads;
  d.head_dim = c.head_dim > 0 ? c.head_dim
                              : (c.num_attention_heads > 0 ? c.hidden_size / c.num_attention_heads
                                                           : 0);
  d.vocab = c.vocab_size;
  d.q_dim = d.n_heads * d.head_dim;
  d.kv_dim = d.n_kv_heads * d.head_dim;
  d.qkv_dim = d.q_dim + 2 * d.kv_dim;
  return d;
}

bool IsMatrixRole(LlamaTensorRole role) {
  switch (role) {
    case LlamaTensorRole::kEmbed:
    case LlamaTensorRole::kQProj:
    case LlamaTensorRole::kKProj:
    case LlamaTensorRole::kVProj:
    case LlamaTensorRole::kOProj:
    case LlamaTensorRole::kGateProj:
    case LlamaTensorRole::kUpProj:
    case LlamaTensorRole::kDownProj:
    case LlamaTensorRole::kLmHead:
      return true;
    default:
      return false;
  }
}

size_t WeightMatrix::bytes() const {
  size_t total = 0;
  for (int i = 0; i < n_segments; ++i) {
    total += static_cast<size_t>(segments[i].rows) * *GgmlRowBytes(segments[i].type, cols);
  }
  return total;
}

void WeightMatrix::RowToF32(int r, float* out) const {
  for (int i = 0; i < n_segments; ++i) {
    const MatrixSegment& seg = segments[i];
    if (r < seg.rows) {
      DequantizeRows(seg.type, seg.data, cols, r, r + 1, out);
      return;
    }
    r -= seg.rows;
  }
}

bool WeightMatrix::all_f32() const {
  for (int i = 0; i < n_segments; ++i) {
    if (segments[i].type != GgmlType::kF32) return false;
  }
  return true;
}

namespace {

size_t LayerBytes(const LayerWeights& l) {
  return l.attn_norm.size_bytes() + l.wqkv.bytes() + l.bqkv.size_bytes() + l.q_norm.size_bytes() +
         l.k_norm.size_bytes() + l.wo.bytes() + l.ffn_norm.size_bytes() + l.w_gate_up.bytes() +
         l.w_down.bytes();
}


}  // namespace

size_t ModelWeights::bytes() const {
  size_t total = embed.bytes() + final_norm.size_bytes() + lm_head.bytes();
  for (const LayerWeights& l : layers) total += LayerBytes(l);
  return total;
}

size_t ModelWeights::decode_bytes_per_token() const {
  size_t total = final_norm.size_bytes();
  if (has_lm_head) total += output().bytes();
  for (const LayerWeights& l : layers) total += LayerBytes(l);
  return total;
}

bool ModelWeights::typed() const {
  auto typed = [](const WeightMatrix& m) { return !m.empty() && !m.all_f32(); };
  if (typed(embed) || typed(lm_head)) return true;
  for (const LayerWeights& l : layers) {
    if (typed(l.wqkv) || typed(l.wo) || typed(l.w_gate_up) || typed(l.w_down)) return true;
  }
  return false;
}

GgmlType ComputeLayout::buffer_type(size_t i) const {
  const WeightSpec& spec = buffers[i];
  if (spec.ggml_type) return *spec.ggml_type;
  switch (spec.dtype) {
    case DType::kF16: return GgmlType::kF16;
    case DType::kBF16: return GgmlType::kBF16;
    default: return GgmlType::kF32;
  }
}

size_t ComputeLayout::buffer_bytes(size_t i) const { return WeightSpecBytes(buffers[i]); }

size_t ComputeLayout::bytes() const {
  size_t total = 0;
  for (size_t i = 0; i < buffers.size(); ++i) total += buffer_bytes(i);
  return total;
}

size_t ComputeLayout::decode_bytes_per_token() const {
  // Everything but the embedding table and the lm_head buffers, plus the
  // output projection (embed when tied) once.
  std::vector<bool> skip(buffers.size(), false);
  for (const MatrixBuffers* m : {&embed, &lm_head}) {
    for (int k = 0; k < m->n; ++k) skip[m->buffer[k]] = true;
  }
  size_t total = 0;
  for (size_t i = 0; i < buffers.size(); ++i) {
    if (!skip[i]) total += buffer_bytes(i);
  }
  if (has_lm_head) {
    const MatrixBuffers& out = lm_head.n > 0 ? lm_head : embed;
    for (int k = 0; k < out.n; ++k) total += buffer_bytes(out.buffer[k]);
  }
  return total;
}

bool ComputeLayout::typed() const {
  for (size_t i = 0; i < buffers.size(); ++i) {
    if (buffer_type(i) != GgmlType::kF32) return true;
  }
  return false;
}

namespace {

std::string FileList(const SafetensorsModel& st) {
  std::string files;
  for (const std::string& f : st.files()) {
    if (!files.empty()) files += ", ";
    files += std::filesystem::path(f).filename().string();
  }
  return files;
}

// The tensor `part` names in `st`, with the expected shape.
Result<const TensorInfo*> FindPart(const ComputePart& part, const ModelConfig& config,
                                   const ModelDims& d, const SafetensorsModel& st,
                                   const std::string& model_dir) {
  const TensorInfo* info = st.Find(part.tensor);
  if (info == nullptr) {
    return NotFoundError(model_dir + ": tensor \"" + part.tensor + "\" not found in " +
                         FileList(st) + " (required by " + config.architecture_name + " with " +
                         std::to_string(d.n_layers) + " layers)");
  }
  if (info->shape != part.shape) {
    return DataLossError(std::filesystem::path(info->file).filename().string() + ": tensor \"" +
                         part.tensor + "\" has shape " + ShapeString(info->shape) +
                         ", expected " + ShapeString(part.shape));
  }
  return info;
}

}  // namespace

namespace {

// The spec of a buffer computing in `type`.
WeightSpec BufferSpec(std::string name, GgmlType type, std::vector<int64_t> shape) {
  WeightSpec spec;
  spec.name = std::move(name);
  spec.shape = std::move(shape);
  switch (type) {
    case GgmlType::kF32: spec.dtype = DType::kF32; break;
    case GgmlType::kF16: spec.dtype = DType::kF16; break;
    case GgmlType::kBF16: spec.dtype = DType::kBF16; break;
    default:
      spec.dtype = DType::kU8;
      spec.ggml_type = type;
      break;
  }
  return spec;
}

}  // namespace

Status CheckComputeDims(const ModelDims& d, const std::string& model_dir) {
  if (d.hidden <= 0 || d.inter <= 0 || d.n_layers <= 0 || d.n_heads <= 0 || d.n_kv_heads <= 0 ||
      d.head_dim <= 0 || d.vocab <= 0) {
    return InvalidArgumentError(model_dir + ": config has a non-positive dimension");
  }
  if (d.head_dim % 2 != 0) {
    return InvalidArgumentError(model_dir + ": head_dim " + std::to_string(d.head_dim) +
                                " is odd; RoPE needs an even head_dim");
  }
  if (d.n_heads % d.n_kv_heads != 0) {
    return InvalidArgumentError(model_dir + ": num_attention_heads " + std::to_string(d.n_heads) +
                                " is not a multiple of num_key_value_heads " +
                                std::to_string(d.n_kv_heads));
  }
  return OkStatus();
}

Result<ComputeLayout> RouteParts(ComputeLayout layout, const LlamaTensorPlan& plan,
                                 const std::vector<GgmlType>& types,
                                 const std::string& model_dir) {
  const ModelDims& d = layout.dims;
  const int64_t H = d.hidden, I = d.inter, V = d.vocab, Q = d.q_dim, KV = d.kv_dim,
                QKV = d.qkv_dim, HD = d.head_dim;
  layout.layers.resize(d.n_layers);
  layout.parts.reserve(plan.tensors.size());
  // A fused group (wqkv, w_gate_up) is one buffer only when its parts share
  // a type; otherwise each part gets its own buffer.
  std::vector<std::array<bool, 2>> fused(d.n_layers, {true, true});
  std::vector<std::array<int, 2>> group_type(d.n_layers, {-1, -1});
  for (size_t k = 0; k < plan.tensors.size(); ++k) {
    const LlamaTensor& t = plan.tensors[k];
    int g = -1;
    if (t.role == LlamaTensorRole::kQProj || t.role == LlamaTensorRole::kKProj ||
        t.role == LlamaTensorRole::kVProj) {
      g = 0;
    } else if (t.role == LlamaTensorRole::kGateProj || t.role == LlamaTensorRole::kUpProj) {
      g = 1;
    }
    if (g < 0) continue;
    int& seen = group_type[t.layer][g];
    if (seen >= 0 && seen != static_cast<int>(types[k])) fused[t.layer][g] = false;
    seen = static_cast<int>(types[k]);
  }

  std::vector<size_t> covered;  // bytes routed to each buffer
  for (size_t k = 0; k < plan.tensors.size(); ++k) {
    const LlamaTensor& t = plan.tensors[k];
    const GgmlType type = types[k];
    LayerBuffers* l = t.layer >= 0 ? &layout.layers[t.layer] : nullptr;
    auto new_buffer = [&](const std::string& member, std::vector<int64_t> shape, GgmlType bt) {
      std::string name = t.layer >= 0 ? "model.layers." + std::to_string(t.layer) + "." + member
                                      : "model." + member;
      layout.buffers.push_back(BufferSpec(std::move(name), bt, std::move(shape)));
      covered.push_back(0);
      return static_cast<int>(layout.buffers.size()) - 1;
    };
    auto add_part = [&](int buffer, size_t byte_offset) {
      layout.parts.push_back(
          ComputePart{t.name, t.shape, static_cast<size_t>(buffer), byte_offset});
    };
    // A vector (norm, bias) routed to F32 floats [offset, …) of `*slot`.
    auto vec = [&](int* slot, const char* member, int64_t n, int64_t offset) {
      if (*slot < 0) *slot = new_buffer(member, {n}, GgmlType::kF32);
      add_part(*slot, static_cast<size_t>(offset) * sizeof(float));
    };
    // A matrix alone in its buffer.
    auto mat = [&](MatrixBuffers* m, const char* member, int64_t rows, int64_t cols) {
      m->buffer[0] = new_buffer(member, {rows, cols}, type);
      m->n = 1;
      add_part(m->buffer[0], 0);
    };
    // Part `index` of a fused group: rows [row0, …) of the fused buffer
    // `member` [rows, cols], or its own buffer `own` [part rows, cols].
    auto fused_part = [&](MatrixBuffers* m, bool is_fused, const char* member, int64_t rows,
                          int index, const char* own, int64_t part_rows, int64_t row0,
                          int64_t cols) {
      if (is_fused) {
        if (m->n == 0) {
          m->buffer[0] = new_buffer(member, {rows, cols}, type);
          m->n = 1;
        }
        add_part(m->buffer[0], static_cast<size_t>(row0) * *GgmlRowBytes(type, cols));
      } else {
        m->buffer[index] = new_buffer(own, {part_rows, cols}, type);
        m->n = index + 1;
        add_part(m->buffer[index], 0);
      }
    };
    const bool fqkv = t.layer >= 0 && fused[t.layer][0];
    const bool fgu = t.layer >= 0 && fused[t.layer][1];
    switch (t.role) {
      case LlamaTensorRole::kEmbed: mat(&layout.embed, "embed", V, H); break;
      case LlamaTensorRole::kAttnNorm: vec(&l->attn_norm, "attn_norm", H, 0); break;
      case LlamaTensorRole::kQProj:
        fused_part(&l->wqkv, fqkv, "wqkv", QKV, 0, "wq", Q, 0, H);
        break;
      case LlamaTensorRole::kKProj:
        fused_part(&l->wqkv, fqkv, "wqkv", QKV, 1, "wk", KV, Q, H);
        break;
      case LlamaTensorRole::kVProj:
        fused_part(&l->wqkv, fqkv, "wqkv", QKV, 2, "wv", KV, Q + KV, H);
        break;
      case LlamaTensorRole::kQBias: vec(&l->bqkv, "bqkv", QKV, 0); break;
      case LlamaTensorRole::kKBias: vec(&l->bqkv, "bqkv", QKV, Q); break;
      case LlamaTensorRole::kVBias: vec(&l->bqkv, "bqkv", QKV, Q + KV); break;
      case LlamaTensorRole::kQNorm: vec(&l->q_norm, "q_norm", HD, 0); break;
      case LlamaTensorRole::kKNorm: vec(&l->k_norm, "k_norm", HD, 0); break;
      case LlamaTensorRole::kOProj: mat(&l->wo, "wo", H, Q); break;
      case LlamaTensorRole::kFfnNorm: vec(&l->ffn_norm, "ffn_norm", H, 0); break;
      case LlamaTensorRole::kGateProj:
        fused_part(&l->w_gate_up, fgu, "w_gate_up", 2 * I, 0, "w_gate", I, 0, H);
        break;
      case LlamaTensorRole::kUpProj:
        fused_part(&l->w_gate_up, fgu, "w_gate_up", 2 * I, 1, "w_up", I, I, H);
        break;
      case LlamaTensorRole::kDownProj: mat(&l->w_down, "w_down", H, I); break;
      case LlamaTensorRole::kFinalNorm: vec(&layout.final_norm, "final_norm", H, 0); break;
      case LlamaTensorRole::kLmHead: mat(&layout.lm_head, "lm_head", V, H); break;
    }
    int64_t elems = 1;
    for (int64_t x : t.shape) elems *= x;
    const size_t part_bytes = IsMatrixRole(t.role)
                                  ? static_cast<size_t>(elems / t.shape.back()) *
                                        *GgmlRowBytes(type, t.shape.back())
                                  : static_cast<size_t>(elems) * sizeof(float);
    covered[layout.parts.back().buffer] += part_bytes;
  }
  layout.has_lm_head = plan.has_lm_head;

  // The parts tile every buffer (the fill relies on it; the plan's shapes
  // guarantee it, so a failure here is a bug in this file).
  for (size_t i = 0; i < layout.buffers.size(); ++i) {
    if (covered[i] != layout.buffer_bytes(i)) {
      return InternalError(model_dir + ": compute buffer " + layout.buffers[i].name + " " +
                           ShapeString(layout.buffers[i].shape) + " gets " +
                           std::to_string(covered[i]) + " bytes from its tensors");
    }
  }
  return layout;
}

Result<ComputeLayout> PlanComputeLayout(const ModelConfig& config, const SafetensorsModel& st,
                                        const std::string& model_dir,
                                        const ComputeOptions& options) {
  ComputeLayout layout;
  layout.config = config;
  layout.dims = DimsOf(config);
  const ModelDims& d = layout.dims;
  ARBITER_RETURN_IF_ERROR(CheckComputeDims(d, model_dir));

  // Which tensors, in which order, with which shapes: the one list shared
  // with the weight runtime (arbiter/formats/llama_tensors.h). Presence and
  // shapes are checked first; then each tensor is routed to its (fused)
  // buffer, created when its first tensor is seen.
  const LlamaTensorPlan plan = PlanLlamaTensors(config, st);
  std::vector<GgmlType> types;  // the compute type of each plan tensor
  types.reserve(plan.tensors.size());
  for (const LlamaTensor& t : plan.tensors) {
    ARBITER_ASSIGN_OR_RETURN(
        const TensorInfo* info,
        FindPart(ComputePart{t.name, t.shape, 0, 0}, config, d, st, model_dir));
    GgmlType type = GgmlType::kF32;  // Note [Compute types]
    if (IsMatrixRole(t.role) && !options.f32) {
      if (info->dtype == DType::kF16) type = GgmlType::kF16;
      if (info->dtype == DType::kBF16) type = GgmlType::kBF16;
    }
    types.push_back(type);
  }
  return RouteParts(std::move(layout), plan, types, model_dir);
}

Status ValidateModelWeights(const ModelConfig& config, const SafetensorsModel& st,
                            const std::string& model_dir) {
  return PlanComputeLayout(config, st, model_dir).status();
}

Status ReadTensorBytes(int fd, const std::string& path, const std::string& tensor, uint64_t at,
                       size_t want, void* out) {
  uint8_t* dst = static_cast<uint8_t*>(out);
  size_t got = 0;
  while (got < want) {
    const ssize_t n = ::pread(fd, dst + got, want - got, static_cast<off_t>(at + got));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return ErrnoToStatus(errno, "read " + path);
    if (n == 0) {
      return DataLossError(path + ": the file ends before tensor \"" + tensor +
                           "\" does (truncated while its weights were read?); reload the model "
                           "once the file is complete");
    }
    got += static_cast<size_t>(n);
  }
  return OkStatus();
}

namespace {

// Bytes read per pread (a multiple of every dtype size).
constexpr size_t kReadChunkBytes = size_t{4} << 20;

// The weight files of one fill, opened once each, with the offset of their
// data area (8 + the header length, from the file itself).
class TensorReader {
 public:
  // Reads `info`'s bytes from its file into `out`, as they are when the
  // buffer computes in the stored dtype (`type`), else converted to f32
  // (Note [Weights are read, not mapped]). kDataLoss when the file is
  // shorter than the tensor's end (truncated since it was opened) or the
  // tensor's dtype no longer matches the planned `type`.
  Status Read(const TensorInfo& info, GgmlType type, void* out) {
    ARBITER_ASSIGN_OR_RETURN(File * f, Get(info.file));
    const size_t elem = DTypeSize(info.dtype);
    if (elem == 0 || info.num_elements() < 0 ||
        static_cast<uint64_t>(info.num_elements()) * elem != info.size_bytes) {
      return ConvertToF32(info, static_cast<float*>(out));  // its error names the mismatch
    }
    const bool raw = (type == GgmlType::kF32 && info.dtype == DType::kF32) ||
                     (type == GgmlType::kF16 && info.dtype == DType::kF16) ||
                     (type == GgmlType::kBF16 && info.dtype == DType::kBF16);
    if (!raw && type != GgmlType::kF32) {
      return DataLossError(info.file + ": tensor \"" + info.name + "\" is " +
                           std::string(DTypeName(info.dtype)) + " but was planned as " +
                           std::string(GgmlTypeName(type)) +
                           " (the file changed since the model was opened); reload the model");
    }
    if (raw) return ReadBytes(*f, info, f->data_start + info.data_begin, info.size_bytes, out);
    if (buffer_.empty()) buffer_.resize(kReadChunkBytes);
    uint64_t at = f->data_start + info.data_begin;
    size_t done = 0;  // bytes converted
    while (done < info.size_bytes) {
      const size_t want = std::min(buffer_.size(), info.size_bytes - done);
      ARBITER_RETURN_IF_ERROR(ReadBytes(*f, info, at, want, buffer_.data()));
      TensorInfo chunk;
      chunk.name = info.name;
      chunk.file = info.file;
      chunk.dtype = info.dtype;
      chunk.shape = {static_cast<int64_t>(want / elem)};
      chunk.data = buffer_.data();
      chunk.size_bytes = want;
      ARBITER_RETURN_IF_ERROR(ConvertToF32(chunk, static_cast<float*>(out) + done / elem));
      done += want;
      at += want;
    }
    return OkStatus();
  }

 private:
  struct File {
    UniqueFd fd;
    uint64_t data_start = 0;
  };
  Result<File*> Get(const std::string& path) {
    auto it = files_.find(path);
    if (it != files_.end()) return &it->second;
    ARBITER_ASSIGN_OR_RETURN(UniqueFd fd, UniqueFd::Open(path.c_str(), O_RDONLY | O_CLOEXEC));
    uint8_t len[8];
    if (::pread(fd.get(), len, sizeof(len), 0) != static_cast<ssize_t>(sizeof(len))) {
      return DataLossError(path + ": cannot read the safetensors header length (truncated?)");
    }
    uint64_t header = 0;
    for (int i = 7; i >= 0; --i) header = (header << 8) | len[i];  // little-endian
    File f;
    f.fd = std::move(fd);
    f.data_start = 8 + header;
    return &files_.emplace(path, std::move(f)).first->second;
  }

  // `want` bytes at file offset `at` into `out`.
  static Status ReadBytes(const File& f, const TensorInfo& info, uint64_t at, size_t want,
                          void* out) {
    return ReadTensorBytes(f.fd.get(), info.file, info.name, at, want, out);
  }

  std::map<std::string, File> files_;
  std::vector<uint8_t> buffer_;
};

}  // namespace

Status FillComputeLayout(const ComputeLayout& layout, const SafetensorsModel& st,
                         const std::string& model_dir, const std::vector<void*>& arrays) {
  if (arrays.size() != layout.buffers.size()) {
    return InvalidArgumentError(model_dir + ": " + std::to_string(arrays.size()) +
                                " arrays for a compute layout of " +
                                std::to_string(layout.buffers.size()) + " buffers");
  }
  // A null array is a buffer this fill does not hold (a split model's
  // other part, Note [Partial offload] in split_compute.cc): skipped.
  if (std::all_of(arrays.begin(), arrays.end(), [](void* a) { return a == nullptr; })) {
    return InvalidArgumentError(model_dir + ": no memory for any compute buffer");
  }
  TensorReader reader;
  for (const ComputePart& part : layout.parts) {
    if (arrays[part.buffer] == nullptr) continue;
    ARBITER_ASSIGN_OR_RETURN(const TensorInfo* info,
                             FindPart(part, layout.config, layout.dims, st, model_dir));
    ARBITER_RETURN_IF_ERROR(reader.Read(*info, layout.buffer_type(part.buffer),
                                        static_cast<uint8_t*>(arrays[part.buffer]) +
                                            part.byte_offset));
  }
  return OkStatus();
}

WeightMatrix BindMatrix(const ComputeLayout& layout, const MatrixBuffers& m,
                        const std::vector<const void*>& arrays) {
  WeightMatrix w;
  for (int k = 0; k < m.n; ++k) {
    const WeightSpec& spec = layout.buffers[m.buffer[k]];
    MatrixSegment& seg = w.segments[k];
    seg.type = layout.buffer_type(m.buffer[k]);
    seg.data = static_cast<const uint8_t*>(arrays[m.buffer[k]]);
    seg.rows = static_cast<int>(spec.shape[0]);
    w.rows += seg.rows;
    w.cols = static_cast<int>(spec.shape[1]);
  }
  w.n_segments = m.n;
  return w;
}

ModelWeights BindModelWeights(const ComputeLayout& layout,
                              const std::vector<const void*>& arrays) {
  auto view = [&](int i) {
    if (i < 0) return FloatView();
    return FloatView(static_cast<const float*>(arrays[i]), layout.buffer_bytes(i) / sizeof(float));
  };
  auto matrix = [&](const MatrixBuffers& m) { return BindMatrix(layout, m, arrays); };
  ModelWeights w;
  w.config = layout.config;
  w.dims = layout.dims;
  w.has_lm_head = layout.has_lm_head;
  w.embed = matrix(layout.embed);
  w.final_norm = view(layout.final_norm);
  w.lm_head = matrix(layout.lm_head);
  w.layers.resize(layout.layers.size());
  for (size_t i = 0; i < layout.layers.size(); ++i) {
    const LayerBuffers& b = layout.layers[i];
    LayerWeights& l = w.layers[i];
    l.attn_norm = view(b.attn_norm);
    l.wqkv = matrix(b.wqkv);
    l.bqkv = view(b.bqkv);
    l.q_norm = view(b.q_norm);
    l.k_norm = view(b.k_norm);
    l.wo = matrix(b.wo);
    l.ffn_norm = view(b.ffn_norm);
    l.w_gate_up = matrix(b.w_gate_up);
    l.w_down = matrix(b.w_down);
  }
  return w;
}

}  // namespace arbiter::engine_internal
