#include "tools/model_maker/model_maker.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <tuple>

#include "arbiter/base/file.h"
#include "arbiter/engine/chat_template.h"
#include "arbiter/engine/tokenizer.h"
#include "arbiter/formats/gguf.h"
#include "arbiter/formats/llama_tensors.h"
#include "arbiter/formats/model_config.h"
#include "arbiter/formats/safetensors.h"
#include "engine/internal/quant.h"

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

// ---- GGUF ------------------------------------------------------------------

// The bytes of tensor `name` of the GGUF file `path`.
std::string GgufTensorBytes(const std::string& path, const GgufFile& gguf,
                            const std::string& name) {
  const GgufTensorInfo* t = gguf.FindTensor(name);
  EXPECT_NE(t, nullptr) << name;
  if (t == nullptr) return "";
  Result<std::string> file = ReadFile(path);
  EXPECT_TRUE(file.ok());
  return file->substr(gguf.data_offset() + t->offset, t->size_bytes);
}

std::vector<float> SafetensorsValues(const SafetensorsModel& st, const std::string& name) {
  const TensorInfo* t = st.Find(name);
  EXPECT_NE(t, nullptr) << name;
  if (t == nullptr) return {};
  std::vector<float> v(t->num_elements());
  EXPECT_TRUE(ConvertToF32(*t, v.data()).ok());
  return v;
}

std::vector<float> AsFloats(const std::string& bytes) {
  std::vector<float> v(bytes.size() / 4);
  std::memcpy(v.data(), bytes.data(), v.size() * 4);
  return v;
}

