// tools/model_maker/bpe_trainer.h — trains a byte-level BPE tokenizer and
// writes it as a Hugging Face tokenizer.json.
//
// Algorithm (the classic one of GPT-2 / HF BpeTrainer):
//   1. Pre-tokenize the corpus with `split_regex` (PCRE2, UTF + UCP; matches
//      and the gaps between them are words, HF Split "Isolated") and count
//      each distinct word.
//   2. Start from 256 single-byte symbols (id = byte value) and count every
//      adjacent symbol pair, weighted by word count.
//   3. Repeatedly merge the most frequent pair into a new symbol. Ties are
//      broken by the pair's byte strings, lexicographically smallest first
//      (left token, then right token), so results are identical on every
//      machine. Pair counts are updated incrementally: only the words holding
//      the merged pair are rewritten, and a lazy max-heap revalidates counts
//      when popped. Stops after `num_merges` merges or when the best pair
//      occurs fewer than `min_pair_count` times.
// A merge whose result equals an existing token string reuses that token's id
// (as HF does), so vocab size ≤ 256 + merges.
//
// The tokenizer.json it writes: model BPE (vocab in ByteLevel alphabet,
// merges "a b"), added_tokens for the special tokens (ids after the vocab),
// normalizer null, pre_tokenizer Sequence[Split(regex, Isolated),
// ByteLevel(add_prefix_space=false, use_regex=false)], decoder ByteLevel.
// Both arbiter's Tokenizer and HF `tokenizers` load it.
//
// Its speed on the default corpus is in docs/BENCHMARKS.md "Tools".
//
// Thread safety: pure functions (no shared state).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "arbiter/base/status.h"

namespace arbiter {

// The Qwen2 / Llama-3 style pre-tokenizer regex (digits split one by one).
extern const char kDefaultBpeSplitRegex[];
// Where DefaultTrainingCorpus() reads (Debian's base-files package).
extern const char kDefaultTrainingCorpusDir[];

struct BpeTrainerOptions {
  int num_merges = 2000;                        // merges to learn (upper bound)
  std::string split_regex = kDefaultBpeSplitRegex;
  std::vector<std::string> special_tokens;      // become added_tokens, in order
  int64_t min_pair_count = 2;                   // stop when the best pair is rarer
};

struct TrainedBpe {
  // Raw byte strings of the model's tokens; id = index. vocab[b] is the single
  // byte b for b < 256.
  std::vector<std::string> vocab;
  // Merges in rank order, as ids into `vocab` (left, right).
  std::vector<std::pair<int32_t, int32_t>> merges;
  // Special tokens; the i-th has id vocab.size() + i.
  std::vector<std::string> special_tokens;
  std::string split_regex;

  // vocab.size() + special_tokens.size().
  int vocab_size() const { return static_cast<int>(vocab.size() + special_tokens.size()); }
  // Id of a special token; -1 when absent.
  int32_t SpecialTokenId(std::string_view token) const;
  // The tokenizer.json text (see the file comment). Deterministic.
  std::string ToTokenizerJson() const;
};

// Trains on `corpus` (any bytes; invalid UTF-8 is not an error).
// Errors: kInvalidArgument when the regex does not compile, num_merges < 0,
// or a special token is empty or duplicated.
Result<TrainedBpe> TrainBpe(std::string_view corpus, const BpeTrainerOptions& options);

// Concatenates the regular files directly under `dir` (sorted by name;
// symlinks skipped, since they duplicate other files there), separated by
// "\n". kNotFound when `dir` is missing or holds no file, with a message
// saying which corpus is expected.
Result<std::string> DefaultTrainingCorpus(const std::string& dir = kDefaultTrainingCorpusDir);

}  // namespace arbiter
