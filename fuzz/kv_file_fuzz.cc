// libFuzzer target: ParseKvFile over arbitrary bytes (the disk tier's reader).
// Invariant: it never crashes or reads outside the input, and a snapshot it
// accepts is self-consistent.
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "arbiter/kv/kv_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  arbiter::Result<arbiter::KvSnapshot> r = arbiter::ParseKvFile(data, size, "fuzz", "");
  if (r.ok()) {
    const arbiter::KvSnapshot& s = *r;
    if (!arbiter::IsKvType(s.kv_type)) std::abort();
    if (s.kv.size() != s.ExpectedKvBytes()) std::abort();
    if (KvFileBytes(s) != size) std::abort();
  }
  return 0;
}
