// bench/grammar_bench.cc — see grammar_bench.h for the method.
#include "bench/grammar_bench.h"

#include <cblas.h>

#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <thread>
#include <vector>

#include "arbiter/engine/engine.h"
#include "arbiter/engine/grammar.h"
#include "arbiter/engine/json_schema.h"
#include "arbiter/engine/tokenizer.h"

namespace arbiter {
namespace {

constexpr char kSchema[] =
    R"({"type":"object","properties":{"city":{"type":"string"},"days":{"type":"integer"},)"
    R"("tags":{"type":"array","items":{"type":"string"},"maxItems":3}},"required":["city","days"],)"
    R"("additionalProperties":false})";

// FillAllowed on a fresh constraint each time: no transition cached yet.
Result<SampleSummary> TimeColdMask(const std::shared_ptr<const Grammar>& g,
                                   const std::shared_ptr<const GrammarVocabulary>& vocab, std::string_view prefix,
                                   int iterations) {
  std::vector<uint8_t> allowed(vocab->size());
  std::vector<double> us;
  for (int i = 0; i < iterations; ++i) {
    GrammarConstraint c(g, vocab);
    ARBITER_RETURN_IF_ERROR(c.AcceptBytes(prefix));
    std::fill(allowed.begin(), allowed.end(), uint8_t{0});
    const double t0 = NowSeconds();
    c.FillAllowed(1 << 20, allowed);
    us.push_back(MsSince(t0) * 1e3);
  }
  return Summarize(us);
}

Result<SampleSummary> TimeMask(const std::shared_ptr<const Grammar>& g,
                               const std::shared_ptr<const GrammarVocabulary>& vocab, std::string_view prefix,
                               int tokens_left, int iterations, int* allowed_count) {
  GrammarConstraint c(g, vocab);
  ARBITER_RETURN_IF_ERROR(c.AcceptBytes(prefix));
  std::vector<uint8_t> allowed(vocab->size());
  std::vector<double> us;
  for (int i = 0; i < iterations; ++i) {
    std::fill(allowed.begin(), allowed.end(), uint8_t{0});
    const double t0 = NowSeconds();
    c.FillAllowed(tokens_left, allowed);
    us.push_back(MsSince(t0) * 1e3);
  }
  *allowed_count = static_cast<int>(std::count(allowed.begin(), allowed.end(), uint8_t{1}));
  return Summarize(us);
}

}  // namespace

Result<GrammarBenchResult> RunGrammarBench(const GrammarBenchOptions& o) {
  if (o.iterations < 1 || o.gen_tokens < 1 || o.repetitions < 1 || o.threads < 0) {
    return InvalidArgumentError("bench grammar: iterations, gen_tokens and repetitions must be ≥ 1");
  }
  GrammarBenchResult r;
  r.model_dir = o.model_dir;
  r.tokenizer_path = o.tokenizer_path;
  r.n_threads = o.threads > 0 ? o.threads : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  r.load_average_start = LoadAverage1();
  openblas_set_num_threads(r.n_threads);
  EngineOptions eo;
  eo.n_slots = 1;
  eo.n_ctx = 16 + o.gen_tokens + 8;
  eo.n_threads = r.n_threads;
  ARBITER_ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine, Engine::Load(o.model_dir, eo));

  std::unique_ptr<Tokenizer> other;
  if (!o.tokenizer_path.empty()) {
    ARBITER_ASSIGN_OR_RETURN(other, Tokenizer::Load(o.tokenizer_path));
  }
  double t0 = NowSeconds();
  std::shared_ptr<const GrammarVocabulary> vocab = GrammarVocabulary::Build(other ? *other : engine->tokenizer());
  r.vocab_build_ms = MsSince(t0);
  r.vocab_size = vocab->size();
  t0 = NowSeconds();
  ARBITER_ASSIGN_OR_RETURN(std::string gbnf, JsonSchemaToGbnf(kSchema));
  ARBITER_ASSIGN_OR_RETURN(std::shared_ptr<const Grammar> g, Grammar::Parse(gbnf));
  r.grammar_compile_ms = MsSince(t0);