// The GGUF file holds the safetensors directory's model: the config, the
// tokenizer and the same values (Note [GGUF files of make-model]).
TEST(ModelMakerGgufTest, TinyGgufHoldsTheSafetensorsModel) {
  const std::string dir = TempDir("gguf_tiny");
  const std::string path = dir + "/sub/tiny.gguf";  // the directory is created
  MakeModelOptions o;
  o.format = ModelFormat::kGguf;
  o.dtype = "f32";
  o.seed = 3;
  std::vector<std::string> stages;
  Status s = MakeModel("tiny", path, o, [&](std::string_view stage, double) {
    if (stages.empty() || stages.back() != stage) stages.emplace_back(stage);
  });
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(stages, (std::vector<std::string>{"tokenizer", "weights", "write"}));
  ASSERT_TRUE(MakeModel("tiny", dir + "/hf", 3).ok());

  Result<GgufFile> gguf = OpenGguf(path);
  ASSERT_TRUE(gguf.ok()) << gguf.status().ToString();
  EXPECT_EQ(*gguf->GetString("general.architecture"), "llama");
  EXPECT_EQ(*gguf->GetString("general.name"), "tiny");
  EXPECT_EQ(*gguf->GetUint("general.file_type"), 0u);
  EXPECT_EQ(*gguf->GetString("tokenizer.ggml.model"), "gpt2");
  EXPECT_EQ(*gguf->GetString("tokenizer.ggml.pre"), "qwen2");
  EXPECT_NE(gguf->GetString("tokenizer.chat_template")->find("<|im_start|>"), std::string::npos);
  Result<ModelConfig> from_gguf = ModelConfigFromGguf(*gguf);
  ASSERT_TRUE(from_gguf.ok()) << from_gguf.status().ToString();
  Result<ModelConfig> from_json = LoadModelConfig(dir + "/hf/config.json");
  ASSERT_TRUE(from_json.ok());
  EXPECT_EQ(from_gguf->arch, from_json->arch);
  EXPECT_EQ(from_gguf->hidden_size, from_json->hidden_size);
  EXPECT_EQ(from_gguf->intermediate_size, from_json->intermediate_size);
  EXPECT_EQ(from_gguf->num_hidden_layers, from_json->num_hidden_layers);
  EXPECT_EQ(from_gguf->num_attention_heads, from_json->num_attention_heads);
  EXPECT_EQ(from_gguf->num_key_value_heads, from_json->num_key_value_heads);
  EXPECT_EQ(from_gguf->head_dim, from_json->head_dim);
  EXPECT_EQ(from_gguf->vocab_size, from_json->vocab_size);
  EXPECT_EQ(from_gguf->max_position_embeddings, from_json->max_position_embeddings);
  EXPECT_FLOAT_EQ(from_gguf->rms_norm_eps, from_json->rms_norm_eps);
  EXPECT_FLOAT_EQ(from_gguf->rope_theta, from_json->rope_theta);
  EXPECT_EQ(from_gguf->tie_word_embeddings, from_json->tie_word_embeddings);
  EXPECT_EQ(from_gguf->bos_token_ids, from_json->bos_token_ids);
  ASSERT_FALSE(from_gguf->eos_token_ids.empty());
  EXPECT_EQ(from_gguf->eos_token_ids[0], from_json->eos_token_ids[0]);  // <|im_end|>

  Result<std::vector<std::string>> tokens = gguf->GetStringArray("tokenizer.ggml.tokens");
  ASSERT_TRUE(tokens.ok());
  EXPECT_EQ(tokens->back(), "<|im_end|>");
  Result<std::vector<int64_t>> types = gguf->GetIntArray("tokenizer.ggml.token_type");
  ASSERT_TRUE(types.ok());
  ASSERT_EQ(types->size(), tokens->size());
  EXPECT_EQ(types->front(), 1);
  EXPECT_EQ(types->back(), 3);
  EXPECT_GT(gguf->GetStringArray("tokenizer.ggml.merges")->size(), 400u);

  // Tensors: the safetensors names' llama.cpp counterparts, same values;
  // matrices in the dtype, 1-D F32.
  Result<SafetensorsModel> st = SafetensorsModel::Open(dir + "/hf");
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(gguf->tensors().size(), st->tensors().size());
  EXPECT_EQ(gguf->FindTensor("output.weight")->type, GgmlType::kF32);
  EXPECT_EQ(gguf->FindTensor("blk.1.ffn_down.weight")->RowMajorShape(),
            (std::vector<int64_t>{64, 128}));
  EXPECT_EQ(AsFloats(GgufTensorBytes(path, *gguf, "token_embd.weight")),
            SafetensorsValues(*st, "model.embed_tokens.weight"));
  EXPECT_EQ(AsFloats(GgufTensorBytes(path, *gguf, "blk.0.attn_norm.weight")),
            SafetensorsValues(*st, "model.layers.0.input_layernorm.weight"));
  EXPECT_EQ(AsFloats(GgufTensorBytes(path, *gguf, "blk.1.attn_v.weight")),
            SafetensorsValues(*st, "model.layers.1.self_attn.v_proj.weight"));

  // Note [GGUF q/k row order]: llama.cpp's converter layout. Within each head
  // of 16 rows, file row 2i + s is Hugging Face row 8s + i.
  const int64_t cols = 64;
  for (const auto& [gguf_name, hf_name, heads] :
       {std::tuple{"blk.0.attn_q.weight", "model.layers.0.self_attn.q_proj.weight", 4},
        std::tuple{"blk.0.attn_k.weight", "model.layers.0.self_attn.k_proj.weight", 2}}) {
    const std::vector<float> file = AsFloats(GgufTensorBytes(path, *gguf, gguf_name));
    const std::vector<float> hf = SafetensorsValues(*st, hf_name);
    ASSERT_EQ(file.size(), static_cast<size_t>(heads) * 16 * cols);
    auto row = [&](const std::vector<float>& v, int64_t r) {
      return std::vector<float>(v.begin() + r * cols, v.begin() + (r + 1) * cols);
    };
    EXPECT_EQ(row(file, 0), row(hf, 0)) << gguf_name;
    EXPECT_EQ(row(file, 1), row(hf, 8)) << gguf_name;
    EXPECT_EQ(row(file, 2), row(hf, 1)) << gguf_name;
    EXPECT_EQ(row(file, 15), row(hf, 15)) << gguf_name;
    EXPECT_EQ(row(file, 16 + 3), row(hf, 16 + 9)) << gguf_name;  // head 1
    EXPECT_NE(row(file, 1), row(hf, 1)) << gguf_name;
  }
  fs::remove_all(dir);
}

