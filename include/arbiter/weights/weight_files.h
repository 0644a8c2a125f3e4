// arbiter/weights/weight_files.h — what the weight runtime reads from a
// model's safetensors files before any byte of weight data is touched: the
// argument order, the byte footprint, a cheap file-change token and the
// layout digest that names a shared host floor.
//
// The reference weight runtime's weight_order, weights_nbytes,
// weights_file_token and weights_digest; docs/weights.md acceptance 12 is
// what the tests hold them to.
// Everything here reads metadata only: no tensor data is paged in.
//
// Example:
//   ARBITER_ASSIGN_OR_RETURN(SafetensorsModel st, SafetensorsModel::Open(dir));
//   ARBITER_ASSIGN_OR_RETURN(ModelConfig config, LoadModelConfig(dir + "/config.json"));
//   ARBITER_ASSIGN_OR_RETURN(std::vector<std::string> order, WeightOrder(st, &config));
//   ARBITER_ASSIGN_OR_RETURN(size_t nbytes, WeightsNbytes(st, order));  // budget unit
//   ARBITER_ASSIGN_OR_RETURN(std::vector<WeightSpec> specs, WeightSpecs(st, order));
//   uint64_t digest = WeightsDigest("demo-chat", specs, WeightsFileToken(st.files()[0]));
//
// Thread safety: pure functions over immutable inputs (SafetensorsModel is
// immutable after Open); thread-safe. WeightsFileToken reads the file system
// (one stat()).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "arbiter/base/status.h"
#include "arbiter/formats/ggml_type.h"
#include "arbiter/formats/model_config.h"
#include "arbiter/formats/safetensors.h"

namespace arbiter {

// The metadata key holding the argument order: a JSON-encoded list of tensor
// names, e.g. "[\"model.embed_tokens.weight\", ...]".
inline constexpr std::string_view kArgumentOrderKey = "argument_order";

// The tensor names of `model` in argument order (the order the weights are
// materialized, transferred and laid out in).
//   1. `__metadata__["argument_order"]` present: that list, honoured as is
//      (even when `architecture` is given). Every listed name must be a
//      tensor of the model; tensors not listed are ignored.
//   2. absent, and the model has no tensors: an empty list.
//   3. absent, tensors present, `architecture` given: the architecture's own
//      order (arbiter/formats/llama_tensors.h, the list the engine loads);
//      extra tensors are ignored. Shapes are not checked here (the engine
//      does that when it loads).
//   4. absent, tensors present, no architecture: an error.
// `architecture` may be null.
// Errors (messages start with the model's file, or its directory when
// sharded):
//   kDataLoss           argument_order is not valid JSON, not a list of
//                       strings, or lists a name twice (names the key);
//                       argument_order lists a name the file lacks:
//                       "weight '<n>' missing"
//   kNotFound           case 3 and a tensor the architecture needs is absent:
//                       "weight '<n>' missing (required by <architecture>)"
//   kFailedPrecondition case 4: "has tensors but no 'argument_order'
//                       metadata" (pass the architecture or add the key)
Result<std::vector<std::string>> WeightOrder(const SafetensorsModel& model,
                                             const ModelConfig* architecture);

// Σ prod(shape) × element size of the stored dtype over `names`, in bytes:
// the device footprint of the weights and the budget unit of a model.
// Metadata only, no alignment padding. A name listed twice counts twice.
// Errors: kNotFound naming the first unknown tensor and the model's file.
Result<size_t> WeightsNbytes(const SafetensorsModel& model, const std::vector<std::string>& names);

// One tensor's layout, as the digest and the host stores see it.
struct WeightSpec {
  std::string name;
  DType dtype = DType::kF32;   // the element type; unused when ggml_type is set
  std::vector<int64_t> shape;  // row-major, outermost first
  // Set for a buffer stored in a ggml block type (a GGUF file's Q4_K, Q8_0,
  // … tensors, computed in that type — issue 13): its size is
  // prod(shape[0 .. n-2]) × GgmlRowBytes(*ggml_type, shape.back()), and the
  // innermost dimension must be a multiple of the type's block size.
  std::optional<GgmlType> ggml_type = std::nullopt;
};

// The specs of `names`, in that order. Errors: as WeightsNbytes.
Result<std::vector<WeightSpec>> WeightSpecs(const SafetensorsModel& model,
                                            const std::vector<std::string>& names);

// A cheap token that changes when the file at `path` is rewritten:
// 0 for an empty path or a file that cannot be stat()ed (missing); otherwise
// XXH3-64 of the text "<size>:<mtime_ns>" (decimal size in bytes, decimal
// st_mtim in nanoseconds since the epoch), never 0 (a 0 hash maps to 1).
// Does not read the file's contents: a rewrite that keeps both size and
// mtime is not detected.
uint64_t WeightsFileToken(const std::string& path);

// The layout digest of a model's host weights: two processes computing it
// for the same model (same key, same file token, same tensors in the same
// order) agree, so it names a node-shared region (weight_store.h);
// anything that changes the layout or the file changes it.
//
// Format v1: XXH3-64 (seed 0) of the bytes of WeightsDigestPreimage():
//   "arbiter-weights-digest-v1\n"
//   "key " <len(model_key)> ":" <model_key> "\n"
//   "content " <content_token> "\n"
//   "tensors " <count> "\n"
//   per spec, in order:
//     <len(name)> ":" <name> " " <DTypeName(dtype)> " " <DTypeSize(dtype)>
//       (for a ggml-typed spec: "ggml:" <GgmlTypeName> " " <block_elems> "/" <block_bytes>)
//     " [" <d0> "," <d1> "," ... "]\n"
// All numbers are unsigned/signed decimal ASCII without padding; strings are
// length-prefixed so any byte in a key or name (spaces, newlines, ':') keeps
// the encoding injective. Example, key "m", token 7, one F32 [2, 3] tensor
// "w": "arbiter-weights-digest-v1\nkey 1:m\ncontent 7\ntensors 1\n1:w F32 4 [2,3]\n".
//
// Why XXH3-64 and not the reference's FNV-1a-64: XXH3 is already our base
// hash (arbiter/base/hash.h), it is much faster on long inputs (models with
// thousands of tensors) and mixes far better than byte-wise FNV; the digest
// only has to agree between our own processes, never with the reference's
// regions. It is not cryptographic: it names a region, it does not
// authenticate it (an attacher still validates what it maps: docs/weights.md
// 'Trusting a READY region').
// Bump the format tag when the preimage changes.
uint64_t WeightsDigest(std::string_view model_key, const std::vector<WeightSpec>& specs,
                       uint64_t content_token);

// The exact bytes WeightsDigest hashes (documentation and tests).
std::string WeightsDigestPreimage(std::string_view model_key,
                                  const std::vector<WeightSpec>& specs, uint64_t content_token);

// The tag that opens the v1 preimage.
inline constexpr std::string_view kWeightsDigestFormatV1 = "arbiter-weights-digest-v1";

}  // namespace arbiter
