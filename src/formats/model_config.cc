// config.json reader for Llama-family decoders.
//
// Parses into native ModelConfig values at once (STYLE.md: "parse everything
// into native types as early as possible"). nlohmann exceptions are caught
// here and become kDataLoss. A JSON null counts as "absent" for optional
// fields, which is how transformers writes unset values.
//
// Besides the fields in model_config.h, two spellings from newer
// transformers releases are accepted: "dtype" for "torch_dtype", and
// "rope_parameters": {"rope_theta": ...} when top-level rope_theta is absent.

#include "arbiter/formats/model_config.h"

#include <cmath>
#include <limits>

#include <nlohmann/json.hpp>

#include "arbiter/base/file.h"

namespace arbiter {
namespace {

using json = nlohmann::json;

constexpr size_t kMaxConfigBytes = 16u << 20;

std::string TypeName(const json& j) {
  if (j.is_number_integer()) return "an integer";
  if (j.is_number_float()) return "a float";
  if (j.is_array()) return "an array";
  if (j.is_object()) return "an object";
  return std::string("a ") + j.type_name();
}

// The field's value, or nullptr when absent or null.
const json* Field(const json& root, const char* name) {
  auto it = root.find(name);
  if (it == root.end() || it->is_null()) return nullptr;
  return &*it;
}

class Reader {
 public:
  Reader(const json& root, const std::string& file) : root_(root), file_(file) {}

  Status Error(const char* field, const std::string& what) const {
    return DataLossError(file_ + ": field \"" + field + "\" " + what);
  }

  // A positive int; `fallback` < 0 means required.
  Status PositiveInt(const char* name, int fallback, int* out) const {
    const json* v = Field(root_, name);
    if (v == nullptr) {
      if (fallback < 0) return Error(name, "is missing");
      *out = fallback;
      return OkStatus();
    }
    if (!v->is_number_integer()) return Error(name, "is " + TypeName(*v) + ", expected an integer");
    if (v->is_number_unsigned()) {
      uint64_t u = v->get<uint64_t>();
      if (u == 0 || u > static_cast<uint64_t>(std::numeric_limits<int>::max())) {
        return Error(name, "is " + std::to_string(u) + ", expected 1.." +
                               std::to_string(std::numeric_limits<int>::max()));
      }
      *out = static_cast<int>(u);
      return OkStatus();
    }
    return Error(name, "is " + std::to_string(v->get<int64_t>()) + ", expected > 0");
  }

  // A positive finite float (integers accepted).
  Status PositiveFloat(const char* name, const json* v, float* out) const {
    if (v == nullptr) return OkStatus();  // keep the default
    if (!v->is_number()) return Error(name, "is " + TypeName(*v) + ", expected a number");
    double d = v->get<double>();
    float f = static_cast<float>(d);
    if (!(d > 0) || !std::isfinite(f) || f == 0.0f) {
      return Error(name, "is " + v->dump() + ", expected a positive number within float range");
    }
    *out = f;
    return OkStatus();
  }

  Status Bool(const char* name, bool fallback, bool* out) const {
    const json* v = Field(root_, name);
    if (v == nullptr) {
      *out = fallback;
      return OkStatus();
    }
    if (!v->is_boolean()) return Error(name, "is " + TypeName(*v) + ", expected true or false");
    *out = v->get<bool>();
    return OkStatus();
  }

  // int, list of ints, or null/absent (empty).
  Status TokenIds(const char* name, std::vector<int>* out) const {
    out->clear();
    const json* v = Field(root_, name);
    if (v == nullptr) return OkStatus();
    auto one = [&](const json& id) -> Status {
      if (!id.is_number_integer()) {
        return Error(name, "holds " + TypeName(id) + ", expected token ids (integers)");
      }
      if (!id.is_number_unsigned() ||
          id.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int>::max())) {
        return Error(name, "holds " + id.dump() + ", which is not a valid token id");
      }
      out->push_back(static_cast<int>(id.get<uint64_t>()));
      return OkStatus();
    };
    if (v->is_array()) {
      for (const json& id : *v) ARBITER_RETURN_IF_ERROR(one(id));
      return OkStatus();
    }
    if (v->is_number_integer()) return one(*v);
    return Error(name, "is " + TypeName(*v) + ", expected an integer, a list of integers or null");
  }

