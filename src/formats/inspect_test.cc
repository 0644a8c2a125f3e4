#include "arbiter/formats/inspect.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "arbiter/formats/gguf.h"
#include "arbiter/formats/safetensors.h"

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
  EXPECT_EQ(m.format, "safetensors");
  ASSERT_EQ(m.files.size(), 2u);
  ASSERT_EQ(m.tensors.size(), 3u);
  EXPECT_EQ(m.tensors[0].name, "lm_head.weight");  // sorted by name
  EXPECT_EQ(m.tensors[0].dtype, "F16");
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
  EXPECT_EQ(j["format"], "safetensors");
  EXPECT_FALSE(j.contains("gguf"));
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

// A tiny qwen3 GGUF: metadata of several types (a 20-token vocabulary, a
// long string, a nested array) and three tensors.
void WriteTinyGguf(const std::string& path, const std::string& arch = "qwen3") {
  GgufWriter w;
  ASSERT_TRUE(w.AddString("general.architecture", arch).ok());
  ASSERT_TRUE(w.AddUint32(arch + ".block_count", 1).ok());
  ASSERT_TRUE(w.AddUint32(arch + ".context_length", 512).ok());
  ASSERT_TRUE(w.AddUint32(arch + ".embedding_length", 8).ok());
  ASSERT_TRUE(w.AddUint32(arch + ".feed_forward_length", 16).ok());
  ASSERT_TRUE(w.AddUint32(arch + ".attention.head_count", 2).ok());
  ASSERT_TRUE(w.AddUint32(arch + ".attention.head_count_kv", 1).ok());
  ASSERT_TRUE(w.AddFloat32(arch + ".attention.layer_norm_rms_epsilon", 1e-6f).ok());
  ASSERT_TRUE(w.AddFloat32(arch + ".rope.freq_base", 1000000.0f).ok());
  std::vector<std::string> tokens;
  for (int i = 0; i < 20; ++i) tokens.push_back("tok" + std::to_string(i));
  ASSERT_TRUE(w.AddStringArray("tokenizer.ggml.tokens", tokens).ok());
  ASSERT_TRUE(w.AddString("tokenizer.chat_template", std::string(200, 'x') + "\n").ok());
  ASSERT_TRUE(w.AddBool("tokenizer.ggml.add_bos_token", false).ok());
  ASSERT_TRUE(w.Add("test.nested", *GgufValue::ArrayOfArrays(
                                       {*GgufValue::IntArray(GgufValueType::kInt8, {1, 2, 3})}))
                  .ok());
  static const std::string embd(8 * 20 * 4, '\0'), q8(2 * 34 * 2, '\0'), norm(8 * 4, '\0');
  ASSERT_TRUE(w.AddTensor("token_embd.weight", {8, 20}, GgmlType::kF32, embd).ok());
  ASSERT_TRUE(w.AddTensor("blk.0.ffn_up.weight", {64, 2}, GgmlType::kQ8_0, q8).ok());
  ASSERT_TRUE(w.AddTensor("output_norm.weight", {8}, GgmlType::kF32, norm).ok());
  ASSERT_TRUE(w.Write(path).ok());
}

