// The dashboard's server side (docs/ui.md): the embedded files and their
// headers, sign-in sessions (Note [Dashboard sessions]), and the history
// rings with their ledger charge (Note [History memory]) — against a real
// Runtime on the tiny model. The page itself is tested in Chromium
// (tests/ui/dashboard.test.mjs).
#include <chrono>
#include <map>
#include <string>
#include <thread>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "server/internal/history.h"
#include "server/internal/ui_assets.h"
#include "server/internal/ui_sessions.h"
#include "server/testing/route_harness.h"

namespace arbiter::server_internal {
namespace {

using json = nlohmann::json;
using Clock = UiSessions::Clock;

TEST(UiSessions, ATokenIsRandomHexValidUntilItsTtlAndRemovable) {
  UiSessions s;
  const Clock::time_point t0 = Clock::now();
  const std::string a = s.Create(t0), b = s.Create(t0);
  EXPECT_EQ(a.size(), 64u);
  EXPECT_EQ(a.find_first_not_of("0123456789abcdef"), std::string::npos);
  EXPECT_NE(a, b);
  EXPECT_TRUE(s.Valid(a, t0 + UiSessions::kSessionTtl - std::chrono::seconds(1)));
  EXPECT_FALSE(s.Valid(a, t0 + UiSessions::kSessionTtl));
  EXPECT_FALSE(s.Valid("", t0));
  EXPECT_FALSE(s.Valid(a.substr(1), t0));
  s.Remove(a);
  EXPECT_FALSE(s.Valid(a, t0));
  EXPECT_TRUE(s.Valid(b, t0));
}

TEST(UiSessions, AtMostMaxSessionsTheOldestGoesFirst) {
  UiSessions s;
  const Clock::time_point t0 = Clock::now();
  const std::string first = s.Create(t0);
  for (size_t i = 1; i < UiSessions::kMaxSessions; ++i) {
    s.Create(t0 + std::chrono::milliseconds(i));
  }
  EXPECT_EQ(s.size(), UiSessions::kMaxSessions);
  const std::string last = s.Create(t0 + std::chrono::seconds(10));
  EXPECT_EQ(s.size(), UiSessions::kMaxSessions);
  EXPECT_FALSE(s.Valid(first, t0 + std::chrono::seconds(11)));
  EXPECT_TRUE(s.Valid(last, t0 + std::chrono::seconds(11)));
}

TEST(UiSessions, FailedSignInsAreLimitedPerWindow) {
  UiSessions s;
  const Clock::time_point t0 = Clock::now();
  for (size_t i = 0; i < UiSessions::kMaxFailures; ++i) {
    ASSERT_TRUE(s.AllowAttempt(t0));
    s.RecordFailure(t0);
  }
  EXPECT_FALSE(s.AllowAttempt(t0 + std::chrono::seconds(1)));
  EXPECT_TRUE(s.AllowAttempt(t0 + UiSessions::kFailureWindow));
}

TEST(CookieValue, FindsANamedCookieAmongOthers) {
  EXPECT_EQ(CookieValue("a=1; arbiter_session=xyz; b=2", "arbiter_session"), "xyz");
  EXPECT_EQ(CookieValue("arbiter_session=xyz", "arbiter_session"), "xyz");
  EXPECT_EQ(CookieValue("x_arbiter_session=1;arbiter_session_2=2", "arbiter_session"), "");
  EXPECT_EQ(CookieValue("", "arbiter_session"), "");
}

TEST(UiAssets, EveryFileThePageLoadsIsEmbeddedWithItsType) {
  std::map<std::string, std::string> types;
  for (const UiAsset& a : UiAssets()) {
    types[std::string(a.name)] = std::string(a.content_type);
    EXPECT_FALSE(a.body.empty()) << a.name;
  }
  EXPECT_EQ(types["index.html"], "text/html; charset=utf-8");
  EXPECT_EQ(types["app.js"], "text/javascript; charset=utf-8");
  EXPECT_EQ(types["uPlot.iife.min.js"], "text/javascript; charset=utf-8");
  EXPECT_EQ(types["style.css"], "text/css; charset=utf-8");
  // index.html loads only embedded files, and every module import is too.
  for (const UiAsset& a : UiAssets()) {
    const std::string body(a.body);
    for (const std::string& prefix : {std::string("src=\"/ui/"), std::string("href=\"/ui/"),
                                      std::string("from './")}) {
      for (size_t p = body.find(prefix); p != std::string::npos; p = body.find(prefix, p + 1)) {
        const size_t start = p + prefix.size();
        const std::string name = body.substr(start, body.find_first_of("\"'", start) - start);
        EXPECT_EQ(types.count(name), 1u) << a.name << " loads " << name;
      }
    }
  }
}

class UiRoutesTest : public RouteHarness {
 protected:
  std::vector<std::vector<Route>> Groups(ServerContext& ctx) override {
    return {UiRoutes(ctx), AdminRoutes(ctx)};
  }
  void SetUp() override {
    RouteHarness::SetUp();
    ctx_.history = std::make_unique<HistoryRecorder>(rt_.get());
  }
  void TearDown() override {
    ctx_.history.reset();
    RouteHarness::TearDown();
  }
  size_t HistoryCharge() {
    const auto& owners = rt_->Status().ledger.by_owner;
    auto it = owners.find("server::history");
    return it == owners.end() ? 0 : it->second.total_bytes;
  }
};

TEST_F(UiRoutesTest, ThePageAndItsFilesAreServedWithAStrictPolicy) {
  auto page = Call("GET /ui");
  ASSERT_EQ(page->status(), 200);
  EXPECT_EQ(page->content_type(), "text/html; charset=utf-8");
  EXPECT_NE(page->body().find("<script type=\"module\" src=\"/ui/app.js\">"), std::string::npos);
  const std::string csp = page->header("Content-Security-Policy");
  EXPECT_NE(csp.find("default-src 'none'"), std::string::npos) << csp;
  EXPECT_NE(csp.find("connect-src 'self'"), std::string::npos) << csp;
  EXPECT_EQ(page->header("X-Content-Type-Options"), "nosniff");
  auto js = Call("GET /ui/{file}", "", {{"file", "views.js"}});
  EXPECT_EQ(js->status(), 200);
  EXPECT_EQ(js->content_type(), "text/javascript; charset=utf-8");
  auto missing = Call("GET /ui/{file}", "", {{"file", "../arbiter.toml"}});
  EXPECT_EQ(missing->status(), 404);
  EXPECT_NE(missing->body().find("no dashboard file"), std::string::npos);
}

TEST_F(UiRoutesTest, WithoutAKeyNoSignInIsNeeded) {
  EXPECT_EQ(Body(*Call("GET /ui/session"))["auth_required"], false);
  auto r = Call("POST /ui/login", R"({"key":"anything"})");
  EXPECT_EQ(r->status(), 200);
  EXPECT_EQ(r->header("Set-Cookie"), "");
}

TEST_F(UiRoutesTest, SignInSetsAStrictHttpOnlyCookieAndWrongKeysAreLimited) {
  ctx_.settings.api_key = "sekrit";
  EXPECT_EQ(Call("POST /ui/login", "not json")->status(), 400);
  EXPECT_EQ(Call("POST /ui/login", R"({"key":"wrong"})")->status(), 401);
  auto ok = Call("POST /ui/login", R"({"key":"sekrit"})");
  ASSERT_EQ(ok->status(), 200) << ok->body();
  const std::string cookie = ok->header("Set-Cookie");
  EXPECT_EQ(cookie.rfind("arbiter_session=", 0), 0u) << cookie;
  for (const char* attr : {"HttpOnly", "SameSite=Strict", "Path=/", "Max-Age=3600"}) {
    EXPECT_NE(cookie.find(attr), std::string::npos) << cookie;
  }
  const std::string token = cookie.substr(16, 64);
  EXPECT_TRUE(ctx_.sessions.Valid(token, Clock::now()));
  // The failures so far count: nine more reach the limit, then 429 even
  // for the right key.
  for (size_t i = 1; i < UiSessions::kMaxFailures; ++i) {
    EXPECT_EQ(Call("POST /ui/login", R"({"key":"wrong"})")->status(), 401);
  }
  auto limited = Call("POST /ui/login", R"({"key":"sekrit"})");
  EXPECT_EQ(limited->status(), 429);
  EXPECT_EQ(limited->header("Retry-After"), "60");
}

TEST_F(UiRoutesTest, HistoryKeepsTenMinutesOfSamplesAndTheLastThousandEvents) {
  const size_t charged_at_start = HistoryCharge();
  EXPECT_EQ(charged_at_start, ctx_.history->bytes());
  EXPECT_GE(charged_at_start, HistoryRecorder::kSampleCapacity * sizeof(HistorySample));
  for (size_t i = 0; i < HistoryRecorder::kSampleCapacity + 5; ++i) ctx_.history->SampleNow();
  ArbiterEvent e;
  e.type = ArbiterEventType::kModelLoad;
  e.model_key = "chat";
  for (int i = 0; i < 1005; ++i) ctx_.history->AddEvent(e, 1000 + i);
  json j = Body(*Call("GET /admin/history"));
  ASSERT_TRUE(j.is_object());
  EXPECT_EQ(j["samples"].size(), HistoryRecorder::kSampleCapacity);
  EXPECT_EQ(j["events"].size(), HistoryRecorder::kEventCapacity);
  EXPECT_EQ(j["events"][0]["t"], 1005);  // the oldest five were dropped
  EXPECT_EQ(j["events"][0]["event"]["model_key"], "chat");
  EXPECT_EQ(j["kinds"].size(), kChargeKindCount);
  const json& s = j["samples"].back();
  EXPECT_EQ(s["by_kind"].size(), kChargeKindCount);
  EXPECT_EQ(s["pressure"], "nominal");
  EXPECT_GT(s["rss"].get<uint64_t>(), 0u);
  // The charge follows what the rings hold; the ring never grows past 1,000.
  const size_t full = HistoryCharge();
  EXPECT_EQ(full, ctx_.history->bytes());
  EXPECT_GT(full, charged_at_start);
  for (int i = 0; i < 500; ++i) ctx_.history->AddEvent(e, 5000 + i);
  EXPECT_EQ(HistoryCharge(), full);
  // since: only what is newer.
  auto newer = Body(*Call("GET /admin/history", "", {}, {{"since", "5498"}}));
  EXPECT_EQ(newer["events"].size(), 1u);
  for (const char* bad : {"yesterday", "-1", "", "12ms", "99999999999999999999"}) {
    EXPECT_EQ(Call("GET /admin/history", "", {}, {{"since", bad}})->status(), 400) << bad;
  }
  // Gone with the recorder.
  ctx_.history.reset();
  EXPECT_EQ(HistoryCharge(), 0u);
}

TEST_F(UiRoutesTest, TheSamplerRecordsUntilStopped) {
  ctx_.history->Start();
  auto samples = [&] { return Body(*Call("GET /admin/history"))["samples"].size(); };
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (samples() < 2 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ctx_.history->Stop();
  const size_t n = samples();
  EXPECT_GE(n, 2u);  // one at start, one an interval later
  std::this_thread::sleep_for(std::chrono::milliseconds(HistoryRecorder::kSampleIntervalMs + 200));
  EXPECT_EQ(samples(), n);  // stopped: no more
}

}  // namespace
}  // namespace arbiter::server_internal
