#include "arbiter/formats/model_config.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <utility>

#include <nlohmann/json.hpp>

#include "arbiter/formats/gguf.h"

namespace arbiter {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

// Meta-Llama-3.1-8B-Instruct/config.json (abridged: same fields and types).
constexpr const char* kLlama3 = R"({
  "architectures": ["LlamaForCausalLM"],
  "attention_bias": false,
  "attention_dropout": 0.0,
  "bos_token_id": 128000,
  "eos_token_id": [128001, 128008, 128009],
  "hidden_act": "silu",
  "hidden_size": 4096,
  "initializer_range": 0.02,
  "intermediate_size": 14336,
  "max_position_embeddings": 131072,
  "mlp_bias": false,
  "model_type": "llama",
  "num_attention_heads": 32,
  "num_hidden_layers": 32,
  "num_key_value_heads": 8,
  "pretraining_tp": 1,
  "rms_norm_eps": 1e-05,
  "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                   "original_max_position_embeddings": 8192, "rope_type": "llama3"},
  "rope_theta": 500000.0,
  "tie_word_embeddings": false,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.42.3",
  "use_cache": true,
  "vocab_size": 128256
})";

// Qwen2.5-0.5B-Instruct/config.json: no attention_bias field.
constexpr const char* kQwen2 = R"({
  "architectures": ["Qwen2ForCausalLM"],
  "attention_dropout": 0.0,
  "bos_token_id": 151643,
  "eos_token_id": 151645,
  "hidden_act": "silu",
  "hidden_size": 896,
  "initializer_range": 0.02,
  "intermediate_size": 4864,
  "max_position_embeddings": 32768,
  "max_window_layers": 21,
  "model_type": "qwen2",
  "num_attention_heads": 14,
  "num_hidden_layers": 24,
  "num_key_value_heads": 2,
  "rms_norm_eps": 1e-06,
  "rope_theta": 1000000.0,
  "sliding_window": 32768,
  "tie_word_embeddings": true,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.43.1",
  "use_cache": true,
  "use_sliding_window": false,
  "vocab_size": 151936
})";

// Qwen3-0.6B/config.json: head_dim (128) ≠ hidden_size / heads (64).
constexpr const char* kQwen3 = R"({
  "architectures": ["Qwen3ForCausalLM"],
  "attention_bias": false,
  "attention_dropout": 0.0,
  "bos_token_id": 151643,
  "eos_token_id": 151645,
  "head_dim": 128,
  "hidden_act": "silu",
  "hidden_size": 1024,
  "initializer_range": 0.02,
  "intermediate_size": 3072,
  "max_position_embeddings": 40960,
  "max_window_layers": 28,
  "model_type": "qwen3",
  "num_attention_heads": 16,
  "num_hidden_layers": 28,
  "num_key_value_heads": 8,
  "rms_norm_eps": 1e-06,
  "rope_scaling": null,
  "rope_theta": 1000000,
  "sliding_window": null,
  "tie_word_embeddings": true,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.51.0",
  "use_cache": true,
  "use_sliding_window": false,
  "vocab_size": 151936
})";

// A minimal valid config to mutate in the error tests.
json Minimal() {
  return json::parse(R"({"architectures": ["LlamaForCausalLM"], "hidden_size": 64,
                         "intermediate_size": 128, "num_hidden_layers": 2,
                         "num_attention_heads": 4, "vocab_size": 100})");
}

Result<ModelConfig> Parse(const json& j) { return ParseModelConfig(j.dump(), "config.json"); }

#define EXPECT_CONFIG_ERROR(result, code_, substring)                      \
  do {                                                                     \
    Status s_ = (result).status();                                         \
    EXPECT_EQ(s_.code(), (code_)) << s_.ToString();                        \
    EXPECT_NE(s_.message().find(substring), std::string::npos)             \
        << "message: " << s_.message() << "\nexpected: " << substring;     \
  } while (0)

TEST(ModelConfigTest, Llama3) {
  Result<ModelConfig> c = ParseModelConfig(kLlama3, "config.json");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->arch, Architecture::kLlama);
  EXPECT_EQ(c->architecture_name, "LlamaForCausalLM");
  EXPECT_EQ(c->hidden_size, 4096);
  EXPECT_EQ(c->intermediate_size, 14336);
  EXPECT_EQ(c->num_hidden_layers, 32);
  EXPECT_EQ(c->num_attention_heads, 32);
  EXPECT_EQ(c->num_key_value_heads, 8);
  EXPECT_EQ(c->head_dim, 128);
  EXPECT_FLOAT_EQ(c->rms_norm_eps, 1e-5f);
  EXPECT_FLOAT_EQ(c->rope_theta, 500000.0f);
  EXPECT_EQ(c->vocab_size, 128256);
  EXPECT_EQ(c->max_position_embeddings, 131072);
  EXPECT_FALSE(c->tie_word_embeddings);
  EXPECT_FALSE(c->attention_bias);
  EXPECT_FALSE(c->qk_norm);
  EXPECT_EQ(c->bos_token_ids, (std::vector<int>{128000}));
  EXPECT_EQ(c->eos_token_ids, (std::vector<int>{128001, 128008, 128009}));
  EXPECT_EQ(c->torch_dtype, "bfloat16");
  EXPECT_EQ(c->rope_scaling.type, RopeScalingType::kLlama3);
  EXPECT_FLOAT_EQ(c->rope_scaling.factor, 8.0f);
  EXPECT_FLOAT_EQ(c->rope_scaling.low_freq_factor, 1.0f);
  EXPECT_FLOAT_EQ(c->rope_scaling.high_freq_factor, 4.0f);
  EXPECT_EQ(c->rope_scaling.original_max_position_embeddings, 8192);
}

