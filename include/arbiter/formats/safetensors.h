// arbiter/formats/safetensors.h — safetensors reader and writer.
//
// Format (https://huggingface.co/docs/safetensors): 8-byte little-endian
// header length N; N bytes of UTF-8 JSON mapping tensor name →
// {"dtype","shape","data_offsets":[begin,end]} plus optional
// "__metadata__" (string → string); then the data area. Offsets are relative
// to the start of the data area.
//
// The reader mmaps the file and validates, before exposing anything:
//   - N ≥ 2, N ≤ kMaxHeaderBytes (100 MiB) and 8 + N ≤ file size;
//   - the header is a JSON object; every entry has the three fields with the
//     right JSON types; dtype is known; shape entries are ≥ 0;
//   - 0 ≤ begin ≤ end ≤ data area size; end − begin == prod(shape) × element
//     size (no overflow); no two tensors overlap.
// Sharded models: a directory holding "model.safetensors.index.json"
// ({"weight_map": {tensor → file}}) plus the shards
// ("model-00001-of-0000N.safetensors"), or a single "model.safetensors",
// load as one SafetensorsModel.
//
// Errors: kDataLoss for corrupt or truncated files, kNotFound for missing
// files, kUnimplemented for dtypes we cannot convert; every message names the
// file and the field or tensor. No exception escapes.
//
// Thread safety: SafetensorsFile / SafetensorsModel are immutable after Open
// (thread-safe). TensorInfo::data points into the mapping and lives as long
// as the owning file object.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "arbiter/base/file.h"
#include "arbiter/base/status.h"

namespace arbiter {

enum class DType {
  kF64, kF32, kF16, kBF16,
  kI64, kI32, kI16, kI8, kU64, kU32, kU16, kU8, kBool,
  kF8E4M3, kF8E5M2,
};

// "F32", "BF16", ... as spelled in safetensors headers.
std::string_view DTypeName(DType dtype);
// Bytes per element.
size_t DTypeSize(DType dtype);
// Parses a safetensors dtype string. kDataLoss when unknown.
Result<DType> ParseDType(std::string_view name);

struct TensorInfo {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;      // row-major, outermost first
  const uint8_t* data = nullptr;   // into the mapping; size_bytes long
  size_t size_bytes = 0;
  uint64_t data_begin = 0;         // offsets within the file's data area
  std::string file;                // path of the file holding it
  int64_t num_elements() const;
};

class SafetensorsFile {
 public:
  static constexpr uint64_t kMaxHeaderBytes = 100ull << 20;

  static Result<SafetensorsFile> Open(const std::string& path);
  // Parses an in-memory image (used by the fuzzer); `bytes` must outlive the
  // returned object. `name` is used in messages.
  static Result<SafetensorsFile> Parse(const uint8_t* bytes, size_t size, const std::string& name);

  // Sorted by name. Header entries may come in any order in the file.
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const TensorInfo* Find(std::string_view name) const;  // nullptr when absent; O(log n)
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const std::string& path() const { return path_; }
  size_t file_size() const { return file_size_; }

 private:
  std::shared_ptr<MappedFile> map_;
  std::vector<TensorInfo> tensors_;
  std::map<std::string, std::string> metadata_;
  std::string path_;
  size_t file_size_ = 0;
};

// One model's tensors, from one file or a sharded set.
class SafetensorsModel {
 public:
  // `path`: a .safetensors file, a directory containing model.safetensors,
  // or a directory containing model.safetensors.index.json (preferred when
  // both exist). Shard names in the index must be relative paths without
  // "..". Every tensor the index names must be in the shard it names
  // (kDataLoss otherwise); a tensor found in two shards is kDataLoss; a
  // missing shard is kNotFound (message names the index and the shard).
  static Result<SafetensorsModel> Open(const std::string& path);

  const TensorInfo* Find(std::string_view name) const;  // nullptr when absent
  std::vector<const TensorInfo*> tensors() const;        // sorted by name
  // Union of the shards' __metadata__ (the first shard wins on a clash).
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // Paths of the files opened, in shard-name order.
  const std::vector<std::string>& files() const { return files_; }
  uint64_t total_tensor_bytes() const;  // sum of size_bytes

 private:
  std::vector<SafetensorsFile> shards_;
  std::map<std::string, std::pair<size_t, size_t>, std::less<>> index_;  // name → (shard, tensor)
  std::map<std::string, std::string> metadata_;
  std::vector<std::string> files_;
};

// "[a, b, c]": a shape as written in error messages and inspect output.
std::string ShapeString(const std::vector<int64_t>& shape);

// Converts an F32/F16/BF16 tensor to f32. `out` holds num_elements() floats.
// `tensor.data` need not be aligned. kUnimplemented for other dtypes
// (message names the tensor and dtype); kInvalidArgument when size_bytes
// does not match shape × dtype size (a hand-built TensorInfo).
Status ConvertToF32(const TensorInfo& tensor, float* out);

// A tensor to write. `data` holds prod(shape) × DTypeSize(dtype) bytes.
struct TensorToWrite {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  std::string_view data;
};

// Writes a safetensors file atomically (temp file, fsync, rename). Tensors
// are laid out in the given order; the JSON header is padded with spaces to
// a multiple of 8 bytes so the data area starts 8-byte aligned.
// kInvalidArgument on a size/shape mismatch, negative dim, duplicate, empty
// or "__metadata__" name, or a name/metadata that is not valid UTF-8; IO
// errors as WriteFileAtomicStreaming. On error `path` is untouched.
Status WriteSafetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                        const std::map<std::string, std::string>& metadata = {});

// f32 → bf16 (round to nearest even; NaN stays NaN with its sign; overflow
// → inf) and f32 ↔ f16 (round to nearest even, subnormals, inf and NaN
// handled). bf16/f16 → f32 is exact.
uint16_t F32ToBF16(float f);
float BF16ToF32(uint16_t h);
uint16_t F32ToF16(float f);
float F16ToF32(uint16_t h);

}  // namespace arbiter
