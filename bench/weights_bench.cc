// bench/weights_bench.cc — `arbiter bench weights`: see weights_bench.h for
// the scenarios, their limits and the method.
//
// Every scenario builds its own WeightCache over its own cpu arena, sized
// from the model's compute layout (Σ 64-byte-aligned tensor bytes) with
// fraction 1 and wiggle 0, so the on-demand budget is exactly what the
// scenario needs (one model, or one but not two, or both). Limits are
// measured in the same process between the scenarios, on buffers of the same
// byte count, so a busy neighbour slows both sides of a ratio alike (it does
// not make the ratio exact: see the caveats in docs/BENCHMARKS.md).
#include "bench/weights_bench.h"

#include <cblas.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <poll.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <vector>

#include "arbiter/engine/engine.h"
#include "arbiter/formats/safetensors.h"
#include "arbiter/memory/device_backend.h"
#include "arbiter/weights/weight_cache.h"
#include "arbiter/weights/weight_store.h"

namespace arbiter {
namespace {

namespace fs = std::filesystem;

constexpr uint64_t kAlign = 64;          // the weight cache's pool alignment
constexpr size_t kReadChunk = 8u << 20;  // sequential read(), bytes per call
constexpr int kPromptTokens = 8;         // (c)
constexpr int kMinLimitReps = 5;         // memcpy limits: at least this many samples
constexpr int kChildWaitSeconds = 600;   // (d): a child that takes longer is killed

// The bytes the weight cache lays `specs` out in (its block size).
uint64_t LayoutBytes(const std::vector<WeightSpec>& specs) {
  uint64_t total = 0;
  for (const WeightSpec& s : specs) total += (WeightSpecBytes(s) + kAlign - 1) / kAlign * kAlign;
  return std::max(total, kAlign);
}

// Anonymous memory, unmapped on destruction.
class Mapping {
 public:
  explicit Mapping(size_t bytes) : bytes_(std::max<size_t>(bytes, 1)) {
    void* p = ::mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    data_ = p == MAP_FAILED ? nullptr : static_cast<uint8_t*>(p);
  }
  ~Mapping() {
    if (data_ != nullptr) ::munmap(data_, bytes_);
  }
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  uint8_t* data() const { return data_; }

 private:
  size_t bytes_;
  uint8_t* data_ = nullptr;
};

// Where MemcpyGbS copies to.
enum class Dst {
  kFaulted,       // plain anonymous memory, faulted in once (the limit)
  kFresh,         // plain anonymous memory, freshly mapped for every copy
  kHugeFaulted,   // a huge-page cpu arena, faulted in once
  kHugeDiscarded  // a huge-page cpu arena, Discarded before every copy
};

// A 1-thread memcpy of `bytes` from a faulted plain buffer to `dst_kind`,
// set up once and timed by Once().
class MemcpyProbe {
 public:
  MemcpyProbe(size_t bytes, Dst dst_kind) : bytes_(bytes), kind_(dst_kind), src_(bytes) {}

  Status Init() {
    if (src_.data() == nullptr) return ResourceExhaustedError("bench: cannot map memcpy src");
    for (size_t i = 0; i < bytes_; i += 4096) src_.data()[i] = static_cast<uint8_t>(i >> 12);
    if (kind_ == Dst::kHugeFaulted || kind_ == Dst::kHugeDiscarded) {
      ARBITER_ASSIGN_OR_RETURN(huge_, CpuDeviceBackend::Create(bytes_, /*huge_pages=*/true));
      ARBITER_ASSIGN_OR_RETURN(DeviceRegion region, huge_->AllocateRegion(bytes_));
      region_ = region.id;
      dst_ = static_cast<uint8_t*>(region.host);
    } else if (kind_ == Dst::kFaulted) {
      plain_ = std::make_unique<Mapping>(bytes_);
      dst_ = plain_->data();
      if (dst_ == nullptr) return ResourceExhaustedError("bench: cannot map memcpy dst");
    }
    if (dst_ != nullptr) std::memcpy(dst_, src_.data(), bytes_);  // fault in
    return OkStatus();
  }

  // One copy; wall seconds of the memcpy alone.
  Result<double> Once() {
    if (kind_ == Dst::kFresh) {
      plain_ = std::make_unique<Mapping>(bytes_);
      dst_ = plain_->data();
      if (dst_ == nullptr) return ResourceExhaustedError("bench: cannot map memcpy dst");
    } else if (kind_ == Dst::kHugeDiscarded) {
      ARBITER_RETURN_IF_ERROR(huge_->Discard(region_, 0, bytes_));
    }
    const double t0 = NowSeconds();
    std::memcpy(dst_, src_.data(), bytes_);
    return NowSeconds() - t0;
  }