// Llama 3.2 / 3.3 files written by older transformers spell "type".
TEST(ModelConfigTest, Llama3RopeScalingOlderTypeSpelling) {
  json j = json::parse(kLlama3);
  j["rope_scaling"] = {{"type", "llama3"},
                       {"factor", 32},
                       {"low_freq_factor", 1},
                       {"high_freq_factor", 4.0},
                       {"original_max_position_embeddings", 8192}};
  Result<ModelConfig> c = Parse(j);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->rope_scaling.type, RopeScalingType::kLlama3);
  EXPECT_FLOAT_EQ(c->rope_scaling.factor, 32.0f);  // integer in the file

  // "rope_type" wins over "type" when both are present (transformers).
  j["rope_scaling"]["rope_type"] = "default";
  c = Parse(j);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->rope_scaling.type, RopeScalingType::kNone);
}

TEST(ModelConfigTest, LinearRopeScaling) {
  for (const char* key : {"type", "rope_type"}) {
    json j = Minimal();
    j["rope_scaling"] = {{key, "linear"}, {"factor", 2.5}};
    Result<ModelConfig> c = Parse(j);
    ASSERT_TRUE(c.ok()) << key << ": " << c.status().ToString();
    EXPECT_EQ(c->rope_scaling.type, RopeScalingType::kLinear);
    EXPECT_FLOAT_EQ(c->rope_scaling.factor, 2.5f);
  }
}

TEST(ModelConfigTest, NullAbsentAndDefaultRopeScalingMeanNone) {
  std::vector<json> values = {nullptr, json{{"type", "default"}}, json{{"rope_type", "default"}},
                              json{{"rope_type", "default"}, {"factor", 1.0}}};
  for (const json& value : values) {
    json j = Minimal();
    j["rope_scaling"] = value;
    Result<ModelConfig> c = Parse(j);
    ASSERT_TRUE(c.ok()) << value.dump() << ": " << c.status().ToString();
    EXPECT_EQ(c->rope_scaling.type, RopeScalingType::kNone) << value.dump();
  }
  Result<ModelConfig> c = Parse(Minimal());
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->rope_scaling.type, RopeScalingType::kNone);
  c = ParseModelConfig(kQwen3, "config.json");  // "rope_scaling": null
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->rope_scaling.type, RopeScalingType::kNone);
  c = ParseModelConfig(kQwen2, "config.json");  // no rope_scaling field
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->rope_scaling.type, RopeScalingType::kNone);
}

TEST(ModelConfigTest, UnsupportedRopeScalingIsRefused) {
  json j = Minimal();
  j["rope_scaling"] = {
      {"rope_type", "yarn"}, {"factor", 4.0}, {"original_max_position_embeddings", 32768}};
  Result<ModelConfig> c = Parse(j);
  EXPECT_EQ(c.status().code(), StatusCode::kUnimplemented);
  EXPECT_EQ(c.status().message(),
            "config.json: rope_scaling type \"yarn\" is not supported (supported: default (or "
            "null), linear, llama3); running it as plain RoPE would give wrong logits");
  for (const char* type : {"dynamic", "longrope", "mrope", "su", "LLAMA3"}) {
    j["rope_scaling"] = {{"type", type}, {"factor", 2.0}};
    EXPECT_CONFIG_ERROR(Parse(j), StatusCode::kUnimplemented,
                        "rope_scaling type \"" + std::string(type) + "\" is not supported");
  }
}

// transformers ≥ 5 writes "rope_parameters" instead of "rope_scaling".
TEST(ModelConfigTest, RopeParametersCarryScaling) {
  json j = Minimal();
  j["rope_parameters"] = {{"rope_type", "llama3"},   {"rope_theta", 500000.0},
                          {"factor", 8.0},           {"low_freq_factor", 1.0},
                          {"high_freq_factor", 4.0}, {"original_max_position_embeddings", 8192}};
  Result<ModelConfig> c = Parse(j);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_FLOAT_EQ(c->rope_theta, 500000.0f);
  EXPECT_EQ(c->rope_scaling.type, RopeScalingType::kLlama3);
  EXPECT_EQ(c->rope_scaling.original_max_position_embeddings, 8192);

  j["rope_parameters"] = {{"rope_type", "yarn"}, {"factor", 4.0}};
  EXPECT_CONFIG_ERROR(Parse(j), StatusCode::kUnimplemented,
                      "config.json: rope_parameters type \"yarn\" is not supported");
  j["rope_parameters"] = {{"rope_theta", 1e6}};  // no rope_type: default RoPE
  c = Parse(j);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->rope_scaling.type, RopeScalingType::kNone);
  // A non-null rope_scaling takes precedence.
  j["rope_scaling"] = {{"rope_type", "linear"}, {"factor", 2.0}};
  c = Parse(j);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->rope_scaling.type, RopeScalingType::kLinear);
}

