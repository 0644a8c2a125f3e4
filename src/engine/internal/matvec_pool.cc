// engine/internal/matvec_pool.cc — see matvec_pool.h (Note [Pool handshake]).
#include "engine/internal/matvec_pool.h"

#include <algorithm>
#include <chrono>

#include "engine/internal/quant.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define ARBITER_CPU_RELAX() _mm_pause()
#else
#define ARBITER_CPU_RELAX() std::this_thread::yield()
#endif

namespace arbiter::engine_internal {
namespace {

// state_ layout: generation [63:32] | chunk count [31:16] | next chunk [15:0].
uint32_t GenerationOf(uint64_t state) { return static_cast<uint32_t>(state >> 32); }
uint32_t ChunkCountOf(uint64_t state) { return static_cast<uint32_t>(state >> 16) & 0xFFFF; }
uint32_t NextChunkOf(uint64_t state) { return static_cast<uint32_t>(state) & 0xFFFF; }

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

MatVecPool::MatVecPool(int n_threads) {
  for (int i = 1; i < n_threads; ++i) workers_.emplace_back([this] { WorkerLoop(); });
}

MatVecPool::~MatVecPool() {
  {
    MutexLock l(&mu_);
    stop_.store(true);
    wake_.SignalAll();
  }
  for (std::thread& t : workers_) t.join();
}

void MatVecPool::RunRows(const Job& job, int r0, int r1) {
  const WeightMatrix& w = *job.w;
  int start = 0;  // first row of segment s
  for (int s = 0; s < w.n_segments && start < r1; start += w.segments[s].rows, ++s) {
    const MatrixSegment& seg = w.segments[s];
    const int lo = std::max(r0, start), hi = std::min(r1, start + seg.rows);
    if (lo >= hi) continue;
    DotRows(seg.type, seg.data, w.cols, job.xa[s], lo - start, hi - start, job.y + lo,
            job.accumulate);
  }
}

void MatVecPool::RunChunk(const Job& job, uint32_t chunk) {
  if (job.fn != nullptr) {
    const int begin = static_cast<int>(chunk) * job.chunk_items;
    (*job.fn)(begin, std::min(job.n_items, begin + job.chunk_items));
    return;
  }
  const int r0 = static_cast<int>(chunk) * kChunkRows;
  RunRows(job, r0, std::min(job.w->rows, r0 + kChunkRows));
}

void MatVecPool::WorkOn(uint32_t gen) {
  uint64_t s = state_.load(std::memory_order_acquire);
  while (GenerationOf(s) == gen) {
    const uint32_t chunk = NextChunkOf(s);
    if (chunk >= ChunkCountOf(s)) return;  // all claimed
    if (!state_.compare_exchange_weak(s, s + 1, std::memory_order_acq_rel,
                                      std::memory_order_acquire)) {
      continue;  // s reloaded
    }
    // Claimed a real chunk of `gen`: the job cannot be replaced before this
    // chunk is reported done, so reading job_ is safe.
    RunChunk(job_, chunk);
    done_chunks_.fetch_add(1, std::memory_order_release);
    s = state_.load(std::memory_order_acquire);
  }
}

void MatVecPool::WorkerLoop() {
  uint32_t seen = 0;
  while (true) {
    uint64_t s = state_.load(std::memory_order_acquire);
    if (GenerationOf(s) == seen) {
      const int64_t spin_until = NowNs() + kSpinNs;
      int spins = 0;
      while (GenerationOf(s = state_.load(std::memory_order_acquire)) == seen &&
             !stop_.load(std::memory_order_relaxed)) {
        ARBITER_CPU_RELAX();
        if ((++spins & 255) == 0 && NowNs() > spin_until) {
          MutexLock l(&mu_);
          while (GenerationOf(state_.load(std::memory_order_acquire)) == seen &&
                 !stop_.load()) {
            wake_.Wait();
          }
        }
      }
    }
    if (stop_.load()) return;
    seen = GenerationOf(s);
    WorkOn(seen);
  }
}

void MatVecPool::Run(const float* w, int rows, int cols, const float* x, bool accumulate,
                     float* y) {
  WeightMatrix m;
  m.rows = rows;
  m.cols = cols;
  m.segments[0] = MatrixSegment{GgmlType::kF32, reinterpret_cast<const uint8_t*>(w), rows};
  m.n_segments = 1;
  const void* xa[1] = {x};
  Run(m, xa, accumulate, y);
}

void MatVecPool::Run(const WeightMatrix& w, const void* const* xa, bool accumulate, float* y) {
  Job job;
  job.w = &w;
  job.xa = xa;
  job.y = y;
  job.accumulate = accumulate;
  job.n_chunks = static_cast<uint32_t>((w.rows + kChunkRows - 1) / kChunkRows);
  Dispatch(job);
}

void MatVecPool::ParallelFor(int n, int chunk, const std::function<void(int, int)>& fn) {
  if (n <= 0) return;
  Job job;
  job.fn = &fn;
  job.n_items = n;
  // Fewer, larger chunks when n / chunk would not fit the 16-bit counter.
  const int64_t min_chunk = (int64_t{n} + kMaxChunks - 1) / kMaxChunks;
  job.chunk_items = static_cast<int>(std::max<int64_t>(chunk, min_chunk));
  job.n_chunks = static_cast<uint32_t>((n + job.chunk_items - 1) / job.chunk_items);
  Dispatch(job);
}

void MatVecPool::Dispatch(const Job& job) {
  bool expected = false;
  if (workers_.empty() || job.n_chunks < 2 || job.n_chunks > kMaxChunks ||
      !busy_.compare_exchange_strong(expected, true, std::memory_order_acquire)) {
    if (job.fn == nullptr) {
      RunRows(job, 0, job.w->rows);  // one DotRows call per segment (quant.h)
    } else {
      for (uint32_t c = 0; c < job.n_chunks; ++c) RunChunk(job, c);
    }
    return;
  }
  // No worker holds a chunk of the previous job (its caller waited for all
  // of them), so the job and the done counter may be rewritten.
  job_ = job;
  done_chunks_.store(0, std::memory_order_relaxed);
  const uint32_t gen = GenerationOf(state_.load(std::memory_order_relaxed)) + 1;
  state_.store(static_cast<uint64_t>(gen) << 32 | static_cast<uint64_t>(job.n_chunks) << 16,
               std::memory_order_release);
  {
    MutexLock l(&mu_);  // no lost wake-up: sleepers re-check state_ under mu_
    wake_.SignalAll();
  }
  WorkOn(gen);
  // A worker still holding a chunk may have been preempted (an oversubscribed
  // machine); after a short spin, yield so it can run on this CPU.
  for (int spins = 0; done_chunks_.load(std::memory_order_acquire) != job.n_chunks; ++spins) {
    if (spins < 2048) {
      ARBITER_CPU_RELAX();
    } else {
      std::this_thread::yield();
    }
  }
  busy_.store(false, std::memory_order_release);
}

}  // namespace arbiter::engine_internal
