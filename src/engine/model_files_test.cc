// ModelFiles (arbiter/engine/model_files.h): one parse per load (Note [One
// parse per load] in src/engine/engine.cc). A model directory opened once
// gives the footprint, the weight registration and the engine with no
// second read of config.json or tokenizer.json (the tests delete them after
// OpenModelFiles); the engine's greedy output is the path-based load's; a
// weight file changed after the open fails the fill with a clear error.
#include "arbiter/engine/model_files.h"

#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "arbiter/engine/engine.h"
#include "tools/model_maker/model_maker.h"
#include "arbiter/memory/device_backend.h"
#include "arbiter/base/file.h"
#include "arbiter/weights/weight_cache.h"
#include "engine/internal/test_model.h"

namespace arbiter {
namespace {

namespace fs = std::filesystem;

class ModelFilesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = engine_internal::MakeTempDir("arbiter_model_files_test_");
    Status s = MakeModel("tiny", dir_, 7);
    ASSERT_TRUE(s.ok()) << s.ToString();
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }

  static EngineOptions Options(int n_slots = 2, int n_ctx = 256) {
    EngineOptions o;
    o.n_ctx = n_ctx;
    o.n_slots = n_slots;
    o.prefill_batch = 16;
    return o;
  }

  static std::vector<int32_t> GreedyTokens(Engine& e, const std::string& text) {
    GenerationRequest r;
    r.prompt_ids = e.tokenizer().Encode(text, /*parse_special=*/false);
    r.sampling.temperature = 0.0f;
    r.max_tokens = 8;
    r.ignore_eos = true;
    Result<GenerationResult> g = e.Generate(r, nullptr, nullptr);
    EXPECT_TRUE(g.ok()) << g.status().ToString();
    return g.ok() ? g->output_ids : std::vector<int32_t>{};
  }

  // Removes config.json and tokenizer.json: whatever still works read them
  // no more.
  void DeleteParsedFiles() {
    ASSERT_TRUE(fs::remove(fs::path(dir_) / "config.json"));
    ASSERT_TRUE(fs::remove(fs::path(dir_) / "tokenizer.json"));
  }

  std::string dir_;
};

constexpr const char* kText = "The quick brown fox jumps over the lazy dog";

TEST_F(ModelFilesTest, LoadFromFilesReadsNothingAgainAndMatchesThePathLoad) {
  Result<std::unique_ptr<Engine>> by_path = Engine::Load(dir_, Options());
  ASSERT_TRUE(by_path.ok()) << by_path.status().ToString();
  const std::vector<int32_t> want = GreedyTokens(**by_path, kText);
  ASSERT_FALSE(want.empty());

  Result<std::shared_ptr<const ModelFiles>> files = OpenModelFiles(dir_);
  ASSERT_TRUE(files.ok()) << files.status().ToString();
  EXPECT_EQ((*files)->dir(), dir_);
  ASSERT_EQ((*files)->weight_files().size(), 1u);
  EXPECT_NE((*files)->files_token(), 0u);
  DeleteParsedFiles();

  // Footprint, registration and load all from the one open.
  Result<EngineFootprint> f = Engine::Footprint(**files, Options());
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  Result<WeightModel> m = Engine::WeightModelFor(**files, "tiny", Options());
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->digest, (*files)->WeightsDigestFor("tiny"));
  EXPECT_EQ(m->specs.size(), (*files)->weight_specs().size());

  Result<std::unique_ptr<Engine>> e = Engine::Load(*files, Options());
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  EXPECT_EQ(GreedyTokens(**e, kText), want);
  EXPECT_EQ(f->engine_bytes(), (*e)->kv_bytes());
  EXPECT_EQ(f->scratch_bytes, (*e)->scratch_bytes());
  EXPECT_EQ(f->weight_bytes, (*e)->weight_bytes());
  EXPECT_EQ(f->weight_bytes, (*files)->weight_bytes());
  EXPECT_EQ(&(*e)->config(), &(*files)->config());  // the same parse, shared

  // The path-based calls do read: with the files gone they fail, naming them.
  Result<std::unique_ptr<Engine>> again = Engine::Load(dir_, Options());
  ASSERT_FALSE(again.ok());
  EXPECT_NE(again.status().message().find("config.json"), std::string::npos)
      << again.status().message();
}

