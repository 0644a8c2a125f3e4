// engine/internal/model_weights.cc — the compute layout of a decoder's
// safetensors weights: planning, f32 conversion into caller-owned buffers,
// and views.
//
// Planning (PlanComputeLayout) reads headers only: it lists, for the whole
// model, every (tensor, expected shape, buffer, float offset), creating each
// compute buffer at the first tensor routed to it, and checks presence and
// shape of every entry, so a bad checkpoint fails before any weight memory
// is touched. Filling (FillComputeLayout) converts each tensor straight into
// its slice (fused matrices get their parts at row offsets). The parts of a
// buffer tile it exactly (checked when planning), so a fill writes every
// element: the weight cache may hand it memory that holds an older model.
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

size_t ModelWeights::bytes() const {
  size_t total = embed.size_bytes() + final_norm.size_bytes() + lm_head.size_bytes();
  for (const LayerWeights& l : layers) {
    total += l.attn_norm.size_bytes() + l.wqkv.size_bytes() + l.bqkv.size_bytes() +
             l.q_norm.size_bytes() + l.k_norm.size_bytes() + l.wo.size_bytes() +
             l.ffn_norm.size_bytes() + l.w_gate_up.size_bytes() + l.w_down.size_bytes();
  }
  return total;
}

size_t ModelWeights::decode_bytes_per_token() const {
  size_t total = final_norm.size_bytes();
  if (has_lm_head) total += size_t{4} * dims.vocab * dims.hidden;
  for (const LayerWeights& l : layers) {
    total += l.attn_norm.size_bytes() + l.wqkv.size_bytes() + l.bqkv.size_bytes() +
             l.q_norm.size_bytes() + l.k_norm.size_bytes() + l.wo.size_bytes() +
             l.ffn_norm.size_bytes() + l.w_gate_up.size_bytes() + l.w_down.size_bytes();
  }
  return total;
}

size_t ComputeLayout::buffer_floats(size_t i) const {
  size_t n = 1;
  for (int64_t d : buffers[i].shape) n *= static_cast<size_t>(d);
  return n;
}

size_t ComputeLayout::bytes() const {
  size_t total = 0;
  for (size_t i = 0; i < buffers.size(); ++i) total += buffer_floats(i) * sizeof(float);
  return total;
}