TEST(ModelMakerGgufTest, QuantizedRowsAreQuantizeRowOfTheValuesAndVectorsStayF32) {
  const std::string dir = TempDir("gguf_q8");
  ASSERT_TRUE(MakeModel("tiny-qwen2", dir + "/hf", 4).ok());
  MakeModelOptions o;
  o.format = ModelFormat::kGguf;
  o.dtype = "q8_0";
  o.seed = 4;
  const std::string path = dir + "/q8.gguf";
  ASSERT_TRUE(MakeModel("tiny-qwen2", path, o).ok());
  Result<GgufFile> gguf = OpenGguf(path);
  ASSERT_TRUE(gguf.ok()) << gguf.status().ToString();
  EXPECT_EQ(*gguf->GetUint("general.file_type"), 7u);     // MOSTLY_Q8_0
  EXPECT_EQ(gguf->FindTensor("output.weight"), nullptr);  // tied
  Result<SafetensorsModel> st = SafetensorsModel::Open(dir + "/hf");
  ASSERT_TRUE(st.ok());
  for (const GgufTensorInfo& t : gguf->tensors()) {
    EXPECT_EQ(t.type, t.dims.size() == 2 ? GgmlType::kQ8_0 : GgmlType::kF32) << t.name;
  }
  const std::vector<float> embed = SafetensorsValues(*st, "model.embed_tokens.weight");
  std::string want(*GgmlRowBytes(GgmlType::kQ8_0, 64) * (embed.size() / 64), '\0');
  for (size_t r = 0; r < embed.size() / 64; ++r) {
    ASSERT_TRUE(engine_internal::QuantizeRow(GgmlType::kQ8_0, &embed[r * 64], 64,
                                             &want[r * *GgmlRowBytes(GgmlType::kQ8_0, 64)])
                    .ok());
  }
  EXPECT_TRUE(GgufTensorBytes(path, *gguf, "token_embd.weight") == want);
  // qwen2 is stored unpermuted, its biases F32 as they are.
  EXPECT_EQ(AsFloats(GgufTensorBytes(path, *gguf, "blk.0.attn_k.bias")),
            SafetensorsValues(*st, "model.layers.0.self_attn.k_proj.bias"));
  fs::remove_all(dir);
}

TEST(ModelMakerGgufTest, SameSeedSameFileAndBadDtypesAreRefused) {
  const std::string dir = TempDir("gguf_det");
  MakeModelOptions o;
  o.format = ModelFormat::kGguf;
  o.dtype = "q4_0";
  o.seed = 9;
  ASSERT_TRUE(MakeModel("tiny-qwen3", dir + "/a.gguf", o).ok());
  ASSERT_TRUE(MakeModel("tiny-qwen3", dir + "/b.gguf", o).ok());
  EXPECT_TRUE(*ReadFile(dir + "/a.gguf") == *ReadFile(dir + "/b.gguf"));

  o.dtype = "q6_k";  // rows of 64: not whole 256-element blocks
  Status k = MakeModel("tiny-qwen3", dir + "/k.gguf", o);
  EXPECT_EQ(k.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(k.message().find("blocks of 256"), std::string::npos) << k.message();
  EXPECT_FALSE(fs::exists(dir + "/k.gguf"));
  o.dtype = "q3_k";
  EXPECT_EQ(MakeModel("tiny-qwen3", dir + "/x.gguf", o).code(), StatusCode::kInvalidArgument);
  MakeModelOptions st;
  st.dtype = "q8_0";  // a block type in safetensors
  Status s = MakeModel("tiny", dir + "/st", st);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("--format gguf"), std::string::npos) << s.message();
  EXPECT_EQ(ModelDtypeNames(ModelFormat::kSafetensors),
            (std::vector<std::string>{"f32", "f16", "bf16"}));
  EXPECT_EQ(ModelDtypeNames(ModelFormat::kGguf).size(), 11u);
  fs::remove_all(dir);
}

TEST(ModelMakerGgufTest, SafetensorsF16StoresEveryTensorF16) {
  const std::string dir = TempDir("st_f16");
  MakeModelOptions o;
  o.dtype = "f16";
  ASSERT_TRUE(MakeModel("tiny", dir, o).ok());
  auto model = SafetensorsModel::Open(dir);
  ASSERT_TRUE(model.ok());
  for (const TensorInfo* t : model->tensors()) EXPECT_EQ(t->dtype, DType::kF16) << t->name;
  auto cfg = ReadFile(dir + "/config.json");
  EXPECT_NE(cfg->find("\"torch_dtype\": \"float16\""), std::string::npos);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace arbiter
