// engine/kv_snapshot.cc — the memory of KV snapshot buffers.
//
// Note [KV buffers]
// A snapshot is allocated whenever a slot is saved (SaveSlot: a stash into
// the host tier, a save to disk) and whenever a KV file is read, and it is
// written exactly once right after. What `arbiter bench kv` showed on
// demo-chat (the figures: docs/BENCHMARKS.md "KV precache", "What changed"):
//   - std::vector<float>::resize zeroed the buffer before the copy
//     overwrote it: one wasted pass, and, in fresh memory, the pass that
//     took every page fault. KvBufferAllocator default-initializes instead.
//   - glibc serves buffers over its mmap threshold with a fresh mapping
//     each time, so every 4 KiB page of such a snapshot is faulted in and
//     zeroed by the kernel when first written, which costs several times
//     the copy itself. So buffers of ≥ 2 MiB are mapped 2 MiB-aligned and
//     MADV_HUGEPAGE, as the cpu arena (Note [Arena huge pages] in
//     memory/device_backend.cc): one fault per 2 MiB, each zeroing its page
//     just before the copy fills it. Without THP the mapping is on base
//     pages.
//   - every snapshot of ≥ 64 KiB is its own mapping, so the memory of a
//     dropped prompt-cache entry goes back to the OS when its charge is
//     released (Note [Where freed memory goes] in base/buffer_memory.cc).
// The tail of a large buffer past its last whole 2 MiB is on base pages, so
// nothing beyond the buffer is resident and the prompt cache's charge
// (MemoryBytes()) is what it holds. Snapshots are not pre-faulted (Note
// [Charged memory is resident]): they are written in full before they are
// charged.
#include "arbiter/engine/kv_snapshot.h"

#include <array>

namespace arbiter {
namespace {

struct KvTypeEntry {
  GgmlType type;
  std::string_view name;
};
constexpr std::array<KvTypeEntry, 4> kKvTypes = {{
    {GgmlType::kF32, "f32"},
    {GgmlType::kF16, "f16"},
    {GgmlType::kBF16, "bf16"},
    {GgmlType::kQ8_0, "q8_0"},
}};

}  // namespace

bool IsKvType(GgmlType type) {
  for (const KvTypeEntry& e : kKvTypes) {
    if (e.type == type) return true;
  }
  return false;
}

std::string_view KvTypeName(GgmlType type) {
  for (const KvTypeEntry& e : kKvTypes) {
    if (e.type == type) return e.name;
  }
  return "type ?";
}

std::optional<GgmlType> ParseKvType(std::string_view name) {
  for (const KvTypeEntry& e : kKvTypes) {
    if (e.name == name) return e.type;
  }
  return std::nullopt;
}

size_t KvRowBytes(GgmlType type, uint64_t kv_dim) {
  if (!IsKvType(type)) return 0;
  return GgmlRowBytes(type, static_cast<int64_t>(kv_dim)).value_or(0);
}

}  // namespace arbiter