TEST(ModelConfigTest, BadRopeScalingNamesTheField) {
  const json llama3 = {{"rope_type", "llama3"},
                       {"factor", 8.0},
                       {"low_freq_factor", 1.0},
                       {"high_freq_factor", 4.0},
                       {"original_max_position_embeddings", 8192}};
  struct Case {
    const char* key;  // nullptr: replace the whole rope_scaling value
    json value;       // null: erase `key`
    const char* expected;
  };
  const Case cases[] = {
      {nullptr, "llama3", "field \"rope_scaling\" is a string, expected an object or null"},
      {nullptr, json::array({8.0}), "field \"rope_scaling\" is an array"},
      {nullptr, json::object({{"factor", 8.0}}),
       "field \"rope_scaling\" has no \"rope_type\" (or \"type\")"},
      {"rope_type", 3, "field \"rope_scaling.rope_type\" is an integer, expected a string"},
      {"factor", "8.0", "field \"rope_scaling.factor\" is a string, expected a number"},
      {"factor", 0, "field \"rope_scaling.factor\" is 0, expected a positive number"},
      {"factor", -8.0, "field \"rope_scaling.factor\" is -8.0, expected a positive number"},
      {"factor", nullptr,
       "field \"rope_scaling.factor\" is missing (required for rope type \"llama3\")"},
      {"low_freq_factor", true, "field \"rope_scaling.low_freq_factor\" is a boolean"},
      {"low_freq_factor", nullptr, "field \"rope_scaling.low_freq_factor\" is missing"},
      {"high_freq_factor", 0.0, "field \"rope_scaling.high_freq_factor\" is 0.0"},
      {"high_freq_factor", 1.0,
       "field \"rope_scaling.high_freq_factor\" is 1.0, expected more than "
       "rope_scaling.low_freq_factor 1.0"},
      {"high_freq_factor", nullptr, "field \"rope_scaling.high_freq_factor\" is missing"},
      {"original_max_position_embeddings", 8192.0,
       "field \"rope_scaling.original_max_position_embeddings\" is a float, expected an integer"},
      {"original_max_position_embeddings", 0,
       "field \"rope_scaling.original_max_position_embeddings\" is 0, expected 1.."},
      {"original_max_position_embeddings", nullptr,
       "field \"rope_scaling.original_max_position_embeddings\" is missing"},
  };
  for (const Case& c : cases) {
    json j = Minimal();
    if (c.key == nullptr) {
      j["rope_scaling"] = c.value;
    } else {
      j["rope_scaling"] = llama3;
      if (c.value.is_null()) {
        j["rope_scaling"].erase(c.key);
      } else {
        j["rope_scaling"][c.key] = c.value;
      }
    }
    EXPECT_CONFIG_ERROR(Parse(j), StatusCode::kDataLoss, c.expected);
  }
  json j = Minimal();
  j["rope_scaling"] = {{"type", "linear"}};
  EXPECT_CONFIG_ERROR(Parse(j), StatusCode::kDataLoss,
                      "config.json: field \"rope_scaling.factor\" is missing (required for rope "
                      "type \"linear\")");
  j["rope_scaling"]["factor"] = "2";
  EXPECT_CONFIG_ERROR(Parse(j), StatusCode::kDataLoss,
                      "field \"rope_scaling.factor\" is a string, expected a number");
}

TEST(ModelConfigTest, Qwen2DefaultsAttentionBiasToTrue) {
  Result<ModelConfig> c = ParseModelConfig(kQwen2, "config.json");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->arch, Architecture::kQwen2);
  EXPECT_TRUE(c->attention_bias);
  EXPECT_FALSE(c->qk_norm);
  EXPECT_TRUE(c->tie_word_embeddings);
  EXPECT_EQ(c->head_dim, 64);  // 896 / 14
  EXPECT_EQ(c->num_key_value_heads, 2);
  EXPECT_FLOAT_EQ(c->rms_norm_eps, 1e-6f);
  EXPECT_FLOAT_EQ(c->rope_theta, 1e6f);
  EXPECT_EQ(c->bos_token_ids, (std::vector<int>{151643}));
  EXPECT_EQ(c->eos_token_ids, (std::vector<int>{151645}));

  // An explicit field wins over the Qwen2 default.
  json j = json::parse(kQwen2);
  j["attention_bias"] = false;
  Result<ModelConfig> c2 = Parse(j);
  ASSERT_TRUE(c2.ok());
  EXPECT_FALSE(c2->attention_bias);
}

TEST(ModelConfigTest, Qwen3HasQkNormAndExplicitHeadDim) {
  Result<ModelConfig> c = ParseModelConfig(kQwen3, "config.json");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->arch, Architecture::kQwen3);
  EXPECT_TRUE(c->qk_norm);
  EXPECT_FALSE(c->attention_bias);
  EXPECT_EQ(c->head_dim, 128);
  EXPECT_EQ(c->hidden_size, 1024);
  EXPECT_FLOAT_EQ(c->rope_theta, 1e6f);  // integer in the file
  EXPECT_EQ(c->max_position_embeddings, 40960);
}

