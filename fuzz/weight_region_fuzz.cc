// libFuzzer target: ValidateSharedRegion on arbitrary bytes as a shared
// weight region (arbiter/weights/region_format.h), first against a small fixed
// layout, then against a layout derived from the input's first bytes so
// table sizes, alignments, zero-byte and invalid (negative, overflowing)
// tensors vary. Any crash, sanitizer report (a read outside the input) or
// accepted region whose tensors do not lie inside it is a bug.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "arbiter/weights/region_format.h"
#include "arbiter/weights/weight_store.h"

namespace {

constexpr uint64_t kFixedDigest = 0x0123456789abcdefull;

// Accepted offsets must be aligned, in order, and inside [0, size).
void CheckAccepted(const arbiter::Result<std::vector<uint64_t>>& r, size_t size,
                   const std::vector<arbiter::WeightSpec>& specs) {
  if (!r.ok()) return;
  if (r->size() != specs.size()) __builtin_trap();
  for (size_t i = 0; i < specs.size(); ++i) {
    const uint64_t offset = (*r)[i];
    const uint64_t bytes = arbiter::WeightSpecBytes(specs[i]);
    if (offset % arbiter::kHostFloorAlignment != 0) __builtin_trap();
    if (offset > size || bytes > size - offset) __builtin_trap();
  }
}

uint64_t Load64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::vector<arbiter::WeightSpec> kFixed = {
      {"tok_embd", arbiter::DType::kF32, {4, 4}},
      {"norm", arbiter::DType::kF16, {3}},
      {"empty", arbiter::DType::kU8, {0}},
  };
  CheckAccepted(arbiter::ValidateSharedRegion(data, size, kFixedDigest, kFixed), size, kFixed);

  // Derived layout: byte 0 → tensor count (0..7); then per tensor one byte
  // of dtype, one of rank (0..3) and one per dim (signed: negatives occur;
  // 0xff scales to a huge dim so products overflow). The digest is read
  // from the header position so the fuzzer can match it.
  if (size == 0) return 0;
  size_t at = 1;
  auto next = [&]() -> uint8_t { return at < size ? data[at++] : 0; };
  const size_t n = data[0] % 8;
  std::vector<arbiter::WeightSpec> specs(n);
  for (size_t i = 0; i < n; ++i) {
    specs[i].name = "t" + std::to_string(i);
    specs[i].dtype = static_cast<arbiter::DType>(next() % 15);
    const int rank = next() % 4;
    for (int k = 0; k < rank; ++k) {
      const int8_t d = static_cast<int8_t>(next());
      specs[i].shape.push_back(d == 127 ? (int64_t{1} << 40) : d);
    }
  }
  const uint64_t digest = size >= 24 ? Load64(data + 16) : 0;
  CheckAccepted(arbiter::ValidateSharedRegion(data, size, digest, specs), size, specs);
  return 0;
}
