// The compute seam (compute_backend.h): the factory's choice by device, the
// CPU implementation's memory figures, and K/V moving through the host
// layout of kv_snapshot.h between slots.
#include "engine/internal/compute_backend.h"

#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "arbiter/engine/engine.h"
#include "tools/model_maker/model_maker.h"
#include "engine/internal/engine_impl.h"
#include "engine/internal/model_files_internal.h"
#include "engine/internal/test_model.h"

namespace arbiter::engine_internal {
namespace {

class ComputeBackendTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::string(MakeTempDir("arbiter_compute_backend_test_"));
    Status s = MakeModel("tiny", *dir_, 3);
    ASSERT_TRUE(s.ok()) << s.ToString();
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }

  static EngineOptions Options() {
    EngineOptions o;
    o.n_ctx = 64;
    o.n_slots = 2;
    o.prefill_batch = 8;
    o.n_threads = 2;
    return o;
  }

  // A spec for the files of `e` as Engine::Load makes it from Options().
  static ComputeSpec SpecOf(const EngineImpl& e) {
    ComputeSpec spec;
    spec.layout = ModelFilesAccess::layout(e.files());
    spec.n_ctx = e.n_ctx();
    spec.batch = Options().prefill_batch;
    spec.n_threads = 2;
    spec.kv_type = e.kv_type();
    return spec;
  }

  static std::string* dir_;
};
std::string* ComputeBackendTest::dir_ = nullptr;