TEST(ModelConfigTest, HeadlessModelVariants) {
  for (const char* name : {"LlamaModel", "Qwen2Model", "Qwen3Model"}) {
    json j = Minimal();
    j["architectures"] = {name};
    Result<ModelConfig> c = Parse(j);
    ASSERT_TRUE(c.ok()) << name << ": " << c.status().ToString();
    EXPECT_EQ(c->architecture_name, name);
  }
  json j = Minimal();
  j["architectures"] = {"Qwen3Model"};
  EXPECT_TRUE(Parse(j)->qk_norm);
  j["architectures"] = {"Qwen2Model"};
  EXPECT_TRUE(Parse(j)->attention_bias);
}

TEST(ModelConfigTest, Defaults) {
  Result<ModelConfig> c = Parse(Minimal());
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->num_key_value_heads, 4);
  EXPECT_EQ(c->head_dim, 16);
  EXPECT_FLOAT_EQ(c->rms_norm_eps, 1e-6f);
  EXPECT_FLOAT_EQ(c->rope_theta, 10000.0f);
  EXPECT_EQ(c->max_position_embeddings, 2048);
  EXPECT_FALSE(c->tie_word_embeddings);
  EXPECT_FALSE(c->attention_bias);
  EXPECT_FALSE(c->qk_norm);
  EXPECT_TRUE(c->bos_token_ids.empty());
  EXPECT_TRUE(c->eos_token_ids.empty());
  EXPECT_TRUE(c->torch_dtype.empty());
}

TEST(ModelConfigTest, NullMeansAbsent) {
  json j = Minimal();
  j["bos_token_id"] = nullptr;
  j["eos_token_id"] = nullptr;
  j["head_dim"] = nullptr;
  j["num_key_value_heads"] = nullptr;
  j["rope_theta"] = nullptr;
  Result<ModelConfig> c = Parse(j);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_TRUE(c->bos_token_ids.empty());
  EXPECT_EQ(c->head_dim, 16);
  EXPECT_EQ(c->num_key_value_heads, 4);
}

TEST(ModelConfigTest, NewerTransformersSpellings) {
  json j = Minimal();
  j["dtype"] = "float16";
  j["rope_parameters"] = {{"rope_theta", 250000.0}, {"rope_type", "default"}};
  Result<ModelConfig> c = Parse(j);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->torch_dtype, "float16");
  EXPECT_FLOAT_EQ(c->rope_theta, 250000.0f);
}

TEST(ModelConfigTest, UnsupportedArchitecture) {
  json j = Minimal();
  j["architectures"] = {"GPT2LMHeadModel"};
  Result<ModelConfig> c = Parse(j);
  EXPECT_EQ(c.status().code(), StatusCode::kUnimplemented);
  EXPECT_EQ(c.status().message(),
            "config.json: architecture \"GPT2LMHeadModel\" is not supported (supported: "
            "LlamaForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM)");
}

TEST(ModelConfigTest, BadJson) {
  EXPECT_CONFIG_ERROR(ParseModelConfig("{", "config.json"), StatusCode::kDataLoss,
                      "config.json: not valid JSON");
  EXPECT_CONFIG_ERROR(ParseModelConfig("", "config.json"), StatusCode::kDataLoss, "not valid JSON");
  EXPECT_CONFIG_ERROR(ParseModelConfig("[1]", "config.json"), StatusCode::kDataLoss,
                      "config.json: top level is an array, expected a JSON object");
}

TEST(ModelConfigTest, ArchitecturesField) {
  json j = Minimal();
  j.erase("architectures");
  EXPECT_CONFIG_ERROR(Parse(j), StatusCode::kDataLoss, "config.json: field \"architectures\" is missing");
  j["architectures"] = json::array();
  EXPECT_CONFIG_ERROR(Parse(j), StatusCode::kDataLoss, "field \"architectures\" must be a non-empty list");
  j["architectures"] = "LlamaForCausalLM";
  EXPECT_CONFIG_ERROR(Parse(j), StatusCode::kDataLoss, "field \"architectures\" must be a non-empty list");
  j["architectures"] = {1};
  EXPECT_CONFIG_ERROR(Parse(j), StatusCode::kDataLoss, "field \"architectures\" must be a non-empty list");
}

TEST(ModelConfigTest, MissingRequiredFields) {
  for (const char* field : {"hidden_size", "intermediate_size", "num_hidden_layers",
                            "num_attention_heads", "vocab_size"}) {
    json j = Minimal();
    j.erase(field);
    EXPECT_CONFIG_ERROR(Parse(j), StatusCode::kDataLoss,
                        "config.json: field \"" + std::string(field) + "\" is missing");
  }
}