 private:
  const size_t bytes_;
  const Dst kind_;
  Mapping src_;
  std::unique_ptr<Mapping> plain_;
  std::unique_ptr<CpuDeviceBackend> huge_;
  DeviceRegionId region_ = 0;  // of huge_; freed with it
  uint8_t* dst_ = nullptr;
};

// p50 GB/s of max(reps, kMinLimitReps) MemcpyProbe copies.
Result<double> MemcpyGbS(size_t bytes, int reps, Dst dst_kind) {
  MemcpyProbe probe(bytes, dst_kind);
  ARBITER_RETURN_IF_ERROR(probe.Init());
  std::vector<double> seconds;
  for (int r = 0; r < std::max(reps, kMinLimitReps); ++r) {
    ARBITER_ASSIGN_OR_RETURN(double s, probe.Once());
    seconds.push_back(s);
  }
  return GbPerSecond(bytes, Summarize(seconds).p50);
}

// One WeightCache over its own cpu arena of `arena_bytes` (fraction 1,
// wiggle 0, no ledger). The device outlives the cache (member order).
struct BenchCache {
  std::unique_ptr<CpuDeviceBackend> device;
  std::unique_ptr<WeightCache> cache;
  // The cache first: it frees its blocks into the device.
  void Reset() {
    cache.reset();
    device.reset();
  }
};

Result<BenchCache> MakeCache(uint64_t arena_bytes, bool huge_pages = true) {
  BenchCache c;
  ARBITER_ASSIGN_OR_RETURN(c.device, CpuDeviceBackend::Create(arena_bytes, huge_pages));
  WeightCacheOptions o;
  o.device = c.device.get();
  o.fraction = 1.0;
  o.wiggle = 0.0;
  ARBITER_ASSIGN_OR_RETURN(c.cache, WeightCache::Create(std::move(o)));
  return c;
}

WeightModelStats ModelStats(const WeightCache& cache, const std::string& key) {
  for (WeightModelStats& m : cache.Stats().models) {
    if (m.key == key) return m;
  }
  return {};
}

EngineOptions BenchEngineOptions(int gen_tokens, int threads) {
  EngineOptions o;
  o.n_ctx = kPromptTokens + gen_tokens + 8;
  o.n_slots = 1;
  o.prefill_batch = 64;
  o.n_threads = threads;
  return o;
}

// Evict (timed into *evict) then Acquire (timed into *acquire) of `key`;
// checks the load came from `want` and adds the cache's load time.
Status EvictAndAcquire(WeightCache* cache, const std::string& key, WeightLoadSource want,
                       std::vector<double>* evict, std::vector<double>* acquire,
                       std::vector<double>* transfer) {
  double t0 = NowSeconds();
  ARBITER_ASSIGN_OR_RETURN(bool evicted, cache->Evict(key));
  if (evict != nullptr) evict->push_back(NowSeconds() - t0);
  if (!evicted) return InternalError("bench: Evict of an idle resident model did nothing");
  const uint64_t loads = ModelStats(*cache, key).loads;
  t0 = NowSeconds();
  {
    ARBITER_ASSIGN_OR_RETURN(WeightLease lease, cache->Acquire(key));
    acquire->push_back(NowSeconds() - t0);
  }
  const WeightModelStats m = ModelStats(*cache, key);
  if (m.loads != loads + 1 || m.last_load_source != want) {
    return InternalError(
        fmt::format("bench: the Acquire of '{}' loaded {} time(s) from the {}, "
                    "expected once from the {}",
                    key, m.loads - loads, WeightLoadSourceName(m.last_load_source),
                    WeightLoadSourceName(want)));
  }
  if (transfer != nullptr) transfer->push_back(m.last_load_seconds);
  return OkStatus();
}

// ---- (a) ---------------------------------------------------------------------

// `repetitions` Evict + Acquire of a kPinnedSystem model over a fresh cache;
// the arena with or without huge pages. With `limit`, each Acquire is
// followed by one limit copy (into *limit_seconds), so a load and its limit
// are measured seconds apart, not minutes.
Status FloorLoads(const WeightsBenchOptions& o, bool huge_pages, uint64_t* weight_bytes,
                  std::vector<double>* evict, std::vector<double>* acquire,
                  std::vector<double>* transfer, MemcpyProbe* limit,
                  std::vector<double>* limit_seconds) {
  const std::string key = "bench-floor";
  ARBITER_ASSIGN_OR_RETURN(WeightModel m,
                           Engine::WeightModelFor(o.model_dir, key, BenchEngineOptions(1, 1),
                                                  ResidencyState::kPinnedSystem));
  m.scratch_bytes = 0;  // no engine runs here: the whole arena is weights
  ARBITER_ASSIGN_OR_RETURN(BenchCache c, MakeCache(LayoutBytes(m.specs), huge_pages));
  ARBITER_RETURN_IF_ERROR(c.cache->Register(std::move(m)));
  ARBITER_RETURN_IF_ERROR(c.cache->PreloadPinned());  // the floor
  { ARBITER_ASSIGN_OR_RETURN(WeightLease warm, c.cache->Acquire(key)); }
  *weight_bytes = ModelStats(*c.cache, key).weight_bytes;
  for (int r = 0; r < o.repetitions; ++r) {
    ARBITER_RETURN_IF_ERROR(
        EvictAndAcquire(c.cache.get(), key, WeightLoadSource::kFloor, evict, acquire, transfer));
    if (limit != nullptr) {
      ARBITER_ASSIGN_OR_RETURN(double s, limit->Once());
      limit_seconds->push_back(s);
    }
  }
  c.Reset();
  return OkStatus();
}

Status RunFloorLoad(const WeightsBenchOptions& o, FloorLoadResult* out) {
  ARBITER_ASSIGN_OR_RETURN(
      WeightModel probe_model,
      Engine::WeightModelFor(o.model_dir, "bench-floor", BenchEngineOptions(1, 1)));
  uint64_t bytes = 0;
  for (const WeightSpec& s : probe_model.specs) bytes += WeightSpecBytes(s);
  std::vector<double> evict, acquire, transfer, limit_seconds;
  {
    MemcpyProbe limit(static_cast<size_t>(bytes), Dst::kFaulted);
    ARBITER_RETURN_IF_ERROR(limit.Init());
    ARBITER_RETURN_IF_ERROR(FloorLoads(o, /*huge_pages=*/true, &out->weight_bytes, &evict, &acquire,
                                       &transfer, &limit, &limit_seconds));
  }
  if (out->weight_bytes != bytes) {
    return InternalError(fmt::format("bench: the cache holds {} weight bytes, the specs say {}",
                                     out->weight_bytes, bytes));
  }
  out->acquire_seconds = Summarize(acquire);
  out->transfer_seconds = Summarize(transfer);
  out->evict_seconds = Summarize(evict);
  out->load_gb_s = GbPerSecond(out->weight_bytes, out->acquire_seconds.p50);
  out->memcpy_gb_s = GbPerSecond(out->weight_bytes, Summarize(limit_seconds).p50);
  std::vector<double> ratios;
  for (size_t i = 0; i < acquire.size(); ++i) ratios.push_back(limit_seconds[i] / acquire[i]);
  out->ratio = Summarize(ratios).p50;

  std::vector<double> base_evict, base_acquire;
  ARBITER_RETURN_IF_ERROR(FloorLoads(o, /*huge_pages=*/false, &out->weight_bytes, &base_evict,
                                     &base_acquire, nullptr, nullptr, nullptr));
  out->base_pages_acquire_seconds = Summarize(base_acquire);
  out->base_pages_evict_seconds = Summarize(base_evict);
  out->base_pages_load_gb_s = GbPerSecond(out->weight_bytes, out->base_pages_acquire_seconds.p50);

  const size_t n = static_cast<size_t>(bytes);
  ARBITER_ASSIGN_OR_RETURN(out->memcpy_fresh_gb_s, MemcpyGbS(n, o.repetitions, Dst::kFresh));
  ARBITER_ASSIGN_OR_RETURN(out->memcpy_huge_gb_s, MemcpyGbS(n, o.repetitions, Dst::kHugeFaulted));
  ARBITER_ASSIGN_OR_RETURN(out->memcpy_huge_discarded_gb_s,
                           MemcpyGbS(n, o.repetitions, Dst::kHugeDiscarded));
  return OkStatus();
}

// ---- (b) ---------------------------------------------------------------------

// Drops `files` from the page cache (fdatasync, then POSIX_FADV_DONTNEED) and
// returns the fraction of their pages still resident (mincore); -1 when that
// cannot be measured. Problems are appended to *note once.
double DropFromPageCache(const std::vector<std::string>& files, std::string* note) {
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  uint64_t pages = 0, resident = 0;
  bool measured = true;
  for (const std::string& f : files) {
    const int fd = ::open(f.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      if (note->empty()) *note = fmt::format("cannot open {}: {}", f, std::strerror(errno));
      measured = false;
      continue;
    }
    ::fdatasync(fd);  // dirty pages are not dropped
    const int rc = ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    if (rc != 0 && note->empty()) {
      *note = fmt::format("posix_fadvise(DONTNEED) of {} failed: {}", f, std::strerror(rc));
    }
    struct stat st {};
    if (::fstat(fd, &st) == 0 && st.st_size > 0) {
      const size_t size = static_cast<size_t>(st.st_size);
      void* p = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
      std::vector<unsigned char> vec((size + page - 1) / page);
      if (p != MAP_FAILED && ::mincore(p, size, vec.data()) == 0) {
        pages += vec.size();
        for (unsigned char v : vec) resident += v & 1;
      } else {
        measured = false;
      }
      if (p != MAP_FAILED) ::munmap(p, size);
    }
    ::close(fd);
  }
  if (!measured || pages == 0) return -1;
  return static_cast<double>(resident) / static_cast<double>(pages);
}

// Reads `files` front to back with read() into `buf`; wall seconds.
Result<double> SequentialRead(const std::vector<std::string>& files, std::vector<char>* buf) {
  const double t0 = NowSeconds();
  for (const std::string& f : files) {
    const int fd = ::open(f.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return UnavailableError(fmt::format("bench: open {}: {}", f, std::strerror(errno)));
    for (;;) {
      const ssize_t n = ::read(fd, buf->data(), buf->size());
      if (n == 0) break;
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        const int err = errno;
        ::close(fd);
        return UnavailableError(fmt::format("bench: read {}: {}", f, std::strerror(err)));
      }
    }
    ::close(fd);
  }
  return NowSeconds() - t0;
}

Status RunFileLoad(const WeightsBenchOptions& o, double memcpy_gb_s, FileLoadResult* out) {
  const std::string key = "bench-file";
  ARBITER_ASSIGN_OR_RETURN(WeightModel m,
                           Engine::WeightModelFor(o.model_dir, key, BenchEngineOptions(1, 1),
                                                  ResidencyState::kUnpinned));
  m.scratch_bytes = 0;
  std::vector<std::string> files;
  {
    // Scoped: the reader maps the files, and a mapped page is never dropped.
    ARBITER_ASSIGN_OR_RETURN(SafetensorsModel st, SafetensorsModel::Open(o.model_dir));
    files = st.files();
  }
  for (const std::string& f : files) {
    std::error_code ec;
    const uintmax_t size = fs::file_size(f, ec);
    if (ec) return UnavailableError(fmt::format("bench: size of {}: {}", f, ec.message()));
    out->file_bytes += size;
  }
  ARBITER_ASSIGN_OR_RETURN(BenchCache c, MakeCache(LayoutBytes(m.specs)));
  ARBITER_RETURN_IF_ERROR(c.cache->Register(std::move(m)));
  std::vector<char> buf(kReadChunk);
  std::memset(buf.data(), 0, buf.size());
  ARBITER_RETURN_IF_ERROR(SequentialRead(files, &buf).status());  // warm the page cache
  { ARBITER_ASSIGN_OR_RETURN(WeightLease warm, c.cache->Acquire(key)); }
  out->f32_bytes = ModelStats(*c.cache, key).weight_bytes;

  for (FileLoadCase* fc : {&out->warm, &out->cold}) {
    fc->cold = fc == &out->cold;
    std::vector<double> reads, acquires;
    for (int r = 0; r < o.repetitions; ++r) {
      if (fc->cold) {
        fc->resident_after_drop =
            std::max(fc->resident_after_drop, DropFromPageCache(files, &out->note));
      }
      ARBITER_ASSIGN_OR_RETURN(double read_s, SequentialRead(files, &buf));
      reads.push_back(read_s);
      if (fc->cold) {
        fc->resident_after_drop =
            std::max(fc->resident_after_drop, DropFromPageCache(files, &out->note));
      }
      ARBITER_RETURN_IF_ERROR(EvictAndAcquire(c.cache.get(), key, WeightLoadSource::kFile, nullptr,
                                              &acquires, nullptr));
    }
    fc->acquire_seconds = Summarize(acquires);
    fc->read_seconds = Summarize(reads);
    fc->file_gb_s = GbPerSecond(out->file_bytes, fc->acquire_seconds.p50);
    fc->f32_gb_s = GbPerSecond(out->f32_bytes, fc->acquire_seconds.p50);
    fc->read_gb_s = GbPerSecond(out->file_bytes, fc->read_seconds.p50);
    fc->ratio_vs_read = fc->read_gb_s > 0 ? fc->file_gb_s / fc->read_gb_s : 0;
    fc->ratio_vs_memcpy = memcpy_gb_s > 0 ? fc->f32_gb_s / memcpy_gb_s : 0;
  }
  if (out->cold.resident_after_drop > 0.01) {
    out->note += fmt::format(
        "{}could not drop the files from the page cache: up to {:.0f}% of "
        "their pages stayed resident; the cold case is partly warm",
        out->note.empty() ? "" : "; ", out->cold.resident_after_drop * 100);
  } else if (out->cold.resident_after_drop < 0) {
    out->note += fmt::format("{}page-cache residency after the drop could not be measured",
                             out->note.empty() ? "" : "; ");
    out->cold.resident_after_drop = 0;
  }
  return OkStatus();
}

// ---- (c) ---------------------------------------------------------------------

std::vector<int32_t> BenchPrompt(int n, int vocab, uint64_t seed) {
  std::vector<int32_t> ids(static_cast<size_t>(n));
  uint64_t s = seed;
  for (int i = 0; i < n; ++i) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    ids[static_cast<size_t>(i)] = static_cast<int32_t>((s >> 33) % static_cast<uint64_t>(vocab));
  }
  ids[0] = static_cast<int32_t>(seed % static_cast<uint64_t>(vocab));  // no shared prefix
  return ids;
}

Status RunAlternationCase(const WeightsBenchOptions& o, const std::string& dir_b,
                          AlternationCase* out, AlternationResult* res) {
  const ResidencyState residency =
      out->name == "floor" ? ResidencyState::kPinnedSystem : ResidencyState::kUnpinned;
  out->residency = std::string(ResidencyStateName(residency));
  out->swapping = out->name != "both_fit";
  const EngineOptions eo = BenchEngineOptions(o.gen_tokens, o.threads);
  const std::string keys[2] = {"model-a", "model-b"};
  const std::string dirs[2] = {o.model_dir, dir_b};
  std::vector<WeightModel> models;
  uint64_t block = 0, scratch = 0;
  for (int i = 0; i < 2; ++i) {
    ARBITER_ASSIGN_OR_RETURN(WeightModel m,
                             Engine::WeightModelFor(dirs[i], keys[i], eo, residency));
    block = std::max(block, LayoutBytes(m.specs));
    scratch = std::max(scratch, m.scratch_bytes);
    models.push_back(std::move(m));
  }
  // Budget = arena − max_scratch (fraction 1, wiggle 0): 1.5 or 2.5 blocks.
  const uint64_t budget = out->swapping ? block + block / 2 : 2 * block + block / 2;
  ARBITER_ASSIGN_OR_RETURN(BenchCache c, MakeCache(scratch + budget));
  for (WeightModel& m : models) ARBITER_RETURN_IF_ERROR(c.cache->Register(std::move(m)));
  ARBITER_RETURN_IF_ERROR(c.cache->PreloadPinned());
  if (out->swapping) res->on_demand_budget = c.cache->Stats().budget.on_demand_budget_bytes;
  res->model_bytes = block;

  std::unique_ptr<Engine> engines[2];  // destroyed before the cache
  for (int i = 0; i < 2; ++i) {
    EngineOptions with_cache = eo;
    with_cache.weight_cache = c.cache.get();
    with_cache.weight_key = keys[i];
    ARBITER_ASSIGN_OR_RETURN(engines[i], Engine::Load(dirs[i], with_cache));
  }
  uint64_t seed = 1000;
  auto request = [&](int i, std::vector<double>* ttft, std::vector<double>* swap_load,
                     double* wall) -> Status {
    GenerationRequest req;
    req.prompt_ids = BenchPrompt(kPromptTokens, engines[i]->config().vocab_size, seed++);
    req.sampling.temperature = 0;
    req.max_tokens = o.gen_tokens;
    req.ignore_eos = true;
    const uint64_t loads = ModelStats(*c.cache, keys[i]).loads;
    const double t0 = NowSeconds();
    ARBITER_ASSIGN_OR_RETURN(GenerationResult g, engines[i]->Generate(req, nullptr, nullptr));
    const double seconds = NowSeconds() - t0;
    if (ttft != nullptr) ttft->push_back(seconds - g.timings.decode_ms / 1e3);
    if (wall != nullptr) *wall += seconds;
    const WeightModelStats m = ModelStats(*c.cache, keys[i]);
    if (swap_load != nullptr && m.loads > loads) swap_load->push_back(m.last_load_seconds);
    return OkStatus();
  };
  for (int i = 0; i < 2; ++i) ARBITER_RETURN_IF_ERROR(request(i, nullptr, nullptr, nullptr));

  const uint64_t loads0 = c.cache->Stats().loads;
  std::vector<double> ttft, swap_load;
  for (int r = 0; r < o.repetitions; ++r) {
    for (int i = 0; i < 2; ++i) {
      ARBITER_RETURN_IF_ERROR(request(i, &ttft, &swap_load, &out->total_seconds));
    }
  }
  out->requests = 2 * o.repetitions;
  out->loads = c.cache->Stats().loads - loads0;
  const uint64_t want = out->swapping ? static_cast<uint64_t>(out->requests) : 0;
  if (out->loads != want) {
    return InternalError(
        fmt::format("bench: alternation '{}' made {} loads in {} requests, "
                    "expected {}",
                    out->name, out->loads, out->requests, want));
  }
  out->ttft_seconds = Summarize(ttft);
  out->swap_load_seconds = Summarize(swap_load);
  return OkStatus();
}

// A byte copy of `dir`'s regular files in a new temp dir (removed by the
// destructor).
class TempModelCopy {
 public:
  ~TempModelCopy() {
    if (!path_.empty()) {
      std::error_code ec;
      fs::remove_all(path_, ec);
    }
  }
  Status Make(const std::string& dir) {
    std::string templ = (fs::temp_directory_path() / "arbiter-wbench-XXXXXX").string();
    if (::mkdtemp(templ.data()) == nullptr) {
      return UnavailableError(fmt::format("bench: mkdtemp {}: {}", templ, std::strerror(errno)));
    }
    path_ = templ;
    std::error_code ec;
    fs::copy(dir, path_, fs::copy_options::recursive, ec);
    if (ec)
      return UnavailableError(fmt::format("bench: copy {} to {}: {}", dir, path_, ec.message()));
    return OkStatus();
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// ---- (d) ---------------------------------------------------------------------

struct ChildReport {
  int32_t ok = 0;
  int32_t filled_here = 0;
  uint64_t lo = 0;  // floor mapping range [lo, hi)
  uint64_t hi = 0;
  uint64_t mapped_bytes = 0;
  double seconds = 0;  // Materialize
  char error[512] = {};
};

bool WriteAll(int fd, const void* p, size_t n) {
  const char* c = static_cast<const char*>(p);
  while (n > 0) {
    const ssize_t w = ::write(fd, c, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    c += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

// The child: materialize, read every page, report, wait for the parent to
// close `go_fd`'s other end, release, _exit. Starts no threads.
[[noreturn]] void PssChild(int report_fd, int go_fd, bool shared, const std::string& prefix,
                           const WeightModel& m) {
  ChildReport rep;
  auto fail = [&](const std::string& what) {
    std::snprintf(rep.error, sizeof(rep.error), "%s", what.c_str());
    WriteAll(report_fd, &rep, sizeof(rep));
    ::_exit(1);
  };
  std::unique_ptr<WeightStore> store;
  if (shared) {
    SharedWeightStoreOptions so;
    so.prefix = prefix;
    Result<std::unique_ptr<SharedWeightStore>> s = SharedWeightStore::Create(so);
    if (!s.ok()) fail(s.status().ToString());
    store = std::move(s).value();
  } else {
    store = std::make_unique<PrivateWeightStore>();
  }
  const double t0 = NowSeconds();
  Result<std::unique_ptr<HostFloor>> floor = store->Materialize(m.key, m.digest, m.specs, m.fill);
  rep.seconds = NowSeconds() - t0;
  if (!floor.ok()) fail(floor.status().ToString());
  std::unique_ptr<HostFloor> held = std::move(floor).value();
  const HostFloor& f = *held;
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  uint64_t lo = UINT64_MAX, hi = 0;
  unsigned sum = 0;
  for (size_t i = 0; i < f.arrays().size(); ++i) {
    const auto* p = static_cast<const volatile uint8_t*>(f.arrays()[i]);
    const uint64_t n = f.tensor_bytes()[i];
    for (uint64_t off = 0; off < n; off += page) sum += p[off];
    if (n > 0) {
      lo = std::min(lo, reinterpret_cast<uint64_t>(p));
      hi = std::max(hi, reinterpret_cast<uint64_t>(p) + n);
    }
  }
  (void)sum;
  rep.ok = 1;
  rep.filled_here = f.filled_here() ? 1 : 0;
  rep.lo = lo == UINT64_MAX ? 0 : lo;
  rep.hi = hi;
  rep.mapped_bytes = f.mapped_bytes();
  WriteAll(report_fd, &rep, sizeof(rep));
  char c;
  while (::read(go_fd, &c, 1) < 0 && errno == EINTR) {
  }
  held.reset();  // detach; the last holder unlinks a shared region
  ::_exit(0);
}

// kB value of the "<field>:" line.
uint64_t FieldKb(const std::string& line) {
  std::istringstream in(line.substr(line.find(':') + 1));
  uint64_t kb = 0;
  in >> kb;
  return kb;
}

// Σ Pss of smaps_rollup; Σ Pss and Rss of the smaps mappings overlapping
// [lo, hi). Errors: kUnavailable when /proc cannot be read.
Status ReadPss(pid_t pid, uint64_t lo, uint64_t hi, uint64_t* pss, uint64_t* floor_pss,
               uint64_t* floor_rss) {
  {
    std::ifstream f(fmt::format("/proc/{}/smaps_rollup", pid));
    if (!f) return UnavailableError(fmt::format("bench: cannot read /proc/{}/smaps_rollup", pid));
    std::string line;
    bool found = false;
    while (std::getline(f, line)) {
      if (line.rfind("Pss:", 0) == 0) {
        *pss += FieldKb(line) * 1024;
        found = true;
      }
    }
    if (!found) return UnavailableError(fmt::format("bench: no Pss in /proc/{}/smaps_rollup", pid));
  }
  std::ifstream f(fmt::format("/proc/{}/smaps", pid));
  if (!f) return UnavailableError(fmt::format("bench: cannot read /proc/{}/smaps", pid));
  std::string line;
  bool in_floor = false;
  while (std::getline(f, line)) {
    if (line.empty()) continue;
    const char c0 = line[0];
    if ((c0 >= '0' && c0 <= '9') || (c0 >= 'a' && c0 <= 'f')) {  // "start-end perms ..."
      const uint64_t start = std::strtoull(line.c_str(), nullptr, 16);
      const uint64_t end = std::strtoull(line.c_str() + line.find('-') + 1, nullptr, 16);
      in_floor = start < hi && lo < end;
    } else if (in_floor && line.rfind("Pss:", 0) == 0) {
      *floor_pss += FieldKb(line) * 1024;
    } else if (in_floor && line.rfind("Rss:", 0) == 0) {
      *floor_rss += FieldKb(line) * 1024;
    }
  }
  return OkStatus();
}

Status RunPssCase(const WeightModel& m, const std::string& prefix, int workers, PssCase* out,
                  uint64_t* floor_bytes) {
  const bool shared = out->store == "shared";
  struct Child {
    pid_t pid = -1;
    int report_fd = -1;
    int go_fd = -1;
    ChildReport rep;
  };
  std::vector<Child> children(static_cast<size_t>(workers));
  auto cleanup = [&](bool kill_them) {
    for (Child& ch : children) {
      if (ch.go_fd >= 0) ::close(ch.go_fd);
      if (ch.report_fd >= 0) ::close(ch.report_fd);
      ch.go_fd = ch.report_fd = -1;
      if (ch.pid > 0) {
        if (kill_them) ::kill(ch.pid, SIGKILL);
        int status = 0;
        while (::waitpid(ch.pid, &status, 0) < 0 && errno == EINTR) {
        }
        ch.pid = -1;
      }
    }
  };
  std::fflush(stdout);
  std::fflush(stderr);
  for (Child& ch : children) {
    int report[2], go[2];
    if (::pipe2(report, O_CLOEXEC) != 0) {
      cleanup(true);
      return UnavailableError(fmt::format("bench: pipe2: {}", std::strerror(errno)));
    }
    if (::pipe2(go, O_CLOEXEC) != 0) {
      ::close(report[0]);
      ::close(report[1]);
      cleanup(true);
      return UnavailableError(fmt::format("bench: pipe2: {}", std::strerror(errno)));
    }
    const pid_t pid = ::fork();
    if (pid == 0) {
      for (Child& other : children) {  // earlier siblings' pipe ends
        if (other.go_fd >= 0) ::close(other.go_fd);
        if (other.report_fd >= 0) ::close(other.report_fd);
      }
      ::close(report[0]);
      ::close(go[1]);
      PssChild(report[1], go[0], shared, prefix, m);
    }
    ::close(report[1]);
    ::close(go[0]);
    ch.report_fd = report[0];
    ch.go_fd = go[1];
    if (pid < 0) {
      cleanup(true);
      return UnavailableError(fmt::format("bench: fork: {}", std::strerror(errno)));
    }
    ch.pid = pid;
  }
  const double deadline = NowSeconds() + kChildWaitSeconds;
  for (Child& ch : children) {
    size_t got = 0;
    auto* dst = reinterpret_cast<char*>(&ch.rep);
    while (got < sizeof(ch.rep)) {
      pollfd p{ch.report_fd, POLLIN, 0};
      const int left_ms = static_cast<int>(std::max(0.0, deadline - NowSeconds()) * 1000);
      const int rc = ::poll(&p, 1, left_ms);
      if (rc < 0 && errno == EINTR) continue;
      if (rc == 0) {
        cleanup(true);
        return InternalError(fmt::format("bench: a {} worker did not report within {} s",
                                         out->store, kChildWaitSeconds));
      }
      const ssize_t n = ::read(ch.report_fd, dst + got, sizeof(ch.rep) - got);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      got += static_cast<size_t>(n);
    }
    if (got != sizeof(ch.rep) || ch.rep.ok != 1) {
      const std::string why = got == sizeof(ch.rep) ? std::string(ch.rep.error) : "it died";
      cleanup(true);
      return InternalError(fmt::format("bench: a {} worker failed: {}", out->store, why));
    }
  }
  std::vector<double> seconds;
  for (Child& ch : children) {
    const Status st = ReadPss(ch.pid, ch.rep.lo, ch.rep.hi, &out->sum_pss_bytes,
                              &out->sum_floor_pss_bytes, &out->sum_floor_rss_bytes);
    if (!st.ok()) {
      cleanup(true);
      return st;
    }
    out->filled_here += ch.rep.filled_here;
    seconds.push_back(ch.rep.seconds);
    *floor_bytes = ch.rep.mapped_bytes;
  }
  out->workers = workers;
  out->materialize_seconds = Summarize(seconds);
  cleanup(false);  // closing go releases them; they detach and exit
  return OkStatus();
}

Status RunPss(const WeightsBenchOptions& o, PssResult* out) {
  ARBITER_ASSIGN_OR_RETURN(
      WeightModel m, Engine::WeightModelFor(o.model_dir, "bench-pss", BenchEngineOptions(1, 1),
                                            ResidencyState::kPinnedSystem));
  const std::string prefix = fmt::format("arbiter-wbench-{}", ::getpid());
  out->shared.store = "shared";
  out->private_store.store = "private";
  Status st = RunPssCase(m, prefix, o.workers, &out->shared, &out->floor_bytes);
  // Whatever happened, leave no region of this prefix behind.
  SharedWeightStoreOptions so;
  so.prefix = prefix;
  if (Result<std::unique_ptr<SharedWeightStore>> s = SharedWeightStore::Create(so); s.ok()) {
    if (Result<std::vector<std::string>> swept = (*s)->SweepOrphans({}); swept.ok()) {
      out->leftover_regions = static_cast<int>(swept->size());
    }
  }
  ARBITER_RETURN_IF_ERROR(st);
  ARBITER_RETURN_IF_ERROR(RunPssCase(m, prefix, o.workers, &out->private_store, &out->floor_bytes));
  auto ratio = [](uint64_t a, uint64_t b) {
    return b > 0 ? static_cast<double>(a) / static_cast<double>(b) : 0.0;
  };
  out->floor_ratio = ratio(out->shared.sum_floor_pss_bytes, out->private_store.sum_floor_pss_bytes);
  out->total_ratio = ratio(out->shared.sum_pss_bytes, out->private_store.sum_pss_bytes);
  out->shared_vs_copy = ratio(out->shared.sum_floor_pss_bytes, out->floor_bytes);
  out->private_vs_copy = ratio(out->private_store.sum_floor_pss_bytes, out->floor_bytes);
  return OkStatus();
}

}  // namespace

Result<WeightsBenchResult> RunWeightsBench(const WeightsBenchOptions& options) {
  if (options.repetitions < 1 || options.workers < 1 || options.gen_tokens < 1 ||
      options.threads < 1) {
    return InvalidArgumentError(
        "bench weights: repetitions, workers, gen_tokens and threads "
        "must be >= 1");
  }
  if (options.model_dir.empty()) return InvalidArgumentError("bench weights: --model is required");
  if (!std::filesystem::is_directory(options.model_dir)) {
    // Its file_load scenario times the safetensors reader itself.
    return InvalidArgumentError("bench weights: " + options.model_dir +
                                " is not a directory; this bench takes a safetensors model "
                                "directory (e.g. make-model --preset demo-chat)");
  }
  const spdlog::level::level_enum saved_level = spdlog::get_level();
  spdlog::set_level(spdlog::level::err);
  const int saved_blas = openblas_get_num_threads();
  openblas_set_num_threads(options.threads);
  struct Restore {
    spdlog::level::level_enum level;
    int blas;
    ~Restore() {
      spdlog::set_level(level);
      openblas_set_num_threads(blas);
    }
  } restore{saved_level, saved_blas};

  WeightsBenchResult r;
  r.model_dir = options.model_dir;
  r.repetitions = options.repetitions;
  r.workers = options.workers;
  r.threads = options.threads;
  r.loadavg_start = LoadAverage1();
  TempModelCopy copy;
  r.model2_dir = options.model2_dir;
  if (r.model2_dir.empty()) {
    ARBITER_RETURN_IF_ERROR(copy.Make(options.model_dir));
    r.model2_dir = copy.path();
    r.model2_is_copy = true;
  }
  ARBITER_RETURN_IF_ERROR(RunFloorLoad(options, &r.floor_load).WithPrefix("floor_load"));
  ARBITER_RETURN_IF_ERROR(
      RunFileLoad(options, r.floor_load.memcpy_gb_s, &r.file_load).WithPrefix("file_load"));
  r.alternation.rounds = options.repetitions;
  r.alternation.prompt_tokens = kPromptTokens;
  r.alternation.gen_tokens = options.gen_tokens;
  for (const char* name : {"floor", "file", "both_fit"}) {
    AlternationCase c;
    c.name = name;
    ARBITER_RETURN_IF_ERROR(
        RunAlternationCase(options, r.model2_dir, &c, &r.alternation).WithPrefix("alternation"));
    r.alternation.cases.push_back(std::move(c));
  }
  ARBITER_RETURN_IF_ERROR(RunPss(options, &r.pss).WithPrefix("worker_pss"));
  r.loadavg_end = LoadAverage1();
  return r;
}

std::string FormatWeightsBench(const WeightsBenchResult& r) {
  auto ms = [](const SampleSummary& s) {
    return fmt::format("{:.1f} ms ({:.1f}–{:.1f})", s.p50 * 1e3, s.min * 1e3, s.max * 1e3);
  };
  auto mb = [](uint64_t b) { return fmt::format("{:.1f} MB", static_cast<double>(b) / 1e6); };
  std::string out = fmt::format(
      "arbiter bench weights: model {}, model2 {}{}, {} repetitions, {} workers, {} thread(s); "
      "load average {:.2f} → {:.2f}\n"
      "(p50 (min–max) over repetitions; GB = 1e9 bytes; limits measured in this run)\n\n",
      r.model_dir, r.model2_dir, r.model2_is_copy ? " (temp copy)" : "", r.repetitions, r.workers,
      r.threads, r.loadavg_start, r.loadavg_end);

  const FloorLoadResult& a = r.floor_load;
  out += fmt::format(
      "(a) floor_load: host floor → cpu arena (huge pages), {} f32, 1 thread\n"
      "  acquire (evict excluded)      {}  = {:.2f} GB/s\n"
      "  cache transfer time           {}\n"
      "  evict                         {}\n"
      "  limit: memcpy, faulted        {:.2f} GB/s (plain buffers, one copy after each load)\n"
      "  ratio load / memcpy           {:.2f} (p50 of the paired ratios; goal >= 0.9: {})\n"
      "  context: memcpy into a faulted huge-page arena {:.2f} GB/s; into a discarded one "
      "{:.2f} GB/s;\n"
      "           into fresh base pages {:.2f} GB/s; the load on a base-page arena {} = "
      "{:.2f} GB/s (ratio {:.2f}), evict {}\n\n",
      mb(a.weight_bytes), ms(a.acquire_seconds), a.load_gb_s, ms(a.transfer_seconds),
      ms(a.evict_seconds), a.memcpy_gb_s, a.ratio, a.ratio >= 0.9 ? "met" : "NOT met",
      a.memcpy_huge_gb_s, a.memcpy_huge_discarded_gb_s, a.memcpy_fresh_gb_s,
      ms(a.base_pages_acquire_seconds), a.base_pages_load_gb_s,
      a.memcpy_gb_s > 0 ? a.base_pages_load_gb_s / a.memcpy_gb_s : 0,
      ms(a.base_pages_evict_seconds));

  const FileLoadResult& b = r.file_load;
  out += fmt::format("(b) file_load: safetensors → f32 arena, {} file, {} f32\n", mb(b.file_bytes),
                     mb(b.f32_bytes));
  out +=
      fmt::format("  {:<5} {:>28} {:>10} {:>10} {:>28} {:>10} {:>8} {:>10}\n", "cache", "acquire",
                  "file GB/s", "f32 GB/s", "limit: read()", "read GB/s", "vs read", "vs memcpy");
  for (const FileLoadCase* c : {&b.warm, &b.cold}) {
    out += fmt::format("  {:<5} {:>28} {:>10.2f} {:>10.2f} {:>28} {:>10.2f} {:>8.2f} {:>10.2f}\n",
                       c->cold ? "cold" : "warm", ms(c->acquire_seconds), c->file_gb_s, c->f32_gb_s,
                       ms(c->read_seconds), c->read_gb_s, c->ratio_vs_read, c->ratio_vs_memcpy);
  }
  out += fmt::format("  cold: up to {:.1f}% of the file pages resident after the drop{}{}\n\n",
                     b.cold.resident_after_drop * 100, b.note.empty() ? "" : "; ", b.note);

  const AlternationResult& c = r.alternation;
  out += fmt::format(
      "(c) alternation: A,B × {} rounds, {}-token prompt, {} tokens, model block {}, swapping "
      "budget {}\n",
      c.rounds, c.prompt_tokens, c.gen_tokens, mb(c.model_bytes), mb(c.on_demand_budget));
  out += fmt::format("  {:<9} {:<14} {:>8} {:>6} {:>10} {:>28} {:>28}\n", "case", "residency",
                     "requests", "loads", "total", "TTFT", "load per swap");
  for (const AlternationCase& k : c.cases) {
    out += fmt::format("  {:<9} {:<14} {:>8} {:>6} {:>7.1f} ms {:>28} {:>28}\n", k.name,
                       k.residency, k.requests, k.loads, k.total_seconds * 1e3, ms(k.ttft_seconds),
                       k.loads > 0 ? ms(k.swap_load_seconds) : "-");
  }
  out += "\n";

  const PssResult& d = r.pss;
  out += fmt::format("(d) worker_pss: {} workers, one floor = {}\n", r.workers, mb(d.floor_bytes));
  out += fmt::format("  {:<8} {:>7} {:>12} {:>14} {:>14} {:>10} {:>28}\n", "store", "filled",
                     "Σ Pss", "Σ floor Pss", "Σ floor Rss", "vs 1 copy", "materialize");
  for (const PssCase* k : {&d.shared, &d.private_store}) {
    out += fmt::format(
        "  {:<8} {:>7} {:>12} {:>14} {:>14} {:>10.2f} {:>28}\n", k->store, k->filled_here,
        mb(k->sum_pss_bytes), mb(k->sum_floor_pss_bytes), mb(k->sum_floor_rss_bytes),
        k == &d.shared ? d.shared_vs_copy : d.private_vs_copy, ms(k->materialize_seconds));
  }
  out += fmt::format(
      "  ratio shared / private: floor Pss {:.3f} (1/{} = {:.3f}), whole process "
      "{:.3f}; leftover regions swept {}\n",
      d.floor_ratio, r.workers, 1.0 / r.workers, d.total_ratio, d.leftover_regions);
  return out;
}

namespace {

// {samples, p50, min, max}: the keys `arbiter bench weights --json` has
// always had (scripts and docs/BENCHMARKS.md read them).
nlohmann::json SummaryJson(const SampleSummary& s) {
  return {{"samples", s.samples}, {"p50", s.p50}, {"min", s.min}, {"max", s.max}};
}

}  // namespace

std::string FormatWeightsBenchJson(const WeightsBenchResult& r) {
  const FloorLoadResult& a = r.floor_load;
  const FileLoadResult& b = r.file_load;
  const AlternationResult& c = r.alternation;
  const PssResult& d = r.pss;
  nlohmann::json j;
  j["model_dir"] = r.model_dir;
  j["model2_dir"] = r.model2_dir;
  j["model2_is_copy"] = r.model2_is_copy;
  j["repetitions"] = r.repetitions;
  j["workers"] = r.workers;
  j["threads"] = r.threads;
  j["loadavg_start"] = r.loadavg_start;
  j["loadavg_end"] = r.loadavg_end;
  j["floor_load"] = {{"weight_bytes", a.weight_bytes},
                     {"acquire_seconds", SummaryJson(a.acquire_seconds)},
                     {"transfer_seconds", SummaryJson(a.transfer_seconds)},
                     {"evict_seconds", SummaryJson(a.evict_seconds)},
                     {"load_gb_s", a.load_gb_s},
                     {"memcpy_gb_s", a.memcpy_gb_s},
                     {"ratio", a.ratio},
                     {"memcpy_huge_gb_s", a.memcpy_huge_gb_s},
                     {"memcpy_huge_discarded_gb_s", a.memcpy_huge_discarded_gb_s},
                     {"memcpy_fresh_gb_s", a.memcpy_fresh_gb_s},
                     {"base_pages_acquire_seconds", SummaryJson(a.base_pages_acquire_seconds)},
                     {"base_pages_evict_seconds", SummaryJson(a.base_pages_evict_seconds)},
                     {"base_pages_load_gb_s", a.base_pages_load_gb_s}};
  auto file_case = [](const FileLoadCase& k) {
    return nlohmann::json{{"resident_after_drop", k.resident_after_drop},
                          {"acquire_seconds", SummaryJson(k.acquire_seconds)},
                          {"file_gb_s", k.file_gb_s},
                          {"f32_gb_s", k.f32_gb_s},
                          {"read_seconds", SummaryJson(k.read_seconds)},
                          {"read_gb_s", k.read_gb_s},
                          {"ratio_vs_read", k.ratio_vs_read},
                          {"ratio_vs_memcpy", k.ratio_vs_memcpy}};
  };
  j["file_load"] = {{"file_bytes", b.file_bytes},
                    {"f32_bytes", b.f32_bytes},
                    {"warm", file_case(b.warm)},
                    {"cold", file_case(b.cold)},
                    {"note", b.note}};
  nlohmann::json cases = nlohmann::json::array();
  for (const AlternationCase& k : c.cases) {
    cases.push_back({{"name", k.name},
                     {"residency", k.residency},
                     {"swapping", k.swapping},
                     {"requests", k.requests},
                     {"loads", k.loads},
                     {"total_seconds", k.total_seconds},
                     {"ttft_seconds", SummaryJson(k.ttft_seconds)},
                     {"swap_load_seconds", SummaryJson(k.swap_load_seconds)}});
  }
  j["alternation"] = {{"rounds", c.rounds},           {"prompt_tokens", c.prompt_tokens},
                      {"gen_tokens", c.gen_tokens},   {"on_demand_budget", c.on_demand_budget},
                      {"model_bytes", c.model_bytes}, {"cases", cases}};
  auto pss_case = [](const PssCase& k) {
    return nlohmann::json{{"workers", k.workers},
                          {"filled_here", k.filled_here},
                          {"sum_pss_bytes", k.sum_pss_bytes},
                          {"sum_floor_pss_bytes", k.sum_floor_pss_bytes},
                          {"sum_floor_rss_bytes", k.sum_floor_rss_bytes},
                          {"materialize_seconds", SummaryJson(k.materialize_seconds)}};
  };
  j["worker_pss"] = {
      {"floor_bytes", d.floor_bytes},         {"shared", pss_case(d.shared)},
      {"private", pss_case(d.private_store)}, {"floor_ratio", d.floor_ratio},
      {"total_ratio", d.total_ratio},         {"shared_vs_copy", d.shared_vs_copy},
      {"private_vs_copy", d.private_vs_copy}, {"leftover_regions", d.leftover_regions}};
  return j.dump(2) + "\n";
}

}  // namespace arbiter
