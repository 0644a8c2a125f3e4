#include "arbiter/server/config.h"

#include <map>

#include <gtest/gtest.h>

namespace arbiter {
namespace {

constexpr uint64_t kGiB = 1ull << 30;
constexpr uint64_t kMemTotal = 16 * kGiB;

EnvLookup FakeEnv(std::map<std::string, std::string> vars) {
  auto shared = std::make_shared<std::map<std::string, std::string>>(std::move(vars));
  return [shared](const char* name) -> const char* {
    auto it = shared->find(name);
    return it == shared->end() ? nullptr : it->second.c_str();
  };
}

TEST(Config, Defaults) {
  auto c = ParseConfigToml("", "/etc/arbiter/arbiter.toml", kMemTotal);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->server.host, "127.0.0.1");
  EXPECT_EQ(c->server.port, 8080);
  EXPECT_EQ(c->server.api_key, "");
  EXPECT_EQ(c->server.max_body_bytes, 8u << 20);
  EXPECT_EQ(c->server.threads, 0);
  EXPECT_EQ(c->server.request_timeout_s, 60);
  EXPECT_FALSE(c->server.preload);
  EXPECT_EQ(c->budget_bytes, kMemTotal - kDefaultHeadroomBytes);
  EXPECT_TRUE(c->models.empty());
  EXPECT_TRUE(c->warnings.empty());
}

TEST(Config, DefaultBudgetOnSmallMachines) {
  EXPECT_EQ(DefaultBudgetBytes(1 * kGiB), kGiB / 2);
  EXPECT_EQ(DefaultBudgetBytes(8 * kGiB), 8 * kGiB - kDefaultHeadroomBytes);
}

TEST(Config, FullFile) {
  auto c = ParseConfigToml(R"(
[server]
host = "0.0.0.0"
port = 9000
api_key = "secret"
max_body_bytes = "1MiB"
threads = 12
request_timeout_s = 20
preload = true

[memory]
budget = "75%"

[[models]]
name = "chat"
path = "models/chat"
parallel = 2
ctx = 4096

[[models]]
name = "embed"
path = "/abs/embed"
capability = "embedding"
)",
                           "/etc/arbiter/arbiter.toml", kMemTotal);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->server.host, "0.0.0.0");
  EXPECT_EQ(c->server.port, 9000);
  EXPECT_EQ(c->server.api_key, "secret");
  EXPECT_EQ(c->server.max_body_bytes, 1u << 20);
  EXPECT_EQ(c->server.threads, 12);
  EXPECT_EQ(c->server.request_timeout_s, 20);
  EXPECT_TRUE(c->server.preload);
  EXPECT_EQ(c->budget_bytes, kMemTotal / 4 * 3);
  ASSERT_EQ(c->models.size(), 2u);
  EXPECT_EQ(c->models[0].name, "chat");
  EXPECT_EQ(c->models[0].path, "/etc/arbiter/models/chat");  // relative to the file
  EXPECT_EQ(c->models[0].capability, Capability::kText);
  EXPECT_EQ(c->models[0].parallel, 2);
  EXPECT_EQ(c->models[0].ctx, 4096);
  EXPECT_EQ(c->models[1].path, "/abs/embed");
  EXPECT_EQ(c->models[1].capability, Capability::kEmbedding);
  EXPECT_EQ(c->models[1].parallel, 1);
  EXPECT_EQ(c->models[1].ctx, 2048);
}

TEST(Config, BudgetForms) {
  auto bytes = ParseConfigToml("[memory]\nbudget = 1048576\n", "a.toml", kMemTotal);
  ASSERT_TRUE(bytes.ok());
  EXPECT_EQ(bytes->budget_bytes, 1048576u);
  auto gb = ParseConfigToml("[memory]\nbudget = \"2GB\"\n", "a.toml", kMemTotal);
  ASSERT_TRUE(gb.ok());
  EXPECT_EQ(gb->budget_bytes, 2000000000u);
  auto bad = ParseConfigToml("[memory]\nbudget = \"lots\"\n", "a.toml", kMemTotal);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("[memory].budget"), std::string::npos);
}

TEST(Config, UnknownKeysWarn) {
  auto c = ParseConfigToml(R"(
[server]
colour = "blue"
[kv]
ttl = 5
[[models]]
name = "a"
path = "/a"
role = "x"
)",
                           "a.toml", kMemTotal);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  ASSERT_EQ(c->warnings.size(), 3u);
  std::string all;
  for (const std::string& w : c->warnings) all += w + "\n";
  EXPECT_NE(all.find("[server].colour"), std::string::npos) << all;
  EXPECT_NE(all.find("\"kv\""), std::string::npos) << all;
  EXPECT_NE(all.find("[[models]][0].role"), std::string::npos) << all;
}

