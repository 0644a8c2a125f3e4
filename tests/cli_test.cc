// End-to-end: the `arbiter` CLI's offline commands (make-model, inspect,
// generate, bench decode, bench arbiter, bench weights) as child processes,
// on good and broken model directories.
#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <regex>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "arbiter/base/file.h"
#include "arbiter/formats/gguf.h"
#include "arbiter/formats/safetensors.h"

namespace arbiter {
namespace {

namespace fs = std::filesystem;

struct RunResult {
  int exit_code = -1;
  std::string output;  // stdout and stderr
};

// `env` (e.g. "VAR=value ") is put before the command.
RunResult RunArbiter(const std::string& args, const std::string& env = "") {
  RunResult r;
  const std::string cmd = env + std::string(ARBITER_BINARY) + " " + args + " 2>&1";
  FILE* p = ::popen(cmd.c_str(), "r");
  if (p == nullptr) return r;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0) r.output.append(buf, n);
  int status = ::pclose(p);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

class CliTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new fs::path(fs::temp_directory_path() /
                        ("arbiter_cli_test_" + std::to_string(::getpid())));
    fs::remove_all(*dir_);
    fs::create_directories(*dir_);
    RunResult r = RunArbiter("make-model --preset tiny --out " + (*dir_ / "tiny").string());
    ASSERT_EQ(r.exit_code, 0) << r.output;
  }
  static void TearDownTestSuite() {
    fs::remove_all(*dir_);
    delete dir_;
  }

  // A copy of tiny whose safetensors is rewritten by `edit`.
  static std::string BrokenCopy(const std::string& name,
                                const std::function<void(std::vector<TensorToWrite>*)>& edit) {
    const fs::path out = *dir_ / name;
    fs::remove_all(out);
    fs::copy(*dir_ / "tiny", out, fs::copy_options::recursive);
    auto st = SafetensorsFile::Open((*dir_ / "tiny" / "model.safetensors").string());
    EXPECT_TRUE(st.ok()) << st.status().ToString();
    std::vector<TensorToWrite> tensors;
    for (const TensorInfo& t : st->tensors()) {
      tensors.push_back({t.name, t.dtype, t.shape,
                         std::string_view(reinterpret_cast<const char*>(t.data), t.size_bytes)});
    }
    edit(&tensors);
    EXPECT_TRUE(WriteSafetensors((out / "model.safetensors").string(), tensors).ok());
    return out.string();
  }

  static fs::path* dir_;
};
fs::path* CliTest::dir_ = nullptr;

TEST_F(CliTest, InspectGoodModel) {
  RunResult r = RunArbiter("inspect " + (*dir_ / "tiny").string());
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("model.embed_tokens.weight"), std::string::npos) << r.output;
  RunResult j = RunArbiter("inspect --json " + (*dir_ / "tiny").string());
  ASSERT_EQ(j.exit_code, 0) << j.output;
  auto doc = nlohmann::json::parse(j.output, nullptr, false);
  ASSERT_FALSE(doc.is_discarded()) << j.output;
  EXPECT_GT(doc["totals"]["tensors"].get<int>(), 10);
}

TEST_F(CliTest, InspectWrongShapeFailsNamingTheTensor) {
  // Swap the two dims of a non-square projection: same bytes, wrong shape.
  const std::string bad = BrokenCopy("wrong-shape", [](std::vector<TensorToWrite>* ts) {
    for (TensorToWrite& t : *ts) {
      if (t.name == "model.layers.0.self_attn.k_proj.weight") std::swap(t.shape[0], t.shape[1]);
    }
  });
  RunResult r = RunArbiter("inspect " + bad);
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("tensor \"model.layers.0.self_attn.k_proj.weight\" has shape"),
            std::string::npos)
      << r.output;
}

TEST_F(CliTest, InspectMissingTensorFailsNamingIt) {
  const std::string bad = BrokenCopy("missing", [](std::vector<TensorToWrite>* ts) {
    std::erase_if(*ts, [](const TensorToWrite& t) { return t.name == "model.norm.weight"; });
  });
  RunResult r = RunArbiter("inspect " + bad);
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("tensor \"model.norm.weight\" not found"), std::string::npos)
      << r.output;
}

