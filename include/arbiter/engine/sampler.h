// arbiter/engine/sampler.h — next-token sampling from logits.
//
// Pipeline (the order of Hugging Face's logits warpers):
//   temperature == 0  → greedy: the arg max (lowest id among ties);
//   otherwise         → softmax(logits / temperature), then top-k (keep the
//                       k most probable; 0 = off), then top-p (nucleus: keep
//                       the most probable tokens, in descending order, while
//                       the probability mass before each is < top_p; at least
//                       one token always survives), then min-p (drop
//                       tokens below min_p × the top probability),
//                       renormalize, draw one.
// Before that, Generate adjusts the logits (ApplyLogitAdjustments): logit
// bias, the repetition penalty, presence and frequency penalties, and the
// TokenConstraint's mask.
// Ties in probability are ordered by ascending id, so candidate sets are
// deterministic.
//
// Randomness: a std::mt19937_64 seeded with SamplingParams::seed when
// has_seed (same seed + same logits → same tokens, on every platform: the
// uniform draw is built from the raw 64-bit output, not from
// std::uniform_real_distribution), else from std::random_device.
//
// Usage:
//   Sampler sampler(request.sampling);
//   int32_t next = sampler.Sample(logits.data(), vocab_size);
//
// Thread safety: Sampler is thread-compatible (one per generation); the free
// functions are thread-safe.
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <vector>

#include "arbiter/base/status.h"
#include "arbiter/engine/engine.h"

namespace arbiter {

// kInvalidArgument unless temperature ≥ 0 (and finite), 0 < top_p ≤ 1,
// top_k ≥ 0, 0 ≤ min_p ≤ 1, presence and frequency penalties in [-2, 2],
// repetition_penalty > 0 and every logit bias in [-100, 100]; the message
// names the field and its value. (Token ids of logit_bias are checked
// against the vocabulary by Generate.)
Status ValidateSamplingParams(const SamplingParams& params);

// Adjusts `logits` [n_vocab] in place for one step, in this order: adds
// params.logit_bias; divides (positive) or multiplies (negative) the logit
// of every token in `seen` [n_vocab] (1 = in the prompt or the output) by
// repetition_penalty; subtracts presence_penalty × [count > 0] +
// frequency_penalty × count, with `output_counts` [n_vocab] the times each
// token was generated so far. Ids of logit_bias outside [0, n_vocab) are
// skipped. REQUIRES: `seen` and `output_counts` empty (penalty off) or
// [n_vocab].
void ApplyLogitAdjustments(const SamplingParams& params, std::span<const uint8_t> seen,
                           std::span<const int32_t> output_counts, float* logits, int n_vocab);

// log-softmax of `logits` [n_vocab] at temperature 1 (−inf entries stay
// −inf): the sampled token's logprob and the `top_n` most probable
// alternatives (ties by ascending id). REQUIRES: some logit is finite.
TokenLogprob LogprobOf(const float* logits, int n_vocab, int32_t token, int top_n);

struct TokenProb {
  int32_t id = 0;
  float p = 0;  // probability after filtering and renormalization
};

// The tokens that survive temperature + top-k + top-p for `logits`
// [n_vocab], most probable first, probabilities summing to 1. For
// temperature 0, the single arg max with p = 1.
// REQUIRES: n_vocab ≥ 1; ValidateSamplingParams(params).ok().
std::vector<TokenProb> FilterCandidates(const float* logits, int n_vocab,
                                        const SamplingParams& params);

class Sampler {
 public:
  // REQUIRES: ValidateSamplingParams(params).ok().
  explicit Sampler(const SamplingParams& params);

  // Picks the next token id from `logits` [n_vocab] (unnormalized, f32).
  // REQUIRES: n_vocab ≥ 1.
  int32_t Sample(const float* logits, int n_vocab);

  // The seed in use (the request's, or the one drawn from random_device).
  uint64_t seed() const { return seed_; }

 private:
  // Uniform in [0, 1) from the top 53 bits of one draw.
  double Uniform();

  SamplingParams params_;
  uint64_t seed_ = 0;
  std::mt19937_64 rng_;
  std::vector<float> probs_;  // scratch [n_vocab] for the unfiltered path
};

}  // namespace arbiter