struct BadConfig {
  const char* toml;
  const char* message_part;
};
class ConfigErrors : public ::testing::TestWithParam<BadConfig> {};

TEST_P(ConfigErrors, NamesTheKey) {
  auto c = ParseConfigToml(GetParam().toml, "a.toml", kMemTotal);
  ASSERT_FALSE(c.ok()) << GetParam().toml;
  EXPECT_NE(c.status().message().find(GetParam().message_part), std::string::npos)
      << c.status().message();
}

INSTANTIATE_TEST_SUITE_P(
    All, ConfigErrors,
    ::testing::Values(
        BadConfig{"[server]\nport = \"80\"\n", "[server].port must be an integer in 0..65535"},
        BadConfig{"[server]\nport = 70000\n", "[server].port"},
        BadConfig{"[server]\nthreads = -1\n", "[server].threads"},
        BadConfig{"[server]\nmax_body_bytes = true\n", "[server].max_body_bytes"},
        BadConfig{"[server]\npreload = 1\n", "[server].preload"},
        BadConfig{"[server]\nrequest_timeout_s = 0\n",
                  "[server].request_timeout_s must be a positive integer"},
        BadConfig{"[[models]]\nname = \"a\"\npath = \"/a\"\n[[models]]\nname = \"b\"\npath = "
                  "\"/b\"\nctx = 0\n",
                  "[[models]][1].ctx must be a positive integer"},
        BadConfig{"[[models]]\nname = \"a\"\npath = \"/a\"\nctx = \"big\"\n",
                  "[[models]][0].ctx must be a positive integer"},
        BadConfig{"[[models]]\nname = \"a\"\npath = \"/a\"\nparallel = 0\n",
                  "[[models]][0].parallel"},
        BadConfig{"[[models]]\npath = \"/a\"\n", "[[models]][0].name"},
        BadConfig{"[[models]]\nname = \"a\"\n", "[[models]][0].path"},
        BadConfig{"[[models]]\nname = \"a\"\npath = \"/a\"\ncapability = \"vision\"\n",
                  "[[models]][0].capability must be \"text\" or \"embedding\""},
        BadConfig{"[[models]]\nname = \"a\"\npath = \"/a\"\n[[models]]\nname = \"a\"\npath = "
                  "\"/b\"\n",
                  "used twice"},
        BadConfig{"[server\nport = 1\n", "a.toml:1:"},
        BadConfig{"server = 5\n", "[server] must be a table"}));

TEST(Config, EnvOverrides) {
  Config c = DefaultConfig(kMemTotal);
  ASSERT_TRUE(ApplyEnvOverrides(FakeEnv({{"ARBITER_HOST", "0.0.0.0"},
                                         {"ARBITER_PORT", "1234"},
                                         {"ARBITER_API_KEY", "k"},
                                         {"ARBITER_BUDGET", "50%"}}),
                                kMemTotal, &c)
                  .ok());
  EXPECT_EQ(c.server.host, "0.0.0.0");
  EXPECT_EQ(c.server.port, 1234);
  EXPECT_EQ(c.server.api_key, "k");
  EXPECT_EQ(c.budget_bytes, kMemTotal / 2);
  Status bad = ApplyEnvOverrides(FakeEnv({{"ARBITER_PORT", "http"}}), kMemTotal, &c);
  EXPECT_NE(bad.message().find("ARBITER_PORT"), std::string::npos);
  Status bad_budget = ApplyEnvOverrides(FakeEnv({{"ARBITER_BUDGET", "-3"}}), kMemTotal, &c);
  EXPECT_NE(bad_budget.message().find("ARBITER_BUDGET"), std::string::npos);
}

TEST(Config, StateDir) {
  EXPECT_EQ(*DefaultStateDir(FakeEnv({{"XDG_STATE_HOME", "/x/state"}, {"HOME", "/home/u"}})),
            "/x/state/arbiter");
  EXPECT_EQ(*DefaultStateDir(FakeEnv({{"HOME", "/home/u"}})), "/home/u/.local/state/arbiter");
  EXPECT_FALSE(DefaultStateDir(FakeEnv({})).ok());
}

}  // namespace
}  // namespace arbiter
