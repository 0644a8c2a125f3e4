// End-to-end, issue 13's "done when": a GGUF file and a bf16 safetensors
// directory each serve chat and embeddings through the same HTTP API as
// any model. The real `arbiter serve` binary on a free loopback port, with
//   chat-gguf    tiny-qwen3 written as one GGUF file, matrices Q8_0
//   embed-gguf   tiny as one GGUF file, matrices F16 (capability embedding)
//   chat-bf16    tiny as a safetensors directory, matrices BF16
//   embed-bf16   the same directory served as an embedding model
// For every model: a chat completion (and a streamed one) or an embedding
// request answers 200 in the API's shape, and the weights are charged at
// their stored size (the file's tensor bytes, not an f32 expansion).
//
// No wall-clock speed assertions: every wait has a generous deadline.
#include <chrono>
#include <cmath>
#include <filesystem>
#include <map>
#include <string>

#include <gtest/gtest.h>
#include <httplib.h>
#include <nlohmann/json.hpp>

#include "server_process.h"
#include "server_suite.h"
#include "tools/model_maker/model_maker.h"

namespace arbiter {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

class ModelFormatsE2E : public ::arbiter::testing::ServerSuite {
 protected:
  static void SetUpTestSuite() {
    ASSERT_TRUE(MakeDir("formats-e2e"));
    auto make = [](const char* preset, const std::string& out, ModelFormat format,
                   const char* dtype, uint64_t seed) {
      MakeModelOptions o;
      o.format = format;
      o.dtype = dtype;
      o.seed = seed;
      const Status s = MakeModel(preset, out, o);
      ASSERT_TRUE(s.ok()) << s.ToString();
    };
    make("tiny-qwen3", dir_ + "/chat.gguf", ModelFormat::kGguf, "q8_0", 1);
    make("tiny", dir_ + "/embed.gguf", ModelFormat::kGguf, "f16", 2);
    make("tiny", dir_ + "/bf16", ModelFormat::kSafetensors, "bf16", 3);
    const std::string config =
        "[memory]\nbudget = \"1GiB\"\n"
        "[pressure]\nsource = \"none\"\n"
        "[[models]]\nname = \"chat-gguf\"\npath = \"chat.gguf\"\n"
        "[[models]]\nname = \"embed-gguf\"\npath = \"embed.gguf\"\n"
        "capability = \"embedding\"\n"
        "[[models]]\nname = \"chat-bf16\"\npath = \"bf16\"\n"
        "[[models]]\nname = \"embed-bf16\"\npath = \"bf16\"\n"
        "capability = \"embedding\"\n";
    std::string error;
    ASSERT_TRUE(StartServe(config, &error)) << error;
  }

  static httplib::Result Post(const std::string& path, const json& body) {
    httplib::Client cli("127.0.0.1", server_.port);
    cli.set_read_timeout(120, 0);
    return cli.Post(path.c_str(), body.dump(), "application/json");
  }

  static json Get(const std::string& path) {
    httplib::Client cli("127.0.0.1", server_.port);
    cli.set_read_timeout(60, 0);
    auto r = cli.Get(path.c_str());
    if (!r || r->status != 200) return json();
    return json::parse(r->body);
  }