  const int kFar = 1 << 20;
  ARBITER_ASSIGN_OR_RETURN(r.mask_start_us, TimeMask(g, vocab, "", kFar, o.iterations, &r.allowed_start));
  ARBITER_ASSIGN_OR_RETURN(r.mask_boundary_us, TimeMask(g, vocab, R"({"city": "Paris", )", kFar, o.iterations,
                                                        &r.allowed_boundary));
  ARBITER_ASSIGN_OR_RETURN(r.mask_string_us,
                           TimeMask(g, vocab, R"({"city": "Pa)", kFar, o.iterations, &r.allowed_string));
  ARBITER_ASSIGN_OR_RETURN(r.mask_string_cold_us,
                           TimeColdMask(g, vocab, R"({"city": "Pa)", std::min(o.iterations, 50)));
  int unused = 0;
  ARBITER_ASSIGN_OR_RETURN(r.mask_string_budget_us,
                           TimeMask(g, vocab, R"({"city": "Pa)", 30, o.iterations, &unused));

  std::shared_ptr<const GrammarVocabulary> model_vocab = other ? GrammarVocabulary::Build(engine->tokenizer()) : vocab;
  const std::vector<int32_t> prompt = engine->tokenizer().Encode("The weather in Paris, as JSON:", false);
  std::vector<int32_t> p16(16, prompt.empty() ? 0 : prompt[0]);
  for (size_t i = 0; i < std::min<size_t>(16, prompt.size()); ++i) p16[i] = prompt[i];
  std::vector<double> plain, constrained;
  for (int rep = 0; rep < o.repetitions; ++rep) {
    GenerationRequest req;
    req.prompt_ids = p16;
    req.sampling.temperature = 0;
    req.max_tokens = o.gen_tokens + 1;
    req.ignore_eos = true;
    ARBITER_ASSIGN_OR_RETURN(GenerationResult a, engine->Generate(req, nullptr, nullptr));
    if (a.timings.decode_tokens > 0) plain.push_back(a.timings.decode_ms / a.timings.decode_tokens);
    GrammarConstraint c(g, model_vocab);
    req.sampling.temperature = 1.0f;
    req.sampling.has_seed = true;
    req.sampling.seed = 7 + rep;
    req.ignore_eos = false;
    req.constraint = &c;
    ARBITER_ASSIGN_OR_RETURN(GenerationResult b, engine->Generate(req, nullptr, nullptr));
    r.constrained_tokens = static_cast<int>(b.output_ids.size());
    if (b.timings.decode_tokens > 0) constrained.push_back(b.timings.decode_ms / b.timings.decode_tokens);
  }
  r.decode_step_ms = Summarize(plain).min;
  r.constrained_decode_step_ms = Summarize(constrained).min;
  if (r.decode_step_ms > 0) {
    r.ratio_string = r.mask_string_us.p50 / 1e3 / r.decode_step_ms;
    r.ratio_boundary = r.mask_boundary_us.p50 / 1e3 / r.decode_step_ms;
    r.ratio_cold = r.mask_string_cold_us.p50 / 1e3 / r.decode_step_ms;
  }
  r.load_average_end = LoadAverage1();
  return r;
}

std::string FormatGrammarBench(const GrammarBenchResult& r) {
  char buf[2048];
  std::snprintf(buf, sizeof buf,
                "model           %s (%d threads; mask over a vocabulary of %d%s)\n"
                "vocabulary      built in %.1f ms; schema compiled in %.2f ms\n"
                "mask (p50/p99)  start %.0f/%.0f us (%d allowed), object boundary %.0f/%.0f us (%d allowed),\n"
                "                inside a string %.0f/%.0f us (%d allowed), same with 30 tokens left %.0f us,\n"
                "                inside a string on a fresh constraint (nothing cached) %.0f/%.0f us\n"
                "decode step     %.2f ms unconstrained; %.2f ms under the constraint (%d tokens)\n"
                "mask / step     %.1f %% inside a string, %.1f %% at an object boundary, %.1f %% on a fresh\n"
                "                constraint (target ≤ 10 %%)\n"
                "load average    %.2f → %.2f\n",
                r.model_dir.c_str(), r.n_threads, r.vocab_size,
                r.tokenizer_path.empty() ? "" : (", from " + r.tokenizer_path).c_str(), r.vocab_build_ms, r.grammar_compile_ms,
                r.mask_start_us.p50, r.mask_start_us.p99, r.allowed_start, r.mask_boundary_us.p50,
                r.mask_boundary_us.p99, r.allowed_boundary, r.mask_string_us.p50, r.mask_string_us.p99,
                r.allowed_string, r.mask_string_budget_us.p50, r.mask_string_cold_us.p50, r.mask_string_cold_us.p99,
                r.decode_step_ms, r.constrained_decode_step_ms,
                r.constrained_tokens, 100 * r.ratio_string, 100 * r.ratio_boundary, 100 * r.ratio_cold, r.load_average_start,
                r.load_average_end);
  return buf;
}

std::string FormatGrammarBenchJson(const GrammarBenchResult& r) {
  auto summary = [](const SampleSummary& s) {
    return nlohmann::json{{"p50", s.p50}, {"p99", s.p99}, {"min", s.min}, {"mean", s.mean}};
  };
  nlohmann::json j = {{"model_dir", r.model_dir},
                      {"tokenizer_path", r.tokenizer_path},
                      {"n_threads", r.n_threads},
                      {"vocab_size", r.vocab_size},
                      {"vocab_build_ms", r.vocab_build_ms},
                      {"grammar_compile_ms", r.grammar_compile_ms},
                      {"mask_start_us", summary(r.mask_start_us)},
                      {"mask_boundary_us", summary(r.mask_boundary_us)},
                      {"mask_string_us", summary(r.mask_string_us)},
                      {"mask_string_budget_us", summary(r.mask_string_budget_us)},
                      {"mask_string_cold_us", summary(r.mask_string_cold_us)},
                      {"ratio_cold", r.ratio_cold},
                      {"allowed_start", r.allowed_start},
                      {"allowed_boundary", r.allowed_boundary},
                      {"allowed_string", r.allowed_string},
                      {"decode_step_ms", r.decode_step_ms},
                      {"constrained_decode_step_ms", r.constrained_decode_step_ms},
                      {"constrained_tokens", r.constrained_tokens},
                      {"ratio_string", r.ratio_string},
                      {"ratio_boundary", r.ratio_boundary},
                      {"load_average_start", r.load_average_start},
                      {"load_average_end", r.load_average_end}};
  return j.dump(2) + "\n";
}

}  // namespace arbiter
