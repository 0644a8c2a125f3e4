#include "arbiter/runtime/config.h"

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
  EXPECT_EQ(c->server.max_embedding_inputs, 2048);
  EXPECT_EQ(c->server.max_embedding_tokens, 300000);
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
max_embedding_inputs = 16
max_embedding_tokens = 1000

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
  EXPECT_EQ(c->server.max_embedding_inputs, 16);
  EXPECT_EQ(c->server.max_embedding_tokens, 1000);
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
[cache]
size = 1
[[models]]
name = "a"
path = "/a"
flavour = "x"
)",
                           "a.toml", kMemTotal);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  ASSERT_EQ(c->warnings.size(), 4u);
  std::string all;
  for (const std::string& w : c->warnings) all += w + "\n";
  EXPECT_NE(all.find("[server].colour"), std::string::npos) << all;
  EXPECT_NE(all.find("[kv].ttl"), std::string::npos) << all;
  EXPECT_NE(all.find("\"cache\""), std::string::npos) << all;
  EXPECT_NE(all.find("[[models]][0].flavour"), std::string::npos) << all;
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
        BadConfig{"[server]\nmax_embedding_inputs = 0\n", "[server].max_embedding_inputs"},
        BadConfig{"[server]\nmax_embedding_tokens = -5\n",
                  "[server].max_embedding_tokens must be a positive integer"},
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
                  "[[models]][0].capability must be one of \"text\", \"embedding\", "
                  "\"vision-describe\""},
        BadConfig{"[[models]]\nname = \"a\"\ncapability = \"speak\"\nengine = \"tesseract\"\n",
                  "[[models]][0].engine \"tesseract\" cannot serve capability \"speak\""},
        BadConfig{"[[models]]\nname = \"a\"\ncapability = \"speak\"\nengine = \"coqui\"\n",
                  "[[models]][0].engine must be one of \"builtin\""},
        BadConfig{"[[models]]\nname = \"a\"\ncapability = \"vad\"\ncommand = [\"/bin/x\"]\n",
                  "cannot serve capability \"vad\""},
        BadConfig{"[[models]]\nname = \"a\"\ncapability = \"image-gen\"\n",
                  "[[models]][0].command must be a non-empty array of strings"},
        BadConfig{"[[models]]\nname = \"a\"\ncapability = \"image-gen\"\ncommand = []\n",
                  "[[models]][0].command must be a non-empty array"},
        BadConfig{"[[models]]\nname = \"a\"\ncapability = \"speak\"\nhealth = \"/h\"\n",
                  "set only on process models"},
        BadConfig{"[[models]]\nname = \"a\"\ncommand = [\"/x\"]\nhealth = \"h\"\n",
                  "[[models]][0].health must be a path starting with /"},
        BadConfig{"[[models]]\nname = \"a\"\ncommand = [\"/x\"]\nestimated_size = \"big\"\n",
                  "[[models]][0].estimated_size must be a positive size"},
        BadConfig{"[[models]]\nname = \"a\"\ncapability = \"speak\"\nlanguage = \"eng\"\n",
                  "[[models]][0].language must be set only on tesseract models"},
        BadConfig{"[[models]]\nname = \"o\"\ncapability = \"vision-describe\"\nlanguage = \"../x\"\n",
                  "[[models]][0].language must be a tessdata language name"},
        BadConfig{"[[models]]\nname = \"a\"\ncapability = \"speak\"\nqueue = 0\n",
                  "[[models]][0].queue must be an integer in 1..100000"},
        BadConfig{"[[models]]\nname = \"a\"\ncapability = \"speak\"\nvision = \"o\"\n",
                  "[[models]][0].vision must be set only on text models"},
        BadConfig{"[[models]]\nname = \"a\"\npath = \"/a\"\nvision = \"nope\"\n",
                  "[[models]][0].vision \"nope\" must name a configured vision-describe model"},
        BadConfig{"[server]\nmax_audio_seconds = 0\n", "[server].max_audio_seconds"},
        BadConfig{"[server]\nmax_audio_bytes = -1\n", "[server].max_audio_bytes"},
        BadConfig{"[[models]]\nname = \"a\"\npath = \"/a\"\n[[models]]\nname = \"a\"\npath = "
                  "\"/b\"\n",
                  "used twice"},
        BadConfig{"[server\nport = 1\n", "a.toml:1:"},
        BadConfig{"[[models]]\nname = \"a\"\npath = \"/a\"\nrole = \"boss\"\n",
                  "[[models]][0].role must be one of \"drafter\""},
        BadConfig{"[[models]]\nname = \"a\"\npath = \"/a\"\nrole = 3\n",
                  "[[models]][0].role must be a string"},
        BadConfig{"[[models]]\nname = \"a\"\npath = \"/a\"\nidle_ttl = \"5 minutes\"\n",
                  "[[models]][0].idle_ttl must be a duration"},
        BadConfig{"[[models]]\nname = \"a\"\npath = \"/a\"\nidle_ttl = -1\n",
                  "[[models]][0].idle_ttl"},
        BadConfig{"[[models]]\nname = \"a\"\npath = \"/a\"\nidle_ttl = 1.5\n",
                  "[[models]][0].idle_ttl"},
        BadConfig{"[memory]\nheadroom = \"lots\"\n", "[memory].headroom is invalid"},
        BadConfig{"[memory]\nheadroom = \"16GiB\"\n",
                  "[memory].headroom (16GiB) must be smaller than total RAM"},
        BadConfig{"[memory]\nheadroom = true\n", "[memory].headroom must be a size"},
        BadConfig{"[pressure]\nsource = \"magic\"\n",
                  "[pressure].source must be one of \"auto\""},
        BadConfig{"[pressure]\nsource = 1\n", "[pressure].source must be a string"},
        BadConfig{"[pressure]\nlow_fraction = 1.5\n", "[pressure].low_fraction"},
        BadConfig{"[pressure]\ncritical_fraction = \"x\"\n", "[pressure].critical_fraction"},
        BadConfig{"[pressure]\nlow_fraction = 0.1\ncritical_fraction = 0.2\n",
                  "[pressure].critical_fraction (0.2) must be < [pressure].low_fraction (0.1)"},
        BadConfig{"[pressure]\ninterval_ms = 10\n", "[pressure].interval_ms"},
        BadConfig{"[pressure]\npsi_window_ms = 20000\n", "[pressure].psi_window_ms"},
        BadConfig{"[pressure]\npsi_window_ms = 1000\npsi_low_stall_ms = 1500\n",
                  "[pressure].psi_low_stall_ms"},
        BadConfig{"[memory]\ndevice_arena = \"huge\"\n", "[memory].device_arena is invalid"},
        BadConfig{"[memory]\ndevice_arena = 0\n", "[memory].device_arena must be a positive size"},
        BadConfig{"[memory]\nweight_cache_fraction = 0\n",
                  "[memory].weight_cache_fraction must be a number in (0, 1]"},
        BadConfig{"[memory]\nwiggle_fraction = 1\n",
                  "[memory].wiggle_fraction must be a number in [0, 1)"},
        BadConfig{"[memory]\nshared_host_weights = \"yes\"\n",
                  "[memory].shared_host_weights"},
        BadConfig{"[memory]\nshared_host_weights_mode = 600\n",
                  "[memory].shared_host_weights_mode must be an octal mode string"},
        BadConfig{"[memory]\nshared_host_weights_mode = \"0400\"\n",
                  "keeps the owner's read and write bits"},
        BadConfig{"[memory]\nshared_host_weights_mode = \"0680\"\n",
                  "[memory].shared_host_weights_mode"},
        BadConfig{"[memory]\nshared_host_weights_prefix = \"a/b\"\n",
                  "[memory].shared_host_weights_prefix must be 1 to 64 characters"},
        BadConfig{"[memory]\nmode = \"manual\"\n",
                  "[memory].mode must be \"self_managed\" or \"externally_managed\""},
        BadConfig{"[memory]\ncompaction_interval = -1\n", "[memory].compaction_interval"},
        BadConfig{"[[models]]\nname = \"a\"\npath = \"/a\"\nresidency = \"pinned\"\n",
                  "[[models]][0].residency must be \"unpinned\", \"pinned_system\" or "
                  "\"pinned_device\" (got \"pinned\")"},
        BadConfig{"[[models]]\nname = \"a\"\npath = \"/a\"\ncompute_dtype = \"f16\"\n",
                  "[[models]][0].compute_dtype must be \"auto\" or \"f32\" (got \"f16\")"},
        BadConfig{"[[models]]\nname = \"a\"\npath = \"/a\"\nkv_type = \"q4_0\"\n",
                  "[[models]][0].kv_type must be one of \"f16\" (default), \"bf16\", \"q8_0\", "
                  "\"f32\" (got \"q4_0\")"},
        BadConfig{"[[models]]\nname = \"a\"\npath = \"/a\"\ndevice_layers = 2\n",
                  "[[models]][0].device_layers must be used only with device = \"vulkan\""},
        BadConfig{"[[models]]\nname = \"a\"\npath = \"/a\"\ndevice = \"vulkan\"\n"
                  "device_layers = -1\n",
                  "[[models]][0].device_layers must be an integer ≥ 0"},
        BadConfig{"[[models]]\nname = \"a\"\npath = \"/a\"\nchat_template = \"vicuna\"\n",
                  "[[models]][0].chat_template must be one of \"chatml\""},
        BadConfig{"pressure = 1\n", "[pressure] must be a table"},
        BadConfig{"server = 5\n", "[server] must be a table"},
        BadConfig{"[devices.\"cuda:0\"]\nbudget = \"1GiB\"\n",
                  "device \"cuda:0\" is not a device name; use \"vulkan:N\""},
        BadConfig{"[devices.\"vulkan:x\"]\n", "device \"vulkan:x\""},
        BadConfig{"[devices.\"vulkan:01\"]\n", "device \"vulkan:01\""},
        BadConfig{"[devices.vulkan]\n", "device \"vulkan\""},
        BadConfig{"[devices.\"vulkan:0\"]\nbudgte = \"1GiB\"\n",
                  "unknown key [devices.\"vulkan:0\"].budgte"},
        BadConfig{"[devices.\"vulkan:0\"]\nbudget = 0\n",
                  "[devices.\"vulkan:0\"].budget must be a positive size"},
        BadConfig{"[devices.\"vulkan:0\"]\nbudget = \"lots\"\n",
                  "[devices.\"vulkan:0\"].budget is invalid"},
        BadConfig{"[devices.\"vulkan:1\"]\nheadroom = true\n",
                  "[devices.\"vulkan:1\"].headroom must be a size"},
        BadConfig{"devices = 1\n", "[devices] must be a table"},
        BadConfig{"[devices]\n\"vulkan:0\" = 3\n", "[devices.\"vulkan:0\"] must be a table"}));

