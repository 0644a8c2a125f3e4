// make-model: deterministic demo and test models, in Hugging Face layout or
// as one GGUF file.
//
// Steps: train the byte-level BPE tokenizer on Debian's license texts (once
// per call) and list the tensors (GenerateModel); then write. A directory
// gets tokenizer.json, tokenizer_config.json, generation_config.json,
// model.safetensors and — last, so a directory with a config.json is
// complete — config.json, each file atomically (temp + fsync + rename). A
// GGUF file is written whole, atomically, by GgufWriter. Tensor values are
// computed when written, tensor by tensor.
//
// Note [Deterministic weights]
// Every tensor's values come from a splitmix64 stream seeded with
// splitmix64(seed ^ XXH3(tensor name)), so a tensor depends only on the seed
// and its own (Hugging Face) name, not on generation order or file format.
// Values are "normal-ish": Irwin–Hall sums of four 16-bit uniforms, rescaled
// to unit variance, times the tensor's std:
//   embeddings / untied lm_head   1 / sqrt(hidden)  (logits ~ unit scale)
//   projections                   0.5 / sqrt(fan_in) (≈ 0.02 at hidden 768)
//   biases                        0.02
//   RMSNorm weights               1 + 0.05·noise (so tests exercise them)
// bf16 presets round each value with F32ToBF16 (round to nearest even): their
// values are bf16 numbers, whatever type they are then stored in.
//
// Note [GGUF files of make-model]
// The file is what llama.cpp's convert_hf_to_gguf.py would write for the
// Hugging Face directory of the same preset and seed, with every matrix in
// one type:
//   metadata  general.architecture (llama / qwen2 / qwen3), general.name (the
//             preset), general.file_type (the llama_ftype whose main type the
//             matrices have: Q4_K is "Q4_K_S", Q5_K "Q5_K_S"; absent for
//             Q8_K, which has none), general.quantization_version 2 for block
//             types; <arch>.block_count, context_length, embedding_length,
//             feed_forward_length, attention.head_count, head_count_kv,
//             key_length, value_length, layer_norm_rms_epsilon,
//             rope.freq_base, rope.dimension_count, vocab_size;
//             tokenizer.ggml.model "gpt2", pre "qwen2" (the trainer's split
//             regex is Qwen2's), tokens (byte-level strings, then the special
//             tokens), token_type (1 normal, 3 control for the specials),
//             merges ("a b"), bos (<|endoftext|>), eos (<|im_end|>), padding
//             (<|endoftext|>), add_bos_token / add_eos_token false,
//             tokenizer.chat_template (ChatML); arbiter.seed.
//   tensors   llama.cpp names (arbiter/formats/llama_tensors.h lists the
//             mapping), dims the row-major shape reversed, matrices (the
//             embedding table included; no output.weight when tied) in the
//             chosen type, row by row through QuantizeRow, 1-D tensors F32;
//             a "llama" model's q/k rows (and biases) permuted as llama.cpp's
//             converter does (Note [GGUF q/k row order] there).
#include "tools/model_maker/model_maker.h"

#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>

#include "arbiter/base/file.h"
#include "arbiter/base/hash.h"
#include "arbiter/formats/gguf.h"
#include "arbiter/formats/llama_tensors.h"
#include "arbiter/formats/safetensors.h"
#include "engine/internal/byte_level.h"
#include "engine/internal/quant.h"

