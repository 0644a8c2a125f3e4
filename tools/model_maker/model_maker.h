// tools/model_maker/model_maker.h — `arbiter make-model`: deterministic demo
// and test models, in Hugging Face layout or as one GGUF file.
//
// Safetensors (the default) writes <out_dir>/{config.json, model.safetensors,
// tokenizer.json, tokenizer_config.json, generation_config.json}. GGUF
// writes the file <out>: the same model — hyperparameters, tokenizer and chat
// template in the metadata llama.cpp's converter writes, the tensors under
// llama.cpp's names (Note [GGUF files of make-model] in model_maker.cc). The
// tokenizer is a byte-level BPE trained (≥ 2000 merges) on a text corpus
// every Debian machine has (/usr/share/common-licenses); the weights are
// random and untrained but deterministic from `seed` (same seed → identical
// files), so outputs are real computation but not meaningful language.
//
// Presets (ModelPresetNames()):
//   tiny        Llama, GQA, f32, a few MB — unit and end-to-end tests
//   tiny-qwen2  Qwen2 with q/k/v bias — numerical reference tests
//   tiny-qwen3  Qwen3 with q/k norm — numerical reference tests
//   demo-chat   Qwen3-style: hidden 768, 8 layers, 12 heads / 4 KV heads,
//               head_dim 64, intermediate 2048, tied embeddings, vocab ≈ 4000,
//               bf16 (~53M parameters)
//   demo-embed  a small embedding model (served with capability embedding)
//
// One model, many encodings: a preset's weights are its values (a bf16
// preset's values are bf16 numbers); `dtype` only chooses how the matrices
// are stored — f32 and bf16 exactly, f16 rounded, a block type quantized by
// the engine's reference quantizers (engine/internal/quant.h QuantizeRow).
// Norm weights and biases are stored F32 in a GGUF file (as llama.cpp does)
// and in the matrices' type in safetensors.
//
// Usage:
//   MakeModelOptions o;
//   o.format = ModelFormat::kGguf;
//   o.dtype = "q4_k";
//   ARBITER_RETURN_IF_ERROR(MakeModel("demo-chat", "/tmp/demo-chat-q4_k.gguf", o));
// Tests that need other sizes (rows of 256 for the K-quants) build a
// ModelShape, GenerateModel once and write it in as many types as they want.
//
// Errors: kNotFound for an unknown preset (message lists the presets);
// kInvalidArgument for an unknown dtype (message lists them), a block type
// with the safetensors format, or a block type whose block size does not
// divide a tensor's rows (naming the tensor); file errors name the path.
// Files are written atomically; a failed run leaves no partial file under a
// final name.
//
// Thread safety: thread-safe (no shared state).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "arbiter/base/status.h"
#include "arbiter/formats/ggml_type.h"
#include "tools/model_maker/bpe_trainer.h"

