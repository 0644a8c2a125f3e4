// engine/internal/test_model.h — test-only: writes a random Llama/Qwen2/Qwen3
// checkpoint (config.json + model.safetensors, no tokenizer) so the weight
// loader and the forward pass can be tested without the model maker; and
// loads a checkpoint's compute layout into private buffers (what a
// WeightCache does for the engine) for tests that run the Decoder directly.
//
// Thread safety: thread-safe (no shared state).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "arbiter/base/status.h"
#include "arbiter/formats/safetensors.h"
#include "engine/internal/aligned_buffer.h"
#include "engine/internal/model_weights.h"

namespace arbiter::engine_internal {

struct TestModelSpec {
  std::string architecture = "LlamaForCausalLM";  // or Qwen2ForCausalLM, Qwen3ForCausalLM
  int hidden = 64;
  int inter = 96;
  int n_layers = 2;
  int n_heads = 4;
  int n_kv_heads = 2;
  int head_dim = 16;
  int vocab = 128;
  bool tied = false;
  float rope_theta = 10000.0f;
  float rms_norm_eps = 1e-5f;
  int max_position_embeddings = 512;
  // JSON text written as config.json's "rope_scaling" value, e.g.
  // R"({"rope_type": "linear", "factor": 4})" or "null"; empty omits the field.
  std::string rope_scaling_json;
  DType dtype = DType::kF32;  // kF32 or kBF16
  uint64_t seed = 1;
  // Edits the tensor list before writing (drop or reshape tensors in tests).
  std::function<void(std::vector<std::pair<std::string, std::vector<int64_t>>>&)> edit;
};

// A compute layout filled into buffers the test owns, and views of them.
// Moving it keeps the views valid (the buffers are heap arrays).
struct TestWeights {
  ComputeLayout layout;
  std::vector<AlignedFloats> buffers;  // one per layout.buffers entry
  ModelWeights w;                      // views of `buffers`
};

// Plans <dir>'s layout (config.json + safetensors), fills it into fresh
// buffers and binds them. Errors: PlanComputeLayout's and FillComputeLayout's.
Result<TestWeights> LoadTestWeights(const std::string& dir);

// Writes <dir>/config.json and <dir>/model.safetensors. `dir` must exist.
Status WriteTestModel(const std::string& dir, const TestModelSpec& spec);

// Runs scripts/reference_logits.py (with /usr/bin/python3, via popen) on
// `model_dir` (a model directory or a .gguf file) for `ids`; returns float64
// logits [ids.size(), vocab] row-major. Errors: kFailedPrecondition when
// python3 or numpy is missing (the message says how to install it),
// kInternal when the script fails (its output is in the message).
Result<std::vector<double>> RunReferenceLogits(const std::string& model_dir,
                                               const std::vector<int32_t>& ids, int vocab);

// As RunReferenceLogits for several prompts in one run of the script (one
// numpy start-up): element i holds prompt i's logits [prompts[i].size(),
// vocab] row-major. `model` is a model directory or a .gguf file.
Result<std::vector<std::vector<double>>> RunReferenceLogitsBatch(
    const std::string& model, const std::vector<std::vector<int32_t>>& prompts, int vocab);

// max_i |got_i − want_i| / max_i |want_i| over one row set.
double MaxRelativeError(const float* got, const double* want, size_t n);

// max_i |got_i − want_i| / (max_i want_i − min_i want_i): the error against
// the spread of the reference logits, which the logits' offset (softmax
// ignores it) does not shrink. max_i |got_i − want_i| when the spread is 0.
double MaxRangeRelativeError(const float* got, const double* want, size_t n);

// A fresh empty directory under $TMPDIR (or /tmp), e.g. for a test model;
// removed (recursively) when the process exits. "" on failure.
std::string MakeTempDir(const std::string& prefix);

}  // namespace arbiter::engine_internal
