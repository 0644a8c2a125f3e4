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
//   - glibc serves buffers over its mmap threshold (at most 32 MiB) with a
//     fresh mapping each time, so every 4 KiB page of such a snapshot is
//     faulted in and zeroed by the kernel when first written, which costs
//     several times the copy itself. Below the threshold glibc may reuse a
//     freed buffer (no faults) or not, depending on the heap's history. So
//     buffers of ≥ 2 MiB get their own mapping, 2 MiB-aligned and
//     MADV_HUGEPAGE, as the cpu arena (Note [Arena huge pages] in
//     memory/device_backend.cc): one fault per 2 MiB, each zeroing its page
//     just before the copy fills it. Without THP the mapping is on base
//     pages and behaves like glibc's.
// Cost: up to 2 MiB − 4 KiB of address space past the end of each buffer
// (resident only if the huge page is); the prompt cache charges
// MemoryBytes(), not the rounded size.
#include "arbiter/engine/kv_snapshot.h"

#include <sys/mman.h>

#include <cstdint>
#include <new>

namespace arbiter {
namespace {

size_t RoundUpHuge(size_t bytes) {
  return (bytes + kKvBufferHugeBytes - 1) / kKvBufferHugeBytes * kKvBufferHugeBytes;
}

}  // namespace

void* AllocateKvBuffer(size_t bytes) {
  if (bytes < kKvBufferHugeBytes) return ::operator new(bytes);
  if (bytes > SIZE_MAX - 2 * kKvBufferHugeBytes) throw std::bad_alloc();
  const size_t length = RoundUpHuge(bytes);
  const size_t mapped = length + kKvBufferHugeBytes;  // room to align
  void* p = ::mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) throw std::bad_alloc();
  const uintptr_t start = reinterpret_cast<uintptr_t>(p);
  const uintptr_t aligned =
      (start + kKvBufferHugeBytes - 1) / kKvBufferHugeBytes * kKvBufferHugeBytes;
  if (aligned > start) ::munmap(p, aligned - start);
  const uintptr_t end = start + mapped;
  if (end > aligned + length) {
    ::munmap(reinterpret_cast<void*>(aligned + length), end - (aligned + length));
  }
  // EINVAL without THP support: the buffer works the same on base pages.
  (void)::madvise(reinterpret_cast<void*>(aligned), length, MADV_HUGEPAGE);
  return reinterpret_cast<void*>(aligned);
}

void FreeKvBuffer(void* p, size_t bytes) noexcept {
  if (p == nullptr) return;
  if (bytes < kKvBufferHugeBytes) {
    ::operator delete(p);
    return;
  }
  ::munmap(p, RoundUpHuge(bytes));
}

}  // namespace arbiter