TEST(ModelConfigTest, WrongTypesNameTheField) {
  struct Case {
    const char* field;
    json value;
    const char* expected;
  };
  const Case cases[] = {
      {"hidden_size", "4096", "field \"hidden_size\" is a string, expected an integer"},
      {"hidden_size", 4096.0, "field \"hidden_size\" is a float, expected an integer"},
      {"num_hidden_layers", true, "field \"num_hidden_layers\" is a boolean, expected an integer"},
      {"num_key_value_heads", json::array(), "field \"num_key_value_heads\" is an array"},
      {"rms_norm_eps", "1e-5", "field \"rms_norm_eps\" is a string, expected a number"},
      {"rope_theta", json::object(), "field \"rope_theta\" is an object, expected a number"},
      {"tie_word_embeddings", 1, "field \"tie_word_embeddings\" is an integer, expected true or false"},
      {"attention_bias", "false", "field \"attention_bias\" is a string, expected true or false"},
      {"bos_token_id", "1", "field \"bos_token_id\" is a string, expected an integer, a list"},
      {"eos_token_id", json::array({1, "2"}), "field \"eos_token_id\" holds a string"},
      {"eos_token_id", -1, "field \"eos_token_id\" holds -1, which is not a valid token id"},
      {"torch_dtype", 16, "field \"torch_dtype\" is an integer, expected a string"},
  };
  for (const Case& c : cases) {
    json j = Minimal();
    j[c.field] = c.value;
    EXPECT_CONFIG_ERROR(Parse(j), StatusCode::kDataLoss, c.expected);
  }
}

TEST(ModelConfigTest, OutOfRangeValues) {
  struct Case {
    const char* field;
    json value;
    const char* expected;
  };
  const Case cases[] = {
      {"hidden_size", 0, "field \"hidden_size\" is 0, expected 1..2147483647"},
      {"num_attention_heads", -4, "field \"num_attention_heads\" is -4, expected > 0"},
      {"vocab_size", 3000000000ull, "field \"vocab_size\" is 3000000000, expected 1..2147483647"},
      {"head_dim", 0, "field \"head_dim\" is 0"},
      {"max_position_embeddings", -1, "field \"max_position_embeddings\" is -1"},
      {"rms_norm_eps", 0.0, "field \"rms_norm_eps\" is 0.0, expected a positive number"},
      {"rms_norm_eps", -1e-6, "field \"rms_norm_eps\""},
      {"rope_theta", 1e300, "field \"rope_theta\" is 1e+300, expected a positive number within float range"},
      {"num_key_value_heads", 3, "field \"num_key_value_heads\" is 3, which does not divide num_attention_heads 4"},
      {"num_key_value_heads", 8, "does not divide"},
  };
  for (const Case& c : cases) {
    json j = Minimal();
    j[c.field] = c.value;
    EXPECT_CONFIG_ERROR(Parse(j), StatusCode::kDataLoss, c.expected);
  }
  json j = Minimal();
  j["hidden_size"] = 66;  // not a multiple of 4 heads, no head_dim
  EXPECT_CONFIG_ERROR(Parse(j), StatusCode::kDataLoss,
                      "field \"head_dim\" is missing and hidden_size 66 is not a multiple of "
                      "num_attention_heads 4");
  j["head_dim"] = 16;
  EXPECT_TRUE(Parse(j).ok());
}

TEST(ModelConfigTest, LoadFromFile) {
  std::string tmpl = (fs::temp_directory_path() / "arbiter_cfg_XXXXXX").string();
  ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
  const std::string path = tmpl + "/config.json";
  {
    std::ofstream f(path);
    f << kQwen3;
  }
  Result<ModelConfig> c = LoadModelConfig(path);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->arch, Architecture::kQwen3);
  {
    std::ofstream f(path);
    f << "{\"architectures\": 5}";
  }
  EXPECT_CONFIG_ERROR(LoadModelConfig(path), StatusCode::kDataLoss, path + ": field \"architectures\"");
  EXPECT_EQ(LoadModelConfig(tmpl + "/missing.json").status().code(), StatusCode::kNotFound);
  fs::remove_all(tmpl);
}

// ---------------------------------------------------------------------------
// ModelConfigFromGguf

