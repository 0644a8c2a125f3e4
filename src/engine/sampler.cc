// engine/sampler.cc — see sampler.h.
//
// Note [Partial sort for top-p]
// Sorting a 150k-entry vocabulary per token costs milliseconds. The nucleus
// usually holds few tokens, so FilterCandidates partially sorts a growing
// prefix (64, 256, 1024, ... entries) until that prefix already carries
// top_p of the mass; the result is identical to a full sort.
#include "arbiter/engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <string>

namespace arbiter {
namespace {

int32_t ArgMax(const float* logits, int n) {
  int32_t best = 0;
  for (int i = 1; i < n; ++i) {
    if (logits[i] > logits[best]) best = i;
  }
  return best;
}

bool MoreProbable(const TokenProb& a, const TokenProb& b) {
  return a.p > b.p || (a.p == b.p && a.id < b.id);
}

}  // namespace

Status ValidateSamplingParams(const SamplingParams& p) {
  if (!(p.temperature >= 0.0f) || !std::isfinite(p.temperature)) {
    return InvalidArgumentError("sampling: temperature " + std::to_string(p.temperature) +
                                " must be a finite number ≥ 0 (0 = greedy)");
  }
  if (!(p.top_p > 0.0f && p.top_p <= 1.0f)) {
    return InvalidArgumentError("sampling: top_p " + std::to_string(p.top_p) +
                                " must be in (0, 1]");
  }
  if (p.top_k < 0) {
    return InvalidArgumentError("sampling: top_k " + std::to_string(p.top_k) +
                                " must be ≥ 0 (0 = off)");
  }
  if (!(p.min_p >= 0.0f && p.min_p <= 1.0f)) {
    return InvalidArgumentError("sampling: min_p " + std::to_string(p.min_p) +
                                " must be in [0, 1] (0 = off)");
  }
  if (!(p.presence_penalty >= -2.0f && p.presence_penalty <= 2.0f)) {
    return InvalidArgumentError("sampling: presence_penalty " +
                                std::to_string(p.presence_penalty) + " must be in [-2, 2]");
  }
  if (!(p.frequency_penalty >= -2.0f && p.frequency_penalty <= 2.0f)) {
    return InvalidArgumentError("sampling: frequency_penalty " +
                                std::to_string(p.frequency_penalty) + " must be in [-2, 2]");
  }
  if (!(p.repetition_penalty > 0.0f) || !std::isfinite(p.repetition_penalty)) {
    return InvalidArgumentError("sampling: repetition_penalty " +
                                std::to_string(p.repetition_penalty) +
                                " must be a finite number > 0 (1 = off)");
  }
  for (const auto& [id, bias] : p.logit_bias) {
    if (!(bias >= -100.0f && bias <= 100.0f)) {
      return InvalidArgumentError("sampling: logit_bias of token " + std::to_string(id) + " is " +
                                  std::to_string(bias) + "; it must be in [-100, 100]");
    }
  }
  return OkStatus();
}

std::vector<TokenProb> FilterCandidates(const float* logits, int n, const SamplingParams& params) {
  if (params.temperature <= 0.0f) return {TokenProb{ArgMax(logits, n), 1.0f}};

  // Softmax at temperature over the whole vocabulary (in double for the sum).
  const float max_logit = logits[ArgMax(logits, n)];
  const double inv_t = 1.0 / params.temperature;
  std::vector<TokenProb> c(n);
  double total = 0;
  for (int i = 0; i < n; ++i) {
    const double e = std::exp((static_cast<double>(logits[i]) - max_logit) * inv_t);
    c[i] = TokenProb{i, static_cast<float>(e)};
    total += e;
  }
  for (TokenProb& t : c) t.p = static_cast<float>(t.p / total);

  // Top-k.
  size_t keep = c.size();
  if (params.top_k > 0 && static_cast<size_t>(params.top_k) < keep) {
    keep = params.top_k;
    std::partial_sort(c.begin(), c.begin() + keep, c.end(), MoreProbable);
    c.resize(keep);
    double mass = 0;
    for (const TokenProb& t : c) mass += t.p;
    for (TokenProb& t : c) t.p = static_cast<float>(t.p / mass);
  }

  // Top-p (Note [Partial sort for top-p]). Sorted prefix grows until it
  // carries top_p of the mass.
  size_t sorted = 0;
  size_t cut = c.size();
  double before = 0;  // mass of c[0, i)
  size_t i = 0;
  for (size_t chunk = 64;; chunk *= 4) {
    const size_t want = std::min(chunk, c.size());
    if (want > sorted) {
      std::partial_sort(c.begin() + sorted, c.begin() + want, c.end(), MoreProbable);
      sorted = want;
    }
    for (; i < sorted; ++i) {
      if (i > 0 && params.top_p < 1.0f && before >= params.top_p) break;
      before += c[i].p;
    }
    if (i < sorted || sorted == c.size()) {
      cut = i;
      break;
    }
  }
  c.resize(cut);
  // Min-p: c is sorted now; drop the tail below min_p × the top probability
  // (the top token always survives).
  if (params.min_p > 0.0f && !c.empty()) {
    const float floor_p = params.min_p * c.front().p;
    size_t keep_n = 1;
    while (keep_n < c.size() && c[keep_n].p >= floor_p) ++keep_n;
    c.resize(keep_n);
  }
  double mass = 0;
  for (const TokenProb& t : c) mass += t.p;
  for (TokenProb& t : c) t.p = static_cast<float>(t.p / mass);
  return c;
}

Sampler::Sampler(const SamplingParams& params) : params_(params) {
  if (params.has_seed) {
    seed_ = params.seed;
  } else {
    std::random_device rd;
    seed_ = (static_cast<uint64_t>(rd()) << 32) ^ rd();
  }
  rng_.seed(seed_);
}

double Sampler::Uniform() { return static_cast<double>(rng_() >> 11) * 0x1.0p-53; }

int32_t Sampler::Sample(const float* logits, int n) {
  if (params_.temperature <= 0.0f) return ArgMax(logits, n);
  const double u = Uniform();
  if (params_.top_k == 0 && params_.top_p >= 1.0f && params_.min_p <= 0.0f) {
    // Full distribution: no sort needed; walk ids in order.
    const float max_logit = logits[ArgMax(logits, n)];
    const double inv_t = 1.0 / params_.temperature;
    probs_.resize(n);
    double total = 0;
    for (int i = 0; i < n; ++i) {
      probs_[i] = static_cast<float>(std::exp((static_cast<double>(logits[i]) - max_logit) * inv_t));
      total += probs_[i];
    }
    double target = u * total, acc = 0;
    for (int i = 0; i < n; ++i) {
      acc += probs_[i];
      if (acc > target) return i;
    }
    return ArgMax(logits, n);  // rounding at the very end
  }
  const std::vector<TokenProb> c = FilterCandidates(logits, n, params_);
  double acc = 0;
  for (const TokenProb& t : c) {
    acc += t.p;
    if (acc > u) return t.id;
  }
  return c.back().id;  // reached only through rounding: u < 1 = Σp
}

void ApplyLogitAdjustments(const SamplingParams& params, std::span<const uint8_t> seen,
                           std::span<const int32_t> output_counts, float* logits, int n) {
  for (const auto& [id, bias] : params.logit_bias) {
    if (id >= 0 && id < n) logits[id] += bias;
  }
  if (params.repetition_penalty != 1.0f && static_cast<int>(seen.size()) == n) {
    const float r = params.repetition_penalty;
    for (int i = 0; i < n; ++i) {
      if (seen[i]) logits[i] = logits[i] > 0 ? logits[i] / r : logits[i] * r;
    }
  }
  if ((params.presence_penalty != 0.0f || params.frequency_penalty != 0.0f) &&
      static_cast<int>(output_counts.size()) == n) {
    for (int i = 0; i < n; ++i) {
      if (output_counts[i] > 0) {
        logits[i] -= params.presence_penalty +
                     params.frequency_penalty * static_cast<float>(output_counts[i]);
      }
    }
  }
}

TokenLogprob LogprobOf(const float* logits, int n, int32_t token, int top_n) {
  const float max_logit = logits[ArgMax(logits, n)];
  double total = 0;
  for (int i = 0; i < n; ++i) total += std::exp(static_cast<double>(logits[i]) - max_logit);
  const double log_z = max_logit + std::log(total);
  TokenLogprob out;
  out.id = token;
  out.logprob = static_cast<float>(logits[token] - log_z);
  if (top_n > 0) {
    std::vector<int32_t> ids(n);
    for (int i = 0; i < n; ++i) ids[i] = i;
    const int k = std::min(top_n, n);
    std::partial_sort(ids.begin(), ids.begin() + k, ids.end(), [&](int32_t a, int32_t b) {
      return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
    });
    for (int i = 0; i < k; ++i) {
      out.top.emplace_back(ids[i], static_cast<float>(logits[ids[i]] - log_z));
    }
  }
  return out;
}

}  // namespace arbiter
