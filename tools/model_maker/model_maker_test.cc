#include "tools/model_maker/model_maker.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <filesystem>

#include "arbiter/base/file.h"
#include "arbiter/engine/chat_template.h"
#include "arbiter/engine/tokenizer.h"
#include "arbiter/formats/model_config.h"
#include "arbiter/formats/safetensors.h"

namespace arbiter {
namespace {

namespace fs = std::filesystem;

std::string TempDir(const std::string& tag) {
  static int n = 0;
  std::string d = ::testing::TempDir() + "/arbiter_model_maker_" + std::to_string(::getpid()) +
                  "_" + tag + "_" + std::to_string(n++);
  fs::remove_all(d);
  return d;
}

double SecondsSince(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

const char* const kFiles[] = {"config.json", "model.safetensors", "tokenizer.json",
                              "tokenizer_config.json", "generation_config.json"};

TEST(ModelMakerTest, PresetsAreListedAndDescribed) {
  auto names = ModelPresetNames();
  ASSERT_GE(names.size(), 5u);
  for (const auto& n : names) EXPECT_FALSE(ModelPresetDescription(n).empty()) << n;
  EXPECT_TRUE(ModelPresetDescription("nope").empty());
  EXPECT_TRUE(ModelPresetIsEmbedding("demo-embed"));
  EXPECT_FALSE(ModelPresetIsEmbedding("demo-chat"));
  EXPECT_FALSE(ModelPresetIsEmbedding("tiny"));
}

TEST(ModelMakerTest, UnknownPresetIsNotFoundAndListsPresets) {
  Status s = MakeModel("huge", TempDir("unknown"), 1);
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_NE(s.message().find("tiny"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("demo-chat"), std::string::npos) << s.message();
}

TEST(ModelMakerTest, TinyWritesAllFilesThatLoad) {
  std::string dir = TempDir("tiny") + "/nested/out";  // created when missing
  std::vector<std::string> stages;
  auto t0 = std::chrono::steady_clock::now();
  Status s = MakeModel("tiny", dir, 42, [&](std::string_view stage, double f) {
    EXPECT_GE(f, 0.0);
    EXPECT_LE(f, 1.0);
    if (stages.empty() || stages.back() != stage) stages.emplace_back(stage);
  });
  double secs = SecondsSince(t0);
  ASSERT_TRUE(s.ok()) << s.ToString();
  std::printf("make-model tiny: %.3f s\n", secs);
  EXPECT_LT(secs, 2.0);
  EXPECT_EQ(stages, (std::vector<std::string>{"tokenizer", "weights", "write"}));
  for (const char* f : kFiles) EXPECT_TRUE(fs::exists(dir + "/" + f)) << f;
  EXPECT_LT(fs::file_size(dir + "/model.safetensors"), 4u << 20);

  auto cfg = LoadModelConfig(dir + "/config.json");
  ASSERT_TRUE(cfg.ok()) << cfg.status().ToString();
  EXPECT_EQ(cfg->arch, Architecture::kLlama);
  EXPECT_EQ(cfg->hidden_size, 64);
  EXPECT_EQ(cfg->num_hidden_layers, 2);
  EXPECT_EQ(cfg->num_attention_heads, 4);
  EXPECT_EQ(cfg->num_key_value_heads, 2);
  EXPECT_EQ(cfg->head_dim, 16);
  EXPECT_EQ(cfg->intermediate_size, 128);
  EXPECT_FALSE(cfg->tie_word_embeddings);
  EXPECT_FLOAT_EQ(cfg->rope_theta, 10000.0f);

  auto tok = Tokenizer::Load(dir + "/tokenizer.json");
  ASSERT_TRUE(tok.ok()) << tok.status().ToString();
  EXPECT_EQ((*tok)->vocab_size(), cfg->vocab_size);
  EXPECT_GT(cfg->vocab_size, 256 + 400);
  EXPECT_LT(cfg->vocab_size, 256 + 512 + 10);
  auto kind = DetectChatTemplate(**tok);
  ASSERT_TRUE(kind.ok());
  EXPECT_EQ(*kind, ChatTemplateKind::kChatML);
  ASSERT_EQ(cfg->eos_token_ids.size(), 2u);
  EXPECT_EQ(cfg->eos_token_ids[0], (*tok)->TokenId("<|im_end|>"));
  EXPECT_EQ(cfg->eos_token_ids[1], (*tok)->TokenId("<|endoftext|>"));

  auto model = SafetensorsModel::Open(dir);
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  const TensorInfo* emb = model->Find("model.embed_tokens.weight");
  ASSERT_NE(emb, nullptr);
  EXPECT_EQ(emb->dtype, DType::kF32);
  EXPECT_EQ(emb->shape, (std::vector<int64_t>{cfg->vocab_size, 64}));
  const TensorInfo* head = model->Find("lm_head.weight");
  ASSERT_NE(head, nullptr);
  EXPECT_EQ(head->shape, (std::vector<int64_t>{cfg->vocab_size, 64}));
  const TensorInfo* k = model->Find("model.layers.1.self_attn.k_proj.weight");
  ASSERT_NE(k, nullptr);
  EXPECT_EQ(k->shape, (std::vector<int64_t>{32, 64}));
  const TensorInfo* o = model->Find("model.layers.0.self_attn.o_proj.weight");
  ASSERT_NE(o, nullptr);
  EXPECT_EQ(o->shape, (std::vector<int64_t>{64, 64}));
  const TensorInfo* down = model->Find("model.layers.0.mlp.down_proj.weight");
  ASSERT_NE(down, nullptr);
  EXPECT_EQ(down->shape, (std::vector<int64_t>{64, 128}));
  EXPECT_EQ(model->Find("model.layers.0.self_attn.q_proj.bias"), nullptr);
  EXPECT_EQ(model->Find("model.layers.0.self_attn.q_norm.weight"), nullptr);
  EXPECT_NE(model->Find("model.norm.weight"), nullptr);
  EXPECT_EQ(model->tensors().size(), 1u + 2u * 9u + 1u + 1u);

  // Weight statistics: projections ~ 0.5/sqrt(64) = 0.0625, norms ~ 1.
  std::vector<float> w(k->num_elements());
  ASSERT_TRUE(ConvertToF32(*k, w.data()).ok());
  double sum = 0, sq = 0;
  for (float v : w) sum += v, sq += double(v) * v;
  double mean = sum / w.size(), sd = std::sqrt(sq / w.size() - mean * mean);
  EXPECT_NEAR(mean, 0.0, 0.01);
  EXPECT_NEAR(sd, 0.0625, 0.01);
  const TensorInfo* norm = model->Find("model.layers.0.input_layernorm.weight");
  std::vector<float> nw(norm->num_elements());
  ASSERT_TRUE(ConvertToF32(*norm, nw.data()).ok());
  for (float v : nw) {
    EXPECT_GT(v, 0.7f);
    EXPECT_LT(v, 1.3f);
  }

  auto tc = ReadFile(dir + "/tokenizer_config.json");
  ASSERT_TRUE(tc.ok());
  EXPECT_NE(tc->find("chat_template"), std::string::npos);
  EXPECT_NE(tc->find("\"eos_token\": \"<|im_end|>\""), std::string::npos);
  // No temp files left behind.
  for (const auto& e : fs::directory_iterator(dir)) {
    EXPECT_EQ(e.path().filename().string().find(".tmp"), std::string::npos) << e.path();
  }
}

TEST(ModelMakerTest, SameSeedGivesIdenticalFilesOtherSeedDiffers) {
  std::string a = TempDir("det_a"), b = TempDir("det_b"), c = TempDir("det_c");
  ASSERT_TRUE(MakeModel("tiny", a, 7).ok());
  ASSERT_TRUE(MakeModel("tiny", b, 7).ok());
  ASSERT_TRUE(MakeModel("tiny", c, 8).ok());
  for (const char* f : kFiles) {
    auto fa = ReadFile(a + "/" + f), fb = ReadFile(b + "/" + f), fc = ReadFile(c + "/" + f);
    ASSERT_TRUE(fa.ok() && fb.ok() && fc.ok()) << f;
    EXPECT_TRUE(*fa == *fb) << f << " differs between two runs with the same seed";
    if (std::string(f) == "model.safetensors") {
      EXPECT_FALSE(*fa == *fc) << "seed does not change the weights";
    }
  }
}

TEST(ModelMakerTest, TinyQwen2HasBiasesAndTiedEmbeddings) {
  std::string dir = TempDir("qwen2");
  ASSERT_TRUE(MakeModel("tiny-qwen2", dir, 1).ok());
  auto cfg = LoadModelConfig(dir + "/config.json");
  ASSERT_TRUE(cfg.ok()) << cfg.status().ToString();
  EXPECT_EQ(cfg->arch, Architecture::kQwen2);
  EXPECT_TRUE(cfg->attention_bias);
  EXPECT_TRUE(cfg->tie_word_embeddings);
  auto model = SafetensorsModel::Open(dir);
  ASSERT_TRUE(model.ok());
  EXPECT_EQ(model->Find("lm_head.weight"), nullptr);
  const TensorInfo* kb = model->Find("model.layers.0.self_attn.k_proj.bias");
  ASSERT_NE(kb, nullptr);
  EXPECT_EQ(kb->shape, (std::vector<int64_t>{32}));
  EXPECT_NE(model->Find("model.layers.1.self_attn.q_proj.bias"), nullptr);
  EXPECT_NE(model->Find("model.layers.1.self_attn.v_proj.bias"), nullptr);
}

TEST(ModelMakerTest, TinyQwen3HasQkNormsAndExplicitHeadDim) {
  std::string dir = TempDir("qwen3");
  ASSERT_TRUE(MakeModel("tiny-qwen3", dir, 1).ok());
  auto cfg = LoadModelConfig(dir + "/config.json");
  ASSERT_TRUE(cfg.ok()) << cfg.status().ToString();
  EXPECT_EQ(cfg->arch, Architecture::kQwen3);
  EXPECT_TRUE(cfg->qk_norm);
  EXPECT_EQ(cfg->head_dim, 32);
  auto model = SafetensorsModel::Open(dir);
  ASSERT_TRUE(model.ok());
  const TensorInfo* qn = model->Find("model.layers.0.self_attn.q_norm.weight");
  ASSERT_NE(qn, nullptr);
  EXPECT_EQ(qn->shape, (std::vector<int64_t>{32}));
  EXPECT_NE(model->Find("model.layers.1.self_attn.k_norm.weight"), nullptr);
  const TensorInfo* q = model->Find("model.layers.0.self_attn.q_proj.weight");
  ASSERT_NE(q, nullptr);
  EXPECT_EQ(q->shape, (std::vector<int64_t>{128, 64}));
  const TensorInfo* o = model->Find("model.layers.0.self_attn.o_proj.weight");
  EXPECT_EQ(o->shape, (std::vector<int64_t>{64, 128}));
}

TEST(ModelMakerTest, DemoChatMatchesTheDocumentedShape) {
  std::string dir = TempDir("demo");
  auto t0 = std::chrono::steady_clock::now();
  ASSERT_TRUE(MakeModel("demo-chat", dir, 0).ok());
  std::printf("make-model demo-chat: %.3f s\n", SecondsSince(t0));
  auto cfg = LoadModelConfig(dir + "/config.json");
  ASSERT_TRUE(cfg.ok()) << cfg.status().ToString();
  EXPECT_EQ(cfg->arch, Architecture::kQwen3);
  EXPECT_EQ(cfg->hidden_size, 768);
  EXPECT_EQ(cfg->num_hidden_layers, 8);
  EXPECT_EQ(cfg->num_attention_heads, 12);
  EXPECT_EQ(cfg->num_key_value_heads, 4);
  EXPECT_EQ(cfg->head_dim, 64);
  EXPECT_EQ(cfg->intermediate_size, 2048);
  EXPECT_EQ(cfg->max_position_embeddings, 4096);
  EXPECT_TRUE(cfg->tie_word_embeddings);
  EXPECT_GT(cfg->vocab_size, 3800);
  EXPECT_LT(cfg->vocab_size, 4100);
  auto model = SafetensorsModel::Open(dir);
  ASSERT_TRUE(model.ok());
  int64_t params = 0;
  for (const TensorInfo* t : model->tensors()) {
    EXPECT_EQ(t->dtype, DType::kBF16) << t->name;
    params += t->num_elements();
  }
  EXPECT_GT(params, 50'000'000);
  EXPECT_LT(params, 56'000'000);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace arbiter
