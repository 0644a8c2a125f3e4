// End-to-end: the KV precache behind the real `arbiter serve` over HTTP
// (the reference's figures: docs/kv-precache.md "Targets").
//
// The model is the "tiny" preset with max_position_embeddings raised to 8192
// (only the RoPE table grows), so a 4k-token system prompt fits and every
// test stays fast; the tokens are real computation all the same.
//
//   - after POST /admin/prewarm of a 4k-token system prompt, the first turn
//     reads ≥ 4000 cached tokens and computes < 50; a [[models]]
//     system_prompt is prefilled at load and a new conversation gets it by a
//     slot copy;
//   - 50 turns of one conversation: hit rate ≥ 95 %, the same slot each turn;
//   - stop (SIGTERM) and restart: the next turn restores from disk;
//   - a corrupted KV file: the turn succeeds with 0 cached tokens, the file
//     is removed;
//   - more conversations than slots: they come back from the host tier;
//   - path-traversal and hostile conversation ids stay inside the KV dir.
// No wall-clock assertions: waits poll with deadlines that only turn a hang
// into a failure.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <thread>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <httplib.h>
#include <nlohmann/json.hpp>

#include "arbiter/engine/chat_template.h"
#include "arbiter/engine/tokenizer.h"
#include "tools/model_maker/model_maker.h"
#include "server_process.h"