TEST_F(CliTest, InspectTruncatedFileFails) {
  const fs::path bad = *dir_ / "truncated";
  fs::remove_all(bad);
  fs::copy(*dir_ / "tiny", bad, fs::copy_options::recursive);
  fs::resize_file(bad / "model.safetensors", fs::file_size(bad / "model.safetensors") / 2);
  RunResult r = RunArbiter("inspect " + (bad / "model.safetensors").string());
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("model.safetensors"), std::string::npos) << r.output;
}

// A one-layer llama GGUF with `arch` as general.architecture.
std::string WriteGguf(const fs::path& path, const std::string& arch) {
  GgufWriter w;
  EXPECT_TRUE(w.AddString("general.architecture", arch).ok());
  for (const char* key : {".block_count", ".attention.head_count"}) {
    EXPECT_TRUE(w.AddUint32(arch + key, 1).ok());
  }
  EXPECT_TRUE(w.AddUint32(arch + ".embedding_length", 32).ok());
  EXPECT_TRUE(w.AddUint32(arch + ".feed_forward_length", 64).ok());
  EXPECT_TRUE(w.AddUint32(arch + ".context_length", 128).ok());
  EXPECT_TRUE(w.AddFloat32(arch + ".attention.layer_norm_rms_epsilon", 1e-5f).ok());
  EXPECT_TRUE(w.AddStringArray("tokenizer.ggml.tokens", {"<s>", "</s>", "a", "b"}).ok());
  static const std::string embd(4 * 34, '\0'), norm(32 * 4, '\0');
  EXPECT_TRUE(w.AddTensor("token_embd.weight", {32, 4}, GgmlType::kQ8_0, embd).ok());
  EXPECT_TRUE(w.AddTensor("output_norm.weight", {32}, GgmlType::kF32, norm).ok());
  EXPECT_TRUE(w.Write(path.string()).ok());
  return path.string();
}

TEST_F(CliTest, InspectGgufFile) {
  const std::string path = WriteGguf(*dir_ / "tiny.gguf", "llama");
  RunResult r = RunArbiter("inspect " + path);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("format: GGUF version 3"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("token_embd.weight"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("Q8_0"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("LlamaForCausalLM"), std::string::npos) << r.output;
  RunResult j = RunArbiter("inspect --json " + path);
  ASSERT_EQ(j.exit_code, 0) << j.output;
  auto doc = nlohmann::json::parse(j.output, nullptr, false);
  ASSERT_FALSE(doc.is_discarded()) << j.output;
  EXPECT_EQ(doc["format"], "gguf");
  EXPECT_EQ(doc["totals"]["tensors"], 2);
  EXPECT_EQ(doc["tensors"][0]["shape"], nlohmann::json::array({4, 32}));
  EXPECT_EQ(doc["config"]["vocab_size"], 4);
}

TEST_F(CliTest, InspectGgufOfAnotherArchitectureFailsNamingIt) {
  const std::string path = WriteGguf(*dir_ / "phi.gguf", "phi3");
  RunResult r = RunArbiter("inspect " + path);
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("token_embd.weight"), std::string::npos) << r.output;  // still listed
  EXPECT_NE(r.output.find("key \"general.architecture\": \"phi3\" is not supported"),
            std::string::npos)
      << r.output;
}

TEST_F(CliTest, InspectTruncatedGgufFails) {
  const std::string path = WriteGguf(*dir_ / "cut.gguf", "llama");
  fs::resize_file(path, 100);
  RunResult r = RunArbiter("inspect " + path);
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find(path + ": "), std::string::npos) << r.output;
}

