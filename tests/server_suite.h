// tests/server_suite.h — the fixture of an end-to-end suite whose tests
// share one `arbiter serve` (ARBITER_BINARY, which every e2e target
// defines).
//
// Derive, and in SetUpTestSuite: MakeDir, the suite's models in dir_, then
// StartServe with the suite's config. The server is killed and dir_
// removed after the suite; a test that failed prints the server log.
//
//   class FooE2E : public ::arbiter::testing::ServerSuite {
//    protected:
//     static void SetUpTestSuite() {
//       ASSERT_TRUE(MakeDir("foo-e2e"));
//       ASSERT_TRUE(MakeModel("tiny", dir_ + "/tiny", 1).ok());
//       std::string error;
//       ASSERT_TRUE(StartServe("[[models]]\nname = \"tiny\"\npath = \"tiny\"\n", &error))
//           << error;
//     }
//   };
//
// The fields are static (one server per suite). gtest runs one suite at a
// time, so suites of one binary that derive from this take them in turn.
// Thread safety: call from the test's main thread.
#pragma once

#include <signal.h>

#include <filesystem>
#include <iostream>
#include <string>
#include <system_error>

#include <gtest/gtest.h>

#include "server_process.h"

namespace arbiter::testing {

class ServerSuite : public ::testing::Test {
 protected:
  static void TearDownTestSuite() {
    KillServer(server_, SIGKILL);
    std::error_code ec;
    if (!dir_.empty()) std::filesystem::remove_all(dir_, ec);
    dir_.clear();
  }

  void TearDown() override {
    if (HasFailure()) PrintServeLog();
  }

  // dir_ = a new scratch directory "/tmp/arbiter-<tag>-XXXXXX"; false when
  // it cannot be made.
  static bool MakeDir(const std::string& tag) {
    dir_ = MakeScratchDir(tag);
    return !dir_.empty();
  }

  // Starts server_ in dir_ with `config_rest` after "[server]\nport = N\n"
  // (StartServeIn). False with `*error` set (the log included) when it did
  // not come up.
  static bool StartServe(const std::string& config_rest, std::string* error) {
    return StartServeIn(ARBITER_BINARY, dir_, config_rest, &server_, error);
  }

  // The server log on stderr, framed.
  static void PrintServeLog() {
    std::cerr << "---- serve.log ----\n" << ReadAll(server_.log) << "----\n";
  }

  static inline std::string dir_;
  static inline ServerProc server_;
};

}  // namespace arbiter::testing