namespace arbiter {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using ::arbiter::testing::FreeLoopbackPort;
using ::arbiter::testing::ReadAll;
using Proc = ::arbiter::testing::ServerProc;

constexpr auto kWait = std::chrono::seconds(120);

class KvE2E : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    char tmpl[] = "/tmp/arbiter-kv-e2e-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = new std::string(tmpl);
    const std::string model = *dir_ + "/chat";
    // A longer context for the 4k-token prefix.
    ASSERT_TRUE(::arbiter::testing::MakeTinyModelWithContext(model, 3, 8192).ok());
    // A system prompt of 4000–4400 tokens as the chat template renders it.
    Result<std::unique_ptr<Tokenizer>> tok = Tokenizer::Load(model + "/tokenizer.json");
    ASSERT_TRUE(tok.ok()) << tok.status().ToString();
    Result<ChatTemplateKind> kind = DetectChatTemplate(**tok);
    ASSERT_TRUE(kind.ok());
    std::string text = "You are a careful assistant.";
    const char* words[] = {" Answer", " briefly", " and", " cite", " the", " manual", " when",
                           " asked", " about", " memory", " budgets", " or", " slots."};
    size_t n = 0;
    for (int i = 0; n < 4000; ++i) {
      text += words[i % 13];
      if (i % 50 == 49) {
        n = EncodeChat(**tok, *kind, {{"system", text}}, false).size();
      }
    }
    system_prompt_ = new std::string(text);
    system_tokens_ = static_cast<int>(n);
    ASSERT_GE(system_tokens_, 4000);
    ASSERT_LE(system_tokens_, 4400);
  }
  static void TearDownTestSuite() {
    std::error_code ec;
    fs::remove_all(*dir_, ec);
    delete dir_;
    delete system_prompt_;
  }

  void SetUp() override {
    state_ = *dir_ + "/state-" + std::to_string(counter_++);
    fs::create_directories(state_);
  }
  void TearDown() override {
    for (Proc& p : procs_) {
      if (HasFailure()) std::cerr << "---- " << p.log << " ----\n" << ReadAll(p.log) << "\n";
      Kill(p, SIGKILL);
    }
  }

  // The config of a server on `port`; `chat` adds lines to the model table.
  std::string Config(int port, const std::string& kv, const std::string& chat) const {
    std::ostringstream c;
    c << "[server]\nport = " << port << "\n"
      << "[memory]\nbudget = \"2GiB\"\n"
      << "[pressure]\nsource = \"none\"\n"
      << "[kv]\ndir = \"" << state_ << "/kv\"\n"
      << kv << "\n"
      << "[[models]]\nname = \"chat\"\npath = \"" << *dir_ << "/chat\"\nctx = 8192\nparallel = 2\n"
      << chat << "\n";
    return c.str();
  }

  Proc Start(const std::string& kv = "", const std::string& chat = "") {
    Proc p;
    p.port = FreeLoopbackPort();
    const std::string base = state_ + "/server-" + std::to_string(procs_.size());
    std::ofstream(base + ".toml") << Config(p.port, kv, chat);
    p.log = base + ".log";
    std::string error;
    p.pid = ::arbiter::testing::StartServer(ARBITER_BINARY, base + ".toml", state_, p.log, p.port,
                                            kWait, &error);
    EXPECT_GT(p.pid, 0) << error;
    procs_.push_back(p);
    return p;
  }
  // SIGTERM and wait: the server persists its conversations on the way out.
  static void Stop(Proc& p) {
    ASSERT_GT(p.pid, 0);
    kill(p.pid, SIGTERM);
    int status = 0;
    waitpid(p.pid, &status, 0);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << ReadAll(p.log);
    p.pid = -1;
  }
  static void Kill(Proc& p, int sig) { ::arbiter::testing::KillServer(p, sig); }

  static httplib::Result Post(const Proc& p, const std::string& path, const json& body) {
    httplib::Client cli("127.0.0.1", p.port);
    cli.set_read_timeout(300, 0);
    return cli.Post(path.c_str(), body.dump(), "application/json");
  }
  static json Get(const Proc& p, const std::string& path) {
    httplib::Client cli("127.0.0.1", p.port);
    auto r = cli.Get(path.c_str());
    EXPECT_TRUE(r && r->status == 200) << path;
    return r ? json::parse(r->body, nullptr, false) : json();
  }

  struct Turn {
    int status = 0;
    int prompt_tokens = 0;
    int cached_tokens = 0;
    std::string slot;
    std::string source;
    std::string text;
  };
  static Turn Chat(const Proc& p, const std::string& conversation, const json& messages,
                   int max_tokens = 8) {
    json body = {{"model", "chat"},
                 {"messages", messages},
                 {"max_tokens", max_tokens},
                 {"temperature", 0}};
    if (!conversation.empty()) body["conversation_id"] = conversation;
    auto r = Post(p, "/v1/chat/completions", body);
    Turn t;
    if (!r) return t;
    t.status = r->status;
    if (r->status != 200) {
      ADD_FAILURE() << r->status << " " << r->body;
      return t;
    }
    json j = json::parse(r->body);
    t.prompt_tokens = j["usage"]["prompt_tokens"].get<int>();
    t.cached_tokens = j["usage"]["prompt_tokens_details"]["cached_tokens"].get<int>();
    t.text = j["choices"][0]["message"]["content"].get<std::string>();
    t.slot = r->get_header_value("X-Arbiter-Kv-Slot");
    t.source = r->get_header_value("X-Arbiter-Kv-Source");
    return t;
  }
  static json Sys() { return {{"role", "system"}, {"content", *system_prompt_}}; }
  static json User(const std::string& s) { return {{"role", "user"}, {"content", s}}; }

  // Every regular file under the state dir, relative to it.
  std::vector<std::string> FilesUnder(const std::string& root) const {
    std::vector<std::string> out;
    for (const auto& e : fs::recursive_directory_iterator(root)) {
      if (e.is_regular_file()) out.push_back(fs::relative(e.path(), root).string());
    }
    return out;
  }
  std::vector<fs::path> KvFiles() const {
    std::vector<fs::path> out;
    std::error_code ec;
    for (const auto& e : fs::recursive_directory_iterator(state_ + "/kv", ec)) {
      if (e.is_regular_file() && e.path().extension() == ".bin") out.push_back(e.path());
    }
    return out;
  }

  static std::string* dir_;
  static std::string* system_prompt_;
  static int system_tokens_;
  static int counter_;
  std::string state_;
  std::vector<Proc> procs_;
};
std::string* KvE2E::dir_ = nullptr;
std::string* KvE2E::system_prompt_ = nullptr;
int KvE2E::system_tokens_ = 0;
int KvE2E::counter_ = 0;

