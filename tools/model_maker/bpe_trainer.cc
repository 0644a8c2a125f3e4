// Byte-level BPE trainer (see bpe_trainer.h for the algorithm).
//
// Note [Incremental pair counts]
// `pair_count` holds, for every adjacent pair, Σ word_count over its
// occurrences; `pair_words` lists the words that held the pair when it was
// last touched (it may hold stale or repeated entries; a per-word stamp
// deduplicates and the rewrite checks the word itself). Merging (a, b)
// rewrites only those words: their old pairs are subtracted and their new
// pairs added, so each merge costs O(total length of the affected words).
// Pairs that do not involve the new symbol can only lose counts, so the heap
// stays correct lazily: a popped entry whose count is stale is re-pushed
// with the current count; pairs involving the new symbol are pushed fresh.
#include "tools/model_maker/bpe_trainer.h"

#include <dirent.h>
#include <sys/stat.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <queue>
#include <unordered_map>
#include <unordered_set>

#include "arbiter/base/file.h"
#include "engine/internal/byte_level.h"
#include "engine/internal/pcre2_regex.h"

namespace arbiter {

const char kDefaultBpeSplitRegex[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| "
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
const char kDefaultTrainingCorpusDir[] = "/usr/share/common-licenses";

namespace {

inline uint64_t PairKey(int32_t a, int32_t b) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
}
inline int32_t PairLeft(uint64_t k) { return static_cast<int32_t>(k >> 32); }
inline int32_t PairRight(uint64_t k) { return static_cast<int32_t>(k & 0xFFFFFFFFu); }

struct HeapEntry {
  int64_t count;
  uint64_t pair;
};

}  // namespace

int32_t TrainedBpe::SpecialTokenId(std::string_view token) const {
  for (size_t i = 0; i < special_tokens.size(); ++i) {
    if (special_tokens[i] == token) return static_cast<int32_t>(vocab.size() + i);
  }
  return -1;
}

Result<TrainedBpe> TrainBpe(std::string_view corpus, const BpeTrainerOptions& options) {
  if (options.num_merges < 0) return InvalidArgumentError("TrainBpe: num_merges must be >= 0");
  {
    std::unordered_set<std::string> seen;
    for (const auto& s : options.special_tokens) {
      if (s.empty()) return InvalidArgumentError("TrainBpe: a special token is empty");
      if (!seen.insert(s).second) {
        return InvalidArgumentError("TrainBpe: special token \"" + s + "\" is listed twice");
      }
    }
  }
  auto re = internal::Pcre2Regex::Compile(options.split_regex);
  if (!re.ok()) return re.status().WithPrefix("TrainBpe: split_regex");

  // 1. Words and their counts.
  std::unordered_map<std::string_view, int64_t> word_counts;
  {
    std::vector<std::pair<size_t, size_t>> spans;
    (*re)->SplitIsolated(corpus, &spans);
    word_counts.reserve(spans.size() / 4 + 16);
    for (auto [b, e] : spans) ++word_counts[corpus.substr(b, e - b)];
  }
  std::vector<std::pair<std::string_view, int64_t>> sorted(word_counts.begin(), word_counts.end());
  std::sort(sorted.begin(), sorted.end());  // deterministic word order
  std::vector<std::vector<int32_t>> words(sorted.size());
  std::vector<int64_t> counts(sorted.size());
  for (size_t w = 0; w < sorted.size(); ++w) {
    counts[w] = sorted[w].second;
    for (unsigned char c : sorted[w].first) words[w].push_back(c);
  }

  TrainedBpe out;
  out.split_regex = options.split_regex;
  out.special_tokens = options.special_tokens;
  out.vocab.reserve(256 + options.num_merges);
  std::unordered_map<std::string, int32_t> token_ids;
  for (int b = 0; b < 256; ++b) {
    out.vocab.emplace_back(1, static_cast<char>(b));
    token_ids.emplace(out.vocab.back(), b);
  }

  // 2. Initial pair counts.
  std::unordered_map<uint64_t, int64_t> pair_count;
  std::unordered_map<uint64_t, std::vector<int32_t>> pair_words;
  for (size_t w = 0; w < words.size(); ++w) {
    const auto& s = words[w];
    for (size_t i = 0; i + 1 < s.size(); ++i) {
      uint64_t k = PairKey(s[i], s[i + 1]);
      pair_count[k] += counts[w];
      auto& list = pair_words[k];
      if (list.empty() || list.back() != static_cast<int32_t>(w)) list.push_back(w);
    }
  }
  const std::vector<std::string>& vocab = out.vocab;
  // Max-heap by count; ties: lexicographically smallest (left, right) first.
  auto less = [&vocab](const HeapEntry& x, const HeapEntry& y) {
    if (x.count != y.count) return x.count < y.count;
    const std::string& xl = vocab[PairLeft(x.pair)];
    const std::string& yl = vocab[PairLeft(y.pair)];
    int c = xl.compare(yl);
    if (c != 0) return c > 0;
    return vocab[PairRight(x.pair)] > vocab[PairRight(y.pair)];
  };
  std::priority_queue<HeapEntry, std::vector<HeapEntry>, decltype(less)> heap(less);
  for (const auto& [k, c] : pair_count) heap.push({c, k});

  // 3. Merge loop.
  std::vector<uint32_t> stamp(words.size(), 0);
  uint32_t merge_no = 0;
  std::vector<int32_t> rewritten;
  std::unordered_set<uint64_t> fresh;
  while (static_cast<int>(out.merges.size()) < options.num_merges && !heap.empty()) {
    HeapEntry top = heap.top();
    heap.pop();
    auto pc = pair_count.find(top.pair);
    int64_t current = pc == pair_count.end() ? 0 : pc->second;
    if (current != top.count) {
      if (current >= options.min_pair_count && current > 0) heap.push({current, top.pair});
      continue;
    }
    if (current < options.min_pair_count || current <= 0) break;
    const int32_t a = PairLeft(top.pair), b = PairRight(top.pair);
    std::string merged = vocab[a] + vocab[b];
    int32_t new_id;
    auto existing = token_ids.find(merged);
    if (existing != token_ids.end()) {
      new_id = existing->second;
    } else {
      new_id = static_cast<int32_t>(out.vocab.size());
      token_ids.emplace(merged, new_id);
      out.vocab.push_back(std::move(merged));
    }
    out.merges.emplace_back(a, b);
    ++merge_no;
    fresh.clear();
    std::vector<int32_t> affected = std::move(pair_words[top.pair]);
    pair_words.erase(top.pair);
    for (int32_t w : affected) {
      if (stamp[w] == merge_no) continue;
      stamp[w] = merge_no;
      std::vector<int32_t>& s = words[w];
      bool has = false;
      for (size_t i = 0; i + 1 < s.size(); ++i) {
        if (s[i] == a && s[i + 1] == b) {
          has = true;
          break;
        }
      }
      if (!has) continue;
      const int64_t c = counts[w];
      for (size_t i = 0; i + 1 < s.size(); ++i) {
        auto it = pair_count.find(PairKey(s[i], s[i + 1]));
        if ((it->second -= c) == 0) pair_count.erase(it);
      }
      rewritten.clear();
      for (size_t i = 0; i < s.size(); ++i) {
        if (i + 1 < s.size() && s[i] == a && s[i + 1] == b) {
          rewritten.push_back(new_id);
          ++i;
        } else {
          rewritten.push_back(s[i]);
        }
      }
      s.assign(rewritten.begin(), rewritten.end());
      for (size_t i = 0; i + 1 < s.size(); ++i) {
        uint64_t k = PairKey(s[i], s[i + 1]);
        pair_count[k] += c;
        if (s[i] == new_id || s[i + 1] == new_id) {
          fresh.insert(k);
          auto& list = pair_words[k];
          if (list.empty() || list.back() != w) list.push_back(w);
        }
      }
    }
    // Push in a fixed order so heap contents do not depend on hashing.
    std::vector<uint64_t> fresh_sorted(fresh.begin(), fresh.end());
    std::sort(fresh_sorted.begin(), fresh_sorted.end());
    for (uint64_t k : fresh_sorted) {
      auto it = pair_count.find(k);
      if (it != pair_count.end() && it->second >= options.min_pair_count) {
        heap.push({it->second, k});
      }
    }
  }
  return out;
}

std::string TrainedBpe::ToTokenizerJson() const {
  using OJson = nlohmann::ordered_json;
  OJson root;
  root["version"] = "1.0";
  root["truncation"] = nullptr;
  root["padding"] = nullptr;
  OJson added = OJson::array();
  for (size_t i = 0; i < special_tokens.size(); ++i) {
    OJson t;
    t["id"] = vocab.size() + i;
    t["content"] = special_tokens[i];
    t["single_word"] = false;
    t["lstrip"] = false;
    t["rstrip"] = false;
    t["normalized"] = false;
    t["special"] = true;
    added.push_back(std::move(t));
  }
  root["added_tokens"] = std::move(added);
  root["normalizer"] = nullptr;
  OJson split;
  split["type"] = "Split";
  split["pattern"] = OJson{{"Regex", split_regex}};
  split["behavior"] = "Isolated";
  split["invert"] = false;
  OJson byte_level;
  byte_level["type"] = "ByteLevel";
  byte_level["add_prefix_space"] = false;
  byte_level["trim_offsets"] = false;
  byte_level["use_regex"] = false;
  OJson pre;
  pre["type"] = "Sequence";
  pre["pretokenizers"] = OJson::array({split, byte_level});
  root["pre_tokenizer"] = std::move(pre);
  root["post_processor"] = nullptr;
  root["decoder"] = byte_level;
  OJson model;
  model["type"] = "BPE";
  model["dropout"] = nullptr;
  model["unk_token"] = nullptr;
  model["continuing_subword_prefix"] = nullptr;
  model["end_of_word_suffix"] = nullptr;
  model["fuse_unk"] = false;
  model["byte_fallback"] = false;
  model["ignore_merges"] = false;
  OJson v = OJson::object();
  for (size_t i = 0; i < vocab.size(); ++i) v[internal::BytesToByteLevel(vocab[i])] = i;
  model["vocab"] = std::move(v);
  OJson m = OJson::array();
  for (const auto& [l, r] : merges) {
    m.push_back(internal::BytesToByteLevel(vocab[l]) + " " + internal::BytesToByteLevel(vocab[r]));
  }
  model["merges"] = std::move(m);
  root["model"] = std::move(model);
  return root.dump(1) + "\n";
}

Result<std::string> DefaultTrainingCorpus(const std::string& dir) {
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) {
    return NotFoundError("training corpus directory " + dir +
                         " is missing; make-model trains its tokenizer on the license texts "
                         "Debian installs there (package base-files)");
  }
  std::vector<std::string> names;
  while (dirent* e = ::readdir(d)) {
    std::string n = e->d_name;
    if (n == "." || n == "..") continue;
    names.push_back(std::move(n));
  }
  ::closedir(d);
  std::sort(names.begin(), names.end());
  std::string corpus;
  for (const std::string& n : names) {
    std::string path = dir + "/" + n;
    struct stat st;
    if (::lstat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) continue;  // symlinks, dirs
    ARBITER_ASSIGN_OR_RETURN(std::string text, ReadFile(path, size_t{64} << 20));
    corpus += text;
    corpus += "\n";
  }
  if (corpus.empty()) {
    return NotFoundError("training corpus directory " + dir +
                         " holds no regular file; make-model needs Debian's license texts there");
  }
  return corpus;
}

}  // namespace arbiter
