// arbiter/formats/inspect.h — a summary of a model on disk, for
// `arbiter inspect PATH [--json]`.
//
// InspectModel opens the weights exactly as the loaders do, so every
// validation they apply is applied here too, and lists what it found. Tensor
// data is not read; inspecting a 16 GB model touches only the headers.
//   - A GGUF file (a path ending in ".gguf", or any file starting with the
//     magic "GGUF") is read with OpenGguf: version, alignment, every metadata
//     entry, the tensor infos, and — when it has general.architecture — the
//     ModelConfig its metadata maps to (ModelConfigFromGguf).
//   - Anything else is safetensors (SafetensorsModel::Open: one file, a
//     directory with model.safetensors, or a sharded directory with
//     model.safetensors.index.json). When `path` is a directory that holds
//     config.json, the parsed ModelConfig is included.
// A config that does not parse or map (or names an unsupported architecture)
// does not fail the inspection: its error message is kept in `config_error`
// so the tool can show both the tensors and the problem.
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
#include "arbiter/formats/gguf.h"
#include "arbiter/formats/model_config.h"

namespace arbiter {

struct InspectedTensor {
  std::string name;
  std::string dtype;           // stored type: a safetensors dtype ("BF16") or a ggml type ("Q4_K")
  std::vector<int64_t> shape;  // row-major, outermost first; [] for a scalar (GGUF: dims reversed)
  uint64_t size_bytes = 0;     // bytes in the file
  std::string file;            // path of the file (shard) holding it
};

struct ModelInspection {
  std::string path;                            // as passed to InspectModel
  std::string format;                          // "safetensors" or "gguf"
  std::vector<std::string> files;              // files read (shards in load order; the GGUF file)
  std::vector<InspectedTensor> tensors;        // safetensors: sorted by name; GGUF: file order
  std::map<std::string, std::string> metadata; // safetensors: union of the files' __metadata__

  // GGUF only.
  uint32_t gguf_version = 0;
  uint64_t gguf_alignment = 0;
  uint64_t gguf_data_offset = 0;                 // absolute offset of the data section
  std::vector<GgufMetadataEntry> gguf_metadata;  // every entry, in file order

  // Totals over `tensors`.
  uint64_t total_tensors = 0;
  uint64_t total_bytes = 0;                    // sum of size_bytes
  uint64_t total_parameters = 0;               // sum of prod(shape)
  std::map<std::string, uint64_t> bytes_by_dtype;  // type name → bytes

  std::optional<ModelConfig> config;           // set when the config parsed (and mapped)
  std::string config_path;                     // config.json path, or the GGUF file
  std::string config_error;                    // set when it did not
};

// Inspects `path`: a GGUF file, a .safetensors file or a model directory
// (see above). Errors: those of OpenGguf or SafetensorsModel::Open —
// kNotFound (no such path, no weights in the directory, missing shard),
// kDataLoss (corrupt header or index; the message names the file and the key
// or tensor), kUnimplemented (a GGUF version or tensor type we cannot read).
Result<ModelInspection> InspectModel(const std::string& path);

// The inspection of a parsed GGUF file (InspectModel's result for it; `path`
// is gguf.name()).
ModelInspection InspectGguf(const GgufFile& gguf);

// A human-readable report: files, metadata, config summary, a table of
// tensors (name, dtype, shape, size, file) and totals with bytes by dtype.
// GGUF files add a "format:" line (version, alignment, data offset) and list
// metadata as key, type and value; a string is cut at 80 bytes, an array
// shows its count and first 8 items (arrays inside arrays only their size
// and type). Ends with a newline.
std::string RenderInspectionText(const ModelInspection& inspection);

// The same as one JSON object (serialized with nlohmann::json, no trailing
// newline):
//   {"path": str, "format": "safetensors"|"gguf", "files": [str],
//    "tensors": [{"name", "dtype", "shape": [int], "bytes", "file"}],
//    "metadata": {str: str}                  (safetensors)
//    "metadata": {key: value}                (GGUF; see below)
//    "gguf": {"version", "alignment", "data_offset"}   (GGUF only)
//    "totals": {"tensors", "bytes", "parameters", "bytes_by_dtype": {dtype: int}},
//    "config": {...ModelConfig fields...}    (only when the config parsed)
//    "config_error": str}                    (only when it did not)
// A GGUF metadata value is {"type": "u32", "value": 32} for a scalar or
// string (strings in full), and {"type": "array", "element_type": "string",
// "count": N, "value": [first ≤ 8 items], "truncated": N > 8} for an array;
// an item that is itself an array is such an object, without "value" below
// the first level. NaN and infinite floats are null. Strings that are not
// valid UTF-8 are replaced with U+FFFD.
std::string RenderInspectionJson(const ModelInspection& inspection);

}  // namespace arbiter