  static json Chat(const std::string& model, bool stream) {
    return json{{"model", model},
                {"messages", {{{"role", "user"}, {"content", "Say hello."}}}},
                {"max_tokens", 6},
                {"temperature", 0},
                {"stream", stream}};
  }
};

TEST_F(ModelFormatsE2E, EveryFormatIsListedReady) {
  const json models = Get("/v1/models");
  ASSERT_TRUE(models.is_object());
  std::map<std::string, json> by_id;
  for (const json& m : models["data"]) by_id[m["id"]] = m;
  ASSERT_EQ(by_id.size(), 4u);
  EXPECT_EQ(by_id["chat-gguf"]["capability"], "text");
  EXPECT_EQ(by_id["chat-bf16"]["capability"], "text");
  EXPECT_EQ(by_id["embed-gguf"]["capability"], "embedding");
  EXPECT_EQ(by_id["embed-bf16"]["capability"], "embedding");
  for (const auto& [id, m] : by_id) EXPECT_NE(m["status"], "failed") << id << " " << m.dump();
}

TEST_F(ModelFormatsE2E, GgufAndBf16ModelsServeChat) {
  for (const char* model : {"chat-gguf", "chat-bf16"}) {
    SCOPED_TRACE(model);
    auto r = Post("/v1/chat/completions", Chat(model, false));
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200) << r->body;
    const json j = json::parse(r->body);
    EXPECT_EQ(j["object"], "chat.completion");
    EXPECT_EQ(j["model"], model);
    EXPECT_EQ(j["choices"][0]["message"]["role"], "assistant");
    EXPECT_TRUE(j["choices"][0]["message"]["content"].is_string());
    EXPECT_GT(j["usage"]["prompt_tokens"].get<int>(), 0);
    EXPECT_GT(j["usage"]["completion_tokens"].get<int>(), 0);

    auto s = Post("/v1/chat/completions", Chat(model, true));
    ASSERT_TRUE(s);
    ASSERT_EQ(s->status, 200) << s->body;
    EXPECT_NE(s->get_header_value("Content-Type").find("text/event-stream"), std::string::npos);
    EXPECT_NE(s->body.find("\"chat.completion.chunk\""), std::string::npos) << s->body;
    EXPECT_NE(s->body.find("data: [DONE]"), std::string::npos) << s->body;
  }
}

TEST_F(ModelFormatsE2E, GgufAndBf16ModelsServeEmbeddings) {
  for (const char* model : {"embed-gguf", "embed-bf16"}) {
    SCOPED_TRACE(model);
    auto r = Post("/v1/embeddings", {{"model", model}, {"input", {"hello world", "goodbye"}}});
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200) << r->body;
    const json j = json::parse(r->body);
    EXPECT_EQ(j["object"], "list");
    ASSERT_EQ(j["data"].size(), 2u);
    for (const json& d : j["data"]) {
      ASSERT_TRUE(d["embedding"].is_array());
      EXPECT_GT(d["embedding"].size(), 0u);
      double norm = 0;
      for (const json& v : d["embedding"]) norm += v.get<double>() * v.get<double>();
      EXPECT_NEAR(std::sqrt(norm), 1.0, 1e-3);
    }
    EXPECT_NE(j["data"][0]["embedding"], j["data"][1]["embedding"]);
  }
}

// The weights of each model, once loaded, are its stored tensors: within 2 %
// of the GGUF file / the bf16 safetensors file (plus the small f32 norm
// vectors), never the 2× of an f32 expansion.
TEST_F(ModelFormatsE2E, WeightsAreChargedAtTheirStoredSize) {
  ASSERT_EQ(Post("/v1/chat/completions", Chat("chat-gguf", false))->status, 200);
  ASSERT_EQ(Post("/v1/chat/completions", Chat("chat-bf16", false))->status, 200);
  ASSERT_EQ(Post("/v1/embeddings", {{"model", "embed-gguf"}, {"input", "x"}})->status, 200);
  const json status = Get("/admin/status");
  ASSERT_TRUE(status.is_object());
  const std::map<std::string, uintmax_t> stored = {
      {"chat-gguf", fs::file_size(dir_ + "/chat.gguf")},
      {"embed-gguf", fs::file_size(dir_ + "/embed.gguf")},
      {"chat-bf16", fs::file_size(dir_ + "/bf16/model.safetensors")}};
  size_t checked = 0;
  for (const json& m : status["models"]) {
    const auto it = stored.find(m["name"]);
    if (it == stored.end()) continue;
    ++checked;
    SCOPED_TRACE(it->first);
    const double weights = m["weight_bytes"].get<double>();
    const double file = static_cast<double>(it->second);
    EXPECT_GT(weights, 0.80 * file) << m.dump();
    EXPECT_LT(weights, 1.02 * file + 64 * 1024) << m.dump();  // + f32 norms and alignment
  }
  EXPECT_EQ(checked, stored.size());
}

}  // namespace
}  // namespace arbiter