TEST_F(KvE2E, AfterPrewarmTheFirstTurnComputesOnlyTheUserTokens) {
  Proc p = Start();
  auto r = Post(p, "/admin/prewarm",
                {{"model", "chat"}, {"conversation_id", "room-1"}, {"messages", json::array({Sys()})}});
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  json w = json::parse(r->body);
  EXPECT_EQ(w["prefix_tokens"].get<int>(), system_tokens_);
  EXPECT_EQ(w["computed_tokens"].get<int>(), system_tokens_);
  Turn t = Chat(p, "room-1", {Sys(), User("What is a slot?")});
  ASSERT_EQ(t.status, 200);
  EXPECT_GE(t.cached_tokens, 4000);
  EXPECT_LT(t.prompt_tokens - t.cached_tokens, 50);
  EXPECT_EQ(t.slot, std::to_string(w["slot"].get<int>()));
  // Bad prewarms are reported, not retried.
  r = Post(p, "/admin/prewarm", {{"model", "chat"}, {"messages", json::array({Sys()})}});
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400);
  r = Post(p, "/admin/prewarm",
           {{"model", "nope"}, {"conversation_id", "x"}, {"prompt", "hello"}});
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 404);
  r = Post(p, "/admin/prewarm",
           {{"model", "chat"}, {"conversation_id", "x"}, {"prompt", "a"}, {"messages", json::array({Sys()})}});
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400);
}

TEST_F(KvE2E, TheConfiguredSystemPromptIsPrefilledAtLoadAndCopiedToNewConversations) {
  json chat_line = "system_prompt = " + json(*system_prompt_).dump();
  Proc p = Start("", chat_line.get<std::string>());
  // The first request loads the model; the load prefills __system_prefix__.
  Turn t = Chat(p, "new-room", {Sys(), User("hello")});
  ASSERT_EQ(t.status, 200);
  EXPECT_GE(t.cached_tokens, 4000);
  EXPECT_LT(t.prompt_tokens - t.cached_tokens, 50);
  json kv = Get(p, "/admin/kv");
  const json& m = kv["models"][0];
  bool system_prefix_seen = false;
  for (const json& s : m["slots"]) {
    if (s["conversation_id"] == "__system_prefix__") system_prefix_seen = true;
  }
  EXPECT_TRUE(system_prefix_seen) << kv.dump(2);
  EXPECT_GE(m["counters"]["copied_tokens"].get<int>(), 4000) << kv.dump(2);
}

TEST_F(KvE2E, FiftyTurnsHitTheCacheOnTheSameSlot) {
  Proc p = Start();
  ASSERT_EQ(Post(p, "/admin/prewarm",
                 {{"model", "chat"}, {"conversation_id", "long-chat"}, {"messages", json::array({Sys()})}})
                ->status,
            200);
  json messages = {Sys()};
  std::string slot;
  int hits = 0;
  int64_t prompt = 0, cached = 0;
  for (int turn = 0; turn < 50; ++turn) {
    messages.push_back(User("Question number " + std::to_string(turn) + "?"));
    Turn t = Chat(p, "long-chat", messages, 4);
    ASSERT_EQ(t.status, 200) << "turn " << turn;
    if (turn == 0) slot = t.slot;
    EXPECT_EQ(t.slot, slot) << "turn " << turn;
    hits += t.cached_tokens > 0;
    prompt += t.prompt_tokens;
    cached += t.cached_tokens;
    messages.push_back({{"role", "assistant"}, {"content", t.text}});
  }
  EXPECT_GE(hits, 48);  // ≥ 95 % of 50 turns
  EXPECT_GE(static_cast<double>(cached) / static_cast<double>(prompt), 0.95)
      << cached << " / " << prompt;
  // The metrics agree.
  httplib::Client cli("127.0.0.1", p.port);
  auto m = cli.Get("/metrics");
  ASSERT_TRUE(m);
  EXPECT_NE(m->body.find("arbiter_kv_prompt_tokens_total{kind=\"cached\",model=\"chat\"}"),
            std::string::npos)
      << m->body;
  EXPECT_NE(m->body.find("arbiter_kv_tier_hits_total{model=\"chat\",tier=\"slot\"}"),
            std::string::npos);
}