// GGUF metadata as llama.cpp's converter writes it for a tiny model of
// `arch`; Set/Erase edit it, Tensors lists the (1-element) tensors the file
// holds, Parse builds the file and maps it.
class GgufModel {
 public:
  explicit GgufModel(const std::string& arch) {
    Set("general.architecture", GgufValue::String(arch));
    Set("general.name", GgufValue::String("tiny"));
    Set(arch + ".block_count", GgufValue::Uint32(2));
    Set(arch + ".context_length", GgufValue::Uint32(4096));
    Set(arch + ".embedding_length", GgufValue::Uint32(8));
    Set(arch + ".feed_forward_length", GgufValue::Uint32(12));
    Set(arch + ".attention.head_count", GgufValue::Uint32(2));
    Set(arch + ".attention.head_count_kv", GgufValue::Uint32(1));
    Set(arch + ".rope.freq_base", GgufValue::Float32(500000.0f));
    Set(arch + ".attention.layer_norm_rms_epsilon", GgufValue::Float32(1e-5f));
    Set(arch + ".rope.dimension_count", GgufValue::Uint32(4));
    Set("tokenizer.ggml.model", GgufValue::String("gpt2"));
    std::vector<std::string> tokens;
    for (int i = 0; i < 16; ++i) tokens.push_back("t" + std::to_string(i));
    Set("tokenizer.ggml.tokens", GgufValue::StringArray(tokens));
    Set("tokenizer.ggml.bos_token_id", GgufValue::Uint32(1));
    Set("tokenizer.ggml.eos_token_id", GgufValue::Uint32(2));
    tensors_ = {"token_embd.weight", "output_norm.weight", "output.weight"};
  }
  GgufModel& Set(const std::string& key, GgufValue v) {
    Erase(key);
    kv_.emplace_back(key, std::move(v));
    return *this;
  }
  GgufModel& Erase(const std::string& key) {
    std::erase_if(kv_, [&](const auto& e) { return e.first == key; });
    return *this;
  }
  GgufModel& Tensors(std::vector<std::string> names) {
    tensors_ = std::move(names);
    return *this;
  }
  // Adds "rope_freqs.weight" as F32 [values.size()] holding `values`.
  GgufModel& RopeFreqs(const std::vector<float>& values) {
    rope_freqs_.assign(reinterpret_cast<const char*>(values.data()),
                       values.size() * sizeof(float));
    n_rope_freqs_ = static_cast<int64_t>(values.size());
    return *this;
  }
  Result<ModelConfig> Parse() const {
    GgufWriter w;
    for (const auto& [k, v] : kv_) EXPECT_TRUE(w.Add(k, v).ok()) << k;
    static const std::string kOne(4, '\0');
    for (const std::string& n : tensors_) {
      EXPECT_TRUE(w.AddTensor(n, {1}, GgmlType::kF32, kOne).ok()) << n;
    }
    if (n_rope_freqs_ > 0) {
      EXPECT_TRUE(w.AddTensor("rope_freqs.weight", {n_rope_freqs_}, GgmlType::kF32, rope_freqs_)
                      .ok());
    }
    const std::string bytes = w.Serialize();
    Result<GgufFile> f = ParseGguf(bytes, "model.gguf");
    EXPECT_TRUE(f.ok()) << f.status().ToString();
    if (!f.ok()) return f.status();
    const uint64_t data_offset = f->data_offset();
    return ModelConfigFromGguf(*f, [&](const GgufTensorInfo& t) -> Result<std::string> {
      return bytes.substr(data_offset + t.offset, t.size_bytes);
    });
  }

 private:
  std::vector<std::pair<std::string, GgufValue>> kv_;
  std::vector<std::string> tensors_;
  std::string rope_freqs_;
  int64_t n_rope_freqs_ = 0;
};

TEST(ModelConfigGgufTest, Llama) {
  GgufModel m("llama");
  m.Set("tokenizer.ggml.eot_token_id", GgufValue::Uint32(3));
  m.Set("tokenizer.ggml.eom_token_id", GgufValue::Uint32(2));  // repeats eos
  Result<ModelConfig> c = m.Parse();
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->arch, Architecture::kLlama);
  EXPECT_EQ(c->architecture_name, "LlamaForCausalLM");
  EXPECT_EQ(c->num_hidden_layers, 2);
  EXPECT_EQ(c->hidden_size, 8);
  EXPECT_EQ(c->intermediate_size, 12);
  EXPECT_EQ(c->num_attention_heads, 2);
  EXPECT_EQ(c->num_key_value_heads, 1);
  EXPECT_EQ(c->head_dim, 4);  // 8 / 2: no key_length
  EXPECT_EQ(c->max_position_embeddings, 4096);
  EXPECT_EQ(c->rope_theta, 500000.0f);
  EXPECT_EQ(c->rms_norm_eps, 1e-5f);
  EXPECT_EQ(c->rope_scaling.type, RopeScalingType::kNone);
  EXPECT_EQ(c->vocab_size, 16);
  EXPECT_EQ(c->bos_token_ids, (std::vector<int>{1}));
  EXPECT_EQ(c->eos_token_ids, (std::vector<int>{2, 3}));
  EXPECT_FALSE(c->tie_word_embeddings);  // output.weight present
  EXPECT_FALSE(c->attention_bias);
  EXPECT_FALSE(c->qk_norm);
  EXPECT_TRUE(c->torch_dtype.empty());
}

TEST(ModelConfigGgufTest, MistralIsLlama) {
  Result<ModelConfig> c = GgufModel("mistral").Parse();
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->arch, Architecture::kLlama);
  EXPECT_EQ(c->architecture_name, "LlamaForCausalLM");
}

TEST(ModelConfigGgufTest, Qwen2HasBiasAndTiesWithoutOutputWeight) {
  GgufModel m("qwen2");
  m.Tensors({"token_embd.weight", "output_norm.weight"});
  m.Erase("qwen2.attention.head_count_kv").Erase("qwen2.rope.freq_base");
  Result<ModelConfig> c = m.Parse();
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->arch, Architecture::kQwen2);
  EXPECT_EQ(c->architecture_name, "Qwen2ForCausalLM");
  EXPECT_TRUE(c->attention_bias);
  EXPECT_TRUE(c->tie_word_embeddings);
  EXPECT_FALSE(c->qk_norm);
  EXPECT_EQ(c->num_key_value_heads, 2);  // defaults to head_count
  EXPECT_EQ(c->rope_theta, 10000.0f);    // default
}