TEST_F(CliTest, GenerateJsonIsDeterministic) {
  const std::string args = "generate --model " + (*dir_ / "tiny").string() +
                           " --prompt-ids 1,2,3 --max-tokens 5 --ignore-eos --json";
  RunResult a = RunArbiter(args), b = RunArbiter(args);
  ASSERT_EQ(a.exit_code, 0) << a.output;
  auto ja = nlohmann::json::parse(a.output, nullptr, false);
  auto jb = nlohmann::json::parse(b.output, nullptr, false);
  ASSERT_FALSE(ja.is_discarded()) << a.output;
  EXPECT_EQ(ja["prompt_ids"], nlohmann::json::array({1, 2, 3}));
  EXPECT_EQ(ja["output_ids"].size(), 5u);
  EXPECT_EQ(ja["output_ids"], jb["output_ids"]);  // greedy by default
  EXPECT_TRUE(ja.contains("text"));
  EXPECT_TRUE(ja.contains("timings"));
}

// make-model --format gguf: one file that inspect lists and generate runs.
TEST_F(CliTest, MakeModelGgufInspectsAndGenerates) {
  const std::string path = (*dir_ / "gguf" / "tiny-q8_0.gguf").string();  // dir created
  RunResult m =
      RunArbiter("make-model --preset tiny --format gguf --dtype q8_0 --seed 3 --out " + path);
  ASSERT_EQ(m.exit_code, 0) << m.output;
  RunResult j = RunArbiter("inspect --json " + path);
  ASSERT_EQ(j.exit_code, 0) << j.output;
  auto doc = nlohmann::json::parse(j.output, nullptr, false);
  ASSERT_FALSE(doc.is_discarded()) << j.output;
  EXPECT_EQ(doc["format"], "gguf");
  EXPECT_EQ(doc["config"]["hidden_size"], 64);
  ASSERT_EQ(doc["tensors"].size(), 1u + 2u * 9u + 1u + 1u);  // as the safetensors tiny
  for (const auto& t : doc["tensors"]) {
    EXPECT_EQ(t["dtype"], t["shape"].size() == 2 ? "Q8_0" : "F32") << t.dump();
  }
  RunResult g =
      RunArbiter("generate --model " + path + " --prompt Hello --max-tokens 4 --ignore-eos --json");
  ASSERT_EQ(g.exit_code, 0) << g.output;
  auto gen = nlohmann::json::parse(g.output, nullptr, false);
  ASSERT_FALSE(gen.is_discarded()) << g.output;
  EXPECT_EQ(gen["output_ids"].size(), 4u);
}

TEST_F(CliTest, MakeModelRefusesDtypesItCannotWrite) {
  // K-quants store rows in blocks of 256; tiny's rows are 64 long.
  const std::string path = (*dir_ / "tiny-q4_k.gguf").string();
  RunResult k = RunArbiter("make-model --preset tiny --format gguf --dtype q4_k --out " + path);
  EXPECT_EQ(k.exit_code, 1) << k.output;
  EXPECT_NE(k.output.find("blocks of 256"), std::string::npos) << k.output;
  EXPECT_NE(k.output.find("\"tiny\""), std::string::npos) << k.output;
  EXPECT_FALSE(fs::exists(path));
  // Block types are GGUF-only.
  RunResult st =
      RunArbiter("make-model --preset tiny --dtype q8_0 --out " + (*dir_ / "tiny-q8").string());
  EXPECT_EQ(st.exit_code, 1) << st.output;
  EXPECT_NE(st.output.find("--format gguf"), std::string::npos) << st.output;
  RunResult bad = RunArbiter("make-model --preset tiny --format gguf --dtype q3_k --out " + path);
  EXPECT_EQ(bad.exit_code, 1) << bad.output;
  EXPECT_NE(bad.output.find("q6_k"), std::string::npos) << bad.output;  // lists the types
}

TEST_F(CliTest, UnknownPresetFailsListingPresets) {
  RunResult r = RunArbiter("make-model --preset nope --out " + (*dir_ / "nope").string());
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("demo-chat"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(*dir_ / "nope" / "config.json"));
}