TEST_F(KvE2E, AConversationSurvivesARestartAndACorruptFileCostsAColdPrefill) {
  Proc p = Start();
  const json first = json::array({User("Remember the number 42 and the colour blue, please.")});
  Turn t1 = Chat(p, "persist-me", first);
  ASSERT_EQ(t1.status, 200);
  Turn other = Chat(p, "corrupt-me", json::array({User("This one will be damaged on disk.")}));
  ASSERT_EQ(other.status, 200);
  Stop(p);
  std::vector<fs::path> files = KvFiles();
  ASSERT_EQ(files.size(), 2u);
  for (const fs::path& f : files) {
    EXPECT_EQ(f.filename().string().find(".short.bin"), f.filename().string().size() - 10) << f;
  }
  // Damage one file in the middle of its K/V.
  fs::path victim;
  for (const fs::path& f : files) {
    if (f.filename().string().rfind("corrupt-me.", 0) == 0) victim = f;
  }
  ASSERT_FALSE(victim.empty());
  {
    std::fstream f(victim, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(fs::file_size(victim) / 2));
    f.put('\x55');
    f.put('\xaa');
  }

  Proc q = Start();
  // The damaged conversation first, while the new engine's slots are empty
  // (so no slot can lend it a prefix): a cold prefill, not an error.
  Turn t3 = Chat(q, "corrupt-me",
                 {User("This one will be damaged on disk."),
                  {{"role", "assistant"}, {"content", other.text}}, User("Still there?")});
  ASSERT_EQ(t3.status, 200);
  EXPECT_EQ(t3.cached_tokens, 0);
  json second = first;
  second.push_back({{"role", "assistant"}, {"content", t1.text}});
  second.push_back(User("What was the number?"));
  Turn t2 = Chat(q, "persist-me", second);
  ASSERT_EQ(t2.status, 200);
  EXPECT_GT(t2.cached_tokens, 0);
  EXPECT_EQ(t2.source, "disk");
  EXPECT_FALSE(fs::exists(victim));
  EXPECT_NE(ReadAll(q.log).find("corrupt-me"), std::string::npos);
  json kv = Get(q, "/admin/kv");
  EXPECT_EQ(kv["models"][0]["counters"]["disk_hits"], 1) << kv.dump(2);
  EXPECT_EQ(kv["models"][0]["counters"]["restore_failures"], 1) << kv.dump(2);
}

TEST_F(KvE2E, MoreConversationsThanSlotsComeBackFromTheHostTier) {
  Proc p = Start();
  constexpr int kConversations = 5;  // on 2 slots
  std::vector<json> history(kConversations);
  for (int c = 0; c < kConversations; ++c) {
    history[c] = json::array({User("Conversation " + std::to_string(c) +
                                   " starts with a fairly long opening message so that its KV is "
                                   "worth keeping around.")});
    Turn t = Chat(p, "conv-" + std::to_string(c), history[c]);
    ASSERT_EQ(t.status, 200);
    history[c].push_back({{"role", "assistant"}, {"content", t.text}});
  }
  json kv = Get(p, "/admin/kv");
  EXPECT_GE(kv["prompt_cache"]["entries"].size(), 3u) << kv.dump(2);
  int from_host = 0;
  for (int c = 0; c < kConversations; ++c) {
    history[c].push_back(User("And then?"));
    Turn t = Chat(p, "conv-" + std::to_string(c), history[c]);
    ASSERT_EQ(t.status, 200);
    EXPECT_GT(t.cached_tokens, 20) << "conversation " << c << " source " << t.source;
    from_host += t.source == "prompt_cache";
  }
  EXPECT_GE(from_host, 3);
  kv = Get(p, "/admin/kv");
  EXPECT_GE(kv["models"][0]["counters"]["prompt_cache_hits"].get<int>(), 3) << kv.dump(2);
  EXPECT_GE(kv["models"][0]["counters"]["stashes"].get<int>(), 3);
}

