// make-model: deterministic demo and test models in Hugging Face layout.
//
// Steps: train the byte-level BPE tokenizer on Debian's license texts (once
// per call), generate the weights, then write tokenizer.json,
// tokenizer_config.json, generation_config.json, model.safetensors and —
// last, so a directory with a config.json is complete — config.json. Each
// file is written atomically (temp + fsync + rename).
//
// Note [Deterministic weights]
// Every tensor's values come from a splitmix64 stream seeded with
// splitmix64(seed ^ XXH3(tensor name)), so a tensor depends only on the seed
// and its own name (not on generation order). Values are "normal-ish":
// Irwin–Hall sums of four 16-bit uniforms, rescaled to unit variance, times
// the tensor's std:
//   embeddings / untied lm_head   1 / sqrt(hidden)  (logits ~ unit scale)
//   projections                   0.5 / sqrt(fan_in) (≈ 0.02 at hidden 768)
//   biases                        0.02
//   RMSNorm weights               1 + 0.05·noise (so tests exercise them)
// bf16 presets round each value with F32ToBF16 (round to nearest even).
#include "tools/model_maker/model_maker.h"

#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>

#include "arbiter/base/file.h"
#include "arbiter/base/hash.h"
#include "arbiter/formats/safetensors.h"
#include "tools/model_maker/bpe_trainer.h"

