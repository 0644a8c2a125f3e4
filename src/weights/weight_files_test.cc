// Weight files: argument order, footprint, file token and layout digest
// (docs/weights.md acceptance 12).
#include "arbiter/weights/weight_files.h"

#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>

#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "arbiter/base/file.h"
#include "arbiter/formats/llama_tensors.h"
#include "arbiter/weights/weight_store.h"

namespace arbiter {
namespace {

namespace fs = std::filesystem;

bool Contains(const std::string& haystack, std::string_view needle) {
  return haystack.find(needle) != std::string::npos;
}

struct Tensor {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
};

class WeightFilesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::temp_directory_path() / "arbiter_weight_files_XXXXXX").string();
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { fs::remove_all(dir_); }

  // Writes `tensors` (zero-filled) and `metadata` to <dir>/<file> and opens it.
  SafetensorsModel Write(const std::vector<Tensor>& tensors,
                         const std::map<std::string, std::string>& metadata = {},
                         const std::string& file = "model.safetensors") {
    std::vector<std::string> data;
    data.reserve(tensors.size());
    std::vector<TensorToWrite> out;
    for (const Tensor& t : tensors) {
      int64_t n = 1;
      for (int64_t d : t.shape) n *= d;
      data.emplace_back(static_cast<size_t>(n) * DTypeSize(t.dtype), '\0');
      out.push_back({t.name, t.dtype, t.shape, data.back()});
    }
    Status s = WriteSafetensors(path(file), out, metadata);
    EXPECT_TRUE(s.ok()) << s.ToString();
    Result<SafetensorsModel> m = SafetensorsModel::Open(path(file));
    EXPECT_TRUE(m.ok()) << m.status().ToString();
    return std::move(m).value();
  }

  std::string path(const std::string& file) const { return dir_ + "/" + file; }

  std::string dir_;
};

// ---- WeightOrder -------------------------------------------------------------

TEST_F(WeightFilesTest, WeightOrderHonoursArgumentOrderAndIgnoresExtraTensors) {
  SafetensorsModel m = Write({{"a", DType::kF32, {2}}, {"b", DType::kF32, {2}}, {"c", DType::kF32, {2}}},
                             {{"argument_order", R"(["c", "a"])"}});
  Result<std::vector<std::string>> order = WeightOrder(m, nullptr);
  ASSERT_TRUE(order.ok()) << order.status().ToString();
  EXPECT_EQ(*order, (std::vector<std::string>{"c", "a"}));
}

TEST_F(WeightFilesTest, WeightOrderEmptyWithoutMetadataOrTensors) {
  SafetensorsModel m = Write({});
  Result<std::vector<std::string>> order = WeightOrder(m, nullptr);
  ASSERT_TRUE(order.ok()) << order.status().ToString();
  EXPECT_TRUE(order->empty());
}

