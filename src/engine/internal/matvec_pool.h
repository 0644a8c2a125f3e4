// engine/internal/matvec_pool.h — decode's matrix-vector product, split
// across a small pool of threads.
//
// y [rows] = W [rows, cols] · x [cols] (+ y), W in the type it is stored in
// (a WeightMatrix of up to 3 typed row segments; quant.h's DotRows computes
// each chunk on the stored blocks). Rows are cut into chunks of
// kChunkRows; the calling thread and the workers claim chunks from one atomic
// counter (work sharing), so a worker that the OS has descheduled only delays
// the chunk it already holds — the caller takes the rest. Each chunk is a
// sequence of per-row dot products, i.e. a sequential read of the chunk's
// rows (Note [Decode matvec] in forward.cc).
//
// Note [Pool handshake]
// `state_` packs (generation << 32 | chunk count << 16 | next chunk). The
// caller writes the job, then publishes a new generation with next chunk 0
// (release). A worker claims a chunk with a CAS on the whole word, so a
// worker that wakes late can never claim from a finished or newer job, and it
// learns "nothing left" from the word itself. It reads the job only after
// claiming a real chunk (acquire); the job cannot be replaced before the
// caller has seen every chunk done. Idle workers spin for up to
// kSpinNs between jobs (decode issues ~30 products per token back to back),
// then sleep on a condition variable.
//
// Only one caller uses the workers at a time; a concurrent caller (another
// slot decoding) runs its product alone on its own thread.
//
// Thread safety: Run is thread-safe.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <thread>
#include <vector>

#include "arbiter/base/mutex.h"
#include "engine/internal/model_weights.h"

namespace arbiter::engine_internal {

class MatVecPool {
 public:
  // `n_threads` ≥ 1 threads compute a product (the caller plus n_threads − 1 workers).
  explicit MatVecPool(int n_threads);
  ~MatVecPool();
  MatVecPool(const MatVecPool&) = delete;
  MatVecPool& operator=(const MatVecPool&) = delete;

  int n_threads() const { return static_cast<int>(workers_.size()) + 1; }

  // y = W·x, or y += W·x when `accumulate`. xa[s] is x as
  // PrepareActivation(w.segments[s].type, x, w.cols, …) made it (x itself
  // for an f32 activation type). REQUIRES: y does not overlap W or xa.
  void Run(const WeightMatrix& w, const void* const* xa, bool accumulate, float* y);
  // The same for an f32 matrix [rows, cols].
  void Run(const float* w, int rows, int cols, const float* x, bool accumulate, float* y);
  // Calls fn(begin, end) for the chunks [k·chunk, min(n, (k + 1)·chunk)) of
  // [0, n), each once, on the caller and the workers (work sharing, as Run),
  // and returns when all are done. fn must be safe to call concurrently on
  // disjoint chunks. Prefill uses it for its row- and token-parallel loops
  // (forward.cc Note [Prefill on typed weights]). REQUIRES: n ≥ 0, chunk ≥ 1.
  void ParallelFor(int n, int chunk, const std::function<void(int, int)>& fn);

 private:
  // Either a product (w set) or a ParallelFor (fn set).
  struct Job {
    const WeightMatrix* w = nullptr;
    const void* const* xa = nullptr;  // one per segment
    float* y = nullptr;
    bool accumulate = false;
    uint32_t n_chunks = 0;
    const std::function<void(int, int)>* fn = nullptr;
    int n_items = 0;      // ParallelFor: items [0, n_items)
    int chunk_items = 0;  // ParallelFor: items per chunk
  };
  static constexpr int kChunkRows = 32;
  static constexpr uint32_t kMaxChunks = 0xFFFF - 256;  // room for over-claims in 16 bits
  static constexpr int64_t kSpinNs = 200000;  // 200 µs

  static void RunRows(const Job& job, int r0, int r1);
  // Runs chunk `chunk` of `job` (rows of a product, or items of a ParallelFor).
  static void RunChunk(const Job& job, uint32_t chunk);
  // Publishes `job` to the workers, works on it, waits for every chunk;
  // runs it alone on this thread when the workers are busy or it is small.
  void Dispatch(const Job& job);
  // Claims and runs chunks of generation `gen` until none are left.
  void WorkOn(uint32_t gen);
  void WorkerLoop();

  Job job_;  // written by the caller holding busy_, before publishing
  std::atomic<uint64_t> state_{0};  // Note [Pool handshake]
  std::atomic<uint32_t> done_chunks_{0};
  std::atomic<bool> busy_{false};   // a caller is using the workers
  std::atomic<bool> stop_{false};

  Mutex mu_;  // sleeping workers
  CondVar wake_{&mu_};
  std::vector<std::thread> workers_;
};

}  // namespace arbiter::engine_internal