TEST(ModelConfigGgufTest, Qwen3HasQkNormAndKeyLength) {
  GgufModel m("qwen3");
  m.Set("qwen3.attention.key_length", GgufValue::Uint32(16));
  m.Set("qwen3.attention.value_length", GgufValue::Uint32(16));
  m.Set("qwen3.rope.dimension_count", GgufValue::Uint32(16));
  Result<ModelConfig> c = m.Parse();
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->arch, Architecture::kQwen3);
  EXPECT_EQ(c->architecture_name, "Qwen3ForCausalLM");
  EXPECT_EQ(c->head_dim, 16);
  EXPECT_TRUE(c->qk_norm);
  EXPECT_FALSE(c->attention_bias);
}

TEST(ModelConfigGgufTest, LlamaWithBiasTensorHasAttentionBias) {
  GgufModel m("llama");
  m.Tensors({"token_embd.weight", "output.weight", "blk.0.attn_q.bias"});
  Result<ModelConfig> c = m.Parse();
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_TRUE(c->attention_bias);
}

TEST(ModelConfigGgufTest, AnyFittingNumericTypeIsAccepted) {
  GgufModel m("llama");
  m.Set("llama.block_count", GgufValue::Uint64(3));
  m.Set("llama.embedding_length", GgufValue::Int32(8));
  m.Set("llama.feed_forward_length", GgufValue::Uint16(12));
  m.Set("llama.attention.layer_norm_rms_epsilon", GgufValue::Float64(1e-6));
  m.Set("tokenizer.ggml.bos_token_id", GgufValue::Int64(7));
  Result<ModelConfig> c = m.Parse();
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->num_hidden_layers, 3);
  EXPECT_EQ(c->intermediate_size, 12);
  EXPECT_EQ(c->rms_norm_eps, 1e-6f);
  EXPECT_EQ(c->bos_token_ids, (std::vector<int>{7}));
}

TEST(ModelConfigGgufTest, VocabSizeFallsBackToTheArchitectureKey) {
  GgufModel m("llama");
  m.Erase("tokenizer.ggml.tokens").Set("llama.vocab_size", GgufValue::Uint32(32));
  Result<ModelConfig> c = m.Parse();
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->vocab_size, 32);
  m.Erase("llama.vocab_size");
  EXPECT_CONFIG_ERROR(m.Parse(), StatusCode::kDataLoss,
                      "model.gguf: key \"tokenizer.ggml.tokens\": is missing (and so is "
                      "\"llama.vocab_size\")");
  m.Set("tokenizer.ggml.tokens", GgufValue::Uint32(5));
  EXPECT_CONFIG_ERROR(m.Parse(), StatusCode::kDataLoss,
                      "key \"tokenizer.ggml.tokens\": is u32, expected an array of string");
  m.Set("tokenizer.ggml.tokens", GgufValue::StringArray({}));
  EXPECT_CONFIG_ERROR(m.Parse(), StatusCode::kDataLoss, "holds 0 tokens");
}

TEST(ModelConfigGgufTest, LinearRopeScaling) {
  GgufModel m("llama");
  m.Set("llama.rope.scaling.type", GgufValue::String("linear"))
      .Set("llama.rope.scaling.factor", GgufValue::Float32(4.0f));
  Result<ModelConfig> c = m.Parse();
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->rope_scaling.type, RopeScalingType::kLinear);
  EXPECT_EQ(c->rope_scaling.factor, 4.0f);
  m.Erase("llama.rope.scaling.factor");
  EXPECT_CONFIG_ERROR(m.Parse(), StatusCode::kDataLoss,
                      "key \"llama.rope.scaling.factor\": is missing");
  m.Set("llama.rope.scaling.type", GgufValue::String("none"));
  EXPECT_EQ(m.Parse()->rope_scaling.type, RopeScalingType::kNone);
  // The older spelling.
  GgufModel old("llama");
  old.Set("llama.rope.scale_linear", GgufValue::Float32(2.0f));
  EXPECT_EQ(old.Parse()->rope_scaling.type, RopeScalingType::kLinear);
  EXPECT_EQ(old.Parse()->rope_scaling.factor, 2.0f);
}

// Llama 3.1+ files carry their RoPE scaling as per-dimension factors.
TEST(ModelConfigGgufTest, RopeFreqsBecomeFrequencyFactors) {
  Result<ModelConfig> c = GgufModel("llama").RopeFreqs({1.0f, 8.0f}).Parse();
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->rope_scaling.freq_factors, (std::vector<float>{1.0f, 8.0f}));
  EXPECT_EQ(c->rope_scaling.type, RopeScalingType::kNone);
  EXPECT_TRUE(GgufModel("llama").Parse()->rope_scaling.freq_factors.empty());
  EXPECT_CONFIG_ERROR(GgufModel("llama").RopeFreqs({1.0f, 2.0f, 3.0f}).Parse(),
                      StatusCode::kDataLoss,
                      "tensor \"rope_freqs.weight\" (RoPE frequency factors) is F32 with 3 "
                      "values; expected F32 with head_dim / 2 = 2");
  EXPECT_CONFIG_ERROR(GgufModel("llama").RopeFreqs({1.0f, -2.0f}).Parse(), StatusCode::kDataLoss,
                      "value 1 is -2.000000; factors must be finite and > 0");
  EXPECT_CONFIG_ERROR(GgufModel("llama").Tensors({"output.weight", "rope_freqs.weight"}).Parse(),
                      StatusCode::kDataLoss, "with 1 values; expected F32 with head_dim / 2 = 2");
}