// Smoke test of `arbiter bench decode` at a tiny shape: the text report keeps
// the prefill and decode lines scripts parse, and --json carries the same
// figures. No timing is asserted.
TEST_F(CliTest, BenchDecodeTextAndJson) {
  const std::string args = "bench decode --model " + (*dir_ / "tiny").string() +
                           " --threads 1 --prompt-tokens 16 --gen-tokens 4 --repetitions 1";
  RunResult r = RunArbiter(args);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::regex prefill(
      R"(\nprefill +16 tokens: [0-9]+\.[0-9] ms, [0-9]+\.[0-9] tok/s \(best of 1\)\n)");
  const std::regex decode(
      R"(\ndecode +4 tokens: [0-9]+\.[0-9] ms, [0-9]+\.[0-9]{2} tok/s \(best of 1\)\n)");
  EXPECT_TRUE(std::regex_search(r.output, prefill)) << r.output;
  EXPECT_TRUE(std::regex_search(r.output, decode)) << r.output;

  RunResult j = RunArbiter(args + " --json");
  ASSERT_EQ(j.exit_code, 0) << j.output;
  nlohmann::json doc = nlohmann::json::parse(j.output, nullptr, false);
  ASSERT_FALSE(doc.is_discarded()) << j.output;
  EXPECT_EQ(doc["n_threads"], 1);
  EXPECT_EQ(doc["prompt_tokens"], 16);
  EXPECT_EQ(doc["gen_tokens"], 4);
  EXPECT_EQ(doc["repetitions"], 1);
  for (const char* k : {"load_ms", "prefill_ms", "prefill_tok_s", "decode_ms", "decode_tok_s",
                        "weight_bytes", "weight_bytes_per_token", "kv_bytes_per_token",
                        "memcpy_bytes_per_s", "roofline_tok_s", "roofline_fraction",
                        "read_bytes_per_s", "read_roofline_tok_s", "read_roofline_fraction"}) {
    EXPECT_GT(doc[k].get<double>(), 0) << k;
  }
}

// Smoke test of `arbiter bench arbiter` (no timings are asserted: benchmarks
// are not part of `make test`).
TEST(CliBenchTest, BenchArbiterRunsAndNamesEveryScenario) {
  RunResult r = RunArbiter("bench arbiter --iterations 1000");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (const char* name :
       {"limit_mutex", "limit_atomic", "acquire_release_1t", "acquire_release_2t_diff",
        "acquire_release_2t_same", "fit_evict_10", "fit_evict_100", "fit_evict_1000",
        "pressure_to_unload", "pressure_rss_drop"}) {
    EXPECT_NE(r.output.find(name), std::string::npos) << name << "\n" << r.output;
  }
  RunResult j = RunArbiter("bench arbiter --iterations 1000 --json");
  ASSERT_EQ(j.exit_code, 0) << j.output;
  nlohmann::json doc = nlohmann::json::parse(j.output);
  EXPECT_EQ(doc["iterations"], 1000);
  EXPECT_GE(doc["scenarios"].size(), 10u);
}