TEST_F(ModelFilesTest, TheSameDigestAsThePathBasedRegistration) {
  Result<WeightModel> by_path = Engine::WeightModelFor(dir_, "tiny", Options());
  ASSERT_TRUE(by_path.ok()) << by_path.status().ToString();
  Result<std::shared_ptr<const ModelFiles>> files = OpenModelFiles(dir_);
  ASSERT_TRUE(files.ok());
  Result<WeightModel> m = Engine::WeightModelFor(**files, "tiny", Options());
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(m->digest, by_path->digest);
  EXPECT_EQ(m->scratch_bytes, by_path->scratch_bytes);
  EXPECT_NE((*files)->WeightsDigestFor("other"), m->digest);
  EXPECT_EQ(Engine::Footprint(**files, Options(/*n_slots=*/0)).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(Engine::WeightModelFor(**files, "tiny", Options(1, /*n_ctx=*/1)).status().code(),
            StatusCode::kInvalidArgument);
}

// Note [One parse per load]: the fill checks the files' token against the
// one in the digest, so a file replaced between the open (the estimate)
// and the load is caught, not loaded under the old digest.
TEST_F(ModelFilesTest, AWeightFileChangedAfterTheOpenFailsTheLoad) {
  Result<std::shared_ptr<const ModelFiles>> files = OpenModelFiles(dir_);
  ASSERT_TRUE(files.ok());
  const fs::path weights = fs::path(dir_) / "model.safetensors";
  fs::last_write_time(weights, fs::last_write_time(weights) + std::chrono::seconds(10));
  Result<std::unique_ptr<Engine>> e = Engine::Load(*files, Options());
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(e.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(e.status().message().find(dir_), std::string::npos) << e.status().message();
  EXPECT_NE(e.status().message().find("changed since"), std::string::npos)
      << e.status().message();
  // Opened anew, the changed files load.
  Result<std::shared_ptr<const ModelFiles>> reopened = OpenModelFiles(dir_);
  ASSERT_TRUE(reopened.ok());
  EXPECT_NE((*reopened)->files_token(), (*files)->files_token());
  EXPECT_TRUE(Engine::Load(*reopened, Options()).ok());
}

TEST_F(ModelFilesTest, ErrorsNameTheFile) {
  Result<std::shared_ptr<const ModelFiles>> missing = OpenModelFiles(dir_ + "/nope");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find(dir_ + "/nope"), std::string::npos)
      << missing.status().message();
  ASSERT_TRUE(fs::remove(fs::path(dir_) / "tokenizer.json"));
  Result<std::shared_ptr<const ModelFiles>> no_tokenizer = OpenModelFiles(dir_);
  ASSERT_FALSE(no_tokenizer.ok());
  EXPECT_NE(no_tokenizer.status().message().find("tokenizer.json"), std::string::npos)
      << no_tokenizer.status().message();
  EXPECT_EQ(Engine::Validate(dir_).code(), no_tokenizer.status().code());
  // The registration needs no tokenizer.
  EXPECT_TRUE(Engine::WeightModelFor(dir_, "tiny", Options()).ok());
}

// The chat format comes from tokenizer_config.json's chat_template; one of
// no known family fails the open naming the override, which then works.
TEST_F(ModelFilesTest, TheChatTemplateComesFromTheModelOrTheOverride) {
  Result<std::shared_ptr<const ModelFiles>> plain = OpenModelFiles(dir_);
  ASSERT_TRUE(plain.ok()) << plain.status().ToString();
  ASSERT_TRUE((*plain)->chat_template().ok());
  EXPECT_EQ(*(*plain)->chat_template(), ChatTemplateKind::kChatML);

  const std::string config = (fs::path(dir_) / "tokenizer_config.json").string();
  ASSERT_TRUE(WriteFileAtomic(config, R"({"chat_template": "{{ '<|user|>' }}{{ '<|end|>' }}"})").ok());
  Result<std::shared_ptr<const ModelFiles>> phi = OpenModelFiles(dir_);
  // Phi-3's end of turn <|end|> is not in this tokenizer: still the model's
  // family, rendered with the tokens it has.
  ASSERT_TRUE(phi.ok()) << phi.status().ToString();
  EXPECT_EQ(*(*phi)->chat_template(), ChatTemplateKind::kPhi3);

  ASSERT_TRUE(WriteFileAtomic(config, R"({"chat_template": "{{ messages | tojson }}"})").ok());
  Result<std::shared_ptr<const ModelFiles>> unknown = OpenModelFiles(dir_);
  ASSERT_FALSE(unknown.ok());
  EXPECT_EQ(unknown.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(unknown.status().message().find("[[models]] chat_template"), std::string::npos)
      << unknown.status().message();
  EXPECT_NE(unknown.status().message().find(dir_), std::string::npos);

  Result<std::shared_ptr<const ModelFiles>> forced =
      OpenModelFiles(dir_, ModelFilesOptions{.chat_template = ChatTemplateKind::kChatML});
  ASSERT_TRUE(forced.ok()) << forced.status().ToString();
  EXPECT_EQ(*(*forced)->chat_template(), ChatTemplateKind::kChatML);
  // An override whose end-of-turn token the tokenizer lacks is refused.
  Result<std::shared_ptr<const ModelFiles>> gemma =
      OpenModelFiles(dir_, ModelFilesOptions{.chat_template = ChatTemplateKind::kGemma});
  ASSERT_FALSE(gemma.ok());
  EXPECT_NE(gemma.status().message().find("<end_of_turn>"), std::string::npos)
      << gemma.status().message();

  // No template at all: the special tokens decide, as before.
  ASSERT_TRUE(fs::remove(config));
  Result<std::shared_ptr<const ModelFiles>> tokens = OpenModelFiles(dir_);
  ASSERT_TRUE(tokens.ok()) << tokens.status().ToString();
  EXPECT_EQ(*(*tokens)->chat_template(), ChatTemplateKind::kChatML);
}

}  // namespace
}  // namespace arbiter