TEST_F(KvE2E, HostileConversationIdsStayInsideTheKvDirectory) {
  Proc p = Start();
  const std::vector<std::string> ids = {"../../x", "/", "a/b", "..", std::string("nul\0id", 6),
                                        std::string(3000, 'z'), "-rf", "h-fake"};
  for (const std::string& id : ids) {
    Turn t = Chat(p, id, json::array({User("hi")}));
    ASSERT_EQ(t.status, 200) << id.size();
  }
  // Close one through the admin API (percent-encoded path) and check 404s.
  httplib::Client cli("127.0.0.1", p.port);
  auto r = cli.Post("/admin/conversations/..%2F..%2Fx/close", "", "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200) << r->body;
  r = cli.Post("/admin/conversations/never-opened/close", "", "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 404);
  Stop(p);  // persists the rest
  const fs::path kv_dir = fs::path(state_) / "kv";
  std::vector<fs::path> files = KvFiles();
  EXPECT_EQ(files.size(), ids.size());
  for (const fs::path& f : files) {
    EXPECT_EQ(f.parent_path().parent_path(), kv_dir) << f;
    EXPECT_LE(f.filename().string().size(), 64u + 14u) << f;
  }
  // Nothing escaped: the state dir holds only the KV tree, configs and logs.
  for (const std::string& rel : FilesUnder(state_)) {
    EXPECT_TRUE(rel.rfind("kv/", 0) == 0 || rel.rfind("server-", 0) == 0) << rel;
  }
  EXPECT_FALSE(fs::exists(fs::path(state_).parent_path() / "x"));
  EXPECT_FALSE(fs::exists(fs::path(state_) / "x"));
}

// The maintenance thread with short windows: an idle conversation is saved
// as .long and closed, a .short file is swept once its TTL passes, and a
// prewarmed conversation is re-warmed by the keep-alive before its short TTL
// runs out.
TEST_F(KvE2E, MaintenanceSavesIdleConversationsSweepsAndKeepsAlive) {
  Proc p = Start(
      "ttl_short = \"2s\"\nkeepalive_interval = \"300ms\"\neviction_interval = \"1s\"\n"
      "conversation_ttl = \"5s\"");
  ASSERT_EQ(Chat(p, "goes-idle", json::array({User("I will be quiet now.")})).status, 200);
  ASSERT_EQ(Chat(p, "short-lived", json::array({User("Close me soon.")})).status, 200);
  httplib::Client cli("127.0.0.1", p.port);
  auto r = cli.Post("/admin/conversations/short-lived/close?model=chat", "", "application/json");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  auto has_file = [&](const std::string& name) {
    for (const fs::path& f : KvFiles()) {
      if (f.filename() == name) return true;
    }
    return false;
  };
  EXPECT_TRUE(has_file("short-lived.short.bin"));
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  auto wait_for = [&](const std::function<bool()>& done) {
    while (!done() && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    return done();
  };
  EXPECT_TRUE(wait_for([&] { return has_file("goes-idle.long.bin"); }));
  EXPECT_TRUE(wait_for([&] { return !has_file("short-lived.short.bin"); }));
  EXPECT_TRUE(wait_for([&] { return Get(p, "/admin/kv")["files_swept"].get<int>() >= 1; }));
  // Keep-alive: prewarmed, then left alone for longer than the short TTL.
  ASSERT_EQ(Post(p, "/admin/prewarm",
                 {{"model", "chat"}, {"conversation_id", "kept"}, {"prompt", "stable prefix text"}})
                ->status,
            200);
  EXPECT_TRUE(wait_for([&] {
    return Get(p, "/admin/kv")["models"][0]["counters"]["keepalive_rewarms"].get<int>() >= 2;
  }));
  json kv = Get(p, "/admin/kv");
  for (const json& w : kv["models"][0]["prewarmed"]) {
    if (w["conversation_id"] == "kept") { EXPECT_LT(w["idle_ms"].get<int>(), 2000) << kv.dump(2); }
  }
}

}  // namespace
}  // namespace arbiter
