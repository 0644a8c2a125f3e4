// arbiter/base/buffer_memory.h — memory for the buffers the ledger charges
// (KV slots, scratch, KV snapshots, prompt-cache entries), and the process
// heap's settings, so that a released charge is memory the OS gets back.
//
// Why these buffers do not come from malloc: Note [Where freed memory goes]
// in src/base/buffer_memory.cc. Why charged buffers are pre-faulted:
// Note [Charged memory is resident] there. docs/memory.md "Memory comes back"
// has the measurements.
//
// Thread safety: every function is thread-safe.
#pragma once

#include <cstddef>

namespace arbiter {

// Buffers of at least this many bytes get their own anonymous mapping
// (munmap'd when freed); smaller ones come from operator new.
inline constexpr size_t kOwnMappingMinBytes = size_t{64} << 10;
// Buffers of at least this many bytes are mapped 2 MiB-aligned and advised
// MADV_HUGEPAGE (base pages where transparent huge pages are off).
inline constexpr size_t kBufferHugeBytes = size_t{2} << 20;
// Every buffer starts on a cache line.
inline constexpr size_t kBufferAlignmentBytes = 64;

// Allocates `bytes` (> 0) aligned to kBufferAlignmentBytes. Contents are
// unspecified (an own mapping is zero, a small buffer is not). Throws
// std::bad_alloc when the memory cannot be had.
void* AllocateBuffer(size_t bytes);

// Frees what AllocateBuffer(bytes) returned, with the same `bytes`; a
// buffer with its own mapping goes back to the OS at once. Null: a no-op.
void FreeBuffer(void* p, size_t bytes) noexcept;

// Makes every page of [p, p + bytes) resident and zero-filled, as a charge
// promises (Note [Charged memory is resident]): MADV_POPULATE_WRITE where
// the kernel has it (Linux ≥ 5.14), a memset otherwise. REQUIRES: `p` from
// AllocateBuffer(bytes), contents not yet written (they become zero).
void ZeroAndPrefault(void* p, size_t bytes) noexcept;

// Sets glibc malloc so that memory freed by allocations that are not
// buffers above (request bodies, token vectors, JSON) goes back to the OS
// instead of staying in per-thread arenas: a fixed mmap threshold (which
// also stops the threshold from growing to 32 MiB after a large free) and
// a cap of arenas. Call once, early in main, before threads start. A no-op
// with another allocator preloaded.
void ConfigureProcessHeap();

// Returns the free pages of every malloc arena to the OS (malloc_trim(0)).
// Takes each arena's lock in turn and walks its free chunks: milliseconds,
// so call it after events that free a lot (a model's unload), never with a
// lock of ours held.
void TrimProcessHeap() noexcept;

}  // namespace arbiter
