// libFuzzer target: SafetensorsFile::Parse on arbitrary bytes, then every
// accessor and conversion over what it accepted. Any crash, sanitizer report
// or escaped exception is a bug in the reader.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "arbiter/formats/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  arbiter::Result<arbiter::SafetensorsFile> file =
      arbiter::SafetensorsFile::Parse(data, size, "fuzz.safetensors");
  if (!file.ok()) return 0;
  std::vector<float> out;
  for (const arbiter::TensorInfo& t : file->tensors()) {
    if (file->Find(t.name) != &t) __builtin_trap();
    // Accepted tensors must lie inside the input.
    if (t.size_bytes > 0 && (t.data < data || t.data + t.size_bytes > data + size)) __builtin_trap();
    if (t.num_elements() > (1 << 20)) continue;  // keep iterations fast
    out.resize(static_cast<size_t>(t.num_elements()));
    arbiter::Status s = arbiter::ConvertToF32(t, out.data());
    s.IgnoreError();
  }
  for (const auto& [key, value] : file->metadata()) {
    (void)key;
    (void)value;
  }
  return 0;
}