TEST(Config, Devices) {
  auto c = ParseConfigToml(R"(
[devices."vulkan:0"]
budget = "70GiB"

[devices."vulkan:1"]
headroom = "10%"

[devices."vulkan:2"]
budget = 1073741824
headroom = 0
)",
                           "a.toml", kMemTotal);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  ASSERT_EQ(c->devices.size(), 3u);
  EXPECT_EQ(c->devices[0].name, "vulkan:0");
  EXPECT_EQ(c->devices[0].budget_text, "70GiB");
  EXPECT_EQ(c->devices[0].headroom_text, kDefaultDeviceHeadroom);
  EXPECT_EQ(c->devices[1].name, "vulkan:1");
  EXPECT_FALSE(c->devices[1].budget_text.has_value());
  EXPECT_EQ(c->devices[1].headroom_text, "10%");
  EXPECT_EQ(c->devices[2].budget_text, "1073741824");
  EXPECT_EQ(c->devices[2].headroom_text, "0");
  EXPECT_TRUE(c->warnings.empty());
  // No device section: none configured, the host's budget as before.
  auto plain = ParseConfigToml("", "a.toml", kMemTotal);
  ASSERT_TRUE(plain.ok());
  EXPECT_TRUE(plain->devices.empty());
  // The texts resolve against the heap when the device is opened.
  EXPECT_EQ(*ResolveDeviceBudget(c->devices[1].name, c->devices[1].budget_text,
                                 c->devices[1].headroom_text, 10 * kGiB, std::nullopt),
            9 * kGiB);
}