TEST_F(WeightFilesTest, WeightOrderTensorsWithoutArgumentOrderFails) {
  SafetensorsModel m = Write({{"a", DType::kF32, {2}}}, {{"format", "pt"}});
  Result<std::vector<std::string>> order = WeightOrder(m, nullptr);
  ASSERT_FALSE(order.ok());
  EXPECT_EQ(order.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_TRUE(Contains(order.status().message(), path("model.safetensors")))
      << order.status().message();
  EXPECT_TRUE(Contains(order.status().message(), "has tensors but no 'argument_order' metadata"))
      << order.status().message();
}

TEST_F(WeightFilesTest, WeightOrderListedNameMissingFails) {
  SafetensorsModel m = Write({{"a", DType::kF32, {2}}}, {{"argument_order", R"(["a", "ghost"])"}});
  Result<std::vector<std::string>> order = WeightOrder(m, nullptr);
  ASSERT_FALSE(order.ok());
  EXPECT_EQ(order.status().code(), StatusCode::kDataLoss);
  EXPECT_TRUE(Contains(order.status().message(), "weight 'ghost' missing"))
      << order.status().message();
  EXPECT_TRUE(Contains(order.status().message(), path("model.safetensors")));
}

TEST_F(WeightFilesTest, WeightOrderInvalidJsonIsDataLossNamingFileAndKey) {
  for (const std::string& bad : {std::string("[\"a\""), std::string("{\"a\": 1}"),
                                 std::string("[\"a\", 3]"), std::string("\"a\""),
                                 std::string("")}) {
    SCOPED_TRACE(bad);
    SafetensorsModel m = Write({{"a", DType::kF32, {2}}}, {{"argument_order", bad}});
    Result<std::vector<std::string>> order = WeightOrder(m, nullptr);
    ASSERT_FALSE(order.ok());
    EXPECT_EQ(order.status().code(), StatusCode::kDataLoss);
    EXPECT_TRUE(Contains(order.status().message(), path("model.safetensors")))
        << order.status().message();
    EXPECT_TRUE(Contains(order.status().message(), "argument_order")) << order.status().message();
  }
}

TEST_F(WeightFilesTest, WeightOrderDuplicateNameIsDataLoss) {
  SafetensorsModel m = Write({{"a", DType::kF32, {2}}}, {{"argument_order", R"(["a", "a"])"}});
  Result<std::vector<std::string>> order = WeightOrder(m, nullptr);
  ASSERT_FALSE(order.ok());
  EXPECT_EQ(order.status().code(), StatusCode::kDataLoss);
  EXPECT_TRUE(Contains(order.status().message(), "'a' twice")) << order.status().message();
}

ModelConfig OneLayerLlama() {
  ModelConfig c;
  c.architecture_name = "LlamaForCausalLM";
  c.hidden_size = 4;
  c.intermediate_size = 6;
  c.num_hidden_layers = 1;
  c.num_attention_heads = 2;
  c.num_key_value_heads = 1;
  c.head_dim = 2;
  c.vocab_size = 8;
  return c;
}

// All tensors OneLayerLlama() needs, in name order (as a file would list
// them), plus an extra one.
std::vector<Tensor> OneLayerLlamaTensors() {
  return {
      {"lm_head.weight", DType::kF32, {8, 4}},
      {"model.embed_tokens.weight", DType::kBF16, {8, 4}},
      {"model.layers.0.input_layernorm.weight", DType::kF32, {4}},
      {"model.layers.0.mlp.down_proj.weight", DType::kF32, {4, 6}},
      {"model.layers.0.mlp.gate_proj.weight", DType::kF32, {6, 4}},
      {"model.layers.0.mlp.up_proj.weight", DType::kF32, {6, 4}},
      {"model.layers.0.post_attention_layernorm.weight", DType::kF32, {4}},
      {"model.layers.0.self_attn.k_proj.weight", DType::kF32, {2, 4}},
      {"model.layers.0.self_attn.o_proj.weight", DType::kF32, {4, 4}},
      {"model.layers.0.self_attn.q_proj.weight", DType::kF32, {4, 4}},
      {"model.layers.0.self_attn.rotary_emb.inv_freq", DType::kF32, {1}},
      {"model.layers.0.self_attn.v_proj.weight", DType::kF32, {2, 4}},
      {"model.norm.weight", DType::kF32, {4}},
  };
}

TEST_F(WeightFilesTest, WeightOrderFromArchitectureWhenNoArgumentOrder) {
  SafetensorsModel m = Write(OneLayerLlamaTensors());
  const ModelConfig config = OneLayerLlama();
  Result<std::vector<std::string>> order = WeightOrder(m, &config);
  ASSERT_TRUE(order.ok()) << order.status().ToString();
  const std::vector<std::string> want = {
      "model.embed_tokens.weight",
      "model.layers.0.input_layernorm.weight",
      "model.layers.0.self_attn.q_proj.weight",
      "model.layers.0.self_attn.k_proj.weight",
      "model.layers.0.self_attn.v_proj.weight",
      "model.layers.0.self_attn.o_proj.weight",
      "model.layers.0.post_attention_layernorm.weight",
      "model.layers.0.mlp.gate_proj.weight",
      "model.layers.0.mlp.up_proj.weight",
      "model.layers.0.mlp.down_proj.weight",
      "model.norm.weight",
      "lm_head.weight",
  };
  EXPECT_EQ(*order, want);
  // The same list the engine loads (one source of truth).
  std::vector<std::string> engine_names;
  for (const LlamaTensor& t : PlanLlamaTensors(config, m).tensors) engine_names.push_back(t.name);
  EXPECT_EQ(*order, engine_names);
}

TEST_F(WeightFilesTest, WeightOrderArgumentOrderWinsOverArchitecture) {
  SafetensorsModel m =
      Write(OneLayerLlamaTensors(), {{"argument_order", R"(["model.norm.weight"])"}});
  const ModelConfig config = OneLayerLlama();
  Result<std::vector<std::string>> order = WeightOrder(m, &config);
  ASSERT_TRUE(order.ok()) << order.status().ToString();
  EXPECT_EQ(*order, (std::vector<std::string>{"model.norm.weight"}));
}

TEST_F(WeightFilesTest, WeightOrderArchitectureTensorMissingIsNotFound) {
  std::vector<Tensor> tensors = OneLayerLlamaTensors();
  std::erase_if(tensors, [](const Tensor& t) { return t.name == "model.norm.weight"; });
  SafetensorsModel m = Write(tensors);
  const ModelConfig config = OneLayerLlama();
  Result<std::vector<std::string>> order = WeightOrder(m, &config);
  ASSERT_FALSE(order.ok());
  EXPECT_EQ(order.status().code(), StatusCode::kNotFound);
  EXPECT_TRUE(Contains(order.status().message(), "weight 'model.norm.weight' missing"))
      << order.status().message();
  EXPECT_TRUE(Contains(order.status().message(), "LlamaForCausalLM")) << order.status().message();
}

// ---- WeightsNbytes / WeightSpecs ----------------------------------------------

TEST_F(WeightFilesTest, WeightsNbytesSumsShapeTimesElementSize) {
  SafetensorsModel m = Write({{"f32", DType::kF32, {2, 3}},
                              {"bf16", DType::kBF16, {4}},
                              {"u8", DType::kU8, {5}},
                              {"f64", DType::kF64, {1, 1, 3}},
                              {"empty", DType::kF32, {0, 7}}});
  Result<uint64_t> n = WeightsNbytes(m, {"f32", "bf16", "u8", "f64", "empty"});
  ASSERT_TRUE(n.ok()) << n.status().ToString();
  EXPECT_EQ(*n, 24u + 8u + 5u + 24u + 0u);
  EXPECT_EQ(*WeightsNbytes(m, {"bf16"}), 8u);
  EXPECT_EQ(*WeightsNbytes(m, {}), 0u);
}

TEST_F(WeightFilesTest, WeightsNbytesUnknownNameIsNotFound) {
  SafetensorsModel m = Write({{"a", DType::kF32, {2}}});
  Result<uint64_t> n = WeightsNbytes(m, {"a", "ghost"});
  ASSERT_FALSE(n.ok());
  EXPECT_EQ(n.status().code(), StatusCode::kNotFound);
  EXPECT_TRUE(Contains(n.status().message(), "'ghost'")) << n.status().message();
  EXPECT_TRUE(Contains(n.status().message(), path("model.safetensors")));
}

TEST_F(WeightFilesTest, WeightSpecsInGivenOrder) {
  SafetensorsModel m = Write({{"a", DType::kF16, {2, 2}}, {"b", DType::kI32, {3}}});
  Result<std::vector<WeightSpec>> specs = WeightSpecs(m, {"b", "a"});
  ASSERT_TRUE(specs.ok()) << specs.status().ToString();
  ASSERT_EQ(specs->size(), 2u);
  EXPECT_EQ((*specs)[0].name, "b");
  EXPECT_EQ((*specs)[0].dtype, DType::kI32);
  EXPECT_EQ((*specs)[1].shape, (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(WeightSpecs(m, {"zz"}).status().code(), StatusCode::kNotFound);
}

// ---- WeightsFileToken (docs/weights.md acceptance 12) --------------------------

void SetMtime(const std::string& path, int64_t sec, int64_t nsec) {
  struct timespec times[2] = {{sec, nsec}, {sec, nsec}};
  ASSERT_EQ(::utimensat(AT_FDCWD, path.c_str(), times, 0), 0);
}

TEST_F(WeightFilesTest, FileTokenNonzeroAndStable) {
  ASSERT_TRUE(WriteFileAtomic(path("w.safetensors"), "hello").ok());
  const uint64_t t = WeightsFileToken(path("w.safetensors"));
  EXPECT_NE(t, 0u);
  EXPECT_EQ(WeightsFileToken(path("w.safetensors")), t);
}

TEST_F(WeightFilesTest, FileTokenChangesOnRewrite) {
  const std::string p = path("w.safetensors");
  ASSERT_TRUE(WriteFileAtomic(p, "hello").ok());
  SetMtime(p, 1700000000, 0);
  const uint64_t before = WeightsFileToken(p);
  // Same size, new contents, new mtime: the token changes.
  ASSERT_TRUE(WriteFileAtomic(p, "world").ok());
  SetMtime(p, 1700000000, 1);
  const uint64_t after = WeightsFileToken(p);
  EXPECT_NE(after, 0u);
  EXPECT_NE(after, before);
  // Same mtime, new size: changes too.
  ASSERT_TRUE(WriteFileAtomic(p, "hello!").ok());
  SetMtime(p, 1700000000, 1);
  EXPECT_NE(WeightsFileToken(p), after);
}

TEST_F(WeightFilesTest, FileTokenZeroForEmptyPath) { EXPECT_EQ(WeightsFileToken(""), 0u); }

TEST_F(WeightFilesTest, FileTokenZeroForMissingFile) {
  EXPECT_EQ(WeightsFileToken(path("does-not-exist.safetensors")), 0u);
}

// ---- WeightsDigest (docs/weights.md acceptance 12) -----------------------------

std::vector<WeightSpec> TwoSpecs() {
  return {{"model.embed_tokens.weight", DType::kBF16, {32, 8}},
          {"model.norm.weight", DType::kF32, {8}}};
}

TEST(WeightsDigestTest, StableAcrossCalls) {
  EXPECT_EQ(WeightsDigest("demo-chat", TwoSpecs(), 42), WeightsDigest("demo-chat", TwoSpecs(), 42));
}

// Pins format v1 so that two processes (or two builds) agree: if this
// changes, bump kWeightsDigestFormatV1.
TEST(WeightsDigestTest, KnownValueOfFormatV1) {
  EXPECT_EQ(WeightsDigestPreimage("m", {{"w", DType::kF32, {2, 3}}}, 7),
            "arbiter-weights-digest-v1\nkey 1:m\ncontent 7\ntensors 1\n1:w F32 4 [2,3]\n");
  EXPECT_EQ(WeightsDigestPreimage("demo-chat", TwoSpecs(), 42),
            "arbiter-weights-digest-v1\nkey 9:demo-chat\ncontent 42\ntensors 2\n"
            "25:model.embed_tokens.weight BF16 2 [32,8]\n17:model.norm.weight F32 4 [8]\n");
  EXPECT_EQ(WeightsDigest("demo-chat", TwoSpecs(), 42), 0xb08fc37045689c9eull);
}

TEST(WeightsDigestTest, ChangesWithSize) {
  std::vector<WeightSpec> specs = TwoSpecs();
  specs[0].shape = {33, 8};
  EXPECT_NE(WeightsDigest("demo-chat", specs, 42), WeightsDigest("demo-chat", TwoSpecs(), 42));
  specs = TwoSpecs();
  specs[1].shape = {8, 1};  // same element count, different shape
  EXPECT_NE(WeightsDigest("demo-chat", specs, 42), WeightsDigest("demo-chat", TwoSpecs(), 42));
}

TEST(WeightsDigestTest, ChangesWithName) {
  std::vector<WeightSpec> specs = TwoSpecs();
  specs[1].name = "model.final_norm.weight";
  EXPECT_NE(WeightsDigest("demo-chat", specs, 42), WeightsDigest("demo-chat", TwoSpecs(), 42));
  // The model key is part of the identity too.
  EXPECT_NE(WeightsDigest("demo-chat2", TwoSpecs(), 42), WeightsDigest("demo-chat", TwoSpecs(), 42));
}

TEST(WeightsDigestTest, ChangesWithDtype) {
  std::vector<WeightSpec> specs = TwoSpecs();
  specs[0].dtype = DType::kF16;  // same element size, different dtype
  EXPECT_NE(WeightsDigest("demo-chat", specs, 42), WeightsDigest("demo-chat", TwoSpecs(), 42));
}

TEST(WeightsDigestTest, ChangesWithContentToken) {
  EXPECT_NE(WeightsDigest("demo-chat", TwoSpecs(), 43), WeightsDigest("demo-chat", TwoSpecs(), 42));
  EXPECT_NE(WeightsDigest("demo-chat", TwoSpecs(), 0), WeightsDigest("demo-chat", TwoSpecs(), 42));
}

TEST(WeightsDigestTest, ChangesWithOrderAndIsInjectiveOverSeparators) {
  std::vector<WeightSpec> specs = TwoSpecs();
  std::swap(specs[0], specs[1]);
  EXPECT_NE(WeightsDigest("demo-chat", specs, 42), WeightsDigest("demo-chat", TwoSpecs(), 42));
  // Length prefixes: moving a separator-like byte between key and name
  // cannot produce the same preimage.
  EXPECT_NE(WeightsDigestPreimage("a 1:b", {}, 0), WeightsDigestPreimage("a", {}, 0));
  EXPECT_NE(WeightsDigestPreimage("k", {{"a\n1:b", DType::kF32, {}}}, 0),
            WeightsDigestPreimage("k", {{"a", DType::kF32, {}}, {"b", DType::kF32, {}}}, 0));
}

TEST(WeightsDigestTest, GgmlTypedSpecNamesItsBlockType) {
  const WeightSpec q{"w", DType::kU8, {4, 256}, GgmlType::kQ4_K};
  EXPECT_EQ(WeightsDigestPreimage("m", {q}, 7),
            "arbiter-weights-digest-v1\nkey 1:m\ncontent 7\ntensors 1\n1:w ggml:Q4_K 256/144 [4,256]\n");
  WeightSpec q6 = q;
  q6.ggml_type = GgmlType::kQ6_K;
  EXPECT_NE(WeightsDigest("m", {q}, 7), WeightsDigest("m", {q6}, 7));
}

TEST(WeightSpecBytesTest, GgmlTypedSpecIsRowsTimesRowBytes) {
  EXPECT_EQ(WeightSpecBytes({"w", DType::kU8, {4, 512}, GgmlType::kQ4_K}), 4u * 2 * 144);
  EXPECT_EQ(WeightSpecBytes({"w", DType::kU8, {3, 64}, GgmlType::kQ8_0}), 3u * 2 * 34);
  EXPECT_EQ(WeightSpecBytes({"w", DType::kU8, {64}, GgmlType::kQ8_0}), 2u * 34);
  EXPECT_EQ(WeightSpecBytes({"w", DType::kU8, {0, 64}, GgmlType::kQ8_0}), 0u);
  // Rows that are not whole blocks, an unknown type and no shape are refused.
  EXPECT_EQ(WeightSpecBytes({"w", DType::kU8, {2, 100}, GgmlType::kQ4_K}), SIZE_MAX);
  EXPECT_EQ(WeightSpecBytes({"w", DType::kU8, {2, 32}, static_cast<GgmlType>(4)}), SIZE_MAX);
  EXPECT_EQ(WeightSpecBytes({"w", DType::kU8, {}, GgmlType::kQ8_0}), SIZE_MAX);
  EXPECT_EQ(WeightSpecBytes({"w", DType::kU8, {-1, 32}, GgmlType::kQ8_0}), SIZE_MAX);
}

}  // namespace
}  // namespace arbiter