namespace arbiter {
namespace {

struct Preset {
  const char* description;
  ModelShape shape;
  bool embedding;
};

// Special tokens of every preset (ChatML, Qwen order).
const char* const kSpecialTokens[] = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"};

ModelShape Shape(const char* name, const char* model_type, int hidden, int layers, int heads,
                 int kv_heads, int head_dim, int intermediate, bool tied, bool bf16, int merges,
                 int max_position, double rope_theta) {
  ModelShape s;
  s.name = name;
  s.model_type = model_type;
  s.hidden = hidden;
  s.layers = layers;
  s.heads = heads;
  s.kv_heads = kv_heads;
  s.head_dim = head_dim;
  s.intermediate = intermediate;
  s.tied = tied;
  s.bf16 = bf16;
  s.merges = merges;
  s.max_position = max_position;
  s.rope_theta = rope_theta;
  return s;
}

const Preset kPresets[] = {
    {"Llama, 2 layers, hidden 64, 4 heads / 2 KV heads (GQA), f32, ~1 MB: unit and "
     "end-to-end tests",
     Shape("tiny", "llama", 64, 2, 4, 2, 16, 128, false, false, 512, 2048, 10000.0), false},
    {"Qwen2 with q/k/v bias, 2 layers, hidden 64, tied embeddings, f32: numerical "
     "reference tests",
     Shape("tiny-qwen2", "qwen2", 64, 2, 4, 2, 16, 128, true, false, 512, 2048, 1000000.0), false},
    {"Qwen3 with per-head q/k RMSNorm, 2 layers, hidden 64, head_dim 32, f32: "
     "numerical reference tests",
     Shape("tiny-qwen3", "qwen3", 64, 2, 4, 2, 32, 128, false, false, 512, 2048, 1000000.0), false},
    {"Qwen3-style chat model: hidden 768, 8 layers, 12 heads / 4 KV heads, tied "
     "embeddings, vocab ~4000, bf16 (~53M parameters, ~106 MB)",
     Shape("demo-chat", "qwen3", 768, 8, 12, 4, 64, 2048, true, true, 3700, 4096, 1000000.0),
     false},
    {"Qwen3-style embedding model: hidden 384, 4 layers, 6 heads / 2 KV heads, "
     "bf16, mean-pooled embeddings (~8M parameters, ~16 MB)",
     Shape("demo-embed", "qwen3", 384, 4, 6, 2, 64, 1024, true, true, 3700, 4096, 1000000.0), true},
};

const Preset* FindPreset(std::string_view name) {
  for (const Preset& p : kPresets) {
    if (name == p.shape.name) return &p;
  }
  return nullptr;
}

std::string PresetList() {
  std::string list;
  for (const Preset& q : kPresets) list += (list.empty() ? "" : ", ") + q.shape.name;
  return list;
}

// config.json's architectures[0] of a model_type.
const char* HfArchitecture(const std::string& model_type) {
  if (model_type == "llama") return "LlamaForCausalLM";
  if (model_type == "qwen2") return "Qwen2ForCausalLM";
  if (model_type == "qwen3") return "Qwen3ForCausalLM";
  return nullptr;
}

inline uint64_t SplitMix64(uint64_t* state) {
  uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Fills `out` with normal-ish values (mean `mean`, std `std`); see
// Note [Deterministic weights].
void FillNormalish(uint64_t seed, const std::string& name, float mean, float std,
                   std::vector<float>* out) {
  uint64_t state = seed ^ Xxh3_64(name.data(), name.size());
  state = SplitMix64(&state);
  // Sum of 4 U[0,1) has mean 2 and variance 4/12 = 1/3.
  const float scale = std * std::sqrt(3.0f) / 65536.0f;
  for (float& v : *out) {
    uint64_t r = SplitMix64(&state);
    uint32_t sum = static_cast<uint32_t>(r & 0xFFFF) + static_cast<uint32_t>((r >> 16) & 0xFFFF) +
                   static_cast<uint32_t>((r >> 32) & 0xFFFF) + static_cast<uint32_t>(r >> 48);
    v = mean + (static_cast<float>(sum) - 2.0f * 65536.0f) * scale;
  }
}

std::string ChatMlJinja() {
  return "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + "
         "message['content'] + '<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt "
         "%}{{ '<|im_start|>assistant\\n' }}{% endif %}";
}

Status WriteJson(const std::string& path, const nlohmann::ordered_json& j) {
  return WriteFileAtomic(path, j.dump(2) + "\n");
}

// The --dtype names, their types and llama.cpp's enum llama_ftype value
// naming each as a file's main type (Note [GGUF files of make-model]), in
// --help order.
struct DtypeName {
  const char* name;
  GgmlType type;
  int llama_ftype;
};
constexpr DtypeName kDtypes[] = {
    {"f32", GgmlType::kF32, 0},     // ALL_F32
    {"f16", GgmlType::kF16, 1},     // MOSTLY_F16
    {"bf16", GgmlType::kBF16, 32},  // MOSTLY_BF16
    {"q8_0", GgmlType::kQ8_0, 7},   // MOSTLY_Q8_0
    {"q4_0", GgmlType::kQ4_0, 2},   // MOSTLY_Q4_0
    {"q4_1", GgmlType::kQ4_1, 3},   // MOSTLY_Q4_1
    {"q5_0", GgmlType::kQ5_0, 8},   // MOSTLY_Q5_0
    {"q5_1", GgmlType::kQ5_1, 9},   // MOSTLY_Q5_1
    {"q4_k", GgmlType::kQ4_K, 14},  // MOSTLY_Q4_K_S
    {"q5_k", GgmlType::kQ5_K, 16},  // MOSTLY_Q5_K_S
    {"q6_k", GgmlType::kQ6_K, 18},  // MOSTLY_Q6_K
};

bool IsFloatType(GgmlType t) {
  return t == GgmlType::kF32 || t == GgmlType::kF16 || t == GgmlType::kBF16;
}

// The llama_ftype of a file whose matrices are all `t`; -1 when it has none
// (Q8_K).
int LlamaFileType(GgmlType t) {
  for (const DtypeName& d : kDtypes) {
    if (d.type == t) return d.llama_ftype;
  }
  return -1;
}

// llama.cpp's name of a Hugging Face tensor (llama_tensors.h's table).
std::string GgufTensorName(const std::string& hf) {
  if (hf == "model.embed_tokens.weight") return "token_embd.weight";
  if (hf == "model.norm.weight") return "output_norm.weight";
  if (hf == "lm_head.weight") return "output.weight";
  static const std::pair<const char*, const char*> kLayer[] = {
      {"input_layernorm.weight", "attn_norm.weight"},
      {"self_attn.q_proj.weight", "attn_q.weight"},
      {"self_attn.k_proj.weight", "attn_k.weight"},
      {"self_attn.v_proj.weight", "attn_v.weight"},
      {"self_attn.q_proj.bias", "attn_q.bias"},
      {"self_attn.k_proj.bias", "attn_k.bias"},
      {"self_attn.v_proj.bias", "attn_v.bias"},
      {"self_attn.q_norm.weight", "attn_q_norm.weight"},
      {"self_attn.k_norm.weight", "attn_k_norm.weight"},
      {"self_attn.o_proj.weight", "attn_output.weight"},
      {"post_attention_layernorm.weight", "ffn_norm.weight"},
      {"mlp.gate_proj.weight", "ffn_gate.weight"},
      {"mlp.up_proj.weight", "ffn_up.weight"},
      {"mlp.down_proj.weight", "ffn_down.weight"},
  };
  const std::string prefix = "model.layers.";
  const size_t dot = hf.find('.', prefix.size());
  const std::string rest = hf.substr(dot + 1);
  for (const auto& [from, to] : kLayer) {
    if (rest == from) return "blk." + hf.substr(prefix.size(), dot - prefix.size()) + "." + to;
  }
  return "";  // not reached: GenerateModel lists only the names above
}

Status CheckShape(const ModelShape& s) {
  if (HfArchitecture(s.model_type) == nullptr) {
    return InvalidArgumentError("make-model: model_type \"" + s.model_type +
                                "\" is not llama, qwen2 or qwen3");
  }
  if (s.hidden <= 0 || s.layers <= 0 || s.heads <= 0 || s.kv_heads <= 0 || s.head_dim <= 0 ||
      s.intermediate <= 0 || s.merges < 0 || s.max_position <= 0) {
    return InvalidArgumentError("make-model: shape \"" + s.name + "\" has a non-positive size");
  }
  if (s.heads % s.kv_heads != 0 || s.head_dim % 2 != 0) {
    return InvalidArgumentError("make-model: shape \"" + s.name +
                                "\" needs heads a multiple of kv_heads and an even head_dim");
  }
  return OkStatus();
}

// Encodes float values as F32 / F16 / BF16 element bytes.
std::string EncodeFloats(const std::vector<float>& v, GgmlType type) {
  std::string out;
  if (type == GgmlType::kF32) {
    out.assign(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
    return out;
  }
  out.resize(v.size() * 2);
  auto* dst = reinterpret_cast<uint16_t*>(out.data());
  for (size_t k = 0; k < v.size(); ++k) {
    dst[k] = type == GgmlType::kBF16 ? F32ToBF16(v[k]) : F32ToF16(v[k]);
  }
  return out;
}

}  // namespace

std::vector<std::string> ModelPresetNames() {
  std::vector<std::string> names;
  for (const Preset& p : kPresets) names.push_back(p.shape.name);
  return names;
}

std::string ModelPresetDescription(std::string_view preset) {
  const Preset* p = FindPreset(preset);
  return p ? p->description : "";
}

bool ModelPresetIsEmbedding(std::string_view preset) {
  const Preset* p = FindPreset(preset);
  return p != nullptr && p->embedding;
}

Result<ModelShape> PresetShape(std::string_view preset) {
  const Preset* p = FindPreset(preset);
  if (p == nullptr) {
    return NotFoundError("unknown model preset \"" + std::string(preset) +
                         "\"; presets: " + PresetList());
  }
  return p->shape;
}

Result<ModelFormat> ParseModelFormat(std::string_view name) {
  if (name == "safetensors") return ModelFormat::kSafetensors;
  if (name == "gguf") return ModelFormat::kGguf;
  return InvalidArgumentError("unknown model format \"" + std::string(name) +
                              "\"; formats: safetensors, gguf");
}

std::vector<std::string> ModelDtypeNames(ModelFormat format) {
  std::vector<std::string> names;
  for (const DtypeName& d : kDtypes) {
    if (format == ModelFormat::kGguf || IsFloatType(d.type)) names.emplace_back(d.name);
  }
  return names;
}

Result<GgmlType> ParseModelDtype(std::string_view name, ModelFormat format) {
  for (const DtypeName& d : kDtypes) {
    if (name != d.name) continue;
    if (format == ModelFormat::kSafetensors && !IsFloatType(d.type)) {
      return InvalidArgumentError("dtype \"" + std::string(name) +
                                  "\" is a GGUF block type; use --format gguf, or one of f32, "
                                  "f16, bf16 for safetensors");
    }
    return d.type;
  }
  std::string list;
  for (const std::string& n : ModelDtypeNames(format)) list += (list.empty() ? "" : ", ") + n;
  return InvalidArgumentError("unknown dtype \"" + std::string(name) + "\"; " +
                              (format == ModelFormat::kGguf ? "GGUF" : "safetensors") + " takes " +
                              list);
}

Result<GeneratedModel> GenerateModel(const ModelShape& shape, uint64_t seed,
                                     const MakeModelProgress& progress) {
  ARBITER_RETURN_IF_ERROR(CheckShape(shape));
  auto report = [&](std::string_view stage, double f) {
    if (progress) progress(stage, f);
  };
  GeneratedModel m;
  m.shape = shape;
  m.seed = seed;

  report("tokenizer", 0.0);
  ARBITER_ASSIGN_OR_RETURN(std::string corpus, DefaultTrainingCorpus());
  BpeTrainerOptions topts;
  topts.num_merges = shape.merges;
  topts.special_tokens.assign(std::begin(kSpecialTokens), std::end(kSpecialTokens));
  ARBITER_ASSIGN_OR_RETURN(m.tokenizer, TrainBpe(corpus, topts));
  report("tokenizer", 1.0);

  const int64_t vocab = m.vocab_size();
  const int h = shape.hidden, hd = shape.head_dim, inter = shape.intermediate;
  const int q_dim = shape.heads * hd, kv_dim = shape.kv_heads * hd;
  const bool bias = shape.model_type == "qwen2", qk_norm = shape.model_type == "qwen3";
  const float emb_std = 1.0f / std::sqrt(static_cast<float>(h));
  auto proj_std = [](int fan_in) { return 0.5f / std::sqrt(static_cast<float>(fan_in)); };
  std::vector<ModelTensorSpec>& specs = m.tensors;
  specs.push_back({"model.embed_tokens.weight", {vocab, h}, 0.0f, emb_std});
  for (int l = 0; l < shape.layers; ++l) {
    std::string pre = "model.layers." + std::to_string(l) + ".";
    specs.push_back({pre + "input_layernorm.weight", {h}, 1.0f, 0.05f});
    specs.push_back({pre + "self_attn.q_proj.weight", {q_dim, h}, 0.0f, proj_std(h)});
    specs.push_back({pre + "self_attn.k_proj.weight", {kv_dim, h}, 0.0f, proj_std(h)});
    specs.push_back({pre + "self_attn.v_proj.weight", {kv_dim, h}, 0.0f, proj_std(h)});
    if (bias) {
      specs.push_back({pre + "self_attn.q_proj.bias", {q_dim}, 0.0f, 0.02f});
      specs.push_back({pre + "self_attn.k_proj.bias", {kv_dim}, 0.0f, 0.02f});
      specs.push_back({pre + "self_attn.v_proj.bias", {kv_dim}, 0.0f, 0.02f});
    }
    if (qk_norm) {
      specs.push_back({pre + "self_attn.q_norm.weight", {hd}, 1.0f, 0.05f});
      specs.push_back({pre + "self_attn.k_norm.weight", {hd}, 1.0f, 0.05f});
    }
    specs.push_back({pre + "self_attn.o_proj.weight", {h, q_dim}, 0.0f, proj_std(q_dim)});
    specs.push_back({pre + "post_attention_layernorm.weight", {h}, 1.0f, 0.05f});
    specs.push_back({pre + "mlp.gate_proj.weight", {inter, h}, 0.0f, proj_std(h)});
    specs.push_back({pre + "mlp.up_proj.weight", {inter, h}, 0.0f, proj_std(h)});
    specs.push_back({pre + "mlp.down_proj.weight", {h, inter}, 0.0f, proj_std(inter)});
  }
  specs.push_back({"model.norm.weight", {h}, 1.0f, 0.05f});
  if (!shape.tied) specs.push_back({"lm_head.weight", {vocab, h}, 0.0f, emb_std});
  return m;
}

std::vector<float> ModelTensorValues(const GeneratedModel& model, const ModelTensorSpec& spec) {
  int64_t n = 1;
  for (int64_t d : spec.shape) n *= d;
  std::vector<float> v(static_cast<size_t>(n));
  FillNormalish(model.seed, spec.name, spec.mean, spec.std, &v);
  if (model.shape.bf16) {
    for (float& x : v) x = BF16ToF32(F32ToBF16(x));
  }
  return v;
}

Status WriteModelDirectory(const GeneratedModel& m, const std::string& out_dir, GgmlType type,
                           const MakeModelProgress& progress) {
  if (!IsFloatType(type)) {
    return InvalidArgumentError("make-model: a safetensors model stores f32, f16 or bf16, not " +
                                std::string(GgmlTypeName(type)));
  }
  auto report = [&](std::string_view stage, double f) {
    if (progress) progress(stage, f);
  };
  const ModelShape& p = m.shape;
  const TrainedBpe& bpe = m.tokenizer;
  const int vocab = m.vocab_size();
  const int32_t endoftext_id = bpe.SpecialTokenId("<|endoftext|>");
  const int32_t im_end_id = bpe.SpecialTokenId("<|im_end|>");

  report("weights", 0.0);
  std::vector<std::string> blobs;
  blobs.reserve(m.tensors.size());
  for (size_t i = 0; i < m.tensors.size(); ++i) {
    blobs.push_back(EncodeFloats(ModelTensorValues(m, m.tensors[i]), type));
    report("weights", static_cast<double>(i + 1) / m.tensors.size());
  }

  report("write", 0.0);
  std::error_code ec;
  std::filesystem::create_directories(out_dir, ec);
  if (ec) {
    return InternalError("make-model: cannot create output directory " + out_dir + ": " +
                         ec.message());
  }
  const std::string dir = out_dir + "/";
  const DType dtype = type == GgmlType::kF32   ? DType::kF32
                      : type == GgmlType::kF16 ? DType::kF16
                                               : DType::kBF16;
  const char* dtype_name = type == GgmlType::kF32   ? "float32"
                           : type == GgmlType::kF16 ? "float16"
                                                    : "bfloat16";

  ARBITER_RETURN_IF_ERROR(WriteFileAtomic(dir + "tokenizer.json", bpe.ToTokenizerJson()));

  using OJson = nlohmann::ordered_json;
  OJson tc;
  tc["add_bos_token"] = false;
  tc["add_eos_token"] = false;
  OJson added = OJson::object();
  for (const char* tok : kSpecialTokens) {
    added[std::to_string(bpe.SpecialTokenId(tok))] = OJson{
        {"content", tok}, {"lstrip", false}, {"normalized", false},
        {"rstrip", false}, {"single_word", false}, {"special", true}};
  }
  tc["added_tokens_decoder"] = std::move(added);
  tc["additional_special_tokens"] = OJson::array({"<|im_start|>", "<|im_end|>"});
  tc["bos_token"] = nullptr;
  tc["chat_template"] = ChatMlJinja();
  tc["clean_up_tokenization_spaces"] = false;
  tc["eos_token"] = "<|im_end|>";
  tc["errors"] = "replace";
  tc["model_max_length"] = p.max_position;
  tc["pad_token"] = "<|endoftext|>";
  tc["split_special_tokens"] = false;
  tc["tokenizer_class"] = "PreTrainedTokenizerFast";
  tc["unk_token"] = nullptr;
  ARBITER_RETURN_IF_ERROR(WriteJson(dir + "tokenizer_config.json", tc));
  report("write", 0.2);

  OJson gc;
  gc["bos_token_id"] = endoftext_id;
  gc["eos_token_id"] = OJson::array({im_end_id, endoftext_id});
  gc["pad_token_id"] = endoftext_id;
  gc["do_sample"] = true;
  gc["temperature"] = 0.7;
  gc["top_p"] = 0.8;
  gc["top_k"] = 20;
  gc["repetition_penalty"] = 1.05;
  gc["transformers_version"] = "4.51.0";
  ARBITER_RETURN_IF_ERROR(WriteJson(dir + "generation_config.json", gc));
  report("write", 0.3);

  std::vector<TensorToWrite> to_write;
  to_write.reserve(m.tensors.size());
  for (size_t i = 0; i < m.tensors.size(); ++i) {
    to_write.push_back({m.tensors[i].name, dtype, m.tensors[i].shape, blobs[i]});
  }
  std::map<std::string, std::string> metadata = {
      {"format", "pt"}, {"arbiter.preset", p.name}, {"arbiter.seed", std::to_string(m.seed)}};
  ARBITER_RETURN_IF_ERROR(WriteSafetensors(dir + "model.safetensors", to_write, metadata));
  report("write", 0.9);

  OJson cfg;
  cfg["architectures"] = OJson::array({HfArchitecture(p.model_type)});
  cfg["model_type"] = p.model_type;
  cfg["attention_bias"] = p.model_type == "qwen2";
  cfg["attention_dropout"] = 0.0;
  cfg["bos_token_id"] = endoftext_id;
  cfg["eos_token_id"] = OJson::array({im_end_id, endoftext_id});
  cfg["head_dim"] = p.head_dim;
  cfg["hidden_act"] = "silu";
  cfg["hidden_size"] = p.hidden;
  cfg["initializer_range"] = 0.02;
  cfg["intermediate_size"] = p.intermediate;
  cfg["max_position_embeddings"] = p.max_position;
  if (p.model_type == "llama") {
    cfg["mlp_bias"] = false;
    cfg["pretraining_tp"] = 1;
  }
  cfg["num_attention_heads"] = p.heads;
  cfg["num_hidden_layers"] = p.layers;
  cfg["num_key_value_heads"] = p.kv_heads;
  cfg["rms_norm_eps"] = p.rms_norm_eps;
  cfg["rope_scaling"] = nullptr;
  cfg["rope_theta"] = p.rope_theta;
  if (p.model_type != "llama") {
    cfg["sliding_window"] = nullptr;
    cfg["use_sliding_window"] = false;
    cfg["max_window_layers"] = p.layers;
  }
  cfg["tie_word_embeddings"] = p.tied;
  cfg["torch_dtype"] = dtype_name;
  cfg["transformers_version"] = "4.51.0";
  cfg["use_cache"] = true;
  cfg["vocab_size"] = vocab;
  ARBITER_RETURN_IF_ERROR(WriteJson(dir + "config.json", cfg));
  report("write", 1.0);
  return OkStatus();
}

Status WriteModelGguf(const GeneratedModel& m, const std::string& path,
                      const GgufModelOptions& options, const MakeModelProgress& progress) {
  // The type tensor `t` is stored in.
  auto type_of = [&](const ModelTensorSpec& t) {
    if (t.shape.size() != 2) return GgmlType::kF32;
    for (const auto& [key, key_type] : options.matrix_types) {
      if (t.name.find(key) != std::string::npos) return key_type;
    }
    return options.type;
  };
  const GgmlType type = options.type;
  for (const auto& [key, t] : options.matrix_types) {
    if (!engine_internal::IsComputeType(t)) {
      return InvalidArgumentError("make-model: arbiter does not compute " +
                                  std::string(GgmlTypeName(t)) + " weights");
    }
  }
  if (!engine_internal::IsComputeType(type)) {
    return InvalidArgumentError("make-model: arbiter does not compute " +
                                std::string(GgmlTypeName(type)) + " weights");
  }
  const ModelShape& p = m.shape;
  for (const ModelTensorSpec& t : m.tensors) {
    const GgmlType t_type = type_of(t);
    const int64_t block = GgmlTypeTraitsOf(t_type)->block_elems;
    if (t.shape.size() == 2 && t.shape[1] % block != 0) {
      return InvalidArgumentError(
          "make-model: " + std::string(GgmlTypeName(t_type)) + " stores rows in blocks of " +
          std::to_string(block) + " elements, but tensor " + t.name + " of \"" + p.name +
          "\" has rows of " + std::to_string(t.shape[1]) +
          "; choose a model whose sizes are multiples of " + std::to_string(block) +
          " (demo-chat) or a type with blocks of 32 (q8_0, q4_0, q4_1, q5_0, q5_1)");
    }
  }
  if (m.tokenizer.split_regex != kDefaultBpeSplitRegex) {
    return InvalidArgumentError(
        "make-model: GGUF files name the tokenizer's split regex by "
        "tokenizer.ggml.pre; only the default (\"qwen2\") is known");
  }
  auto report = [&](std::string_view stage, double f) {
    if (progress) progress(stage, f);
  };
  const std::string& arch = p.model_type;
  const std::string a = arch + ".";
  const TrainedBpe& bpe = m.tokenizer;
  GgufWriter w;
  ARBITER_RETURN_IF_ERROR(w.AddString("general.architecture", arch));
  ARBITER_RETURN_IF_ERROR(w.AddString("general.name", p.name));
  if (LlamaFileType(type) >= 0) {
    ARBITER_RETURN_IF_ERROR(
        w.AddUint32("general.file_type", static_cast<uint32_t>(LlamaFileType(type))));
  }
  if (!IsFloatType(type)) ARBITER_RETURN_IF_ERROR(w.AddUint32("general.quantization_version", 2));
  ARBITER_RETURN_IF_ERROR(w.AddUint32(a + "block_count", p.layers));
  ARBITER_RETURN_IF_ERROR(w.AddUint32(a + "context_length", p.max_position));
  ARBITER_RETURN_IF_ERROR(w.AddUint32(a + "embedding_length", p.hidden));
  ARBITER_RETURN_IF_ERROR(w.AddUint32(a + "feed_forward_length", p.intermediate));
  ARBITER_RETURN_IF_ERROR(w.AddUint32(a + "attention.head_count", p.heads));
  ARBITER_RETURN_IF_ERROR(w.AddUint32(a + "attention.head_count_kv", p.kv_heads));
  ARBITER_RETURN_IF_ERROR(w.AddUint32(a + "attention.key_length", p.head_dim));
  ARBITER_RETURN_IF_ERROR(w.AddUint32(a + "attention.value_length", p.head_dim));
  ARBITER_RETURN_IF_ERROR(
      w.AddFloat32(a + "attention.layer_norm_rms_epsilon", static_cast<float>(p.rms_norm_eps)));
  ARBITER_RETURN_IF_ERROR(w.AddFloat32(a + "rope.freq_base", static_cast<float>(p.rope_theta)));
  ARBITER_RETURN_IF_ERROR(w.AddUint32(a + "rope.dimension_count", p.head_dim));
  ARBITER_RETURN_IF_ERROR(w.AddUint32(a + "vocab_size", m.vocab_size()));

  std::vector<std::string> tokens;
  std::vector<int64_t> token_types;
  tokens.reserve(m.vocab_size());
  for (const std::string& t : bpe.vocab) tokens.push_back(internal::BytesToByteLevel(t));
  token_types.assign(tokens.size(), 1);  // normal
  for (const std::string& t : bpe.special_tokens) {
    tokens.push_back(t);
    token_types.push_back(3);  // control
  }
  std::vector<std::string> merges;
  merges.reserve(bpe.merges.size());
  for (const auto& [l, r] : bpe.merges) {
    merges.push_back(internal::BytesToByteLevel(bpe.vocab[l]) + " " +
                     internal::BytesToByteLevel(bpe.vocab[r]));
  }
  ARBITER_RETURN_IF_ERROR(w.AddString("tokenizer.ggml.model", "gpt2"));
  ARBITER_RETURN_IF_ERROR(w.AddString("tokenizer.ggml.pre", "qwen2"));
  ARBITER_RETURN_IF_ERROR(w.AddStringArray("tokenizer.ggml.tokens", tokens));
  ARBITER_ASSIGN_OR_RETURN(GgufValue types,
                           GgufValue::IntArray(GgufValueType::kInt32, token_types));
  ARBITER_RETURN_IF_ERROR(w.Add("tokenizer.ggml.token_type", std::move(types)));
  ARBITER_RETURN_IF_ERROR(w.AddStringArray("tokenizer.ggml.merges", merges));
  ARBITER_RETURN_IF_ERROR(
      w.AddUint32("tokenizer.ggml.bos_token_id", bpe.SpecialTokenId("<|endoftext|>")));
  ARBITER_RETURN_IF_ERROR(
      w.AddUint32("tokenizer.ggml.eos_token_id", bpe.SpecialTokenId("<|im_end|>")));
  ARBITER_RETURN_IF_ERROR(
      w.AddUint32("tokenizer.ggml.padding_token_id", bpe.SpecialTokenId("<|endoftext|>")));
  ARBITER_RETURN_IF_ERROR(w.AddBool("tokenizer.ggml.add_bos_token", false));
  ARBITER_RETURN_IF_ERROR(w.AddBool("tokenizer.ggml.add_eos_token", false));
  ARBITER_RETURN_IF_ERROR(w.AddString("tokenizer.chat_template", ChatMlJinja()));
  ARBITER_RETURN_IF_ERROR(w.Add("arbiter.seed", GgufValue::Uint64(m.seed)));

  // Tensors: values, q/k rows permuted for llama, each row encoded.
  report("weights", 0.0);
  const bool permute = arch == "llama" && options.permute_llama_qk;
  std::vector<std::string> blobs(m.tensors.size());  // GgufWriter keeps views of these
  for (size_t i = 0; i < m.tensors.size(); ++i) {
    const ModelTensorSpec& t = m.tensors[i];
    std::vector<float> v = ModelTensorValues(m, t);
    const int64_t cols = t.shape.size() == 2 ? t.shape[1] : 1;
    const int64_t rows = t.shape[0];
    int permute_heads = 0;
    if (permute && t.name.find("self_attn.q_proj.") != std::string::npos) permute_heads = p.heads;
    if (permute && t.name.find("self_attn.k_proj.") != std::string::npos) {
      permute_heads = p.kv_heads;
    }
    if (permute_heads > 0) {
      // Note [GGUF q/k row order]: file row r holds Hugging Face row GgufRowToHfRow(r).
      std::vector<float> hf = std::move(v);
      v.resize(hf.size());
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t from = GgufRowToHfRow(r, permute_heads, p.head_dim);
        std::memcpy(&v[r * cols], &hf[from * cols], static_cast<size_t>(cols) * sizeof(float));
      }
    }
    std::string& blob = blobs[i];
    const GgmlType t_type = type_of(t);
    if (IsFloatType(t_type)) {
      blob = EncodeFloats(v, t_type);
    } else {
      const size_t row_bytes = *GgmlRowBytes(t_type, cols);
      blob.resize(static_cast<size_t>(rows) * row_bytes);
      for (int64_t r = 0; r < rows; ++r) {
        ARBITER_RETURN_IF_ERROR(
            engine_internal::QuantizeRow(t_type, &v[r * cols], cols, &blob[r * row_bytes]));
      }
    }
    std::vector<int64_t> dims(t.shape.rbegin(), t.shape.rend());
    ARBITER_RETURN_IF_ERROR(w.AddTensor(GgufTensorName(t.name), std::move(dims), t_type, blob));
    report("weights", static_cast<double>(i + 1) / m.tensors.size());
  }

  report("write", 0.0);
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  if (!parent.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(parent, ec);
    if (ec) {
      return InternalError("make-model: cannot create directory " + parent.string() + ": " +
                           ec.message());
    }
  }
  ARBITER_RETURN_IF_ERROR(w.Write(path));
  report("write", 1.0);
  return OkStatus();
}

Status MakeModel(std::string_view preset, const std::string& out, const MakeModelOptions& options,
                 const MakeModelProgress& progress) {
  ARBITER_ASSIGN_OR_RETURN(ModelShape shape, PresetShape(preset));
  GgmlType type = shape.bf16 ? GgmlType::kBF16 : GgmlType::kF32;
  if (!options.dtype.empty()) {
    ARBITER_ASSIGN_OR_RETURN(type, ParseModelDtype(options.dtype, options.format));
  }
  if (options.format == ModelFormat::kGguf && !IsFloatType(type)) {
    // Refuse a block size that does not divide the rows before training.
    const int64_t block = GgmlTypeTraitsOf(type)->block_elems;
    for (int n : {shape.hidden, shape.intermediate, shape.heads * shape.head_dim}) {
      if (n % block != 0) {
        return InvalidArgumentError(
            "make-model: --dtype " + options.dtype + " stores rows in blocks of " +
            std::to_string(block) + " elements, but preset \"" + shape.name + "\" has rows of " +
            std::to_string(n) + " (hidden " + std::to_string(shape.hidden) + ", intermediate " +
            std::to_string(shape.intermediate) + ", heads × head_dim " +
            std::to_string(shape.heads * shape.head_dim) +
            "); use demo-chat, or a type with "
            "blocks of 32 (q8_0, q4_0, q4_1, q5_0, q5_1)");
      }
    }
  }
  ARBITER_ASSIGN_OR_RETURN(GeneratedModel m, GenerateModel(shape, options.seed, progress));
  if (options.format == ModelFormat::kGguf) {
    GgufModelOptions g;
    g.type = type;
    return WriteModelGguf(m, out, g, progress);
  }
  return WriteModelDirectory(m, out, type, progress);
}

Status MakeModel(std::string_view preset, const std::string& out_dir, uint64_t seed,
                 const MakeModelProgress& progress) {
  MakeModelOptions o;
  o.seed = seed;
  return MakeModel(preset, out_dir, o, progress);
}

}  // namespace arbiter