namespace arbiter {

std::vector<std::string> ModelPresetNames();
// One-line description of a preset; empty when unknown.
std::string ModelPresetDescription(std::string_view preset);
// True for presets meant to be served as embedding models.
bool ModelPresetIsEmbedding(std::string_view preset);

// Progress: stage name ("tokenizer", "weights", "write") and fraction [0, 1].
using MakeModelProgress = std::function<void(std::string_view stage, double fraction)>;

enum class ModelFormat {
  kSafetensors,  // a Hugging Face model directory
  kGguf,         // one GGUF (version 3) file
};

// "safetensors" / "gguf"; kInvalidArgument (listing both) for another name.
Result<ModelFormat> ParseModelFormat(std::string_view name);

// The --dtype names `format` accepts, in the order --help lists them:
// safetensors f32 f16 bf16; GGUF also q8_0 q4_0 q4_1 q5_0 q5_1 q4_k q5_k
// q6_k (ggml's block types, lower case).
std::vector<std::string> ModelDtypeNames(ModelFormat format);
// The ggml type a dtype name stores matrices in (F32, F16, BF16 or a block
// type); kInvalidArgument naming the accepted names for another name.
Result<GgmlType> ParseModelDtype(std::string_view name, ModelFormat format);

struct MakeModelOptions {
  ModelFormat format = ModelFormat::kSafetensors;
  // How matrices are stored (ModelDtypeNames); "" = the preset's own (bf16
  // or f32).
  std::string dtype;
  uint64_t seed = 0;
};

// Writes preset `preset` to `out`: a directory (created when missing) for
// safetensors, a file path for GGUF (its directory created when missing).
Status MakeModel(std::string_view preset, const std::string& out, const MakeModelOptions& options,
                 const MakeModelProgress& progress = nullptr);
// The safetensors model of the preset with `seed`.
Status MakeModel(std::string_view preset, const std::string& out_dir, uint64_t seed,
                 const MakeModelProgress& progress = nullptr);

// ---- Lower level: one generated model written in several encodings. --------

// The architecture and sizes of a model (what a preset names).
struct ModelShape {
  std::string name;        // general.name / arbiter.preset
  std::string model_type;  // "llama", "qwen2" (q/k/v bias) or "qwen3" (q/k norm)
  int hidden = 64;
  int layers = 2;
  int heads = 4;
  int kv_heads = 2;
  int head_dim = 16;
  int intermediate = 128;
  bool tied = false;  // lm_head is the embedding table
  bool bf16 = false;  // the values are bf16 numbers (stored bf16 by default)
  int merges = 512;   // BPE merges to train
  int max_position = 2048;
  double rope_theta = 10000.0;
  double rms_norm_eps = 1e-6;
};

// The shape of a preset; kNotFound (listing the presets) when unknown.
Result<ModelShape> PresetShape(std::string_view preset);

// One tensor of a generated model: Hugging Face name, row-major shape, and
// the normal-ish distribution its values are drawn from (Note [Deterministic
// weights] in model_maker.cc).
struct ModelTensorSpec {
  std::string name;
  std::vector<int64_t> shape;
  float mean = 0;
  float std = 0;
};

// A model generated in memory: its shape, trained tokenizer and tensor list.
// The values are computed when written (ModelTensorValues), so a model
// costs the tokenizer's memory until then.
struct GeneratedModel {
  ModelShape shape;
  uint64_t seed = 0;
  TrainedBpe tokenizer;
  std::vector<ModelTensorSpec> tensors;  // in the order model.safetensors lists them

  int vocab_size() const { return tokenizer.vocab_size(); }
};

// Trains the tokenizer and lists the tensors. kInvalidArgument for a shape
// the engine could not run (a non-positive size, heads not a multiple of
// kv_heads, an odd head_dim, an unknown model_type).
Result<GeneratedModel> GenerateModel(const ModelShape& shape, uint64_t seed,
                                     const MakeModelProgress& progress = nullptr);

// The values of one tensor (bf16-rounded for a bf16 shape), row-major.
std::vector<float> ModelTensorValues(const GeneratedModel& model, const ModelTensorSpec& spec);

// Writes the Hugging Face directory, matrices in `type` (F32, F16 or BF16).
Status WriteModelDirectory(const GeneratedModel& model, const std::string& dir, GgmlType type,
                           const MakeModelProgress& progress = nullptr);

struct GgufModelOptions {
  GgmlType type = GgmlType::kF32;  // the matrices' type (1-D tensors are F32)
  // Mixed files (as llama.cpp's Q4_K_M): a matrix whose Hugging Face name
  // contains a key (e.g. "v_proj") is stored in that key's type instead of
  // `type` (the first key in the map's order that matches).
  std::map<std::string, GgmlType> matrix_types;
  // Note [GGUF q/k row order] (arbiter/formats/llama_tensors.h): "llama" files
  // store q/k rows permuted. false writes them unpermuted — a wrong file, for
  // tests that show the permutation matters.
  bool permute_llama_qk = true;
};

// Writes the GGUF file. Any compute type of the engine (quant.h
// IsComputeType) may be given, Q8_K too (llama.cpp cannot run Q8_K weights;
// make-model does not offer it).
Status WriteModelGguf(const GeneratedModel& model, const std::string& path,
                      const GgufModelOptions& options, const MakeModelProgress& progress = nullptr);

}  // namespace arbiter
