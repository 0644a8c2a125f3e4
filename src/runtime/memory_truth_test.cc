// The ledger is the truth, on a real Runtime (tiny model, real engine, real
// KV slots): charged + runtime matches the process's RssAnon + RssShmem
// while a model is loaded (its KV slots pre-faulted: Note [Charged memory is
// resident]), and the memory comes back when it is unloaded (Note [Where
// freed memory goes]). Tolerances are counted in pages.
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>

#include <gtest/gtest.h>

#include "arbiter/runtime/runtime.h"
#include "base/testing/sanitizers.h"
#include "runtime/testing/tiny_runtime.h"

namespace arbiter {
namespace {

namespace fs = std::filesystem;

int64_t Pages(int64_t bytes) { return bytes / static_cast<int64_t>(::sysconf(_SC_PAGESIZE)); }

class MemoryTruthTest : public ::testing::Test {
 protected:
  void SetUp() override {
    Result<fs::path> dir = testing::MakeTinyModelDir("memory-truth-test");
    ASSERT_TRUE(dir.ok()) << dir.status().ToString();
    dir_ = *dir;
    // 4 slots of the tiny model's longest context (2,048 tokens) and the
    // prefill scratch for it: ~25 MiB charged as kv_slot and scratch.
    Config c = testing::TinyRuntimeConfig(dir_, (dir_ / "state").string(),
                                          {{"chat", Capability::kText}});
    c.models[0].ctx = 16384;
    c.models[0].parallel = 4;
    Result<std::unique_ptr<Runtime>> rt = Runtime::Create(c);
    ASSERT_TRUE(rt.ok()) << rt.status().ToString();
    rt_ = std::move(rt).value();
  }
  void TearDown() override {
    if (rt_) rt_->Shutdown();
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }

  void Chat() {
    TextRequest t;
    t.model = "chat";
    t.messages = {{"user", "hello"}};
    t.max_tokens = 2;
    Result<std::unique_ptr<TextGeneration>> g = rt_->StartText(std::move(t));
    ASSERT_TRUE(g.ok()) << g.status().ToString();
    ASSERT_TRUE((*g)->Run(nullptr, nullptr).ok());
  }

  fs::path dir_;
  std::unique_ptr<Runtime> rt_;
};

using testing::kSanitized;  // base/testing/sanitizers.h

TEST_F(MemoryTruthTest, LedgerPlusRuntimeMatchesResidentMemoryAndComesBack) {
  if (kSanitized) GTEST_SKIP() << "RSS under a sanitizer is not the process's own";
  const RuntimeStatus idle = rt_->Status();
  ASSERT_GT(idle.process_resident_bytes, 0u);
  EXPECT_EQ(idle.ledger.charged_bytes, 0u);
  EXPECT_GT(idle.ledger.runtime_bytes, 0u);  // measured while nothing is charged
  EXPECT_LE(std::llabs(Pages(idle.unaccounted_bytes)), 256);

  Chat();
  const RuntimeStatus loaded = rt_->Status();
  ASSERT_GE(loaded.ledger.kind_bytes(ChargeKind::kKvSlot), 2ull << 20);  // f16 KV
  ASSERT_GE(loaded.ledger.charged_bytes, 20ull << 20);
  // Charged and untouched would be about −20 MiB here; leaked, positive.
  // 8 MiB of slack: the first request's own allocations (OpenBLAS's
  // per-thread buffers, tokenizer and heap growth) are not charged.
  EXPECT_LE(std::llabs(Pages(loaded.unaccounted_bytes)), 2048)
      << "charged " << loaded.ledger.charged_bytes << " runtime " << loaded.ledger.runtime_bytes
      << " resident " << loaded.process_resident_bytes;

  for (int i = 0; i < 5; ++i) {
    ASSERT_TRUE(rt_->UnloadModel("chat", 10000).ok());
    Chat();
  }
  ASSERT_TRUE(rt_->UnloadModel("chat", 10000).ok());
  const RuntimeStatus after = rt_->Status();
  EXPECT_EQ(after.ledger.charged_bytes, 0u);
  // The KV slots' pages went back to the OS: resident is within 2 MiB of idle.
  EXPECT_LE(Pages(static_cast<int64_t>(after.process_resident_bytes) -
                  static_cast<int64_t>(idle.process_resident_bytes)),
            512)
      << "idle " << idle.process_resident_bytes << " after " << after.process_resident_bytes;
}

// Note [Grammar vocabularies]: a constrained request builds the model's
// grammar vocabulary once, charged as scratch under the model; the charge
// goes when the model unloads.
TEST_F(MemoryTruthTest, GrammarVocabularyIsChargedOnceAndGoesWithTheModel) {
  auto constrained = [&] {
    TextRequest t;
    t.model = "chat";
    t.messages = {{"user", "json"}};
    t.max_tokens = 8;
    t.constraint = OutputConstraintKind::kJsonObject;
    Result<std::unique_ptr<TextGeneration>> g = rt_->StartText(std::move(t));
    ASSERT_TRUE(g.ok()) << g.status().ToString();
    Result<TextResult> r = (*g)->Run(nullptr, nullptr);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(r->generation.text.front(), '{') << r->generation.text;
  };
  Chat();
  const size_t plain = rt_->Status().ledger.kind_bytes(ChargeKind::kScratch);
  constrained();
  const size_t with_vocab = rt_->Status().ledger.kind_bytes(ChargeKind::kScratch);
  EXPECT_GT(with_vocab, plain);
  constrained();  // built once: the same charge
  EXPECT_EQ(rt_->Status().ledger.kind_bytes(ChargeKind::kScratch), with_vocab);
  Result<UnloadResult> u = rt_->UnloadModel("chat", 10000);
  ASSERT_TRUE(u.ok()) << u.status().ToString();
  EXPECT_EQ(rt_->Status().ledger.kind_bytes(ChargeKind::kScratch), 0u);
}

}  // namespace
}  // namespace arbiter
