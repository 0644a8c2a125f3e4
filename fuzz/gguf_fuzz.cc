// libFuzzer target: ParseGguf on arbitrary bytes, then, on what it accepts,
// the invariants gguf.h promises, every value and typed accessor, the
// ModelConfig mapping and the GGUF tensor plan, the inspect renderers, and a
// writer round trip: GgufWriter must accept every entry and tensor the reader
// accepted, and reading its output back must give the same metadata and
// tensors. Any crash, sanitizer report, escaped exception or trap is a bug.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "arbiter/formats/ggml_type.h"
#include "arbiter/formats/gguf.h"
#include "arbiter/formats/inspect.h"
#include "arbiter/formats/llama_tensors.h"
#include "arbiter/formats/model_config.h"
#include "model_config_checks.h"

namespace {

using arbiter::GgufValue;
using arbiter::GgufValueType;

// Reads every accessor of `v` and of up to 64 elements per array, visiting
// at most *budget values in all (nested arrays could otherwise fan out).
void Touch(const GgufValue& v, int* budget) {
  if (--*budget < 0) return;
  (void)v.AsUint();
  (void)v.AsInt();
  (void)v.AsFloat();
  (void)v.AsBool();
  (void)v.AsString();
  if (!v.is_array()) {
    if (v.size() != 0) __builtin_trap();
    return;
  }
  const size_t n = std::min<size_t>(v.size(), 64);
  for (size_t i = 0; i < n; ++i) {
    if (v.element_type() == GgufValueType::kArray) {
      Touch(v.ArrayAt(i), budget);
      continue;
    }
    const GgufValue e = v.At(i);
    if (e.type() != v.element_type()) __builtin_trap();
    if (v.element_type() == GgufValueType::kString && e.AsString() != v.StringAt(i)) {
      __builtin_trap();
    }
    Touch(e, budget);
  }
  // Out of range: defined, empty results.
  if (v.At(v.size()).type() != GgufValueType::kUint8) __builtin_trap();
  if (!v.StringAt(v.size()).empty() || v.ArrayAt(v.size()).size() != 0) __builtin_trap();
}

void CheckConfig(const arbiter::ModelConfig& c) {
  CheckModelConfigInvariants(c);
  if (c.num_hidden_layers <= 256) {  // a plan lists ~15 tensors per layer
    arbiter::LlamaTensorPlan plan = arbiter::PlanLlamaTensorsGguf(c);
    if (plan.tensors.empty() || !plan.has_lm_head) __builtin_trap();
  }
  if (c.head_dim % 2 == 0) {
    for (int64_t row : {int64_t{0}, int64_t{1}, int64_t{c.head_dim} - 1}) {
      const int64_t hf = arbiter::GgufRowToHfRow(row, c.num_attention_heads, c.head_dim);
      if (hf < 0 || hf >= int64_t{c.head_dim}) __builtin_trap();
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  arbiter::Result<arbiter::GgufFile> file = arbiter::ParseGguf(bytes, "fuzz.gguf");
  if (!file.ok()) return 0;
  const arbiter::GgufFile& f = *file;

  const uint64_t a = f.alignment();
  if (a == 0 || (a & (a - 1)) != 0 || f.data_offset() % a != 0) __builtin_trap();
  if (f.file_size() != size) __builtin_trap();
  for (const arbiter::GgufTensorInfo& t : f.tensors()) {
    if (f.FindTensor(t.name) != &t) __builtin_trap();
    if (t.dims.empty() || t.dims.size() > 4 || t.offset % a != 0) __builtin_trap();
    if (f.data_offset() + t.offset + t.size_bytes > size) __builtin_trap();
    int64_t n = 1;
    for (int64_t d : t.dims) n *= d;  // the reader proved this does not overflow
    if (n != t.n_elements) __builtin_trap();
    std::optional<size_t> row = arbiter::GgmlRowBytes(t.type, t.dims[0]);
    if (!row) __builtin_trap();
    if (t.dims[0] > 0 && *row * static_cast<uint64_t>(n / t.dims[0]) != t.size_bytes) {
      __builtin_trap();
    }
  }
  int budget = 20000;
  for (const arbiter::GgufMetadataEntry& e : f.metadata()) {
    if (f.FindValue(e.key) != &e.value) __builtin_trap();
    Touch(e.value, &budget);
    f.GetString(e.key).status().IgnoreError();
    f.GetUint(e.key).status().IgnoreError();
    f.GetInt(e.key).status().IgnoreError();
    f.GetFloat(e.key).status().IgnoreError();
    f.GetBool(e.key).status().IgnoreError();
    f.GetIntArray(e.key).status().IgnoreError();
    f.GetFloatArray(e.key).status().IgnoreError();
    if (e.value.size() <= 4096) f.GetStringArray(e.key).status().IgnoreError();
  }

  arbiter::Result<arbiter::ModelConfig> config = arbiter::ModelConfigFromGguf(f);
  if (config.ok()) CheckConfig(*config);

  arbiter::ModelInspection inspection = arbiter::InspectGguf(f);
  (void)arbiter::RenderInspectionText(inspection);
  (void)arbiter::RenderInspectionJson(inspection);

  // Writer round trip.
  arbiter::GgufWriter w;
  for (const arbiter::GgufMetadataEntry& e : f.metadata()) {
    if (!w.Add(e.key, e.value).ok()) __builtin_trap();
  }
  for (const arbiter::GgufTensorInfo& t : f.tensors()) {
    if (!w.AddTensor(t.name, t.dims, t.type,
                     bytes.substr(f.data_offset() + t.offset, t.size_bytes))
             .ok()) {
      __builtin_trap();
    }
  }
  if (w.alignment() != a) __builtin_trap();
  const std::string image = w.Serialize();
  arbiter::Result<arbiter::GgufFile> again = arbiter::ParseGguf(image, "again.gguf");
  if (!again.ok() || again->version() != 3) __builtin_trap();
  if (again->metadata().size() != f.metadata().size() ||
      again->tensors().size() != f.tensors().size()) {
    __builtin_trap();
  }
  for (size_t i = 0; i < f.metadata().size(); ++i) {
    if (again->metadata()[i].key != f.metadata()[i].key ||
        !(again->metadata()[i].value == f.metadata()[i].value)) {
      __builtin_trap();
    }
  }
  for (size_t i = 0; i < f.tensors().size(); ++i) {
    const arbiter::GgufTensorInfo& x = f.tensors()[i];
    const arbiter::GgufTensorInfo& y = again->tensors()[i];
    if (x.name != y.name || x.dims != y.dims || x.type != y.type || x.size_bytes != y.size_bytes ||
        image.compare(again->data_offset() + y.offset, y.size_bytes,
                      bytes.substr(f.data_offset() + x.offset, x.size_bytes)) != 0) {
      __builtin_trap();
    }
  }
  return 0;
}
