// arbiter/engine/model_files.h — a model directory, opened and planned once.
//
// A ModelFiles is everything the engine needs from a model directory before
// it touches weight bytes: config.json parsed, tokenizer.json loaded, the
// safetensors headers checked against the architecture and turned into the
// compute plan (the f32 buffers the forward pass reads), and a token of the
// weight files (size and mtime of each) that goes into the weights digest.
// One load opens it once and hands it to every step: the footprint estimate
// (Engine::Footprint), the weight registration (Engine::WeightModelFor) and
// Engine::Load — Note [One parse per load] in src/engine/engine.cc.
//
// Example:
//   ARBITER_ASSIGN_OR_RETURN(std::shared_ptr<const ModelFiles> files, OpenModelFiles(dir));
//   ARBITER_ASSIGN_OR_RETURN(EngineFootprint bytes, Engine::Footprint(*files, options));
//   ARBITER_ASSIGN_OR_RETURN(WeightModel weights,
//                            Engine::WeightModelFor(*files, "chat", options));
//   ARBITER_RETURN_IF_ERROR(cache->Register(std::move(weights)));
//   ARBITER_ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine, Engine::Load(files, options));
//
// Thread safety: immutable after OpenModelFiles; thread-safe reads. Shared
// (std::shared_ptr<const ModelFiles>) by the engines loaded from it.
// No file stays open or mapped: the weight bytes are read by the weight
// registration's fill, when the WeightCache loads them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "arbiter/base/status.h"
#include "arbiter/engine/chat_template.h"
#include "arbiter/engine/tokenizer.h"
#include "arbiter/formats/model_config.h"
#include "arbiter/weights/weight_files.h"

namespace arbiter {

namespace engine_internal {
struct ComputeLayout;
struct ModelFilesAccess;
}  // namespace engine_internal

class ModelFiles {
 public:
  ModelFiles(const ModelFiles&) = delete;
  ModelFiles& operator=(const ModelFiles&) = delete;
  ~ModelFiles();

  // The directory as given to OpenModelFiles.
  const std::string& dir() const { return dir_; }
  const ModelConfig& config() const;
  // REQUIRES: opened by OpenModelFiles (the path-based
  // Engine::WeightModelFor plans without a tokenizer, internally).
  const Tokenizer& tokenizer() const { return *tokenizer_; }
  // The safetensors files read, in shard order.
  const std::vector<std::string>& weight_files() const { return weight_files_; }
  // XXH3-64 over WeightsFileToken (size and mtime) of every weight file at
  // open, 8 bytes little-endian each, in weight_files() order; never 0.
  uint64_t files_token() const { return files_token_; }
  // The compute layout's buffers (each in the type it computes in, the order
  // Engine::WeightModelFor documents) and their total size in bytes.
  const std::vector<WeightSpec>& weight_specs() const;
  size_t weight_bytes() const;
  // The chat format the model is rendered in (ChooseChatTemplate at open:
  // the override, the model's template text, or its special tokens);
  // kFailedPrecondition when the model has none (a completions-only model).
  // REQUIRES: opened by OpenModelFiles (with the tokenizer).
  Result<ChatTemplateKind> chat_template() const;
  // WeightsDigest(key, weight_specs(), files_token()): the digest of the
  // registration Engine::WeightModelFor(*this, key, …) makes.
  uint64_t WeightsDigestFor(std::string_view key) const;

 private:
  friend struct engine_internal::ModelFilesAccess;
  ModelFiles() = default;

  std::string dir_;
  std::shared_ptr<const Tokenizer> tokenizer_;  // null only for the internal headers-only open
  std::optional<ChatTemplateKind> chat_template_;  // set when the model has a chat format
  Status chat_template_error_;                     // why not, otherwise
  std::shared_ptr<const engine_internal::ComputeLayout> layout_;
  std::vector<std::string> weight_files_;
  uint64_t files_token_ = 0;
};

// How OpenModelFiles plans the compute layout.
struct ModelFilesOptions {
  // Convert every weight matrix to f32 at load (`[[models]] compute_dtype =
  // "f32"`) instead of computing it in its stored type (F16, BF16 and the
  // GGUF block types; engine/internal/model_weights.h Note [Compute types]).
  bool compute_f32 = false;
  // `[[models]] chat_template`: render chats in this family whatever the
  // model's own template says.
  std::optional<ChatTemplateKind> chat_template;
};

// Opens `model_dir`: parses config.json and tokenizer.json, reads the
// safetensors headers (model.safetensors, or the shards of
// model.safetensors.index.json) and plans the compute layout, checking that
// every tensor the architecture needs is present with the expected shape.
// Reads headers only: cheap for any model size.
// Errors name the file and the field or tensor: kNotFound (a missing file
// or tensor), kDataLoss (a malformed file, a tensor of the wrong shape),
// kUnimplemented (an unsupported architecture or tokenizer),
// kFailedPrecondition (a chat template of no known family, or an override
// whose tokens the tokenizer lacks: ChooseChatTemplate's errors),
// kInvalidArgument (a config the forward pass cannot run),
// kResourceExhausted (out of memory reading the headers).
Result<std::shared_ptr<const ModelFiles>> OpenModelFiles(const std::string& model_dir,
                                                         const ModelFilesOptions& options = {});

}  // namespace arbiter