TEST(Config, DeviceNames) {
  EXPECT_TRUE(ValidateDeviceName("vulkan:0").ok());
  EXPECT_TRUE(ValidateDeviceName("vulkan:12").ok());
  for (const char* bad : {"vulkan", "vulkan:", "vulkan:-1", "vulkan:1x", "vulkan:1000",
                          "Vulkan:0", "cpu", "host", "cuda:0", ""}) {
    EXPECT_EQ(ValidateDeviceName(bad).code(), StatusCode::kInvalidArgument) << bad;
  }
}

// Every capability, each engine's default, a process model (issue 14).
TEST(Config, ModalitiesAndProcessModels) {
  auto c = ParseConfigToml(R"(
[server]
max_audio_bytes = 1000000
max_audio_seconds = 30.5
[[models]]
name = "chat"
path = "chat"
vision = "ocr"
[[models]]
name = "asr"
capability = "transcribe"
queue = 4
[[models]]
name = "tts"
capability = "speak"
[[models]]
name = "tts2"
capability = "speak"
engine = "espeak-ng"
[[models]]
name = "ocr"
capability = "vision-describe"
language = "eng+deu"
[[models]]
name = "vad"
capability = "vad"
[[models]]
name = "sd"
capability = "image-gen"
command = ["bin/sd-server", "--port", "{port}"]
health = "/healthz"
ready_timeout_s = 5
estimated_size = "2GiB"
)",
                           "/etc/arbiter/a.toml", kMemTotal);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  ASSERT_TRUE(ValidateConfig(*c).ok());
  EXPECT_EQ(c->server.max_audio_bytes, 1000000u);
  EXPECT_DOUBLE_EQ(c->server.max_audio_seconds, 30.5);
  const auto& m = c->models;
  ASSERT_EQ(m.size(), 7u);
  EXPECT_EQ(m[0].engine, ModelEngine::kBuiltin);
  EXPECT_EQ(m[0].vision, "ocr");
  EXPECT_EQ(m[1].engine, ModelEngine::kPocketSphinx);
  EXPECT_EQ(m[1].queue, 4);
  EXPECT_TRUE(m[1].path.empty());
  EXPECT_EQ(m[2].engine, ModelEngine::kFlite);
  EXPECT_EQ(m[2].queue, 16);
  EXPECT_EQ(m[3].engine, ModelEngine::kEspeakNg);
  EXPECT_EQ(m[4].engine, ModelEngine::kTesseract);
  EXPECT_EQ(m[4].language, "eng+deu");
  EXPECT_EQ(m[5].engine, ModelEngine::kPocketSphinx);
  EXPECT_EQ(m[5].capability, Capability::kVad);
  EXPECT_EQ(m[6].engine, ModelEngine::kProcess);
  EXPECT_EQ(m[6].process.argv,
            (std::vector<std::string>{"/etc/arbiter/bin/sd-server", "--port", "{port}"}));
  EXPECT_EQ(m[6].process.health, "/healthz");
  EXPECT_EQ(m[6].process.ready_timeout_ms, 5000);
  EXPECT_EQ(m[6].process.estimated_bytes, 2ull << 30);
  EXPECT_TRUE(c->warnings.empty());
}

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