// Smoke test of `arbiter bench weights` on the tiny model: 1 repetition, 2
// workers, a second model copied by the bench itself. Behaviour only (the
// JSON has every scenario, the counts are as set up, the figures are
// positive); never speed.
TEST_F(CliTest, BenchWeightsRunsEveryScenario) {
  RunResult r = RunArbiter("bench weights --model " + (*dir_ / "tiny").string() +
                           " --repetitions 1 --workers 2 --json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  nlohmann::json doc = nlohmann::json::parse(r.output, nullptr, false);
  ASSERT_FALSE(doc.is_discarded()) << r.output;
  EXPECT_EQ(doc["repetitions"], 1);
  EXPECT_EQ(doc["workers"], 2);
  EXPECT_TRUE(doc["model2_is_copy"].get<bool>());
  EXPECT_FALSE(fs::exists(doc["model2_dir"].get<std::string>())) << "temp copy left behind";

  const nlohmann::json& a = doc["floor_load"];
  EXPECT_GT(a["weight_bytes"].get<double>(), 0);
  for (const char* k :
       {"load_gb_s", "memcpy_gb_s", "ratio", "memcpy_huge_gb_s", "memcpy_huge_discarded_gb_s",
        "memcpy_fresh_gb_s", "base_pages_load_gb_s"}) {
    EXPECT_GT(a[k].get<double>(), 0) << k;
  }
  EXPECT_EQ(a["acquire_seconds"]["samples"], 1);
  EXPECT_GT(a["acquire_seconds"]["p50"].get<double>(), 0);

  const nlohmann::json& b = doc["file_load"];
  EXPECT_GT(b["file_bytes"].get<double>(), 0);
  EXPECT_EQ(b["f32_bytes"], a["weight_bytes"]);
  for (const char* state : {"warm", "cold"}) {
    for (const char* k :
         {"file_gb_s", "f32_gb_s", "read_gb_s", "ratio_vs_read", "ratio_vs_memcpy"}) {
      EXPECT_GT(b[state][k].get<double>(), 0) << state << " " << k;
    }
  }

  const nlohmann::json& c = doc["alternation"];
  ASSERT_EQ(c["cases"].size(), 3u);
  for (const nlohmann::json& k : c["cases"]) {
    const std::string name = k["name"];
    EXPECT_EQ(k["requests"], 2) << name;
    EXPECT_EQ(k["loads"], name == "both_fit" ? 0 : 2) << name;
    EXPECT_GT(k["total_seconds"].get<double>(), 0) << name;
    EXPECT_GT(k["ttft_seconds"]["p50"].get<double>(), 0) << name;
  }

  const nlohmann::json& d = doc["worker_pss"];
  EXPECT_GT(d["floor_bytes"].get<double>(), 0);
  EXPECT_EQ(d["shared"]["filled_here"], 1);
  EXPECT_EQ(d["private"]["filled_here"], 2);
  for (const char* store : {"shared", "private"}) {
    EXPECT_GT(d[store]["sum_pss_bytes"].get<double>(), 0) << store;
    EXPECT_GT(d[store]["sum_floor_pss_bytes"].get<double>(), 0) << store;
  }
  EXPECT_GT(d["floor_ratio"].get<double>(), 0);
  EXPECT_LT(d["floor_ratio"].get<double>(), 1);  // shared floors are shared
  EXPECT_EQ(d["leftover_regions"], 0);

  RunResult text = RunArbiter("bench weights --model " + (*dir_ / "tiny").string() +
                              " --repetitions 1 --workers 2");
  ASSERT_EQ(text.exit_code, 0) << text.output;
  for (const char* name :
       {"(a) floor_load", "(b) file_load", "(c) alternation", "(d) worker_pss"}) {
    EXPECT_NE(text.output.find(name), std::string::npos) << name << "\n" << text.output;
  }
}

}  // namespace
}  // namespace arbiter

namespace arbiter {
namespace {

// A machine with a Vulkan loader but no device (no ICD found): the CLI
// starts, lists the cpu and says why there is no Vulkan device; a model on
// "vulkan" fails naming the device, and the same model on the cpu works.
TEST_F(CliTest, WithoutAVulkanDeviceTheCpuPathStillWorks) {
  const std::string env = "VK_DRIVER_FILES=/nonexistent VK_ICD_FILENAMES=/nonexistent ";
  auto run = [&](const std::string& args) { return RunArbiter(args, env); };
  RunResult none = run("devices --json");
  EXPECT_EQ(none.exit_code, 0) << none.output;
  EXPECT_NE(none.output.find("\"cpu\""), std::string::npos) << none.output;
  EXPECT_EQ(none.output.find("\"vulkan:0\""), std::string::npos) << none.output;
  EXPECT_NE(none.output.find("\"available\": false"), std::string::npos) << none.output;
  const std::string gen =
      "generate --model " + (*dir_ / "tiny").string() + " --prompt-ids 1,2,3 --max-tokens 2 ";
  RunResult gpu = run(gen + "--device vulkan");
  EXPECT_NE(gpu.exit_code, 0) << gpu.output;
  EXPECT_NE(gpu.output.find("vulkan"), std::string::npos) << gpu.output;
  RunResult cpu = run(gen + "--device cpu");
  EXPECT_EQ(cpu.exit_code, 0) << cpu.output;
}

}  // namespace
}  // namespace arbiter
