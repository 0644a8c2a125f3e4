#include "arbiter/formats/inspect.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

namespace arbiter {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

class InspectTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::temp_directory_path() / "arbiter_inspect_XXXXXX").string();
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  std::string Path(const std::string& name) const { return dir_ + "/" + name; }
  void WriteText(const std::string& name, const std::string& text) {
    std::ofstream f(Path(name));
    f << text;
  }
  // Two shards: embed [8, 4] BF16 + norm [4] F32 in the first, lm_head
  // [8, 4] F16 in the second.
  void WriteShardedModel() {
    std::string embed(8 * 4 * 2, '\0'), norm(4 * 4, '\0'), head(8 * 4 * 2, '\0');
    ASSERT_TRUE(WriteSafetensors(Path("model-00001-of-00002.safetensors"),
                                 {{"model.embed_tokens.weight", DType::kBF16, {8, 4}, embed},
                                  {"model.norm.weight", DType::kF32, {4}, norm}},
                                 {{"format", "pt"}})
                    .ok());
    ASSERT_TRUE(WriteSafetensors(Path("model-00002-of-00002.safetensors"),
                                 {{"lm_head.weight", DType::kF16, {8, 4}, head}}, {{"format", "pt"}})
                    .ok());
    WriteText("model.safetensors.index.json", R"({"weight_map": {
        "model.embed_tokens.weight": "model-00001-of-00002.safetensors",
        "model.norm.weight": "model-00001-of-00002.safetensors",
        "lm_head.weight": "model-00002-of-00002.safetensors"}})");
  }
  std::string dir_;
};

constexpr const char* kConfig = R"({"architectures": ["Qwen3ForCausalLM"], "hidden_size": 4,
  "intermediate_size": 8, "num_hidden_layers": 1, "num_attention_heads": 2,
  "num_key_value_heads": 1, "head_dim": 2, "vocab_size": 8, "eos_token_id": [6, 7],
  "torch_dtype": "bfloat16"})";

TEST_F(InspectTest, ShardedDirectoryWithConfig) {
  WriteShardedModel();
  WriteText("config.json", kConfig);
  Result<ModelInspection> r = InspectModel(dir_);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  const ModelInspection& m = *r;
  EXPECT_EQ(m.path, dir_);
  ASSERT_EQ(m.files.size(), 2u);
  ASSERT_EQ(m.tensors.size(), 3u);
  EXPECT_EQ(m.tensors[0].name, "lm_head.weight");  // sorted by name
  EXPECT_EQ(m.tensors[0].dtype, DType::kF16);
  EXPECT_EQ(m.tensors[0].shape, (std::vector<int64_t>{8, 4}));
  EXPECT_EQ(m.tensors[0].size_bytes, 64u);
  EXPECT_EQ(m.tensors[0].file, Path("model-00002-of-00002.safetensors"));
  EXPECT_EQ(m.total_tensors, 3u);
  EXPECT_EQ(m.total_bytes, 64u + 64u + 16u);
  EXPECT_EQ(m.total_parameters, 32u + 32u + 4u);
  EXPECT_EQ(m.bytes_by_dtype.at("BF16"), 64u);
  EXPECT_EQ(m.bytes_by_dtype.at("F16"), 64u);
  EXPECT_EQ(m.bytes_by_dtype.at("F32"), 16u);
  EXPECT_EQ(m.metadata.at("format"), "pt");
  ASSERT_TRUE(m.config.has_value());
  EXPECT_EQ(m.config->arch, Architecture::kQwen3);
  EXPECT_EQ(m.config_path, Path("config.json"));
  EXPECT_TRUE(m.config_error.empty());

  std::string text = RenderInspectionText(m);
  EXPECT_NE(text.find("model.embed_tokens.weight"), std::string::npos) << text;
  EXPECT_NE(text.find("[8, 4]"), std::string::npos) << text;
  EXPECT_NE(text.find("BF16"), std::string::npos) << text;
  EXPECT_NE(text.find("model-00002-of-00002.safetensors"), std::string::npos) << text;
  EXPECT_NE(text.find("Qwen3ForCausalLM"), std::string::npos) << text;
  EXPECT_NE(text.find("3 tensors"), std::string::npos) << text;
  EXPECT_NE(text.find("68 parameters"), std::string::npos) << text;
  EXPECT_EQ(text.back(), '\n');

  json j = json::parse(RenderInspectionJson(m));
  EXPECT_EQ(j["files"].size(), 2u);
  ASSERT_EQ(j["tensors"].size(), 3u);
  EXPECT_EQ(j["tensors"][1]["name"], "model.embed_tokens.weight");
  EXPECT_EQ(j["tensors"][1]["dtype"], "BF16");
  EXPECT_EQ(j["tensors"][1]["shape"], json::array({8, 4}));
  EXPECT_EQ(j["tensors"][1]["bytes"], 64);
  EXPECT_EQ(j["metadata"]["format"], "pt");
  EXPECT_EQ(j["totals"]["tensors"], 3);
  EXPECT_EQ(j["totals"]["bytes"], 144);
  EXPECT_EQ(j["totals"]["parameters"], 68);
  EXPECT_EQ(j["totals"]["bytes_by_dtype"]["F16"], 64);
  EXPECT_EQ(j["config"]["architecture"], "Qwen3ForCausalLM");
  EXPECT_EQ(j["config"]["head_dim"], 2);
  EXPECT_EQ(j["config"]["qk_norm"], true);
  EXPECT_EQ(j["config"]["eos_token_ids"], json::array({6, 7}));
  EXPECT_FALSE(j.contains("config_error"));
}

TEST_F(InspectTest, SingleFileWithoutConfig) {
  std::string data(6 * 4, '\0');
  const std::string path = Path("tiny.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, {{"w", DType::kF32, {2, 3}, data}}).ok());
  WriteText("config.json", kConfig);  // ignored: path is a file
  Result<ModelInspection> r = InspectModel(path);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_FALSE(r->config.has_value());
  EXPECT_TRUE(r->config_path.empty());
  EXPECT_EQ(r->total_parameters, 6u);
  json j = json::parse(RenderInspectionJson(*r));
  EXPECT_FALSE(j.contains("config"));
  EXPECT_EQ(j["metadata"], json::object());
  std::string text = RenderInspectionText(*r);
  EXPECT_NE(text.find("[2, 3]"), std::string::npos) << text;
}

TEST_F(InspectTest, BadConfigIsReportedNotFatal) {
  WriteShardedModel();
  WriteText("config.json", R"({"architectures": ["GPT2LMHeadModel"]})");
  Result<ModelInspection> r = InspectModel(dir_);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_FALSE(r->config.has_value());
  EXPECT_NE(r->config_error.find("GPT2LMHeadModel"), std::string::npos) << r->config_error;
  json j = json::parse(RenderInspectionJson(*r));
  EXPECT_FALSE(j.contains("config"));
  EXPECT_NE(j["config_error"].get<std::string>().find("not supported"), std::string::npos);
  EXPECT_NE(RenderInspectionText(*r).find("not supported"), std::string::npos);
}

TEST_F(InspectTest, ErrorsPassThrough) {
  EXPECT_EQ(InspectModel(Path("missing")).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(InspectModel(dir_).status().code(), StatusCode::kNotFound);  // empty dir
  WriteText("model.safetensors", "garbage!garbage");
  Status s = InspectModel(dir_).status();
  EXPECT_EQ(s.code(), StatusCode::kDataLoss) << s.ToString();
  EXPECT_NE(s.message().find("model.safetensors"), std::string::npos) << s.message();
}

}  // namespace
}  // namespace arbiter
