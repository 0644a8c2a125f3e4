// UnloadEngineModel, the explicit unload step of an engine model (Note
// [Unloading an engine model] in models.cc), on the tiny model with the
// server's own weight runtime: the engine goes, then its device weights, and
// a reference kept past the step keeps the engine alive (never freed under a
// user) while the weights still go.
#include <filesystem>
#include <memory>

#include <gtest/gtest.h>

#include "arbiter/engine/engine.h"
#include "arbiter/memory/memory_ledger.h"
#include "arbiter/runtime/models.h"
#include "arbiter/weights/weight_cache.h"
#include "runtime/testing/tiny_runtime.h"

namespace arbiter {
namespace {

namespace fs = std::filesystem;

class EngineUnloadTest : public ::testing::Test {
 protected:
  void SetUp() override {
    Result<fs::path> dir = testing::MakeTinyModelDir("engine-unload-test");
    ASSERT_TRUE(dir.ok()) << dir.status().ToString();
    dir_ = *dir;
    config_ = testing::TinyRuntimeConfig(dir_, (dir_ / "state").string(),
                                         {{"chat", Capability::kText}});
    Result<std::unique_ptr<ServeWeights>> w = MakeServeWeights(config_, &ledger_, nullptr);
    ASSERT_TRUE(w.ok()) << w.status().ToString();
    weights_ = std::move(w).value();
  }
  void TearDown() override {
    weights_.reset();
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }

  size_t DeviceWeightBytes() const {
    return ledger_.Snapshot().kind_bytes(ChargeKind::kDeviceWeights);
  }
  bool DeviceResident() const {
    for (const WeightModelStats& m : weights_->cache->Stats().models) {
      if (m.key == "chat") return m.device_resident;
    }
    ADD_FAILURE() << "model chat is not registered";
    return false;
  }
  LoadedBackend Load() {
    Result<LoadedBackend> b = LoadEngineModel(config_.models[0], weights_->cache.get());
    EXPECT_TRUE(b.ok()) << b.status().ToString();
    return b.ok() ? std::move(b).value() : LoadedBackend{};
  }

  fs::path dir_;
  Config config_;
  MemoryLedger ledger_;
  std::unique_ptr<ServeWeights> weights_;
};

TEST_F(EngineUnloadTest, FreesTheEngineAndEvictsItsDeviceWeights) {
  LoadedBackend backend = Load();
  ASSERT_NE(backend.object, nullptr);
  ASSERT_EQ(backend.type, typeid(Engine));
  std::weak_ptr<Engine> engine = std::static_pointer_cast<Engine>(backend.object);
  ASSERT_TRUE(DeviceResident());
  ASSERT_GT(DeviceWeightBytes(), 0u);

  UnloadEngineModel("chat", std::move(backend), weights_->cache.get(), nullptr);
  EXPECT_TRUE(engine.expired()) << "the step's reference was the last: the engine is gone";
  EXPECT_FALSE(DeviceResident());
  EXPECT_EQ(DeviceWeightBytes(), 0u);

  // Loaded again, the weights come back: the model stays registered.
  LoadedBackend again = Load();
  ASSERT_NE(again.object, nullptr);
  EXPECT_TRUE(DeviceResident());
  UnloadEngineModel("chat", std::move(again), weights_->cache.get(), nullptr);
  EXPECT_EQ(DeviceWeightBytes(), 0u);
}

TEST_F(EngineUnloadTest, AReferenceKeptPastTheStepKeepsTheEngineAlive) {
  LoadedBackend backend = Load();
  ASSERT_NE(backend.object, nullptr);
  // A copy of backend_object() that outlives its handle.
  std::shared_ptr<Engine> kept = std::static_pointer_cast<Engine>(backend.object);
  std::weak_ptr<Engine> engine = kept;

  UnloadEngineModel("chat", std::move(backend), weights_->cache.get(), nullptr);
  ASSERT_FALSE(engine.expired()) << "never freed under a user";
  EXPECT_FALSE(DeviceResident()) << "the weights go all the same";
  // The engine still serves: its next lease reloads the weights.
  GenerationRequest r;
  r.prompt_ids = {1, 2, 3};
  r.max_tokens = 2;
  r.sampling.temperature = 0.0f;
  r.ignore_eos = true;
  Result<GenerationResult> g = kept->Generate(r, nullptr, nullptr);
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  EXPECT_EQ(g->output_ids.size(), 2u);
  kept.reset();
  EXPECT_TRUE(engine.expired());
}

TEST_F(EngineUnloadTest, ABackendThatIsNotAnEngineIsLeftAlone) {
  auto other = std::make_shared<int>(7);
  std::weak_ptr<int> weak = other;
  UnloadEngineModel("chat", LoadedBackend::Of(std::move(other), 1), weights_->cache.get(),
                    nullptr);
  EXPECT_TRUE(weak.expired()) << "dropped, nothing else done";
}

}  // namespace
}  // namespace arbiter
