// engine/internal/gguf_weights.cc — the compute layout of a GGUF file:
// planning (PlanComputeLayoutGguf) and filling (FillComputeLayoutGguf), the
// GGUF counterparts of model_weights.cc's safetensors functions
// (declared in model_weights.h).
//
// A matrix stays in its stored block type (Note [Compute types] in
// model_weights.h): the fill preads the tensor's bytes straight into its
// buffer — the device copy is the file's bytes, so the ledger charges the
// tensors' stored size. Rows are moved only for the q/k projections of
// "llama" files (Note [GGUF q/k row order] in arbiter/formats/llama_tensors.h)
// and converted only for compute_dtype = "f32" and for vectors stored as
// F16/BF16. As for safetensors, the file is read with pread, never mapped
// (Note [Weights are read, not mapped] in model_weights.cc).
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>
#include <vector>

#include "arbiter/base/fd.h"
#include "arbiter/formats/llama_tensors.h"
#include "engine/internal/model_weights.h"
#include "engine/internal/quant.h"

namespace arbiter::engine_internal {
namespace {

// Bytes read per pread.
constexpr size_t kReadChunkBytes = size_t{4} << 20;

// The tensor `part` names, with its planned shape (and, when `type` is set,
// its planned stored type).
Result<const GgufTensorInfo*> FindGgufPart(const ComputePart& part, const GgufFile& gguf,
                                           const std::string& path, const GgmlType* type) {
  const GgufTensorInfo* t = gguf.FindTensor(part.tensor);
  if (t == nullptr) {
    return NotFoundError(path + ": tensor \"" + part.tensor + "\" not found (required by the "
                         "architecture in general.architecture)");
  }
  if (t->RowMajorShape() != part.shape) {
    return DataLossError(path + ": tensor \"" + part.tensor + "\" has shape " +
                         ShapeString(t->RowMajorShape()) + ", expected " +
                         ShapeString(part.shape));
  }
  if (type != nullptr && t->type != *type) {
    return DataLossError(path + ": tensor \"" + part.tensor + "\" is " +
                         std::string(GgmlTypeName(t->type)) + " but was planned as " +
                         std::string(GgmlTypeName(*type)) +
                         " (the file changed since the model was opened); reload the model");
  }
  return t;
}

std::string ComputeTypeList() {
  return "F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K and Q8_K";
}

}  // namespace

Result<ComputeLayout> PlanComputeLayoutGguf(const ModelConfig& config, const GgufFile& gguf,
                                            const std::string& path,
                                            const ComputeOptions& options) {
  ComputeLayout layout;
  layout.source = ComputeSource::kGguf;
  layout.config = config;
  layout.dims = DimsOf(config);
  const ModelDims& d = layout.dims;
  ARBITER_RETURN_IF_ERROR(CheckComputeDims(d, path));

  const LlamaTensorPlan plan = PlanLlamaTensorsGguf(config);
  const bool permuted = GgufQkRowsPermuted(config);
  std::vector<GgmlType> types;     // compute type per plan tensor
  std::vector<GgmlType> stored;    // stored type per plan tensor
  types.reserve(plan.tensors.size());
  for (const LlamaTensor& t : plan.tensors) {
    ComputePart probe{t.name, t.shape, 0, 0};
    ARBITER_ASSIGN_OR_RETURN(const GgufTensorInfo* info, FindGgufPart(probe, gguf, path, nullptr));
    const bool block = GgmlTypeTraitsOf(info->type)->block_elems > 1;
    if (IsMatrixRole(t.role)) {
      if (!IsComputeType(info->type)) {
        return UnimplementedError(path + ": tensor \"" + t.name + "\" is " +
                                  std::string(GgmlTypeName(info->type)) + "; arbiter computes " +
                                  ComputeTypeList());
      }
      types.push_back(options.f32 ? GgmlType::kF32 : info->type);
    } else {
      if (block || !IsComputeType(info->type)) {
        return DataLossError(path + ": tensor \"" + t.name + "\" is " +
                             std::string(GgmlTypeName(info->type)) +
                             "; norm weights and biases must be F32, F16 or BF16");
      }
      types.push_back(GgmlType::kF32);
    }
    stored.push_back(info->type);
  }
  ARBITER_ASSIGN_OR_RETURN(layout, RouteParts(std::move(layout), plan, types, path));
  // RouteParts adds one part per plan tensor, in plan order.
  for (size_t k = 0; k < plan.tensors.size(); ++k) {
    ComputePart& part = layout.parts[k];
    part.stored = stored[k];
    const LlamaTensorRole role = plan.tensors[k].role;
    if (!permuted) continue;
    if (role == LlamaTensorRole::kQProj || role == LlamaTensorRole::kQBias) {
      part.permute_heads = d.n_heads;
    } else if (role == LlamaTensorRole::kKProj || role == LlamaTensorRole::kKBias) {
      part.permute_heads = d.n_kv_heads;
    }
  }
  return layout;
}

Status FillComputeLayoutGguf(const ComputeLayout& layout, const GgufFile& gguf,
                             const std::string& path, const std::vector<void*>& arrays) {
  if (arrays.size() != layout.buffers.size()) {
    return InvalidArgumentError(path + ": " + std::to_string(arrays.size()) +
                                " arrays for a compute layout of " +
                                std::to_string(layout.buffers.size()) + " buffers");
  }
  // A null array is a buffer this fill does not hold (a split model's
  // other part, Note [Partial offload] in split_compute.cc): skipped.
  if (std::all_of(arrays.begin(), arrays.end(), [](void* a) { return a == nullptr; })) {
    return InvalidArgumentError(path + ": no memory for any compute buffer");
  }
  ARBITER_ASSIGN_OR_RETURN(UniqueFd fd, UniqueFd::Open(path.c_str(), O_RDONLY | O_CLOEXEC));
  std::vector<uint8_t> chunk;
  for (const ComputePart& part : layout.parts) {
    if (arrays[part.buffer] == nullptr) continue;
    ARBITER_ASSIGN_OR_RETURN(const GgufTensorInfo* t,
                             FindGgufPart(part, gguf, path, &part.stored));
    const GgmlType to = layout.buffer_type(part.buffer);
    // A vector is a column of n one-element rows, so a bias permutes as the
    // rows of its projection do.
    const int64_t cols = part.shape.size() == 1 ? 1 : part.shape.back();
    const int64_t rows = t->n_elements / cols;
    const size_t src_row = *GgmlRowBytes(t->type, cols);
    const size_t dst_row = *GgmlRowBytes(to, cols);
    uint8_t* dst = static_cast<uint8_t*>(arrays[part.buffer]) + part.byte_offset;
    const uint64_t at = gguf.data_offset() + t->offset;
    if (to == t->type && part.permute_heads == 0) {
      ARBITER_RETURN_IF_ERROR(
          ReadTensorBytes(fd.get(), path, part.tensor, at, t->size_bytes, dst));
      continue;
    }
    const int64_t head_rows = layout.dims.head_dim;
    const int64_t per_chunk = std::max<int64_t>(1, kReadChunkBytes / src_row);
    chunk.resize(static_cast<size_t>(std::min(rows, per_chunk)) * src_row);
    for (int64_t r0 = 0; r0 < rows; r0 += per_chunk) {
      const int64_t n = std::min(per_chunk, rows - r0);
      ARBITER_RETURN_IF_ERROR(ReadTensorBytes(fd.get(), path, part.tensor, at + r0 * src_row,
                                     static_cast<size_t>(n) * src_row, chunk.data()));
      for (int64_t r = r0; r < r0 + n; ++r) {
        const int64_t out_row =
            part.permute_heads > 0 ? GgufRowToHfRow(r, part.permute_heads, head_rows) : r;
        if (out_row < 0 || out_row >= rows) {
          return InternalError(path + ": tensor \"" + part.tensor + "\": row " +
                               std::to_string(r) + " has no Hugging Face row");
        }
        uint8_t* out = dst + out_row * dst_row;
        if (to == t->type) {
          std::memcpy(out, chunk.data() + (r - r0) * src_row, src_row);
        } else {
          DequantizeRows(t->type, chunk.data() + (r - r0) * src_row, cols, 0, 1,
                         reinterpret_cast<float*>(out));
        }
      }
    }
  }
  return OkStatus();
}

}  // namespace arbiter::engine_internal
