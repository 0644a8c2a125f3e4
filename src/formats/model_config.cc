// config.json reader for Llama-family decoders, and the same ModelConfig
// from a GGUF file's metadata (ModelConfigFromGguf, at the end; its key
// table is in model_config.h).
//
// Parses into native ModelConfig values at once (STYLE.md: "parse everything
// into native types as early as possible"). nlohmann exceptions are caught
// here and become kDataLoss. A JSON null counts as "absent" for optional
// fields, which is how transformers writes unset values.
//
// Besides the fields in model_config.h, two spellings from newer
// transformers releases are accepted: "dtype" for "torch_dtype", and
// "rope_parameters": {"rope_theta": ..., "rope_type": ..., ...} when
// top-level rope_theta / rope_scaling are absent.
//
// rope_scaling is all-or-nothing: a type this engine does not implement is
// kUnimplemented, never "ignored", because RoPE without the checkpoint's
// scaling still runs and yields plausible but wrong logits.

#include "arbiter/formats/model_config.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include <nlohmann/json.hpp>

#include "formats/internal/json_type_name.h"

#include "arbiter/base/file.h"
#include "arbiter/formats/gguf.h"

namespace arbiter {
namespace {

using json = nlohmann::json;

constexpr size_t kMaxConfigBytes = 16u << 20;

using formats_internal::JsonTypeName;

// The field's value, or nullptr when absent or null.
const json* Field(const json& root, const char* name) {
  auto it = root.find(name);
  if (it == root.end() || it->is_null()) return nullptr;
  return &*it;
}

class Reader {
 public:
  Reader(const json& root, const std::string& file) : root_(root), file_(file) {}

  Status Error(const std::string& field, const std::string& what) const {
    return DataLossError(file_ + ": field \"" + field + "\" " + what);
  }

  // A positive int; `fallback` < 0 means required.
  Status PositiveInt(const char* name, int fallback, int* out) const {
    return PositiveInt(name, Field(root_, name), fallback, out);
  }

