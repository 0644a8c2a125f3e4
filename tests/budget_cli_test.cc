// End-to-end: `arbiter budget` as a child process — the reference
// weight_budget table (docs/config.md "[memory]", the reference's values)
// through the real binary, and usage errors naming the flag.
#include <sys/wait.h>

#include <cstdio>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace arbiter {
namespace {

struct RunResult {
  int exit_code = -1;
  std::string out;  // stdout
  std::string all;  // stdout and stderr
};

RunResult Run(const std::string& args, bool with_stderr) {
  RunResult r;
  const std::string cmd =
      std::string(ARBITER_BINARY) + " " + args + (with_stderr ? " 2>&1" : " 2>/dev/null");
  FILE* p = ::popen(cmd.c_str(), "r");
  if (p == nullptr) return r;
  char buf[4096];
  size_t n;
  std::string text;
  while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0) text.append(buf, n);
  const int status = ::pclose(p);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  (with_stderr ? r.all : r.out) = text;
  return r;
}

RunResult RunBudget(const std::string& args) {
  RunResult out = Run("budget " + args, /*with_stderr=*/false);
  RunResult all = Run("budget " + args, /*with_stderr=*/true);
  out.all = all.all;
  return out;
}

struct Row {
  const char* args;
  uint64_t pool;
  uint64_t budget;
  bool over_commit;
};

TEST(BudgetCliTest, ReferenceTableAsJson) {
  // Arena 1000, wiggle 0.1 (the default).
  const Row rows[] = {
      {"--arena 1000 --fraction 1.0", 900, 900, false},
      {"--arena 1000 --fraction 0.5", 500, 500, false},
      {"--arena 1000 --max-scratch 300", 600, 600, false},
      {"--arena 1000 --max-scratch 300 --pinned 200", 600, 400, false},
      {"--arena 1000 --max-scratch 300 --pinned 700", 600, 0, true},
      {"--arena 1000 --max-scratch 950", 0, 0, false},
      {"--arena 0", 0, 0, false},
  };
  for (const Row& row : rows) {
    SCOPED_TRACE(row.args);
    RunResult r = RunBudget(std::string(row.args) + " --wiggle 0.1 --json");
    ASSERT_EQ(r.exit_code, 0) << r.all;
    nlohmann::json j = nlohmann::json::parse(r.out, nullptr, false);
    ASSERT_FALSE(j.is_discarded()) << r.out;
    EXPECT_EQ(j.size(), 4u) << r.out;
    EXPECT_EQ(j.at("weight_pool").get<uint64_t>(), row.pool);
    EXPECT_EQ(j.at("on_demand_budget").get<uint64_t>(), row.budget);
    EXPECT_EQ(j.at("pinned_over_commit").get<bool>(), row.over_commit);
    EXPECT_EQ(j.at("scratch_ceiling").get<uint64_t>(),
              std::string(row.args) == "--arena 0" ? 0u : 900u);
  }
}

TEST(BudgetCliTest, SizesWithUnitsAndDefaults) {
  RunResult r = RunBudget("--arena 1GiB --max-scratch 100MiB --pinned 2GB --json");
  ASSERT_EQ(r.exit_code, 0) << r.all;
  nlohmann::json j = nlohmann::json::parse(r.out);
  const uint64_t gib = uint64_t{1} << 30;
  const uint64_t ceiling = static_cast<uint64_t>(0.9 * static_cast<double>(gib));
  EXPECT_EQ(j.at("scratch_ceiling").get<uint64_t>(), ceiling);
  EXPECT_EQ(j.at("weight_pool").get<uint64_t>(), ceiling - (uint64_t{100} << 20));
  EXPECT_EQ(j.at("on_demand_budget").get<uint64_t>(), 0u);
  EXPECT_TRUE(j.at("pinned_over_commit").get<bool>());
}

TEST(BudgetCliTest, ArenaAsAPercentageOfRam) {
  RunResult r = RunBudget("--arena 50% --json");
  ASSERT_EQ(r.exit_code, 0) << r.all;
  nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_GT(j.at("weight_pool").get<uint64_t>(), 0u);
}

TEST(BudgetCliTest, HumanReadableOutput) {
  RunResult r = RunBudget("--arena 1000 --max-scratch 300 --pinned 200");
  ASSERT_EQ(r.exit_code, 0) << r.all;
  EXPECT_NE(r.out.find("weight pool"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("(600 bytes)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("on-demand budget"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("(400 bytes)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("pinned over-commit  no"), std::string::npos) << r.out;
}

TEST(BudgetCliTest, BadValuesExit2NamingTheFlag) {
  const std::pair<const char*, const char*> cases[] = {
      {"--arena lots", "--arena"},
      {"--arena 1000 --fraction 1.5", "--fraction"},
      {"--arena 1000 --fraction 0", "--fraction"},
      {"--arena 1000 --fraction abc", "--fraction"},
      {"--arena 1000 --wiggle 1", "--wiggle"},
      {"--arena 1000 --wiggle -0.2", "--wiggle"},
      {"--arena 1000 --max-scratch -5", "--max-scratch"},
      {"--arena 1000 --pinned 12XB", "--pinned"},
      {"--arena 1000 --pinned 10%", "--pinned"},
      {"--fraction 0.5", "--arena"},  // --arena is required
  };
  for (const auto& [args, flag] : cases) {
    SCOPED_TRACE(args);
    RunResult r = RunBudget(args);
    EXPECT_EQ(r.exit_code, 2) << r.all;
    EXPECT_NE(r.all.find(flag), std::string::npos) << r.all;
    EXPECT_TRUE(r.out.empty()) << r.out;
  }
}

}  // namespace
}  // namespace arbiter
