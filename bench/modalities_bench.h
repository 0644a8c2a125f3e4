// bench/modalities_bench.h — the cross-modal scenario (`arbiter bench
// modalities`, docs/BENCHMARKS.md "Modalities"; issue 14 point 5).
//
// Real Runtimes in this process serving demo-chat (generated into a temp
// dir unless given; vision = "ocr"), asr and vad (PocketSphinx en-us), tts
// (Flite) and ocr (Tesseract eng); the state dir is a temp dir, removed
// afterwards.
//   1. Per backend model (room for all): its load time, first-result
//      latency, footprint as measured (the arbiter's bytes) against what is
//      charged to the ledger under its owner, and the process's RssAnon +
//      RssFile growth across its load measured here independently.
//   2. TTS → ASR round trip: each of the first two Harvard sentence lists
//      (20 sentences, public domain) spoken by Flite `slt`, transcribed by
//      PocketSphinx; the word error rate over all 20 (word-level edit
//      distance / reference words, after lower-casing and dropping
//      punctuation). Target: ≤ 20 %. With `asr_path`, the same speech is
//      also transcribed by a second PocketSphinx model from that directory
//      (e.g. en-us MAP-adapted to slt by scripts/asr-adapt/adapt.sh) and its
//      WER reported beside the first.
//   3. The scenario under a budget of demo-chat + the largest other model
//      + 8 MiB: a voice turn (speak → transcribe → chat) loads tts then asr,
//      each evicting the other, never the text model; an image chat evicts
//      the idle voice model and a repeated image hits the vision cache (no
//      second OCR run); critical pressure refuses speech while chat
//      answers, nominal restores it; after unloading every model but the
//      text model, RssAnon is back within max(2 %, 8 MiB) of its value with
//      only the text model loaded. Each step is a check with its figure.
//
// Errors: a model that cannot be made or loaded, a request that fails
// unexpectedly (the runtime's error, naming the step).
// Thread safety: run one at a time (it measures the whole process).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "arbiter/base/status.h"

namespace arbiter {

struct ModalitiesBenchOptions {
  std::string chat_dir;   // "" = the demo-chat preset, generated
  int sentences = 20;     // Harvard sentences used (1..20)
  std::string asr_path;   // "" = en-us only; else also a PocketSphinx model here
};

// One transcribe model's TTS → ASR round trip over the bench's sentences.
struct AsrWerFigures {
  std::string model;  // the configured model: "asr", or "asr-adapted" (asr_path)
  std::string tag;    // short name in the per-sentence lines: "en-us", "adapted"
  std::string label;  // "PocketSphinx en-us", ...
  std::string path;   // "" = the engine's default model (Debian's en-us)
  int reference_words = 0;
  int word_errors = 0;
  double wer() const { return reference_words > 0 ? double(word_errors) / reference_words : 0; }
  std::vector<std::string> heard;  // one per sentence, in the order of `references`
};

struct ModalityModelFigures {
  std::string name;
  std::string capability;
  double load_ms = 0;
  double first_result_ms = 0;
  uint64_t measured_bytes = 0;   // the arbiter's bytes (after the first run)
  uint64_t charged_bytes = 0;    // the ledger's charges under its owner
  uint64_t rss_growth_bytes = 0; // RssAnon + RssFile across the load, measured here
};

struct ScenarioCheck {
  std::string name;
  bool ok = false;
  std::string detail;
};

struct ModalitiesBenchResult {
  std::vector<ModalityModelFigures> models;
  int sentences = 0;
  std::vector<std::string> references;  // the sentences spoken
  // [0]: en-us (the demo's asr); [1]: the asr_path model, when given.
  std::vector<AsrWerFigures> asr;
  uint64_t budget_bytes = 0;
  std::vector<ScenarioCheck> checks;
  bool all_ok() const;
};

Result<ModalitiesBenchResult> RunModalitiesBench(const ModalitiesBenchOptions& options);
std::string FormatModalitiesBench(const ModalitiesBenchResult& result);
std::string FormatModalitiesBenchJson(const ModalitiesBenchResult& result);

// Word error rate pieces: the word-level edit distance between `reference`
// and `hypothesis` after lower-casing and dropping punctuation (apostrophes
// kept), and the reference's word count.
int WordEditDistance(const std::string& reference, const std::string& hypothesis, int* ref_words);

}  // namespace arbiter