  // `v` (nullptr when absent or null) as a positive int named `name`.
  Status PositiveInt(const std::string& name, const json* v, int fallback, int* out) const {
    if (v == nullptr) {
      if (fallback < 0) return Error(name, "is missing");
      *out = fallback;
      return OkStatus();
    }
    if (!v->is_number_integer()) return Error(name, "is " + JsonTypeName(*v) + ", expected an integer");
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
  Status PositiveFloat(const std::string& name, const json* v, float* out) const {
    if (v == nullptr) return OkStatus();  // keep the default
    if (!v->is_number()) return Error(name, "is " + JsonTypeName(*v) + ", expected a number");
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
    if (!v->is_boolean()) return Error(name, "is " + JsonTypeName(*v) + ", expected true or false");
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
        return Error(name, "holds " + JsonTypeName(id) + ", expected token ids (integers)");
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
    return Error(name, "is " + JsonTypeName(*v) + ", expected an integer, a list of integers or null");
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

constexpr const char* kSupportedRopeScaling = "default (or null), linear, llama3";

// Parses `obj` (the value of `field`: "rope_scaling" or "rope_parameters")
// into *out. Errors name nested fields as "rope_scaling.factor".
Status ParseRopeScaling(const Reader& r, const std::string& file, const std::string& field,
                        const json& obj, RopeScaling* out) {
  *out = RopeScaling{};
  if (!obj.is_object()) {
    return r.Error(field, "is " + JsonTypeName(obj) + ", expected an object or null");
  }
  // transformers: rope_scaling.get("rope_type", rope_scaling.get("type")).
  const char* type_key = Field(obj, "rope_type") != nullptr ? "rope_type" : "type";
  const json* type = Field(obj, type_key);
  if (type == nullptr) {
    // A bare rope_parameters {"rope_theta": ...} means default RoPE.
    if (field == "rope_parameters") return OkStatus();
    return r.Error(field, "has no \"rope_type\" (or \"type\"); expected one of " +
                              std::string(kSupportedRopeScaling));
  }
  if (!type->is_string()) {
    return r.Error(field + "." + type_key, "is " + JsonTypeName(*type) + ", expected a string");
  }
  const std::string name = type->get<std::string>();
  if (name == "default") return OkStatus();
  if (name != "linear" && name != "llama3") {
    return UnimplementedError(file + ": " + field + " type \"" + name +
                              "\" is not supported (supported: " + kSupportedRopeScaling +
                              "); running it as plain RoPE would give wrong logits");
  }
  // Fetches a required field; nullptr is reported with missing(key).
  auto required = [&](const char* key) { return Field(obj, key); };
  auto missing = [&](const char* key) {
    return r.Error(field + "." + key, "is missing (required for rope type \"" + name + "\")");
  };
  if (required("factor") == nullptr) return missing("factor");
  ARBITER_RETURN_IF_ERROR(r.PositiveFloat(field + ".factor", required("factor"), &out->factor));
  if (name == "linear") {
    out->type = RopeScalingType::kLinear;
    return OkStatus();
  }
  for (const char* key :
       {"low_freq_factor", "high_freq_factor", "original_max_position_embeddings"}) {
    if (required(key) == nullptr) return missing(key);
  }
  ARBITER_RETURN_IF_ERROR(r.PositiveFloat(field + ".low_freq_factor", required("low_freq_factor"),
                                          &out->low_freq_factor));
  ARBITER_RETURN_IF_ERROR(r.PositiveFloat(field + ".high_freq_factor", required("high_freq_factor"),
                                          &out->high_freq_factor));
  if (!(out->high_freq_factor > out->low_freq_factor)) {
    return r.Error(field + ".high_freq_factor",
                   "is " + obj.at("high_freq_factor").dump() + ", expected more than " + field +
                       ".low_freq_factor " + obj.at("low_freq_factor").dump());
  }
  ARBITER_RETURN_IF_ERROR(r.PositiveInt(field + ".original_max_position_embeddings",
                                        required("original_max_position_embeddings"), -1,
                                        &out->original_max_position_embeddings));
  out->type = RopeScalingType::kLlama3;
  return OkStatus();
}

Result<ModelConfig> ParseRoot(const json& root, const std::string& file) {
  if (!root.is_object()) {
    return DataLossError(file + ": top level is " + JsonTypeName(root) + ", expected a JSON object");
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
  if (const json* scaling = Field(root, "rope_scaling")) {
    ARBITER_RETURN_IF_ERROR(ParseRopeScaling(r, file, "rope_scaling", *scaling, &c.rope_scaling));
  } else if (const json* params = Field(root, "rope_parameters")) {
    ARBITER_RETURN_IF_ERROR(ParseRopeScaling(r, file, "rope_parameters", *params, &c.rope_scaling));
  }

  ARBITER_RETURN_IF_ERROR(r.Bool("tie_word_embeddings", false, &c.tie_word_embeddings));
  ARBITER_RETURN_IF_ERROR(
      r.Bool("attention_bias", c.arch == Architecture::kQwen2, &c.attention_bias));
  c.qk_norm = c.arch == Architecture::kQwen3;

  ARBITER_RETURN_IF_ERROR(r.TokenIds("bos_token_id", &c.bos_token_ids));
  ARBITER_RETURN_IF_ERROR(r.TokenIds("eos_token_id", &c.eos_token_ids));

  const char* dtype_field = Field(root, "torch_dtype") != nullptr ? "torch_dtype" : "dtype";
  if (const json* dtype = Field(root, dtype_field)) {
    if (!dtype->is_string()) {
      return r.Error(dtype_field, "is " + JsonTypeName(*dtype) + ", expected a string");
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

// ---------------------------------------------------------------------------
// GGUF metadata → ModelConfig (the key table is in model_config.h).

namespace {

struct GgufArchEntry {
  std::string_view name;  // general.architecture
  Architecture arch;
  std::string_view architecture_name;
};

constexpr GgufArchEntry kGgufArchitectures[] = {
    {"llama", Architecture::kLlama, "LlamaForCausalLM"},
    {"mistral", Architecture::kLlama, "LlamaForCausalLM"},
    {"qwen2", Architecture::kQwen2, "Qwen2ForCausalLM"},
    {"qwen3", Architecture::kQwen3, "Qwen3ForCausalLM"},
};

class GgufConfigReader {
 public:
  explicit GgufConfigReader(const GgufFile& gguf) : gguf_(gguf) {}

  Status Error(const std::string& key, const std::string& what) const {
    return DataLossError(gguf_.name() + ": key \"" + key + "\": " + what);
  }

  // A count in 1..INT_MAX. `fallback` < 0: required.
  Status PositiveInt(const std::string& key, int fallback, int* out) const {
    Result<uint64_t> v = gguf_.GetUint(key);
    if (v.status().code() == StatusCode::kNotFound) {
      if (fallback < 0) return DataLossError(v.status().message());
      *out = fallback;
      return OkStatus();
    }
    if (!v.ok()) return v.status();
    if (*v == 0 || *v > static_cast<uint64_t>(std::numeric_limits<int>::max())) {
      return Error(key, "is " + std::to_string(*v) + ", expected 1.." +
                            std::to_string(std::numeric_limits<int>::max()));
    }
    *out = static_cast<int>(*v);
    return OkStatus();
  }

  // A positive finite float; absent keeps *out unless `required`.
  Status PositiveFloat(const std::string& key, bool required, float* out) const {
    Result<double> v = gguf_.GetFloat(key);
    if (v.status().code() == StatusCode::kNotFound) {
      return required ? DataLossError(v.status().message()) : OkStatus();
    }
    if (!v.ok()) return v.status();
    const float f = static_cast<float>(*v);
    if (!(*v > 0) || !std::isfinite(f) || f == 0.0f) {
      return Error(key, "is " + std::to_string(*v) + ", expected a positive number within float range");
    }
    *out = f;
    return OkStatus();
  }

  // Appends the token id at `key`, when present, unless already listed.
  Status TokenId(const std::string& key, std::vector<int>* ids) const {
    Result<uint64_t> v = gguf_.GetUint(key);
    if (v.status().code() == StatusCode::kNotFound) return OkStatus();
    if (!v.ok()) return v.status();
    if (*v > static_cast<uint64_t>(std::numeric_limits<int>::max())) {
      return Error(key, "is " + std::to_string(*v) + ", which is not a valid token id");
    }
    const int id = static_cast<int>(*v);
    if (std::find(ids->begin(), ids->end(), id) == ids->end()) ids->push_back(id);
    return OkStatus();
  }

 private:
  const GgufFile& gguf_;
};

}  // namespace

namespace {

// The bytes of tensor `t`, read from the file OpenGguf opened (bounds
// checked against the file's size again: it may have changed since).
Result<std::string> ReadTensorFromFile(const GgufFile& gguf, const GgufTensorInfo& t) {
  ARBITER_ASSIGN_OR_RETURN(MappedFile f, MappedFile::Open(gguf.name()));
  const uint64_t at = gguf.data_offset() + t.offset;
  if (at > f.size() || t.size_bytes > f.size() - at) {
    return DataLossError(gguf.name() + ": the file ends before tensor \"" + t.name + "\" does");
  }
  return std::string(reinterpret_cast<const char*>(f.data() + at), t.size_bytes);
}

// rope_freqs.weight → config.rope_scaling.freq_factors (see the header).
Status ReadRopeFreqs(const GgufFile& gguf, const GgufTensorInfo& t,
                     const GgufTensorReader& read_tensor, ModelConfig* c) {
  const std::string what = gguf.name() + ": tensor \"" + t.name + "\" (RoPE frequency factors)";
  const int64_t want = c->head_dim / 2;
  if (t.type != GgmlType::kF32 || t.n_elements != want) {
    return DataLossError(what + " is " + std::string(GgmlTypeName(t.type)) + " with " +
                         std::to_string(t.n_elements) + " values; expected F32 with head_dim / 2 = " +
                         std::to_string(want));
  }
  Result<std::string> bytes = read_tensor ? read_tensor(t) : ReadTensorFromFile(gguf, t);
  if (!bytes.ok()) return bytes.status();
  if (bytes->size() != static_cast<size_t>(want) * sizeof(float)) {
    return DataLossError(what + ": read " + std::to_string(bytes->size()) + " bytes, expected " +
                         std::to_string(want * sizeof(float)));
  }
  c->rope_scaling.freq_factors.resize(static_cast<size_t>(want));
  std::memcpy(c->rope_scaling.freq_factors.data(), bytes->data(), bytes->size());
  for (size_t i = 0; i < c->rope_scaling.freq_factors.size(); ++i) {
    const float f = c->rope_scaling.freq_factors[i];
    if (!std::isfinite(f) || f <= 0.0f) {
      return DataLossError(what + ": value " + std::to_string(i) + " is " + std::to_string(f) +
                           "; factors must be finite and > 0");
    }
  }
  return OkStatus();
}

}  // namespace

Result<ModelConfig> ModelConfigFromGguf(const GgufFile& gguf, const GgufTensorReader& read_tensor) {
  const std::string& file = gguf.name();
  GgufConfigReader r(gguf);
  ModelConfig c;

  Result<std::string> arch = gguf.GetString("general.architecture");
  if (arch.status().code() == StatusCode::kNotFound) return DataLossError(arch.status().message());
  if (!arch.ok()) return arch.status();
  const GgufArchEntry* entry = nullptr;
  for (const GgufArchEntry& e : kGgufArchitectures) {
    if (e.name == *arch) entry = &e;
  }
  if (entry == nullptr) {
    std::string shown = arch->substr(0, 100);
    return UnimplementedError(file + ": key \"general.architecture\": \"" + shown +
                              "\" is not supported (supported: llama, mistral, qwen2, qwen3)");
  }
  c.arch = entry->arch;
  c.architecture_name = std::string(entry->architecture_name);
  const std::string a = *arch + ".";

  ARBITER_RETURN_IF_ERROR(r.PositiveInt(a + "block_count", -1, &c.num_hidden_layers));
  ARBITER_RETURN_IF_ERROR(r.PositiveInt(a + "embedding_length", -1, &c.hidden_size));
  ARBITER_RETURN_IF_ERROR(r.PositiveInt(a + "feed_forward_length", -1, &c.intermediate_size));
  ARBITER_RETURN_IF_ERROR(r.PositiveInt(a + "attention.head_count", -1, &c.num_attention_heads));
  ARBITER_RETURN_IF_ERROR(r.PositiveInt(a + "attention.head_count_kv", c.num_attention_heads,
                                        &c.num_key_value_heads));
  if (c.num_attention_heads % c.num_key_value_heads != 0) {
    return r.Error(a + "attention.head_count_kv",
                   "is " + std::to_string(c.num_key_value_heads) + ", which does not divide " +
                       a + "attention.head_count " + std::to_string(c.num_attention_heads));
  }
  if (gguf.FindValue(a + "attention.key_length") == nullptr &&
      c.hidden_size % c.num_attention_heads != 0) {
    return r.Error(a + "attention.key_length",
                   "is missing and " + a + "embedding_length " + std::to_string(c.hidden_size) +
                       " is not a multiple of " + a + "attention.head_count " +
                       std::to_string(c.num_attention_heads));
  }
  ARBITER_RETURN_IF_ERROR(r.PositiveInt(a + "attention.key_length",
                                        c.hidden_size / c.num_attention_heads, &c.head_dim));
  for (const char* k : {"attention.value_length", "rope.dimension_count"}) {
    int v = c.head_dim;
    ARBITER_RETURN_IF_ERROR(r.PositiveInt(a + k, c.head_dim, &v));
    if (v != c.head_dim) {
      return UnimplementedError(file + ": key \"" + a + k + "\": " + std::to_string(v) +
                                " differs from the head dimension " + std::to_string(c.head_dim) +
                                "; only models whose keys, values and RoPE span the whole head "
                                "are supported");
    }
  }
  ARBITER_RETURN_IF_ERROR(r.PositiveInt(a + "context_length", -1, &c.max_position_embeddings));
  ARBITER_RETURN_IF_ERROR(
      r.PositiveFloat(a + "attention.layer_norm_rms_epsilon", /*required=*/true, &c.rms_norm_eps));
  ARBITER_RETURN_IF_ERROR(r.PositiveFloat(a + "rope.freq_base", /*required=*/false, &c.rope_theta));

  // RoPE scaling.
  Result<std::string> scaling = gguf.GetString(a + "rope.scaling.type");
  if (!scaling.ok() && scaling.status().code() != StatusCode::kNotFound) return scaling.status();
  if (scaling.ok() && *scaling != "none") {
    if (*scaling != "linear") {
      return UnimplementedError(file + ": key \"" + a + "rope.scaling.type\": \"" +
                                scaling->substr(0, 100) +
                                "\" is not supported (supported: none, linear); running it as "
                                "plain RoPE would give wrong logits");
    }
    c.rope_scaling.type = RopeScalingType::kLinear;
    ARBITER_RETURN_IF_ERROR(
        r.PositiveFloat(a + "rope.scaling.factor", /*required=*/true, &c.rope_scaling.factor));
  } else if (!scaling.ok() && gguf.FindValue(a + "rope.scale_linear") != nullptr) {
    ARBITER_RETURN_IF_ERROR(
        r.PositiveFloat(a + "rope.scale_linear", /*required=*/true, &c.rope_scaling.factor));
    if (c.rope_scaling.factor != 1.0f) c.rope_scaling.type = RopeScalingType::kLinear;
  }
  if (const GgufTensorInfo* freqs = gguf.FindTensor("rope_freqs.weight")) {
    ARBITER_RETURN_IF_ERROR(ReadRopeFreqs(gguf, *freqs, read_tensor, &c));
  }

  // Vocabulary.
  if (const GgufValue* tokens = gguf.FindValue("tokenizer.ggml.tokens")) {
    if (!tokens->is_array() || tokens->element_type() != GgufValueType::kString) {
      return r.Error("tokenizer.ggml.tokens",
                     "is " + std::string(tokens->is_array() ? "array of " : "") +
                         std::string(GgufValueTypeName(tokens->is_array() ? tokens->element_type()
                                                                          : tokens->type())) +
                         ", expected an array of string");
    }
    if (tokens->size() == 0 ||
        tokens->size() > static_cast<size_t>(std::numeric_limits<int>::max())) {
      return r.Error("tokenizer.ggml.tokens", "holds " + std::to_string(tokens->size()) +
                                                  " tokens, expected 1.." +
                                                  std::to_string(std::numeric_limits<int>::max()));
    }
    c.vocab_size = static_cast<int>(tokens->size());
  } else if (gguf.FindValue(a + "vocab_size") != nullptr) {
    ARBITER_RETURN_IF_ERROR(r.PositiveInt(a + "vocab_size", -1, &c.vocab_size));
  } else {
    return DataLossError(file + ": key \"tokenizer.ggml.tokens\": is missing (and so is \"" + a +
                         "vocab_size\"); the vocabulary size is unknown");
  }

  ARBITER_RETURN_IF_ERROR(r.TokenId("tokenizer.ggml.bos_token_id", &c.bos_token_ids));
  for (const char* k : {"tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id",
                        "tokenizer.ggml.eom_token_id"}) {
    ARBITER_RETURN_IF_ERROR(r.TokenId(k, &c.eos_token_ids));
  }

  c.tie_word_embeddings = gguf.FindTensor("output.weight") == nullptr;
  c.attention_bias =
      c.arch == Architecture::kQwen2 || gguf.FindTensor("blk.0.attn_q.bias") != nullptr;
  c.qk_norm = c.arch == Architecture::kQwen3;
  return c;
}

}  // namespace arbiter