TEST_F(InspectTest, GgufFile) {
  const std::string path = Path("tiny.gguf");
  WriteTinyGguf(path);
  Result<ModelInspection> r = InspectModel(path);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  const ModelInspection& m = *r;
  EXPECT_EQ(m.format, "gguf");
  EXPECT_EQ(m.files, (std::vector<std::string>{path}));
  EXPECT_EQ(m.gguf_version, 3u);
  EXPECT_EQ(m.gguf_alignment, 32u);
  EXPECT_EQ(m.gguf_data_offset % 32, 0u);
  EXPECT_EQ(m.gguf_metadata.size(), 13u);
  ASSERT_EQ(m.tensors.size(), 3u);
  EXPECT_EQ(m.tensors[0].name, "token_embd.weight");  // file order
  EXPECT_EQ(m.tensors[0].dtype, "F32");
  EXPECT_EQ(m.tensors[0].shape, (std::vector<int64_t>{20, 8}));  // row-major
  EXPECT_EQ(m.tensors[1].dtype, "Q8_0");
  EXPECT_EQ(m.tensors[1].size_bytes, 136u);
  EXPECT_EQ(m.total_tensors, 3u);
  EXPECT_EQ(m.total_bytes, 640u + 136u + 32u);
  EXPECT_EQ(m.total_parameters, 160u + 128u + 8u);
  EXPECT_EQ(m.bytes_by_dtype.at("Q8_0"), 136u);
  EXPECT_EQ(m.bytes_by_dtype.at("F32"), 672u);
  ASSERT_TRUE(m.config.has_value()) << m.config_error;
  EXPECT_EQ(m.config->arch, Architecture::kQwen3);
  EXPECT_EQ(m.config->vocab_size, 20);
  EXPECT_TRUE(m.config->tie_word_embeddings);
  EXPECT_EQ(m.config_path, path);

  const std::string text = RenderInspectionText(m);
  EXPECT_NE(text.find("format: GGUF version 3, alignment 32, data section at byte "),
            std::string::npos) << text;
  EXPECT_NE(text.find("metadata (13):"), std::string::npos) << text;
  EXPECT_NE(text.find("general.architecture"), std::string::npos) << text;
  EXPECT_NE(text.find("\"qwen3\""), std::string::npos) << text;
  EXPECT_NE(text.find("array[string]"), std::string::npos) << text;
  EXPECT_NE(text.find("20 items: [\"tok0\", \"tok1\", \"tok2\", \"tok3\", \"tok4\", \"tok5\", "
                      "\"tok6\", \"tok7\", ...]"),
            std::string::npos) << text;
  EXPECT_NE(text.find("... (201 bytes)"), std::string::npos) << text;  // long string cut
  EXPECT_NE(text.find("[[3 × i8]]"), std::string::npos) << text;
  EXPECT_NE(text.find("1e-06"), std::string::npos) << text;
  EXPECT_NE(text.find("false"), std::string::npos) << text;
  EXPECT_NE(text.find("Q8_0"), std::string::npos) << text;
  EXPECT_NE(text.find("[20, 8]"), std::string::npos) << text;
  EXPECT_NE(text.find("Qwen3ForCausalLM"), std::string::npos) << text;
  EXPECT_NE(text.find("3 tensors"), std::string::npos) << text;
  EXPECT_NE(text.find("296 parameters"), std::string::npos) << text;
  EXPECT_EQ(text.back(), '\n');

  json j = json::parse(RenderInspectionJson(m));
  EXPECT_EQ(j["format"], "gguf");
  EXPECT_EQ(j["gguf"]["version"], 3);
  EXPECT_EQ(j["gguf"]["alignment"], 32);
  EXPECT_EQ(j["gguf"]["data_offset"], m.gguf_data_offset);
  EXPECT_EQ(j["metadata"]["general.architecture"], json({{"type", "string"}, {"value", "qwen3"}}));
  EXPECT_EQ(j["metadata"]["qwen3.block_count"], json({{"type", "u32"}, {"value", 1}}));
  EXPECT_EQ(j["metadata"]["qwen3.attention.layer_norm_rms_epsilon"]["value"], 1e-6);
  const json& toks = j["metadata"]["tokenizer.ggml.tokens"];
  EXPECT_EQ(toks["type"], "array");
  EXPECT_EQ(toks["element_type"], "string");
  EXPECT_EQ(toks["count"], 20);
  EXPECT_EQ(toks["value"].size(), 8u);
  EXPECT_EQ(toks["value"][7], "tok7");
  EXPECT_EQ(toks["truncated"], true);
  EXPECT_EQ(j["metadata"]["tokenizer.chat_template"]["value"].get<std::string>().size(), 201u);
  const json& nested = j["metadata"]["test.nested"];
  EXPECT_EQ(nested["truncated"], false);
  EXPECT_EQ(nested["value"][0], json({{"type", "array"}, {"element_type", "i8"}, {"count", 3}}));
  ASSERT_EQ(j["tensors"].size(), 3u);
  EXPECT_EQ(j["tensors"][1]["name"], "blk.0.ffn_up.weight");
  EXPECT_EQ(j["tensors"][1]["dtype"], "Q8_0");
  EXPECT_EQ(j["tensors"][1]["shape"], json::array({2, 64}));
  EXPECT_EQ(j["tensors"][1]["bytes"], 136);
  EXPECT_EQ(j["totals"]["bytes_by_dtype"]["Q8_0"], 136);
  EXPECT_EQ(j["totals"]["parameters"], 296);
  EXPECT_EQ(j["config"]["architecture"], "Qwen3ForCausalLM");
  EXPECT_EQ(j["config"]["qk_norm"], true);
  EXPECT_EQ(j["config"]["vocab_size"], 20);
  EXPECT_FALSE(j.contains("config_error"));
}

TEST_F(InspectTest, GgufIsRecognisedByItsMagic) {
  WriteTinyGguf(Path("model.bin"));
  Result<ModelInspection> r = InspectModel(Path("model.bin"));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->format, "gguf");
}

TEST_F(InspectTest, GgufWithUnsupportedArchitectureIsReportedNotFatal) {
  WriteTinyGguf(Path("g.gguf"), "gemma2");
  Result<ModelInspection> r = InspectModel(Path("g.gguf"));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_FALSE(r->config.has_value());
  EXPECT_NE(r->config_error.find("key \"general.architecture\": \"gemma2\" is not supported"),
            std::string::npos) << r->config_error;
  EXPECT_EQ(r->tensors.size(), 3u);
  json j = json::parse(RenderInspectionJson(*r));
  EXPECT_FALSE(j.contains("config"));
  EXPECT_NE(j["config_error"].get<std::string>().find("gemma2"), std::string::npos);
  EXPECT_NE(RenderInspectionText(*r).find("not supported"), std::string::npos);
}

TEST_F(InspectTest, GgufWithoutArchitectureHasNoConfig) {
  GgufWriter w;
  ASSERT_TRUE(w.AddUint32("x", 1).ok());
  ASSERT_TRUE(w.Write(Path("x.gguf")).ok());
  Result<ModelInspection> r = InspectModel(Path("x.gguf"));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_FALSE(r->config.has_value());
  EXPECT_TRUE(r->config_error.empty());
  EXPECT_TRUE(r->config_path.empty());
  EXPECT_TRUE(r->tensors.empty());
  json j = json::parse(RenderInspectionJson(*r));
  EXPECT_EQ(j["metadata"]["x"]["value"], 1);
  EXPECT_FALSE(j.contains("config"));
}

TEST_F(InspectTest, CorruptGgufFails) {
  const std::string path = Path("bad.gguf");
  WriteTinyGguf(path);
  fs::resize_file(path, fs::file_size(path) - 1);
  Status s = InspectModel(path).status();
  EXPECT_EQ(s.code(), StatusCode::kDataLoss) << s.ToString();
  EXPECT_NE(s.message().find(path + ": tensor \"output_norm.weight\""), std::string::npos)
      << s.message();
  WriteText("empty.gguf", "");
  EXPECT_EQ(InspectModel(Path("empty.gguf")).status().code(), StatusCode::kDataLoss);
  EXPECT_EQ(InspectModel(Path("absent.gguf")).status().code(), StatusCode::kNotFound);
}

}  // namespace
}  // namespace arbiter