TEST(Config, RoleAndIdleTtl) {
  auto c = ParseConfigToml(R"(
[[models]]
name = "chat"
path = "/m/chat"

[[models]]
name = "embed"
path = "/m/embed"
capability = "embedding"
role = "drafter"
idle_ttl = "5m"

[[models]]
name = "e2"
path = "/m/e2"
capability = "embedding"
idle_ttl = 30

[[models]]
name = "e3"
path = "/m/e3"
capability = "embedding"
role = "text-target"
idle_ttl = "1h"

[[models]]
name = "e4"
path = "/m/e4"
idle_ttl = "250ms"
)",
                           "a.toml", kMemTotal);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  ASSERT_EQ(c->models.size(), 5u);
  EXPECT_FALSE(c->models[0].role.has_value());  // DefaultRoleFor at registration
  EXPECT_FALSE(c->models[0].idle_ttl_ms.has_value());
  EXPECT_EQ(c->models[1].role, ResidentRole::kDrafter);
  EXPECT_EQ(c->models[1].idle_ttl_ms, 5 * 60 * 1000);
  EXPECT_EQ(c->models[2].idle_ttl_ms, 30 * 1000);
  EXPECT_EQ(c->models[3].role, ResidentRole::kTextTarget);
  EXPECT_EQ(c->models[3].idle_ttl_ms, 3600 * 1000);
  EXPECT_EQ(c->models[4].idle_ttl_ms, 250);
  // Every role name parses.
  for (size_t r = 0; r < kResidentRoleCount; ++r) {
    const std::string name(ResidentRoleName(static_cast<ResidentRole>(r)));
    auto one = ParseConfigToml("[[models]]\nname = \"a\"\npath = \"/a\"\nrole = \"" + name + "\"\n",
                               "a.toml", kMemTotal);
    ASSERT_TRUE(one.ok()) << name << ": " << one.status().ToString();
    EXPECT_EQ(one->models[0].role, static_cast<ResidentRole>(r)) << name;
  }
}

