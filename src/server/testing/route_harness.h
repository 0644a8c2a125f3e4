// server/testing/route_harness.h — the fixture of the in-process route
// tests (routes_test.cc, routes_compat_test.cc): a real Runtime on the tiny
// model (a text model "chat" and an embedding model "emb", fresh state per
// test), a ServerContext, and the route groups a suite names, called with
// an http::Request and answered through an in-memory http::FakeResponder.
//
//   class MyRoutesTest : public RouteHarness {
//    protected:
//     std::vector<std::vector<Route>> Groups(ServerContext& ctx) override {
//       return {OpenAIRoutes(ctx)};
//     }
//   };
//   TEST_F(MyRoutesTest, X) { EXPECT_EQ(Call("GET /v1/models")->status(), 200); }
//
// Not thread-safe (a gtest fixture).
#pragma once

#include <unistd.h>

#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "arbiter/runtime/runtime.h"
#include "runtime/testing/tiny_runtime.h"
#include "server/internal/context.h"
#include "server/internal/http/fake_responder.h"

namespace arbiter::server_internal {

class RouteHarness : public ::testing::Test {
 protected:
  // The tiny model's directory, made once per suite (the suites of one test
  // binary run one after the other).
  static void SetUpTestSuite() {
    Result<std::filesystem::path> dir = ::arbiter::testing::MakeTinyModelDir("routes-test");
    ASSERT_TRUE(dir.ok()) << dir.status().ToString();
    dir_ = new std::filesystem::path(*dir);
  }
  static void TearDownTestSuite() {
    std::error_code ec;
    std::filesystem::remove_all(*dir_, ec);
    delete dir_;
    dir_ = nullptr;
  }

  // The route groups under test, built on `ctx`.
  virtual std::vector<std::vector<Route>> Groups(ServerContext& ctx) = 0;
  // Changes the tiny runtime's config before the Runtime is made (a
  // suite that needs a longer context than the default 256 tokens).
  virtual void AdjustConfig(Config* config) { (void)config; }

  void SetUp() override {
    Config c = ::arbiter::testing::TinyRuntimeConfig(
        *dir_, (*dir_ / ("state-" + std::to_string(++n_))).string(),
        {{"chat", Capability::kText}, {"emb", Capability::kEmbedding}});
    AdjustConfig(&c);
    Result<std::unique_ptr<Runtime>> rt = Runtime::Create(c);
    ASSERT_TRUE(rt.ok()) << rt.status().ToString();
    rt_ = std::move(rt).value();
    ctx_.runtime = rt_.get();
    ctx_.threads = 4;
    for (std::vector<Route>& group : Groups(ctx_)) {
      for (Route& r : group) routes_[r.method + " " + r.pattern] = std::move(r);
    }
  }

  void TearDown() override { rt_->Shutdown(); }

  // Runs the route `method pattern` on `body` (path parameters in `params`,
  // query in `query`) and returns the responder.
  std::unique_ptr<http::FakeResponder> Call(const std::string& route, std::string body = "",
                                            std::map<std::string, std::string> params = {},
                                            std::multimap<std::string, std::string> query = {}) {
    auto out = std::make_unique<http::FakeResponder>();
    auto it = routes_.find(route);
    EXPECT_NE(it, routes_.end()) << route;
    if (it == routes_.end()) return out;
    http::Request req;
    req.method = route.substr(0, route.find(' '));
    req.path = route.substr(route.find(' ') + 1);
    req.body = std::move(body);
    req.params = std::move(params);
    req.query = std::move(query);
    it->second.handler(req, *out);
    EXPECT_EQ(out->answers(), 1) << route;
    return out;
  }

  static nlohmann::json Body(const http::FakeResponder& r) {
    return nlohmann::json::parse(r.body(), nullptr, false);
  }

  static inline std::filesystem::path* dir_ = nullptr;
  static inline int n_ = 0;
  std::unique_ptr<Runtime> rt_;
  ServerContext ctx_;
  std::map<std::string, Route> routes_;
};

}  // namespace arbiter::server_internal