TEST_F(ComputeBackendTest, AnUnknownDeviceIsRefusedByName) {
  std::unique_ptr<Engine> e = std::move(Engine::Load(*dir_, Options())).value();
  ComputeSpec spec = SpecOf(dynamic_cast<const EngineImpl&>(*e));
  // (A Vulkan name opens the loader: engine_vulkan_test, label vulkan, has
  // those cases; this binary also runs under the sanitizers.)
  spec.device = "cuda:0";
  Result<std::unique_ptr<DecoderCompute>> c = MakeDecoderCompute(spec);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(c.status().message().find("\"cuda:0\""), std::string::npos) << c.status().message();
  EXPECT_EQ(SlotFootprintFor(spec).status().code(), StatusCode::kInvalidArgument);

  EngineOptions o = Options();
  o.device = "tpu";
  Result<std::unique_ptr<Engine>> loaded = Engine::Load(*dir_, o);
  ASSERT_FALSE(loaded.ok());
  EXPECT_EQ(loaded.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(loaded.status().message().find("\"tpu\""), std::string::npos);
  Result<EngineFootprint> f = Engine::Footprint(dynamic_cast<const EngineImpl&>(*e).files(), o);
  EXPECT_EQ(f.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(Engine::WeightModelFor(*dir_, "k", o).status().code(), StatusCode::kInvalidArgument);
}

TEST_F(ComputeBackendTest, TheCpuDeviceHoldsItsSlotsInTheHostDomain) {
  std::unique_ptr<Engine> e = std::move(Engine::Load(*dir_, Options())).value();
  const auto& impl = dynamic_cast<const EngineImpl&>(*e);
  EXPECT_EQ(e->device(), "cpu");
  EXPECT_EQ(e->memory_domain(), "host");
  EXPECT_EQ(impl.decoder().device(), "cpu");

  Result<std::unique_ptr<DecoderCompute>> c = MakeDecoderCompute(SpecOf(impl));
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  const SlotFootprint want = (*c)->slot_footprint();
  Result<std::unique_ptr<ComputeSlot>> slot = (*c)->CreateSlot();
  ASSERT_TRUE(slot.ok());
  EXPECT_EQ((*slot)->footprint().kv_bytes, want.kv_bytes);
  EXPECT_EQ((*slot)->footprint().scratch_bytes, want.scratch_bytes);
  const ModelDims& d = (*c)->dims();
  EXPECT_EQ(want.kv_bytes_per_token, 2u * d.n_layers * KvRowBytes(e->kv_type(), d.kv_dim));
  EXPECT_EQ(want.kv_bytes, want.kv_bytes_per_token * static_cast<size_t>(e->n_ctx()));
  // What the engine reports (and the runtime charges) is its slots' footprints.
  Result<EngineFootprint> f = Engine::Footprint(impl.files(), Options());
  ASSERT_TRUE(f.ok());
  EXPECT_EQ(f->kv_bytes, 2 * want.kv_bytes);
  EXPECT_EQ(f->scratch_bytes, 2 * want.scratch_bytes);
  EXPECT_EQ(e->kv_bytes(), 2 * want.bytes());
  EXPECT_EQ(e->scratch_bytes(), 2 * want.scratch_bytes);
}

// Prefill a prompt into slot a; move its K/V to b through ReadKv/WriteKv
// (the snapshot layout) and to c with CopyKv; the next decode step gives
// the same logits in all three, and VisitKv shows the bytes ReadKv wrote.
TEST_F(ComputeBackendTest, KvMovesBetweenSlotsInTheHostLayout) {
  std::unique_ptr<Engine> e = std::move(Engine::Load(*dir_, Options())).value();
  const auto& impl = dynamic_cast<const EngineImpl&>(*e);
  std::unique_ptr<DecoderCompute> c = std::move(MakeDecoderCompute(SpecOf(impl))).value();
  Result<WeightLease> lease = impl.weight_cache().Acquire(impl.weight_key());
  ASSERT_TRUE(lease.ok()) << lease.status().ToString();
  std::unique_ptr<ComputeWeights> w = std::move(c->BindWeights(*lease, "k")).value();
  std::unique_ptr<ComputeSlot> a = std::move(c->CreateSlot()).value();
  std::unique_ptr<ComputeSlot> b = std::move(c->CreateSlot()).value();
  std::unique_ptr<ComputeSlot> copy = std::move(c->CreateSlot()).value();

  const ModelDims& d = c->dims();
  std::vector<int32_t> ids;
  for (int i = 0; i < 21; ++i) ids.push_back((i * 37 + 5) % d.vocab);
  const int n = static_cast<int>(ids.size());
  std::vector<float> prefill_logits(d.vocab);
  ASSERT_TRUE(c->Prefill(*w, *a, ids.data(), n, 0, {.last_logits = prefill_logits.data()}).ok());

  const size_t row = KvRowBytes(c->kv_type(), d.kv_dim);
  std::vector<uint8_t> kv(size_t{2} * d.n_layers * n * row);
  c->ReadKv(*a, n, kv.data());
  c->WriteKv(*b, n, kv.data());
  c->CopyKv(*a, *copy, 0, n);

  KvRowsView header;
  header.n_layers = static_cast<uint32_t>(d.n_layers);
  header.kv_dim = static_cast<uint32_t>(d.kv_dim);
  header.kv_type = c->kv_type();
  header.tokens = ids.data();
  header.n_tokens = ids.size();
  int visits = 0;
  ASSERT_TRUE(c->VisitKv(*b, header, [&](const KvRowsView& rows) {
                 ++visits;
                 EXPECT_EQ(rows.n_tokens, ids.size());
                 EXPECT_EQ(rows.k.size(), static_cast<size_t>(d.n_layers));
                 for (int l = 0; l < d.n_layers; ++l) {
                   const size_t block = static_cast<size_t>(n) * row;
                   EXPECT_EQ(std::memcmp(rows.k[l], kv.data() + 2 * l * block, block), 0);
                   EXPECT_EQ(std::memcmp(rows.v[l], kv.data() + (2 * l + 1) * block, block), 0);
                 }
                 return OkStatus();
               }).ok());
  EXPECT_EQ(visits, 1);

  const int32_t next = 9;
  std::vector<float> la(d.vocab), lb(d.vocab), lc(d.vocab);
  ASSERT_TRUE(c->Decode(*w, *a, next, n, la.data()).ok());
  ASSERT_TRUE(c->Decode(*w, *b, next, n, lb.data()).ok());
  ASSERT_TRUE(c->Decode(*w, *copy, next, n, lc.data()).ok());
  EXPECT_EQ(la, lb);
  EXPECT_EQ(la, lc);
  EXPECT_NE(la, prefill_logits);  // a different position and token: the step ran

  // The engine's own forward pass agrees: its logits for ids + next, the
  // prefix prefilled as one call and `next` as a decode step.
  std::vector<int32_t> all = ids;
  all.push_back(next);
  Result<std::vector<float>> engine_logits =
      dynamic_cast<EngineImpl&>(*e).IncrementalLogits(all, n);
  ASSERT_TRUE(engine_logits.ok());
  EXPECT_EQ(*engine_logits, la);
}

}  // namespace
}  // namespace arbiter::engine_internal