TEST(Config, WeightRuntime) {
  auto d = ParseConfigToml("", "a.toml", kMemTotal);
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->weights.device_arena_bytes, 0u);
  EXPECT_EQ(d->weights.weight_cache_fraction, 1.0);
  EXPECT_EQ(d->weights.wiggle_fraction, 0.1);
  EXPECT_FALSE(d->weights.shared_host_weights);
  EXPECT_EQ(d->weights.shared_host_weights_mode, 0600u);
  EXPECT_EQ(d->weights.mode, ResidencyMode::kSelfManaged);
  EXPECT_EQ(d->weights.compaction_every_loads, 0u);
  auto c = ParseConfigToml(R"(
[memory]
device_arena = "25%"
weight_cache_fraction = 0.5
wiggle_fraction = 0
shared_host_weights = true
shared_host_weights_mode = "0660"
mode = "externally_managed"
compaction_interval = 8
[[models]]
name = "a"
path = "/a"
residency = "pinned_device"
compute_dtype = "f32"
kv_type = "q8_0"
chat_template = "gemma"
[[models]]
name = "b"
path = "/b"
compute_dtype = "auto"
device = "vulkan"
device_layers = 3
)",
                           "a.toml", kMemTotal);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_TRUE(c->warnings.empty());
  EXPECT_EQ(c->weights.device_arena_bytes, kMemTotal / 4);
  EXPECT_EQ(c->weights.device_arena_text, "25%");
  EXPECT_EQ(c->weights.weight_cache_fraction, 0.5);
  EXPECT_EQ(c->weights.wiggle_fraction, 0.0);
  EXPECT_TRUE(c->weights.shared_host_weights);
  EXPECT_EQ(c->weights.shared_host_weights_mode, 0660u);
  EXPECT_EQ(c->weights.mode, ResidencyMode::kExternallyManaged);
  EXPECT_EQ(c->weights.compaction_every_loads, 8u);
  EXPECT_EQ(c->models[0].residency, ResidencyState::kPinnedDevice);
  EXPECT_EQ(c->models[1].residency, ResidencyState::kUnpinned);
  EXPECT_TRUE(c->models[0].compute_f32);
  EXPECT_FALSE(c->models[1].compute_f32);
  EXPECT_EQ(c->models[0].kv_type, GgmlType::kQ8_0);
  EXPECT_EQ(c->models[1].kv_type, GgmlType::kF16);  // the default
  EXPECT_EQ(c->models[0].chat_template, ChatTemplateKind::kGemma);
  EXPECT_EQ(c->models[1].chat_template, std::nullopt);
  EXPECT_EQ(c->models[0].device_layers, -1);  // decided at startup
  EXPECT_EQ(c->models[1].device_layers, 3);
}