size_t ComputeLayout::decode_bytes_per_token() const {
  // Everything but the embedding table and the lm_head buffer, plus the
  // output projection (embed when tied) once.
  size_t total = 0;
  for (size_t i = 0; i < buffers.size(); ++i) {
    if (static_cast<int>(i) == embed || static_cast<int>(i) == lm_head) continue;
    total += buffer_floats(i) * sizeof(float);
  }
  if (has_lm_head) total += size_t{4} * dims.vocab * dims.hidden;
  return total;
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

Result<ComputeLayout> PlanComputeLayout(const ModelConfig& config, const SafetensorsModel& st,
                                        const std::string& model_dir) {
  ComputeLayout layout;
  layout.config = config;
  layout.dims = DimsOf(config);
  const ModelDims& d = layout.dims;
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

  // Which tensors, in which order, with which shapes: the one list shared
  // with the weight runtime (arbiter/formats/llama_tensors.h). Here each is
  // routed to its (fused) buffer, created when its first tensor is seen.
  const LlamaTensorPlan plan = PlanLlamaTensors(config, st);
  const int64_t H = d.hidden, I = d.inter, V = d.vocab, Q = d.q_dim, KV = d.kv_dim,
                QKV = d.qkv_dim, HD = d.head_dim;
  layout.layers.resize(d.n_layers);
  layout.parts.reserve(plan.tensors.size());
  std::vector<size_t> covered;  // floats routed to each buffer
  for (const LlamaTensor& t : plan.tensors) {
    LayerBuffers* l = t.layer >= 0 ? &layout.layers[t.layer] : nullptr;
    // Routes t to floats [offset, …) of the buffer in `slot`, creating it as
    // `member` [shape] if it does not exist yet.
    auto route = [&](int* slot, const char* member, std::vector<int64_t> shape, int64_t offset) {
      if (*slot < 0) {
        *slot = static_cast<int>(layout.buffers.size());
        std::string name = t.layer >= 0 ? "model.layers." + std::to_string(t.layer) + "." + member
                                        : std::string("model.") + member;
        layout.buffers.push_back(WeightSpec{std::move(name), DType::kF32, std::move(shape)});
        covered.push_back(0);
      }
      layout.parts.push_back(
          ComputePart{t.name, t.shape, static_cast<size_t>(*slot), static_cast<size_t>(offset)});
    };
    switch (t.role) {
      case LlamaTensorRole::kEmbed: route(&layout.embed, "embed", {V, H}, 0); break;
      case LlamaTensorRole::kAttnNorm: route(&l->attn_norm, "attn_norm", {H}, 0); break;
      case LlamaTensorRole::kQProj: route(&l->wqkv, "wqkv", {QKV, H}, 0); break;
      case LlamaTensorRole::kKProj: route(&l->wqkv, "wqkv", {QKV, H}, Q * H); break;
      case LlamaTensorRole::kVProj: route(&l->wqkv, "wqkv", {QKV, H}, (Q + KV) * H); break;
      case LlamaTensorRole::kQBias: route(&l->bqkv, "bqkv", {QKV}, 0); break;
      case LlamaTensorRole::kKBias: route(&l->bqkv, "bqkv", {QKV}, Q); break;
      case LlamaTensorRole::kVBias: route(&l->bqkv, "bqkv", {QKV}, Q + KV); break;
      case LlamaTensorRole::kQNorm: route(&l->q_norm, "q_norm", {HD}, 0); break;
      case LlamaTensorRole::kKNorm: route(&l->k_norm, "k_norm", {HD}, 0); break;
      case LlamaTensorRole::kOProj: route(&l->wo, "wo", {H, Q}, 0); break;
      case LlamaTensorRole::kFfnNorm: route(&l->ffn_norm, "ffn_norm", {H}, 0); break;
      case LlamaTensorRole::kGateProj: route(&l->w_gate_up, "w_gate_up", {2 * I, H}, 0); break;
      case LlamaTensorRole::kUpProj: route(&l->w_gate_up, "w_gate_up", {2 * I, H}, I * H); break;
      case LlamaTensorRole::kDownProj: route(&l->w_down, "w_down", {H, I}, 0); break;
      case LlamaTensorRole::kFinalNorm: route(&layout.final_norm, "final_norm", {H}, 0); break;
      case LlamaTensorRole::kLmHead: route(&layout.lm_head, "lm_head", {V, H}, 0); break;
    }
  }
  layout.has_lm_head = plan.has_lm_head;

  // Presence and shapes.
  for (const ComputePart& part : layout.parts) {
    ARBITER_ASSIGN_OR_RETURN(const TensorInfo* info, FindPart(part, config, d, st, model_dir));
    covered[part.buffer] += static_cast<size_t>(info->num_elements());
  }
  // The parts tile every buffer (the fill relies on it; the plan's shapes
  // guarantee it, so a failure here is a bug in this file).
  for (size_t i = 0; i < layout.buffers.size(); ++i) {
    if (covered[i] != layout.buffer_floats(i)) {
      return InternalError(model_dir + ": compute buffer " + layout.buffers[i].name + " " +
                           ShapeString(layout.buffers[i].shape) + " gets " +
                           std::to_string(covered[i]) + " floats from its tensors");
    }
  }
  return layout;
}

Status ValidateModelWeights(const ModelConfig& config, const SafetensorsModel& st,
                            const std::string& model_dir) {
  return PlanComputeLayout(config, st, model_dir).status();
}

namespace {

// Bytes read per pread (a multiple of every dtype size).
constexpr size_t kReadChunkBytes = size_t{4} << 20;

// The weight files of one fill, opened once each, with the offset of their
// data area (8 + the header length, from the file itself).
class TensorReader {
 public:
  // Converts `info`'s bytes, read from its file, to f32 at `out` (Note
  // [Weights are read, not mapped]). kDataLoss when the file is shorter
  // than the tensor's end (truncated since it was opened).
  Status ReadToF32(const TensorInfo& info, float* out) {
    ARBITER_ASSIGN_OR_RETURN(File * f, Get(info.file));
    const size_t elem = DTypeSize(info.dtype);
    if (elem == 0 || info.num_elements() < 0 ||
        static_cast<uint64_t>(info.num_elements()) * elem != info.size_bytes) {
      return ConvertToF32(info, out);  // its error names the mismatch
    }
    if (buffer_.empty()) buffer_.resize(kReadChunkBytes);
    uint64_t at = f->data_start + info.data_begin;
    size_t done = 0;  // bytes converted
    while (done < info.size_bytes) {
      const size_t want = std::min(buffer_.size(), info.size_bytes - done);
      size_t got = 0;
      while (got < want) {
        const ssize_t n = ::pread(f->fd.get(), buffer_.data() + got, want - got,
                                  static_cast<off_t>(at + got));
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) return ErrnoToStatus(errno, "read " + info.file);
        if (n == 0) {
          return DataLossError(info.file + ": the file ends before tensor \"" + info.name +
                               "\" does (truncated while its weights were read?); reload the "
                               "model once the file is complete");
        }
        got += static_cast<size_t>(n);
      }
      TensorInfo chunk;
      chunk.name = info.name;
      chunk.file = info.file;
      chunk.dtype = info.dtype;
      chunk.shape = {static_cast<int64_t>(want / elem)};
      chunk.data = buffer_.data();
      chunk.size_bytes = want;
      ARBITER_RETURN_IF_ERROR(ConvertToF32(chunk, out + done / elem));
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
  for (size_t i = 0; i < arrays.size(); ++i) {
    if (arrays[i] == nullptr) {
      return InvalidArgumentError(model_dir + ": no memory for compute buffer " +
                                  layout.buffers[i].name);
    }
  }
  TensorReader reader;
  for (const ComputePart& part : layout.parts) {
    ARBITER_ASSIGN_OR_RETURN(const TensorInfo* info,
                             FindPart(part, layout.config, layout.dims, st, model_dir));
    ARBITER_RETURN_IF_ERROR(
        reader.ReadToF32(*info, static_cast<float*>(arrays[part.buffer]) + part.offset));
  }
  return OkStatus();
}

ModelWeights BindModelWeights(const ComputeLayout& layout,
                              const std::vector<const void*>& arrays) {
  auto view = [&](int i) {
    if (i < 0) return FloatView();
    return FloatView(static_cast<const float*>(arrays[i]), layout.buffer_floats(i));
  };
  ModelWeights w;
  w.config = layout.config;
  w.dims = layout.dims;
  w.has_lm_head = layout.has_lm_head;
  w.embed = view(layout.embed);
  w.final_norm = view(layout.final_norm);
  w.lm_head = view(layout.lm_head);
  w.layers.resize(layout.layers.size());
  for (size_t i = 0; i < layout.layers.size(); ++i) {
    const LayerBuffers& b = layout.layers[i];
    LayerWeights& l = w.layers[i];
    l.attn_norm = view(b.attn_norm);
    l.wqkv = view(b.wqkv);
    l.bqkv = view(b.bqkv);
    l.q_norm = view(b.q_norm);
    l.k_norm = view(b.k_norm);
    l.wo = view(b.wo);
    l.ffn_norm = view(b.ffn_norm);
    l.w_gate_up = view(b.w_gate_up);
    l.w_down = view(b.w_down);
  }
  return w;
}

}  // namespace arbiter::engine_internal