namespace arbiter {
namespace {

struct Preset {
  const char* name;
  const char* description;
  const char* architecture;  // config.json architectures[0]
  const char* model_type;    // config.json model_type
  int hidden;
  int layers;
  int heads;
  int kv_heads;
  int head_dim;
  int intermediate;
  bool tied;
  bool attention_bias;  // Qwen2
  bool qk_norm;         // Qwen3
  bool bf16;
  int merges;
  int max_position;
  double rope_theta;
  bool embedding;
};

// Special tokens of every preset (ChatML, Qwen order).
const char* const kSpecialTokens[] = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"};

const Preset kPresets[] = {
    {"tiny", "Llama, 2 layers, hidden 64, 4 heads / 2 KV heads (GQA), f32, ~1 MB: unit and "
             "end-to-end tests",
     "LlamaForCausalLM", "llama", 64, 2, 4, 2, 16, 128, false, false, false, false, 512, 2048,
     10000.0, false},
    {"tiny-qwen2", "Qwen2 with q/k/v bias, 2 layers, hidden 64, tied embeddings, f32: numerical "
                   "reference tests",
     "Qwen2ForCausalLM", "qwen2", 64, 2, 4, 2, 16, 128, true, true, false, false, 512, 2048,
     1000000.0, false},
    {"tiny-qwen3", "Qwen3 with per-head q/k RMSNorm, 2 layers, hidden 64, head_dim 32, f32: "
                   "numerical reference tests",
     "Qwen3ForCausalLM", "qwen3", 64, 2, 4, 2, 32, 128, false, false, true, false, 512, 2048,
     1000000.0, false},
    {"demo-chat", "Qwen3-style chat model: hidden 768, 8 layers, 12 heads / 4 KV heads, tied "
                  "embeddings, vocab ~4000, bf16 (~53M parameters, ~106 MB)",
     "Qwen3ForCausalLM", "qwen3", 768, 8, 12, 4, 64, 2048, true, false, true, true, 3700, 4096,
     1000000.0, false},
    {"demo-embed", "Qwen3-style embedding model: hidden 384, 4 layers, 6 heads / 2 KV heads, "
                   "bf16, mean-pooled embeddings (~8M parameters, ~16 MB)",
     "Qwen3ForCausalLM", "qwen3", 384, 4, 6, 2, 64, 1024, true, false, true, true, 3700, 4096,
     1000000.0, true},
};

const Preset* FindPreset(std::string_view name) {
  for (const Preset& p : kPresets) {
    if (name == p.name) return &p;
  }
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

struct Tensor {
  std::string name;
  std::vector<int64_t> shape;
  std::string bytes;
};

std::string ChatMlJinja() {
  return "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + "
         "message['content'] + '<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt "
         "%}{{ '<|im_start|>assistant\\n' }}{% endif %}";
}

Status WriteJson(const std::string& path, const nlohmann::ordered_json& j) {
  return WriteFileAtomic(path, j.dump(2) + "\n");
}

}  // namespace

std::vector<std::string> ModelPresetNames() {
  std::vector<std::string> names;
  for (const Preset& p : kPresets) names.emplace_back(p.name);
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

Status MakeModel(std::string_view preset_name, const std::string& out_dir, uint64_t seed,
                 const MakeModelProgress& progress) {
  const Preset* p = FindPreset(preset_name);
  if (p == nullptr) {
    std::string list;
    for (const Preset& q : kPresets) list += std::string(list.empty() ? "" : ", ") + q.name;
    return NotFoundError("unknown model preset \"" + std::string(preset_name) +
                         "\"; presets: " + list);
  }
  auto report = [&](std::string_view stage, double f) {
    if (progress) progress(stage, f);
  };

  // Tokenizer.
  report("tokenizer", 0.0);
  ARBITER_ASSIGN_OR_RETURN(std::string corpus, DefaultTrainingCorpus());
  BpeTrainerOptions topts;
  topts.num_merges = p->merges;
  topts.special_tokens.assign(std::begin(kSpecialTokens), std::end(kSpecialTokens));
  ARBITER_ASSIGN_OR_RETURN(TrainedBpe bpe, TrainBpe(corpus, topts));
  const int vocab = bpe.vocab_size();
  const int32_t endoftext_id = bpe.SpecialTokenId("<|endoftext|>");
  const int32_t im_end_id = bpe.SpecialTokenId("<|im_end|>");
  std::string tokenizer_json = bpe.ToTokenizerJson();
  report("tokenizer", 1.0);

  // Weights.
  const int h = p->hidden, hd = p->head_dim, inter = p->intermediate;
  const int q_dim = p->heads * hd, kv_dim = p->kv_heads * hd;
  struct Spec {
    std::string name;
    std::vector<int64_t> shape;
    float mean;
    float std;
  };
  std::vector<Spec> specs;
  const float emb_std = 1.0f / std::sqrt(static_cast<float>(h));
  auto proj_std = [](int fan_in) { return 0.5f / std::sqrt(static_cast<float>(fan_in)); };
  specs.push_back({"model.embed_tokens.weight", {vocab, h}, 0.0f, emb_std});
  for (int l = 0; l < p->layers; ++l) {
    std::string pre = "model.layers." + std::to_string(l) + ".";
    specs.push_back({pre + "input_layernorm.weight", {h}, 1.0f, 0.05f});
    specs.push_back({pre + "self_attn.q_proj.weight", {q_dim, h}, 0.0f, proj_std(h)});
    specs.push_back({pre + "self_attn.k_proj.weight", {kv_dim, h}, 0.0f, proj_std(h)});
    specs.push_back({pre + "self_attn.v_proj.weight", {kv_dim, h}, 0.0f, proj_std(h)});
    if (p->attention_bias) {
      specs.push_back({pre + "self_attn.q_proj.bias", {q_dim}, 0.0f, 0.02f});
      specs.push_back({pre + "self_attn.k_proj.bias", {kv_dim}, 0.0f, 0.02f});
      specs.push_back({pre + "self_attn.v_proj.bias", {kv_dim}, 0.0f, 0.02f});
    }
    if (p->qk_norm) {
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
  if (!p->tied) specs.push_back({"lm_head.weight", {vocab, h}, 0.0f, emb_std});

  report("weights", 0.0);
  std::vector<Tensor> tensors;
  tensors.reserve(specs.size());
  std::vector<float> buf;
  for (size_t i = 0; i < specs.size(); ++i) {
    const Spec& s = specs[i];
    int64_t n = 1;
    for (int64_t d : s.shape) n *= d;
    buf.resize(static_cast<size_t>(n));
    FillNormalish(seed, s.name, s.mean, s.std, &buf);
    Tensor t{s.name, s.shape, {}};
    if (p->bf16) {
      t.bytes.resize(buf.size() * 2);
      auto* dst = reinterpret_cast<uint16_t*>(t.bytes.data());
      for (size_t k = 0; k < buf.size(); ++k) dst[k] = F32ToBF16(buf[k]);
    } else {
      t.bytes.assign(reinterpret_cast<const char*>(buf.data()), buf.size() * sizeof(float));
    }
    tensors.push_back(std::move(t));
    report("weights", static_cast<double>(i + 1) / specs.size());
  }

  // Files.
  report("write", 0.0);
  std::error_code ec;
  std::filesystem::create_directories(out_dir, ec);
  if (ec) {
    return InternalError("make-model: cannot create output directory " + out_dir + ": " +
                         ec.message());
  }
  const std::string dir = out_dir + "/";
  const char* dtype_name = p->bf16 ? "bfloat16" : "float32";

  ARBITER_RETURN_IF_ERROR(WriteFileAtomic(dir + "tokenizer.json", tokenizer_json));

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
  tc["model_max_length"] = p->max_position;
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
  to_write.reserve(tensors.size());
  for (const Tensor& t : tensors) {
    to_write.push_back({t.name, p->bf16 ? DType::kBF16 : DType::kF32, t.shape, t.bytes});
  }
  std::map<std::string, std::string> metadata = {
      {"format", "pt"}, {"arbiter.preset", p->name}, {"arbiter.seed", std::to_string(seed)}};
  ARBITER_RETURN_IF_ERROR(WriteSafetensors(dir + "model.safetensors", to_write, metadata));
  report("write", 0.9);

  OJson cfg;
  cfg["architectures"] = OJson::array({p->architecture});
  cfg["model_type"] = p->model_type;
  cfg["attention_bias"] = p->attention_bias;
  cfg["attention_dropout"] = 0.0;
  cfg["bos_token_id"] = endoftext_id;
  cfg["eos_token_id"] = OJson::array({im_end_id, endoftext_id});
  cfg["head_dim"] = hd;
  cfg["hidden_act"] = "silu";
  cfg["hidden_size"] = h;
  cfg["initializer_range"] = 0.02;
  cfg["intermediate_size"] = inter;
  cfg["max_position_embeddings"] = p->max_position;
  if (std::string_view(p->model_type) == "llama") {
    cfg["mlp_bias"] = false;
    cfg["pretraining_tp"] = 1;
  }
  cfg["num_attention_heads"] = p->heads;
  cfg["num_hidden_layers"] = p->layers;
  cfg["num_key_value_heads"] = p->kv_heads;
  cfg["rms_norm_eps"] = 1e-6;
  cfg["rope_scaling"] = nullptr;
  cfg["rope_theta"] = p->rope_theta;
  if (std::string_view(p->model_type) != "llama") {
    cfg["sliding_window"] = nullptr;
    cfg["use_sliding_window"] = false;
    cfg["max_window_layers"] = p->layers;
  }
  cfg["tie_word_embeddings"] = p->tied;
  cfg["torch_dtype"] = dtype_name;
  cfg["transformers_version"] = "4.51.0";
  cfg["use_cache"] = true;
  cfg["vocab_size"] = vocab;
  ARBITER_RETURN_IF_ERROR(WriteJson(dir + "config.json", cfg));
  report("write", 1.0);
  return OkStatus();
}

}  // namespace arbiter