TEST(Config, KvSection) {
  auto d = ParseConfigToml("", "a.toml", kMemTotal);
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->kv.dir, "");
  EXPECT_EQ(d->kv.ttl_short_ms, 300000);
  EXPECT_EQ(d->kv.ttl_long_ms, 3600000);
  EXPECT_EQ(d->kv.ttl_extended_ms, 86400000);
  EXPECT_EQ(d->kv.conversation_ttl_ms, 3600000);
  EXPECT_EQ(d->kv.eviction_interval_ms, 300000);
  EXPECT_EQ(d->kv.keepalive_interval_ms, 30000);
  EXPECT_EQ(d->kv.prompt_cache_bytes, 512ull << 20);
  EXPECT_EQ(d->kv.disk_budget_bytes, 4 * kGiB);

  auto c = ParseConfigToml(R"(
[kv]
dir = "/var/lib/arbiter/kv"
ttl_short = "2m"
ttl_long = 1800
ttl_extended = "12h"
conversation_ttl = "30m"
eviction_interval = "10s"
keepalive_interval = "20s"
prompt_cache = "1%"
disk_budget = 0
[[models]]
name = "chat"
path = "/m"
system_prompt = "You are terse."
)",
                           "a.toml", kMemTotal);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_TRUE(c->warnings.empty());
  EXPECT_EQ(c->kv.dir, "/var/lib/arbiter/kv");
  EXPECT_EQ(c->kv.ttl_short_ms, 120000);
  EXPECT_EQ(c->kv.ttl_long_ms, 1800000);
  EXPECT_EQ(c->kv.ttl_extended_ms, 43200000);
  EXPECT_EQ(c->kv.conversation_ttl_ms, 1800000);
  EXPECT_EQ(c->kv.eviction_interval_ms, 10000);
  EXPECT_EQ(c->kv.keepalive_interval_ms, 20000);
  EXPECT_EQ(c->kv.prompt_cache_bytes, kMemTotal / 100);
  EXPECT_EQ(c->kv.disk_budget_bytes, 0u);
  EXPECT_EQ(c->models[0].system_prompt, "You are terse.");

  auto err = [](const std::string& toml) {
    auto r = ParseConfigToml(toml, "a.toml", kMemTotal);
    return r.ok() ? std::string("ok") : r.status().message();
  };
  EXPECT_NE(err("[kv]\ndir = \"\"").find("[kv].dir"), std::string::npos);
  EXPECT_NE(err("[kv]\nttl_short = \"0s\"").find("[kv].ttl_short"), std::string::npos);
  EXPECT_NE(err("[kv]\nttl_long = \"soon\"").find("[kv].ttl_long"), std::string::npos);
  EXPECT_NE(err("[kv]\neviction_interval = \"10ms\"").find("[kv].eviction_interval"),
            std::string::npos);
  EXPECT_NE(err("[kv]\nprompt_cache = -1").find("[kv].prompt_cache"), std::string::npos);
  EXPECT_NE(err("[kv]\ndisk_budget = \"lots\"").find("[kv].disk_budget"), std::string::npos);
  EXPECT_NE(err("[kv]\nttl_short = \"2h\"").find("ttl_short"), std::string::npos);  // > long
  // A keep-alive interval that lets the short TTL run out (docs/kv-precache.md
  // "Defects of the reference, fixed": keep-alive before the short TTL).
  EXPECT_NE(err("[kv]\nkeepalive_interval = \"240s\"").find("[kv].keepalive_interval"),
            std::string::npos);
  EXPECT_NE(err("[kv]\nttl_short = \"100s\"\nkeepalive_interval = \"20s\"")
                .find("[kv].keepalive_interval"),
            std::string::npos);
  EXPECT_EQ(err("[kv]\nttl_short = \"100s\"\nkeepalive_interval = \"19s\""), "ok");
  EXPECT_NE(err("[[models]]\nname = \"e\"\npath = \"/e\"\ncapability = \"embedding\"\n"
                "system_prompt = \"x\"")
                .find("system_prompt"),
            std::string::npos);
}

TEST(Config, DurationParsing) {
  EXPECT_EQ(*ParseDurationMs("30s", "k"), 30000);
  EXPECT_EQ(*ParseDurationMs("5m", "k"), 300000);
  EXPECT_EQ(*ParseDurationMs("1h", "k"), 3600000);
  EXPECT_EQ(*ParseDurationMs("250ms", "k"), 250);
  EXPECT_EQ(*ParseDurationMs("12", "k"), 12000);
  for (const char* bad : {"", "s", "5 m", "5d", "-5s", "1.5h", "99999999999999999999h"}) {
    auto r = ParseDurationMs(bad, "[[models]][0].idle_ttl");
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_NE(r.status().message().find("[[models]][0].idle_ttl"), std::string::npos);
  }
}

TEST(Config, Headroom) {
  auto c = ParseConfigToml("[memory]\nheadroom = \"4GiB\"\n", "a.toml", kMemTotal);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->headroom_bytes, 4 * kGiB);
  EXPECT_EQ(c->budget_bytes, kMemTotal - 4 * kGiB);
  auto pct = ParseConfigToml("[memory]\nheadroom = \"25%\"\n", "a.toml", kMemTotal);
  ASSERT_TRUE(pct.ok());
  EXPECT_EQ(pct->budget_bytes, kMemTotal / 4 * 3);
  // An explicit budget wins, but the headroom is still validated.
  auto both = ParseConfigToml("[memory]\nbudget = \"2GiB\"\nheadroom = \"1GiB\"\n", "a.toml",
                              kMemTotal);
  ASSERT_TRUE(both.ok());
  EXPECT_EQ(both->budget_bytes, 2 * kGiB);
  auto bad_with_budget = ParseConfigToml("[memory]\nbudget = \"2GiB\"\nheadroom = \"x\"\n",
                                         "a.toml", kMemTotal);
  ASSERT_FALSE(bad_with_budget.ok());
  EXPECT_NE(bad_with_budget.status().message().find("[memory].headroom"), std::string::npos);
  // Env: ARBITER_HEADROOM re-derives the budget when none was set.
  Config d = DefaultConfig(kMemTotal);
  ASSERT_TRUE(ApplyEnvOverrides(FakeEnv({{"ARBITER_HEADROOM", "2GiB"}}), kMemTotal, &d).ok());
  EXPECT_EQ(d.budget_bytes, kMemTotal - 2 * kGiB);
  Status bad = ApplyEnvOverrides(FakeEnv({{"ARBITER_HEADROOM", "99GiB"}}), kMemTotal, &d);
  EXPECT_NE(bad.message().find("ARBITER_HEADROOM"), std::string::npos) << bad.message();
}

