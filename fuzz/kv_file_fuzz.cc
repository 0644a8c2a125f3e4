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
    if (s.kv.size() != size_t{2} * s.n_layers * s.n_tokens() * s.kv_dim) std::abort();
    if (KvFileBytes(s) != size) std::abort();
  }
  return 0;
}