 private:
  const json& root_;
  const std::string& file_;
};

struct ArchEntry {
  std::string_view name;
  Architecture arch;
};

constexpr ArchEntry kArchitectures[] = {
    {"LlamaForCausalLM", Architecture::kLlama}, {"LlamaModel", Architecture::kLlama},
    {"Qwen2ForCausalLM", Architecture::kQwen2}, {"Qwen2Model", Architecture::kQwen2},
    {"Qwen3ForCausalLM", Architecture::kQwen3}, {"Qwen3Model", Architecture::kQwen3},
};

Result<ModelConfig> ParseRoot(const json& root, const std::string& file) {
  if (!root.is_object()) {
    return DataLossError(file + ": top level is " + TypeName(root) + ", expected a JSON object");
  }
  Reader r(root, file);
  ModelConfig c;

  const json* archs = Field(root, "architectures");
  if (archs == nullptr) return r.Error("architectures", "is missing");
  if (!archs->is_array() || archs->empty() || !(*archs)[0].is_string()) {
    return r.Error("architectures", "must be a non-empty list of strings, got " + archs->dump());
  }
  c.architecture_name = (*archs)[0].get<std::string>();
  bool known = false;
  for (const ArchEntry& e : kArchitectures) {
    if (e.name == c.architecture_name) {
      c.arch = e.arch;
      known = true;
    }
  }
  if (!known) {
    return UnimplementedError(file + ": architecture \"" + c.architecture_name +
                              "\" is not supported (supported: LlamaForCausalLM, "
                              "Qwen2ForCausalLM, Qwen3ForCausalLM)");
  }

  ARBITER_RETURN_IF_ERROR(r.PositiveInt("hidden_size", -1, &c.hidden_size));
  ARBITER_RETURN_IF_ERROR(r.PositiveInt("intermediate_size", -1, &c.intermediate_size));
  ARBITER_RETURN_IF_ERROR(r.PositiveInt("num_hidden_layers", -1, &c.num_hidden_layers));
  ARBITER_RETURN_IF_ERROR(r.PositiveInt("num_attention_heads", -1, &c.num_attention_heads));
  ARBITER_RETURN_IF_ERROR(r.PositiveInt("vocab_size", -1, &c.vocab_size));
  ARBITER_RETURN_IF_ERROR(
      r.PositiveInt("num_key_value_heads", c.num_attention_heads, &c.num_key_value_heads));
  if (c.num_attention_heads % c.num_key_value_heads != 0) {
    return r.Error("num_key_value_heads",
                   "is " + std::to_string(c.num_key_value_heads) + ", which does not divide " +
                       "num_attention_heads " + std::to_string(c.num_attention_heads));
  }
  if (Field(root, "head_dim") == nullptr && c.hidden_size % c.num_attention_heads != 0) {
    return r.Error("head_dim", "is missing and hidden_size " + std::to_string(c.hidden_size) +
                                   " is not a multiple of num_attention_heads " +
                                   std::to_string(c.num_attention_heads));
  }
  ARBITER_RETURN_IF_ERROR(
      r.PositiveInt("head_dim", c.hidden_size / c.num_attention_heads, &c.head_dim));
  ARBITER_RETURN_IF_ERROR(
      r.PositiveInt("max_position_embeddings", 2048, &c.max_position_embeddings));

  ARBITER_RETURN_IF_ERROR(r.PositiveFloat("rms_norm_eps", Field(root, "rms_norm_eps"), &c.rms_norm_eps));
  const json* theta = Field(root, "rope_theta");
  if (theta == nullptr) {
    const json* params = Field(root, "rope_parameters");
    if (params != nullptr && params->is_object()) theta = Field(*params, "rope_theta");
  }
  ARBITER_RETURN_IF_ERROR(r.PositiveFloat("rope_theta", theta, &c.rope_theta));

  ARBITER_RETURN_IF_ERROR(r.Bool("tie_word_embeddings", false, &c.tie_word_embeddings));
  ARBITER_RETURN_IF_ERROR(
      r.Bool("attention_bias", c.arch == Architecture::kQwen2, &c.attention_bias));
  c.qk_norm = c.arch == Architecture::kQwen3;

  ARBITER_RETURN_IF_ERROR(r.TokenIds("bos_token_id", &c.bos_token_ids));
  ARBITER_RETURN_IF_ERROR(r.TokenIds("eos_token_id", &c.eos_token_ids));

  const char* dtype_field = Field(root, "torch_dtype") != nullptr ? "torch_dtype" : "dtype";
  if (const json* dtype = Field(root, dtype_field)) {
    if (!dtype->is_string()) {
      return r.Error(dtype_field, "is " + TypeName(*dtype) + ", expected a string");
    }
    c.torch_dtype = dtype->get<std::string>();
  }
  return c;
}

}  // namespace

Result<ModelConfig> ParseModelConfig(std::string_view json_text, const std::string& file) {
  json root;
  try {
    root = json::parse(json_text.begin(), json_text.end(), nullptr,
                       /*allow_exceptions=*/true, /*ignore_comments=*/false);
  } catch (const std::exception& e) {
    return DataLossError(file + ": not valid JSON: " + e.what());
  }
  try {
    return ParseRoot(root, file);
  } catch (const std::exception& e) {
    // Not expected: ParseRoot checks every type before reading it.
    return DataLossError(file + ": malformed config: " + e.what());
  }
}

Result<ModelConfig> LoadModelConfig(const std::string& path) {
  Result<std::string> text = ReadFile(path, kMaxConfigBytes);
  if (!text.ok()) return text.status();
  return ParseModelConfig(*text, path);
}

}  // namespace arbiter