TEST(ModelConfigGgufTest, UnsupportedFeaturesAreRefusedByName) {
  EXPECT_CONFIG_ERROR(GgufModel("gemma2").Parse(), StatusCode::kUnimplemented,
                      "model.gguf: key \"general.architecture\": \"gemma2\" is not supported "
                      "(supported: llama, mistral, qwen2, qwen3)");
  EXPECT_CONFIG_ERROR(GgufModel("llama").Set("llama.rope.scaling.type", GgufValue::String("yarn")).Parse(),
                      StatusCode::kUnimplemented,
                      "key \"llama.rope.scaling.type\": \"yarn\" is not supported");
  EXPECT_CONFIG_ERROR(GgufModel("llama").Set("llama.rope.dimension_count", GgufValue::Uint32(2)).Parse(),
                      StatusCode::kUnimplemented,
                      "key \"llama.rope.dimension_count\": 2 differs from the head dimension 4");
  EXPECT_CONFIG_ERROR(GgufModel("qwen3").Set("qwen3.attention.value_length", GgufValue::Uint32(8)).Parse(),
                      StatusCode::kUnimplemented, "key \"qwen3.attention.value_length\": 8");
}

TEST(ModelConfigGgufTest, BadValuesNameTheKey) {
  EXPECT_CONFIG_ERROR(GgufModel("llama").Erase("general.architecture").Parse(),
                      StatusCode::kDataLoss, "model.gguf: key \"general.architecture\": is missing");
  EXPECT_CONFIG_ERROR(GgufModel("llama").Set("general.architecture", GgufValue::Uint8(1)).Parse(),
                      StatusCode::kDataLoss, "key \"general.architecture\": is u8, expected a string");
  for (const char* key : {"llama.block_count", "llama.embedding_length", "llama.feed_forward_length",
                          "llama.attention.head_count", "llama.context_length",
                          "llama.attention.layer_norm_rms_epsilon"}) {
    EXPECT_CONFIG_ERROR(GgufModel("llama").Erase(key).Parse(), StatusCode::kDataLoss,
                        "model.gguf: key \"" + std::string(key) + "\": is missing");
  }
  EXPECT_CONFIG_ERROR(GgufModel("llama").Set("llama.block_count", GgufValue::String("2")).Parse(),
                      StatusCode::kDataLoss, "key \"llama.block_count\": is string, expected an integer");
  EXPECT_CONFIG_ERROR(GgufModel("llama").Set("llama.block_count", GgufValue::Uint32(0)).Parse(),
                      StatusCode::kDataLoss, "key \"llama.block_count\": is 0, expected 1..");
  EXPECT_CONFIG_ERROR(GgufModel("llama").Set("llama.block_count", GgufValue::Int32(-2)).Parse(),
                      StatusCode::kDataLoss, "key \"llama.block_count\": is i32 -2");
  EXPECT_CONFIG_ERROR(GgufModel("llama").Set("llama.context_length", GgufValue::Uint64(1ull << 40)).Parse(),
                      StatusCode::kDataLoss, "key \"llama.context_length\": is 1099511627776");
  EXPECT_CONFIG_ERROR(GgufModel("llama").Set("llama.attention.head_count_kv", GgufValue::Uint32(3)).Parse(),
                      StatusCode::kDataLoss,
                      "key \"llama.attention.head_count_kv\": is 3, which does not divide");
  EXPECT_CONFIG_ERROR(GgufModel("llama").Set("llama.embedding_length", GgufValue::Uint32(9)).Parse(),
                      StatusCode::kDataLoss, "key \"llama.attention.key_length\": is missing and");
  EXPECT_CONFIG_ERROR(
      GgufModel("llama").Set("llama.attention.layer_norm_rms_epsilon", GgufValue::Float32(-1.0f)).Parse(),
      StatusCode::kDataLoss, "key \"llama.attention.layer_norm_rms_epsilon\": is -1");
  EXPECT_CONFIG_ERROR(GgufModel("llama").Set("llama.rope.freq_base", GgufValue::Uint32(10000)).Parse(),
                      StatusCode::kDataLoss, "key \"llama.rope.freq_base\": is u32, expected f32 or f64");
  EXPECT_CONFIG_ERROR(
      GgufModel("llama").Set("tokenizer.ggml.eos_token_id", GgufValue::Uint64(1ull << 33)).Parse(),
      StatusCode::kDataLoss, "key \"tokenizer.ggml.eos_token_id\": is 8589934592, which is not a valid token id");
}

}  // namespace
}  // namespace arbiter