TEST(Config, Pressure) {
  auto def = ParseConfigToml("", "a.toml", kMemTotal);
  ASSERT_TRUE(def.ok());
  EXPECT_EQ(def->pressure.source, PressureSourceKind::kAuto);
  EXPECT_DOUBLE_EQ(def->pressure.low_fraction, 0.15);
  EXPECT_DOUBLE_EQ(def->pressure.critical_fraction, 0.05);
  EXPECT_EQ(def->pressure.psi_window_ms, 2000);
  auto c = ParseConfigToml(R"(
[pressure]
source = "meminfo"
interval_ms = 1000
low_fraction = 0.2
critical_fraction = 0.1
psi_window_ms = 4000
psi_low_stall_ms = 400
psi_critical_stall_ms = 300
psi_quiet_ms = 5000
shiny = 1
)",
                           "a.toml", kMemTotal);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->pressure.source, PressureSourceKind::kMeminfo);
  EXPECT_EQ(c->pressure.interval_ms, 1000);
  EXPECT_DOUBLE_EQ(c->pressure.low_fraction, 0.2);
  EXPECT_DOUBLE_EQ(c->pressure.critical_fraction, 0.1);
  EXPECT_EQ(c->pressure.psi_window_ms, 4000);
  EXPECT_EQ(c->pressure.psi_low_stall_ms, 400);
  EXPECT_EQ(c->pressure.psi_critical_stall_ms, 300);
  EXPECT_EQ(c->pressure.psi_quiet_ms, 5000);
  ASSERT_EQ(c->warnings.size(), 1u);
  EXPECT_NE(c->warnings[0].find("[pressure].shiny"), std::string::npos);
  for (const char* name : {"auto", "meminfo", "psi", "cgroup", "none"}) {
    auto one = ParseConfigToml(std::string("[pressure]\nsource = \"") + name + "\"\n", "a.toml",
                               kMemTotal);
    ASSERT_TRUE(one.ok()) << name;
    EXPECT_EQ(PressureSourceKindName(one->pressure.source), name);
  }
  Config e = DefaultConfig(kMemTotal);
  ASSERT_TRUE(
      ApplyEnvOverrides(FakeEnv({{"ARBITER_PRESSURE_SOURCE", "none"}}), kMemTotal, &e).ok());
  EXPECT_EQ(e.pressure.source, PressureSourceKind::kNone);
  Status bad = ApplyEnvOverrides(FakeEnv({{"ARBITER_PRESSURE_SOURCE", "x"}}), kMemTotal, &e);
  EXPECT_NE(bad.message().find("ARBITER_PRESSURE_SOURCE"), std::string::npos);
}

TEST(Config, StateDir) {
  EXPECT_EQ(*DefaultStateDir(FakeEnv({{"XDG_STATE_HOME", "/x/state"}, {"HOME", "/home/u"}})),
            "/x/state/arbiter");
  EXPECT_EQ(*DefaultStateDir(FakeEnv({{"HOME", "/home/u"}})), "/home/u/.local/state/arbiter");
  EXPECT_FALSE(DefaultStateDir(FakeEnv({})).ok());
}

TEST(Config, CorsOriginsAndMetricsCompat) {
  auto none = ParseConfigToml("", "a.toml", kMemTotal);
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->server.cors_origins.empty());
  EXPECT_TRUE(none->server.metrics_compat.empty());
  auto c = ParseConfigToml(
      "[server]\ncors_origins = [\"http://localhost:5173\", \"*\"]\nmetrics_compat = [\"vllm\"]\n",
      "a.toml", kMemTotal);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->server.cors_origins,
            (std::vector<std::string>{"http://localhost:5173", "*"}));
  EXPECT_EQ(c->server.metrics_compat, std::vector<std::string>{"vllm"});
  for (const char* bad : {"[server]\ncors_origins = \"http://a\"\n",
                          "[server]\ncors_origins = [\"localhost:5173\"]\n",
                          "[server]\ncors_origins = [\"http://a/\"]\n",
                          "[server]\nmetrics_compat = [\"tgi\"]\n"}) {
    auto r = ParseConfigToml(bad, "a.toml", kMemTotal);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_NE(r.status().message().find("[server]."), std::string::npos) << r.status().message();
  }
}

