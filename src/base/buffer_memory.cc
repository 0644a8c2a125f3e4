// base/buffer_memory.cc — own mappings for charged buffers; heap settings.
//
// Note [Where freed memory goes]
// 100 cycles of load demo-chat → one 2-token chat → unload left the ledger
// at 0 bytes and RssAnon 200 MiB higher than after the first cycle, in
// ~25 MiB anonymous mappings aligned to 64 MiB that nothing owned: glibc's
// per-thread malloc arenas (heaps of 64 MiB). The cause was two glibc
// behaviours together:
//   - the mmap threshold is dynamic: freeing a chunk that glibc had mmap'd
//     raises the threshold to that chunk's size (up to 32 MiB), so from the
//     first unload on, a model's KV slots and scratch (each under 32 MiB)
//     were carved out of arena heaps instead of getting their own mapping;
//   - a freed chunk inside a non-main arena's heap goes back to the OS only
//     when it ends up at the heap's top and the top exceeds the trim
//     threshold. Each load ran on whichever thread asked for the model, so
//     each arena kept a model's worth of freed buffers, up to 8 × cores
//     arenas.
// The fix has two parts:
//   1. What the ledger charges does not come from malloc. AllocateBuffer
//      maps every buffer of ≥ kOwnMappingMinBytes on its own and FreeBuffer
//      munmaps it, so releasing a charge returns its pages whatever the
//      allocator's history. (KV slots, forward scratch, RoPE tables, KV
//      snapshots and prompt-cache entries; weights were already in the
//      device arena and shm floors.)
//   2. What the ledger does not charge (request bodies, token vectors, JSON,
//      logits) still uses malloc. ConfigureProcessHeap fixes the mmap and
//      trim thresholds (a fixed value turns the dynamic adjustment off) and
//      caps the arenas, and the runtime calls TrimProcessHeap after a model
//      is unloaded, which hands every arena's free pages back.
// Measured with ../shared/checks/rss_cycles.py-style cycles on demo-chat
// (docs/memory.md "Memory comes back"): glibc as it was, +204 MiB after 100
// cycles; jemalloc 5.3 (LD_PRELOAD, default decay) +52 MiB after 60 cycles,
// still there 10 s later; mimalloc 2.0.9 +169 MiB; glibc with a fixed mmap
// threshold alone +13 MiB after 40; with the arena cap too, +0.7 MiB. So we
// keep glibc, configured, and own the mappings of what we charge.
//
// Note [Charged memory is resident]
// A charge is a promise that the bytes are in memory: the ledger must match
// RSS (docs/memory.md "The ledger is the truth"). An anonymous mapping is
// only address space until its pages are first written, so a KV slot sized
// for the whole context would be charged in full and resident only as far as
// the longest sequence it held — the ledger would over-report by up to the
// whole KV budget. The alternative, charging pages as they are first used,
// would make every decode step a possible ledger update and a possible
// eviction in the middle of a request. We pre-fault instead: what is charged
// is written once, at allocation (MADV_POPULATE_WRITE: the kernel faults the
// range in without a user-space pass). The cost is the memory a charge
// already reserves against the budget, and one page-zeroing pass at load.
#include "arbiter/base/buffer_memory.h"

#include <malloc.h>
#include <sys/mman.h>

#include <cstdint>
#include <cstring>
#include <new>

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23  // Linux 5.14
#endif

namespace arbiter {
namespace {

// Whole base pages, even for a huge-page buffer: the kernel backs each
// 2 MiB-aligned extent that lies wholly inside the mapping with a huge page
// and the tail with base pages, so nothing past the buffer becomes
// resident and the charge (the buffer's bytes) stays the truth. Rounding
// the mapping up to 2 MiB left up to 2 MiB − 4 KiB of zeroes resident per
// buffer that no charge counted (`arbiter bench memory`: +12 MiB
// unaccounted with 8 conversations in the prompt cache).
size_t MappedLength(size_t bytes) {
  constexpr size_t kPage = 4096;
  return (bytes + kPage - 1) / kPage * kPage;
}

// The heap settings of ConfigureProcessHeap (Note [Where freed memory goes]).
constexpr int kMmapThresholdBytes = 128 << 10;  // glibc's initial default
constexpr int kTrimThresholdBytes = 128 << 10;
constexpr int kArenaMax = 2;

}  // namespace

void* AllocateBuffer(size_t bytes) {
  if (bytes < kOwnMappingMinBytes) {
    return ::operator new(bytes == 0 ? 1 : bytes, std::align_val_t{kBufferAlignmentBytes});
  }
  if (bytes > SIZE_MAX - 2 * kBufferHugeBytes) throw std::bad_alloc();
  const size_t length = MappedLength(bytes);
  if (bytes < kBufferHugeBytes) {
    void* p = ::mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw std::bad_alloc();
    return p;
  }
  // 2 MiB-aligned so the kernel can back it with huge pages (Note [Arena
  // huge pages] in memory/device_backend.cc): map 2 MiB more, trim the ends.
  const size_t mapped = length + kBufferHugeBytes;
  void* p = ::mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) throw std::bad_alloc();
  const uintptr_t start = reinterpret_cast<uintptr_t>(p);
  const uintptr_t aligned = (start + kBufferHugeBytes - 1) / kBufferHugeBytes * kBufferHugeBytes;
  if (aligned > start) ::munmap(p, aligned - start);
  const uintptr_t end = start + mapped;
  if (end > aligned + length) {
    ::munmap(reinterpret_cast<void*>(aligned + length), end - (aligned + length));
  }
  // EINVAL without THP support: the buffer works the same on base pages.
  (void)::madvise(reinterpret_cast<void*>(aligned), length, MADV_HUGEPAGE);
  return reinterpret_cast<void*>(aligned);
}

void FreeBuffer(void* p, size_t bytes) noexcept {
  if (p == nullptr) return;
  if (bytes < kOwnMappingMinBytes) {
    ::operator delete(p, std::align_val_t{kBufferAlignmentBytes});
    return;
  }
  ::munmap(p, MappedLength(bytes));
}

void ZeroAndPrefault(void* p, size_t bytes) noexcept {
  if (p == nullptr || bytes == 0) return;
  if (bytes >= kOwnMappingMinBytes &&
      ::madvise(p, MappedLength(bytes), MADV_POPULATE_WRITE) == 0) {
    return;  // a fresh mapping: its pages are zero
  }
  std::memset(p, 0, bytes);
}

void ConfigureProcessHeap() {
  (void)::mallopt(M_MMAP_THRESHOLD, kMmapThresholdBytes);
  (void)::mallopt(M_TRIM_THRESHOLD, kTrimThresholdBytes);
  (void)::mallopt(M_ARENA_MAX, kArenaMax);
}

void TrimProcessHeap() noexcept { (void)::malloc_trim(0); }

}  // namespace arbiter
