// arbiter/formats/inspect.h — a summary of a model on disk, for
// `arbiter inspect PATH [--json]`.
//
// InspectModel opens the safetensors weights exactly as the loader does
// (SafetensorsModel::Open: one file, a directory with model.safetensors, or a
// sharded directory with model.safetensors.index.json), so every validation
// the loader applies is applied here too, and lists what it found. Tensor
// data is not read; inspecting a 16 GB model touches only the headers.
//
// When `path` is a directory that holds config.json, the parsed ModelConfig
// is included. A config.json that does not parse (or names an unsupported
// architecture) does not fail the inspection: its error message is kept in
// `config_error` so the tool can show both the tensors and the problem.
//
// Usage:
//   Result<ModelInspection> info = InspectModel("/models/Qwen3-0.6B");
//   if (!info.ok()) { print(info.status().ToString()); return 1; }
//   std::cout << (json ? RenderInspectionJson(*info) : RenderInspectionText(*info));
//
// Thread safety: pure functions over values; thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "arbiter/base/status.h"
#include "arbiter/formats/model_config.h"
#include "arbiter/formats/safetensors.h"

namespace arbiter {

struct InspectedTensor {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;  // row-major, outermost first; [] for a scalar
  uint64_t size_bytes = 0;     // prod(shape) × DTypeSize(dtype)
  std::string file;            // path of the shard holding it
};

struct ModelInspection {
  std::string path;                            // as passed to InspectModel
  std::vector<std::string> files;              // safetensors files (shards), in load order
  std::vector<InspectedTensor> tensors;        // sorted by name
  std::map<std::string, std::string> metadata; // union of the files' __metadata__

  // Totals over `tensors`.
  uint64_t total_tensors = 0;
  uint64_t total_bytes = 0;                    // sum of size_bytes
  uint64_t total_parameters = 0;               // sum of prod(shape)
  std::map<std::string, uint64_t> bytes_by_dtype;  // DTypeName → bytes

  std::optional<ModelConfig> config;           // set when config.json parsed
  std::string config_path;                     // config.json path when present
  std::string config_error;                    // set when config.json failed to parse
};

// Inspects `path`: a .safetensors file or a model directory (see above).
// Errors: those of SafetensorsModel::Open — kNotFound (no such path, no
// weights in the directory, missing shard), kDataLoss (corrupt header or
// index; the message names the file and tensor).
Result<ModelInspection> InspectModel(const std::string& path);

// A human-readable report: files, metadata, config summary, a table of
// tensors (name, dtype, shape, size, file) and totals with bytes by dtype.
// Ends with a newline.
std::string RenderInspectionText(const ModelInspection& inspection);

// The same as one JSON object (serialized with nlohmann::json, no trailing
// newline):
//   {"path": str, "files": [str],
//    "tensors": [{"name", "dtype", "shape": [int], "bytes", "file"}],
//    "metadata": {str: str},
//    "totals": {"tensors", "bytes", "parameters", "bytes_by_dtype": {dtype: int}},
//    "config": {...ModelConfig fields...}    (only when config.json parsed)
//    "config_error": str}                    (only when it did not)
// Strings that are not valid UTF-8 are replaced with U+FFFD.
std::string RenderInspectionJson(const ModelInspection& inspection);

}  // namespace arbiter