TEST(Config, AllowedHosts) {
  auto none = ParseConfigToml("", "a.toml", kMemTotal);
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->server.allowed_hosts.empty());
  auto c = ParseConfigToml(
      "[server]\nallowed_hosts = [\"arbiter.lan\", \"192.168.1.5\", \"[fd00::1]\", \"*\"]\n",
      "a.toml", kMemTotal);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->server.allowed_hosts,
            (std::vector<std::string>{"arbiter.lan", "192.168.1.5", "[fd00::1]", "*"}));
  EXPECT_TRUE(c->warnings.empty());
  for (const char* bad :
       {"[server]\nallowed_hosts = \"arbiter.lan\"\n",
        "[server]\nallowed_hosts = [\"arbiter.lan:8080\"]\n",
        "[server]\nallowed_hosts = [\"http://arbiter.lan\"]\n",
        "[server]\nallowed_hosts = [\"fd00::1\"]\n", "[server]\nallowed_hosts = [\"\"]\n",
        "[server]\nallowed_hosts = [\"a b\"]\n", "[server]\nallowed_hosts = [1]\n"}) {
    auto r = ParseConfigToml(bad, "a.toml", kMemTotal);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_NE(r.status().message().find("[server].allowed_hosts must be an array of host names"),
              std::string::npos)
        << r.status().message();
  }
  // ARBITER_ALLOWED_HOSTS: comma-separated, replacing the file's list.
  Config e = DefaultConfig(kMemTotal);
  ASSERT_TRUE(
      ApplyEnvOverrides(FakeEnv({{"ARBITER_ALLOWED_HOSTS", "a.lan, b.lan ,[::1]"}}), kMemTotal, &e)
          .ok());
  EXPECT_EQ(e.server.allowed_hosts, (std::vector<std::string>{"a.lan", "b.lan", "[::1]"}));
  Status bad = ApplyEnvOverrides(FakeEnv({{"ARBITER_ALLOWED_HOSTS", "a.lan,,b"}}), kMemTotal, &e);
  EXPECT_NE(bad.message().find("ARBITER_ALLOWED_HOSTS"), std::string::npos) << bad.message();
  bad = ApplyEnvOverrides(FakeEnv({{"ARBITER_ALLOWED_HOSTS", "a.lan:80"}}), kMemTotal, &e);
  EXPECT_NE(bad.message().find("ARBITER_ALLOWED_HOSTS"), std::string::npos) << bad.message();
}

// [server] max_speech_chars and shutdown_timeout_s: defaults, values, ranges.
TEST(Config, SpeechLimitAndShutdownTimeout) {
  auto d = ParseConfigToml("", "/etc/arbiter/a.toml", kMemTotal);
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->server.max_speech_chars, 4096);
  EXPECT_EQ(d->server.shutdown_timeout_s, 10);
  auto c = ParseConfigToml("[server]\nmax_speech_chars = 100\nshutdown_timeout_s = 3\n",
                           "/etc/arbiter/a.toml", kMemTotal);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->server.max_speech_chars, 100);
  EXPECT_EQ(c->server.shutdown_timeout_s, 3);
  EXPECT_TRUE(c->warnings.empty());
  for (const char* bad : {"max_speech_chars = 0", "max_speech_chars = 1000001",
                          "shutdown_timeout_s = 0", "shutdown_timeout_s = 3601",
                          "shutdown_timeout_s = \"10s\""}) {
    auto e = ParseConfigToml(std::string("[server]\n") + bad + "\n", "/etc/arbiter/a.toml",
                             kMemTotal);
    ASSERT_FALSE(e.ok()) << bad;
    const std::string key = std::string(bad).substr(0, std::string(bad).find(' '));
    EXPECT_NE(e.status().message().find("[server]." + key), std::string::npos)
        << e.status().message();
  }
}

}  // namespace
}  // namespace arbiter
