// Note [Bounded shutdown]: the real Server over a real Runtime (tiny model)
// whose speech call is replaced by one that never looks at its
// cancellation (STYLE.md rule 22: the fault is an injected collaborator).
// Stop() waits for that handler forever; the ShutdownDeadline reports the
// request and expires. The process exit itself (std::_Exit after the log)
// is covered end to end by tests/serve_e2e_test.cc.
#include "arbiter/server/shutdown_deadline.h"

#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <future>
#include <mutex>
#include <thread>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <httplib.h>

#include "arbiter/server/server.h"
#include "runtime/testing/forwarding_runtime.h"
#include "runtime/testing/tiny_runtime.h"

namespace arbiter {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using ::testing::StartsWith;

// Speak() blocks until Release(), whatever its cancellation says.
class StuckSpeechRuntime : public testing::ForwardingRuntime {
 public:
  using ForwardingRuntime::ForwardingRuntime;
  ::arbiter::Status Speak(const SpeechRequest&, const std::function<bool(const SpeechStart&)>&,
                          const std::function<bool(std::span<const int16_t>)>&,
                          const Cancellation&) override {
    std::unique_lock<std::mutex> l(mu_);
    entered_ = true;
    cv_.notify_all();
    cv_.wait(l, [&] { return released_; });
    return UnavailableError("released");
  }
  bool WaitEntered(std::chrono::seconds limit) {
    std::unique_lock<std::mutex> l(mu_);
    return cv_.wait_for(l, limit, [&] { return entered_; });
  }
  void Release() {
    std::lock_guard<std::mutex> l(mu_);
    released_ = true;
    cv_.notify_all();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool entered_ = false, released_ = false;
};

class ShutdownDeadlineTest : public ::testing::Test {
 protected:
  void SetUp() override {
    Result<fs::path> dir = testing::MakeTinyModelDir("shutdown-deadline-test");
    ASSERT_TRUE(dir.ok()) << dir.status().ToString();
    dir_ = *dir;
    Result<std::unique_ptr<Runtime>> rt = Runtime::Create(
        testing::TinyRuntimeConfig(dir_, (dir_ / "state").string(), {{"chat", Capability::kText}}));
    ASSERT_TRUE(rt.ok()) << rt.status().ToString();
    real_ = std::move(rt).value();
    stuck_ = std::make_unique<StuckSpeechRuntime>(real_.get());
  }
  void TearDown() override {
    if (real_) real_->Shutdown();
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }

  // Settings for a server on a free loopback port.
  static ServerSettings AnyPort() {
    ServerSettings settings;
    settings.port = 0;
    return settings;
  }

  fs::path dir_;
  std::unique_ptr<Runtime> real_;
  std::unique_ptr<StuckSpeechRuntime> stuck_;
};

TEST_F(ShutdownDeadlineTest, AStuckHandlerIsReportedAndTheDeadlineExpires) {
  Server server(AnyPort(), stuck_.get());
  ASSERT_TRUE(server.Bind().ok());
  std::thread loop([&] { (void)server.Run(); });
  std::thread client([&] {
    httplib::Client c("127.0.0.1", server.port());
    c.set_read_timeout(120, 0);
    (void)c.Post("/v1/audio/speech", R"({"model":"tts","input":"hello"})", "application/json");
  });
  ASSERT_TRUE(stuck_->WaitEntered(std::chrono::seconds(60)));
  const std::vector<std::string> running = server.DescribeRunning();
  ASSERT_EQ(running.size(), 1u);
  EXPECT_THAT(running[0], StartsWith("POST /v1/audio/speech from 127.0.0.1:"));
  EXPECT_THAT(running[0], HasSubstr(", running for "));

  std::promise<std::string> expired;
  std::future<std::string> report = expired.get_future();
  {
    ShutdownDeadline deadline(&server, stuck_.get(), std::chrono::milliseconds(200),
                              [&](const std::string& r) { expired.set_value(r); });
    std::thread stopper([&] { server.Stop(); });  // waits for the stuck handler
    // A fuse, not a timing assertion: the deadline is 200 ms.
    ASSERT_EQ(report.wait_for(std::chrono::seconds(60)), std::future_status::ready);
    const std::string text = report.get();
    EXPECT_THAT(text, StartsWith("shutdown did not finish within 0.2 s ([server] "
                                 "shutdown_timeout_s)"));
    EXPECT_THAT(text, HasSubstr("\nabandoned request: POST /v1/audio/speech from 127.0.0.1:"));
    stuck_->Release();
    stopper.join();
  }
  loop.join();
  client.join();
  EXPECT_TRUE(server.DescribeRunning().empty());
}

TEST_F(ShutdownDeadlineTest, AShutdownThatFinishesInTimeReportsNothing) {
  Server server(AnyPort(), stuck_.get());
  ASSERT_TRUE(server.Bind().ok());
  std::thread loop([&] { (void)server.Run(); });
  bool expired = false;
  {
    ShutdownDeadline deadline(&server, stuck_.get(), std::chrono::seconds(60),
                              [&](const std::string&) { expired = true; });
    server.Stop();
    loop.join();
    deadline.Disarm();
  }  // joins the watching thread
  EXPECT_FALSE(expired);
  // Destroyed without Disarm(): disarmed by the destructor.
  {
    ShutdownDeadline deadline(&server, nullptr, std::chrono::seconds(60),
                              [&](const std::string&) { expired = true; });
  }
  EXPECT_FALSE(expired);
}

// Past StopReadingRuntime() (Runtime::Shutdown() frees what Status()
// reads), the report names the runtime's shutdown instead of its models.
TEST_F(ShutdownDeadlineTest, AStuckRuntimeShutdownIsReportedWithoutReadingIt) {
  Server server(AnyPort(), stuck_.get());
  std::promise<std::string> expired;
  std::future<std::string> report = expired.get_future();
  ShutdownDeadline deadline(&server, stuck_.get(), std::chrono::milliseconds(50),
                            [&](const std::string& r) { expired.set_value(r); });
  deadline.StopReadingRuntime();
  ASSERT_EQ(report.wait_for(std::chrono::seconds(60)), std::future_status::ready);
  const std::string text = report.get();
  EXPECT_THAT(text, HasSubstr("\nno request is running\n"));
  EXPECT_THAT(text, HasSubstr("\nabandoned the runtime, which was shutting down"));
}

}  // namespace
}  // namespace arbiter
